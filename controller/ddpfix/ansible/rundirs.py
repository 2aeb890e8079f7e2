"""Run directories: each run gets its own private data dir under ``<state dir>/runs/<timestamp>-<name>``, held while
the run lives and pruned after; the extra vars written there as data (never templates), secrets redacted after."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ddpfix import paths
from ddpfix.ansible import collection
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.safefile import write_atomic

#: Run directories kept under the state dir (older ones are removed when a new run starts).
KEEP_RUNS = int(os.environ.get("DDPFIX_KEEP_RUNS", "30"))



#: Name of the lock file in each run directory: flock-ed by the process using the directory while it lives.
LIVE_LOCK = ".ddpfix-live.lock"
_live: dict[Path, int] = {}  # run dir -> descriptor holding its live lock (for this process's lifetime)


def in_use(run_dir: Path) -> bool:
    """Whether a live process holds `run_dir`'s live lock (a directory without one, or unreadable, counts as in use
    only while it is younger than a minute: it may be a run that is just being created)."""
    lock = run_dir / LIVE_LOCK
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            return time.time() - run_dir.stat().st_mtime < 60
        except OSError:
            return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def prune_runs(base: Path, keep: int = KEEP_RUNS) -> None:
    """Remove all but the newest `keep` run directories; never one that a live run (any process) uses."""
    try:
        runs = sorted((d for d in base.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    except OSError:
        return
    for d in runs[: max(0, len(runs) - keep)]:
        if d in _live or in_use(d):
            continue
        shutil.rmtree(d, ignore_errors=True)


_run_dirs: list[Path] = []


def last_run_dir() -> Path | None:
    """The newest run directory created since `forget_run_dirs()` that still exists (for error messages)."""
    return next((d for d in reversed(_run_dirs) if d.is_dir()), None)


def forget_run_dirs() -> None:
    """A new command starts: earlier run directories are not its run log."""
    _run_dirs.clear()


def _hold(run_dir: Path) -> None:
    fd = os.open(run_dir / LIVE_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"{os.getpid()}\n".encode())
    _live[run_dir] = fd


def release_run_dir(run_dir: Path) -> None:
    """Drop this process's live lock on `run_dir` (it becomes prunable)."""
    fd = _live.pop(run_dir, None)
    if fd is not None:
        os.close(fd)


def discard_run_dir(run_dir: Path) -> None:
    """Remove a run directory that holds nothing to keep (the run stopped on invalid input before any node)."""
    release_run_dir(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)


def new_run_dir(name: str) -> Path:
    """A fresh run directory, 0700 under `runs/` (0700; created with the state directory, 0700, when missing): what
    ansible-runner, the fact cache and the extra vars write there is the run's alone."""
    base = paths.private_dir(paths.state_dir() / "runs", "run directories' directory")  # checked before pruning
    prune_runs(base)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(1000):
        d = base / (f"{stamp}-{name}" if n == 0 else f"{stamp}-{name}-{n}")
        try:
            d.mkdir(mode=0o700, exist_ok=False)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)
        _hold(d)
        _run_dirs.append(d)
        return d
    raise DdpfixError(f"cannot create a run directory under {base}", ExitCode.RUN_FAILED)



def as_data(value: Any) -> Any:
    """`value` with every string marked unsafe for Ansible (`{"__ansible_unsafe": s}`, which ansible-core's JSON
    decoder turns into a value it never templates, 2.17 to 2.19 alike). Extra vars are trusted templates to
    ansible-core; what ddpfix hands a play is data (plans, names, addresses, env values, some of which a node
    returned), so no `{{ ... }}` in it is ever evaluated on the controller or in a role. Dict keys are not
    templated by ansible-core and stay plain."""
    if isinstance(value, str):
        return {"__ansible_unsafe": value}
    if isinstance(value, Mapping):
        return {str(k): as_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_data(v) for v in value]
    return value


def write_extravars(run_dir: Path, extravars: Mapping[str, Any]) -> Path:
    """The run's extra vars as JSON in `<run dir>/env/extravars`, which ansible-runner passes as `-e @path`;
    every string in them is data, never a template (`as_data`)."""
    env = run_dir / "env"
    env.mkdir(mode=0o700, exist_ok=True)
    path = env / "extravars"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(as_data(dict(extravars)), f)
    return path


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """umask 077 while ansible-runner and ansible-playbook run: every file they (and a persistent fact cache the user
    configured there, and ansible-runner's artifacts) create in the run directory is readable by its owner only."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def owner_only(base: Path) -> None:
    """Drop group and other permissions from everything under `base`: Ansible's jsonfile fact cache chmods its files
    0644 whatever the umask (they were never reachable: the run directory is 0700; now they are not readable either)."""
    for root, dirs, files in os.walk(base):
        for name in [*dirs, *files]:
            p = os.path.join(root, name)
            with contextlib.suppress(OSError):
                st = os.lstat(p)
                if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                    os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o077)


def write_event(events_dir: Path, event: Mapping[str, Any]) -> bool:
    """Write one ansible-runner event as ansible-runner itself would (`<events_dir>/<counter>-<uuid>.json`, 0600,
    through a temporary file renamed into place: `safefile.write_atomic`), but in one `json.dumps` (its C encoder)
    and one write: ansible-runner streams `json.dump` through a codecs writer, about ten times slower on a node's
    facts (a 320-node audit's CLI spent half its CPU there). Returns whether it was written (an event without
    counter or uuid is not)."""
    counter, uuid = event.get("counter"), event.get("uuid")
    if not isinstance(counter, int) or not isinstance(uuid, str) or not uuid or "/" in uuid:
        return False
    try:  # (ansible-runner does not sync them either)
        write_atomic(events_dir / f"{counter}-{uuid}.json", json.dumps(event), mode=0o600, sync=False)
    except OSError:
        return False  # as ansible-runner: an event that cannot be written is skipped, the run goes on
    return True


def redact_extravars(run_dir: Path) -> None:
    """Rewrite `<run dir>/env/extravars` with secret-looking values (`plan.is_secret`) replaced by ***: the plan's env
    values were needed by the run, not by whoever reads the run directory later."""
    path = run_dir / "env" / "extravars"
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return
    scrubbed = scrub(data)
    if scrubbed != data:  # as it is (already `as_data`), atomically, 0600
        write_atomic(path, json.dumps(scrubbed), mode=0o600)


def scrub(obj: Any) -> Any:
    """`obj` (JSON data) with secret-looking values (`plan.is_secret`, by key name or URL userinfo) replaced by ***,
    and KEY=value lines of secret keys in strings redacted (`plan.redact_env`)."""
    string = _string_scrubber()

    def walk(o: Any, key: str = "") -> Any:
        if isinstance(o, dict):
            if set(o) == {"__ansible_unsafe"}:  # as_data's wrapper: the value still belongs to the key above
                return {"__ansible_unsafe": walk(o["__ansible_unsafe"], key)}
            return {k: walk(v, str(k)) for k, v in o.items()}
        if isinstance(o, list):  # a list under a secret-looking name holds names (outside_keys), not values
            if o and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in o):
                return [[p[0], walk(p[1], p[0])] for p in o]  # (key, value) pairs: a Node's env_extra, asdict'ed
            return [walk(v) for v in o]
        if isinstance(o, str):
            return string(key, o)
        return o

    return walk(obj)


@functools.lru_cache(maxsize=1)
def _string_scrubber() -> Callable[[str, str], str]:
    """One string under its key, scrubbed: `is_secret(key, value)` and `redact` of the env file's library, each
    answer kept for the strings seen again (every event of a run repeats its names, addresses and flags: a
    320-node audit scrubs some 200,000 strings, most of them seen before)."""
    lib = collection.module_utils("ddpfix_envfile")  # the env file's managed-block functions (plan.envfile_lib)

    @functools.lru_cache(maxsize=4096)
    def key_secret(key: str) -> bool:
        return bool(lib.is_secret(key))

    @functools.lru_cache(maxsize=65536)
    def string(key: str, o: str) -> str:
        if key and (key_secret(key) or lib.is_secret("", o)):
            return str(lib.REDACTED)
        return str(lib.redact(o)) if ("=" in o or "@" in o) else o

    return string


def _removed(orig: Any, scrubbed: Any) -> set[str]:
    """The strings `scrub` replaced by *** as a whole (values of secret keys) in `orig`."""
    if isinstance(orig, dict) and isinstance(scrubbed, dict):
        return {s for k in orig.keys() & scrubbed.keys() for s in _removed(orig[k], scrubbed[k])}
    if isinstance(orig, list) and isinstance(scrubbed, list):
        return {s for a, b in zip(orig, scrubbed, strict=False) for s in _removed(a, b)}
    if isinstance(orig, str) and scrubbed == "***" and orig not in ("", "***"):
        return {orig}
    return set()


class LiveOutput:
    """-v..-vvvv: Ansible's own display text of each event, live on stderr, without what `scrub` takes out of the
    run's records: a result that held a secret is shown as its scrubbed JSON, and every secret value seen so far is
    *** in each later line (the verbose lines of -vvv and -vvvv too)."""

    def __init__(self) -> None:
        self.secrets: set[str] = set()

    def render(self, text: str, res: Any = None, scrubbed: Any = None) -> str:
        """`text` without the secrets of `res` (as `scrubbed` leaves it) or of any earlier result."""
        if not text:
            return text
        if scrubbed is not None and scrubbed != res:
            self.secrets |= _removed(res, scrubbed)
            head = text.split(" => ", 1)[0] if " => " in text else text.splitlines()[0]
            text = f"{head} => {json.dumps(scrubbed, indent=4, sort_keys=True)}"
        for secret in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def show(self, text: str, res: Any = None, scrubbed: Any = None) -> None:
        text = self.render(text, res, scrubbed)
        if text:
            sys.stderr.write(f"{text}\n")
            sys.stderr.flush()
