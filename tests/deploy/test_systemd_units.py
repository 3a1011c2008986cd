"""The systemd units: systemd's own verifier, its exposure score, the hardening they promise."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.deploy.deploy_support.common import DEPLOY, run, tool
from trainmon.collectors.training import TrainingConfig

SYSTEMD = DEPLOY / "systemd"
UNITS = ("trainmon.service", "trainmon-tencent.service")
#: Where the units expect the installed program (docs/deploy.md, "Bare metal").
PROGRAM = "opt/trainmon/bin/trainmon"
#: The programs the units start: the daemon, and kill for ``ExecReload`` (SIGHUP).
PROGRAMS = (PROGRAM, "bin/kill")


def parse_unit(path: Path) -> dict[str, list[str]]:
    """``Section.Key`` → every value given (systemd keys may repeat)."""
    entries: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return entries


def system_root(tmp_path: Path, unit_text: dict[str, str]) -> Path:
    """A file-system root holding systemd's own units, ours, and the program they start."""
    root = tmp_path / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    for name, text in unit_text.items():
        (root / "etc/systemd/system" / name).write_text(text, encoding="utf-8")
    for name in PROGRAMS:
        program = root / name
        program.parent.mkdir(parents=True, exist_ok=True)
        program.write_text("#!/bin/sh\n", encoding="utf-8")
        program.chmod(0o755)
    return root


def verify(tmp_path: Path, name: str, text: str) -> tuple[int, str]:
    root = system_root(tmp_path, {name: text})
    completed = run(
        [tool("systemd-analyze"), "verify", f"--root={root}", f"/etc/systemd/system/{name}"]
    )
    return completed.returncode, (completed.stdout + completed.stderr).strip()


@pytest.mark.parametrize("name", UNITS)
def test_systemd_analyze_verify_accepts_the_unit_without_a_warning(
    tmp_path: Path, name: str
) -> None:
    returncode, output = verify(tmp_path, name, (SYSTEMD / name).read_text(encoding="utf-8"))
    assert (returncode, output) == (0, "")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("ProtectHome=yes", "ProtectHom=yes"), "Unknown key"),
        (("ProtectSystem=strict", "ProtectSystem=stricter"), "protect system value"),
        (("ExecStart=/opt", "ExecStart=opt"), "absolute path"),
    ],
)
def test_the_verify_check_catches_a_broken_unit(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    """The check above fails on a typo: warnings count, not only the exit code."""
    text = (SYSTEMD / "trainmon.service").read_text(encoding="utf-8").replace(*change)
    returncode, output = verify(tmp_path, "trainmon.service", text)
    assert message in output
    assert (returncode, output) != (0, "")


@pytest.mark.parametrize(("name", "ceiling"), [("trainmon.service", 2.0), ("trainmon-tencent.service", 1.5)])
def test_systemd_exposure_score_is_low(tmp_path: Path, name: str, ceiling: float) -> None:
    """`systemd-analyze security` rates 0 (locked down) to 10 (exposed); NVML keeps the
    node daemon's device access, so its ceiling is higher than the puller's."""
    root = system_root(tmp_path, {name: (SYSTEMD / name).read_text(encoding="utf-8")})
    completed = run(
        [
            tool("systemd-analyze"),
            "security",
            "--offline=yes",
            f"--root={root}",
            "--no-pager",
            f"/etc/systemd/system/{name}",
        ]
    )
    assert completed.returncode == 0, completed.stderr
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", completed.stdout)
    assert match is not None, completed.stdout
    assert float(match.group(1)) <= ceiling, completed.stdout


COMMON_HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateMounts": "yes",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "ProtectHostname": "yes",
    "RestrictNamespaces": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "SystemCallArchitectures": "native",
    "Restart": "on-failure",
    "RestartPreventExitStatus": "2",
}


@pytest.mark.parametrize("name", UNITS)
def test_units_carry_the_common_hardening(name: str) -> None:
    unit = parse_unit(SYSTEMD / name)
    for key, value in COMMON_HARDENING.items():
        assert unit.get(f"Service.{key}") == [value], key
    assert "@system-service" in unit["Service.SystemCallFilter"]
    assert unit["Install.WantedBy"] == ["multi-user.target"]
    # /etc/trainmon keeps systemd's default 0755: the puller's dynamic user
    # must read its configuration there too.
    assert unit["Service.ConfigurationDirectory"] == ["trainmon"]
    assert "Service.ConfigurationDirectoryMode" not in unit
    # `systemctl reload` is the daemon's SIGHUP (tests/test_reload.py)
    assert unit["Service.ExecReload"] == ["/bin/kill -HUP $MAINPID"]


def test_node_daemon_unit_gives_nvml_its_devices_and_the_socket_its_group() -> None:
    unit = parse_unit(SYSTEMD / "trainmon.service")
    service = {key.removeprefix("Service."): values for key, values in unit.items()}
    assert service["ExecStart"] == [
        "/opt/trainmon/bin/trainmon serve --config /etc/trainmon/trainmon.yml"
    ]
    assert (service["User"], service["Group"]) == (["trainmon"], ["trainmon"])
    # The step socket's folder, group-accessible and kept across restarts.
    assert service["RuntimeDirectory"] == ["trainmon"]
    assert service["RuntimeDirectoryMode"] == ["0750"]
    assert service["RuntimeDirectoryPreserve"] == ["yes"]
    # NVML: the device allow-list, never a private /dev.
    assert service["DevicePolicy"] == ["closed"]
    assert set(service["DeviceAllow"]) == {
        "/dev/nvidiactl rw",
        "/dev/nvidia-uvm rw",
        "char-nvidia* rw",
    }
    assert "PrivateDevices" not in service
    # Process attribution reads other users' /proc/<pid>; NIC counters /proc/net.
    assert "ProtectProc" not in service
    assert "ProcSubset" not in service
    assert "After" in {key.removeprefix("Unit.") for key in unit if key.startswith("Unit.")}
    assert "nvidia-persistenced.service" in unit["Unit.After"][0].split()


def test_puller_unit_is_isolated_and_gets_its_key_as_a_credential() -> None:
    service = {
        key.removeprefix("Service."): values
        for key, values in parse_unit(SYSTEMD / "trainmon-tencent.service").items()
    }
    assert service["ExecStart"] == [
        "/opt/trainmon/bin/trainmon serve --config /etc/trainmon/tencent.yml"
    ]
    assert service["DynamicUser"] == ["yes"]
    for key in ("PrivateDevices", "PrivateUsers", "MemoryDenyWriteExecute"):
        assert service[key] == ["yes"], key
    assert service["ProtectProc"] == ["invisible"]
    assert service["LoadCredential"] == ["tencent-secret-key:/etc/trainmon/tencent-secret-key"]
    assert service["EnvironmentFile"] == ["-/etc/trainmon/tencent.env"]


def test_example_configs_fit_the_units() -> None:
    """The configs the units read put the socket and the secret where the units expect."""
    node_unit = parse_unit(SYSTEMD / "trainmon.service")
    node = yaml.safe_load((DEPLOY / "examples" / "trainmon.yml").read_text(encoding="utf-8"))
    runtime_dir = "/run/" + node_unit["Service.RuntimeDirectory"][0]
    training = node["collectors"]["training"]
    assert str(Path(training["socket"]).parent) == runtime_dir
    assert training["socket_mode"] == "0660"  # the group of RuntimeDirectoryMode=0750
    assert node["listen"].endswith(":19400")

    puller_unit = parse_unit(SYSTEMD / "trainmon-tencent.service")
    puller = yaml.safe_load((DEPLOY / "examples" / "tencent.yml").read_text(encoding="utf-8"))
    credential = puller_unit["Service.LoadCredential"][0].split(":")[0]
    tencent = puller["collectors"]["tencent"]
    assert tencent["secret_key_file"] == "${CREDENTIALS_DIRECTORY}/" + credential
    assert tencent["secret_id"] == "${TENCENTCLOUD_SECRET_ID}"
    assert "secret_key" not in tencent
    assert puller["listen"].endswith(":19401")


def test_sysusers_file_creates_the_daemon_user_and_socket_group(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n", encoding="utf-8")
    (root / "etc/group").write_text("root:x:0:\n", encoding="utf-8")
    completed = run(
        [tool("systemd-sysusers"), f"--root={root}", "-"],
        stdin_text=(SYSTEMD / "trainmon.sysusers").read_text(encoding="utf-8"),
    )
    assert completed.returncode == 0, completed.stderr
    users = {line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").open()}
    groups = {line.split(":")[0]: line.split(":") for line in (root / "etc/group").open()}
    assert users["trainmon"][6].strip() == "/usr/sbin/nologin"
    assert users["trainmon"][3] == groups["trainmon"][2]


def test_sysctl_file_sets_existing_kernel_settings() -> None:
    settings = {}
    for line in (SYSTEMD / "trainmon.sysctl.conf").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings[key.strip()] = int(value)
    assert set(settings) == {"net.unix.max_dgram_qlen", "net.core.rmem_max"}
    assert settings["net.unix.max_dgram_qlen"] >= 512
    # What the daemon asks for by default fits under the cap.
    assert settings["net.core.rmem_max"] >= TrainingConfig().receive_buffer_bytes
    for key in settings:
        assert Path("/proc/sys", *key.split(".")).exists(), key


def test_both_units_run_python_alike() -> None:
    """The puller's unit sets the node daemon unit's Environment= (-OO, one malloc arena),
    which make run and testkit.footprint also read."""
    def environment(name: str) -> set[str]:
        return {word for line in parse_unit(SYSTEMD / name).get("Service.Environment", [])
                for word in line.split()}
    assert environment("trainmon.service") == environment("trainmon-tencent.service") == {
        "PYTHONOPTIMIZE=2", "MALLOC_ARENA_MAX=1"}
