#!/usr/bin/python
"""Find the configuration file chronyd reads and whether it reads ddpfix's drop-in (read-only)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddpfix_chrony_conf
short_description: Where chronyd reads its configuration, and whether that reads the ddpfix drop-in (read-only)
description:
  - The main configuration is I(conf_path) when given; else the C(-f FILE) of the running chronyd; else the C(-f) in
    C(/etc/default/chrony) (C(DAEMON_OPTS)) or C(/etc/sysconfig/chronyd) (C(OPTIONS)); else the distribution's default,
    C(/etc/chrony/chrony.conf) (Debian) or C(/etc/chrony.conf) (RHEL and others), whichever exists.
  - The drop-in directory is I(dropin_dir) when given; else a directory the main configuration already reads with
    C(confdir); else C(<dir>/conf.d) next to a C(<dir>/chrony.conf) in a chrony directory (Debian), else
    C(/etc/chrony.d) (RHEL).
  - C(confdir) and C(include) (with glob patterns) directives are followed through included files. Changes nothing.
options:
  conf_path: {description: The configuration file chronyd reads; empty to find it., type: str, default: ''}
  dropin_dir: {description: The directory for ddpfix.conf; empty to choose it., type: str, default: ''}
"""

RETURN = r"""
conf_path: {description: The main configuration file., returned: always, type: str}
conf_source: {description: How it was found., returned: always, type: str}
conf_exists: {description: Whether it exists., returned: always, type: bool}
dropin_dir: {description: The drop-in directory., returned: always, type: str}
dropin_dir_exists: {description: Whether it exists., returned: always, type: bool}
dropin_file: {description: The ddpfix drop-in file (dropin_dir/ddpfix.conf)., returned: always, type: str}
included: {description: Whether the main configuration reads dropin_file., returned: always, type: bool}
include_line: {description: The directive that makes it read dropin_dir (C(confdir DIR))., returned: always, type: str}
directives: {description: The confdir/include lines found, as C(FILE:LINE: TEXT)., returned: always, type: list}
service: {description: The service name (chrony on Debian, chronyd elsewhere)., returned: always, type: str}
chronyd: {description: Path of the chronyd binary (empty when not installed)., returned: always, type: str}
writes: {description: "The files the time fix writes: dropin_file, and conf_path where it exists and does not read
  dropin_file yet.", returned: always, type: list}
"""

import fnmatch
import glob
import os
import shlex

from ansible.module_utils.basic import AnsibleModule

DEBIAN_CONF = "/etc/chrony/chrony.conf"
RHEL_CONF = "/etc/chrony.conf"
OPTION_FILES = (("/etc/default/chrony", "DAEMON_OPTS"), ("/etc/sysconfig/chronyd", "OPTIONS"))
COMMENT = ("#", "!", ";", "%")


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def conf_from_argv(argv):
    """The FILE of `-f FILE` (or `-fFILE`) in a chronyd argument list, else None."""
    for i, a in enumerate(argv):
        if a == "-f" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("-f") and len(a) > 2 and not a.startswith("--"):
            return a[2:]
    return None


def running_chronyd(proc="/proc"):
    """argv of the first running chronyd, or None."""
    try:
        pids = sorted((d for d in os.listdir(proc) if d.isdigit()), key=int)
    except OSError:
        return None
    for pid in pids:
        try:
            with open(os.path.join(proc, pid, "comm")) as f:
                if f.read().strip() != "chronyd":
                    continue
            with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
    return None


def conf_from_options_file(text, var):
    """The -f FILE in a shell-style `VAR="..."` options file (last assignment wins), else None."""
    found = None
    for line in (text or "").splitlines():
        line = line.strip()
        if line.startswith(var + "="):
            try:
                value = shlex.split(line[len(var) + 1:])
            except ValueError:
                continue
            words = []
            for v in value:
                words.extend(v.split())
            found = conf_from_argv(words)
    return found


def find_conf(explicit="", proc="/proc", exists=os.path.exists, read=_read):
    """(path, how it was found)."""
    if explicit:
        return explicit, "ddpfix_chrony_conf_path"
    argv = running_chronyd(proc)
    if argv is not None:
        f = conf_from_argv(argv[1:])
        if f:
            return f, "the running chronyd's -f"
    for path, var in OPTION_FILES:
        f = conf_from_options_file(read(path), var)
        if f:
            return f, f"-f in {path} {var}"
    default = DEBIAN_CONF if exists("/etc/debian_version") else RHEL_CONF
    other = RHEL_CONF if default == DEBIAN_CONF else DEBIAN_CONF
    if not exists(default) and exists(other):
        default = other
    how = "chronyd's default" if argv is not None else "the distribution's default"
    return default, how


def directives(path, read=_read, depth=0, seen=None):
    """[(file, line number, keyword, args)] of confdir/include directives, following includes (as chronyd does)."""
    seen = seen if seen is not None else set()
    if depth > 8 or path in seen:
        return []
    seen.add(path)
    out = []
    for n, raw in enumerate((read(path) or "").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(COMMENT):
            continue
        parts = line.split()
        key = parts[0].lower()
        if key not in ("confdir", "include"):
            continue
        out.append((path, n, key, parts[1:]))
        if key == "include" and parts[1:]:
            for f in sorted(glob.glob(parts[1])):
                out.extend(directives(f, read, depth + 1, seen))
        elif key == "confdir":
            for d in parts[1:]:
                for f in sorted(glob.glob(os.path.join(d, "*.conf"))):
                    out.extend(directives(f, read, depth + 1, seen))
    return out


def _glob_match(pattern, path):
    """Whether glob `pattern` matches `path` (a '*' does not cross '/', as in glob(3))."""
    p, q = os.path.normpath(pattern).split("/"), os.path.normpath(path).split("/")
    return len(p) == len(q) and all(fnmatch.fnmatchcase(b, a) for a, b in zip(p, q))


def reads(found, dropin_file):
    """Whether the directives read `dropin_file`."""
    d = os.path.normpath(os.path.dirname(dropin_file))
    for _, _, key, args in found:
        if key == "confdir" and d in [os.path.normpath(a) for a in args]:
            return True
        if key == "include" and args and _glob_match(args[0], dropin_file):
            return True
    return False


def choose_dropin_dir(conf, found, explicit=""):
    if explicit:
        return os.path.normpath(explicit)
    for _, _, key, args in found:
        if key == "confdir":
            for a in args:
                if os.path.normpath(a).startswith("/etc/"):
                    return os.path.normpath(a)
    parent = os.path.dirname(os.path.normpath(conf))
    if os.path.basename(parent) == "chrony":
        return os.path.join(parent, "conf.d")
    return "/etc/chrony.d"


def service_name(exists=os.path.exists):
    for unit_dir in ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system"):
        for name in ("chrony", "chronyd"):
            if exists(os.path.join(unit_dir, name + ".service")) and not os.path.islink(
                    os.path.join(unit_dir, name + ".service")):
                return name
    for name in ("chrony", "chronyd"):
        if exists("/etc/init.d/" + name):
            return name
    return "chrony" if exists("/etc/debian_version") else "chronyd"


def inspect(conf_path="", dropin_dir="", proc="/proc"):
    conf, how = find_conf(conf_path, proc)
    found = directives(conf)
    ddir = choose_dropin_dir(conf, found, dropin_dir)
    dfile = os.path.join(ddir, "ddpfix.conf")
    chronyd = next((p for p in ("/usr/sbin/chronyd", "/usr/bin/chronyd", "/sbin/chronyd") if os.path.exists(p)), "")
    included = reads(found, dfile)
    return {
        "conf_path": conf,
        "conf_source": how,
        "conf_exists": os.path.exists(conf),
        "dropin_dir": ddir,
        "dropin_dir_exists": os.path.isdir(ddir),
        "dropin_file": dfile,
        "included": included,
        "include_line": f"confdir {ddir}",
        "directives": [f"{f}:{n}: {k} {' '.join(a)}" for f, n, k, a in found],
        "service": service_name(),
        "chronyd": chronyd,
        "writes": [dfile] + ([conf] if os.path.exists(conf) and not included else []),
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(conf_path=dict(type="str", default=""), dropin_dir=dict(type="str", default="")),
        supports_check_mode=True,
    )
    for key in ("conf_path", "dropin_dir"):
        v = module.params[key]
        if v and (not v.startswith("/") or any(c.isspace() for c in v)):
            module.fail_json(msg=f"ddpfix_chrony_{key} must be an absolute path without whitespace, got {v!r}")
    module.exit_json(changed=False, **inspect(module.params["conf_path"], module.params["dropin_dir"]))


if __name__ == "__main__":
    main()
