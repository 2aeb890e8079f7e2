"""Each file ddpfix writes is spelled once, and read from there (issue 38 item 1). The shipped files (controller,
plugins, roles, playbooks) that type each of these paths are listed here with the reason each one must: its source,
or a copy on the node side (modules and module_utils run on the node's Python, without the controller or the roles'
files) or a role's own default (a role stands on its own, from ansible-playbook or AWX), or documentation (a module's
DOCUMENTATION/EXAMPLES, a comment, a docstring). A new place that types one fails here: read it from its source.
The copies that must agree with their source are compared below."""

from __future__ import annotations

import posixpath
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("controller", "plugins", "roles", "playbooks")

NOFILE = "/etc/security/limits.d/90-ddpfix-nofile.conf"
ENV = "/etc/ddpfix/ddp.env"
CLUSTER = "cluster.json"
SPELLED: dict[str, dict[str, str]] = {
    NOFILE: {
        "roles/ddpfix_limits/defaults/main.yml": "the source: ddpfix_limits_nofile_path, what the fix writes",
        "plugins/module_utils/ddpfix_readers.py": "node side: the facts module's default (NOFILE_PATH)",
        "controller/ddpfix/rules/host.py": "the finding's fix text (NOFILE_PATH)",
    },
    ENV: {
        "controller/ddpfix/model/cluster.py": "the source of the controller: DEFAULT_ENV_PATH",
        "roles/ddpfix_env/defaults/main.yml": "the env role's default (ddp_env_path's)",
        "roles/ddpfix_facts/defaults/main.yml": "the facts role's default (ddp_env_path's)",
        "roles/ddpfix_verify/defaults/main.yml": "the verify role's default (ddp_env_path's)",
        "plugins/modules/ddpfix_node_facts.py": "node side: its env_path default and its DOCUMENTATION",
        "plugins/module_utils/ddpfix_files.py": "node side: the refusal of a volatile env path names a good place",
        "plugins/modules/ddpfix_env_file.py": "documentation: EXAMPLES",
        "plugins/modules/ddpfix_node_files.py": "documentation: EXAMPLES",
    },
    CLUSTER: {
        "controller/ddpfix/clusterfile.py": "the source of the controller: NAME (and its docstring)",
        "roles/ddpfix_env/defaults/main.yml": "the env role's default (ddpfix_env_cluster_path)",
        "roles/ddpfix_env/meta/argument_specs.yml": "documentation: ddpfix_env_cluster_path's description",
        "plugins/module_utils/ddpfix_readers.py": "node side: the env file's facts read the cluster file next to it",
        "controller/ddpfix/cli/check.py": "DEFAULT_CLUSTER_FILE: `check --local` loads before the plan modules",
        "controller/ddpfix/cli/env.py": "documentation: the command's help",
        "controller/ddpfix/remediate/preflight.py": "documentation: a docstring",
        "controller/ddpfix/remediate/writes.py": "documentation: a docstring",
        "plugins/modules/ddpfix_backup_prune.py": "documentation: EXAMPLES",
        "plugins/modules/ddpfix_node_files.py": "documentation: EXAMPLES",
    },
}


def _typed(literal: str) -> set[str]:
    out = set()
    for top in SHIPPED:
        for p in (ROOT / top).rglob("*"):
            if (p.suffix in (".py", ".yml", ".yaml", ".j2") and "collections" not in p.parts
                    and literal in p.read_text(encoding="utf-8", errors="replace")):
                out.add(p.relative_to(ROOT).as_posix())
    return out


@pytest.mark.parametrize("literal", sorted(SPELLED))
def test_each_path_is_typed_only_where_listed(literal: str) -> None:
    typed = _typed(literal)
    assert typed == set(SPELLED[literal]), (
        f"{literal!r} typed in files not listed (read it from its source instead): {sorted(typed - set(SPELLED[literal]))}; "
        f"listed but no longer typed (take them off the list): {sorted(set(SPELLED[literal]) - typed)}")


def test_the_copies_agree_with_their_source() -> None:
    from ddpfix import clusterfile
    from ddpfix.ansible.collection import module_utils
    from ddpfix.model.cluster import DEFAULT_ENV_PATH
    from ddpfix.rules.host import NOFILE_PATH

    limits = yaml.safe_load((ROOT / "roles" / "ddpfix_limits" / "defaults" / "main.yml").read_text())
    unit_dropins = yaml.safe_load((ROOT / "roles" / "ddpfix_limits" / "vars" / "main.yml").read_text())
    readers = module_utils("ddpfix_readers")
    assert limits["ddpfix_limits_nofile_path"] == readers.NOFILE_PATH == NOFILE_PATH == NOFILE
    assert posixpath.basename(readers.UNIT_NOFILE_PATH) == unit_dropins["__ddpfix_limits_nofile_dropin"]
    env_default = yaml.safe_load((ROOT / "roles" / "ddpfix_env" / "defaults" / "main.yml").read_text())
    assert f"default('{DEFAULT_ENV_PATH}')" in env_default["ddpfix_env_path"]
    assert env_default["ddpfix_env_cluster_path"].endswith("/" + clusterfile.NAME)
