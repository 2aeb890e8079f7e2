"""Files ddpfix writes on the controller (`-o FILE`, `inventory slurm -o`, the standalone playbook's report, env
files, run directory files): one writer, `write_atomic`.

A file is written to a temporary file of an unpredictable name created exclusively in the target's directory
(O_CREAT|O_EXCL|O_NOFOLLOW, 0600 from the start: a planted file or symlink of that name is never opened, let alone
followed), synced, given its mode, then renamed over the target. A reader sees the old file or the new one, never
part of either; a symlink planted at the target itself is replaced, never followed (its target is left alone).

The mode: `mode` when given (0600 for files that may hold secrets); else an existing regular file keeps its mode;
else a new file gets 0666 less the process umask, as a plain `open` would give it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def umask() -> int:
    """The process umask, read without changing it (`os.umask` sets it: a race with other threads)."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def target_mode(path: str | os.PathLike[str], mode: int | None = None) -> int:
    """The mode `write_atomic` gives `path` (see the module's docstring)."""
    if mode is not None:
        return mode
    try:
        st = os.lstat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode):
        return stat.S_IMODE(st.st_mode)
    return 0o666 & ~umask()


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, mode: int | None = None,
                 sync: bool = True) -> Path:
    """Write `data` (text as UTF-8) into `path` atomically through a private, exclusively created temporary file in
    its directory; -> the path written. OSError as the system raised it (the temporary file is removed). `sync`
    False: no fsync before the rename (a record written hundreds of times a run, such as a run's job events, that
    a crash may lose but never leaves half-written)."""
    target = Path(os.path.abspath(os.fspath(path)))
    if os.path.isdir(target) and not os.path.islink(target):
        raise IsADirectoryError(21, "Is a directory", str(target))
    want = target_mode(target, mode)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    for _ in range(100):
        tmp = target.with_name(f".{target.name}.{os.urandom(6).hex()}.tmp")
        try:
            fd = os.open(tmp, _FLAGS, 0o600)
        except FileExistsError:
            continue
        break
    else:  # 100 collisions of 48 random bits: someone is filling the directory
        raise FileExistsError(17, "File exists", str(tmp))
    try:
        try:
            os.fchmod(fd, want)
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target
