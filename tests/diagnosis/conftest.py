"""Fixtures for the diagnosis tests; helpers live in ``diagnosis_support``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # importlib mode: make diagnosis_support importable

from diagnosis_support import ProcTree, SysTree

REPO = Path(__file__).resolve().parents[2]
FAKE_NVML_BUILD = REPO / "tests" / "gpu" / "fakenvml" / "build.py"


@pytest.fixture
def proc(tmp_path: Path) -> ProcTree:
    return ProcTree(tmp_path / "proc")


@pytest.fixture
def sys_tree(tmp_path: Path) -> SysTree:
    return SysTree(tmp_path / "sys")


@pytest.fixture(scope="session")
def fake_nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the fake ``libnvidia-ml.so.1``, compiled by its public build script."""
    directory = tmp_path_factory.mktemp("diagnosis-fakenvml")
    result = subprocess.run(
        [sys.executable, str(FAKE_NVML_BUILD), str(directory)],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot build the fake NVML library: {result.stderr or result.stdout}")
    return directory
