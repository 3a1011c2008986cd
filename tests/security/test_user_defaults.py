"""The default paths for real local users (``trainmon.paths``): a user's own daemon,
reporter and ``trainmon runs`` meet under XDG with private folders; a folder another
user planted in /tmp is refused; and on a node where root runs the daemon with the
system defaults, a user's reporter finds ``/run/trainmon/steps.sock`` and the user's
``trainmon runs`` reads the runs from the daemon (the ledger is not theirs to read).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
import yaml

import trainmon
from testkit.daemon import Daemon, free_port, ready, wait_for_run
from tests.security.security_support import LocalUser
from trainmon.paths import SYSTEM_RUNTIME_DIRECTORY, SYSTEM_STATE_DIRECTORY, socket_listening

#: Where this suite's third-party packages and the trainmon package are.
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])
EXPORTER = Path(trainmon.__file__).resolve().parents[1]
#: ``python -c BOOT SITE EXPORTER ARGS...``: ``trainmon ARGS`` from those folders.
BOOT = ("import sys; sys.path[:0] = sys.argv[1:3]; del sys.argv[1:3]; "
        "from trainmon.cli import main; sys.exit(main())")
#: A training script with every default: the endpoint is the client's choice.
TRAINING = ("import sys; sys.path[:0] = [sys.argv[1]]; from trainmon.client import Reporter\n"
            "with Reporter(job=sys.argv[2]) as reporter:\n"
            "    [reporter.step(samples=8) for _ in range(20)]\n"
            "print(reporter.endpoint)\n")


def reachable_by_everyone(path: Path) -> bool:
    return all(os.stat(folder).st_mode & stat.S_IXOTH for folder in path.resolve().parents)


@pytest.fixture(scope="module")
def python() -> str:
    """An interpreter of this suite's Python version that other users may run, with
    this suite's packages and trainmon readable to them."""
    if not (reachable_by_everyone(SITE_PACKAGES / "yaml") and
            reachable_by_everyone(EXPORTER / "trainmon")):
        pytest.skip("the packages are not readable by other local users")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/python{version}",
                      f"/usr/local/bin/python{version}"):
        if Path(candidate).exists() and reachable_by_everyone(Path(candidate)):
            return candidate
    pytest.skip(f"no Python {version} that other local users can run")


def user_env(home: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **extra}


def identity(user: LocalUser | None) -> tuple[int | None, int | None, list[int] | None]:
    """``user=``, ``group=`` and ``extra_groups=`` of ``subprocess`` (None: root, as is)."""
    return (None, None, None) if user is None else (user.uid, user.gid, [])


def run_as(python: str, user: LocalUser | None, args: Sequence[str],
           env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """``trainmon ARGS`` as ``user`` (None: root)."""
    uid, gid, groups = identity(user)
    return subprocess.run(
        [python, "-I", "-c", BOOT, str(SITE_PACKAGES), str(EXPORTER), *args],
        env=dict(env), capture_output=True, text=True, timeout=120, check=False, cwd="/",
        user=uid, group=gid, extra_groups=groups,
    )


def train_as(python: str, user: LocalUser | None, job: str, env: Mapping[str, str]) -> str:
    """Run the training script as ``user``; the endpoint its reporter chose."""
    uid, gid, groups = identity(user)
    done = subprocess.run(
        [python, "-I", "-c", TRAINING, str(EXPORTER), job], env=dict(env),
        capture_output=True, text=True, timeout=60, check=False, cwd="/",
        user=uid, group=gid, extra_groups=groups,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def serve_as(python: str, user: LocalUser | None, folder: Path,
             env: Mapping[str, str]) -> Daemon:
    """``trainmon serve`` with every default path, flushing the ledger often."""
    config = folder / "flush.yml"
    config.write_text(yaml.safe_dump({"collectors": {"ledger": {"flush_seconds": 0.2},
                                                     "gpu": {"enabled": False}}}))
    config.chmod(0o644)
    port = free_port()
    log_path = folder / f"serve-{port}.log"
    uid, gid, groups = identity(user)
    process = subprocess.Popen(
        [python, "-I", "-c", BOOT, str(SITE_PACKAGES), str(EXPORTER), "serve",
         "--config", str(config), "--listen", f"127.0.0.1:{port}"],
        stdout=log_path.open("w"), stderr=subprocess.STDOUT, text=True, env=dict(env),
        cwd="/", user=uid, group=gid, extra_groups=groups,
    )
    return ready(Daemon(process, port, log_path, config))




def private_folder(path: Path, user: LocalUser) -> Path:
    path.mkdir(mode=0o700)
    os.chown(path, user.uid, user.gid)
    return path


def owner_and_mode(path: Path) -> tuple[int, int]:
    found = os.stat(path)
    return found.st_uid, stat.S_IMODE(found.st_mode)


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.stop(signal.SIGTERM)


def test_a_users_daemon_reporter_and_runs_meet_under_xdg(
        python: str, local_users: tuple[LocalUser, LocalUser], shared_dir: Path,
        daemons: list[Daemon]) -> None:
    alice, _ = local_users
    home = private_folder(shared_dir / "home", alice)
    runtime = private_folder(shared_dir / "runtime", alice)
    env = user_env(home, XDG_RUNTIME_DIR=str(runtime))
    daemon = serve_as(python, alice, shared_dir, env)
    daemons.append(daemon)
    socket, ledger = runtime / "trainmon/steps.sock", home / ".local/state/trainmon/ledger.sqlite3"
    assert socket_listening(socket), daemon.log()
    assert ledger.exists(), daemon.log()
    for folder in (runtime / "trainmon", home / ".local", home / ".local/state", ledger.parent):
        assert owner_and_mode(folder) == (alice.uid, 0o700), folder

    assert train_as(python, alice, "alice-job", env) == f"unix://{socket}"
    wait_for_run(daemon, "alice-job")
    done = run_as(python, alice, ["runs", "--json"], env)
    assert done.returncode == 0, done.stderr
    assert [(run["job"], run["source"]) for run in json.loads(done.stdout)["runs"]] == [
        ("alice-job", "ledger")]
    assert f"trainmon: reading the ledger {ledger}" in done.stderr


def test_without_xdg_runtime_dir_the_socket_is_in_a_private_tmp_folder(
        python: str, local_users: tuple[LocalUser, LocalUser], shared_dir: Path,
        daemons: list[Daemon]) -> None:
    alice, mallory = local_users
    home = private_folder(shared_dir / "home", alice)
    folder = Path(f"/tmp/trainmon-{alice.uid}")
    if os.path.lexists(folder):
        pytest.skip(f"{folder} exists already")
    try:
        # another user got there first: the daemon refuses the folder
        planted = private_folder(folder, mallory)
        planted.chmod(0o755)
        daemon = serve_as(python, alice, shared_dir, user_env(home))
        daemons.append(daemon)
        _, health = daemon.get("/healthz")
        assert f"{folder} belongs to uid {mallory.uid}" in health, health
        assert not (folder / "steps.sock").exists()
        daemon.stop()
        shutil.rmtree(folder)
        # once it is gone, the daemon makes its own, 0700
        daemon = serve_as(python, alice, shared_dir, user_env(home))
        daemons.append(daemon)
        assert owner_and_mode(folder) == (alice.uid, 0o700)
        assert socket_listening(folder / "steps.sock"), daemon.log()
        assert train_as(python, alice, "tmp-job", user_env(home)) == (
            f"unix://{folder}/steps.sock")
        wait_for_run(daemon, "tmp-job")
    finally:
        for daemon in daemons:
            daemon.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def system_folders_free() -> Iterator[None]:
    """The machine's /var/lib/trainmon and /run/trainmon are not there; whatever the
    test makes of them is removed afterwards."""
    if any(os.path.lexists(folder) for folder in (SYSTEM_STATE_DIRECTORY,
                                                  SYSTEM_RUNTIME_DIRECTORY)):
        pytest.skip("a trainmon is installed on this machine: its folders stay untouched")
    try:
        yield
    finally:
        for folder in (SYSTEM_STATE_DIRECTORY, SYSTEM_RUNTIME_DIRECTORY):
            shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.usefixtures("system_folders_free")
def test_users_report_to_and_read_from_a_root_daemon_with_the_system_defaults(
        python: str, local_users: tuple[LocalUser, LocalUser], shared_dir: Path,
        daemons: list[Daemon]) -> None:
    """``make run`` as root, then a README training script and ``trainmon runs``."""
    alice, _ = local_users
    root_env = user_env(Path("/root"))
    daemon = serve_as(python, None, shared_dir, root_env)
    daemons.append(daemon)
    ledger = SYSTEM_STATE_DIRECTORY / "ledger.sqlite3"
    assert owner_and_mode(SYSTEM_STATE_DIRECTORY)[1] == 0o750
    assert owner_and_mode(SYSTEM_RUNTIME_DIRECTORY)[1] == 0o755
    assert owner_and_mode(ledger)[1] == 0o640

    home = private_folder(shared_dir / "home", alice)
    runtime = private_folder(shared_dir / "runtime", alice)  # no daemon of alice's here
    env = user_env(home, XDG_RUNTIME_DIR=str(runtime), TRAINMON_LISTEN=f"127.0.0.1:{daemon.port}")
    assert train_as(python, alice, "shared-job", env) == "unix:///run/trainmon/steps.sock"
    wait_for_run(daemon, "shared-job")

    done = run_as(python, alice, ["runs", "--json"], env)
    assert done.returncode == 0, done.stderr
    [run] = json.loads(done.stdout)["runs"]
    assert (run["job"], run["source"]) == ("shared-job", "daemon")
    assert f"reading the daemon at {daemon.url}" in done.stderr
    mine = run_as(python, None, ["runs"], root_env)
    assert mine.returncode == 0, mine.stderr
    assert run["run"] in mine.stdout
    assert f"trainmon: reading the ledger {ledger}" in mine.stderr
