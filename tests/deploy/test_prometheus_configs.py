"""Prometheus configurations: promtool accepts them, and a real Prometheus labels every target.

Debian's Prometheus is built without Kubernetes service discovery, so for the
``*-kubernetes.yml`` configurations the ``kubernetes_sd_configs`` blocks are
checked field by field here, and the rest of each file (relabelling, rules,
alerting) goes through promtool and a real Prometheus with the SD block
swapped for a file listing the targets Kubernetes would produce, ``__meta_*``
labels included.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.prometheus import Prometheus, wait_until
from tests.deploy.deploy_support.common import (
    ALERTS,
    PROMETHEUS,
    VARIANTS,
    run,
    stage_prometheus,
    tool,
)

STATIC = {variant: PROMETHEUS / f"prometheus-{variant}.yml" for variant in VARIANTS}
KUBERNETES_SD = {variant: PROMETHEUS / f"prometheus-{variant}-kubernetes.yml" for variant in VARIANTS}
#: Fields of a kubernetes_sd_config (Prometheus configuration reference) and roles.
KUBERNETES_SD_FIELDS = {"role", "namespaces", "selectors", "attach_metadata", "api_server", "kubeconfig_file"}
KUBERNETES_SD_ROLES = {"node", "service", "pod", "endpoints", "endpointslice", "ingress"}
#: Meta labels the `endpoints` role sets (Prometheus configuration reference).
ENDPOINTS_META = re.compile(
    r"__meta_kubernetes_(namespace|endpoints_name|endpoints_label_.+|endpoint_hostname"
    r"|endpoint_node_name|endpoint_ready|endpoint_port_name|endpoint_port_protocol"
    r"|endpoint_address_target_kind|endpoint_address_target_name|service_name"
    r"|service_label_.+|service_annotation_.+|pod_.+)"
)
EXPECTED_JOBS = {
    "dcgm": {"trainmon", "dcgm-exporter"},
    "tencent-cloud": {"trainmon", "trainmon-tencent"},
}


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return document


def rule_count(variant: str) -> int:
    count = 0
    for path in (ALERTS / variant).glob("*.yml"):
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        count += sum(len(group["rules"]) for group in document.get("groups", []))
    return count


def without_kubernetes_sd(config: dict[str, Any], targets_file: str) -> dict[str, Any]:
    """The config with every kubernetes_sd_configs block read from ``targets_file`` instead."""
    for job in config["scrape_configs"]:
        assert "kubernetes_sd_configs" in job, job["job_name"]
        del job["kubernetes_sd_configs"]
        job["file_sd_configs"] = [{"files": [targets_file]}]
    return config


def promtool_check(config: Path) -> str:
    completed = run([tool("promtool"), "check", "config", str(config)])
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    return output


@pytest.mark.parametrize("variant", VARIANTS)
def test_promtool_accepts_the_static_config_with_the_variant_rules(
    variant: str, tmp_path: Path
) -> None:
    config = stage_prometheus(STATIC[variant], tmp_path / "etc", variant)
    output = promtool_check(config)
    assert f"SUCCESS: {rule_count(variant)} rules found" in output
    assert {job["job_name"] for job in load(config)["scrape_configs"]} == EXPECTED_JOBS[variant]


@pytest.mark.parametrize("variant", VARIANTS)
def test_promtool_accepts_the_kubernetes_config(variant: str, tmp_path: Path) -> None:
    config = stage_prometheus(KUBERNETES_SD[variant], tmp_path / "etc", variant)
    document = without_kubernetes_sd(load(config), "targets/trainmon.yml")
    config.write_text(yaml.safe_dump(document), encoding="utf-8")
    output = promtool_check(config)
    assert f"SUCCESS: {rule_count(variant)} rules found" in output


@pytest.mark.parametrize("variant", VARIANTS)
def test_kubernetes_sd_blocks_use_known_fields_and_meta_labels(variant: str) -> None:
    config = load(KUBERNETES_SD[variant])
    assert {job["job_name"] for job in config["scrape_configs"]} == EXPECTED_JOBS[variant]
    for job in config["scrape_configs"]:
        for block in job["kubernetes_sd_configs"]:
            assert set(block) <= KUBERNETES_SD_FIELDS
            assert block["role"] == "endpoints"
            assert set(block["namespaces"]) == {"names"}
            assert block["namespaces"]["names"] == ["trainmon"]
        for rule in job["relabel_configs"]:
            for label in rule.get("source_labels", []):
                assert ENDPOINTS_META.fullmatch(label), label


@pytest.mark.parametrize("path", [*STATIC.values(), *KUBERNETES_SD.values()], ids=lambda p: p.name)
def test_trainmon_jobs_honour_pushed_labels(path: Path) -> None:
    """Training series keep their own `job` and `rank` (docs/deploy.md)."""
    jobs = {job["job_name"]: job for job in load(path)["scrape_configs"]}
    for name in ("trainmon", "trainmon-tencent"):
        if name in jobs:
            assert jobs[name]["honor_labels"] is True, name
    assert load(path)["rule_files"] == ["rules/*.yml"]


def write_targets(path: Path, groups: list[dict[str, Any]]) -> None:
    path.write_text(yaml.safe_dump(groups), encoding="utf-8")


@pytest.mark.integration
def test_relabelling_gives_every_target_a_node_label(tmp_path: Path) -> None:
    """A real Prometheus per shipped config, with loopback targets (never scraped
    successfully: only discovery and relabelling are looked at)."""
    servers: dict[str, Prometheus] = {}
    expected: dict[str, dict[tuple[str, str], str]] = {}
    with contextlib.ExitStack() as stack:
        for variant in VARIANTS:
            # Static targets: the node is the address' host unless a label sets it.
            folder = tmp_path / f"static-{variant}"
            config = stage_prometheus(STATIC[variant], folder, variant)
            remove_rules(folder)
            for name in ("trainmon", "dcgm-exporter", "trainmon-tencent"):
                write_targets(
                    folder / "targets" / f"{name}.yml",
                    [
                        {"targets": ["127.0.0.1:9"]},
                        {"targets": ["127.0.0.2:9"], "labels": {"node": "gpu-node-07"}},
                    ],
                )
            write_targets(folder / "targets" / "alertmanager.yml", [{"targets": ["127.0.0.1:9"]}])
            servers[f"static-{variant}"] = start(stack, config)
            expected[f"static-{variant}"] = {
                (job, address): node
                for job in EXPECTED_JOBS[variant]
                for address, node in (("127.0.0.1:9", "127.0.0.1"), ("127.0.0.2:9", "gpu-node-07"))
            }

            # Kubernetes: what endpoints discovery yields for each Service, plus one
            # Service of another application that must be dropped.
            folder = tmp_path / f"kubernetes-{variant}"
            config = stage_prometheus(KUBERNETES_SD[variant], folder, variant)
            remove_rules(folder)
            document = without_kubernetes_sd(load(config), "targets/kubernetes.yml")
            document["alerting"]["alertmanagers"] = [{"static_configs": [{"targets": ["127.0.0.1:9"]}]}]
            config.write_text(yaml.safe_dump(document), encoding="utf-8")
            discovered = []
            expected[f"kubernetes-{variant}"] = {}
            for index, job in enumerate(sorted(EXPECTED_JOBS[variant])):
                address = f"127.0.0.{index + 1}:9"
                discovered.append(endpoint(address, service=job, node=f"node-{index}"))
                expected[f"kubernetes-{variant}"][(job, address)] = f"node-{index}"
            discovered.append(endpoint("127.0.0.9:9", service="other-app", node="node-9"))
            discovered.append(endpoint("127.0.0.8:9", service="trainmon", node="node-8", port="http"))
            write_targets(folder / "targets" / "kubernetes.yml", discovered)
            servers[f"kubernetes-{variant}"] = start(stack, config)

        for name, server in servers.items():
            targets = wait_until(
                lambda server=server, name=name: _active_targets(server, len(expected[name])),
                30,
                f"{name}: the discovery of every target",
                interval=0.25,
            )
            labels = {(t["labels"]["job"], t["labels"]["instance"]): t["labels"] for t in targets}
            assert {key: value["node"] for key, value in labels.items()} == expected[name], name


def start(stack: contextlib.ExitStack, config: Path) -> Prometheus:
    """A real Prometheus on the staged ``config``, in its folder, stopped with ``stack``."""
    server = Prometheus(config.parent)
    stack.callback(server.stop)
    return server.start(config)


def endpoint(address: str, *, service: str, node: str, port: str = "metrics") -> dict[str, Any]:
    return {
        "targets": [address],
        "labels": {
            "__meta_kubernetes_namespace": "trainmon",
            "__meta_kubernetes_service_name": service,
            "__meta_kubernetes_service_label_app_kubernetes_io_name": service,
            "__meta_kubernetes_endpoint_port_name": port,
            "__meta_kubernetes_endpoint_node_name": node,
        },
    }


def remove_rules(folder: Path) -> None:
    """No rules while looking at discovery: nothing may fire and notify."""
    for path in (folder / "rules").iterdir():
        path.unlink()


def _active_targets(server: Prometheus, count: int) -> list[dict[str, Any]]:
    targets: list[dict[str, Any]] = server.api("targets", [("state", "active")])["activeTargets"]
    return targets if len(targets) >= count else []
