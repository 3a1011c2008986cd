"""Where the ledger lives when deployed: the default path is writable under the systemd
unit's hardening and on the DaemonSet's node, for the daemon's user."""

from __future__ import annotations

from pathlib import Path

import yaml

from trainmon.ledger.config import DEFAULT_LEDGER_PATH, LedgerConfig

ROOT = Path(__file__).resolve().parents[2]


def test_the_systemd_unit_gives_the_ledger_a_state_directory() -> None:
    unit = (ROOT / "deploy/systemd/trainmon.service").read_text()
    settings = [line.strip() for line in unit.splitlines() if not line.startswith("#")]
    assert "ProtectSystem=strict" in settings  # only StateDirectory= makes /var/lib writable
    assert f"StateDirectory={DEFAULT_LEDGER_PATH.parent.name}" in settings
    assert DEFAULT_LEDGER_PATH.parent == Path("/var/lib") / DEFAULT_LEDGER_PATH.parent.name
    assert LedgerConfig().file == DEFAULT_LEDGER_PATH


def test_the_daemonset_keeps_the_ledger_on_the_node_writable_by_the_daemon() -> None:
    [daemonset] = [doc for doc in yaml.safe_load_all(
        (ROOT / "deploy/kubernetes/base/daemonset.yaml").read_text()) if doc]
    pod = daemonset["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    folder = str(DEFAULT_LEDGER_PATH.parent)
    assert volumes["state"]["hostPath"] == {"path": folder, "type": "DirectoryOrCreate"}
    [daemon] = [c for c in pod["containers"] if c["name"] == "trainmon"]
    assert {"name": "state", "mountPath": folder} in daemon["volumeMounts"]
    init = pod["initContainers"][0]
    assert {"name": "state", "mountPath": folder} in init["volumeMounts"]
    user = pod["securityContext"]["runAsUser"]
    command = " ".join(init["command"][-1].split())
    assert f"chown {user}:{user} /run/trainmon {folder}" in command
