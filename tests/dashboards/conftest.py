"""Fixtures for the dashboard tests; the helper modules of this folder become importable."""

from __future__ import annotations

import pytest

from testkit.dashboard_files import Dashboard, load_dashboards
from testkit.metric_contract import Contract, load_contract


@pytest.fixture(scope="session")
def dashboards() -> list[Dashboard]:
    return load_dashboards()


@pytest.fixture(scope="session")
def contract() -> Contract:
    return load_contract()
