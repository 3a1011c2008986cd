"""The docker-compose trials (deploy/compose: Prometheus; deploy/scale: vmagent shards and
VictoriaMetrics): Debian's docker-compose accepts them, and what they mount exists."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy import sharding
from deploy.bundle import rule_files
from tests.deploy.deploy_support.common import ALERTS, DEPLOY, REPO, VARIANTS, run, tool

COMPOSE = DEPLOY / "compose" / "docker-compose.yml"
SCALE_COMPOSE = DEPLOY / "scale" / "docker-compose.yml"
SCALE_SERVICES = {
    "trainmon-1", "trainmon-2", "vmagent-0", "vmagent-1", "victoria-metrics", "vmalert",
    "alertmanager", "grafana",
}


def compose_config(variant: str, compose_file: Path = COMPOSE) -> tuple[int, str]:
    completed = run(
        [tool("docker-compose"), "--file", str(compose_file), "config"],
        env={"TRAINMON_VARIANT": variant},
    )
    return completed.returncode, completed.stdout + completed.stderr


def bind_mounts(services: dict[str, Any]) -> dict[tuple[str, str], Path]:
    """(service, path in the container) → the host path, for every bind mount (all exist)."""
    mounts = {}
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("/"):
                assert Path(source).exists(), f"{name}: {source}"
                mounts[(name, target)] = Path(source)
    return mounts


def grafana_datasource_urls(mounts: dict[tuple[str, str], Path]) -> list[str]:
    """The URLs of the datasources Grafana's provisioning mounts give it."""
    folder = "/etc/grafana/provisioning/datasources"
    files = [
        path
        for (service, target), source in mounts.items()
        if service == "grafana" and target.startswith(folder)
        for path in (sorted(source.glob("*.yml")) if source.is_dir() else [source])
    ]
    return [
        source["url"]
        for path in files
        for source in yaml.safe_load(path.read_text())["datasources"]
    ]


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
    mounts = bind_mounts(services)
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
    assert grafana_datasource_urls(mounts) == ["http://prometheus:9090"]
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


def _flags(command: list[str]) -> dict[str, str]:
    """``-name=value`` → {name: value}; a bare boolean ``-name`` → {name: "true"}."""
    flags = {}
    for argument in command:
        name, _, value = argument.partition("=")
        flags[name] = value if "=" in argument else "true"
    return flags


@pytest.mark.parametrize("variant", VARIANTS)
def test_docker_compose_accepts_the_scale_trial(variant: str) -> None:
    returncode, output = compose_config(variant, SCALE_COMPOSE)
    assert returncode == 0, output
    services = yaml.safe_load(output)["services"]
    assert set(services) == SCALE_SERVICES
    mounts = bind_mounts(services)

    # Two demo nodes of the repository's image.
    assert Path(services["trainmon-1"]["build"]["context"]) == REPO
    for name in ("trainmon-1", "trainmon-2"):
        assert services[name]["image"] == services["trainmon-1"]["image"]
        assert "--demo" in services[name]["command"]

    # vmagent shard i of 2 runs the generated file unchanged, targets beside it, and
    # writes to the VictoriaMetrics service.
    for shard in (0, 1):
        name = f"vmagent-{shard}"
        assert services[name]["environment"] == {
            "TRAINMON_SHARD_COUNT": "2", "TRAINMON_SHARD": str(shard),
        }
        flags = _flags(services[name]["command"])
        config = Path(flags["-promscrape.config"])
        assert mounts[(name, str(config))] == sharding.output_path(variant)
        assert mounts[(name, str(config.parent / "targets"))] == DEPLOY / "scale" / "targets"
        assert flags["-remoteWrite.url"] == "http://victoria-metrics:8428/api/v1/write"

    # vmalert: the variant's rules, VictoriaMetrics for queries, writes and state
    # restore, and the compose Alertmanager.
    flags = _flags(services["vmalert"]["command"])
    rule_glob = Path(flags["-rule"])
    rules = mounts[("vmalert", str(rule_glob.parent))]
    assert rules == ALERTS / variant
    assert sorted(rules.glob(rule_glob.name)) == rule_files(variant) != []
    for flag in ("-datasource.url", "-remoteWrite.url", "-remoteRead.url"):
        assert flags[flag] == "http://victoria-metrics:8428", flag
    assert flags["-notifier.url"] == "http://alertmanager:9093"
    assert flags["-disableAlertgroupLabel"] == "true"  # ALERTS as Prometheus makes them
    assert mounts[("alertmanager", "/etc/alertmanager")] == DEPLOY / "alertmanager"

    # Grafana: only the VictoriaMetrics datasource, and the variant's dashboards.
    assert grafana_datasource_urls(mounts) == ["http://victoria-metrics:8428"]
    provider_file = mounts[("grafana", "/etc/grafana/provisioning/dashboards/trainmon.yml")]
    provider = yaml.safe_load(provider_file.read_text())["providers"][0]
    assert mounts[("grafana", provider["options"]["path"])] == REPO / "dashboards" / variant

    # Images pinned, the VictoriaMetrics ones at one version; ports on loopback only.
    images = {name: service["image"] for name, service in services.items()}
    assert all(":" in image and not image.endswith(":latest") for image in images.values())
    versions = {images[name].rsplit(":", 1)[1] for name in ("vmagent-0", "victoria-metrics", "vmalert")}
    assert len(versions) == 1, images
    for service in services.values():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), port


def test_scale_trial_targets_give_each_shard_one_node() -> None:
    compose = yaml.safe_load(SCALE_COMPOSE.read_text())["services"]
    groups = yaml.safe_load((DEPLOY / "scale" / "targets" / "trainmon.yml").read_text())
    targets = {group["targets"][0]: group["labels"]["node"] for group in groups}
    assert set(targets) == {f"{name}:19400" for name in ("trainmon-1", "trainmon-2")}
    for name in ("trainmon-1", "trainmon-2"):
        assert compose[name]["ports"][0].endswith(":19400")
    assert sorted(sharding.vmagent_shard(node, 2) for node in targets.values()) == [0, 1]
    for name in ("dcgm-exporter", "trainmon-tencent"):
        assert yaml.safe_load((DEPLOY / "scale" / "targets" / f"{name}.yml").read_text()) == []


def test_the_victoriametrics_datasource_sits_beside_the_prometheus_one() -> None:
    """Both are type prometheus (the dashboards' $datasource lists them); one default."""
    folder = DEPLOY / "grafana" / "provisioning" / "datasources"
    sources = {
        path.name: yaml.safe_load(path.read_text())["datasources"][0]
        for path in folder.glob("*.yml")
    }
    prometheus = sources["trainmon-prometheus.yml"]
    victoria = sources["trainmon-victoriametrics.yml"]
    assert victoria["type"] == prometheus["type"] == "prometheus"
    assert victoria["uid"] == "trainmon-victoriametrics"
    assert victoria["url"] == "http://victoria-metrics:8428"
    assert (prometheus["isDefault"], victoria["isDefault"]) == (True, False)
    scrape = sharding.load_vmagent_config(sharding.output_path("dcgm"))["global"]
    assert victoria["jsonData"]["timeInterval"] == scrape["scrape_interval"]
    assert prometheus["jsonData"] == victoria["jsonData"]
    assert "/select/<tenant>/prometheus" in (folder / "trainmon-victoriametrics.yml").read_text()
