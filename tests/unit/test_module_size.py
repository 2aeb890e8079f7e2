"""No controller module over 500 lines (issue 38: smaller pieces a newcomer can read whole). A module that grows past
it is split by concern into a package whose `__init__` keeps the public names importable, as `ddpfix.remediate` and
`ddpfix.firewall.firewalld` were."""

from __future__ import annotations

from pathlib import Path

CONTROLLER = Path(__file__).resolve().parents[2] / "controller"
MAX_LINES = 500


def test_no_controller_module_is_over_500_lines() -> None:
    sizes = {p.relative_to(CONTROLLER).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in sorted(CONTROLLER.rglob("*.py"))}
    assert len(sizes) > 50  # the walk found the package
    over = {p: n for p, n in sizes.items() if n > MAX_LINES}
    assert not over, f"controller modules over {MAX_LINES} lines (split them by concern): {over}"
