"""Fixtures of the ledger tests."""

from __future__ import annotations

import pytest

from tests.ledger.ledger_support import Clocks


@pytest.fixture
def clocks() -> Clocks:
    """The test's monotonic and wall clocks, advanced together by hand."""
    return Clocks()
