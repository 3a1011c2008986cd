"""Where the ledger lives when deployed: the default path is writable under the systemd
unit's hardening and on the DaemonSet's node, for the daemon's user, and it is the
daemon's default because that user owns the folder (``trainmon.paths``). The folders a
daemon makes itself: ``tests/test_paths.py``, ``tests/security/test_user_defaults.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from trainmon.ledger.config import DEFAULT_LEDGER_PATH, LedgerConfig
from trainmon.paths import default_ledger_path, uses_system_directory

ROOT = Path(__file__).resolve().parents[2]


def test_the_systemd_unit_gives_the_ledger_a_state_directory() -> None:
    unit = (ROOT / "deploy/systemd/trainmon.service").read_text()
    settings = [line.strip() for line in unit.splitlines() if not line.startswith("#")]
    assert "ProtectSystem=strict" in settings  # only StateDirectory= makes /var/lib writable
    assert f"StateDirectory={DEFAULT_LEDGER_PATH.parent.name}" in settings
    assert DEFAULT_LEDGER_PATH.parent == Path("/var/lib") / DEFAULT_LEDGER_PATH.parent.name
    assert default_ledger_path(environ={}, euid=0) == DEFAULT_LEDGER_PATH
    # what the unit's StateDirectory= hands the daemon, whoever it runs as
    unit = {"STATE_DIRECTORY": str(DEFAULT_LEDGER_PATH.parent)}
    assert default_ledger_path(environ=unit, euid=12345) == DEFAULT_LEDGER_PATH
    assert LedgerConfig().file == default_ledger_path()


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



def test_the_deployed_daemons_user_owns_the_system_folders_so_they_are_its_defaults(
        tmp_path: Path) -> None:
    """The DaemonSet runs as ``runAsUser`` after its init container's chown, the unit as
    ``trainmon`` with StateDirectory=: neither is root, both get the system paths."""
    if os.geteuid() != 0:
        pytest.skip("chown needs root; the rule itself is in tests/test_paths.py")
    [daemonset] = [doc for doc in yaml.safe_load_all(
        (ROOT / "deploy/kubernetes/base/daemonset.yaml").read_text()) if doc]
    user = daemonset["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    state = tmp_path / "var/lib/trainmon"
    state.mkdir(parents=True)
    assert not uses_system_directory(state, user)
    os.chown(state, user, user)  # what the init container does
    assert uses_system_directory(state, user)
    assert default_ledger_path({"HOME": "/"}, user, state) == state / "ledger.sqlite3"
