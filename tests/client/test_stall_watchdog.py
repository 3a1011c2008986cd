"""The client's stall watchdog (``trainmon.client.watchdog``): when a rank counts as
stalled, where its training thread is, and what reaches the daemon."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.exposition import parse
from trainmon.client import Reporter, watchdog
from trainmon.client.watchdog import RankState, StallWatch, typical_step
from trainmon.contract import STEP_BUCKET_COUNT, STEP_SECONDS_BOUNDS

#: The watchdog's threshold in the tests that run a real thread (the contract's floor
#: is 10 s; what is tested is where the thread is, not how long the rule waits).
THRESHOLD_SECONDS = 0.5
DEADLINE_SECONDS = 20.0


def buckets_of(seconds: float, steps: int) -> list[int]:
    counts = [0] * STEP_BUCKET_COUNT
    index = next((i for i, bound in enumerate(STEP_SECONDS_BOUNDS) if seconds <= bound),
                 len(STEP_SECONDS_BOUNDS))
    counts[index] = steps
    return counts


def state(steps: int, last_step: float, buckets: list[int], **changes: object) -> RankState:
    values: dict[str, object] = {"thread": threading.get_ident(), "steps": steps,
                                 "last_step": last_step, "buckets": buckets, "phase": None,
                                 "checkpointing": False, "in_flight": None}
    values.update(changes)
    return RankState(**values)  # type: ignore[arg-type]


def test_slow_regular_steps_are_no_stall_and_ten_of_them_are() -> None:
    """20 s steps (bucket ≤ 30 s): quiet for 299 s without a step, stalled after 300."""
    now = 10_000.0
    watch = StallWatch(Reporter.track.__code__, clock=lambda: now, wall_clock=lambda: now)
    slow = buckets_of(20.0, 50)
    assert typical_step(slow) == 30.0
    assert watch.look(state(50, now - 299.0, slow)) is None
    line = watch.look(state(50, now - 301.0, slow))
    assert line is not None and line["type"] == "stall" and line["steps"] == 50
    assert line["since"] == pytest.approx(now - 301.0)
    assert line["where"] == "code"  # this test's own thread, in no loader or phase


def test_fast_steps_use_the_floor_and_no_step_yet_is_no_stall() -> None:
    now = 10_000.0
    watch = StallWatch(Reporter.track.__code__, clock=lambda: now, wall_clock=lambda: now)
    fast = buckets_of(0.2, 100)
    assert watch.look(state(100, now - 9.0, fast)) is None  # 10 typical steps: 2.5 s; floor 10
    assert watch.look(state(100, now - 11.0, fast)) is not None
    assert watch.look(state(0, now - 1000.0, [0] * STEP_BUCKET_COUNT)) is None


@pytest.fixture
def quick_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "stall_threshold", lambda typical: THRESHOLD_SECONDS)


def blocking_loader(release: threading.Event, after: int) -> Iterator[int]:
    """``after`` batches, then a next() that blocks until ``release`` (as a dataset on a
    dead mount would), then batches again."""
    for _ in range(after):
        yield 8
    while not release.is_set():
        time.sleep(0.01)
    while True:
        yield 8


def stalled_ranks(daemon: Daemon) -> dict[str, dict[str, str]]:
    scrape = parse(daemon.metrics())
    return {labels["rank"]: labels for labels in scrape.labelsets("trainmon_training_stall_info")}


def wait_for(condition: Callable[[], bool], daemon: Daemon) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.1)


@pytest.mark.integration
@pytest.mark.usefixtures("quick_watchdog")
def test_a_rank_blocked_in_its_loader_is_reported_there_until_it_steps_again(
    start_daemon: Callable[..., Daemon], tmp_path: Path,
) -> None:
    daemon = start_daemon()
    release, stop = threading.Event(), threading.Event()

    def train() -> None:
        with Reporter("stuck", rank=1, world_size=2, environ={}, interval_seconds=0.2,
                      endpoint=f"unix://{tmp_path / 'steps-0.sock'}") as reporter:
            for _ in reporter.track(blocking_loader(release, after=20)):
                time.sleep(0.005)
                reporter.step()
                if stop.is_set():
                    break

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        wait_for(lambda: "1" in stalled_ranks(daemon), daemon)
        info = stalled_ranks(daemon)["1"]
        scrape = parse(daemon.metrics())
        release.set()
        wait_for(lambda: not stalled_ranks(daemon), daemon)
        cleared = parse(daemon.metrics())
    finally:
        release.set()
        stop.set()
        thread.join(timeout=10)
    assert info["where"] == "data_loader"
    assert info["frame"].startswith("test_stall_watchdog.py:")
    assert info["frame"].endswith(" blocking_loader")
    assert scrape.value("trainmon_training_stalled", job="stuck", rank="1") == 1.0
    assert cleared.value("trainmon_training_stalled", job="stuck", rank="1") == 0.0


@pytest.mark.integration
@pytest.mark.usefixtures("quick_watchdog")
def test_a_rank_stuck_on_a_lock_in_a_phase_or_a_checkpoint_is_reported_there(
    start_daemon: Callable[..., Daemon], tmp_path: Path,
) -> None:
    daemon = start_daemon()
    lock = threading.Lock()
    lock.acquire()
    where: dict[str, str] = {}

    def train(job: str, block: Callable[[Reporter], None]) -> None:
        with Reporter(job, rank=0, world_size=1, environ={}, interval_seconds=0.2,
                      endpoint=f"unix://{tmp_path / 'steps-0.sock'}") as reporter:
            for step in reporter.track(range(1000)):
                time.sleep(0.005)
                reporter.step()
                if step == 10:
                    block(reporter)
                    return

    def in_phase(reporter: Reporter) -> None:
        with reporter.phase("optimizer"):
            lock.acquire()
            lock.release()

    def in_checkpoint(reporter: Reporter) -> None:
        with reporter.checkpoint(str(tmp_path / "ckpt.pt")):
            lock.acquire()
            lock.release()

    threads = [threading.Thread(target=train, args=args, daemon=True)
               for args in (("phased", in_phase), ("saving", in_checkpoint))]
    for thread in threads:
        thread.start()
    try:
        def both() -> bool:
            scrape = parse(daemon.metrics())
            for labels in scrape.labelsets("trainmon_training_stall_info"):
                where[labels["job"]] = labels["where"]
            return len(where) == 2
        wait_for(both, daemon)
    finally:
        lock.release()
        for thread in threads:
            thread.join(timeout=10)
    assert where == {"phased": "phase", "saving": "checkpoint"}
