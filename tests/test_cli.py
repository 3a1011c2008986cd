"""The command line, run as a user runs it: a real process, its output and exit code."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from testkit.daemon import Daemon, free_port, trainmon_command, wait_ready
from trainmon import __version__


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*trainmon_command(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_version() -> None:
    result = run("version")
    assert result.returncode == 0
    assert result.stdout.startswith(f"trainmon {__version__} ")


def test_no_command_prints_usage_and_exits_2() -> None:
    result = run()
    assert result.returncode == 2 and "serve" in result.stderr


def test_check_config_accepts_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "good.yml"
    path.write_text("listen: '127.0.0.1:19999'\ncollectors: {disk: {include: '^nvme'}}\n")
    result = run("check-config", str(path))
    assert result.returncode == 0, result.stderr
    assert f"{path}: OK" in result.stdout and "listen 127.0.0.1:19999" in result.stdout


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "collectors: {disk: {exclude: 'sd('}}",
            "collectors.disk.exclude: not a valid regular expression",
        ),
        ("collectors: {gpu: {enabeld: true}}", "collectors.gpu.enabeld: unknown key"),
        ("listen: [", "is not valid YAML"),
    ],
)
def test_check_config_rejects_a_bad_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(text)
    result = run("check-config", str(path))
    assert result.returncode == 2
    assert message in result.stderr


THREE_ERRORS = (
    "listen: '127.0.0.1:19999'\n"
    "collectors:\n"
    "  gpu: {enabeld: true}\n"
    "  ledger: {flush_second: 5}\n"
    "  disk: {exclude: 'sd('}\n"
)


def test_check_config_shows_every_error_at_once(tmp_path: Path) -> None:
    """Three errors in three sections: three lines, each naming its key, and the
    misspelt keys with the key they were meant to be."""
    path = tmp_path / "bad.yml"
    path.write_text(THREE_ERRORS)
    result = run("check-config", str(path))
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 3, result.stderr
    assert all(line.startswith(f"{path}: collectors.") for line in lines), result.stderr
    assert f"{path}: collectors.ledger.flush_second: unknown key, did you mean flush_seconds?" \
        in lines
    assert f"{path}: collectors.gpu.enabeld: unknown key, did you mean enabled?" in lines
    assert any(line.startswith(f"{path}: collectors.disk.exclude: not a valid regular")
               for line in lines)


def test_serve_refuses_a_config_with_every_error_listed(tmp_path: Path) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(THREE_ERRORS)
    port = free_port()
    result = run("serve", "--config", str(path), "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines()
              if line.startswith("trainmon: invalid configuration: collectors.")]
    assert len(errors) == 3, result.stderr
    with socket.socket() as sock:  # nothing was left bound
        sock.bind(("127.0.0.1", port))


def test_check_config_lists_what_the_file_turns_on(tmp_path: Path) -> None:
    path = tmp_path / "cloud.yml"
    path.write_text(
        "collectors:\n"
        "  gpu: {enabled: false}\n"  # attribution reads the GPU collector: off with it
        "  infiniband: {enabled: true}\n"
        "  tencent: {enabled: true, region: ap-guangzhou}\n"
    )
    result = run("check-config", str(path))
    assert result.returncode == 0, result.stderr
    assert ("collectors: network, infiniband, disk, nfs, training, platform, tencent, "
            "pressure, diagnosis, health, ledger, profiling;") in result.stdout


def test_check_config_validates_without_building_collectors(tmp_path: Path) -> None:
    """The collector modules are read for their sections and entries, but no collector
    is built: none instantiated, no NVML library loaded, no thread started, no HTTP
    session opened (the cloud puller's)."""
    path = tmp_path / "cloud.yml"
    path.write_text("collectors: {tencent: {enabled: true, region: ap-guangzhou}}\n")
    code = (
        "import sys, threading, requests\n"
        "def refuse(*args, **kwargs): raise AssertionError('check-config opened a Session')\n"
        "requests.Session.__init__ = refuse\n"
        "from trainmon.core.collector import Collector\n"
        "def build(cls, *args, **kwargs): raise AssertionError(f'check-config built {cls}')\n"
        "Collector.__new__ = build\n"
        "from trainmon.cli import main\n"
        f"code = main(['check-config', {str(path)!r}])\n"
        "nvml = sys.modules.get('pynvml')\n"
        "print('nvml loaded:', nvml is not None and nvml.nvmlLib is not None)\n"
        "print('threads:', threading.active_count())\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "nvml loaded: False" in result.stdout
    assert "threads: 1" in result.stdout


def test_the_collector_table_builds_what_it_lists() -> None:
    """``check-config`` names the table's entries; ``serve`` builds collectors by the same names."""
    from trainmon.cli import build_collectors, enabled_collectors
    from trainmon.config import parse_config

    config = parse_config({"collectors": {"infiniband": {"enabled": False}}})
    built = build_collectors(config, demo=False)
    assert [collector.name for collector in built] == [
        entry.name for entry in enabled_collectors(config, demo=False)
    ]
    assert [collector.name for collector in built] == [
        "network", "disk", "nfs", "gpu", "training", "platform", "attribution", "numa",
        "pressure", "diagnosis", "health", "ledger", "profiling",
    ]


def test_check_config_on_a_missing_file(tmp_path: Path) -> None:
    result = run("check-config", str(tmp_path / "nope.yml"))
    assert result.returncode == 2 and "No such file" in result.stderr


def test_serve_rejects_a_bad_config_before_binding(tmp_path: Path) -> None:
    path = tmp_path / "bad.yml"
    path.write_text("collectors: {network: {include: '('}}\n")
    port = free_port()
    result = run("serve", "--config", str(path), "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert "invalid configuration: collectors.network.include" in result.stderr
    with socket.socket() as sock:  # nothing was left bound
        sock.bind(("127.0.0.1", port))


def test_serve_rejects_a_bad_listen_flag_and_web_config(tmp_path: Path) -> None:
    result = run("serve", "--listen", "nowhere")
    assert result.returncode == 2 and "--listen: expected host:port" in result.stderr
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users: {admin: hunter2}\n")
    result = run("serve", "--listen", f"127.0.0.1:{free_port()}", "--web-config-file", str(web))
    assert result.returncode == 2 and "basic_auth_users.admin" in result.stderr
    assert "hunter2" not in result.stderr


def test_serve_reports_a_taken_port(start_daemon: Callable[..., Daemon]) -> None:
    daemon = start_daemon()
    result = run(
        "serve",
        "--listen",
        f"127.0.0.1:{daemon.port}",
        env={"TRAINMON_CONFIG": str(daemon.config_path)},
    )
    assert result.returncode == 1 and "cannot listen on" in result.stderr


def test_serve_with_built_in_defaults(tmp_path: Path) -> None:
    """No config file at all: NIC and disk metrics of this machine, with correct types."""
    port = free_port()
    log_path = tmp_path / "serve.log"
    env = {key: value for key, value in os.environ.items() if not key.startswith("TRAINMON_")}
    env["TRAINMON_LISTEN"] = f"127.0.0.1:{port}"  # options also come from the environment
    started = time.time()
    process = subprocess.Popen(
        [*trainmon_command(), "serve"],
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    daemon = Daemon(process, port, log_path)
    try:
        wait_ready(daemon)
        families = {f.name: f for f in text_string_to_metric_families(daemon.metrics())}
        assert families["trainmon_network_receive_bytes"].type == "counter"
        assert families["trainmon_disk_reads_completed"].type == "counter"
        assert families["trainmon_network_receive_bytes"].samples
        assert families["trainmon_build_info"].samples[0].labels["mode"] == "real"
        status, body = daemon.get("/healthz")
        assert status == 200 and '"network": {' in body
        assert_own_process_metrics(families, started)
    finally:
        assert daemon.stop(signal.SIGTERM) == 0, daemon.log()
    assert "stopped" in daemon.log()


def test_sigint_is_a_clean_shutdown(start_daemon: Callable[..., Daemon]) -> None:
    daemon = start_daemon()
    started = time.monotonic()
    assert daemon.stop(signal.SIGINT) == 0
    assert time.monotonic() - started < 5
    assert "Traceback" not in daemon.log()


def assert_own_process_metrics(families: dict[str, Metric], started: float) -> None:
    """The daemon's own footprint, in the standard ``process_*`` names, with sane values."""
    value = {name: families[name].samples[0].value for name in (
        "process_resident_memory_bytes", "process_virtual_memory_bytes",
        "process_cpu_seconds", "process_open_fds", "process_max_fds",
        "process_start_time_seconds",
    )}
    assert 4 << 20 < value["process_resident_memory_bytes"] < 1 << 30  # a Python daemon
    assert value["process_virtual_memory_bytes"] >= value["process_resident_memory_bytes"]
    assert families["process_cpu_seconds"].type == "counter"
    assert 0 < value["process_cpu_seconds"] < 120
    assert 3 <= value["process_open_fds"] <= value["process_max_fds"]
    # started while the test waited: within a few seconds after ``started``
    assert started - 2 < value["process_start_time_seconds"] < started + 60
    success = {s.labels["collector"]: s.value for s in families["trainmon_collector_success"].samples}
    assert success["process"] == 1.0
