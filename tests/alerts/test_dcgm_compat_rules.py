"""The opt-in DCGM-compatible pack: valid, generated, and unit-tested by promtool.

``alerts/tests/dcgm-compat.test.yml`` checks the units and labels of every
recorded ``DCGM_FI_*`` series; ``test_dcgm_compat_dashboard.py`` runs the
dcgm-exporter dashboard's queries on it against a real Prometheus.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from testkit.prometheus import require
from testkit.victoriametrics import dry_run_rules
from tests.alerts.alerts_support.bundle import REPO
from tests.alerts.alerts_support.stack import PROMTOOL

pytestmark = pytest.mark.integration

PACK = REPO / "alerts" / "dcgm-compat" / "dcgm-compat.rules.yml"
TESTS = REPO / "alerts" / "tests" / "dcgm-compat.test.yml"
#: The fields the pack promises (issue 38), in DCGM's names.
DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require(PROMTOOL), *args], capture_output=True, text=True,
                          timeout=120)


def test_the_pack_loads_and_records_every_field_and_nothing_else() -> None:
    result = promtool("check", "rules", str(PACK))
    assert result.returncode == 0, result.stdout + result.stderr
    document = yaml.safe_load(PACK.read_text())
    rules = [rule for group in document["groups"] for rule in group["rules"]]
    assert all("alert" not in rule for rule in rules)
    recorded = {rule["record"] for rule in rules}
    assert {name for name in recorded if name.startswith("DCGM_")} == DCGM_FIELDS
    helpers = recorded - DCGM_FIELDS
    assert all(re.fullmatch(r"instance_gpu:trainmon_[a-z_]+:[a-z]+", name) for name in helpers)


def test_the_pack_loads_in_vmalert() -> None:
    status, output = dry_run_rules([PACK])
    assert status == 0, output


def test_promtool_units_and_labels() -> None:
    result = promtool("test", "rules", str(TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    tested = {re.match(r"[A-Z_]+", case["expr"]).group(0)  # type: ignore[union-attr]
              for test in cases for case in test["promql_expr_test"]}
    assert tested == DCGM_FIELDS, "a DCGM field without a promtool case"
