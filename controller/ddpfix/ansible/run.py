"""The run itself: the only place that starts Ansible (through ansible-runner). A run runs in the user's working
directory with the user's Ansible configuration and returns typed per-host results (`ddpfix.ansible.results`)."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddpfix import paths
from ddpfix.ansible import args as ansibleargs
from ddpfix.ansible import config as ansiblecfg
from ddpfix.ansible.env import STRICT_INVENTORY, ansible_env, default_forks, working_dir
from ddpfix.ansible.results import HostResult, RunResult, changed_before, lock_held_elsewhere, record_event, short_line
from ddpfix.ansible.rundirs import (
    LiveOutput,
    new_run_dir,
    owner_only,
    private_umask,
    redact_extravars,
    scrub,
    write_event,
    write_extravars,
)
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.lock import HELD_ENV, OWNER_ENV, holder_info


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
    payloads: Sequence[str] = (),
) -> RunResult:
    """Run one of our playbooks; return per-host results. Raises DdpfixError on run failure, on a node lock
    held by another run (LOCKED) and, unless `interruptible` (the caller reports what changed), on Ctrl-C or
    SIGTERM (INTERRUPTED). `preload`: modules the caller needs after the run, imported in a background thread
    while ansible-playbook starts (this process only waits then), off the path of the user's wait. `payloads`: ddpfix's
    modules whose payloads ansible-playbook builds while the playbook starts, before the task that
    sends them (plugins/callback/ddpfix_payloads.py)."""
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
    ident = uuid.uuid4().hex  # ansible-runner's artifacts/<ident>/: where the handler writes the events
    events_dir = run_dir / "artifacts" / ident / "job_events"
    live = LiveOutput()

    def handler(event: dict[str, Any]) -> bool:
        data = event.get("event_data") or {}
        with lock:
            record_event(hosts, event)
        if on_event is not None:
            on_event(event)
        # what ansible-runner writes to job_events/ after this handler: secret-looking values redacted (the
        # TaskResults above keep the originals: the cluster view carries ddp_env_extra for the plan)
        res = data.get("res") if isinstance(data.get("res"), dict) else None
        scrubbed = scrub(res) if res is not None else None
        if event.get("stdout"):  # the event's display text, in job_events/ too, without those secrets
            event["stdout"] = live.render(event["stdout"], res, scrubbed)
            if verbosity:  # -v..-vvvv: Ansible's own output, live, as ansible-playbook shows it
                sys.stderr.write(f"{event['stdout']}\n")
                sys.stderr.flush()
        if scrubbed is not None and scrubbed != res:
            data["res"] = scrubbed
        # written here, in one piece (rundirs.write_event); False: ansible-runner does not write it again
        return not write_event(events_dir, event)

    started = time.monotonic()
    try:
        with _Interrupt(stop_file) as interrupt, private_umask():
            r = ansible_runner.run(
                private_data_dir=str(run_dir),
                ident=ident,
                # ansible-playbook runs in the user's directory, as if they had typed it there: relative paths in
                # their config, inventory variables and ssh arguments mean what they mean to them.
                project_dir=working_dir(pb_path.parent),
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
                verbosity=min(verbosity, 4) or None,
                envvars={**ansible_env(run_dir, nforks, inventories, cfg), **STRICT_INVENTORY,
                         "DDPFIX_STOP_FILE": str(stop_file), HELD_ENV: os.environ.get(HELD_ENV, ""),
                         # a lock its first task takes is this command's, until the command ends (lock.command_owner)
                         OWNER_ENV: os.environ.get(OWNER_ENV, ""),
                         "DDPFIX_LOCKED_FILE": str(locked_file),
                         "DDPFIX_PAYLOADS": ",".join("{}.{}.{}".format(*paths.COLLECTION, m) for m in payloads)},
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
    import ptyprocess  # type: ignore[import-untyped]  # ansible-runner's dependency: loaded with it, at a run

    close = ptyprocess.PtyProcess.close
    if getattr(close, "_ddpfix", False):
        return

    def close_reaped_without_delay(self: Any, force: bool = True) -> None:
        if getattr(self, "terminated", False):
            self.delayafterclose = 0.0
        close(self, force)

    close_reaped_without_delay._ddpfix = True  # type: ignore[attr-defined]
    ptyprocess.PtyProcess.close = close_reaped_without_delay



def _stdout_tail(r: Any) -> str:
    try:
        lines = [ln for ln in r.stdout.read().splitlines() if ln.strip()]
    except Exception:  # noqa: BLE001 - best effort diagnostics
        return "no output"
    for ln in reversed(lines):
        if "ERROR" in ln or "error" in ln:
            return short_line(ln)
    return short_line(lines[-1]) if lines else "no output"
