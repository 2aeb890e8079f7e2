"""ddp_env_extra: keys and values checked on the controller with the env file's own grammar, before any node is
contacted (exit 2, one line naming the host, the key and the value)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpfix.ansible import collection
from ddpfix.cli import cli
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.inventory.contract import RESERVED_ENV_KEYS, check_env_extra
from ddpfix.inventory.derive import cluster_from_inventory_data
from ddpfix.plan import node_env, torchrun_env


def _data(extra: object) -> dict:
    hv = {"a": {"ansible_host": "192.0.2.1"}, "b": {"ansible_host": "192.0.2.2", "ddp_env_extra": extra}}
    return {"_meta": {"hostvars": hv}, "all": {"children": ["ddp_nodes"]}, "ddp_nodes": {"hosts": ["a", "b"]}}


def _refused(extra: object) -> str:
    with pytest.raises(DdpfixError) as exc:
        cluster_from_inventory_data(_data(extra))
    assert exc.value.code == ExitCode.INVALID_INPUT
    msg = str(exc.value)
    assert "\n" not in msg and "ddp_env_extra of b" in msg, msg
    return msg


TORCH_KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
              "GROUP_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "PET_NODE_RANK", "PET_NNODES",
              "PET_MASTER_ADDR", "PET_RDZV_ENDPOINT", "PET_ANYTHING", "TORCHELASTIC_RUN_ID",
              "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"]
DDPFIX_KEYS = ["NNODES", "NODE_RANK", "NPROC_PER_NODE", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
               "TP_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA"]


@pytest.mark.parametrize("key", TORCH_KEYS + DDPFIX_KEYS)
def test_reserved_keys_refused(key: str) -> None:
    msg = _refused({key: "0"})
    assert f"{key}='0' is reserved" in msg


def test_every_key_ddpfix_writes_is_reserved() -> None:
    """The plan's own keys (rendezvous, ranks, torchrun's PET_*, socket interfaces, process vars) can never be
    replaced by ddp_env_extra: a new key in plan.node_env must join the reserved set."""
    from ddpfix.inventory.contract import env_key_reserved

    written = {**node_env("10.0.0.1", 29500, 2, 1, 1, "eth0", process_vars=True),
               **torchrun_env("10.0.0.1", 29500, 2, 1, 1)}
    assert all(env_key_reserved(k) for k in written), [k for k in written if not env_key_reserved(k)]
    assert {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} <= RESERVED_ENV_KEYS


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a b", "NOTE='a b' would need quoting"),  # the case: refused up front, not by the node's module
        ("$(id)", "would need quoting"),
        ("`id`", "would need quoting"),
        ("{{ 7*191 }}", "would need quoting"),
        ("{{x}}", "would need quoting"),  # no space: braces alone are outside the grammar
        ("{%raw%}", "would need quoting"),
        ("{#c#}", "would need quoting"),
        ("${HOME}", "would need quoting"),
        ("x;reboot", "would need quoting"),
        ("a|b", "would need quoting"),
        ("a&b", "would need quoting"),
        ("'q'", "would need quoting"),
        ('"q"', "would need quoting"),
        ("a\\b", "would need quoting"),
        ("#comment", "would need quoting"),
        ("a*", "would need quoting"),
        ("a\tb", "would need quoting"),
        ("caf\u00e9", "would need quoting"),
        ("x\n", "must be one line"),
        ("x\nEVIL=1", "must be one line"),
        ("x\rEVIL=1", "must be one line"),
        ("x\0y", "must be one line"),
        ("x" * 4097, "at most 4096"),
    ],
)
def test_values_outside_the_env_grammar_refused(value: str, message: str) -> None:
    assert message in _refused({"NOTE": value})


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("nccl_debug", "key 'nccl_debug' is not an environment name"),
        ("1ABC", "is not an environment name"),
        ("A-B", "is not an environment name"),
        ("A B", "is not an environment name"),
        ("A=B", "is not an environment name"),
        ("A\nB", "is not an environment name"),
        ("A\n", "is not an environment name"),
        ("{{X}}", "is not an environment name"),
        ("", "is not an environment name"),
        ("A" * 129, "at most 128"),
        (5, "key 5 is not an environment name"),
    ],
)
def test_bad_keys_refused(key: object, message: str) -> None:
    assert message in _refused({key: "1"})


@pytest.mark.parametrize("value", [None, [], {}, ["a"], {"a": 1}])
def test_non_scalar_values_refused(value: object) -> None:
    assert "must be a string or number" in _refused({"NOTE": value})


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("INFO", "INFO"),
        (22, "22"),
        (True, "true"),
        (1.5, "1.5"),
        ("", ""),
        ("=mlx5_0:1,mlx5_1:1", "=mlx5_0:1,mlx5_1:1"),
        ("^docker,lo", "^docker,lo"),
        ("http://proxy.example:3128/", "http://proxy.example:3128/"),
        ("user@host", "user@host"),
        ("50%", "50%"),
        ("a+b-c_d.e", "a+b-c_d.e"),
        ("x" * 4096, "x" * 4096),
    ],
)
def test_values_in_the_grammar_kept_literally(value: object, written: str) -> None:
    c = cluster_from_inventory_data(_data({"NCCL_DEBUG": value}))
    assert dict(c.node("b").env_extra) == {"NCCL_DEBUG": written}
    # and the node's module accepts exactly what the controller accepted (one grammar)
    assert collection.module_utils("ddpfix_envfile").check_values({"NCCL_DEBUG": written}) is None


def test_controller_and_module_grammar_agree() -> None:
    """What the controller refuses, the module refuses too (and the other way round), for every printable ASCII
    character and a few others, alone and inside a value."""
    lib = collection.module_utils("ddpfix_envfile")
    for ch in [chr(i) for i in range(128)] + ["\u00e9", "\u2028", "\ufeff"]:
        for value in (ch, f"a{ch}b"):
            module_ok = lib.check_values({"K": value}) is None
            try:
                check_env_extra("h", "K", value)
                ctrl_ok = True
            except DdpfixError:
                ctrl_ok = False
            assert ctrl_ok == module_ok, repr(value)


def test_module_refuses_a_trailing_newline() -> None:
    """`$` matches before a final newline: the module's check matches the whole value."""
    lib = collection.module_utils("ddpfix_envfile")
    assert lib.check_values({"K": "x\n"}) is not None
    assert lib.check_values({"K\n": "x"}) is not None


def _inventory(tmp_path: Path, extra: str) -> Path:
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "ddp_nodes:\n  hosts:\n    a: {ansible_host: 192.0.2.1}\n"
        f"    b: {{ansible_host: 192.0.2.2, ddp_env_extra: {extra}}}\n"
    )
    return inv


@pytest.mark.parametrize("args", [["audit"], ["audit", "--no-probe"], ["remediate"], ["remediate", "--apply"],
                                  ["env"], ["env", "--apply"]])
@pytest.mark.parametrize(("extra", "message"), [
    ('{NOTE: "a b"}', "ddp_env_extra of b: env value NOTE='a b' would need quoting"),
    ('{PET_NODE_RANK: "0"}', "ddp_env_extra of b: PET_NODE_RANK='0' is reserved"),
    # Ansible templates inventory values (the inventory author's own templates); a value that is still template
    # text afterwards is outside the env grammar: refused, never handed on to be evaluated again
    ("{NOTE: \"{% raw %}{{ lookup('pipe', 'touch MARKER') }}{% endraw %}\"}",
     "ddp_env_extra of b: env value NOTE="),
])
def test_cli_refuses_before_any_node_is_contacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  args: list[str], extra: str, message: str) -> None:
    """Every command that reads the inventory refuses with exit 2 and one line, and runs no play (no run directory
    with events: no node was contacted). The hosts are TEST-NET addresses: a play would fail to reach them."""
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    extra = extra.replace("MARKER", str(tmp_path / "marker"))
    r = CliRunner().invoke(cli, ["-i", str(_inventory(tmp_path, extra)), *args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0] and ("quoting" in lines[0] or "reserved" in lines[0]), r.output
    assert not (tmp_path / "marker").exists()
    events = list((tmp_path / "state").rglob("job_events/*.json"))
    hosts_events = [e for e in events if '"host": "b"' in e.read_text() or '"host": "a"' in e.read_text()]
    assert not hosts_events, hosts_events


@pytest.mark.parametrize("playbook", ["remediate.yml", "audit.yml"])
def test_standalone_playbook_refuses_before_any_node_is_contacted(tmp_path: Path, playbook: str) -> None:
    """`ansible-playbook playbooks/remediate.yml` derives the cluster with the same inventory code (action
    ddpfix_cluster, run once on the controller, any_errors_fatal): the same one-line refusal, and no node is contacted
    (TEST-NET addresses: a connection attempt would say UNREACHABLE)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DDPFIX_STATE_DIR": str(tmp_path / "state"), "ANSIBLE_NOCOLOR": "1",
           "PYTHONPATH": os.pathsep.join([str(root / "controller"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    for k in ("DDPFIX_INVENTORY", "ANSIBLE_CACHE_PLUGIN", "ANSIBLE_CACHE_PLUGIN_CONNECTION"):
        env.pop(k, None)
    inv = _inventory(tmp_path, '{NOTE: "a b"}')
    exe = Path(sys.executable).parent / "ansible-playbook"
    p = subprocess.run([str(exe), "-i", str(inv), str(root / "playbooks" / playbook), "--check"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path), check=False)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "ddp_env_extra of b: env value NOTE='a b' would need quoting" in out, out
    assert "UNREACHABLE" not in out and "Failed to connect" not in out, out


@pytest.mark.parametrize("name", ["{{ 7*191 }}", "n$(id)", "a b", "a\nb", "x;y", "'q'", "n`id`"])
def test_hostile_inventory_host_names_refused(name: str) -> None:
    data = {"_meta": {"hostvars": {name: {}, "b": {}}}, "ddp_nodes": {"hosts": [name, "b"]}}
    with pytest.raises(DdpfixError) as exc:
        cluster_from_inventory_data(data)
    assert exc.value.code == ExitCode.INVALID_INPUT and f"inventory host name {name!r}" in str(exc.value)


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("ddpfix_firewall_revert_timeout", "soon", "ddpfix_firewall_revert_timeout of b 'soon'"),
        ("ddpfix_firewall_backend", "pf", "value of ddpfix_firewall_backend must be one of"),
        ("ddpfix_limits_units", {"a": 1}, "ddpfix_limits_units of b"),
        ("ddpfix_hosts_path", "/etc/hosts\n/etc/passwd", "contains a newline"),
        ("ddpfix_firewall_zone", "trusted\0", "control character"),
        ("ddpfix_chrony_install", "perhaps", "ddpfix_chrony_install of b"),
    ],
)
def test_role_inputs_set_in_the_inventory_checked_up_front(var: str, value: object, message: str) -> None:
    """A role input in the inventory is checked against its argument spec before any node is contacted, not when
    its role starts (the hosts role starts after the firewall and chrony were changed)."""
    data = _data({})
    data["_meta"]["hostvars"]["b"] = {var: value}
    with pytest.raises(DdpfixError) as exc:
        cluster_from_inventory_data(data)
    assert exc.value.code == ExitCode.INVALID_INPUT and message in str(exc.value) and "\n" not in str(exc.value)


def test_role_inputs_valid_or_templated_pass() -> None:
    data = _data({})
    data["_meta"]["hostvars"]["b"] = {"ddpfix_firewall_revert_timeout": "120", "ddpfix_hosts_path": "/etc/hosts",
                                      "ddpfix_chrony_conf_path": "{{ my_conf }}", "other_var": "a\nb"}
    assert cluster_from_inventory_data(data).names == ["a", "b"]


@pytest.mark.parametrize(
    ("extra", "secret"),
    [
        ({"WANDB_API_KEY": "abc def"}, "abc def"),
        ({"DB_PASSWORD": "p$w"}, "p$w"),
        ({"HF_TOKEN": "t\nx"}, "t\nx"),
        ({"HTTPS_PROXY": "http://user:s3cr3t@proxy:3128 x"}, "s3cr3t"),
        ({"MY_SECRET": "x" * 5000}, "x" * 5000),
    ],
)
def test_a_refused_secret_value_is_not_printed(extra: dict[str, str], secret: str) -> None:
    """The refusal names the host and the key; a secret-looking value stays in the inventory (never on stderr)."""
    msg = _refused(extra)
    assert secret not in msg and repr(secret) not in msg and "***" in msg, msg
    assert next(iter(extra)) in msg
