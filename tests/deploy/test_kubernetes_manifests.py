"""Kubernetes manifests: schema-valid after assembly, and wired together as they claim."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from testkit.daemon import trainmon_command
from tests.deploy.deploy_support import crd_schemas, kustomize
from tests.deploy.deploy_support.common import KUBERNETES, VARIANTS, run
from trainmon import __version__

Manifest = dict[str, Any]
#: The oldest Kubernetes release still commonly run, and the newest with schemas.
KUBERNETES_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
EXAMPLE_JOB = KUBERNETES / "examples" / "training-job.yaml"


def find(objects: list[Manifest], kind: str, name: str) -> Manifest:
    for manifest in objects:
        if manifest["kind"] == kind and manifest["metadata"]["name"] == name:
            return manifest
    raise AssertionError(f"no {kind}/{name} in {[(o['kind'], o['metadata']['name']) for o in objects]}")


def pod_spec(workload: Manifest) -> Manifest:
    spec: Manifest = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Manifest, name: str) -> Manifest:
    for entry in pod_spec(workload)["containers"]:
        if entry["name"] == name:
            return dict(entry)
    raise AssertionError(f"no container {name}")


def validate(manifest: Manifest, version: str) -> None:
    """Built-in kinds against the Kubernetes schemas (strict); CRDs against their schema."""
    schema = crd_schemas.SCHEMAS.get(manifest["kind"])
    if schema is not None:
        jsonschema.validate(manifest, schema)
    else:
        kubernetes_validate.validate(manifest, version, strict=True)


def configmap_files(objects: list[Manifest], name: str) -> dict[str, Any]:
    data: dict[str, Any] = find(objects, "ConfigMap", name)["data"]
    return {key: yaml.safe_load(text) for key, text in data.items()}


# -- schemas --------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_assembled_object_is_schema_valid(
    overlays: dict[str, list[Manifest]], variant: str, version: str
) -> None:
    kinds = set()
    for manifest in overlays[variant]:
        validate(manifest, version)
        kinds.add(manifest["kind"])
    assert {"Namespace", "DaemonSet", "Service", "ServiceMonitor", "PrometheusRule"} <= kinds


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_example_training_job_is_schema_valid(version: str) -> None:
    documents = [doc for doc in yaml.safe_load_all(EXAMPLE_JOB.read_text()) if doc]
    assert [doc["kind"] for doc in documents] == ["Job"]
    validate(documents[0], version)


def test_validation_is_strict_enough_to_catch_a_misspelt_field(
    overlays: dict[str, list[Manifest]],
) -> None:
    daemonset = copy.deepcopy(find(overlays["dcgm"], "DaemonSet", "trainmon"))
    pod_spec(daemonset)["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(daemonset, KUBERNETES_VERSIONS[-1])
    monitor = copy.deepcopy(find(overlays["dcgm"], "ServiceMonitor", "trainmon"))
    monitor["spec"]["endpoints"][0]["honorlabels"] = True
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor, KUBERNETES_VERSIONS[-1])
    rule = copy.deepcopy(find(overlays["dcgm"], "PrometheusRule", "trainmon-dcgm"))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    with pytest.raises(jsonschema.ValidationError):
        validate(rule, KUBERNETES_VERSIONS[-1])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
@pytest.mark.parametrize("variant", VARIANTS)
def test_assembly_matches_kubectl_kustomize(
    overlays: dict[str, list[Manifest]], variant: str
) -> None:
    """Where kubectl exists, its kustomize builds exactly what the test assembler builds."""
    completed = run(["kubectl", "kustomize", str(KUBERNETES / "overlays" / variant)])
    assert completed.returncode == 0, completed.stderr
    theirs = kustomize.by_kind_and_name(list(yaml.safe_load_all(completed.stdout)))
    assert kustomize.by_kind_and_name(overlays[variant]) == theirs


def test_assembler_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "patches: [{path: patch.yaml}]\n"
    )
    with pytest.raises(kustomize.KustomizeError, match="patches"):
        kustomize.build(tmp_path)


# -- wiring -----------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_everything_lands_in_the_trainmon_namespace(
    overlays: dict[str, list[Manifest]], variant: str
) -> None:
    for manifest in overlays[variant]:
        metadata = manifest["metadata"]
        assert metadata["labels"]["app.kubernetes.io/part-of"] == "trainmon"
        if manifest["kind"] != "Namespace":
            assert metadata["namespace"] == "trainmon", manifest["kind"]


def test_node_daemon_pod_matches_its_configuration(overlays: dict[str, list[Manifest]]) -> None:
    objects = overlays["dcgm"]
    daemonset = find(objects, "DaemonSet", "trainmon")
    pod = pod_spec(daemonset)
    daemon = container(daemonset, "trainmon")
    config_file = PurePosixPath(daemon["args"][daemon["args"].index("--config") + 1])
    configs = configmap_files(objects, "trainmon-config")
    config = configs[config_file.name]

    mounts = {mount["name"]: mount for mount in daemon["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert mounts["config"]["mountPath"] == str(config_file.parent)
    assert volumes["config"]["configMap"]["name"] == "trainmon-config"
    # The host's /proc and /sys, read-only, where the configuration looks.
    for key, host in (("proc", "/proc"), ("sys", "/sys")):
        assert volumes[key]["hostPath"]["path"] == host
        assert mounts[key] == {"name": key, "mountPath": config["paths"][key], "readOnly": True}
    # The whole folder is the ConfigMap's volume (no subPath, which the kubelet never
    # updates), and the daemon reloads the file when its content changes.
    assert "subPath" not in mounts["config"]
    assert config["reload"]["watch_interval_seconds"] > 0
    # The step socket's folder is the node's /run/trainmon.
    socket = PurePosixPath(config["collectors"]["training"]["socket"])
    assert mounts["step-socket"]["mountPath"] == str(socket.parent)
    assert volumes["step-socket"]["hostPath"]["path"] == "/run/trainmon"
    # The port Prometheus scrapes is the one the daemon listens on.
    port = daemon["ports"][0]
    assert port["name"] == "metrics"
    assert config["listen"].endswith(f":{port['containerPort']}")
    for probe in ("livenessProbe", "readinessProbe"):
        assert daemon[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # Node-level view, without the host's PID namespace or root.
    assert pod["hostNetwork"] is True
    assert pod["hostPID"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert daemon["securityContext"]["allowPrivilegeEscalation"] is False
    assert daemon["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert daemon["resources"]["requests"] and daemon["resources"]["limits"]["memory"]
    # GPU nodes, including tainted ones.
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod["tolerations"]
    # The init container hands the socket folder to the daemon's user and group.
    init = pod["initContainers"][0]
    user, group = pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
    assert f"chown {user}:{group} {socket.parent}" in init["command"][-1]
    assert config["collectors"]["training"]["socket_mode"] == "0660"


def test_node_daemon_pod_raises_the_datagram_queue_of_the_host(
    overlays: dict[str, list[Manifest]],
) -> None:
    """net.unix.max_dgram_qlen, as deploy/systemd/trainmon.sysctl.conf sets it.

    It belongs to the network namespace: with hostNetwork the host's, which a pod's
    ``securityContext.sysctls`` may not touch, so a privileged init container writes
    it before the daemon creates its socket (the queue length is read then).
    """
    sysctl_file = KUBERNETES.parent / "systemd" / "trainmon.sysctl.conf"
    wanted = next(
        int(line.split("=", 1)[1])
        for line in sysctl_file.read_text().splitlines()
        if line.split("=", 1)[0].strip() == "net.unix.max_dgram_qlen"
    )
    for variant in VARIANTS:
        pod = pod_spec(find(overlays[variant], "DaemonSet", "trainmon"))
        assert pod["hostNetwork"] is True
        assert "sysctls" not in pod["securityContext"]  # refused beside hostNetwork
        inits = {entry["name"]: entry for entry in pod["initContainers"]}
        queue = inits["unix-datagram-queue"]
        assert queue["securityContext"]["privileged"] is True
        assert queue["securityContext"]["runAsUser"] == 0
        script = queue["command"][-1]
        assert f"-ge {wanted} ] || echo {wanted} > $qlen" in script
        assert "qlen=/proc/sys/net/unix/max_dgram_qlen" in script
        # the daemon itself stays unprivileged
        assert "privileged" not in container(
            find(overlays[variant], "DaemonSet", "trainmon"), "trainmon"
        )["securityContext"]


def test_datagram_queue_script_raises_and_never_lowers(
    overlays: dict[str, list[Manifest]], tmp_path: Path
) -> None:
    """The init container's script, run on a stand-in file for /proc/sys."""
    pod = pod_spec(find(overlays["dcgm"], "DaemonSet", "trainmon"))
    entry = next(e for e in pod["initContainers"] if e["name"] == "unix-datagram-queue")
    script = entry["command"][-1].replace(
        "/proc/sys/net/unix/max_dgram_qlen", str(tmp_path / "max_dgram_qlen")
    )
    for before, after in (("10", "512"), ("512", "512"), ("4096", "4096")):
        (tmp_path / "max_dgram_qlen").write_text(before + "\n")
        completed = run([*entry["command"][:-1], script])
        assert completed.returncode == 0, completed.stderr
        assert (tmp_path / "max_dgram_qlen").read_text().strip() == after
        assert completed.stdout.strip() == f"net.unix.max_dgram_qlen = {after}"


def test_images_are_pinned_and_trainmon_is_this_release(
    overlays: dict[str, list[Manifest]],
) -> None:
    trainmon_images = 0
    for variant in VARIANTS:
        for manifest in overlays[variant]:
            if "template" not in manifest.get("spec", {}):
                continue
            pod = pod_spec(manifest)
            for entry in pod["containers"] + pod.get("initContainers", []):
                name, _, tag = entry["image"].rpartition(":")
                assert name and tag and tag != "latest", entry["image"]
                if name == "trainmon":
                    assert tag == __version__
                    trainmon_images += 1
    assert trainmon_images == 7  # daemon + two init containers, twice; the puller


@pytest.mark.parametrize("variant", VARIANTS)
def test_service_monitors_reach_a_workload_port(
    overlays: dict[str, list[Manifest]], variant: str
) -> None:
    objects = overlays[variant]
    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    expected = {"trainmon", "dcgm-exporter"} if variant == "dcgm" else {"trainmon", "trainmon-tencent"}
    assert {m["metadata"]["name"] for m in monitors} == expected
    for monitor in monitors:
        wanted = monitor["spec"]["selector"]["matchLabels"]
        services = [
            o for o in objects
            if o["kind"] == "Service" and wanted.items() <= o["metadata"]["labels"].items()
        ]
        assert len(services) == 1, monitor["metadata"]["name"]
        service = services[0]
        endpoint = monitor["spec"]["endpoints"][0]
        port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
        workloads = [
            o for o in objects
            if o["kind"] in ("DaemonSet", "Deployment")
            and service["spec"]["selector"].items()
            <= o["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(workloads) == 1, service["metadata"]["name"]
        ports = [p for c in pod_spec(workloads[0])["containers"] for p in c["ports"]]
        assert any(p["name"] == port["targetPort"] for p in ports)
        # Every series gets the node it came from; pushed labels are honoured.
        assert endpoint["honorLabels"] is True
        assert {
            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node",
            "action": "replace",
        } in endpoint["relabelings"]


def test_puller_runs_once_with_its_secret(overlays: dict[str, list[Manifest]]) -> None:
    objects = overlays["tencent-cloud"]
    deployment = find(objects, "Deployment", "trainmon-tencent")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    puller = container(deployment, "trainmon-tencent")
    config_file = PurePosixPath(puller["args"][puller["args"].index("--config") + 1])
    config = configmap_files(objects, "trainmon-tencent-config")[config_file.name]
    tencent = config["collectors"]["tencent"]
    assert tencent["enabled"] is True
    assert config["listen"].endswith(f":{puller['ports'][0]['containerPort']}")
    # The SecretId as an environment variable, the SecretKey as a file.
    env = {entry["name"]: entry for entry in puller["env"]}
    assert tencent["secret_id"] == "${TENCENTCLOUD_SECRET_ID}"
    secret_ref = env["TENCENTCLOUD_SECRET_ID"]["valueFrom"]["secretKeyRef"]
    volumes = {volume["name"]: volume for volume in pod_spec(deployment)["volumes"]}
    mount = next(m for m in puller["volumeMounts"] if m["name"] == "credentials")
    secret = volumes["credentials"]["secret"]
    assert secret["secretName"] == secret_ref["name"]
    key_path = PurePosixPath(mount["mountPath"]) / secret["items"][0]["path"]
    assert tencent["secret_key_file"] == str(key_path)
    # The node collectors are off: the puller is not a node daemon.
    for name in ("network", "disk", "training"):
        assert config["collectors"][name]["enabled"] is False


def test_dcgm_overlay_runs_dcgm_exporter_and_the_other_does_not(
    overlays: dict[str, list[Manifest]],
) -> None:
    exporter = find(overlays["dcgm"], "DaemonSet", "dcgm-exporter")
    dcgm = container(exporter, "dcgm-exporter")
    assert dcgm["image"].startswith("nvcr.io/nvidia/k8s/dcgm-exporter:")
    assert dcgm["ports"][0]["containerPort"] == 9400
    env = {entry["name"]: entry.get("value") for entry in dcgm["env"]}
    assert env["DCGM_EXPORTER_KUBERNETES"] == "true"
    names = {(o["kind"], o["metadata"]["name"]) for o in overlays["tencent-cloud"]}
    assert not any("dcgm" in name for _, name in names)
    assert ("Deployment", "trainmon-tencent") not in {
        (o["kind"], o["metadata"]["name"]) for o in overlays["dcgm"]
    }


def test_example_job_shares_the_daemon_socket(overlays: dict[str, list[Manifest]]) -> None:
    job = yaml.safe_load(EXAMPLE_JOB.read_text())
    daemonset = find(overlays["dcgm"], "DaemonSet", "trainmon")
    config = configmap_files(overlays["dcgm"], "trainmon-config")["trainmon.yml"]
    socket = PurePosixPath(config["collectors"]["training"]["socket"])
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    env = {entry["name"]: entry["value"] for entry in trainer["env"]}
    assert env["TRAINMON_ENDPOINT"] == f"unix://{socket}"
    mount = trainer["volumeMounts"][0]
    assert mount["mountPath"] == str(socket.parent)
    volume = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    daemon_volume = next(v for v in pod_spec(daemonset)["volumes"] if v["name"] == "step-socket")
    assert volume["hostPath"]["path"] == daemon_volume["hostPath"]["path"]
    group = pod_spec(daemonset)["securityContext"]["runAsGroup"]
    assert group in job["spec"]["template"]["spec"]["securityContext"]["supplementalGroups"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_configmaps_hold_valid_trainmon_configurations(
    overlays: dict[str, list[Manifest]], variant: str, tmp_path: Path
) -> None:
    """What the cluster gets in its ConfigMaps passes `trainmon check-config`."""
    checked = 0
    for manifest in overlays[variant]:
        if manifest["kind"] != "ConfigMap":
            continue
        for key, text in manifest["data"].items():
            path = tmp_path / key
            path.write_text(text)
            completed = run(
                [*trainmon_command(), "check-config", str(path)],
                env={"TENCENTCLOUD_SECRET_ID": "AKIDexample"},
            )
            assert completed.returncode == 0, completed.stdout + completed.stderr
            checked += 1
    assert checked == (1 if variant == "dcgm" else 2)
