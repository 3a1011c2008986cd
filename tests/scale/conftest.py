"""The fleet tests' templates: one real ``trainmon serve --demo`` captured once per session
(``bench.fleet_scale.capture``, about 15 s), shared by every simulated fleet."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import fleet_scale


@pytest.fixture(scope="session")
def fleet_templates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``templates.json`` of a captured demo node (``bench.fleet_sim.load_templates``)."""
    return fleet_scale.capture(tmp_path_factory.mktemp("fleet-templates"))
