"""``doctor``, ``runs`` and ``compare`` without ``--url``/``--ledger`` find the node's
daemon where it listens (``trainmon.local_daemon``): a real daemon on a free port,
named to the commands through a configuration file or ``TRAINMON_LISTEN``."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.daemon import Daemon, free_port, trainmon_command, wait_for_run
from trainmon.client import Reporter


def command(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """``trainmon ARGS`` with only ``env`` of the TRAINMON_* variables."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("TRAINMON_")}
    return subprocess.run([*trainmon_command(), *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=120, check=False)


def daemon_settings(daemon: Daemon) -> dict[str, Any]:
    assert daemon.config_path is not None
    settings: dict[str, Any] = yaml.safe_load(daemon.config_path.read_text())
    return settings


def config_file(tmp_path: Path, name: str, settings: Mapping[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(dict(settings)))
    return path




def test_doctor_reads_the_daemon_at_the_configured_listen_address(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    daemon = start_daemon()
    socket = daemon_settings(daemon)["collectors"]["training"]["socket"]
    config = config_file(tmp_path, "node.yml", {
        "listen": f"127.0.0.1:{daemon.port}", "collectors": {"training": {"socket": socket}}})
    done = command(["doctor", "--seconds", "1", "--json"], {"TRAINMON_CONFIG": str(config)})
    report = json.loads(done.stdout)
    assert report["source"]["url"] == f"{daemon.url}/metrics", done.stderr
    assert report["source"]["snapshots"] >= 2
    assert (f"trainmon doctor: read the daemon at {daemon.url} "
            f"(listen 127.0.0.1:{daemon.port} of {config})") in done.stderr
    assert (f"trainmon: reading the daemon at {daemon.url} (pid {daemon.process.pid} "
            "python3, uid 0 root)") in done.stderr
    assert "in use by another running daemon" not in done.stderr


def test_doctor_takes_the_address_from_trainmon_listen(
        start_daemon: Callable[..., Daemon]) -> None:
    daemon = start_daemon()
    done = command(["doctor", "--seconds", "1"],
                   {"TRAINMON_LISTEN": f"0.0.0.0:{daemon.port}"})
    assert f"read the daemon at {daemon.url} (TRAINMON_LISTEN=0.0.0.0:{daemon.port})" \
        in done.stderr
    assert f"trainmon doctor: read {daemon.url}/metrics for 1 s" in done.stdout


def test_doctor_samples_the_node_when_no_daemon_answers(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    daemon = start_daemon()  # listening on another port than the configuration says
    socket = daemon_settings(daemon)["collectors"]["training"]["socket"]
    nobody = free_port()
    config = config_file(tmp_path, "elsewhere.yml", {
        "listen": f"127.0.0.1:{nobody}", "collectors": {"training": {"socket": socket}}})
    done = command(["doctor", "--seconds", "1", "--json", "--config", str(config)], {})
    assert json.loads(done.stdout)["source"]["kind"] == "local"
    assert f"no daemon answered at http://127.0.0.1:{nobody}" in done.stderr
    # the daemon keeps its socket: sampled without it, and said so
    assert f"a daemon holds {socket} but is listening elsewhere" in done.stderr
    assert "in use by another running daemon" not in done.stderr
    quiet = config_file(tmp_path, "quiet.yml", {
        "listen": f"127.0.0.1:{nobody}",
        "collectors": {"training": {"socket": str(tmp_path / "own.sock")}}})
    done = command(["doctor", "--seconds", "1", "--config", str(quiet)], {})
    assert (f"no daemon answered at http://127.0.0.1:{nobody} (listen 127.0.0.1:{nobody} "
            f"of {quiet}); sampling this node") in done.stderr
    assert "trainmon doctor: sampled this node for 1 s" in done.stdout


def report_one_run(daemon: Daemon, job: str) -> None:
    socket = daemon_settings(daemon)["collectors"]["training"]["socket"]
    with Reporter(job=job, endpoint=f"unix://{socket}", environ={}) as reporter:
        for _ in range(20):
            reporter.step(samples=8)
    wait_for_run(daemon, job)


def test_runs_and_compare_read_the_daemon_when_the_ledger_file_is_missing(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    daemon = start_daemon({"collectors": {"ledger": {"flush_seconds": 0.2}}})
    report_one_run(daemon, "resnet")
    missing = tmp_path / "not-here" / "ledger.sqlite3"
    config = config_file(tmp_path, "reader.yml", {
        "listen": f"127.0.0.1:{daemon.port}",
        "collectors": {"ledger": {"path": str(missing)}}})
    done = command(["runs", "--json"], {"TRAINMON_CONFIG": str(config)})
    assert done.returncode == 0, done.stderr
    [run] = json.loads(done.stdout)["runs"]
    assert (run["job"], run["source"]) == ("resnet", "daemon")
    assert (f"trainmon: reading the daemon at {daemon.url} (pid {daemon.process.pid} "
            f"python3, uid 0 root); no readable ledger at {missing}") in done.stderr
    text = command(["runs"], {"TRAINMON_CONFIG": str(config)})
    assert run["run"] in text.stdout
    same = command(["compare", run["run"], run["run"], "--json"],
                   {"TRAINMON_CONFIG": str(config)})
    assert same.returncode == 0, same.stderr
    unknown = command(["compare", run["run"], "nope"], {"TRAINMON_CONFIG": str(config)})
    assert unknown.returncode == 2
    assert f"run 'nope' is not in the ledger of the daemon at {daemon.url}" in unknown.stderr
    assert not missing.parent.exists()


def test_runs_read_a_readable_ledger_file_and_name_it(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    daemon = start_daemon({"collectors": {"ledger": {"flush_seconds": 0.2}}})
    report_one_run(daemon, "bert")
    daemon.stop()  # the file alone: no daemon needed
    ledger = daemon_settings(daemon)["collectors"]["ledger"]["path"]
    done = command(["runs", "--json"], {"TRAINMON_CONFIG": str(daemon.config_path)})
    assert done.returncode == 0, done.stderr
    assert [run["source"] for run in json.loads(done.stdout)["runs"]] == ["ledger"]
    assert f"trainmon: reading the ledger {ledger}" in done.stderr


def test_runs_without_a_ledger_or_a_daemon_name_both(tmp_path: Path) -> None:
    missing, port = tmp_path / "ledger.sqlite3", free_port()
    config = config_file(tmp_path, "none.yml", {
        "listen": f"127.0.0.1:{port}", "collectors": {"ledger": {"path": str(missing)}}})
    done = command(["runs"], {"TRAINMON_CONFIG": str(config)})
    assert done.returncode == 1
    assert f"no readable ledger at {missing}, and no daemon answered at " \
           f"http://127.0.0.1:{port}" in done.stderr


@pytest.mark.parametrize("listen, url", [
    ("0.0.0.0:19400", "http://127.0.0.1:19400"), (":9100", "http://127.0.0.1:9100"),
    ("[::]:19400", "http://[::1]:19400"), ("10.1.2.3:19400", "http://10.1.2.3:19400"),
    ("127.0.0.1:0", None),
])
def test_the_url_of_a_listen_address(listen: str, url: str | None) -> None:
    from trainmon.http.listen import parse_listen_address
    from trainmon.local_daemon import loopback_url

    assert loopback_url(parse_listen_address(listen)) == url


def test_the_trusted_owners_of_a_local_daemon(tmp_path: Path) -> None:
    """Root, the caller, the owner of a system folder only root could have handed over
    (not one in a folder others may write), and the owners named."""
    from trainmon.local_daemon import DaemonTrust

    handed = tmp_path / "var-lib-trainmon"
    handed.mkdir()
    os.chown(handed, 4242, 4242)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    planted = shared / "var-lib-trainmon"
    planted.mkdir()
    os.chown(planted, 4343, 4343)
    trust = DaemonTrust.default(["4444", " root "], euid=1234, folders=(handed, planted))
    assert {0, 1234, 4242, 4444} <= trust.uids and 4343 not in trust.uids
    assert not trust.anyone and not trust.trusts(4343)
    assert DaemonTrust.default(["any"], euid=1234, folders=()).trusts(4343)
    with pytest.raises(ValueError, match="no user 'no-such-user-here'"):
        DaemonTrust.default(["no-such-user-here"], folders=())


def test_which_addresses_stay_on_this_node() -> None:
    import socket

    from trainmon.local_daemon import is_local_address

    assert all(map(is_local_address, ("127.0.0.1", "127.8.9.10", "::1", "0.0.0.0", "::")))
    assert not any(map(is_local_address, ("192.0.2.1", "2001:db8::1", "localhost", "")))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # the address this node would send from
        except OSError:
            pytest.skip("no route off this node")
        assert is_local_address(probe.getsockname()[0])


def test_a_remote_daemon_is_not_checked_and_an_unknown_owner_is_refused() -> None:
    from trainmon.http.peer import ListenerOwner
    from trainmon.local_daemon import DaemonTrust, TrustedDaemon, UntrustedDaemon

    def kernel_says_nothing(host: str, port: int) -> ListenerOwner | None:
        raise OSError(93, "Protocol not supported")

    trust = DaemonTrust.default(folders=())
    remote = TrustedDaemon.check("http://192.0.2.1:19400", trust, kernel_says_nothing)
    assert not remote.local and remote.describe() == (
        "the daemon at http://192.0.2.1:19400 (a remote host: its process is not checked)")
    with pytest.raises(UntrustedDaemon, match=r"sock_diag.*--trust-daemon-owner any"):
        TrustedDaemon.check("127.0.0.1:19400", trust, kernel_says_nothing)
    anyone = DaemonTrust.default(["any"], folders=())
    assert TrustedDaemon.check("http://[::1]:19400", anyone, kernel_says_nothing).listeners == ()
