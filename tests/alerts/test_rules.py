"""The shipped alert rules: generated from one source, valid, and unit-tested by promtool.

Every alert of each variant must have a promtool case where it fires and one
where it must stay silent (alerts/tests/*.test.yml).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.prometheus import require
from tests.alerts.alerts_support.bundle import (
    REPO,
    VARIANTS,
    rules_path,
    run_script,
    shipped_alerts,
)
from tests.alerts.alerts_support.stack import PROMTOOL

pytestmark = pytest.mark.integration

TESTS_DIR = REPO / "alerts" / "tests"
#: promtool test files and the variants whose rules they test.
TEST_FILES = {
    "common.test.yml": VARIANTS,
    "diagnosis.test.yml": VARIANTS,
    "platform.test.yml": VARIANTS,
    "runs.test.yml": VARIANTS,
    "goodput.test.yml": VARIANTS,
    "goodput-days.test.yml": VARIANTS,
    "operations.test.yml": VARIANTS,
    "hang.test.yml": VARIANTS,
    "dcgm.test.yml": ("dcgm",),
    "tencent-cloud.test.yml": ("tencent-cloud",),
    "suspects.test.yml": VARIANTS,
    "suspects-tencent-cloud.test.yml": ("tencent-cloud",),
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require(PROMTOOL), *args], capture_output=True, text=True, timeout=240
    )


def test_generated_rules_and_alert_table_are_up_to_date() -> None:
    result = run_script("alerts/generate.py", "--check")
    assert result.returncode == 0, result.stderr


def _copy_bundle(tmp_path: Path) -> Path:
    """A scratch copy of what alerts/generate.py reads and writes."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "alerts", root / "alerts", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "docs" / "runbooks", root / "docs" / "runbooks")
    shutil.copy(REPO / "docs" / "alerts.md", root / "docs" / "alerts.md")
    return root


def test_check_fails_on_a_hand_edited_rules_file_and_generate_repairs_it(tmp_path: Path) -> None:
    root = _copy_bundle(tmp_path)
    shipped = root / "alerts" / "dcgm" / "trainmon.rules.yml"
    shipped.write_text(shipped.read_text().replace("for: 5m", "for: 1m", 1))

    check = run_script("alerts/generate.py", "--check", cwd=root)
    assert check.returncode == 1
    assert "alerts/dcgm/trainmon.rules.yml" in check.stderr

    assert run_script("alerts/generate.py", cwd=root).returncode == 0
    assert shipped.read_text() == rules_path("dcgm").read_text()
    assert run_script("alerts/generate.py", "--check", cwd=root).returncode == 0


def test_generator_refuses_an_alert_without_a_runbook(tmp_path: Path) -> None:
    root = _copy_bundle(tmp_path)
    (root / "docs" / "runbooks" / "TrainmonGPUSawtooth.md").unlink()
    result = run_script("alerts/generate.py", cwd=root)
    assert result.returncode == 2
    assert "docs/runbooks/TrainmonGPUSawtooth.md does not exist" in result.stderr


@pytest.mark.parametrize("variant", VARIANTS)
def test_promtool_check_rules(variant: str) -> None:
    result = promtool("check", "rules", str(rules_path(variant)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"SUCCESS: \d+ rules found", result.stdout), result.stdout


@pytest.mark.parametrize("variant", VARIANTS)
def test_alerts_follow_the_monitoring_mixin_conventions(variant: str) -> None:
    for rule in shipped_alerts(variant):
        name = rule["alert"]
        assert re.fullmatch(r"Trainmon[A-Z][A-Za-z0-9]+", name), name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        annotations = rule["annotations"]
        assert annotations["summary"].strip() and annotations["description"].strip(), name
        assert annotations["runbook_url"].endswith(f"/docs/runbooks/{name}.md"), name
        assert (REPO / "docs" / "runbooks" / f"{name}.md").is_file(), name
        doc = (REPO / "docs" / "alerts.md").read_text()
        assert f"| `{name}` |" in doc, f"{name} is missing from docs/alerts.md"


def _test_file_for(variant: str, name: str, tmp_path: Path) -> Path:
    """The promtool test file ``name`` with its rule_files pointed at ``variant``."""
    document = yaml.safe_load((TESTS_DIR / name).read_text())
    document["rule_files"] = [str(rules_path(variant))]
    path = tmp_path / f"{variant}-{name}"
    path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
    return path


@pytest.mark.parametrize(
    ("name", "variant"),
    [(name, variant) for name, variants in TEST_FILES.items() for variant in variants],
)
def test_promtool_unit_tests(name: str, variant: str, tmp_path: Path) -> None:
    result = promtool("test", "rules", str(_test_file_for(variant, name, tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _alert_cases(variant: str) -> tuple[set[str], set[str]]:
    """Alert names with a firing case and with a silent case in the variant's tests."""
    fires: set[str] = set()
    silent: set[str] = set()
    for name, variants in TEST_FILES.items():
        if variant not in variants:
            continue
        document: dict[str, Any] = yaml.safe_load((TESTS_DIR / name).read_text())
        for test in document["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    return fires, silent


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_alert_has_a_firing_and_a_silent_case(variant: str) -> None:
    names = {rule["alert"] for rule in shipped_alerts(variant)}
    fires, silent = _alert_cases(variant)
    assert names - fires == set(), "alerts without a case where they fire"
    assert names - silent == set(), "alerts without a case where they must not fire"
    assert fires | silent <= names, "tests name alerts the variant does not ship"


def test_scale_shortens_every_duration_and_nothing_else(tmp_path: Path) -> None:
    scaled_path = tmp_path / "scaled.yml"
    result = run_script(
        "alerts/generate.py", "scale", "--factor", "0.05", str(rules_path("dcgm")),
        str(scaled_path),
    )
    assert result.returncode == 0, result.stderr
    check = promtool("check", "rules", str(scaled_path))
    assert check.returncode == 0, check.stdout + check.stderr

    original = {r.get("alert") or r["record"]: r for r in _rules(rules_path("dcgm"))}
    scaled = {r.get("alert") or r["record"]: r for r in _rules(scaled_path)}
    assert scaled.keys() == original.keys()
    sawtooth = scaled["TrainmonGPUSawtooth"]
    assert sawtooth["for"] == "15s" and "keep_firing_for" not in sawtooth
    # the 10 min hold of the recorded 5 min minimum, on a series 5 min old
    assert "[30s]" in sawtooth["expr"]
    hold = scaled["instance_gpu:trainmon_gpu_sawtooth_ratio:min5m"]["expr"]
    assert "[15s]" in hold and "offset 15s" in hold
    crossings = scaled["UUID:dcgm_gpu_util_crossings:changes10m"]["expr"]
    assert "[30s:750ms]" in crossings and "[30s]" in crossings
    assert "[30s:750ms]" in scaled["TrainmonGPUSawtoothScraped"]["expr"]
    assert "[18m]" in scaled["TrainmonGPUMissing"]["expr"]
    # group intervals too: the 1 min groups every 3 s
    groups = yaml.safe_load(scaled_path.read_text())["groups"]
    intervals = {group["name"]: group.get("interval") for group in groups}
    assert intervals["trainmon-gpu-1m"] == "3s" and intervals["trainmon-node.rules"] == "15s"
    # offsets too: a run is compared once Prometheus saw its start 30 s (10 min) ago
    settled = scaled["job_run:trainmon_training_samples_per_second_per_rank:settled_rate10m"]
    assert "offset 30s" in settled["expr"]
    assert scaled["TrainmonThroughputRegression"]["for"] == "45s"
    # thresholds in seconds are not durations and stay as shipped
    assert "> 600" in scaled["TrainmonTrainingStalled"]["expr"]

    def durations_blanked(expr: str) -> str:
        return re.sub(r"\boffset\s+\S+", "offset _", re.sub(r"\[[^\]]*\]", "[]", expr))

    for name, rule in original.items():
        unscaled = durations_blanked(rule["expr"])
        assert durations_blanked(scaled[name]["expr"]) == unscaled, name
        assert scaled[name].get("labels") == rule.get("labels"), name
        assert scaled[name].get("annotations") == rule.get("annotations"), name


def _rules(path: Path) -> list[dict[str, Any]]:
    document = yaml.safe_load(path.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]
