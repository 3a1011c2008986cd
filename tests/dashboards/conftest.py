"""Fixtures for the dashboard tests; the helper modules of this folder become importable."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from dashboard_files import Dashboard, load_dashboards
from metric_contract import Contract, load_contract


@pytest.fixture(scope="session")
def dashboards() -> list[Dashboard]:
    return load_dashboards()


@pytest.fixture(scope="session")
def contract() -> Contract:
    return load_contract()
