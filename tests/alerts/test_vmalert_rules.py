"""The shipped rules load in vmalert (Debian's ``victoria-metrics`` package, 1.79).

``vmalert -dryRun`` parses every group, rule, MetricsQL expression and
annotation template, and refuses fields it does not know (``keep_firing_for``
arrived in vmalert 1.92). The time-scaled copies the end-to-end alert tests run
(``alerts/generate.py scale``) must load too, so that the same tests could run on
vmalert. That every rule also evaluates there without error, against
VictoriaMetrics fed by vmagent, is checked by ``tests/dashboards/test_dashboard_queries.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.victoriametrics import dry_run_rules
from tests.alerts.alerts_support.bundle import VARIANTS, rules_path, run_script

pytestmark = pytest.mark.integration

#: The factors of the end-to-end alert tests (test_end_to_end, test_spot_reclaim_end_to_end,
#: test_throughput_regression_end_to_end).
SCALE_FACTORS = ("0.05",)


@pytest.mark.parametrize("variant", VARIANTS)
def test_shipped_rules_load_in_vmalert(variant: str) -> None:
    status, output = dry_run_rules([rules_path(variant)])
    assert status == 0, output


@pytest.mark.parametrize("factor", SCALE_FACTORS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_time_scaled_rules_load_in_vmalert(tmp_path: Path, variant: str, factor: str) -> None:
    scaled_rules = tmp_path / "trainmon.rules.yml"
    scaled = run_script("alerts/generate.py", "scale", "--factor", factor,
                        str(rules_path(variant)), str(scaled_rules))
    assert scaled.returncode == 0, scaled.stderr
    status, output = dry_run_rules([scaled_rules])
    assert status == 0, output
