"""ddp_python as an argv (ddpfix.model.pyargv): a plain word or the jobs' own launch as a YAML list (a container
runtime's), checked before any node is contacted; a hostile value is one line naming the variable, exit 2."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpfix.cli import cli
from ddpfix.errors import DdpfixError, ExitCode
from ddpfix.inventory.derive import cluster_from_inventory_data
from ddpfix.model import pyargv


def _data(hosts: dict[str, dict]) -> dict:
    return {"_meta": {"hostvars": hosts}, "all": {"children": ["ddp_nodes"]}, "ddp_nodes": {"hosts": list(hosts)}}


GOOD = [
    "python3",
    "/opt/venv/bin/python",
    ["/opt/venv/bin/python"],
    ["docker", "run", "--rm", "--network", "host", "nvcr.io/nvidia/pytorch:24.05-py3", "python3"],
    ["enroot", "start", "--rw", "pytorch", "python3"],
    ["apptainer", "exec", "--nv", "/shared/images/pytorch_24.05.sif", "python3"],
    ["/usr/local/bin/fakectr", "run", "--rm", "IMAGE", "python3"],
    ["docker", "run", "-e", "NCCL_DEBUG=INFO", "img", "python3"],
]


@pytest.mark.parametrize("value", GOOD, ids=[str(v) for v in GOOD])
def test_a_word_or_an_argv_list_is_accepted(value: object) -> None:
    assert pyargv.argv_problem(value) is None
    c = cluster_from_inventory_data(_data({"a": {"ddp_python": value}, "b": {}}))
    assert c.node("a")


BAD = [
    ("python3\n", "control character"),  # a trailing newline (re.match's $ would let it through)
    (["python3\nid"], "control character"),
    (["docker", "run", "img\n", "python3"], "word 3 contains a newline"),
    (["docker", "run", "img\x00", "python3"], "control character"),
    ("$(id)", "absolute path or a command name"),
    (["$(id)"], "shell or template expansion"),
    (["python3", "-c", "$(id)"], "word 3 ('$(id)') holds a shell or template expansion"),
    (["docker", "run", "`id`", "python3"], "shell or template expansion"),
    (["docker", "run", "{{ lookup('pipe', 'id') }}", "python3"], "shell or template expansion"),
    ("{{ lookup('pipe', 'id') }}", "absolute path or a command name"),
    (["docker", "run", "${HOME}", "python3"], "shell or template expansion"),
    ([], "is an empty list"),
    ([""], "word 1 is empty"),
    (["docker"] + ["x"] * pyargv.MAX_WORDS, f"at most {pyargv.MAX_WORDS}"),
    (["docker", "x" * (pyargv.MAX_WORD + 1)], f"at most {pyargv.MAX_WORD}"),
    (["docker"] + ["x" * 1000] * 5, f"longer than {pyargv.MAX_TOTAL}"),
    (["docker", "run", 3, "python3"], "word 3 (3) is not a string"),
    (["python3; id"], "its first word 'python3; id' must be"),
    (["./python3"], "must be an absolute path or a command name"),
    (["/opt/../bin/python"], "must be an absolute path or a command name"),
    ("docker run --rm img python3", "write a command with arguments, such as a container runtime's, as a YAML list"),
    ({"cmd": "python3"}, "must be a string or a list of strings, not dict"),
    (3, "not int"),
]


@pytest.mark.parametrize(("value", "message"), BAD, ids=[repr(v)[:40] for v, _ in BAD])
def test_hostile_values_are_refused_naming_the_variable(value: object, message: str) -> None:
    with pytest.raises(DdpfixError) as exc:
        cluster_from_inventory_data(_data({"a": {"ddp_python": value}, "b": {}}))
    text = str(exc.value)
    assert text.startswith("ddp_python of a ") and message in text, text
    assert "\n" not in text and exc.value.code == ExitCode.INVALID_INPUT


def test_the_roles_copies_are_checked_too() -> None:
    with pytest.raises(DdpfixError, match=r"^ddpfix_verify_python of b \['\$\(id\)'\]"):
        cluster_from_inventory_data(_data({"a": {}, "b": {"ddpfix_verify_python": ["$(id)"]}}))
    c = cluster_from_inventory_data(_data({"a": {"ddpfix_facts_python": "{{ ddp_python | default('python3') }}"},
                                           "b": {"ddpfix_facts_python": ["docker", "run", "img", "python3"]}}))
    assert c.node("b")


def test_cli_refuses_a_shell_string_in_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "inv.yml"
    inv.write_text(textwrap.dedent("""\
        ddp_nodes:
          hosts:
            a: {ansible_host: 192.0.2.1, ddp_python: [docker, run, "$(curl evil)", python3]}
            b: {ansible_host: 192.0.2.2}
        """))
    r = CliRunner().invoke(cli, ["-i", str(inv), "audit"])
    assert r.exit_code == ExitCode.INVALID_INPUT, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "ddp_python of a" in lines[0] and "$(curl evil)" in lines[0], r.output


def test_a_yaml_list_reaches_the_cluster_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inventory as an operator writes it (group vars, a YAML list) passes the contract as it is."""
    from ddpfix.inventory.derive import load_cluster

    monkeypatch.setenv("DDPFIX_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "inv.yml"
    inv.write_text(textwrap.dedent("""\
        ddp_nodes:
          vars:
            ddp_python: [enroot, start, --env, NCCL_DEBUG, pytorch, python3]
          hosts:
            a: {ansible_host: 192.0.2.1}
            b: {ansible_host: 192.0.2.2, ddp_python: /opt/venv/bin/python}
        """))
    assert load_cluster([str(inv)]).world_size == 2
    assert pyargv.shown(["docker", "run", "my image", "python3"]) == "docker run 'my image' python3"
    assert pyargv.argv("python3") == ["python3"]
