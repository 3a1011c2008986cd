"""The kustomize components of deploy/kubernetes/components: each toggle, added to an
overlay as a user would (``components:`` in its kustomization), builds with
``kubectl kustomize``, every object it yields is schema-valid, and it changes what it
says and nothing else. Also the conventions every overlay keeps: the node's name from
the downward API, honorLabels, GPU nodes only."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.deploy_support import crd_schemas
from tests.deploy.deploy_support.common import ALERTS, KUBERNETES, VARIANTS, run
from tests.deploy.deploy_support.kustomize import Manifest, by_kind_and_name
from trainmon.attribution.podresources import DEFAULT_SOCKET

COMPONENTS = KUBERNETES / "components"
#: Each component and the overlay it is tested on alone: dcgm-compat only where no
#: dcgm-exporter runs (docs/alerts.md, "DCGM-compatible series"); the others, which
#: patch the base, on dcgm, and all of them together on tencent-cloud
#: (test_components_combine), so each is built with every overlay it applies to.
COMPONENT_VARIANTS: dict[str, tuple[str, ...]] = {
    "dcgm-compat": ("tencent-cloud",),
    "host-pid": ("dcgm",),
    "all-nodes": ("dcgm",),
    "pod-monitor": ("dcgm",),
    "pod-resources": ("dcgm",),
}
KUBERNETES_VERSION = kubernetes_validate.latest_version()

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None,
                                reason="kubectl (kustomize) not installed")


def build(tmp_path: Path, variant: str, *components: str) -> dict[tuple[str, str], Manifest]:
    """``kubectl kustomize`` of overlay ``variant`` with ``components`` added to it."""
    tree = tmp_path / f"{variant}-{'-'.join(components) or 'plain'}"
    shutil.copytree(KUBERNETES, tree)
    kustomization_path = tree / "overlays" / variant / "kustomization.yaml"
    kustomization = yaml.safe_load(kustomization_path.read_text())
    kustomization["components"] = [f"../../components/{name}" for name in components]
    kustomization_path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    completed = run(["kubectl", "kustomize", str(tree / "overlays" / variant)])
    assert completed.returncode == 0, completed.stderr
    objects = [document for document in yaml.safe_load_all(completed.stdout) if document]
    for manifest in objects:
        schema = crd_schemas.SCHEMAS.get(manifest["kind"])
        if schema is not None:
            jsonschema.validate(manifest, schema)
        else:
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        if manifest["kind"] != "Namespace":
            assert manifest["metadata"].get("namespace") == "trainmon", manifest["metadata"]
    return by_kind_and_name(objects)


def pod_spec(objects: dict[tuple[str, str], Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = objects[("DaemonSet", "trainmon")]["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[tuple[str, str], Manifest]]:
    folder = tmp_path_factory.mktemp("plain")
    return {variant: build(folder, variant) for variant in VARIANTS}


def test_every_component_is_a_kustomize_component_with_a_test() -> None:
    found = sorted(path.parent.name for path in COMPONENTS.glob("*/kustomization.yaml"))
    assert found == sorted(COMPONENT_VARIANTS)
    for name in found:
        kustomization = yaml.safe_load((COMPONENTS / name / "kustomization.yaml").read_text())
        assert kustomization["kind"] == "Component", name
        assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1alpha1", name


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_node_daemon_names_its_node_from_the_downward_api_on_gpu_nodes(
    plain: dict[str, dict[tuple[str, str], Manifest]], variant: str
) -> None:
    spec = pod_spec(plain[variant])
    [daemon] = [c for c in spec["containers"] if c["name"] == "trainmon"]
    env = {variable["name"]: variable for variable in daemon["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]
    assert spec["hostPID"] is False
    # the node label Prometheus sets is that same spec.nodeName; pod labels stay as exported
    [endpoint] = plain[variant][("ServiceMonitor", "trainmon")]["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node",
            "action": "replace"} in endpoint["relabelings"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_monitor_keeps_the_labels_its_target_exports(
    plain: dict[str, dict[tuple[str, str], Manifest]], variant: str
) -> None:
    """honorLabels on every endpoint: a `pod` label that trainmon (or dcgm-exporter) gives
    a GPU stays `pod`, not `exported_pod` under the exporter pod's own (the pod-monitor
    component's endpoint is the ServiceMonitor's: its test)."""
    objects = plain[variant]
    monitors = [o for (kind, _), o in objects.items() if kind in ("ServiceMonitor", "PodMonitor")]
    assert len(monitors) >= 2, list(objects)
    for monitor in monitors:
        spec = monitor["spec"]
        for endpoint in spec.get("endpoints", []) + spec.get("podMetricsEndpoints", []):
            assert endpoint["honorLabels"] is True, monitor["metadata"]["name"]


def changed(before: dict[tuple[str, str], Manifest],
            after: dict[tuple[str, str], Manifest]) -> set[tuple[str, str]]:
    """Objects added, removed or changed between two builds."""
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


@pytest.mark.parametrize("variant", COMPONENT_VARIANTS["host-pid"])
def test_host_pid_turns_on_the_host_pid_namespace_only(
    tmp_path: Path, plain: dict[str, dict[tuple[str, str], Manifest]], variant: str
) -> None:
    objects = build(tmp_path, variant, "host-pid")
    assert changed(plain[variant], objects) == {("DaemonSet", "trainmon")}
    expected = pod_spec(plain[variant]) | {"hostPID": True}
    assert pod_spec(objects) == expected


@pytest.mark.parametrize("variant", COMPONENT_VARIANTS["all-nodes"])
def test_all_nodes_drops_the_gpu_node_selector_and_tolerates_every_taint(
    tmp_path: Path, plain: dict[str, dict[tuple[str, str], Manifest]], variant: str
) -> None:
    objects = build(tmp_path, variant, "all-nodes")
    assert changed(plain[variant], objects) == {("DaemonSet", "trainmon")}
    spec = pod_spec(objects)
    assert "nodeSelector" not in spec
    assert spec["tolerations"] == [{"operator": "Exists"}]


@pytest.mark.parametrize("variant", COMPONENT_VARIANTS["pod-monitor"])
def test_pod_monitor_replaces_the_service_monitor_and_keeps_its_scrape(
    tmp_path: Path, plain: dict[str, dict[tuple[str, str], Manifest]], variant: str
) -> None:
    objects = build(tmp_path, variant, "pod-monitor")
    assert changed(plain[variant], objects) == {
        ("ServiceMonitor", "trainmon"), ("Service", "trainmon"), ("PodMonitor", "trainmon")}
    monitor = objects[("PodMonitor", "trainmon")]["spec"]
    [endpoint] = monitor["podMetricsEndpoints"]
    [before] = plain[variant][("ServiceMonitor", "trainmon")]["spec"]["endpoints"]
    assert endpoint == before  # honorLabels, the node relabelling, interval, port
    template = objects[("DaemonSet", "trainmon")]["spec"]["template"]
    assert monitor["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    ports = {port["name"] for c in template["spec"]["containers"] for port in c.get("ports", [])}
    assert endpoint["port"] in ports


@pytest.mark.parametrize("variant", COMPONENT_VARIANTS["pod-resources"])
def test_pod_resources_mounts_the_kubelet_socket_where_the_daemon_looks_for_it(
    tmp_path: Path, plain: dict[str, dict[tuple[str, str], Manifest]], variant: str
) -> None:
    objects = build(tmp_path, variant, "pod-resources")
    assert changed(plain[variant], objects) == {("DaemonSet", "trainmon")}
    spec = pod_spec(objects)
    [daemon] = [c for c in spec["containers"] if c["name"] == "trainmon"]
    [mount] = [m for m in daemon["volumeMounts"] if m["name"] == "pod-resources"]
    socket = Path(mount["mountPath"]) / "kubelet.sock"
    assert socket == DEFAULT_SOCKET  # collectors.attribution.pod_resources_socket's
    assert mount["readOnly"] is True
    [volume] = [v for v in spec["volumes"] if v["name"] == "pod-resources"]
    assert volume["hostPath"] == {"path": mount["mountPath"], "type": "Directory"}
    # root for the kubelet's root-only socket, and nothing more: no capability back
    security = daemon["securityContext"]
    assert security["runAsUser"] == 0 and security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert spec["hostPID"] is False and spec["securityContext"]["runAsUser"] == 19400


def test_dcgm_compat_adds_the_pack_as_a_prometheus_rule(
    tmp_path: Path, plain: dict[str, dict[tuple[str, str], Manifest]]
) -> None:
    objects = build(tmp_path, "tencent-cloud", "dcgm-compat")
    assert changed(plain["tencent-cloud"], objects) == {("PrometheusRule", "trainmon-dcgm-compat")}
    rules = yaml.safe_load((ALERTS / "dcgm-compat" / "dcgm-compat.rules.yml").read_text())
    assert objects[("PrometheusRule", "trainmon-dcgm-compat")]["spec"]["groups"] == rules["groups"]


def test_components_combine(
    tmp_path: Path, plain: dict[str, dict[tuple[str, str], Manifest]]
) -> None:
    objects = build(tmp_path, "tencent-cloud", *COMPONENT_VARIANTS)
    assert changed(plain["tencent-cloud"], objects) == {
        ("DaemonSet", "trainmon"), ("ServiceMonitor", "trainmon"), ("Service", "trainmon"),
        ("PodMonitor", "trainmon"), ("PrometheusRule", "trainmon-dcgm-compat")}
    spec = pod_spec(objects)
    assert spec["hostPID"] is True and "nodeSelector" not in spec
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert {"name", "hostPath"} <= next(v for v in spec["volumes"] if v["name"] == "pod-resources").keys()
    [endpoint] = objects[("PodMonitor", "trainmon")]["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True
