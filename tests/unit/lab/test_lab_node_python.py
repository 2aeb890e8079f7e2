"""A lab node on a pyenv build (`lab up --python node2=3.8`), planned without a host: the option's grammar, the build
it resolves to, the mounts that make it visible in the node and the inventory's ansible_python_interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpfix.errors import ExitCode
from ddpfix.lab.daemons import _python_binds
from ddpfix.lab.model import LabError
from ddpfix.lab.plan import parse_pythons, plan_lab
from ddpfix.lab.prerequisites import python_home


def test_python_option_grammar() -> None:
    assert parse_pythons("node2=3.8, node3=3.13.0,") == {"node2": "3.8", "node3": "3.13.0"}
    assert parse_pythons({"node1": 3.9}) == {"node1": "3.9"}  # type: ignore[dict-item]
    assert parse_pythons(None) == parse_pythons("") == {}
    for bad in ("node2", "node2=", "=3.8", "node2=2.7", "node2=3.8;id", "node2=../../x", "node2=3"):
        with pytest.raises(LabError) as exc:
            parse_pythons(bad)
        assert exc.value.code == ExitCode.INVALID_INPUT and "--python" in str(exc.value)


def test_plan_sets_the_nodes_python_and_refuses_an_unknown_node() -> None:
    plan = plan_lab("t", 3, "clean", "192.168.200.0/24", None, "node2=3.8")
    assert [n.python for n in plan.nodes] == [None, "3.8", None]
    with pytest.raises(LabError) as exc:
        plan_lab("t", 3, "clean", "192.168.200.0/24", None, "node4=3.8")
    assert exc.value.code == ExitCode.INVALID_INPUT and "node4" in str(exc.value)


def _build(root: Path, version: str) -> None:
    minor = ".".join(version.split(".")[:2])
    (root / version / "bin").mkdir(parents=True)
    (root / version / "bin" / f"python{minor}").write_text("")


def test_python_home_is_the_newest_matching_build(tmp_path: Path) -> None:
    for v in ("3.8.9", "3.8.18", "3.10.13", "3.1.5"):
        _build(tmp_path, v)
    (tmp_path / "3.9.0").mkdir()  # no interpreter in it
    assert python_home("3.8", tmp_path) == tmp_path / "3.8.18"
    assert python_home("3.8.9", tmp_path) == tmp_path / "3.8.9"
    assert python_home("3.1", tmp_path) == tmp_path / "3.1.5"  # not 3.10.13
    for missing in ("3.9", "3.12"):
        with pytest.raises(LabError) as exc:
            python_home(missing, tmp_path)
        assert exc.value.code == ExitCode.PREREQUISITE and f"pyenv install {missing}" in str(exc.value)


def test_the_build_is_mounted_read_only_at_its_own_path_and_is_the_interpreter(tmp_path: Path) -> None:
    plan = plan_lab("t", 2, "clean", "192.168.200.0/24", None, {"node2": "3.8"})
    n1, n2 = plan.nodes
    n2.python_home = "/root/.pyenv/versions/3.8.18"
    assert _python_binds(tmp_path, n1) == [] and n1.interpreter is None
    inside = str(tmp_path / "root/.pyenv/versions/3.8.18")
    # onto the node's own /root copy first (the host's path is hidden once /root is replaced), then to its own path
    assert _python_binds(tmp_path, n2) == [["/root/.pyenv/versions/3.8.18", inside, "ro"],
                                           [inside, "/root/.pyenv/versions/3.8.18", "ro"]]
    assert n2.interpreter == "/root/.pyenv/versions/3.8.18/bin/python3.8"
