"""The multi-node recording rules, checked and unit-tested by the real promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent
RULES = HERE.parents[1] / "alerts" / "diagnosis-recording.yml"
TESTS = HERE / "diagnosis-recording.test.yml"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed"),
]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=HERE,
                          timeout=60, check=False)


def test_recording_rules_are_valid() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout


def test_recording_rules_aggregate_verdicts_and_find_stragglers_across_nodes() -> None:
    result = promtool("test", "rules", TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
