"""Fixtures for the diagnosis tests; helpers live in ``diagnosis_support`` (``proc`` and
``sys_tree``, which ``tests/attribution`` uses too, are in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fake_nvml_library(fake_nvml_dir: Path) -> Path:
    """The folder with the fake ``libnvidia-ml.so.1``: the shared session build
    (tests/conftest.py), which fails on a compiler error and skips only without a compiler."""
    return fake_nvml_dir
