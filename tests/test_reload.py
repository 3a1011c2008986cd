"""Configuration reload of a running daemon (trainmon.reload): a real ``trainmon serve``,
a real SIGHUP, real ``POST /-/reload`` requests (from loopback and from this machine's
own non-loopback address), and a training job reporting steps through the client the
whole time. Each test waits on what the daemon exposes, within a deadline."""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import bcrypt
import pytest
import yaml

from testkit.daemon import Daemon, serve, wait_for_run
from testkit.exposition import Scrape, parse
from trainmon.client import Reporter

JOB = "reload-job"
#: The longest wait for a reload, or for the job's steps, to show on /metrics.
DEADLINE_SECONDS = 10.0
#: The daemons' reload.min_interval_seconds.
MIN_INTERVAL_SECONDS = 0.1


def write_config(path: Path, folder: Path, **changes: object) -> None:
    """The test daemon's configuration: its socket and ledger in ``folder``, sources
    that need no hardware; ``changes`` (a YAML text under ``raw``, or collector
    sections by name, merged over these) on top."""
    if "raw" in changes:
        path.write_text(str(changes["raw"]))
        return
    collectors: dict[str, dict[str, object]] = {
        "gpu": {"enabled": False},
        "tencent": {"enabled": False},
        "infiniband": {"enabled": False},
        "disk": {"enabled": True},
        "network": {"include": "^lo$", "exclude": None},
        "training": {"socket": str(folder / "steps.sock")},
        "ledger": {"path": str(folder / "ledger.sqlite3"), "flush_seconds": 0.2},
    }
    for name, section in changes.items():
        if name not in ("reload", "web_config_file"):
            collectors[name] = {**collectors.get(name, {}), **dict(section)}  # type: ignore[call-overload]
    config: dict[str, object] = {"collectors": collectors,
                                 "reload": changes.get("reload", {"min_interval_seconds": MIN_INTERVAL_SECONDS})}
    if "web_config_file" in changes:
        config["web_config_file"] = changes["web_config_file"]
    path.write_text(yaml.safe_dump(config))


class Job:
    """A one-rank training job reporting its steps through ``trainmon.client``."""

    def __init__(self, endpoint: str, name: str = JOB, token: str | None = None) -> None:
        self._reporter = Reporter(name, endpoint=endpoint, token=token, environ={}, rank=0,
                                  world_size=1, interval_seconds=0.1)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._train, daemon=True)
        self._thread.start()

    def _train(self) -> None:
        while not self._stopping.wait(0.005):  # a step's work
            self._reporter.step(samples=8)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._reporter.close()


def metrics(daemon: Daemon, headers: Mapping[str, str] | None = None) -> Scrape:
    status, body = daemon.get("/metrics", headers)
    assert status == 200, body
    return parse(body)


def wait_for(daemon: Daemon, condition: Callable[[Scrape], bool],
             headers: Mapping[str, str] | None = None) -> Scrape:
    """The first scrape for which ``condition`` holds, within ``DEADLINE_SECONDS``."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        scrape = metrics(daemon, headers)
        if condition(scrape):
            return scrape
        assert time.monotonic() < deadline, f"not seen on /metrics:\n{daemon.log()}"
        time.sleep(0.05)


def reloads(scrape: Scrape, result: str) -> float:
    return scrape.value("trainmon_config_reloads_total", result=result) or 0.0


def steps(scrape: Scrape, job: str = JOB) -> float:
    return scrape.value("trainmon_training_steps_total", job=job) or 0.0


def post(url: str, headers: Mapping[str, str] | None = None,
         method: str = "POST") -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None,
                                     headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def own_address() -> str | None:
    """An IPv4 address of this machine that is not loopback: the source of its route
    to TEST-NET-1 (a UDP connect sends nothing); None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if ipaddress.ip_address(address).is_loopback else address


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    write_config(tmp_path / "trainmon.yml", tmp_path)
    running = serve(tmp_path / "trainmon.yml", tmp_path / "trainmon.log",
                    state_directory=tmp_path, host="0.0.0.0")
    yield running
    running.stop()


def test_a_valid_file_takes_effect_on_sighup_and_post_while_a_job_reports(
        daemon: Daemon, tmp_path: Path) -> None:
    config = tmp_path / "trainmon.yml"
    job = Job(f"unix://{tmp_path / 'steps.sock'}")
    try:
        before = wait_for(daemon, lambda s: steps(s) > 0)
        assert before.value("trainmon_config_last_reload_successful") == 1
        assert before.value("trainmon_collector_success", collector="disk") is not None
        assert before.value("trainmon_network_receive_bytes_total", device="lo") is not None
        wait_for_run(daemon, JOB)
        kept_alive = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
        kept_alive.request("GET", "/healthz")
        first = kept_alive.getresponse()
        assert first.status == 200 and first.read()

        # SIGHUP: disk off, network on another interface filter, a new diagnosis
        # window (live); the training store's rate window (restart only: the store stays)
        write_config(config, tmp_path, disk={"enabled": False},
                     network={"include": "^nothing$"}, diagnosis={"window_seconds": 30},
                     training={"window_seconds": 120})
        os.kill(daemon.process.pid, signal.SIGHUP)
        after = wait_for(daemon, lambda s: reloads(s, "success") == 1)
        assert after.value("trainmon_config_last_reload_successful") == 1
        assert after.value("trainmon_collector_success", collector="disk") is None
        assert after.value("trainmon_network_receive_bytes_total", device="lo") is None
        assert after.value("trainmon_config_keys_awaiting_restart") == 1
        assert steps(after) >= steps(before)  # the store and its counters survived
        wait_for(daemon, lambda s: steps(s) > steps(after))  # and the job goes on
        log = daemon.log()
        assert "collectors.training.window_seconds changed" in log
        assert "collectors started: none; rebuilt: network, diagnosis; stopped: disk" in log
        assert log.count("run ledger at") == 1  # opened once: the ledger stayed open

        # the connection opened before the reload is still served
        kept_alive.request("GET", "/healthz")
        health = json.loads(kept_alive.getresponse().read())
        assert health["collectors"]["ledger"]["state"] == "ok"
        kept_alive.close()

        # POST from loopback, once reload.min_interval_seconds passed: disk back on
        write_config(config, tmp_path, training={"window_seconds": 120})
        wait_for(daemon, lambda s: time.time() > MIN_INTERVAL_SECONDS + (s.value(
            "trainmon_config_last_reload_success_timestamp_seconds") or 0.0))
        status, _, body = post(daemon.url + "/-/reload")
        assert status == 200, body
        assert json.loads(body) == {"status": "success",
                                    "restart_required": ["collectors.training.window_seconds"]}
        again = metrics(daemon)
        assert reloads(again, "success") == 2
        assert again.value("trainmon_collector_success", collector="disk") is not None
        assert steps(again) >= steps(after)
        wait_for_run(daemon, JOB)  # the ledger still answers, with the job's run

        # a GET is not a reload; a peer that is not loopback needs credentials
        status, headers, _ = post(daemon.url + "/-/reload", method="GET")
        assert (status, headers.get("Allow")) == (405, "POST")
        address = own_address()
        if address is None:
            pytest.skip("this machine has no address but loopback")
        status, _, body = post(f"http://{address}:{daemon.port}/-/reload")
        assert status == 403, body
        refused = metrics(daemon)
        assert refused.value("trainmon_config_reload_requests_refused_total",
                             reason="forbidden") == 1
        assert reloads(refused, "success") == 2
    finally:
        job.stop()


@pytest.mark.parametrize(("trigger", "text", "message"), [
    ("SIGHUP", "collectors: {disk: {enabled: false}\n",
     "is not valid YAML at line 2, column 1"),
    ("POST", "collectors:\n  disk: {enabeld: false}\n",
     "collectors.disk.enabeld: unknown key, did you mean enabled?"),
    ("POST", "collectors:\n  disk: {enabled: false}\n  ledger: {flush_seconds: -1}\n",
     "collectors.ledger.flush_seconds: must be >= 0.1, got -1"),
])
def test_an_invalid_file_keeps_the_running_configuration(
        daemon: Daemon, tmp_path: Path, trigger: str, text: str, message: str) -> None:
    job = Job(f"unix://{tmp_path / 'steps.sock'}")
    try:
        before = wait_for(daemon, lambda s: steps(s) > 0)
        write_config(tmp_path / "trainmon.yml", tmp_path, raw=text)
        if trigger == "SIGHUP":
            os.kill(daemon.process.pid, signal.SIGHUP)
        else:
            status, _, body = post(daemon.url + "/-/reload")
            assert status == 500 and message in json.loads(body)["error"], body
        failed = wait_for(daemon, lambda s: reloads(s, "failure") == 1)
        assert failed.value("trainmon_config_last_reload_successful") == 0
        assert reloads(failed, "success") == 0
        assert failed.value("trainmon_collector_success", collector="disk") is not None
        assert failed.value("trainmon_config_last_reload_success_timestamp_seconds") == \
            before.value("trainmon_config_last_reload_success_timestamp_seconds")
        errors = [line for line in daemon.log().splitlines() if " trainmon.reload: " in line]
        assert len(errors) == 1 and "ERROR" in errors[0] and message in errors[0], errors
        wait_for(daemon, lambda s: steps(s) > steps(failed))  # the job goes on

        write_config(tmp_path / "trainmon.yml", tmp_path)  # a valid file again
        os.kill(daemon.process.pid, signal.SIGHUP)
        fixed = wait_for(daemon, lambda s: reloads(s, "success") == 1)
        assert fixed.value("trainmon_config_last_reload_successful") == 1
    finally:
        job.stop()


def test_a_peer_with_the_web_configs_credentials_may_reload(tmp_path: Path) -> None:
    address = own_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    (tmp_path / "web.yml").write_text(f"basic_auth_users: {{admin: '{hashed}'}}\n")
    write_config(tmp_path / "trainmon.yml", tmp_path, web_config_file=str(tmp_path / "web.yml"),
                 reload={"min_interval_seconds": 60})
    good = {"Authorization": "Basic " + base64.b64encode(b"admin:pw").decode()}
    daemon = serve(tmp_path / "trainmon.yml", tmp_path / "trainmon.log",
                   state_directory=tmp_path, host="0.0.0.0", headers=good)
    try:
        remote = f"http://{address}:{daemon.port}/-/reload"
        wrong = {"Authorization": "Basic " + base64.b64encode(b"admin:nope").decode()}
        assert post(remote)[0] == 403
        assert post(remote, wrong)[0] == 403
        status, _, body = post(remote, good)
        assert status == 200, body
        # within reload.min_interval_seconds: refused, with when to come back
        status, headers, _ = post(daemon.url + "/-/reload")
        assert status == 429 and 1 <= int(headers["Retry-After"]) <= 60
        scrape = metrics(daemon, good)
        assert reloads(scrape, "success") == 1
        assert scrape.value("trainmon_config_reload_requests_refused_total",
                            reason="forbidden") == 2
        assert scrape.value("trainmon_config_reload_requests_refused_total",
                            reason="too_soon") == 1
    finally:
        daemon.stop()


def test_the_watcher_reloads_when_a_configmap_swaps_its_files(tmp_path: Path) -> None:
    """A ConfigMap volume: ``trainmon.yml`` → ``..data/trainmon.yml``, and ``..data`` a
    symlink the kubelet swaps atomically to a new folder: the inode of the file read
    changes with every update, its content only when the map did."""
    folder = tmp_path / "etc"
    folder.mkdir()

    def publish(version: str, **changes: object) -> None:
        data = folder / f"..{version}"
        data.mkdir()
        write_config(data / "trainmon.yml", tmp_path, **changes,
                     reload={"watch_interval_seconds": 1, "min_interval_seconds": 0.1})
        (folder / "..data_tmp").symlink_to(data.name)
        os.replace(folder / "..data_tmp", folder / "..data")

    publish("v1")
    (folder / "trainmon.yml").symlink_to("..data/trainmon.yml")
    daemon = serve(folder / "trainmon.yml", tmp_path / "trainmon.log", state_directory=tmp_path)
    try:
        assert metrics(daemon).value("trainmon_collector_success", collector="disk") is not None
        publish("v2", disk={"enabled": False})
        changed = wait_for(daemon, lambda s: reloads(s, "success") == 1)
        assert changed.value("trainmon_collector_success", collector="disk") is None
        assert "reload (file): configuration applied" in daemon.log()
    finally:
        daemon.stop()


def test_a_rebuilt_gpu_collector_keeps_the_ledger_that_books_with_it(tmp_path: Path) -> None:
    """The demo's simulated GPUs: a GPU setting is live, the ledger (which books GPU time
    with the GPU collector's process lists) is kept and follows the new collector; the
    GPU collector coming or going is for a restart."""
    config = tmp_path / "trainmon.yml"
    write_config(config, tmp_path, gpu={"enabled": "auto"})
    daemon = serve(config, tmp_path / "trainmon.log", state_directory=tmp_path, args=["--demo"])
    try:
        def productive(scrape: Scrape) -> float:
            return scrape.value("trainmon_job_gpu_seconds_total", job="demo-healthy",
                                bucket="productive") or 0.0

        before = wait_for(daemon, lambda s: productive(s) > 0)
        assert before.value("trainmon_collector_success", collector="gpu") == 1
        write_config(config, tmp_path, gpu={"enabled": "auto", "idle_threshold": 0.2})
        os.kill(daemon.process.pid, signal.SIGHUP)
        after = wait_for(daemon, lambda s: reloads(s, "success") == 1)
        assert after.value("trainmon_config_keys_awaiting_restart") == 0
        wait_for(daemon, lambda s: productive(s) > productive(after)
                 and s.value("trainmon_collector_success", collector="gpu") == 1
                 and s.value("trainmon_collector_success", collector="ledger") == 1)
        log = daemon.log()
        assert "rebuilt: gpu, attribution, numa; stopped: none" in log
        assert log.count("run ledger at") == 1 and "Traceback" not in log

        # the GPU collector gone would leave the ledger without its process lists
        write_config(config, tmp_path, gpu={"enabled": False})
        wait_for(daemon, lambda s: time.time() > MIN_INTERVAL_SECONDS + (s.value(
            "trainmon_config_last_reload_success_timestamp_seconds") or 0.0))
        status, _, body = post(daemon.url + "/-/reload")
        assert status == 200, body
        assert json.loads(body)["restart_required"] == ["collectors.gpu.enabled",
                                                        "collectors.gpu.idle_threshold"]
        assert metrics(daemon).value("trainmon_collector_success", collector="gpu") == 1
    finally:
        daemon.stop()


def test_a_reload_reads_the_token_file_again(tmp_path: Path) -> None:
    """Tokens rotated in place: the file is read again at the reload, the store and the
    jobs reporting on the socket carry on."""
    tokens = tmp_path / "tokens"
    tokens.write_text("first first-token-0123456789\n")
    write_config(tmp_path / "trainmon.yml", tmp_path, training={"token_file": str(tokens)})
    daemon = serve(tmp_path / "trainmon.yml", tmp_path / "trainmon.log",
                   state_directory=tmp_path)
    jobs = [Job(f"unix://{tmp_path / 'steps.sock'}"),
            Job(daemon.url, "http-first", token="first-token-0123456789")]
    try:
        before = wait_for(daemon, lambda s: steps(s) > 0 and steps(s, "http-first") > 0)
        tokens.write_text("second second-token-0123456789\n")
        os.kill(daemon.process.pid, signal.SIGHUP)
        after = wait_for(daemon, lambda s: reloads(s, "success") == 1)
        assert after.value("trainmon_config_keys_awaiting_restart") == 0
        jobs.append(Job(daemon.url, "http-second", token="second-token-0123456789"))
        wait_for(daemon, lambda s: steps(s, "http-second") > 0 and (s.value(
            "trainmon_training_rejected_reports_total", reason="unauthorized") or 0) > 0
            and steps(s) > steps(after))
        assert steps(after) >= steps(before)

        # a token file that cannot be read: the tokens read before stay in use
        tokens.write_text("short\n")
        os.kill(daemon.process.pid, signal.SIGHUP)
        broken = wait_for(daemon, lambda s: reloads(s, "success") == 2)
        wait_for(daemon, lambda s: steps(s, "http-second") > steps(broken, "http-second"))
        log = daemon.log()
        assert "the tokens read before stay in use" in log and "Traceback" not in log
    finally:
        for job in jobs:
            job.stop()
        daemon.stop()


def test_a_reload_lowers_the_training_stores_caps_in_place(daemon: Daemon,
                                                          tmp_path: Path) -> None:
    """The store's caps are live keys: lowered by a reload, they hold at once for new
    jobs, with nothing awaiting a restart and the store's counters kept."""
    socket_endpoint = f"unix://{tmp_path / 'steps.sock'}"
    jobs = [Job(socket_endpoint, name) for name in ("cap-a", "cap-b")]
    try:
        before = wait_for(daemon, lambda s: steps(s, "cap-a") > 0 and steps(s, "cap-b") > 0)
        write_config(tmp_path / "trainmon.yml", tmp_path, training={"max_jobs": 2})
        os.kill(daemon.process.pid, signal.SIGHUP)
        after = wait_for(daemon, lambda s: reloads(s, "success") == 1)
        assert after.value("trainmon_config_keys_awaiting_restart") == 0
        assert steps(after, "cap-a") >= steps(before, "cap-a")  # the store stayed
        # a third job of the same writer makes room at max_jobs 2: its least recently
        # updated job is evicted (with the old cap of 64 nothing would be)
        jobs.append(Job(socket_endpoint, "cap-c"))
        wait_for(daemon, lambda s: steps(s, "cap-c") > 0 and (s.value(
            "trainmon_training_evicted_ranks_total", reason="max_jobs") or 0) > 0)
        status, body = daemon.get("/healthz")
        assert status == 200
        assert json.loads(body)["collectors"]["training"]["jobs"] <= 2
        assert "collectors.training.max_jobs changed" not in daemon.log()
    finally:
        for job in jobs:
            job.stop()


def test_the_web_configs_users_change_with_a_reload(tmp_path: Path) -> None:
    def users(password: bytes) -> None:
        hashed = bcrypt.hashpw(password, bcrypt.gensalt(rounds=4)).decode()
        (tmp_path / "web.yml").write_text(f"basic_auth_users: {{admin: '{hashed}'}}\n")

    def credentials(password: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(
            f"admin:{password}".encode()).decode()}

    users(b"old")
    write_config(tmp_path / "trainmon.yml", tmp_path, web_config_file=str(tmp_path / "web.yml"))
    daemon = serve(tmp_path / "trainmon.yml", tmp_path / "trainmon.log",
                   state_directory=tmp_path, headers=credentials("old"))
    try:
        users(b"new")
        status, _, body = post(daemon.url + "/-/reload")  # loopback: no credentials needed
        assert status == 200 and json.loads(body)["restart_required"] == [], body
        assert daemon.get("/metrics", credentials("old"))[0] == 401
        assert daemon.get("/metrics", credentials("new"))[0] == 200
    finally:
        daemon.stop()
