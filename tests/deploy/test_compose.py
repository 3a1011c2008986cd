"""The docker-compose trial: Debian's docker-compose accepts it, and what it mounts exists."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deploytest.common import ALERTS, DEPLOY, REPO, VARIANTS, run, tool

COMPOSE = DEPLOY / "compose" / "docker-compose.yml"


def compose_config(variant: str, compose_file: Path = COMPOSE) -> tuple[int, str]:
    completed = run(
        [tool("docker-compose"), "--file", str(compose_file), "config"],
        env={"TRAINMON_VARIANT": variant},
    )
    return completed.returncode, completed.stdout + completed.stderr


@pytest.mark.parametrize("variant", VARIANTS)
def test_docker_compose_accepts_the_trial(variant: str) -> None:
    returncode, output = compose_config(variant)
    assert returncode == 0, output
    resolved: dict[str, Any] = yaml.safe_load(output)
    services = resolved["services"]
    assert set(services) == {"trainmon", "prometheus", "alertmanager", "grafana"}

    # trainmon is the image of the repository's Containerfile, in demo mode.
    build = services["trainmon"]["build"]
    assert Path(build["context"]) == REPO
    assert (REPO / build["dockerfile"]).is_file()
    assert "--demo" in services["trainmon"]["command"]

    # Every bind mount exists, and Prometheus gets the shipped config and rules.
    mounts = {}
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("/"):
                assert Path(source).exists(), f"{name}: {source}"
                mounts[(name, target)] = Path(source)
    assert mounts[("prometheus", "/etc/prometheus/prometheus.yml")] == (
        DEPLOY / "prometheus" / f"prometheus-{variant}.yml"
    )
    assert mounts[("prometheus", "/etc/prometheus/rules")] == ALERTS / variant
    assert mounts[("alertmanager", "/etc/alertmanager")] == DEPLOY / "alertmanager"
    # Grafana's dashboard provider reads the folder the variant's dashboards are
    # mounted at, and its datasource is the compose Prometheus.
    provider_file = mounts[("grafana", "/etc/grafana/provisioning/dashboards/trainmon.yml")]
    provider = yaml.safe_load(provider_file.read_text())["providers"][0]
    dashboards = mounts[("grafana", provider["options"]["path"])]
    assert dashboards == REPO / "dashboards" / variant
    assert list(dashboards.glob("*.json"))
    datasources = mounts[("grafana", "/etc/grafana/provisioning/datasources")]
    urls = [
        source["url"]
        for path in datasources.glob("*.yml")
        for source in yaml.safe_load(path.read_text())["datasources"]
    ]
    assert urls == ["http://prometheus:9090"]
    # Every port is published on loopback only.
    for service in services.values():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), port


def test_docker_compose_check_catches_a_broken_file(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("    ports:\n", "    portz:\n", 1))
    returncode, output = compose_config("dcgm", broken)
    assert returncode != 0
    assert "portz" in output


@pytest.mark.parametrize("variant", VARIANTS)
def test_trial_targets_work_with_the_shipped_prometheus_config(
    variant: str, tmp_path: Path
) -> None:
    """The trial's target lists beside the shipped config pass promtool, and name the
    compose services on the ports they serve."""
    folder = tmp_path / "etc"
    folder.mkdir()
    shutil.copy(DEPLOY / "prometheus" / f"prometheus-{variant}.yml", folder / "prometheus.yml")
    shutil.copytree(DEPLOY / "compose" / "targets", folder / "targets")
    shutil.copytree(ALERTS / variant, folder / "rules")
    completed = run([tool("promtool"), "check", "config", str(folder / "prometheus.yml")])
    assert completed.returncode == 0, completed.stdout + completed.stderr

    compose = yaml.safe_load(COMPOSE.read_text())["services"]
    for name in ("trainmon", "alertmanager"):
        groups = yaml.safe_load((folder / "targets" / f"{name}.yml").read_text())
        published = compose[name]["ports"][0].rsplit(":", 1)[1]
        assert groups[0]["targets"] == [f"{name}:{published}"]
