"""Fixtures for the diagnosis tests; helpers live in ``diagnosis_support``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.diagnosis.diagnosis_support import ProcTree, SysTree


@pytest.fixture
def proc(tmp_path: Path) -> ProcTree:
    return ProcTree(tmp_path / "proc")


@pytest.fixture
def sys_tree(tmp_path: Path) -> SysTree:
    return SysTree(tmp_path / "sys")


@pytest.fixture(scope="session")
def fake_nvml_library(fake_nvml_dir: Path) -> Path:
    """The folder with the fake ``libnvidia-ml.so.1``: the shared session build
    (tests/conftest.py), which fails on a compiler error and skips only without a compiler."""
    return fake_nvml_dir
