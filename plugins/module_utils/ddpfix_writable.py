"""Can a remediation write this file? The pre-flight of ``ddpfix_run_lock state=writable``: stdlib-only, read-only.

ddpfix writes every file atomically: a temporary file in the target's directory, then a rename over the target
(in place only for a bind-mounted file), with a backup copy next to it. So a file can be written only when:

- the file system is not mounted read-only (``statvfs`` ``ST_RDONLY``, per mount: a read-only bind mount counts);
- neither the file nor its directory is immutable (``chattr +i``) or append-only (``chattr +a``): an append-only
  file cannot be truncated or renamed over, and no entry of an append-only directory can be renamed or removed
  (read with the ``FS_IOC_GETFLAGS`` ioctl, ``lsattr``'s own call);
- the file (when it exists) and its directory are writable by this user;
- the file system has room for the new file and its backup (blocks and inodes);
- a missing directory can be created: the nearest existing parent is a directory that passes the same checks.

``problems(path)`` names the first reason a path cannot be written, or None.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import array
import fcntl
import os

FS_IOC_GETFLAGS = 0x80086601
FS_IMMUTABLE_FL = 0x10
FS_APPEND_FL = 0x20
#: Room a new file needs besides twice the old one's size (the new file and the backup): at least this much.
MIN_FREE_BYTES = 64 * 1024
#: Inodes a write needs: the temporary file and the backup.
MIN_FREE_INODES = 2


def attr_flags(path, follow=False):
    """The inode flags (``lsattr``) of `path` (of a symlink's target with `follow`); 0 when the file system does not
    report them."""
    nofollow = 0 if follow else getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | nofollow)
    except OSError:
        return 0
    try:
        buf = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf, True)
        return buf[0]
    except OSError:
        return 0
    finally:
        os.close(fd)


def _attr_problem(path):
    flags = attr_flags(path)
    if flags & FS_IMMUTABLE_FL:
        return f"{path}: immutable (chattr +i): run `chattr -i {path}` if it may change"
    if flags & FS_APPEND_FL:
        return f"{path}: append-only (chattr +a): run `chattr -a {path}` if it may change"
    return None


def _statvfs(path):
    try:
        return os.statvfs(path)
    except OSError:
        return None


def _space_problem(path, need_bytes, need_inodes):
    st = _statvfs(path)
    if st is None:
        return None
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    free = (st.f_bfree if root else st.f_bavail) * st.f_frsize
    inodes = st.f_ffree if root else st.f_favail
    if free < need_bytes:
        return f"{path}: file system full ({free} bytes free, {need_bytes} needed for the new file and its backup)"
    if st.f_files and inodes < need_inodes:  # f_files 0: the file system has no inode limit (btrfs, some FUSE)
        return f"{path}: file system out of inodes ({inodes} free, {need_inodes} needed)"
    return None


def _dir_problem(d, need_bytes, need_inodes):
    """Why no file can be created and renamed in the existing directory `d`, or None."""
    if not os.path.isdir(d):
        return f"{d}: not a directory"
    st = _statvfs(d)
    if st is not None and st.f_flag & os.ST_RDONLY:
        return f"{d}: read-only file system"
    bad = _attr_problem(d)
    if bad:
        return bad
    if not os.access(d, os.W_OK | os.X_OK):
        return f"{d}: directory not writable (uid {os.getuid()})"
    return _space_problem(d, need_bytes, need_inodes)


def problems(path):
    """The first reason `path` cannot be written (created, or replaced atomically), or None."""
    if not path or not os.path.isabs(path):
        return f"{path!r}: not an absolute path"
    target = os.path.realpath(path) if os.path.lexists(path) else path
    if os.path.lexists(path) and not os.path.exists(target):
        return f"{path}: a symlink to {target}, which does not exist"
    if os.path.exists(target):
        if os.path.isdir(target):
            return f"{target}: a directory"
        st = _statvfs(target)
        if st is not None and st.f_flag & os.ST_RDONLY:
            return f"{target}: read-only file system"
        bad = _attr_problem(target)
        if bad:
            return bad
        if not os.access(target, os.W_OK):
            return f"{target}: not writable (uid {os.getuid()})"
        try:
            size = os.path.getsize(target)
        except OSError:
            size = 0
        return _dir_problem(os.path.dirname(target) or "/", 2 * size + MIN_FREE_BYTES, MIN_FREE_INODES)
    # a new file: its directory, or the nearest existing parent where the missing directories are created
    d, missing = os.path.dirname(target) or "/", 0
    while not os.path.lexists(d) and d not in ("/", ""):
        d, missing = os.path.dirname(d) or "/", missing + 1
    if missing and os.path.lexists(d) and not os.path.isdir(d):
        return f"{d}: not a directory, so {os.path.dirname(target)} cannot be created"
    bad = _dir_problem(os.path.realpath(d), MIN_FREE_BYTES, MIN_FREE_INODES + missing)
    if bad and missing:
        return f"{bad} (the directory {os.path.dirname(target)} is missing and cannot be created there)"
    return bad


def unwritable(paths, if_present=()):
    """path -> reason for each of `paths` that cannot be written, and for every path of each group in `if_present`
    whose first path exists (files written only where they exist: firewall persistence files)."""
    todo = list(paths)
    for group in if_present or ():
        group = [p for p in (group or []) if p]
        if group and os.path.lexists(group[0]):
            todo.extend(group)
    bad = {}
    for p in todo:
        if p in bad:
            continue
        why = problems(p)
        if why:
            bad[p] = why
    return bad
