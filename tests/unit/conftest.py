"""The unit tests' fixtures; their helpers (the recorded clean cluster `Sim`, role code loaded by path) are in
unit_helpers.py, which tests import as `unit_helpers` from any directory under tests/unit."""

from __future__ import annotations

import pytest
from unit_helpers import Sim


@pytest.fixture
def sim() -> Sim:
    return Sim()
