"""A burst of reports from 100 ranks of one node loses nothing (client side).

Linux refuses a unix datagram (EAGAIN) once ``net.unix.max_dgram_qlen``
datagrams wait in the daemon's queue: often only 10, whatever the receive
buffer. 100 ranks reporting in the same instant hit that limit; the client
retries with backoff (``FULL_QUEUE_RETRY_BUDGET_SECONDS``) on the sender
thread, and the run description rides in the same datagram as a step report,
so neither is lost. The daemon is a real ``trainmon serve`` subprocess, the
queue length the machine's own. Two of the bursts meet a daemon that stalls
for ``STALL_SECONDS`` (stopped with SIGSTOP, as a busy or descheduled daemon
would be), so the queue is certainly full: the old 31 ms of retries lost
about 90 of each such burst of 100.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from testkit.daemon import Daemon
from trainmon.client import Reporter
from trainmon.training.writers import uid_writer

RANKS = 100
#: Flushes of all ranks at once, after the first (which carries the descriptions).
ROUNDS = 3
#: Longest wait for the daemon to have read every datagram (a bound, not a pace).
DRAIN_SECONDS = 10.0
#: How long the daemon stops reading during a stalled burst: well past the old
#: 31 ms of retries, well inside FULL_QUEUE_RETRY_BUDGET_SECONDS.
STALL_SECONDS = 0.2


@contextmanager
def stalled(daemon: Daemon) -> Iterator[None]:
    """The daemon stopped now and continued ``STALL_SECONDS`` later (or at the end)."""
    pid = daemon.process.pid
    os.kill(pid, signal.SIGSTOP)
    resume = threading.Timer(STALL_SECONDS, os.kill, (pid, signal.SIGCONT))
    resume.start()
    try:
        yield
    finally:
        resume.cancel()
        os.kill(pid, signal.SIGCONT)


def accepted(text: str) -> int:
    found = re.search(r'^trainmon_training_reports_total\{transport="unix"\} (\S+)$', text, re.M)
    return int(float(found.group(1))) if found else 0


def at_once(reporters: list[Reporter], action: Callable[[Reporter], object]) -> None:
    """Run ``action`` on every reporter, each on its own thread, released together."""
    barrier = threading.Barrier(len(reporters))

    def run(reporter: Reporter) -> None:
        barrier.wait(30)
        action(reporter)

    threads = [threading.Thread(target=run, args=(reporter,)) for reporter in reporters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


def test_100_ranks_reporting_at_once_lose_no_report_and_no_description(
    start_daemon: Callable[..., Daemon], tmp_path: Path,
) -> None:
    queue_length = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    daemon = start_daemon()
    endpoint = f"unix://{tmp_path / 'steps-0.sock'}"
    reporters = [
        Reporter("burst", rank=rank, local_rank=rank, world_size=RANKS, endpoint=endpoint,
                 environ={"TRAINMON_RUN_ID": "burst-1"}, interval_seconds=3600,
                 config={"lr": 0.1})
        for rank in range(RANKS)
    ]
    for round_ in range(ROUNDS + 1):
        for reporter in reporters:
            reporter.step(samples=1)
        if round_ == 0:  # each datagram also holds the run description
            with stalled(daemon):
                at_once(reporters, Reporter.flush)
        else:
            at_once(reporters, Reporter.flush)
    with stalled(daemon):
        at_once(reporters, Reporter.close)  # the final totals and the ended description
    # every rank: ROUNDS + 1 flushes and the close, each one report; two descriptions
    expected = RANKS * (ROUNDS + 2) + RANKS * 2
    deadline = time.monotonic() + DRAIN_SECONDS
    text = daemon.metrics()
    while accepted(text) < expected and time.monotonic() < deadline:
        text = daemon.metrics()
    assert accepted(text) == expected, (queue_length, accepted(text), expected)
    assert [reporter.dropped_reports for reporter in reporters] == [0] * RANKS
    assert not re.search(r"^trainmon_training_rejected_reports_total\{.*\} [1-9]", text, re.M)
    assert not re.search(r"^trainmon_training_dropped_reports_total\{.*\} [1-9]", text, re.M)
    # the job's owner: the kernel's word for this test's user on the socket
    owner = uid_writer(os.geteuid())
    steps = re.findall(rf'^trainmon_training_steps_total\{{job="burst",owner="{owner}",'
                       r'rank="\d+"\} (\S+)$', text, re.M)
    assert [float(value) for value in steps] == [ROUNDS + 1.0] * RANKS
