"""ansible-playbook's own options (`-e`, `-u`, `-b`, `--private-key`, `-K`) as the CLI took them, for every run.

The CLI fills one `AnsibleArgs` (the Application's) and `use()`s it; `ansible.run.run_playbook` reads `current()` when a
run starts, and the in-process inventory read applies `extra_vars` over every host's variables, as ansible-playbook
does (extra vars have the highest precedence). Like ansible-core's own `context.CLIARGS`: the command line of this
process, set once.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpfix.errors import DdpfixError, ExitCode

#: Prefixes of ddpfix's own variables (the plan's, the roles' inputs it sets): refused in -e, never silently replaced.
RESERVED_PREFIXES = ("ddpfix_", "__ddpfix")

#: ansible-playbook's prompt for -K (`BECOME password: `, ansible-core 2.17 to 2.19), answered by ansible-runner.
BECOME_PROMPT = r"^BECOME password.*:\s*?$"


@dataclass
class AnsibleArgs:
    user: str | None = None
    become: bool = False
    private_key: str | None = None
    ask_become_pass: bool = False
    extra_vars: dict[str, Any] = field(default_factory=dict)
    become_password: str | None = field(default=None, repr=False)  # -K's answer: in memory only

    def cmdline(self) -> list[str]:
        """The ansible-playbook arguments (extra vars go through the run's private extravars file instead)."""
        out: list[str] = []
        if self.user:
            out += ["--user", self.user]
        if self.become:
            out.append("--become")
        if self.private_key:
            out += ["--private-key", self.private_key]
        if self.ask_become_pass:
            out.append("--ask-become-pass")
        return out

    def passwords(self) -> dict[str, str] | None:
        """ansible-runner's prompt answers (written to ansible-playbook's terminal, never to a file or argv)."""
        if self.ask_become_pass and self.become_password is not None:
            return {BECOME_PROMPT: self.become_password}
        return None


_current = AnsibleArgs()


def use(args: AnsibleArgs) -> None:
    global _current
    _current = args


def current() -> AnsibleArgs:
    return _current


def _bad(value: str, why: str) -> DdpfixError:
    return DdpfixError(f"-e/--extra-vars {json.dumps(value)[:200]}: {why}", ExitCode.INVALID_INPUT)


def parse_extra_vars(value: str) -> dict[str, Any]:
    """One `-e` value the way ansible-playbook reads it: `@file` (YAML or JSON), inline YAML/JSON (`{...}`), or
    `key=value ...` (strings). A mapping, else exit 2; ddpfix's own names (ddpfix_*) are refused."""
    import yaml  # CLI start: PyYAML only for a -e value
    from ansible.parsing.splitter import parse_kv  # ansible-core loads slowly (CLI start): only for a -e value

    value = value.strip()
    if not value:
        return {}
    data: Any
    try:
        if value.startswith("@"):
            path = Path(value[1:]).expanduser()
            try:
                text = path.read_text()
            except OSError as exc:
                raise _bad(value, f"cannot read {path}: {exc.strerror}") from None
            data = yaml.safe_load(text)
        elif value[0] in "/.":
            raise _bad(value, "a file name needs a leading @ (as in ansible-playbook)")
        elif value[0] in "[{":
            data = yaml.safe_load(value)
        else:
            data = parse_kv(value)
            if "_raw_params" in data:  # a word without '=' (ansible-playbook would pass `_raw_params` on)
                raise _bad(value, f"{json.dumps(data['_raw_params'])[:80]} is not key=value (quote a value with "
                                  "spaces; a file needs a leading @)")
    except yaml.YAMLError as exc:
        raise _bad(value, f"not YAML/JSON data ({' '.join(str(exc).split())[:200]}); vault files are not read "
                          "here: pass such values in the inventory") from None
    except Exception as exc:
        if isinstance(exc, DdpfixError):
            raise
        raise _bad(value, " ".join(str(exc).split())[:200]) from None
    if not isinstance(data, Mapping):
        raise _bad(value, "not a mapping of variable names to values")
    try:
        plain: dict[str, Any] = json.loads(json.dumps(dict(data)))  # plain JSON data (tagged strings, dates: refused)
    except (TypeError, ValueError) as exc:
        raise _bad(value, f"not JSON-representable data ({exc})") from None
    for key in plain:
        if key.startswith(RESERVED_PREFIXES):
            raise DdpfixError(f"-e/--extra-vars {key}: a ddpfix variable, set by ddpfix from its options and the "
                              "inventory; -e cannot override it (set the ddp_* inventory variable or the option)",
                              ExitCode.INVALID_INPUT)
    return plain


def merge_extra_vars(values: Sequence[str], into: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every -e in order, later ones winning per top-level key (ansible-core's default hash_behaviour=replace)."""
    out = dict(into or {})
    for v in values:
        out.update(parse_extra_vars(v))
    return out


def apply_to_inventory(data: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`ansible-inventory --list` data with the extra vars over every host's variables (what hostvars shows inside
    ansible-playbook -e). Every host of the inventory gets them, also one without variables of its own."""
    if not extra:
        return data
    meta = data.setdefault("_meta", {})
    hostvars: dict[str, Any] = meta.setdefault("hostvars", {})
    names: set[str] = set(hostvars)
    for group in data.values():
        if isinstance(group, Mapping):
            names.update(h for h in group.get("hosts") or () if isinstance(h, str))
    for name in names:
        hostvars[name] = {**(hostvars.get(name) or {}), **extra}
    return data


def shell_join(args: Sequence[str]) -> str | None:
    return shlex.join(args) if args else None
