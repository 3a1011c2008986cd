"""Configured paths checked all the way up (``trainmon.paths.check_folder``,
``trainmon.ledger.files``), against a real second local user.

A root daemon whose configured socket or ledger sits below a folder that user
owns refuses it, says so in ``/healthz`` (state ``degraded``, the folder, its
owner and mode) and in ``trainmon_training_socket_up`` / ``trainmon_ledger_up``,
and goes on with the rest: the user can neither capture the reports (``mv run
run.root; mkdir run``) nor have root write through a symlink nor have
``/api/v1/runs`` serve a ledger they swapped in. A ledger file the user
pre-created in a safe folder is refused, not adopted. A user who pre-creates
``/tmp/trainmon-<uid>`` denies another user's daemon its socket, and that
daemon's ``/healthz`` says so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest
import yaml

import trainmon
from testkit.daemon import Daemon, free_port, ready
from testkit.exposition import parse
from tests.ledger.ledger_support import description, step
from tests.security.security_support import AsUser, LocalUser
from trainmon.ledger import Ledger, LedgerError, RecordUpdate, RunRecord
from trainmon.ledger.files import held_descriptors
from trainmon.paths import socket_listening

pytestmark = pytest.mark.integration

SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])
EXPORTER = Path(trainmon.__file__).resolve().parents[1]
#: ``python -c BOOT SITE EXPORTER ARGS...``: ``trainmon ARGS`` from those folders.
BOOT = ("import sys; sys.path[:0] = sys.argv[1:3]; del sys.argv[1:3]; "
        "from trainmon.cli import main; sys.exit(main())")
#: Longest wait for the daemon to show what a test waits for.
WAIT_SECONDS = 30.0


def as_shell(user: LocalUser, command: str) -> None:
    """``sh -c command`` as ``user`` (in /, no extra groups)."""
    done = subprocess.run(["sh", "-c", command], user=user.uid, group=user.gid,
                          extra_groups=[], cwd="/", capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def folder_of(user: LocalUser, path: Path, mode: int = 0o755) -> Path:
    path.mkdir(mode=mode)
    path.chmod(mode)
    os.chown(path, user.uid, user.gid)
    return path


def health_of(daemon: Daemon, collector: str) -> dict[str, object]:
    status, body = daemon.get("/healthz")
    assert status == 200, body
    entry: dict[str, object] = json.loads(body)["collectors"][collector]
    return entry


def gauge(daemon: Daemon, name: str) -> float | None:
    return parse(daemon.metrics()).value(name)


def wait_until(check: Callable[[], bool], what: str, daemon: Daemon) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen:\n{daemon.log()}")
        time.sleep(0.05)


def report(as_user: AsUser, socket: Path, job: str) -> None:
    """One run of ``job`` (a description and a step report) sent as root."""
    lines = [json.dumps(description(job=job)), json.dumps(step(10, job=job))]
    as_user(None, f"unix://{socket}", ["\n".join(lines).encode()])


def forged_ledger(workshop: Path, into: Path, owner: LocalUser) -> Path:
    """A real trainmon ledger holding one forged run "forged-job", made in ``workshop``
    (root's) and handed to ``owner`` in ``into``."""
    made = workshop / "forged.sqlite3"
    record = RunRecord(job="forged-job", run="forged", node="n", config_hash="",
                       started=1.0, ended=2.0, end_reason="finished", updated=2.0,
                       world_size=1, ranks=1, owner="uid:0")
    with Ledger.open(made, readonly=False) as ledger:
        ledger.write([RecordUpdate(record, {})])
    assert not made.with_name("forged.sqlite3-wal").exists()  # checkpointed at close
    forged = Path(shutil.move(made, into / made.name))
    os.chown(forged, owner.uid, owner.gid)
    return forged


@pytest.fixture
def root_daemon(shared_dir: Path) -> Iterator[Callable[..., Daemon]]:
    """``root_daemon(socket=..., ledger=...)``: ``trainmon serve`` as root with those
    paths (defaults in a root-only folder), flushing the ledger every 0.2 s."""
    private = shared_dir / "root-only"
    private.mkdir(mode=0o700)
    started: list[Daemon] = []

    def start(socket: Path | None = None, ledger: Path | None = None) -> Daemon:
        index = len(started)
        config = private / f"trainmon-{index}.yml"
        config.write_text(yaml.safe_dump({"collectors": {
            "training": {"socket": str(socket or private / f"steps-{index}.sock")},
            "ledger": {"path": str(ledger or private / f"ledger-{index}.sqlite3"),
                       "flush_seconds": 0.2},
            "gpu": {"enabled": False}}}))
        port = free_port()
        log_path = private / f"serve-{index}.log"
        process = subprocess.Popen(
            [sys.executable, "-m", "trainmon", "serve", "--config", str(config),
             "--listen", f"127.0.0.1:{port}"],
            stdout=log_path.open("w"), stderr=subprocess.STDOUT, text=True)
        started.append(ready(Daemon(process, port, log_path, config)))
        return started[-1]

    yield start
    for daemon in started:
        daemon.stop(signal.SIGTERM)


def test_a_socket_below_a_users_folder_is_refused_so_the_user_captures_nothing(
        local_users: tuple[LocalUser, LocalUser], shared_dir: Path,
        root_daemon: Callable[..., Daemon]) -> None:
    _, mallory = local_users
    theirs = folder_of(mallory, shared_dir / "mallory")
    run = theirs / "run"
    run.mkdir(mode=0o755)  # root's folder, in mallory's
    daemon = root_daemon(socket=run / "steps.sock")

    training = health_of(daemon, "training")
    assert training["state"] == "degraded", training
    error = str(training["error"])
    assert f"{theirs} belongs to uid {mallory.uid} (owner {mallory.name}, mode 0755)" in error
    assert str(run / "steps.sock") in error
    assert gauge(daemon, "trainmon_training_socket_up") == 0.0
    assert "cannot receive training steps" in daemon.log()
    assert not os.path.lexists(run / "steps.sock")

    # the capture: mallory moves root's folder aside and puts her own listener there;
    # there is no daemon socket to take over, and no report of root's reaches her
    # through a socket the daemon bound
    as_shell(mallory, f"mv {run} {theirs}/run.root && mkdir {run}")
    assert not os.path.lexists(theirs / "run.root" / "steps.sock")
    # the daemon itself goes on: HTTP intake, the ledger, /metrics
    assert health_of(daemon, "ledger")["state"] == "ok"


def test_a_ledger_below_a_users_folder_is_refused_and_root_never_writes_through_a_symlink(
        local_users: tuple[LocalUser, LocalUser], shared_dir: Path,
        root_daemon: Callable[..., Daemon], as_user: AsUser) -> None:
    _, mallory = local_users
    theirs = folder_of(mallory, shared_dir / "mallory")
    target = shared_dir / "root-only-target"
    target.mkdir(mode=0o700)
    victim = target / "victim.db"  # a file mallory may not write: root would make it
    as_shell(mallory, f"ln -s {victim} {theirs}/ledger.sqlite3")
    socket = shared_dir / "root-only" / "steps.sock"
    daemon = root_daemon(socket=socket, ledger=theirs / "ledger.sqlite3")

    ledger = health_of(daemon, "ledger")
    assert ledger["state"] == "degraded" and ledger["open"] is False, ledger
    error = str(ledger["ledger_error"])
    assert f"{theirs} belongs to uid {mallory.uid}" in error, error
    assert "mode 0755" in error
    assert gauge(daemon, "trainmon_ledger_up") == 0.0

    report(as_user, socket, "root-job")
    wait_until(lambda: health_of(daemon, "ledger")["recording_runs"] == 1,
               "the run recorded in memory", daemon)
    assert not victim.exists() and not victim.with_name("victim.db-wal").exists()
    status, body = daemon.get("/api/v1/runs")
    assert status == 503 and "root-job" not in body, body


def test_a_ledger_the_user_precreated_in_a_safe_folder_is_refused_not_adopted(
        local_users: tuple[LocalUser, LocalUser], shared_dir: Path,
        root_daemon: Callable[..., Daemon], as_user: AsUser) -> None:
    _, mallory = local_users
    folder = shared_dir / "state"
    folder.mkdir(mode=0o755)
    planted = folder / "ledger.sqlite3"
    planted.touch(mode=0o666)
    os.chown(planted, mallory.uid, mallory.gid)  # hers: she may chmod it and read it
    socket = shared_dir / "root-only" / "steps.sock"
    daemon = root_daemon(socket=socket, ledger=planted)

    ledger = health_of(daemon, "ledger")
    assert ledger["state"] == "degraded", ledger
    error = str(ledger["ledger_error"])
    assert f"{planted}: it belongs to uid {mallory.uid}" in error, error
    assert gauge(daemon, "trainmon_ledger_up") == 0.0

    report(as_user, socket, "root-job")
    wait_until(lambda: health_of(daemon, "ledger")["recording_runs"] == 1,
               "the run recorded in memory", daemon)
    daemon.stop()  # the last flush: nothing of root's reaches mallory's file
    found = os.stat(planted)
    assert (found.st_uid, found.st_size) == (mallory.uid, 0)
    assert not planted.with_name("ledger.sqlite3-wal").exists()


def test_a_ledger_the_user_swapped_is_not_served_through_the_api(
        local_users: tuple[LocalUser, LocalUser], shared_dir: Path,
        root_daemon: Callable[..., Daemon], as_user: AsUser) -> None:
    _, mallory = local_users
    theirs = folder_of(mallory, shared_dir / "mallory")
    forged = forged_ledger(shared_dir / "root-only", theirs, mallory)
    socket = shared_dir / "root-only" / "steps.sock"
    path = theirs / "ledger.sqlite3"
    daemon = root_daemon(socket=socket, ledger=path)
    report(as_user, socket, "root-job")
    wait_until(lambda: health_of(daemon, "ledger")["recording_runs"] == 1,
               "the run recorded", daemon)

    # mallory replaces whatever is there with her forged ledger (and drops the -wal and
    # -shm that would lay root's pages over it)
    as_shell(mallory, f"mv -f {forged} {path} && rm -f {path}-wal {path}-shm")
    status, body = daemon.get("/api/v1/runs")
    assert status == 503, body
    assert "forged-job" not in body
    assert f"{theirs} belongs to uid {mallory.uid}" in json.loads(body)["detail"]


@pytest.fixture(scope="module")
def python() -> str:
    """An interpreter of this suite's Python that other users may run, with the
    packages readable to them."""

    def reachable(path: Path) -> bool:
        return all(os.stat(folder).st_mode & stat.S_IXOTH for folder in path.resolve().parents)

    if not (reachable(SITE_PACKAGES / "yaml") and reachable(EXPORTER / "trainmon")):
        pytest.skip("the packages are not readable by other local users")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/python{version}",
                      f"/usr/local/bin/python{version}"):
        if Path(candidate).exists() and reachable(Path(candidate)):
            return candidate
    pytest.skip(f"no Python {version} that other local users can run")


def test_a_tmp_folder_another_user_precreated_makes_healthz_unhealthy(
        python: str, local_users: tuple[LocalUser, LocalUser], shared_dir: Path) -> None:
    alice, mallory = local_users
    folder = Path(f"/tmp/trainmon-{alice.uid}")
    if os.path.lexists(folder):
        pytest.skip(f"{folder} exists already")
    home = folder_of(alice, shared_dir / "home", 0o700)
    config = shared_dir / "alice.yml"
    config.write_text(yaml.safe_dump({"collectors": {"gpu": {"enabled": False}}}))
    config.chmod(0o644)
    port = free_port()
    log_path = shared_dir / "alice.log"
    try:
        folder_of(mallory, folder)  # first there: alice's socket folder is mallory's
        with log_path.open("w") as log_file:
            process = subprocess.Popen(
                [python, "-I", "-c", BOOT, str(SITE_PACKAGES), str(EXPORTER), "serve",
                 "--config", str(config), "--listen", f"127.0.0.1:{port}"],
                stdout=log_file, stderr=subprocess.STDOUT, cwd="/",
                env={"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                user=alice.uid, group=alice.gid, extra_groups=[])
        daemon = ready(Daemon(process, port, log_path, config))
        try:
            training = health_of(daemon, "training")
            assert training["state"] == "degraded", training
            assert f"{folder} belongs to uid {mallory.uid}" in str(training["error"])
            assert gauge(daemon, "trainmon_training_socket_up") == 0.0
            assert not socket_listening(folder / "steps.sock")
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_an_outside_reader_of_the_held_file_sees_every_commit(tmp_path: Path) -> None:
    """The descriptors the daemon keeps of its ledger never drop SQLite's locks: after
    readers in the same process came and went, an outside reader closing its
    connection does not delete the writer's -wal."""
    path = tmp_path / "ledger.sqlite3"
    record = RunRecord(job="j", run="r", node="n", config_hash="", started=1.0,
                       ended=None, end_reason=None, updated=1.0, world_size=1, ranks=1)
    with Ledger.open(path, readonly=False) as writer:
        writer.write([RecordUpdate(record, {})])
        for _ in range(20):  # GET /api/v1/runs beside the recorder
            with Ledger.open(path) as reader:
                assert reader.count() == 1
        outside = subprocess.run(
            [sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
             "print(c.execute('SELECT count(*) FROM runs').fetchone()[0]); c.close()",
             str(path)], capture_output=True, text=True, timeout=60, check=True)
        assert outside.stdout.strip() == "1"
        assert path.with_name("ledger.sqlite3-wal").exists()  # still the writer's
        writer.write([RecordUpdate(record, {"n": 2})])
        with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as check:
            assert check.execute("SELECT state FROM runs").fetchone()[0] == '{"n":2}'


# -- the file itself, in a folder that passes ------------------------------------------


def ledger_with_a_run(path: Path) -> Path:
    record = RunRecord(job="j", run="r", node="n", config_hash="", started=1.0,
                       ended=None, end_reason=None, updated=1.0, world_size=1, ranks=1)
    with Ledger.open(path, readonly=False) as ledger:
        ledger.write([RecordUpdate(record, {})])
    return path


def test_a_symlinked_ledger_is_neither_written_through_nor_read(tmp_path: Path) -> None:
    target = ledger_with_a_run(tmp_path / "elsewhere.sqlite3")
    before = target.read_bytes()
    link = tmp_path / "ledger.sqlite3"
    link.symlink_to(target)
    for readonly in (False, True):
        with pytest.raises(LedgerError, match=f"refusing the ledger {link}: it is a symlink"):
            Ledger.open(link, readonly=readonly)
    dangling = tmp_path / "dangling.sqlite3"
    dangling.symlink_to(tmp_path / "made-through-the-link")
    with pytest.raises(LedgerError, match="it is a symlink"):
        Ledger.open(dangling, readonly=False)
    assert not (tmp_path / "made-through-the-link").exists()
    assert target.read_bytes() == before
    assert held_descriptors() == 0


def test_a_symlinked_wal_or_a_hard_link_is_refused(tmp_path: Path) -> None:
    path = ledger_with_a_run(tmp_path / "ledger.sqlite3")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"")
    wal = tmp_path / "ledger.sqlite3-wal"
    wal.symlink_to(elsewhere)
    for readonly in (False, True):
        with pytest.raises(LedgerError, match=f"refusing the ledger {wal}: it is a symlink"):
            Ledger.open(path, readonly=readonly)
    wal.unlink()
    os.link(path, tmp_path / "second-name")
    with pytest.raises(LedgerError, match="it has 2 hard links"):
        Ledger.open(path, readonly=False)
    assert elsewhere.read_bytes() == b"" and held_descriptors() == 0


def test_a_fifo_in_place_of_the_ledger_is_refused_without_waiting(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    os.mkfifo(path)
    with pytest.raises(LedgerError, match="is not a regular file"):
        Ledger.open(path, readonly=False)


def test_a_ledger_or_shm_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another uid")
    other = 12345
    path = ledger_with_a_run(tmp_path / "ledger.sqlite3")
    shm = tmp_path / "ledger.sqlite3-shm"
    shm.write_bytes(b"")
    os.chown(shm, other, other)
    for readonly in (False, True):
        with pytest.raises(LedgerError, match=f"{shm}: it belongs to uid {other}"):
            Ledger.open(path, readonly=readonly)
    shm.unlink()
    os.chown(path, other, other)
    with pytest.raises(LedgerError, match=f"{path}: it belongs to uid {other}"):
        Ledger.open(path, readonly=False)
    # whom a caller trusts is its choice (a reader of the service user's ledger)
    with Ledger.open(path, owners={0, other}) as reader:
        assert reader.count() == 1
    assert (os.stat(path).st_uid, held_descriptors()) == (other, 0)


def test_readers_beside_the_writer_hold_no_descriptor_of_their_own(tmp_path: Path) -> None:
    path = ledger_with_a_run(tmp_path / "ledger.sqlite3")
    with Ledger.open(path, readonly=False):
        held = held_descriptors()
        assert held == 1  # the database (its -wal/-shm went with the last connection)
        for _ in range(50):
            with Ledger.open(path) as reader:
                assert reader.count() == 1
        assert held_descriptors() == held
    assert held_descriptors() == 0
