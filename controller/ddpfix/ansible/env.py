"""The Ansible environment of a run: where ansible-playbook is, how many forks, and the settings a run gets (the
user's Ansible configuration (`ddpfix.ansible.config`) first, ddpfix's own defaults only where the user set none)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from ddpfix import paths
from ddpfix.ansible import config as ansiblecfg
from ddpfix.errors import DdpfixError, ExitCode

#: Default upper bound on forks when the user does not pass --forks.
MAX_DEFAULT_FORKS = 50
#: The length of the name ansible-core's ssh connection gives a control socket (the first 10 hex digits of a sha1).
ANSIBLE_CONTROL_NAME = 10
#: The callback every run enables, after the user's own (plugins/callback/ddpfix_exit.py).
EXIT_CALLBACK = "{}.{}.ddpfix_exit".format(*paths.COLLECTION)
#: The callback that builds the payloads of the modules a run names (DDPFIX_PAYLOADS) while the playbook starts
#: (plugins/callback/ddpfix_payloads.py).
PAYLOADS_CALLBACK = "{}.{}.ddpfix_payloads".format(*paths.COLLECTION)
#: An inventory source Ansible cannot parse is an error, never a warning with fewer hosts (the audit's ansible-playbook
#: is the one reader of the inventory: it must fail where the CLI's own read would).
STRICT_INVENTORY = {"ANSIBLE_INVENTORY_UNPARSED_FAILED": "True", "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True"}



@contextlib.contextmanager
def environ(updates: Mapping[str, str]) -> Iterator[None]:
    """This process's environment with `updates` set for the block, and as it was after it (set or unset)."""
    saved = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
    cp_dir = paths.control_dir(ANSIBLE_CONTROL_NAME)
    ansible_bin = _ensure_ansible_on_path()
    return {
        "PATH": f"{ansible_bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_HOME": str(paths.private_dir(state / "ansible", "Ansible home (ANSIBLE_HOME)")),
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
        # ansible-playbook exits without the interpreter's final garbage collection over everything it loaded
        # (plugins/callback/ddpfix_exit.py): 0.2-0.3 s of every run on a 2-core controller; the payloads of the
        # modules the run names are built while the playbook starts (plugins/callback/ddpfix_payloads.py)
        "ANSIBLE_CALLBACKS_ENABLED": f"{EXIT_CALLBACK},{PAYLOADS_CALLBACK}",
    }



def working_dir(fallback: Path) -> str:
    """The directory ddpfix was started in (where the user would have typed ansible-playbook), if it still exists."""
    try:
        return os.getcwd()
    except OSError:
        return str(fallback)
