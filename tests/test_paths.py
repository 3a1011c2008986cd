"""Default ledger and socket paths, their folders' modes, and the client's socket rule
(``trainmon.paths``), with the base folders, the environment and the uid injected."""

from __future__ import annotations

import grp
import os
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from trainmon import paths
from trainmon.client.transport import default_endpoint

USER = 12345  # a uid that owns nothing here unless a test gives it a folder


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create folders of other uids")


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


@pytest.fixture
def world_writable(tmp_path: Path) -> Path:
    """A /tmp-like folder: anyone may create names in it (sticky)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def test_root_gets_the_system_paths(tmp_path: Path) -> None:
    state, runtime = tmp_path / "var/lib/trainmon", tmp_path / "run/trainmon"
    environ = {"HOME": "/root", "XDG_STATE_HOME": "/x", "XDG_RUNTIME_DIR": "/y"}
    assert paths.default_ledger_path(environ, 0, state) == state / "ledger.sqlite3"
    assert paths.default_socket_path(environ, 0, runtime) == runtime / "steps.sock"
    assert Path("/var/lib/trainmon/ledger.sqlite3") == paths.SYSTEM_LEDGER_PATH
    assert Path("/run/trainmon/steps.sock") == paths.SYSTEM_SOCKET_PATH


def test_another_user_follows_xdg(tmp_path: Path) -> None:
    state, runtime = tmp_path / "var/lib/trainmon", tmp_path / "run/trainmon"
    environ = {"HOME": "/home/alice", "XDG_STATE_HOME": "/home/alice/.state",
               "XDG_RUNTIME_DIR": "/run/user/12345"}
    assert paths.default_ledger_path(environ, USER, state) == Path(
        "/home/alice/.state/trainmon/ledger.sqlite3")
    assert paths.default_socket_path(environ, USER, runtime) == Path(
        "/run/user/12345/trainmon/steps.sock")


def test_unset_or_relative_xdg_variables_fall_back(tmp_path: Path) -> None:
    state, runtime, temporary = tmp_path / "state", tmp_path / "run", tmp_path / "tmp"
    for environ in ({"HOME": "/home/alice"},
                    {"HOME": "/home/alice", "XDG_STATE_HOME": "rel", "XDG_RUNTIME_DIR": ""}):
        assert paths.default_ledger_path(environ, USER, state) == Path(
            "/home/alice/.local/state/trainmon/ledger.sqlite3")
        assert paths.default_socket_path(environ, USER, runtime, temporary) == (
            temporary / f"trainmon-{USER}" / "steps.sock")


@pytest.mark.usefixtures("root_only")
def test_the_owner_of_the_system_folder_uses_it(tmp_path: Path) -> None:
    """The systemd unit's StateDirectory=/RuntimeDirectory= and the DaemonSet's init
    container hand the system folders to the daemon's user."""
    state, runtime = tmp_path / "var/lib/trainmon", tmp_path / "run/trainmon"
    for folder in (state, runtime):
        folder.mkdir(parents=True)
        os.chown(folder, USER, USER)
    environ = {"HOME": "/", "XDG_RUNTIME_DIR": "/run/user/12345"}
    assert paths.default_ledger_path(environ, USER, state) == state / "ledger.sqlite3"
    assert paths.default_socket_path(environ, USER, runtime) == runtime / "steps.sock"
    assert paths.default_ledger_path(environ, USER + 1, state).parts[:2] == ("/", ".local")


@pytest.mark.usefixtures("umask_022")
def test_root_makes_the_state_folder_0750_with_the_ledger_group(tmp_path: Path) -> None:
    group = next(entry for entry in grp.getgrall() if entry.gr_gid != os.getegid())
    folder = tmp_path / "var/lib/trainmon"
    made = paths.make_state_directory(folder, euid=0, group=group.gr_name)
    assert made == [tmp_path / "var", tmp_path / "var/lib", folder]
    assert mode(folder) == 0o750 and os.stat(folder).st_gid == group.gr_gid
    # the folders above are only traversable, and keep the creator's group
    assert mode(tmp_path / "var") == 0o755
    assert os.stat(tmp_path / "var").st_gid == os.getegid()


@pytest.mark.usefixtures("umask_022")
def test_without_the_group_the_state_folder_keeps_the_daemons(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    paths.make_state_directory(folder, euid=0, group="no-such-group-trainmon")
    assert mode(folder) == 0o750 and os.stat(folder).st_gid == os.getegid()


@pytest.mark.usefixtures("umask_022")
def test_root_makes_the_runtime_folder_0755_and_users_make_private_ones(
        tmp_path: Path) -> None:
    paths.make_runtime_directory(tmp_path / "run/trainmon", euid=0)
    assert mode(tmp_path / "run/trainmon") == 0o755
    made = paths.make_runtime_directory(tmp_path / "user/trainmon", euid=os.geteuid() or 1)
    paths.make_state_directory(tmp_path / "home/.local/state/trainmon", euid=os.geteuid() or 1)
    assert made == [tmp_path / "user", tmp_path / "user/trainmon"]
    for folder in ("user", "user/trainmon", "home", "home/.local/state/trainmon"):
        assert mode(tmp_path / folder) == 0o700, folder


def test_the_umask_only_takes_bits_away(tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        paths.make_state_directory(tmp_path / "state", euid=0)
    finally:
        os.umask(previous)
    assert mode(tmp_path / "state") == 0o700


def test_an_existing_folder_is_left_as_the_admin_made_it(tmp_path: Path) -> None:
    me = os.geteuid()
    folder = tmp_path / "trainmon"
    folder.mkdir()
    folder.chmod(0o711)
    assert paths.make_state_directory(folder, euid=me) == []
    assert paths.make_runtime_directory(folder, euid=me) == []
    assert mode(folder) == 0o711
    # one that others may write is refused, and left as it is too
    folder.chmod(0o777)
    with pytest.raises(paths.UnsafePathError, match=f"{folder} is writable by other users"):
        paths.make_runtime_directory(folder, euid=me)
    assert mode(folder) == 0o777


@pytest.mark.usefixtures("root_only")
def test_a_folder_in_tmp_made_by_someone_else_is_refused(world_writable: Path) -> None:
    planted = world_writable / "trainmon-0"
    planted.mkdir(mode=0o700)
    os.chown(planted, USER, USER)
    with pytest.raises(PermissionError, match=f"belongs to uid {USER}"):
        paths.make_runtime_directory(planted, euid=0)


def test_a_folder_in_tmp_others_may_write_or_a_symlink_is_refused(
        world_writable: Path, tmp_path: Path) -> None:
    me = os.geteuid()
    loose = world_writable / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(PermissionError, match="writable by other users"):
        paths.make_runtime_directory(loose, euid=me)
    link = world_writable / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(PermissionError, match="not a directory"):
        paths.make_runtime_directory(link, euid=me)
    made = paths.make_runtime_directory(world_writable / f"trainmon-{me}", euid=me)
    assert made == [world_writable / f"trainmon-{me}"]


@pytest.mark.usefixtures("root_only")
def test_every_folder_from_the_root_down_is_checked(tmp_path: Path) -> None:
    """``mv run run.root; mkdir run``: a folder of root's below a user's is the user's."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, USER, USER)
    run = theirs / "run"
    run.mkdir(mode=0o755)
    with pytest.raises(paths.UnsafePathError) as refused:
        paths.check_folder(run, euid=0)
    assert refused.value.component == theirs
    assert f"{theirs} belongs to uid {USER} (owner no passwd entry, mode 0755)" in str(
        refused.value)
    # nothing is made below it either
    with pytest.raises(paths.UnsafePathError, match=f"{theirs} belongs to uid {USER}"):
        paths.make_runtime_directory(run / "trainmon" / "sockets", euid=0)
    assert not (run / "trainmon").exists()
    # the user's own daemon may use it: the folders are the user's or root's
    assert paths.check_folder(run, euid=USER) == run


def test_a_folder_its_group_may_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)  # as umask 002 makes them, even where the group is the user's own
    (shared / "trainmon").mkdir()
    with pytest.raises(paths.UnsafePathError, match=f"{shared} is writable by other users "
                       r"\(owner .*, mode 0775\)"):
        paths.check_folder(shared / "trainmon")
    with pytest.raises(paths.UnsafePathError, match="writable by other users"):
        paths.check_folder(shared)


def test_a_sticky_folder_is_a_way_through_never_the_folder_itself(
        world_writable: Path) -> None:
    me = os.geteuid()
    mine = world_writable / "mine"
    mine.mkdir(mode=0o700)
    assert paths.check_folder(mine) == mine
    with pytest.raises(paths.UnsafePathError, match=f"{world_writable} is writable by other"):
        paths.check_folder(world_writable)
    # without the sticky bit anyone may rename "mine" away: refused on the way too
    world_writable.chmod(0o777)
    with pytest.raises(paths.UnsafePathError, match=f"{world_writable} is writable by other"):
        paths.check_folder(mine)
    world_writable.chmod(0o1777)
    if me == 0:  # a sticky folder of another user: its owner may remove what is in it
        os.chown(world_writable, USER, USER)
        with pytest.raises(paths.UnsafePathError,
                           match=f"{world_writable} belongs to uid {USER}"):
            paths.check_folder(mine)


def test_symlinks_on_the_way_are_followed_and_their_targets_checked(
        tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "trainmon").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    (tmp_path / "relative").symlink_to("real/../real/trainmon")
    assert paths.check_folder(tmp_path / "link" / "trainmon") == real / "trainmon"
    assert paths.check_folder(tmp_path / "relative") == real / "trainmon"
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(OSError, match="too many symlinks"):
        paths.check_folder(tmp_path / "loop")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        paths.check_folder(tmp_path / "file" / "trainmon")
    with pytest.raises(FileNotFoundError):
        paths.check_folder(tmp_path / "absent")


@pytest.mark.usefixtures("root_only")
def test_a_symlink_to_a_users_folder_is_that_users_folder(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    (theirs / "run").mkdir(parents=True)
    os.chown(theirs, USER, USER)
    (tmp_path / "run").symlink_to(theirs / "run")  # root's link, in root's folder
    with pytest.raises(paths.UnsafePathError, match=f"{theirs} belongs to uid {USER}"):
        paths.check_folder(tmp_path / "run", euid=0)


def test_a_relative_path_is_checked_from_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "state").mkdir()
    monkeypatch.chdir(tmp_path)
    assert paths.check_folder(Path("state")) == tmp_path / "state"
    assert paths.make_state_directory(Path("state/trainmon"), euid=os.geteuid()) == [
        tmp_path / "state" / "trainmon"]


def bound(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    return sock


def test_the_client_sends_to_its_users_daemon_when_one_listens(tmp_path: Path) -> None:
    me = os.geteuid() or 1  # a user, whose own socket differs from the system one
    system, runtime = tmp_path / "run/trainmon", tmp_path / "xdg"
    environ = {"XDG_RUNTIME_DIR": str(runtime), "HOME": str(tmp_path)}
    own = runtime / "trainmon/steps.sock"
    # no daemon of the user: the system socket (a root daemon's)
    assert paths.client_socket_path(environ, me, system) == system / "steps.sock"
    with bound(own):
        assert paths.client_socket_path(environ, me, system) == own
    # a stale socket file (its daemon was killed) is not a daemon
    assert own.exists()
    assert paths.client_socket_path(environ, me, system) == system / "steps.sock"


@pytest.mark.usefixtures("root_only")
def test_the_client_ignores_a_socket_another_user_planted_in_tmp(world_writable: Path,
                                                                 tmp_path: Path) -> None:
    system = tmp_path / "run/trainmon"
    planted = world_writable / f"trainmon-{USER}"
    with bound(planted / "steps.sock"):
        os.chown(planted, USER + 1, USER + 1)
        assert paths.client_socket_path({}, USER, system, world_writable) == (
            system / "steps.sock")
        os.chown(planted, USER, USER)
        assert paths.client_socket_path({}, USER, system, world_writable) == (
            planted / "steps.sock")


def test_root_and_the_reporter_default_to_the_system_socket() -> None:
    if os.geteuid() != 0:
        pytest.skip("root's default")
    assert default_endpoint({}) == "unix:///run/trainmon/steps.sock"


@pytest.mark.usefixtures("root_only")
def test_a_root_daemon_makes_the_missing_socket_folder_0755(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    runtime = tmp_path / "run/trainmon"
    daemon = start_daemon({"collectors": {"training": {"socket": str(runtime / "steps.sock")}}})
    status, health = daemon.get("/healthz")
    assert status == 200 and "socket_error" not in health, health
    assert paths.socket_listening(runtime / "steps.sock")
    assert mode(runtime) == 0o755 and mode(tmp_path / "run") == 0o755
    assert f"created {runtime} (mode 755)" in daemon.log()


def test_a_daemon_leaves_an_existing_socket_folder_as_it_is(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    runtime = tmp_path / "admin"
    runtime.mkdir()
    runtime.chmod(0o711)
    daemon = start_daemon({"collectors": {"training": {"socket": str(runtime / "steps.sock")}}})
    assert paths.socket_listening(runtime / "steps.sock"), daemon.log()
    assert mode(runtime) == 0o711 and "created" not in daemon.log()
