"""The user's Ansible configuration, found and read the way `ansible-playbook` does.

ddpfix runs Ansible through ansible-runner, whose own settings (and ddpfix's) are environment
variables, which beat any ansible.cfg. So ddpfix finds the config file the user's own
`ansible-playbook` would use, passes it on as ANSIBLE_CONFIG, reads it (configparser, as Ansible
does) and sets one of its own defaults only where neither that file nor the user's environment
sets the same thing.

ddpfix's addition on top of ansible-core's own search (`ansible.config.manager.find_ini_config_file`, the function
`ansible-playbook` runs): an `ansible.cfg` next to the inventory (the `-i` directory, or the directory of an `-i` file)
comes before the user-wide files, so an inventory directory can carry its own SSH settings. The order (first
existing, readable file wins):

1. `ANSIBLE_CONFIG` (a file, or a directory holding `ansible.cfg`);
2. `./ansible.cfg` in the directory ddpfix runs in (skipped when that directory is world-writable);
3. `ansible.cfg` next to the inventory (ddpfix's addition);
4. `~/.ansible.cfg`;
5. `/etc/ansible/ansible.cfg`.
"""

from __future__ import annotations

import configparser
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddpfix.errors import DdpfixError, ExitCode

#: ddpfix's additions to the ssh arguments: connection reuse (one SSH handshake per node and run).
CONTROL_PERSIST_ARGS = "-o ControlMaster=auto -o ControlPersist=60s"
KEEPALIVE_ARGS = "-o ServerAliveInterval=15"
_CONTROL_RE = re.compile(r"(^|\s)-o\s*['\"]?\s*Control(Master|Persist)\b", re.I)
_KEEPALIVE_RE = re.compile(r"(^|\s)-o\s*['\"]?\s*ServerAlive(Interval|CountMax)\b", re.I)


@dataclass(frozen=True)
class Setting:
    """One Ansible setting: the variable ddpfix sets, its other env names and its ini keys."""

    env: str
    ini: tuple[tuple[str, str], ...]
    aliases: tuple[str, ...] = ()


# Where Ansible (ansible-core 2.1x: lib/ansible/config/base.yml and the ssh connection plugin) reads each setting
# that ddpfix has a default for.
SETTINGS: dict[str, Setting] = {s.env: s for s in (
    Setting("ANSIBLE_HOME", (("defaults", "home"),)),
    Setting("ANSIBLE_LOCAL_TEMP", (("defaults", "local_tmp"),)),
    Setting("ANSIBLE_FORKS", (("defaults", "forks"),)),
    Setting("ANSIBLE_PIPELINING", (("defaults", "pipelining"), ("connection", "pipelining"),
                                   ("ssh_connection", "pipelining")), ("ANSIBLE_SSH_PIPELINING",)),
    Setting("ANSIBLE_SSH_ARGS", (("ssh_connection", "ssh_args"),)),
    Setting("ANSIBLE_SSH_CONTROL_PATH_DIR", (("ssh_connection", "control_path_dir"),)),
    Setting("ANSIBLE_TIMEOUT", (("defaults", "timeout"), ("ssh_connection", "timeout")), ("ANSIBLE_SSH_TIMEOUT",)),
    Setting("ANSIBLE_HOST_KEY_CHECKING", (("defaults", "host_key_checking"), ("ssh_connection", "host_key_checking")),
            ("ANSIBLE_SSH_HOST_KEY_CHECKING",)),
    Setting("ANSIBLE_GATHERING", (("defaults", "gathering"),)),
    Setting("ANSIBLE_INJECT_FACT_VARS", (("defaults", "inject_facts_as_vars"),)),
    Setting("ANSIBLE_DEPRECATION_WARNINGS", (("defaults", "deprecation_warnings"),)),
    Setting("ANSIBLE_SYSTEM_WARNINGS", (("defaults", "system_warnings"),)),
    Setting("ANSIBLE_PYTHON_INTERPRETER", (("defaults", "interpreter_python"),)),
    Setting("ANSIBLE_COLLECTIONS_PATH", (("defaults", "collections_path"), ("defaults", "collections_paths")),
            ("ANSIBLE_COLLECTIONS_PATHS",)),
    Setting("ANSIBLE_CALLBACKS_ENABLED", (("defaults", "callbacks_enabled"),)),
)}


#: Where Ansible looks for collections when nothing is configured.
DEFAULT_COLLECTIONS_PATH = f"{Path('~/.ansible/collections').expanduser()}{os.pathsep}/usr/share/ansible/collections"


@dataclass(frozen=True)
class UserConfig:
    """The config file the user's Ansible would read (None: none) and its parsed content."""

    path: Path | None
    parser: configparser.ConfigParser

    def value(self, setting: Setting, environ: Mapping[str, str]) -> str | None:
        """What the user set for `setting`: the environment first (as Ansible), then the file; None: nothing."""
        for name in (setting.env, *setting.aliases):
            if name in environ:
                return environ[name]
        for section, key in reversed(setting.ini):  # Ansible: the later ini entry of a setting wins
            v = self.parser.get(section, key, raw=True, fallback=None)
            if v is not None:
                return v
        return None


def inventory_dirs(inventories: Sequence[str]) -> list[Path]:
    """The directories of the -i paths (a directory itself, or a file's directory); ad-hoc host lists have none."""
    out: list[Path] = []
    for inv in inventories:
        p = Path(inv).expanduser()
        if not p.exists():
            continue
        d = (p if p.is_dir() else p.parent).resolve()
        if d not in out:
            out.append(d)
    return out


def core_config_file() -> str | None:
    """The file ansible-core's own search finds (`ansible.config.manager.find_ini_config_file`, which `ansible-playbook`
    runs): ANSIBLE_CONFIG (a file, or a directory's ansible.cfg), ./ansible.cfg unless the working directory is
    world-writable, ~/.ansible.cfg, /etc/ansible/ansible.cfg; the first that exists and is readable. The same steps,
    without importing ansible-core's config manager (0.1 s of every command's start, before its ansible-playbook
    starts); tests/unit/ansible/test_ansiblecfg.py checks the two answer alike."""
    candidates: list[str] = []
    named = os.environ.get("ANSIBLE_CONFIG")
    if named is not None:
        path = _unfrack(named)
        candidates.append(os.path.join(path, "ansible.cfg") if os.path.isdir(path) else path)
    try:
        cwd = os.getcwd()
        if not os.stat(cwd).st_mode & stat.S_IWOTH:
            candidates.append(os.path.join(cwd, "ansible.cfg"))
    except OSError:  # no working directory: not a place to look (as ansible-core)
        pass
    candidates += [_unfrack("~/.ansible.cfg"), "/etc/ansible/ansible.cfg"]
    return next((c for c in candidates if os.path.exists(c) and os.access(c, os.R_OK)), None)


def _unfrack(path: str) -> str:
    """ansible-core's unfrackpath(path, follow=False): variables and ~ expanded, absolute, normalised."""
    return os.path.normpath(os.path.join(os.getcwd(), os.path.expanduser(os.path.expandvars(path))))


def find_config(inventories: Sequence[str] = ()) -> Path | None:
    """The ansible.cfg the user's Ansible would read, from this process's environment and working directory:
    ansible-core's own search (`core_config_file`), with an inventory's ansible.cfg before the user-wide files (see
    the module docstring)."""
    found = core_config_file()
    if found is not None:
        path = Path(found)
        user_wide = {Path("~/.ansible.cfg").expanduser(), Path("/etc/ansible/ansible.cfg")}
        named = os.environ.get("ANSIBLE_CONFIG")
        if named is not None:
            p = Path(named).expanduser()
            named_path = p / "ansible.cfg" if p.is_dir() else p
            if named_path.absolute() == path.absolute():
                return path.resolve()
        if path not in user_wide:
            return path.resolve()
    for d in inventory_dirs(inventories):
        c = d / "ansible.cfg"
        if c.is_file() and os.access(c, os.R_OK):
            return c.resolve()
    return None if found is None else Path(found).resolve()


def read_config(path: Path | None) -> UserConfig:
    """Parse `path` as Ansible does (configparser, ';' inline comments, raw values)."""
    parser = configparser.ConfigParser(inline_comment_prefixes=(";",))
    if path is not None:
        try:
            parser.read_string(path.read_text(encoding="utf-8"), source=str(path))
        except (OSError, UnicodeError, configparser.Error) as exc:
            raise DdpfixError(f"cannot read the Ansible config {path}: {' '.join(str(exc).split())}",
                              ExitCode.INVALID_INPUT) from None
    return UserConfig(path, parser)


def load(inventories: Sequence[str] = ()) -> UserConfig:
    return read_config(find_config(inventories))


def user_inventory(environ: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
                   ) -> tuple[str, tuple[str, ...]]:
    """The inventory the user's `ansible-playbook` would read when given no -i: ANSIBLE_INVENTORY, else `inventory`
    in [defaults] of the config file it would read (relative paths from that file's directory, as Ansible
    resolves a path list from a file). Returns (where it was set, the paths); ("", ()) when neither sets one
    (Ansible's built-in /etc/ansible/hosts is not used: ddpfix audits only an inventory the user named)."""
    env = os.environ if environ is None else environ
    raw = env.get("ANSIBLE_INVENTORY", "").strip()
    base, origin = Path(cwd or os.getcwd()), "ANSIBLE_INVENTORY"
    if not raw:
        cfg = read_config(find_config(()))
        raw = (cfg.parser.get("defaults", "inventory", raw=True, fallback="") or "").strip()
        if not raw or cfg.path is None:
            return "", ()
        base, origin = cfg.path.parent, f"inventory in {cfg.path}"
    paths = tuple(os.path.normpath(base / Path(p.strip()).expanduser()) for p in raw.split(",") if p.strip())
    return origin, paths


def extend_ssh_args(user: str | None, ours_control: str = CONTROL_PERSIST_ARGS,
                    ours_keepalive: str = KEEPALIVE_ARGS) -> str:
    """The user's ssh_args plus ddpfix's connection reuse and keepalive, each only when the user set none.

    Never drops or reorders anything the user wrote. With no user value, Ansible's default `-C` is kept."""
    base = "-C" if user is None else user.strip()
    extra = []
    if not _CONTROL_RE.search(base):
        extra.append(ours_control)
    if not _KEEPALIVE_RE.search(base):
        extra.append(ours_keepalive)
    return " ".join(x for x in [base, *extra] if x)


def overlay(defaults: Mapping[str, str], cfg: UserConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """ddpfix's Ansible env vars minus every setting the user set (file or environment).

    `ANSIBLE_SSH_ARGS` is the user's value extended (see `extend_ssh_args`); `ANSIBLE_COLLECTIONS_PATH` is
    ddpfix's collection first, then the user's; `ANSIBLE_CALLBACKS_ENABLED` is the user's callbacks, then ddpfix's;
    `ANSIBLE_CONFIG` names the user's file. Keys that are not in
    SETTINGS (ddpfix's private run files) are always kept."""
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for key, ours in defaults.items():
        setting = SETTINGS.get(key)
        if setting is None:
            out[key] = ours
            continue
        user = cfg.value(setting, env)
        if key == "ANSIBLE_SSH_ARGS":
            out[key] = extend_ssh_args(user)
        elif key == "ANSIBLE_COLLECTIONS_PATH":
            # ddpfix's collection first, then the user's collections (or Ansible's default places).
            out[key] = f"{ours}{os.pathsep}{user if user is not None else DEFAULT_COLLECTIONS_PATH}"
        elif key == "ANSIBLE_CALLBACKS_ENABLED":
            # the user's callbacks stay enabled (a variable replaces the file's list): theirs, then ddpfix's
            theirs = [c.strip() for c in (user or "").split(",") if c.strip()]
            out[key] = ",".join([*theirs, *(c for c in ours.split(",") if c not in theirs)])
        elif key == "ANSIBLE_HOST_KEY_CHECKING":
            # ansible-runner turns host key checking off unless the variable is set: keep the user's
            # choice, or Ansible's own default (on).
            out[key] = ours if user is None else user
        elif user is None:
            out[key] = ours
    if cfg.path is not None:
        out["ANSIBLE_CONFIG"] = str(cfg.path)
    return out


def user_forks(cfg: UserConfig, environ: Mapping[str, str] | None = None) -> int | None:
    """`forks` from the user's environment or config (None when unset or not a positive integer)."""
    v = cfg.value(SETTINGS["ANSIBLE_FORKS"], os.environ if environ is None else environ)
    try:
        n = int(str(v).strip()) if v is not None else 0
    except ValueError:
        return None
    return n if n > 0 else None


#: Settings that make ansible-playbook prompt for a password on its terminal (ddpfix answers only -K's, from memory).
PROMPTS: dict[str, Setting] = {
    "become": Setting("ANSIBLE_BECOME_ASK_PASS", (("privilege_escalation", "become_ask_pass"),)),
    "ssh": Setting("ANSIBLE_ASK_PASS", (("defaults", "ask_pass"),)),
}


def prompts(cfg: UserConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """Which password prompts (`PROMPTS` keys) the user's environment or config turns on (Ansible's booleans)."""
    env = os.environ if environ is None else environ
    return [name for name, setting in PROMPTS.items()
            if str(cfg.value(setting, env) or "").strip().lower() in ("1", "true", "yes", "on", "y", "t")]
