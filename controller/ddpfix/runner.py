"""The runner layer: the only place that talks to Ansible (through ansible-runner).

A run gets its own private data dir under ``<state dir>/runs/<timestamp>-<name>``, runs in the
user's working directory with the user's Ansible configuration (`ansiblecfg`), our own settings
(pipelining, ControlPersist, explicit fact gathering, no ``~/.ansible``) only where the user set
none, and returns typed per-host results.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpfix import ansibleargs, ansiblecfg, paths
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.lock import HELD_ENV, holder_info

#: Default upper bound on forks when the user does not pass --forks.
MAX_DEFAULT_FORKS = 50
#: An inventory source Ansible cannot parse is an error, never a warning with fewer hosts (the audit's ansible-playbook
#: is the one reader of the inventory: it must fail where the CLI's own read would).
STRICT_INVENTORY = {"ANSIBLE_INVENTORY_UNPARSED_FAILED": "True", "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True"}
#: Run directories kept under the state dir (older ones are removed when a new run starts).
KEEP_RUNS = int(os.environ.get("DDPFIX_KEEP_RUNS", "30"))


@dataclass
class TaskResult:
    task: str
    status: str  # ok | changed | failed | skipped | unreachable
    res: dict[str, Any]
    created: str = ""  # controller-side ISO timestamp of the result event
    start: str = ""  # controller-side ISO timestamps: when the task started for this host, and when it ended
    end: str = ""
    action: str = ""  # the module or action plugin that ran (resolved, e.g. ddpfix.cluster.ddpfix_node_facts)
    role: str = ""  # the role the task belongs to ("" for a play's own task)

    def is_action(self, name: str) -> bool:
        """Whether this task ran module/action `name`: its short name, whatever the prefix (FQCN, legacy, none)."""
        return short_name(self.action) == short_name(name)

    def in_role(self, name: str) -> bool:
        return short_name(self.role) == short_name(name)


def short_name(name: str) -> str:
    """The last dotted component: `ddpfix.cluster.ddpfix_node_facts` and `ddpfix_node_facts` are the same module."""
    return name.rsplit(".", 1)[-1]


@dataclass
class HostResult:
    name: str
    unreachable: bool = False
    failed: bool = False
    message: str = ""
    #: a module that failed on the node without a result of its own (its interpreter exited non-zero, a traceback, no
    #: Python): "MODULE: its error" (SSH worked: never "unreachable")
    module_error: str = ""
    tasks: list[TaskResult] = field(default_factory=list)

    def find(self, action: str, *, role: str | None = None, ran: bool = False,
             has: str | None = None) -> TaskResult | None:
        """The last result of a task that ran module/action `action` (matched by its short name, never by the task's
        name), optionally only in `role`, only one that ran (not skipped), only one whose result has key `has`."""
        for t in reversed(self.tasks):
            if (t.is_action(action) and (role is None or t.in_role(role)) and not (ran and t.status == "skipped")
                    and (has is None or has in t.res)):
                return t
        return None

    def fact(self, key: str) -> tuple[TaskResult, Any] | None:
        """The last task result that returned fact `key` (`ansible_facts[key]`), and that fact's value."""
        for t in reversed(self.tasks):
            facts = t.res.get("ansible_facts") if isinstance(t.res, dict) else None
            if isinstance(facts, dict) and key in facts:
                return t, facts[key]
        return None

    @property
    def ok(self) -> bool:
        return not (self.unreachable or self.failed)


@dataclass
class RunResult:
    status: str
    rc: int
    stats: dict[str, dict[str, int]]
    hosts: dict[str, HostResult]
    run_dir: Path
    seconds: float
    interrupted: bool = False  # Ctrl-C/SIGTERM: the run stopped starting tasks (see run_playbook)

    def changed(self, host: str | None = None) -> int:
        per_host = self.stats.get("changed", {}) or {}
        if host is not None:
            return int(per_host.get(host, 0))
        return sum(int(v) for v in per_host.values())

    @property
    def unreachable(self) -> list[str]:
        return sorted(h for h, r in self.hosts.items() if r.unreachable)


#: How ansible-core words a module that returned no result of its own: its process failed on the node
MODULE_FAILURE_MARKERS = ("MODULE FAILURE", "Module result deserialization failed", "The module interpreter")


def module_failure(res: Mapping[str, Any]) -> str | None:
    """The module's own error, in one line, when a module failed on the node without a result of its own (its
    interpreter exited non-zero or is missing, a traceback): ansible-core's message, the exit status and the tails of
    what the process wrote (stderr, then stdout, then the traceback). None for a module that failed by itself
    (fail_json: its own message is the error)."""
    from ddpfix.factguard import one_line  # what the node wrote is hostile text: one printable line

    msg = " ".join(str(res.get("msg") or "").split())
    if not msg.startswith(MODULE_FAILURE_MARKERS) and "module_stderr" not in res:
        return None
    parts = [one_line(msg, 200) or "MODULE FAILURE"]
    rc = res.get("rc")
    if isinstance(rc, int) and not isinstance(rc, bool):
        parts.append(f"rc={rc}")
    for key, label in (("module_stderr", "stderr"), ("module_stdout", "stdout"), ("exception", "traceback")):
        text = " ".join(str(res.get(key) or "").split())
        if text:
            parts.append(f"{label}: {one_line(text[-300:], 400)}")
    return "; ".join(parts)


def record_event(hosts: dict[str, HostResult], event: Mapping[str, Any]) -> None:
    """Fold one ansible-runner event into the per-host results (`hosts`, by host name)."""
    data = event.get("event_data") or {}
    host = data.get("host")
    kind = str(event.get("event", ""))
    if not host or not kind.startswith("runner_on_"):
        return
    hr = hosts.setdefault(host, HostResult(name=host))
    res = data.get("res") or {}
    task = data.get("task", "")
    created = str(event.get("created", ""))
    # identity of the task: the module that ran and its role (task names are for people)
    ident = {"action": str(data.get("resolved_action") or data.get("task_action") or ""),
             "role": str(data.get("resolved_role") or data.get("role") or "")}
    if kind == "runner_on_unreachable":
        hr.unreachable = True
        hr.message = _one_line(res.get("msg", "unreachable"))
        hr.tasks.append(TaskResult(task, "unreachable", res, **ident))
    elif kind == "runner_on_failed" and not data.get("ignore_errors"):
        hr.failed = True
        broken = module_failure(res)
        if broken:
            hr.module_error = f"{short_name(ident['action']) or task}: {broken}"
        hr.message = broken or _one_line(res.get("msg") or res.get("stderr") or "task failed")
        hr.tasks.append(TaskResult(task, "failed", res, **ident))
    elif kind == "runner_on_ok":
        hr.tasks.append(TaskResult(task, "changed" if res.get("changed") else "ok", res, created,
                                   str(data.get("start", "")), str(data.get("end", "")), **ident))
    elif kind == "runner_on_skipped":
        hr.tasks.append(TaskResult(task, "skipped", res, **ident))


def find_ansible_playbook() -> str:
    """Locate ansible-playbook: next to this interpreter (venv not on PATH) or on PATH."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    if beside.exists():
        return str(beside)
    found = shutil.which("ansible-playbook")
    if found:
        return found
    raise DdpfixError(
        "ansible-playbook not found: install ddpfix into a venv with its dependencies "
        "(pip install ddpfix) and run that venv's ddpfix, or put the venv's bin/ on PATH",
        ExitCode.PREREQUISITE,
    )


def _ensure_ansible_on_path() -> Path:
    """ansible-runner looks its commands up on this process's PATH: put ours first."""
    bindir = Path(find_ansible_playbook()).parent
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if str(bindir) not in parts:
        os.environ["PATH"] = os.pathsep.join([str(bindir), *[p for p in parts if p]])
    return bindir


def default_forks(n_hosts: int, forks: int | None, user_forks: int | None = None) -> int:
    """--forks, else the user's Ansible `forks` (config or ANSIBLE_FORKS), else one per host (5-50)."""
    if forks:
        return forks
    if user_forks:
        return user_forks
    return max(5, min(n_hosts, MAX_DEFAULT_FORKS))


def ansible_env(run_dir: Path, forks: int, inventories: Sequence[str] = (),
                cfg: ansiblecfg.UserConfig | None = None) -> dict[str, str]:
    """The environment of an Ansible run: the user's config file (ANSIBLE_CONFIG), and our settings where
    neither that file nor the user's environment sets them (environment variables beat any ansible.cfg)."""
    if cfg is None:
        cfg = ansiblecfg.load(inventories)
    return ansiblecfg.overlay(ddpfix_defaults(run_dir, forks), cfg)


def ddpfix_defaults(run_dir: Path, forks: int) -> dict[str, str]:
    """ddpfix's own Ansible settings, before the user's configuration is applied."""
    state = paths.state_dir()
    cp_dir = paths.private_dir(state / "cp")
    ansible_bin = _ensure_ansible_on_path()
    return {
        "PATH": f"{ansible_bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_HOME": str(state / "ansible"),
        "ANSIBLE_LOCAL_TEMP": str(run_dir / "tmp"),
        "ANSIBLE_COLLECTIONS_PATH": str(paths.collections_dir()),
        "ANSIBLE_FORKS": str(forks),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=15",
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(cp_dir),
        "ANSIBLE_TIMEOUT": "10",
        # ansible-runner turns host key checking off by default; keep Ansible's own default (on) unless the
        # user turned it off explicitly (ansiblecfg.overlay keeps the user's value).
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_GATHERING": "explicit",
        "ANSIBLE_INJECT_FACT_VARS": "False",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_SYSTEM_WARNINGS": "False",
        "ANSIBLE_PYTHON_INTERPRETER": "auto_silent",
        "ANSIBLE_NOCOLOR": "1",
        # facts live as long as the ansible-playbook run that reads them (the CLI takes them from its events): a
        # persistent cache (jsonfile) would JSON-encode and write every node's facts at each fact-setting task and
        # decode them again at each task of each node, on the controller's one busy process (issue 21 item 6)
        "ANSIBLE_CACHE_PLUGIN": "memory",
    }


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
    base = paths.state_dir() / "runs"
    if base.is_dir():
        prune_runs(base)
    paths.private_dir(base)
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


#: The role whose first tasks take the node lock in every play (and whose `always` tasks release it).
NODE_LOCK_ROLE = "ddpfix_run"
#: The node lock's module; the lock is taken by a `fail` task of that role when another run holds it.
NODE_LOCK_MODULE = "ddpfix_run_lock"
#: The audit's facts module, which takes the node lock itself for its one task per node.
NODE_FACTS_MODULE = "ddpfix_node_facts"


def is_node_lock_task(t: TaskResult) -> bool:
    """A task that takes or releases the node lock: one of role ddpfix_run's, but for its pre-flight (the same module
    with `state: writable`, whose result says `unwritable`)."""
    args = (t.res.get("invocation") or {}).get("module_args") or {} if isinstance(t.res, dict) else {}
    preflight = "unwritable" in t.res or (isinstance(args, dict) and args.get("state") == "writable")
    return t.in_role(NODE_LOCK_ROLE) and not preflight


def lock_held_elsewhere(t: TaskResult, message: str) -> bool:
    """A failed node-lock task of role ddpfix_run reporting that another run holds the lock (exit 5); a lock
    module that broke is a failure of that host, not "locked"."""
    if t.status != "failed" or "is held by" not in message:
        return False
    # the audit's facts module takes the node lock itself (module_utils ddpfix_lock), in its one task per node
    return (t.in_role(NODE_LOCK_ROLE) and (t.is_action("fail") or t.is_action(NODE_LOCK_MODULE))) or (
        t.is_action(NODE_FACTS_MODULE) and bool(t.res.get("locked")))


def changed_before(hosts: Mapping[str, HostResult], check: bool = False) -> str:
    """What a run that stopped (exit 5) had changed by then, in one clause: per node, the tasks that reported a
    change (under --check: would have), or that it changed nothing."""
    done = {h: [t.task for t in hr.tasks if t.status == "changed"] for h, hr in sorted(hosts.items())}
    done = {h: ts for h, ts in done.items() if ts}
    verb = "would have changed" if check else "changed"
    if not done:
        return f"this run {'would have changed' if check else 'had changed'} nothing before it stopped"
    return f"this run {verb} before it stopped: " + "; ".join(
        f"{h}: {', '.join(ts[:5])}{f' (+{len(ts) - 5} more)' if len(ts) > 5 else ''}" for h, ts in done.items())


class _Interrupt:
    """Ctrl-C/SIGTERM during a run: the first one asks the play to start no new task (a stop file that the
    remediate playbook checks before each step, `__ddpfix_go`); running tasks finish. A second one kills the run."""

    def __init__(self, stop_file: Path) -> None:
        self.stop_file = stop_file
        self.signals = 0
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: object) -> None:
        self.signals += 1
        if self.signals == 1:
            with contextlib.suppress(OSError):
                self.stop_file.write_text(f"{signal.Signals(signum).name}\n")
            print("ddpfix: interrupted: finishing the running tasks, starting no new one "
                  "(interrupt again to kill the run now)", file=sys.stderr, flush=True)
        elif self.signals == 2:
            print("ddpfix: killing the run now: node locks (/run/ddpfix.lock) stay until a run takes them over "
                  "(ddpfix_run_stale_minutes) or you remove them", file=sys.stderr, flush=True)

    def cancel(self) -> bool:
        return self.signals > 1

    def __enter__(self) -> _Interrupt:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


EventCallback = Callable[[dict[str, Any]], None]


def run_playbook(
    playbook: str,
    inventories: Sequence[str],
    *,
    extravars: Mapping[str, Any] | None = None,
    limit: str | None = None,
    forks: int | None = None,
    n_hosts: int = 5,
    check: bool = False,
    diff: bool = False,
    tags: str | None = None,
    skip_tags: str | None = None,
    verbosity: int = 0,
    on_event: EventCallback | None = None,
    name: str | None = None,
    interruptible: bool = False,
    preload: Sequence[str] = (),
) -> RunResult:
    """Run one of our playbooks; return per-host results. Raises DdpfixError on run failure, on a node lock
    held by another run (LOCKED) and, unless `interruptible` (the caller reports what changed), on Ctrl-C or
    SIGTERM (INTERRUPTED). `preload`: modules the caller needs after the run, imported in a background thread
    while ansible-playbook starts (this process only waits then), off the path of the user's wait."""
    import ansible_runner  # slow import: only when a run happens

    _no_close_delay_after_exit()
    pb_path = paths.playbook(playbook)
    if not pb_path.is_file():
        raise DdpfixError(f"internal: playbook {pb_path} is missing from the installation", ExitCode.RUN_FAILED)
    run_dir = new_run_dir(name or Path(playbook).stem)
    (run_dir / "tmp").mkdir(mode=0o700)
    cfg = ansiblecfg.load(inventories)
    nforks = default_forks(n_hosts, forks, ansiblecfg.user_forks(cfg))
    user_args = ansibleargs.current()  # -u/-b/--private-key/-K/-e as ansible-playbook takes them
    # a prompt nobody answers would hang the run: refuse before anything starts
    asks = ansiblecfg.prompts(cfg)
    if "become" in asks and not user_args.ask_become_pass:
        raise DdpfixError(f"become_ask_pass is on ({cfg.path or 'ANSIBLE_BECOME_ASK_PASS'}): pass -K, ddpfix asks "
                          "for the password once", ExitCode.INVALID_INPUT)
    if "ssh" in asks:
        raise DdpfixError(f"ask_pass is on ({cfg.path or 'ANSIBLE_ASK_PASS'}): ddpfix does not answer SSH password "
                          "prompts; use SSH keys (--private-key) or turn ask_pass off", ExitCode.INVALID_INPUT)
    cmdline: list[str] = user_args.cmdline()
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    stop_file = run_dir / "stop"
    locked_file = run_dir / "locked"  # action ddpfix_cluster: another run holds the cluster's controller lock
    # the user's -e first: ddpfix's own names were refused there (ansibleargs.RESERVED_PREFIXES), so nothing of
    # the plan is replaced; the user's values are data like the plan's (never templated)
    write_extravars(run_dir, {**user_args.extra_vars, "ddpfix_run_holder": holder_info(), **dict(extravars or {})})
    hosts: dict[str, HostResult] = {}
    lock = threading.Lock()

    def handler(event: dict[str, Any]) -> bool:
        data = event.get("event_data") or {}
        with lock:
            record_event(hosts, event)
        if on_event is not None:
            on_event(event)
        # what ansible-runner writes to job_events/ after this handler: secret-looking values redacted (the
        # TaskResults above keep the originals: the cluster view carries ddp_env_extra for the plan)
        if isinstance(data.get("res"), dict):
            scrubbed = _scrub(data["res"])
            if scrubbed != data["res"]:
                data["res"] = scrubbed
        return True

    started = time.monotonic()
    try:
        with _Interrupt(stop_file) as interrupt, private_umask():
            r = ansible_runner.run(
                private_data_dir=str(run_dir),
                # ansible-playbook runs in the user's directory, as if they had typed it there: relative paths in
                # their config, inventory variables and ssh arguments mean what they mean to them.
                project_dir=_working_dir(pb_path.parent),
                playbook=str(pb_path),
                inventory=[str(Path(i).resolve()) for i in inventories],
                # extravars go in env/extravars (ansible-runner passes `-e @file`), never inline on the command
                # line: a plan for thousands of hosts would exceed the kernel's per-argument limit (E2BIG).
                limit=limit,
                forks=nforks,
                cmdline=ansibleargs.shell_join(cmdline),
                passwords=user_args.passwords(),  # -K: answered on ansible-playbook's terminal, in memory only
                tags=tags,
                skip_tags=skip_tags,
                verbosity=verbosity if verbosity >= 3 else None,
                envvars={**ansible_env(run_dir, nforks, inventories, cfg), **STRICT_INVENTORY,
                         "DDPFIX_STOP_FILE": str(stop_file), HELD_ENV: os.environ.get(HELD_ENV, ""),
                         "DDPFIX_LOCKED_FILE": str(locked_file)},
                # ansible-runner would otherwise force its jsonfile fact cache over ANSIBLE_CACHE_PLUGIN (ddpfix's
                # memory cache, or the user's own setting, which then stays in force)
                fact_cache_type="memory",
                event_handler=handler,
                status_handler=_preloader(preload),
                cancel_callback=interrupt.cancel,
                quiet=True,
                json_mode=False,
                suppress_env_files=True,
            )
    except KeyboardInterrupt as exc:
        raise DdpfixError("interrupted", ExitCode.INTERRUPTED) from exc
    finally:
        redact_extravars(run_dir)  # the run is over: what stays in its directory holds no secret
        owner_only(run_dir)
    seconds = time.monotonic() - started
    stats = r.stats or {}
    for h in (stats.get("dark") or {}):
        hosts.setdefault(h, HostResult(name=h)).unreachable = True
    if locked_file.is_file():  # stopped before any node was contacted: another run holds the cluster's lock
        raise DdpfixError(locked_file.read_text().strip(), ExitCode.LOCKED)
    locked: dict[str, list[str]] = {}  # message -> nodes
    for h, hr in sorted(hosts.items()):
        # only a lock another run holds is "locked" (exit 5); a lock module that broke is a failure of that host
        if any(lock_held_elsewhere(t, hr.message) for t in hr.tasks):
            locked.setdefault(hr.message, []).append(h)
    if locked:
        what = "; ".join(f"{', '.join(nodes)}: {msg}" for msg, nodes in locked.items())
        raise DdpfixError(f"another ddpfix run holds the node lock: {what}; {changed_before(hosts, check)} "
                          f"[run dir: {run_dir}]", ExitCode.LOCKED)
    if interrupt.signals:
        result = RunResult(status=r.status, rc=r.rc, stats=stats, hosts=hosts, run_dir=run_dir, seconds=seconds,
                           interrupted=True)
        if interruptible:
            return result
        raise DdpfixError(f"interrupted: the run stopped before its end [run dir: {run_dir}]", ExitCode.INTERRUPTED)
    if r.status not in ("successful", "failed"):
        tail = _stdout_tail(r)
        raise DdpfixError(f"ansible run {r.status} (rc={r.rc}): {tail} [run dir: {run_dir}]", ExitCode.RUN_FAILED)
    if r.status == "failed" and not stats:
        # No stats at all: the playbook never ran (syntax error, inventory error, ...)
        tail = _stdout_tail(r)
        if "no hosts to target" in tail or "Could not match supplied host pattern" in tail:
            raise DdpfixError(f"--limit {limit!r} matches no host of the inventory", ExitCode.INVALID_INPUT)
        raise DdpfixError(f"ansible-playbook failed (rc={r.rc}): {tail} [run dir: {run_dir}]", ExitCode.RUN_FAILED)
    return RunResult(status=r.status, rc=r.rc, stats=stats, hosts=hosts, run_dir=run_dir, seconds=seconds)


def _preloader(modules: Sequence[str]) -> Callable[..., None] | None:
    """An ansible-runner status handler that imports `modules` in a daemon thread once the run is starting."""
    if not modules:
        return None

    def load() -> None:
        import importlib

        for name in modules:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)

    def on_status(data: Mapping[str, Any], **_: Any) -> None:
        if data.get("status") == "running":
            threading.Thread(target=load, name="ddpfix-preload", daemon=True).start()

    return on_status


def _no_close_delay_after_exit() -> None:
    """ansible-runner runs ansible-playbook on a pty (ptyprocess) and closes it once the child has exited; ptyprocess's
    close sleeps `delayafterclose` (0.1 s) first, "to give the kernel time to update the process status", which is
    known already when the child was reaped. Skip that sleep then (a child still alive keeps it, and is terminated as
    before): 0.1 s of every run, 5 % of a 4-node audit."""
    import ptyprocess  # type: ignore[import-untyped]

    close = ptyprocess.PtyProcess.close
    if getattr(close, "_ddpfix", False):
        return

    def close_reaped_without_delay(self: Any, force: bool = True) -> None:
        if getattr(self, "terminated", False):
            self.delayafterclose = 0.0
        close(self, force)

    close_reaped_without_delay._ddpfix = True  # type: ignore[attr-defined]
    ptyprocess.PtyProcess.close = close_reaped_without_delay


def _working_dir(fallback: Path) -> str:
    """The directory ddpfix was started in (where the user would have typed ansible-playbook), if it still exists."""
    try:
        return os.getcwd()
    except OSError:
        return str(fallback)


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
    import json

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


def redact_extravars(run_dir: Path) -> None:
    """Rewrite `<run dir>/env/extravars` with secret-looking values (`plan.is_secret`) replaced by ***: the plan's env
    values were needed by the run, not by whoever reads the run directory later."""
    import json

    path = run_dir / "env" / "extravars"
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return
    scrubbed = _scrub(data)
    if scrubbed != data:  # as it is (already `as_data`), atomically, 0600
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(scrubbed, f)
        os.replace(tmp, path)


def _scrub(obj: Any) -> Any:
    """`obj` (JSON data) with secret-looking values (`plan.is_secret`, by key name or URL userinfo) replaced by ***,
    and KEY=value lines of secret keys in strings redacted (`plan.redact_env`)."""
    from ddpfix.plan import envfile_lib

    lib = envfile_lib()

    def walk(o: Any, key: str = "") -> Any:
        if isinstance(o, dict):
            if set(o) == {"__ansible_unsafe"}:  # as_data's wrapper: the value still belongs to the key above
                return {"__ansible_unsafe": walk(o["__ansible_unsafe"], key)}
            return {k: walk(v, str(k)) for k, v in o.items()}
        if isinstance(o, list):  # a list under a secret-looking name holds names (outside_keys), not values
            return [walk(v) for v in o]
        if isinstance(o, str):
            if key and lib.is_secret(key, o):
                return lib.REDACTED
            return lib.redact(o) if ("=" in o or "@" in o) else o
        return o

    return walk(obj)


def _one_line(text: object) -> str:
    s = str(text).strip().replace("\r", "")
    return " ".join(s.split())[:400]


def _stdout_tail(r: Any) -> str:
    try:
        lines = [ln for ln in r.stdout.read().splitlines() if ln.strip()]
    except Exception:  # noqa: BLE001 - best effort diagnostics
        return "no output"
    for ln in reversed(lines):
        if "ERROR" in ln or "error" in ln:
            return _one_line(ln)
    return _one_line(lines[-1]) if lines else "no output"


def check_inventory_paths(inventories: Sequence[str]) -> None:
    """Every inventory source exists (an ad-hoc host list is a file by now)."""
    for inv in inventories:
        if not Path(inv).exists():
            raise DdpfixError(f"inventory not found: {inv}", ExitCode.INVALID_INPUT)


def list_inventory(inventories: Sequence[str]) -> dict[str, Any]:
    """What `ansible-inventory --list` prints (groups and merged host vars), read in this process with Ansible's
    own InventoryCLI (the user's ansible.cfg, inventory plugins, group_vars/host_vars), without a second process.
    Falls back to `ansible-inventory` through ansible-runner when Ansible's configuration was already loaded in this
    process from another config file (its settings are read once per process)."""
    check_inventory_paths(inventories)
    run_dir = new_run_dir("inventory")
    env = {**ansible_env(run_dir, 1, inventories), **STRICT_INVENTORY}
    try:
        data = _inventory_in_process(inventories, env)
        if data is None:
            data = _inventory_subprocess(inventories, env, run_dir)
    finally:
        discard_run_dir(run_dir)
    # -e: the highest precedence, over every host's variables, as in ansible-playbook's hostvars
    return ansibleargs.apply_to_inventory(data, ansibleargs.current().extra_vars)


def _inventory_in_process(inventories: Sequence[str], env: Mapping[str, str]) -> dict[str, Any] | None:
    import contextlib
    import io
    import json
    import sys
    import warnings

    loaded = sys.modules.get("ansible.constants")
    if loaded is not None and str(getattr(loaded, "CONFIG_FILE", None) or "") != str(env.get("ANSIBLE_CONFIG") or ""):
        return None  # Ansible's settings were read already, from another file: ask a fresh process
    if loaded is not None and not all(getattr(loaded, k, False) is True
                                      for k in ("INVENTORY_UNPARSED_IS_FAILED", "INVENTORY_ANY_UNPARSED_IS_FAILED")):
        return None  # ... or without the strict inventory settings (something imported Ansible before this read)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from ansible import constants as C
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.plugins.loader import init_plugin_loader
        from ansible.vars.manager import VariableManager

        quiet = io.StringIO()  # Ansible's warnings (a source no plugin parsed) stay out of ddpfix's output
        try:
            with contextlib.redirect_stderr(quiet), contextlib.redirect_stdout(quiet), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "AnsibleCollectionFinder has already been configured" (2nd read)
                init_plugin_loader([])
                loader = DataLoader()
                inventory = InventoryManager(loader=loader, sources=[str(Path(i).resolve()) for i in inventories])
                vm = VariableManager(loader=loader, inventory=inventory)
                data = _inventory_list(inventory, vm, C.INTERNAL_STATIC_VARS)
            return dict(json.loads(json.dumps(data, default=_json_plain)))
        except AnsibleError as exc:
            raise DdpfixError(f"cannot read inventory {', '.join(inventories)}: {_one_line(exc)}") from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _json_plain(value: Any) -> Any:
    """`json.dumps`'s fallback for the values of an inventory read in this process, as `ansible-inventory --list`
    prints them: plain data whatever ansible-core 2.17-2.19 wrapped them in. Its str/int/float/dict/list subclasses
    (AnsibleUnsafeText, 2.19's tagged values) are written as what they are by json itself; here dates become ISO
    text, sets and tuples lists, bytes text, and anything else its text (a vaulted value: its plain text, as
    ansible-inventory prints it). Nothing is templated: a value is read as it is, "{{ ... }}" stays that text."""
    import datetime

    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return str(value)


def _inventory_list(inventory: Any, vm: Any, internal: Any) -> dict[str, Any]:
    """`ansible-inventory --list` (InventoryCLI.json_inventory without --export): groups with their direct hosts
    and children, and every host's merged variables minus Ansible's internal ones."""
    seen: set[str] = set()
    hosts = inventory.get_hosts("all")
    available = frozenset(h.name for h in hosts)
    out: dict[str, Any] = {}

    def group(g: Any) -> None:
        entry: dict[str, Any] = {}
        if g.name != "all":
            entry["hosts"] = [h.name for h in g.hosts if h.name in available]
        entry["children"] = [c.name for c in g.child_groups]
        for c in g.child_groups:
            if c.name not in seen:
                seen.add(c.name)
                group(c)
        entry = {k: v for k, v in entry.items() if v}
        if entry:
            out[g.name] = entry

    group(inventory.groups["all"])
    hostvars = {}
    for h in hosts:
        hv = vm.get_vars(host=h, include_hostvars=False, stage="all")
        hv = {k: v for k, v in hv.items() if k not in internal}
        if hv:
            hostvars[h.name] = hv
    out["_meta"] = {"hostvars": hostvars}
    return out


def _inventory_subprocess(inventories: Sequence[str], env: Mapping[str, str], run_dir: Path) -> dict[str, Any]:
    import json

    import ansible_runner

    with private_umask():
        out, err = ansible_runner.get_inventory(
            action="list",
            inventories=[str(Path(i).resolve()) for i in inventories],
            response_format="json",
            quiet=True,
            private_data_dir=str(run_dir),
            envvars=dict(env),
        )
    if not out:
        raise DdpfixError(f"cannot read inventory {', '.join(inventories)}: {_one_line(err or 'no output')}")
    return dict(out if isinstance(out, dict) else json.loads(out))
