"""Two labs coming up at once (tests in parallel, benchmarks) never both take one subnet: the subnet is checked free
again, and the network made, under one lock of the whole machine."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path
from typing import Any

import pytest

from ddpfix.errors import ExitCode
from ddpfix.lab import lifecycle, system


def held(path: Path) -> bool:
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def test_the_subnet_is_checked_and_the_network_made_under_the_machines_lock(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system, "STATE_ROOT", tmp_path)
    lock = tmp_path / f".{lifecycle.SUBNETS_LOCK}.lock"
    seen: list[tuple[str, bool]] = []
    monkeypatch.setattr(lifecycle, "_check_subnet_free", lambda plan: seen.append(("check", held(lock))))
    monkeypatch.setattr(lifecycle, "_create_network", lambda plan: seen.append(("create", held(lock))))
    lifecycle._claim_network(object())  # type: ignore[arg-type]
    assert seen == [("check", True), ("create", True)]
    assert not held(lock)


def test_a_second_lab_checks_only_after_the_first_made_its_network(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system, "STATE_ROOT", tmp_path)
    taken: list[Any] = []
    first_inside = threading.Event()
    go_on = threading.Event()

    def check(plan: Any) -> None:
        if plan in taken:
            raise lifecycle.LabError(f"subnet {plan} overlaps", ExitCode.INVALID_INPUT)

    def create(plan: Any) -> None:
        if plan == "first":
            first_inside.set()
            go_on.wait(5)
        taken.append("192.168.7.0/24")

    monkeypatch.setattr(lifecycle, "_check_subnet_free", lambda plan: check("192.168.7.0/24"))
    monkeypatch.setattr(lifecycle, "_create_network", create)
    first = threading.Thread(target=lifecycle._claim_network, args=("first",))  # a plan stands in
    first.start()
    assert first_inside.wait(5)
    errors: list[BaseException] = []

    def second() -> None:
        try:
            lifecycle._claim_network("second")  # type: ignore[arg-type]
        except lifecycle.LabError as exc:
            errors.append(exc)

    other = threading.Thread(target=second)
    other.start()
    other.join(0.3)
    assert other.is_alive()  # waits for the first lab's network
    go_on.set()
    first.join(5)
    other.join(5)
    assert [str(e) for e in errors] == ["subnet 192.168.7.0/24 overlaps"]
