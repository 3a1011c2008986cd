"""Fixtures for the security tests: real local users, and a daemon they can reach.

``local_users`` creates two real users (``useradd``) for the whole module and
removes them afterwards; ``as_user(user, ...)`` runs a small sender as one of
them, so the daemon sees that user's uid from the kernel, as it would on a
shared node. Everything stays on loopback and in folders the test made.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from tests.security.security_support import TOKEN, AsUser, LocalUser, Node, python_for_everyone


def _useradd(name: str) -> LocalUser:
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    "--user-group", name], check=True, capture_output=True)
    entry = pwd.getpwnam(name)
    return LocalUser(name, entry.pw_uid, entry.pw_gid)


@pytest.fixture(scope="module")
def local_users() -> Iterator[tuple[LocalUser, LocalUser]]:
    """Two real, unprivileged local users (a victim and an attacker), removed afterwards."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create local users")
    suffix = secrets.token_hex(3)
    made: list[LocalUser] = []
    try:
        for role in ("victim", "attacker"):
            made.append(_useradd(f"tm-{role}-{suffix}"))
        yield made[0], made[1]
    finally:
        for user in made:
            subprocess.run(["userdel", user.name], check=False, capture_output=True)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every local user can reach (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="trainmon-shared-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


#: Sends each payload of a JSON list (latin-1 strings) to a unix socket or an HTTP
#: URL, and prints one JSON answer per payload: "sent", or the HTTP status and body.
SENDER = r"""
import json, socket, sys, http.client, urllib.parse
target, token = sys.argv[1], sys.argv[2]
answers = []
for text in json.load(sys.stdin):
    payload = text.encode("latin-1")
    if target.startswith("unix://"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(payload, target[len("unix://"):])
        answers.append({"status": "sent"})
    else:
        url = urllib.parse.urlsplit(target)
        connection = http.client.HTTPConnection(url.netloc, timeout=10)
        headers = {"Authorization": "Bearer " + token} if token else {}
        connection.request("POST", "/api/v1/steps", body=payload, headers=headers)
        response = connection.getresponse()
        answers.append({"status": response.status, "body": response.read().decode()})
        connection.close()
print(json.dumps(answers))
"""


@pytest.fixture
def as_user() -> AsUser:
    """``as_user(user, target, payloads, token="")``: send as ``user`` (None: as root)."""

    def send(user: LocalUser | None, target: str, payloads: Sequence[bytes],
             token: str = "") -> list[dict[str, object]]:
        extra = {} if user is None else {"user": user.uid, "group": user.gid,
                                         "extra_groups": []}
        done = subprocess.run(
            [python_for_everyone(), "-I", "-c", SENDER, target, token],
            input=json.dumps([payload.decode("latin-1") for payload in payloads]),
            capture_output=True, text=True, timeout=60, check=True, cwd="/",
            **extra,  # type: ignore[arg-type]
        )
        answers: list[dict[str, object]] = json.loads(done.stdout)
        return answers

    return send


@pytest.fixture
def node(
    start_daemon: Callable[..., Daemon], shared_dir: Path, request: pytest.FixtureRequest,
) -> Node:
    training: dict[str, object] = {"socket": str(shared_dir / "steps.sock"),
                                   "socket_mode": "0666"}
    training.update(getattr(request, "param", {}))
    if training.get("token_file") == "TOKEN_FILE":
        token_file = shared_dir / "tokens"
        token_file.write_text(f"ci {TOKEN}\n")
        training["token_file"] = str(token_file)
    config = {"collectors": {"training": training, "ledger": {"flush_seconds": 0.2},
                             "gpu": {"enabled": False}}}
    return Node(start_daemon(config=config), shared_dir / "steps.sock")
