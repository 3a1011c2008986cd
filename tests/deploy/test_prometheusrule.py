"""The PrometheusRule objects of the overlays are alerts/, never a hand-kept copy."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_support.common import ALERTS, KUBERNETES, VARIANTS, run

GENERATOR = [sys.executable, "-m", "deploy.prometheusrule"]


def alerts_groups(alerts_dir: Path, variant: str) -> list[dict[str, Any]]:
    """The rule groups Prometheus would load from ``alerts/<variant>/``."""
    groups: list[dict[str, Any]] = []
    for path in sorted((alerts_dir / variant).glob("*.yml")):
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(document, dict) and "groups" in document:
            groups.extend(document["groups"])
    return groups


def manifest_groups(kubernetes_dir: Path, variant: str) -> list[dict[str, Any]]:
    path = kubernetes_dir / "overlays" / variant / "prometheusrule.yaml"
    manifest = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert manifest["kind"] == "PrometheusRule"
    groups: list[dict[str, Any]] = manifest["spec"]["groups"]
    return groups


@pytest.mark.parametrize("variant", VARIANTS)
def test_committed_prometheusrule_equals_the_rules_in_alerts(variant: str) -> None:
    expected = alerts_groups(ALERTS, variant)
    alerts = [rule for group in expected for rule in group["rules"] if "alert" in rule]
    assert alerts, f"alerts/{variant}/ has no alerting rules"
    assert manifest_groups(KUBERNETES, variant) == expected, (
        "stale PrometheusRule: run `make generate` (python -m deploy.prometheusrule)"
    )


def test_generator_check_passes_on_the_repository() -> None:
    completed = run([*GENERATOR, "--check"])
    assert completed.returncode == 0, completed.stderr


def test_generator_notices_and_repairs_a_changed_rule(tmp_path: Path) -> None:
    alerts = tmp_path / "alerts"
    shutil.copytree(ALERTS, alerts)
    kubernetes = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, kubernetes)
    rules_file = sorted((alerts / "dcgm").glob("*.yml"))[0]
    document = yaml.safe_load(rules_file.read_text(encoding="utf-8"))
    document["groups"][0]["rules"][0]["expr"] = "vector(42)"
    rules_file.write_text(yaml.safe_dump(document), encoding="utf-8")

    arguments = ["--alerts-dir", str(alerts), "--kubernetes-dir", str(kubernetes)]
    stale = run([*GENERATOR, "--check", *arguments])
    assert stale.returncode == 1
    assert "overlays/dcgm/prometheusrule.yaml" in stale.stderr
    assert "tencent-cloud" not in stale.stderr

    written = run([*GENERATOR, *arguments])
    assert written.returncode == 0, written.stderr
    assert manifest_groups(kubernetes, "dcgm") == alerts_groups(alerts, "dcgm")
    assert manifest_groups(kubernetes, "dcgm")[0]["rules"][0]["expr"] == "vector(42)"
    assert run([*GENERATOR, "--check", *arguments]).returncode == 0
