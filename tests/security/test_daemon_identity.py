"""``doctor``, ``runs`` and ``compare`` know whom they read (``trainmon.local_daemon``).

While no daemon runs, any user may listen on its port. Here a real second local
user listens on a free loopback port and answers ``/metrics`` with a forged spot
reclaim and ``/api/v1/runs`` with forged runs "owned" by ``uid:0``, every name
laced with terminal escape sequences. Root's commands, pointed at that port by
``--url`` or by the configuration, refuse with exit code 2 and name the
process and the uid; trusting that user explicitly reads it, and still nothing
that acts on a terminal is printed. A real root daemon is trusted and named.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import yaml

from testkit.daemon import Daemon, free_port, trainmon_command
from tests.security.security_support import LocalUser, python_for_everyone
from trainmon.ledger.records import RunRecord
from trainmon.local_daemon import DaemonTrust, TrustedDaemon, UntrustedDaemon

#: Escape sequences a hostile answer carries: retitle the window, clear the screen,
#: ask the terminal to answer back (DSR), an 8-bit CSI, a bidirectional override.
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[6n\x9b31m\u202e"
#: What may never reach the terminal: C0 but newline and tab, DEL, C1, bidi controls.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

#: A stand-in daemon any user can run (standard library only): answers GET with the
#: bodies of a JSON mapping read from stdin (path → body; ``/api/v1/runs/<run>`` as
#: ``/api/v1/runs``), prints "ready" once it listens on 127.0.0.1:PORT.
FORGED_DAEMON = r"""
import http.server, json, sys
bodies = json.load(sys.stdin)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path.startswith("/api/v1/runs/"):
            path = "/api/v1/runs"
        body = bodies.get(path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write((body or "").encode())
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print("ready", flush=True)
server.serve_forever()
"""


def forged_bodies(now: float) -> dict[str, str]:
    """A spot reclaim in 85 s, and a run of ``uid:0``, both with escape sequences."""
    metrics = (
        "# TYPE trainmon_node_info gauge\n"
        f'trainmon_node_info{{provider="tencent",instance_id="ins-{ESCAPES}",'
        f'instance_type="GN10X{ESCAPES}",region="ap-shanghai",zone="ap-shanghai-2"}} 1\n'
        "# TYPE trainmon_node_spot_instance gauge\ntrainmon_node_spot_instance 1\n"
        "# TYPE trainmon_node_spot_termination_timestamp_seconds gauge\n"
        f"trainmon_node_spot_termination_timestamp_seconds {now + 85:.0f}\n"
        "# TYPE trainmon_platform_metadata_up gauge\ntrainmon_platform_metadata_up 1\n"
    )
    record = RunRecord(
        job=f"train{ESCAPES}", run=f"forged{ESCAPES}-1", node="node-a", config_hash="c0ffee",
        started=now - 600, ended=now - 60, end_reason="finished", updated=now - 60,
        world_size=8, ranks=8, description={"config": {"lr": f"0.1{ESCAPES}"}},
        summary={"final_verdict": f"compute{ESCAPES}"}, owner="uid:0")
    return {"/metrics": metrics, "/healthz": "{}",
            "/api/v1/runs": json.dumps([record.to_json()], ensure_ascii=False)}


def listen_as(user: LocalUser, port: int, bodies: Mapping[str, str]) -> subprocess.Popen[str]:
    """The forged daemon, run as ``user`` on 127.0.0.1:``port``, once it listens."""
    process = subprocess.Popen(
        [python_for_everyone(), "-I", "-c", FORGED_DAEMON, str(port)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/",
        user=user.uid, group=user.gid, extra_groups=[])
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(json.dumps(bodies))
    process.stdin.close()
    if process.stdout.readline().strip() != "ready":
        process.kill()
        pytest.fail(f"the forged daemon of {user.name} did not start")
    return process


@pytest.fixture
def forged(local_users: tuple[LocalUser, LocalUser]
           ) -> Iterator[tuple[LocalUser, subprocess.Popen[str], int]]:
    """The attacker's forged daemon on a free port: (attacker, its process, the port)."""
    _, attacker = local_users
    port = free_port()
    process = listen_as(attacker, port, forged_bodies(time.time()))
    try:
        yield attacker, process, port
    finally:
        process.kill()
        process.wait()


def command(args: list[str], env: Mapping[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """``trainmon ARGS`` as root, with only ``env`` of the TRAINMON_* variables."""
    kept = {key: value for key, value in os.environ.items() if not key.startswith("TRAINMON_")}
    return subprocess.run([*trainmon_command(), *args], env={**kept, **(env or {})},
                          capture_output=True, text=True, timeout=120, check=False)


def assert_nothing_acts_on_the_terminal(done: subprocess.CompletedProcess[str]) -> None:
    for name, text in (("stdout", done.stdout), ("stderr", done.stderr)):
        found = UNSAFE.search(text)
        assert found is None, f"{name} carries {found.group()!r}: {text!r}"


def reader_config(tmp_path: Path, port: int) -> Path:
    """A configuration naming the port as the daemon's, with no ledger file to read."""
    path = tmp_path / "reader.yml"
    path.write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{port}",
        "collectors": {"ledger": {"path": str(tmp_path / "absent" / "ledger.sqlite3")},
                       "training": {"socket": str(tmp_path / "steps.sock")},
                       "gpu": {"enabled": False}}}))
    return path


def assert_refused(done: subprocess.CompletedProcess[str], attacker: LocalUser,
                   process: subprocess.Popen[str], url: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"refusing to read {url}" in done.stderr
    assert f"pid {process.pid} python3, uid {attacker.uid} {attacker.name}" in done.stderr
    assert f"--trust-daemon-owner {attacker.uid}" in done.stderr
    assert_nothing_acts_on_the_terminal(done)


@pytest.mark.parametrize("how", ["--url", "config"])
def test_root_doctor_refuses_a_port_another_user_listens_on(
        forged: tuple[LocalUser, subprocess.Popen[str], int], tmp_path: Path, how: str) -> None:
    attacker, process, port = forged
    url = f"http://127.0.0.1:{port}"
    args = ["--url", url] if how == "--url" else ["--config", str(reader_config(tmp_path, port))]
    done = command(["doctor", "--seconds", "1", *args])
    assert_refused(done, attacker, process, url)
    assert "reclaim" not in done.stdout.lower()  # nothing of the forged answer was read


@pytest.mark.parametrize("how", ["--url", "config"])
def test_root_runs_refuses_a_port_another_user_listens_on(
        forged: tuple[LocalUser, subprocess.Popen[str], int], tmp_path: Path, how: str) -> None:
    attacker, process, port = forged
    url = f"http://127.0.0.1:{port}"
    args = ["--url", url] if how == "--url" else ["--config", str(reader_config(tmp_path, port))]
    for listing in (["runs", *args], ["runs", "--json", *args],
                    ["compare", "forged-1", "forged-2", *args]):
        done = command(listing)
        assert_refused(done, attacker, process, url)
        assert "forged" not in done.stdout and "uid:0" not in done.stdout


def test_trusting_the_owner_reads_it_and_prints_nothing_that_acts_on_the_terminal(
        forged: tuple[LocalUser, subprocess.Popen[str], int]) -> None:
    attacker, process, port = forged
    url = f"http://127.0.0.1:{port}"
    named = f"(pid {process.pid} python3, uid {attacker.uid} {attacker.name})"
    doctor = command(["doctor", "--seconds", "1", "--url", url,
                      "--trust-daemon-owner", attacker.name])
    assert doctor.returncode == 1, doctor.stderr  # the (forged) reclaim, as asked
    assert f"trainmon: reading the daemon at {url} {named}" in doctor.stderr
    assert "reclaim" in doctor.stdout.lower()
    assert_nothing_acts_on_the_terminal(doctor)
    for listing in (["runs"], ["runs", "--json"]):
        done = command([*listing, "--url", url],
                       {"TRAINMON_TRUST_DAEMON_OWNER": str(attacker.uid)})
        assert done.returncode == 0, done.stderr
        assert f"trainmon: reading the daemon at {url} {named}" in done.stderr
        assert "forged" in done.stdout
        assert_nothing_acts_on_the_terminal(done)
    as_json = command(["runs", "--json", "--url", url, "--trust-daemon-owner", "any"])
    [run] = json.loads(as_json.stdout)["runs"]
    assert run["job"] == f"train{ESCAPES}"  # the data kept whole, only escaped


def test_a_user_is_refused_another_users_daemon_and_reads_their_own(
        local_users: tuple[LocalUser, LocalUser],
        forged: tuple[LocalUser, subprocess.Popen[str], int]) -> None:
    victim, _ = local_users
    attacker, process, port = forged
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(UntrustedDaemon, match=f"uid {attacker.uid} {attacker.name}"):
        TrustedDaemon.check(url, DaemonTrust.default(euid=victim.uid))
    own = TrustedDaemon.check(url, DaemonTrust.default(euid=attacker.uid))
    assert [(owner.uid, owner.pid) for owner in own.listeners] == [(attacker.uid, process.pid)]


def test_the_port_taken_over_between_the_check_and_the_last_read_is_refused(
        local_users: tuple[LocalUser, LocalUser]) -> None:
    _, attacker = local_users
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", port))
        listening.listen()
        checked = TrustedDaemon.check(url, DaemonTrust.default())
        assert [owner.uid for owner in checked.listeners] == [0]
        checked.confirm()  # the same socket: fine
    process = listen_as(attacker, port, {"/healthz": "{}"})
    try:
        with pytest.raises(UntrustedDaemon, match=f"uid {attacker.uid}"):
            checked.confirm()
    finally:
        process.kill()
        process.wait()


def test_a_root_daemon_is_trusted_and_named(start_daemon: Callable[..., Daemon]) -> None:
    daemon = start_daemon({"collectors": {"gpu": {"enabled": False}}})
    named = f"(pid {daemon.process.pid} python3, uid 0 root)"
    doctor = command(["doctor", "--seconds", "1", "--json", "--url", daemon.url])
    assert f"trainmon: reading the daemon at {daemon.url} {named}" in doctor.stderr
    assert json.loads(doctor.stdout)["source"]["snapshots"] >= 2, doctor.stderr
    runs = command(["runs", "--url", daemon.url])
    assert runs.returncode == 0, runs.stderr
    assert f"trainmon: reading the daemon at {daemon.url} {named}" in runs.stderr
