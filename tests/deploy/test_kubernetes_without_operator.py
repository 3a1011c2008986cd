"""Kubernetes without the Prometheus Operator (docs/deploy.md): the daemons with no CRD
objects, the access a Prometheus needs for its discovery, and that Prometheus and its
Alertmanager configured from ConfigMaps and a Secret made from the repository's files.

The ConfigMaps and the Secret are made by the commands docs/deploy.md gives
(``kubectl create … --dry-run=client -o yaml``, which needs no cluster) and laid out as
their volumes would be, then checked by promtool and amtool. Debian's promtool is built
without Kubernetes service discovery ("field kubernetes_sd_configs not found in type
config.ScrapeConfig"); there the ``kubernetes_sd_configs`` blocks are swapped for a
file of targets before the check, and test_prometheus_configs.py checks the blocks'
fields and meta labels against the Prometheus reference.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.deploy_support import kustomize
from tests.deploy.deploy_support.common import (
    ALERTMANAGER_CONFIG,
    ALERTS,
    KUBERNETES,
    PROMETHEUS,
    REPO,
    VARIANTS,
    run,
    tool,
)

Manifest = dict[str, Any]
WITHOUT_OPERATOR = KUBERNETES / "without-operator"
OPERATOR_API = "monitoring.coreos.com/v1"
DISCOVERY = {("Role", "prometheus-discovery"), ("RoleBinding", "prometheus-discovery")}
#: What `role: endpoints` discovery lists and watches (Prometheus configuration reference).
ENDPOINTS_ROLE_RESOURCES = {"endpoints", "services", "pods"}
kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")


@pytest.fixture(scope="module")
def plain() -> dict[str, list[Manifest]]:
    return {variant: kustomize.build(WITHOUT_OPERATOR / variant) for variant in VARIANTS}


def keyed(objects: list[Manifest]) -> dict[tuple[str, str], Manifest]:
    return kustomize.by_kind_and_name(objects)


def find(objects: list[Manifest], kind: str, name: str) -> Manifest:
    return keyed(objects)[(kind, name)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_overlay_without_the_operators_objects_plus_discovery_access(
    overlays: dict[str, list[Manifest]], plain: dict[str, list[Manifest]], variant: str
) -> None:
    operator = {key for key, manifest in keyed(overlays[variant]).items()
                if manifest["apiVersion"] == OPERATOR_API}
    assert {kind for kind, _ in operator} == {"ServiceMonitor", "PrometheusRule"}
    expected = {key: manifest for key, manifest in keyed(overlays[variant]).items()
                if key not in operator}
    theirs = keyed(plain[variant])
    assert set(theirs) == set(expected) | DISCOVERY
    assert {key: theirs[key] for key in expected} == expected  # everything else unchanged
    assert all(manifest["apiVersion"] != OPERATOR_API for manifest in plain[variant])


@pytest.mark.parametrize("version", ("1.28.0", kubernetes_validate.latest_version()))
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_is_a_built_in_kind_and_schema_valid(
    plain: dict[str, list[Manifest]], variant: str, version: str
) -> None:
    for manifest in plain[variant]:
        kubernetes_validate.validate(manifest, version, strict=True)
        assert manifest["metadata"]["labels"]["app.kubernetes.io/part-of"] == "trainmon"
        if manifest["kind"] != "Namespace":
            assert manifest["metadata"]["namespace"] == "trainmon", manifest["kind"]


@kubectl
@pytest.mark.parametrize("variant", VARIANTS)
def test_assembly_matches_kubectl_kustomize(plain: dict[str, list[Manifest]], variant: str) -> None:
    completed = run(["kubectl", "kustomize", str(WITHOUT_OPERATOR / variant)])
    assert completed.returncode == 0, completed.stderr
    assert keyed(plain[variant]) == keyed(list(yaml.safe_load_all(completed.stdout)))


def test_the_assembler_refuses_patches_other_than_one_deletion(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: a}\n")
    for patch in ("$patch: delete\napiVersion: v1\nkind: Service\nmetadata: {name: b}\n",
                  "apiVersion: v1\nkind: Service\nmetadata: {name: a, labels: {x: y}}\n"):
        (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": ["a.yaml"], "patches": [{"patch": patch}]}))
        with pytest.raises(kustomize.KustomizeError, match="patch"):
            kustomize.build(tmp_path)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_role_grants_what_the_shipped_discovery_watches(
    plain: dict[str, list[Manifest]], variant: str
) -> None:
    config = yaml.safe_load((PROMETHEUS / f"prometheus-{variant}-kubernetes.yml").read_text())
    blocks = [block for job in config["scrape_configs"] for block in job["kubernetes_sd_configs"]]
    assert {block["role"] for block in blocks} == {"endpoints"}
    namespaces = {name for block in blocks for name in block["namespaces"]["names"]}
    role = find(plain[variant], "Role", "prometheus-discovery")
    binding = find(plain[variant], "RoleBinding", "prometheus-discovery")
    assert namespaces == {role["metadata"]["namespace"]} == {binding["metadata"]["namespace"]}
    [rule] = role["rules"]
    assert rule["apiGroups"] == [""] and set(rule["resources"]) == ENDPOINTS_ROLE_RESOURCES
    assert set(rule["verbs"]) == {"get", "list", "watch"}
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "prometheus-discovery"}
    # kustomize namespaces only subjects named `default`: this one keeps its own, which
    # is where the shipped config expects Alertmanager too
    [subject] = binding["subjects"]
    [alertmanagers] = config["alerting"]["alertmanagers"]
    [target] = alertmanagers["static_configs"][0]["targets"]
    assert subject["kind"] == "ServiceAccount"
    assert target == f"alertmanager.{subject['namespace']}.svc:9093"


def created(command: list[str]) -> dict[str, str]:
    """The files of the ConfigMap or Secret ``kubectl create … --dry-run=client`` makes."""
    completed = run(["kubectl", *command, "--dry-run=client", "-o", "yaml"], cwd=REPO)
    assert completed.returncode == 0, completed.stderr
    made = yaml.safe_load(completed.stdout)
    if made["kind"] == "Secret":
        return {name: base64.b64decode(value).decode() for name, value in made["data"].items()}
    return dict(made["data"])


def mount(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")


def rule_count(variant: str) -> int:
    return sum(len(group["rules"]) for path in (ALERTS / variant).glob("*.yml")
               for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []))


@pytest.mark.integration
@kubectl
@pytest.mark.parametrize("variant", VARIANTS)
def test_prometheus_from_configmaps_passes_promtool(variant: str, tmp_path: Path) -> None:
    etc = tmp_path / "prometheus"
    mount(etc, created(["-n", "monitoring", "create", "configmap", "prometheus-trainmon",
                        f"--from-file=prometheus.yml=deploy/prometheus/"
                        f"prometheus-{variant}-kubernetes.yml"]))
    mount(etc / "rules", created(["-n", "monitoring", "create", "configmap", "trainmon-rules",
                                  f"--from-file=alerts/{variant}/"]))
    config = etc / "prometheus.yml"
    checked = run([tool("promtool"), "check", "config", str(config)])
    output = checked.stdout + checked.stderr
    if "field kubernetes_sd_configs not found" in output:  # built without Kubernetes SD
        document = yaml.safe_load(config.read_text())
        for job in document["scrape_configs"]:
            job["file_sd_configs"] = [{"files": ["targets.yml"]}]
            del job["kubernetes_sd_configs"]
        config.write_text(yaml.safe_dump(document), encoding="utf-8")
        checked = run([tool("promtool"), "check", "config", str(config)])
        output = checked.stdout + checked.stderr
    assert checked.returncode == 0, output
    assert f"SUCCESS: {rule_count(variant)} rules found" in output


@pytest.mark.integration
@kubectl
def test_alertmanager_from_a_secret_and_a_configmap_passes_amtool(tmp_path: Path) -> None:
    etc = tmp_path / "alertmanager"
    mount(etc, created(["-n", "monitoring", "create", "secret", "generic", "alertmanager-trainmon",
                        "--from-file=alertmanager.yml=deploy/alertmanager/alertmanager.yml"]))
    mount(etc / "templates", created(["-n", "monitoring", "create", "configmap",
                                      "alertmanager-trainmon-templates",
                                      "--from-file=deploy/alertmanager/templates/"]))
    assert (etc / "alertmanager.yml").read_text() == ALERTMANAGER_CONFIG.read_text()
    checked = run([tool("amtool"), "check-config", str(etc / "alertmanager.yml")])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert " - 1 templates" in checked.stdout, checked.stdout  # templates/*.tmpl found
