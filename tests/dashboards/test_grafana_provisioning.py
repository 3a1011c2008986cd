"""Grafana provisioning files in deploy/grafana/ load the dashboards of each variant."""

from __future__ import annotations

from typing import Any

import yaml

from testkit.dashboard_files import DASHBOARDS, REPO, VARIANTS

PROVISIONING = REPO / "deploy" / "grafana" / "provisioning"
DOCS = REPO / "docs" / "dashboards.md"


def _load(path: str) -> Any:
    return yaml.safe_load((PROVISIONING / path).read_text(encoding="utf-8"))


def test_the_datasource_is_a_prometheus_with_its_scrape_interval() -> None:
    config = _load("datasources/trainmon-prometheus.yml")
    assert config["apiVersion"] == 1
    [datasource] = config["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["url"].startswith("http")
    # $__rate_interval is 4 × this; it must be set, not left to Grafana's 15 s guess.
    assert datasource["jsonData"]["timeInterval"].endswith("s")


def test_each_variant_has_a_file_provider_for_its_folder() -> None:
    folders = set()
    for variant in VARIANTS:
        config = _load(f"dashboards/trainmon-{variant}.yml")
        assert config["apiVersion"] == 1
        [provider] = config["providers"]
        assert provider["type"] == "file"
        assert provider["allowUiUpdates"] is False, "generated JSON: edits belong in the code"
        path = provider["options"]["path"]
        assert path == f"/var/lib/grafana/dashboards/trainmon/{variant}"
        folders.add(provider["folderUid"])
        assert list((DASHBOARDS / variant).glob("*.json")), variant
    assert len(folders) == len(VARIANTS)


def test_the_documented_mounts_match_the_providers() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    provider = "deploy/grafana/provisioning/dashboards/trainmon-dcgm.yml"
    assert f"{provider}:/etc/grafana/provisioning/dashboards/trainmon-dcgm.yml" in docs
    assert "dashboards/dcgm:/var/lib/grafana/dashboards/trainmon/dcgm" in docs
    assert "grafana_dashboard=1" in docs, "the Kubernetes sidecar label"
