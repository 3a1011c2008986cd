"""Earlier trainmon code from this repository's history, run as it was.

``worktree(commit)`` checks an old commit out with ``git worktree add`` into a
temporary folder (removed afterwards, with its entry in ``.git/worktrees``);
``environment(tree)`` puts that tree's ``exporter`` first on ``PYTHONPATH``, so
``python -m trainmon`` and ``import trainmon.client`` in a child process run
the old code with this virtual environment's libraries. ``serve`` starts a
daemon of a tree (or of the current code, ``tree=None``), ``report`` runs a
job of a few steps through a tree's ``trainmon.client.Reporter`` (the client
API has not changed since the ledger's first schema: ``Reporter(job, run=,
endpoint=, config=, interval_seconds=)``, ``step(samples=)``, ``flush()``,
``close()``).

The commits:

- ``SCHEMA_COMMITS``: the last commit that wrote each ledger schema (found
  with ``git log -S"SCHEMA_VERSION = N" -- exporter/trainmon/ledger``): schema 1
  up to 6283e23 (67fc775 introduced 2), schema 2 up to 767a8b2 (da38bf8
  introduced 3), schema 3 at ``PREVIOUS_RELEASE``.
- ``PREVIOUS_RELEASE``: the repository has no release tag and its CHANGELOG no
  released ``## [x.y.z]`` section yet (only ``[Unreleased]``), so the previous
  release is taken to be 440b497, the commit before issue 37's work began.

A clone without that history (shallow) cannot run them: ``have_commit``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from testkit.daemon import Daemon, free_port, ready

#: The repository this module belongs to.
ROOT = Path(__file__).resolve().parent.parent
#: Stand-in for the previous release (module docstring).
PREVIOUS_RELEASE = "440b497"
#: The last commit that wrote each earlier ledger schema.
SCHEMA_COMMITS = {1: "6283e23", 2: "767a8b2", 3: PREVIOUS_RELEASE}
#: Longest wait for a git command (s).
GIT_TIMEOUT_SECONDS = 60.0
#: Longest a reporting job of ``report`` may take (s).
JOB_TIMEOUT_SECONDS = 30.0

#: The job ``report`` runs: ``argv[1]`` a JSON object with ``endpoint``, ``job``,
#: ``run``, ``steps`` and ``end``: ``finished`` (``close()``), ``crashed``
#: (``close(finished=False)``) or ``killed`` (exits after a flush without closing: its
#: ranks expire in the daemon). Prints the steps it counted as JSON.
_JOB = """
import json, os, sys, time
from trainmon.client import Reporter
plan = json.loads(sys.argv[1])
reporter = Reporter(plan["job"], run=plan["run"], endpoint=plan["endpoint"],
                    interval_seconds=0.2, environ={},
                    config={"lr": 0.1, "batch_size": 32, "job": plan["job"]})
for _ in range(plan["steps"]):
    time.sleep(0.005)
    reporter.step(samples=32)
print(json.dumps({"steps": plan["steps"]}), flush=True)
if plan["end"] == "killed":
    reporter.flush()
    os._exit(0)
reporter.close(finished=plan["end"] == "finished")
"""


def have_commit(commit: str) -> bool:
    """Whether this clone holds ``commit`` (a shallow one may not)."""
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True, timeout=GIT_TIMEOUT_SECONDS).returncode == 0


@contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """``commit`` checked out in a temporary folder (detached), removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="trainmon-old-"))
    tree = parent / commit
    try:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet",
                        str(tree), commit], check=True, capture_output=True,
                       timeout=GIT_TIMEOUT_SECONDS)
        yield tree
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       capture_output=True, timeout=GIT_TIMEOUT_SECONDS)
        shutil.rmtree(parent, ignore_errors=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True,
                       timeout=GIT_TIMEOUT_SECONDS)


def environment(tree: Path | None, **extra: str) -> dict[str, str]:
    """This process's environment with ``tree``'s code first on ``PYTHONPATH`` (the
    current code for None), plus ``extra``."""
    env = {**os.environ, **extra}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(tree / "exporter"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def serve(tree: Path | None, folder: Path, *, ledger: Path,
          ttl_seconds: float = 1.0) -> Daemon:
    """``trainmon serve`` of ``tree`` (None: the current code) on a free loopback port,
    its training socket ``folder/steps.sock``, its ledger ``ledger`` (flushed every
    0.2 s), ranks expiring after ``ttl_seconds``; its log and configuration in
    ``folder``."""
    config = {"collectors": {
        "training": {"socket": str(folder / "steps.sock"), "ttl_seconds": ttl_seconds},
        "ledger": {"path": str(ledger), "flush_seconds": 0.2}}}
    config_path = folder / "trainmon.yml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = folder / "trainmon.log"
    port = free_port()
    with log_path.open("w") as log_file:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "trainmon", "serve", "--config", str(config_path),
             "--listen", f"127.0.0.1:{port}"],
            stdout=log_file, stderr=subprocess.STDOUT, text=True, cwd=folder,
            env=environment(tree))
    return ready(Daemon(process, port, log_path, config_path))


def report(tree: Path | None, endpoint: str, job: str, run: str, steps: int,
           end: str = "finished") -> int:
    """Run a job of ``steps`` steps of 32 samples through ``tree``'s client (None: the
    current one) to ``endpoint``, ending ``end`` (``_JOB``); the steps it counted."""
    done = subprocess.run(
        [sys.executable, "-c", _JOB, json.dumps(
            {"endpoint": endpoint, "job": job, "run": run, "steps": steps, "end": end})],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_SECONDS,
        env=environment(tree), cwd=tempfile.gettempdir())
    assert done.returncode == 0, done.stderr
    counted = json.loads(done.stdout.splitlines()[-1])["steps"]
    assert isinstance(counted, int)
    return counted
