"""Read-only launch-path facts for ddpfix_node_facts: the open-file limit, ARP sysctls and the torch build.

- `nofile_limit()`: RLIMIT_NOFILE of this process (the SSH session's, what a login shell gets);
  `unit_nofile(units)`: `systemctl show -p LimitNOFILE,LimitNOFILESoft UNIT` (what a systemd launcher gets).
- `arp_sysctls(names)`: /proc/sys/net/ipv4/conf/{all,IFACE}/{arp_ignore,arp_announce} (per network namespace).
- `torch_info(python)`: torch's version, CUDA/ROCm build and NCCL version from one start of `python` (ddp_python),
  cached in /run/ddpfix/torch by the interpreter's real path and mtime and by torch's version.py mtime, so later
  audits start no interpreter until either changes (a pip install rewrites version.py). An interpreter without torch
  is cached too, with the mtime of every directory of its import path (and of the user site, existing or not): until
  one of them changes (installing torch adds an entry to one), no interpreter is started. The interpreter reads
  torch/version.py as text (ast, nothing of torch runs) and imports torch.cuda.nccl only on a CUDA/ROCm build.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import hashlib
import json
import os
import re
import resource
import shutil
import stat
import tempfile

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_nodeinfo import run_command

TORCH_CACHE_DIR = "/run/ddpfix/torch"
TORCH_TIMEOUT = 30
#: printed as one JSON line by `python -c` (first line: a marker lab stand-ins can match)
TORCH_INFO_CODE = (
    "# ddpfix torch-info\n"
    "import ast, json, os, importlib.util as u\n"
    "out = {'version': None, 'cuda': None, 'hip': None, 'nccl': None, 'error': None, 'stamp': None}\n"
    "try:\n"
    "    spec = u.find_spec('torch')\n"
    "except Exception as e:\n"
    "    spec = None\n"
    "    out['error'] = 'torch: ' + str(e)[:200]\n"
    "if spec is None or not spec.origin:\n"
    "    out['error'] = out['error'] or 'torch is not installed for this interpreter'\n"
    "    if spec is None and not out['error'].startswith('torch: '):\n"
    "        import site, sys\n"
    "        dirs = [os.path.abspath(p or '.') for p in sys.path] + [site.getusersitepackages()]\n"
    "        def mt(d):\n"
    "            try:\n"
    "                return os.stat(d).st_mtime_ns\n"
    "            except OSError:\n"
    "                return None\n"
    "        out['absent'] = [[d, mt(d)] for d in dirs]\n"
    "else:\n"
    "    vf = os.path.join(os.path.dirname(spec.origin), 'version.py')\n"
    "    vals = {}\n"
    "    try:\n"
    "        with open(vf) as f:\n"
    "            tree = ast.parse(f.read())\n"
    "        for n in tree.body:\n"
    "            one = isinstance(n, ast.Assign) and len(n.targets) == 1\n"
    "            t = n.targets[0] if one else getattr(n, 'target', None)\n"
    "            if isinstance(t, ast.Name) and isinstance(getattr(n, 'value', None), ast.Constant):\n"
    "                vals[t.id] = n.value.value\n"
    "        out['stamp'] = [vf, os.stat(vf).st_mtime_ns]\n"
    "    except (OSError, SyntaxError, ValueError) as e:\n"
    "        out['error'] = vf + ': ' + str(e)[:200]\n"
    "    for k, key in (('version', '__version__'), ('cuda', 'cuda'), ('hip', 'hip')):\n"
    "        v = vals.get(key)\n"
    "        out[k] = v if isinstance(v, str) else None\n"
    "    if out['cuda'] or out['hip']:\n"
    "        try:\n"
    "            import torch.cuda.nccl as nc\n"
    "            v = nc.version()\n"
    "            out['nccl'] = '.'.join(str(x) for x in v) if isinstance(v, tuple) else str(v)\n"
    "        except Exception as e:\n"
    "            out['nccl_error'] = str(e)[:200]\n"
    "print(json.dumps(out))\n"
)


def _rlimit(n):
    return -1 if n == resource.RLIM_INFINITY else int(n)


def nofile_limit():
    """RLIMIT_NOFILE of this process (the SSH session's): soft, hard (-1 unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {"soft": _rlimit(soft), "hard": _rlimit(hard), "source": "ssh session"}


def unit_nofile(units, timeout=5):
    """({unit: {soft, hard, source}}, [why]): the LimitNOFILE a systemd launcher unit's processes get."""
    out, whys = {}, []
    for unit in units or []:
        rc, text, err = run_command(
            ["systemctl", "show", "-p", "LimitNOFILE", "-p", "LimitNOFILESoft", "--", unit], timeout
        )
        if rc != 0:
            whys.append("systemctl show {}: {}".format(unit, (err.strip().splitlines() or [f"rc={rc}"])[-1][:200]))
            continue
        vals = dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln)

        def num(v):
            v = (v or "").strip()
            return -1 if v == "infinity" else int(v) if v.isdigit() else None

        hard = num(vals.get("LimitNOFILE"))
        soft = num(vals.get("LimitNOFILESoft") or vals.get("LimitNOFILE"))
        if soft is None or hard is None:
            whys.append("systemctl show {}: unparsable LimitNOFILE {!r}".format(unit, vals.get("LimitNOFILE")))
            continue
        out[unit] = {"soft": soft, "hard": hard, "source": f"systemd unit {unit}"}
    return out, whys


def arp_sysctls(names, proc_root="/proc"):
    """({conf: {arp_ignore, arp_announce}} for `all` and each interface of `names` with IPv4 configuration, why or
    None): the first unreadable or non-numeric value stops the reading (the caller lists it as not read)."""
    out = {}
    for conf in ["all"] + [n for n in names if n and n != "all"]:
        vals = {}
        for key in ("arp_ignore", "arp_announce"):
            path = os.path.join(proc_root, "sys", "net", "ipv4", "conf", conf.replace("/", "."), key)
            try:
                with open(path) as f:
                    text = f.read().strip()
            except OSError as exc:
                if getattr(exc, "errno", None) in (errno.ENOENT, errno.ENOTDIR) and conf != "all":
                    vals = None  # no IPv4 configuration (or gone meanwhile)
                    break
                return out, "{}: {}".format(path, getattr(exc, "strerror", None) or exc)
            if not re.match(r"^\d{1,3}$", text):
                return out, f"{path}: {text[:40]!r} is not a number"
            vals[key] = int(text)
        if vals is not None:
            out[conf] = vals
    return out, None


def _resolve_python(python):
    """The interpreter's path as it is started (a venv's bin/python, not its target: sys.path differs) or None."""
    return python if os.path.isabs(python) else shutil.which(python)


def _stat_key(path):
    st = os.stat(path)
    return [st.st_mtime_ns, st.st_size, st.st_ino]


def _cache_dir(path):
    """`path` created (0700) and safe to use: a directory of this user's, no symlink, writable by no one else."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return path


def _cache_read(path, key):
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd) as f:
            doc = json.loads(f.read(65536))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(doc.get("result"), dict):
        return None
    if "absent" in doc["result"]:  # no torch: stale once any directory torch could be installed in changed
        return doc["result"] if _unchanged(doc["result"]["absent"]) else None
    stamp = doc["result"].get("stamp")
    try:  # torch reinstalled (version.py rewritten): stale
        if not (isinstance(stamp, list) and len(stamp) == 2 and os.stat(stamp[0]).st_mtime_ns == stamp[1]):
            return None
    except (OSError, TypeError, ValueError):
        return None
    return doc["result"]


def _unchanged(dirs):
    """Whether every [directory, mtime_ns or None (absent)] of an absent torch's stamp is as it was: installing torch
    (or a .pth, an egg link) adds an entry to one of the import path's directories, or creates the user site."""
    if not isinstance(dirs, list) or not dirs:
        return False
    for entry in dirs:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            return False
        try:
            now = os.stat(entry[0]).st_mtime_ns
        except OSError:
            now = None
        if now != entry[1]:
            return False
    return True


def _cache_write(cdir, path, key, result):
    try:
        fd, tmp = tempfile.mkstemp(dir=cdir, prefix=".torch-")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"key": key, "result": result}))
        os.replace(tmp, path)
    except OSError:
        pass


def python_argv(python):
    """ddp_python as the argv it is started with: a string is one word (an interpreter's path or command name), a list
    the jobs' own launch (`docker run --rm --network host IMAGE python3`); None when it is neither."""
    if isinstance(python, str):
        return [python] if python else None
    if isinstance(python, (list, tuple)) and python and all(isinstance(a, str) and a for a in python):
        return list(python)
    return None


def python_shown(argv):
    """The argv as one line for reasons and reports (each word as it is, space-separated; the controller validated
    them: no control characters)."""
    return " ".join(argv)


def torch_info(python, cache_dir=TORCH_CACHE_DIR, timeout=TORCH_TIMEOUT):
    """{python, version, cuda, hip, nccl, cached, absent} of torch under `python` (ddp_python: a path or command name,
    or an argv list such as a container runtime's), and why it could not be read (None: read). A missing
    interpreter, one that fails, or one without torch: the reason, never a version; `absent` is true only when the
    interpreter ran and has no torch (not a host fault: the controller lists the torch comparison as not evaluated).
    An argv of more than one word (a container) is not cached: its import path is the image's, not this host's."""
    argv = python_argv(python)
    shown = python_shown(argv) if argv else None
    info = {"python": (argv[0] if len(argv) == 1 else argv) if argv else None, "version": None, "cuda": None,
            "hip": None, "nccl": None, "cached": False, "absent": False}
    if not argv:
        return info, "no interpreter given (ddp_python)"
    exe = _resolve_python(argv[0])
    if not exe or not os.access(exe, os.X_OK):
        what = "interpreter" if len(argv) == 1 else "command"
        return info, f"{argv[0]}: no such {what} on this node"
    try:  # the environment that changes the interpreter's import path is part of the key
        key = [exe, os.path.realpath(exe), *_stat_key(exe), os.getcwd(),
               *(os.environ.get(v) for v in ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE"))]
    except OSError as exc:
        return info, "{}: {}".format(shown, getattr(exc, "strerror", None) or exc)
    cdir = _cache_dir(cache_dir) if cache_dir and len(argv) == 1 else None
    cpath = os.path.join(cdir, hashlib.sha256(exe.encode()).hexdigest()[:32] + ".json") if cdir else None
    result = _cache_read(cpath, key) if cpath else None
    if result is not None:
        info["cached"] = True
    else:
        rc, out, err = run_command([*argv, "-c", TORCH_INFO_CODE], timeout)
        if rc != 0:
            line = next((ln.strip() for ln in reversed(err.splitlines()) if ln.strip()), f"rc={rc}")
            return info, f"{shown}: {line[:200]}"
        try:
            result = json.loads((out.strip().splitlines() or [""])[-1])
        except ValueError:
            result = None
        if not isinstance(result, dict):
            return info, f"{shown}: printed no torch version ({out.strip()[:80]!r})"
        if cpath and ((result.get("version") and not result.get("error")) or _unchanged(result.get("absent"))):
            _cache_write(cdir, cpath, key, result)
    for k in ("version", "cuda", "hip", "nccl"):
        v = result.get(k)
        info[k] = v if isinstance(v, str) and v else None
    if result.get("error") or not info["version"]:
        info["absent"] = isinstance(result.get("absent"), list) and not info["version"]
        return info, f"{shown}: {str(result.get('error') or 'no torch version')[:200]}"
    return info, None
