"""A report's paths are looked up with its writer's permissions, not root's: a local
user cannot learn from a root daemon whether a path it may not see exists
(docs/security.md, "Paths a report names"; ``trainmon.node.mounts``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.exposition import parse
from testkit.prometheus import wait_until
from tests.security.security_support import AsUser, LocalUser
from tests.training.training_support import report

pytestmark = pytest.mark.integration


def checkpoint_line(job: str, path: str) -> bytes:
    # this test's own process runs as root: the daemon could look at paths through its
    # root (/proc/<pid>/root) with root's permissions
    return json.dumps(report(job=job, pid=os.getpid(), checkpoints=1, checkpoint_seconds=1.0,
                             checkpoint_path=path)).encode() + b"\n"


def test_a_path_behind_a_folder_the_user_cannot_search_tells_nothing(
    start_daemon: Callable[..., Daemon], shared_dir: Path, as_user: AsUser,
    local_users: tuple[LocalUser, LocalUser],
) -> None:
    _, attacker = local_users
    secret = shared_dir / "root-only"
    (secret / "models").mkdir(parents=True)
    secret.chmod(0o700)  # root's: the attacker may not look inside
    daemon = start_daemon(config={"collectors": {
        "training": {"socket": str(shared_dir / "steps.sock"), "socket_mode": "0666"},
        "ledger": {"enabled": False}, "gpu": {"enabled": False}}})
    answers = as_user(attacker, f"unix://{shared_dir / 'steps.sock'}", [
        checkpoint_line("probe-there", f"{secret}/models/step-1.pt"),
        checkpoint_line("probe-absent", f"{secret}/nothing/step-1.pt")])
    assert answers

    def storages() -> dict[str, tuple[str, str, str]]:
        found = parse(daemon.metrics()).labelsets("trainmon_training_checkpoint_storage_info")
        return {labels["job"]: (labels["mountpoint"], labels["fstype"], labels["storage"])
                for labels in found}

    wait_until(lambda: len(storages()) == 2, 15.0, "both probes' checkpoints", interval=0.05)
    seen = storages()
    assert seen["probe-there"] == seen["probe-absent"], seen
