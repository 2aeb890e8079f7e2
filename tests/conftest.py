"""Shared fixtures. The lab fixtures build real SSH hosts in Linux namespaces (root only).

    @pytest.mark.lab
    def test_something(lab_factory):
        info = lab_factory(nodes=3, scenario="hostname-loopback")   # torn down at module end
        ...  # info.inventory -> hosts.yml for `ddpfix audit -i`, info.ssh_config, lab.node_exec(info.name, ...)

`lab_factory` (module scope) and `temp_lab` (function scope) give every lab a unique name and a
free /24 subnet, so labs of several modules, test runs or developers coexist; every lab is
removed at the end of its scope, also when the test fails. `clean_lab` is one shared clean
3-node lab per module.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("lab") and os.geteuid() != 0:
        pytest.skip("lab tests need root (network namespaces, mounts, veths): run pytest as root")


class LabPool:
    """Creates labs with unique names/subnets and removes all of them on close()."""

    _counter = 0

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.names: list[str] = []

    def _name(self) -> str:
        LabPool._counter += 1
        return f"t{os.getpid() % 100000}-{LabPool._counter}"

    def make(self, nodes: int = 3, scenario: str = "clean", ifnames: str | None = None, *,
             name: str | None = None, subnet: str | None = None, wait_sync: bool = True,
             pythons: dict[str, str] | None = None):
        from ddpfix import lab
        from ddpfix.errors import ExitCode

        name = name or self._name()
        candidates = [subnet] if subnet else [f"192.168.{o}.0/24" for o in random.sample(range(100, 250), 40)]
        last: Exception | None = None
        self.names.append(name)
        for net in candidates:
            try:
                return lab.up(name, nodes, scenario, net, ifnames, self.base_dir / name, wait_sync=wait_sync,
                              pythons=pythons)
            except lab.LabError as exc:  # subnet taken by another lab/developer: try the next one
                last = exc
                if exc.code != ExitCode.INVALID_INPUT or "overlaps" not in str(exc) or subnet:
                    raise
        raise RuntimeError(f"no free lab subnet found: {last}")

    def close(self) -> None:
        from ddpfix import lab

        errors = []
        for name in reversed(self.names):
            try:
                lab.down(name)
            except Exception as exc:  # noqa: BLE001 - keep tearing the others down
                errors.append(f"{name}: {exc}")
        self.names.clear()
        if errors:
            raise RuntimeError("lab teardown failed: " + "; ".join(errors))


@pytest.fixture(scope="module")
def lab_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., object]]:
    """`lab_factory(nodes=3, scenario="clean", ifnames=None) -> LabInfo`; labs live until module end."""
    pool = LabPool(tmp_path_factory.mktemp("labs"))
    try:
        yield pool.make
    finally:
        pool.close()


@pytest.fixture
def temp_lab(tmp_path: Path) -> Iterator[Callable[..., object]]:
    """Like `lab_factory`, but the labs are removed at the end of the test."""
    pool = LabPool(tmp_path)
    try:
        yield pool.make
    finally:
        pool.close()


@pytest.fixture(scope="module")
def clean_lab(lab_factory):
    """One clean 3-node lab (chrony synchronised) shared by a module's tests."""
    return lab_factory(nodes=3, scenario="clean")


@pytest.fixture
def free_subnet() -> Callable[[], str]:
    """`free_subnet()` -> a /24 no route on this machine overlaps (for tests calling the CLI)."""
    return find_free_subnet


def find_free_subnet() -> str:
    """A /24 that no route on this machine overlaps (for tests that call the CLI themselves)."""
    from ddpfix import lab

    return lab.free_subnet()
