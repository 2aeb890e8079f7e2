"""Host environment facts of the launch path: /dev/shm and the launcher variables shell start files set.

Stdlib only, read-only, no subprocess and no shell: every source is a file read (or one statvfs), so the facts pass
stays cheap. Used by the ``ddpfix_node_facts`` module; the controller's /dev/shm and stray-launcher-variable checks
read the result.

- ``shm_facts``: the size and free space of /dev/shm (statvfs), its mount (``/proc/self/mountinfo``: type and
  options, e.g. Docker's ``size=65536k``) and the GPUs the node's driver lists (``/proc/driver/nvidia/gpus/*``, else
  ``/dev/nvidia<N>``).
- ``stray_env_facts``: the assignments of launcher variables (rendezvous, ranks, socket interfaces: ``WATCHED``)
  in /etc/environment, /etc/profile, /etc/bash.bashrc, /etc/profile.d/*.sh and the start files of root and the login
  user, read as text and never evaluated (``parse_assignments``), with file and line. Only watched keys leave the
  node; a secret-looking value (``ddpfix_envfile.is_secret``) leaves as ``***``.
"""

from __future__ import absolute_import, division, print_function

import errno
import glob
import os
import re

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_envfile import REDACTED, is_secret

__metaclass__ = type

#: Launcher variables whose assignment in a shell start file shadows (or stands in for) the env file: torch's
#: rendezvous and rank variables, torchrun's own PET_* names, NCCL's rendezvous override and every *_SOCKET_IFNAME.
WATCHED = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
           "GROUP_RANK", "NNODES", "NPROC_PER_NODE", "NCCL_COMM_ID")
WATCHED_RE = re.compile(r"^(?:" + "|".join(WATCHED) + r"|PET_[A-Z0-9_]+|[A-Z0-9_]*_SOCKET_IFNAME)$")
#: an assignment at the start of a line or after ; && || then do else, optionally with export / declare -x / readonly
_ASSIGN = re.compile(r"(?:^|[;&|]|\bthen\b|\bdo\b|\belse\b)\s*"
                     r"(?:export\s+|declare\s+-x\s+|typeset\s+-x\s+|readonly\s+)?([A-Za-z_][A-Za-z0-9_]*)=")
_DECLARES = re.compile(r"\b(?:export|declare|typeset|readonly)\s")
_NEXT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
_EXPORT_NAMES = re.compile(r"(?:^|[;&|]|\bthen\b)\s*export((?:\s+[A-Za-z_][A-Za-z0-9_]*)+)\s*(?:$|[;&|#])")
MAX_FILE = 256 * 1024  # bytes read of one start file (the rest of a longer one is not looked at)
MAX_VALUE = 512  # characters of a value kept
#: the system start files, in the order a login shell reads them (/etc/environment: pam_env, every PAM session)
SYSTEM_FILES = ("/etc/environment", "/etc/profile", "/etc/bash.bashrc")
PROFILE_D = "/etc/profile.d/*.sh"
#: a user's start files: bash reads the first of .bash_profile, .bash_login, .profile for a login shell, and
#: .bashrc for an interactive one and for a command sshd starts (`ssh node torchrun ...`)
USER_FILES = (".bash_profile", ".bash_login", ".profile", ".bashrc")


def _value(rest):
    """(value, dynamic, end) of the text after `KEY=`: quotes as the shell reads them; dynamic when it expands
    something ($, backquote), which ddpfix does not evaluate; `end`: where the word ends in `rest`."""
    out, dynamic, i, n = [], False, 0, len(rest)
    while i < n:
        c = rest[i]
        if c in " \t;&|":
            break
        if c == "'":
            j = rest.find("'", i + 1)
            j = n if j < 0 else j
            out.append(rest[i + 1:j])
            i = j + 1
            continue
        if c == '"':
            j, buf = i + 1, []
            while j < n and rest[j] != '"':
                if rest[j] == "\\" and j + 1 < n and rest[j + 1] in '"\\$`':
                    buf.append(rest[j + 1])
                    j += 2
                    continue
                if rest[j] in "$`":
                    dynamic = True
                buf.append(rest[j])
                j += 1
            out.append("".join(buf))
            i = j + 1
            continue
        if c in "$`":
            dynamic = True
        if c == "\\" and i + 1 < n:
            out.append(rest[i + 1])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out), dynamic, i


def parse_assignments(text, watched=WATCHED_RE):
    """[{line, key, value, dynamic, conditional, exported}] of every assignment of a watched key in shell (or
    pam_env) text, read as text: nothing is evaluated. `conditional`: not at the start of its line (after `&&`,
    `then`, ...); `exported`: with export/declare -x, or named by an `export KEY` in the same file. `KEY=V command`
    (set for that command only) is no assignment of the shell."""
    found, exported = [], set()
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        for m in _ASSIGN.finditer(line):
            declared = _DECLARES.search(m.group(0)) is not None
            key, pos = m.group(1), m.end()
            while True:
                value, dynamic, end = _value(line[pos:])
                after = line[pos + end:].lstrip()
                if not declared and after and after[0] not in ";&|#" and not after.startswith("fi"):
                    break  # `KEY=V command`: set for that one command only, not in the shell
                if watched.match(key):
                    found.append({"line": no, "key": key, "value": value[:MAX_VALUE], "dynamic": dynamic,
                                  "conditional": m.start() > 0,
                                  "exported": declared and "readonly" not in m.group(0)})
                nxt = _NEXT.match(after) if declared else None  # export A=1 B=2
                if not nxt:
                    break
                key, pos = nxt.group(1), len(line) - len(after) + nxt.end()
        for names in _EXPORT_NAMES.findall(line):  # `export KEY` (without a value) exports an earlier assignment
            exported.update(names.split())
    for a in found:
        a["exported"] = a["exported"] or a["key"] in exported
    return found


def _read(path):
    """(text, why): (None, None) for a missing file."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE + 1)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None, None
        return None, f"{path}: {exc.strerror or exc}"
    return data[:MAX_FILE].decode("utf-8", "replace"), None


def _homes(login_user):
    """[(user, home)] of root and the login user (once each)."""
    out = []
    try:
        import pwd

        for user in ("root", login_user):
            if user and user not in [u for u, _ in out]:
                try:
                    out.append((user, pwd.getpwnam(user).pw_dir))
                except KeyError:
                    continue
    except ImportError:
        pass
    return out


def login_user(environ=None):
    """The user who logged in: SUDO_USER under become (sudo), else the effective user."""
    env = os.environ if environ is None else environ
    if env.get("SUDO_USER") and env.get("SUDO_USER") != "root":
        return env["SUDO_USER"]
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return None


def stray_env_facts(user=None, system_files=SYSTEM_FILES, profile_d=PROFILE_D, homes=None):
    """({users, files, assignments: [{file, line, key, value, dynamic, conditional, exported, secret}]}, unread)."""
    unread = []
    paths = list(system_files) + sorted(glob.glob(profile_d))
    users = _homes(user if user is not None else login_user()) if homes is None else list(homes)
    for _, home in users:
        paths += [os.path.join(home, f) for f in USER_FILES]
    files, assignments = [], []
    for path in paths:
        text, why = _read(path)
        if why:
            unread.append({"source": "shell_env", "reason": why})
            continue
        if text is None:
            continue
        files.append(path)
        for a in parse_assignments(text):
            if path == "/etc/environment":  # pam_env exports every line of it
                a["exported"] = True
            secret = is_secret(a["key"], a["value"])
            a.update(file=path, secret=secret, value=REDACTED if secret else a["value"])
            assignments.append(a)
    return {"users": [u for u, _ in users], "files": files, "assignments": assignments}, unread


def _mount(mountinfo_text, mountpoint):
    """(fstype, options) of the last mount on `mountpoint` in /proc/self/mountinfo text (the visible one)."""
    got = (None, None)
    for line in mountinfo_text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 6 and len(tail) >= 3 and fields[4] == mountpoint:
            got = (tail[0], tail[2])
    return got


def gpu_count(proc_root="/proc", dev_root="/dev"):
    """(GPUs the NVIDIA driver lists, where): /proc/driver/nvidia/gpus/<PCI address>, else /dev/nvidia<N>; (None,
    None) without an NVIDIA driver."""
    gpus = os.path.join(proc_root, "driver", "nvidia", "gpus")
    try:
        return len(os.listdir(gpus)), gpus
    except OSError:
        pass
    try:
        n = len([d for d in os.listdir(dev_root) if re.match(r"^nvidia[0-9]+$", d)])
    except OSError:
        n = 0
    return (n, os.path.join(dev_root, "nvidia<N>")) if n else (None, None)


def shm_facts(path="/dev/shm", mountinfo="/proc/self/mountinfo", proc_root="/proc", dev_root="/dev"):
    """({path, size_bytes, avail_bytes, fstype, options, gpus, gpus_source}, unread): sizes None (and an unread
    `shm` source) when /dev/shm could not be read."""
    out = {"path": path, "size_bytes": None, "avail_bytes": None, "fstype": None, "options": None}
    unread = []
    try:
        st = os.statvfs(path)
        out["size_bytes"] = st.f_blocks * st.f_frsize
        out["avail_bytes"] = st.f_bavail * st.f_frsize
    except OSError as exc:
        unread.append({"source": "shm", "reason": f"statvfs {path}: {exc.strerror or exc}"})
    text, _ = _read(mountinfo)
    if text is not None:
        out["fstype"], out["options"] = _mount(text, path)
    out["gpus"], out["gpus_source"] = gpu_count(proc_root, dev_root)
    return out, unread
