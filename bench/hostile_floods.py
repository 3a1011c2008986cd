"""Floods from local users, before and after: the probes of issue 35 against two daemons.

The flood probes of ``bench.hostile`` (its probes 1–6 are the junk and slow-client
probes; these are the volume probes), run the same way: "before" is
``trainmon serve`` of a landed commit (``--before``, default ``BEFORE_REF``, the
head before the bounds), "after" this working tree, one daemon per flood with
the shipped defaults (flush every 10 s, TTL 300 s), its socket (mode ``0666``)
and ledger in a temporary folder.

Each flood is sent over the unix socket by forked processes that drop to a
user id of their own (``setresuid``: the kernel's ``SCM_CREDENTIALS`` name a
different writer for each; no account is needed), one user alone and four at
once, each user sending:

- ``descriptions``: ``JOBS`` jobs × ``RANKS`` ranks, each rank with its own run id
  and a 13.5 KB run description (as the issue measured: 222 MB for one user);
- ``reports``: the same shape of step reports, every rank reporting
  ``--rounds`` times with more steps;
- ``stalls``: a report per rank, then a stall line per rank with 16 frames of the
  longest file, function and code.

While a flood lasts and for ``--settle`` seconds after it: the daemon's peak
resident memory (``VmRSS`` every 50 ms), ``/metrics`` every second (p99 on a fresh
connection, 10 s timeout: Prometheus' default), ``/healthz`` every second (the
slowest; 5 s timeout: the DaemonSet's liveness probe), the ledger's bytes
(file + WAL) after two flushes, and SIGTERM to exit at the end (``TimeoutStopSec``
is 20 s; the goal 5 s). Then a day of one writer's runs (``--churn-runs``, each of
the largest description a line allows) written to a ledger as the recorder writes
them: the file it can fill (the goal: 64 MB per writer per day).

    .venv/bin/python -m bench.hostile_floods               # about 20 minutes
    .venv/bin/python -m bench.hostile_floods --quick       # a smaller flood, ~3 min
    .venv/bin/python -m bench.hostile_floods --before ''   # the working tree only

Needs root (to drop to other user ids). Prints a markdown table for
docs/security.md; a budget column marks each after-side figure ✓ or ✗.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import benchlib
from bench.hostile import Daemon, before_tree, start_daemon
from trainmon.contract import STEP_BUCKET_COUNT

#: The landed head before issue 35's bounds: the default ``--before``.
BEFORE_REF = "629e98b"
#: The first user id the flooding processes take (one more per user).
FIRST_UID = 42_001
#: Largest datagram the protocol takes.
DATAGRAM_BYTES = 65_536
FLOODS = ("descriptions", "reports", "stalls")


@dataclass(frozen=True)
class Settings:
    jobs: int = 16
    ranks: int = 1024
    rounds: int = 3
    settle_seconds: float = 25.0
    #: The longest a flood may take before it is cut (its figures say so).
    flood_deadline_seconds: float = 120.0
    exit_timeout_seconds: float = 60.0


QUICK = Settings(jobs=4, ranks=512, rounds=2, settle_seconds=15.0)


# -- the lines -----------------------------------------------------------------------


def description_line(user: int, job: int, rank: int, ranks: int) -> str:
    config = {f"hyper_parameter_{index:02d}": "v" * 250 for index in range(50)}
    return json.dumps({
        "v": 1, "type": "run", "job": f"flood-{user}-{job}", "rank": rank,
        "reporter_id": f"{user:04d}{job:04d}{rank:08d}", "run": f"run-{user}-{job}-{rank}",
        "started": time.time() - 60, "world_size": ranks,
        "config_hash": "sha256:0123456789abcdef", "config": config, "environment": {},
        "data_paths": [], "versions": {"python": "3.11"}, "git": None, "host": "node-1",
        "framework": {}}, separators=(",", ":"))


def report_line(user: int, job: int, rank: int, ranks: int, steps: int) -> str:
    buckets = [0] * STEP_BUCKET_COUNT
    buckets[4] = steps
    return json.dumps({
        "v": 1, "job": f"flood-{user}-{job}", "rank": rank, "world_size": ranks,
        "reporter_id": f"{user:04d}{job:04d}{rank:08d}", "run": f"run-{user}-{job}-{rank}",
        "steps": steps, "samples": steps * 32, "step_seconds": steps * 0.2,
        "data_wait_seconds": steps * 0.05, "step_buckets": buckets,
        "phase_seconds": {f"phase_{index}": 0.001 * steps for index in range(8)},
        "last_step_time": time.time()}, separators=(",", ":"))


def stall_line(user: int, job: int, rank: int, ranks: int, steps: int) -> str:
    frames = [{"file": "/" + "f" * 255, "line": index, "function": "g" * 128,
               "code": "c" * 160} for index in range(16)]
    return json.dumps({
        "v": 1, "type": "stall", "job": f"flood-{user}-{job}", "rank": rank,
        "world_size": ranks, "reporter_id": f"{user:04d}{job:04d}{rank:08d}",
        "steps": steps, "since": time.time() - 30, "where": "data_loader",
        "frames": frames}, separators=(",", ":"))


def flood_lines(kind: str, user: int, settings: Settings) -> Iterator[str]:
    shape = [(job, rank) for job in range(settings.jobs) for rank in range(settings.ranks)]
    if kind == "descriptions":
        for job, rank in shape:
            yield description_line(user, job, rank, settings.ranks)
    elif kind == "reports":
        for round_ in range(1, settings.rounds + 1):
            for job, rank in shape:
                yield report_line(user, job, rank, settings.ranks, 10 * round_)
    else:
        for job, rank in shape:
            yield report_line(user, job, rank, settings.ranks, 10)
        for job, rank in shape:
            yield stall_line(user, job, rank, settings.ranks, 10)


def datagrams(lines: Iterator[str]) -> Iterator[bytes]:
    """Lines packed into datagrams of at most ``DATAGRAM_BYTES`` (and 64 lines)."""
    batch: list[bytes] = []
    size = 0
    for text in lines:
        line = text.encode() + b"\n"
        if batch and (size + len(line) > DATAGRAM_BYTES or len(batch) == 64):
            yield b"".join(batch)
            batch, size = [], 0
        batch.append(line)
        size += len(line)
    if batch:
        yield b"".join(batch)


def send_as(uid: int, socket_path: Path, kind: str, settings: Settings) -> int:
    """Fork a process that becomes ``uid`` and sends its flood; its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sender.settimeout(settings.flood_deadline_seconds)
        deadline = time.monotonic() + settings.flood_deadline_seconds
        for datagram in datagrams(flood_lines(kind, uid - FIRST_UID, settings)):
            if time.monotonic() > deadline:
                code = 3
                break
            sender.sendto(datagram, str(socket_path))
    except BaseException:  # the child never returns into the parent's code
        code = 2
    os._exit(code)


# -- measuring ----------------------------------------------------------------------------


@dataclass
class Watch:
    """Samples of one daemon while a flood lasts."""

    daemon: Daemon
    peak_rss_kib: int = 0
    scrapes: list[float] = field(default_factory=list)
    health: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Watch:
        for target in (self._memory, self._scraper, self._healthz):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)

    def _memory(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(OSError, ValueError):
                self.peak_rss_kib = max(self.peak_rss_kib,
                                        benchlib.memory_kib(self.daemon.pid))

    def _scraper(self) -> None:
        self._every_second("/metrics", 10.0, self.scrapes)

    def _healthz(self) -> None:
        self._every_second("/healthz", 5.0, self.health)

    def _every_second(self, path: str, timeout: float, into: list[float]) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            into.append(timed_get(self.daemon.port, path, timeout))
            self._stop.wait(max(0.0, 1.0 - (time.perf_counter() - started)))


def timed_get(port: int, path: str, timeout: float) -> float:
    """Seconds to a whole 200 (or 503 from /healthz: an answer) on a fresh connection;
    inf for no answer within ``timeout``."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    started = time.perf_counter()
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        if response.status not in (200, 503):
            return math.inf
    except (OSError, http.client.HTTPException):
        return math.inf
    finally:
        connection.close()
    return time.perf_counter() - started


def ledger_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.glob("ledger.sqlite3*")
               if path.is_file())


@dataclass
class Outcome:
    flood_seconds: float
    cut: bool
    peak_rss_mib: float
    scrape_p99: float
    healthz_max: float
    ledger_mb: float
    exit_seconds: float


def flood_once(exporter: Path, folder: Path, kind: str, users: int,
               settings: Settings) -> Outcome:
    folder.mkdir(parents=True)
    folder.chmod(0o755)  # the flooding users reach the socket in it
    daemon = start_daemon(exporter, folder)
    try:
        with Watch(daemon) as watch:
            started = time.monotonic()
            children = [send_as(FIRST_UID + user, daemon.socket_path, kind, settings)
                        for user in range(users)]
            codes = [os.waitpid(child, 0)[1] for child in children]
            flood_seconds = time.monotonic() - started
            time.sleep(settings.settle_seconds)  # the recorder's next flushes, measured
        ledger = ledger_bytes(folder)
        exit_seconds = sigterm_to_exit(daemon, settings.exit_timeout_seconds)
    finally:
        benchlib.stop(daemon.process)
    return Outcome(
        flood_seconds=flood_seconds, cut=any(codes), peak_rss_mib=watch.peak_rss_kib / 1024,
        scrape_p99=benchlib.percentile(watch.scrapes, 0.99) if watch.scrapes else math.inf,
        healthz_max=max(watch.health, default=math.inf), ledger_mb=ledger / 1e6,
        exit_seconds=exit_seconds)


def sigterm_to_exit(daemon: Daemon, timeout: float) -> float:
    started = time.perf_counter()
    daemon.process.terminate()
    try:
        daemon.process.wait(timeout)
    except Exception:
        daemon.process.kill()
        daemon.process.wait()
        return math.inf
    return time.perf_counter() - started


# -- a day of one writer's runs in the ledger ----------------------------------------------


def ledger_churn(folder: Path, runs: int) -> tuple[float, float]:
    """(MB of the file and its WAL, seconds) after one owner's ``runs`` records of the
    largest size a description line allows (16 KiB), written as the recorder writes
    them (batches of 32, the shipped ``max_runs_per_owner``) and the space reclaimed
    as the recorder does: the ledger one writer can fill, however long it floods."""
    from trainmon.ledger.config import LedgerConfig
    from trainmon.ledger.records import RunRecord
    from trainmon.ledger.store import Ledger, RecordUpdate

    cap = LedgerConfig().max_runs_per_owner
    config = {f"hyper_parameter_{index:02d}": "v" * 250 for index in range(60)}
    started = time.perf_counter()
    with Ledger.open(folder / "churn.sqlite3", readonly=False) as ledger:
        for first in range(0, runs, 32):
            ledger.write([RecordUpdate(RunRecord(
                job="flood", run=f"run-{index}", node="node-1",
                config_hash="sha256:0123456789abcdef", started=float(index),
                ended=index + 1.0, end_reason="lost", updated=index + 1.0, world_size=1,
                ranks=1, description={"config": config}, summary={}, owner="uid:42001"),
                {}) for index in range(first, min(first + 32, runs))], cap)
        ledger.reclaim()
    size = sum(path.stat().st_size for path in folder.glob("churn.sqlite3*"))
    return size / 1e6, time.perf_counter() - started


# -- the table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    name: str
    budget: str
    within: Callable[[float], bool] | None
    text: Callable[[Outcome], str]
    value: Callable[[Outcome], float]


def seconds(value: float) -> str:
    return "no answer" if math.isinf(value) else f"{value:.2f}"


COLUMNS = (
    Column("flood sent in (s)", "—", None,
           lambda o: f"{o.flood_seconds:.1f}" + (" (cut)" if o.cut else ""),
           lambda o: o.flood_seconds),
    Column("peak RSS (MiB)", "≤ 128", lambda v: v <= 128, lambda o: f"{o.peak_rss_mib:.0f}",
           lambda o: o.peak_rss_mib),
    Column("scrape p99 (s)", "≤ 1", lambda v: v <= 1.0, lambda o: seconds(o.scrape_p99),
           lambda o: o.scrape_p99),
    Column("slowest /healthz (s)", "< 1", lambda v: v < 1.0, lambda o: seconds(o.healthz_max),
           lambda o: o.healthz_max),
    Column("ledger (MB)", "—", None, lambda o: f"{o.ledger_mb:.1f}", lambda o: o.ledger_mb),
    Column("SIGTERM to exit (s)", "≤ 5", lambda v: v <= 5.0, lambda o: seconds(o.exit_seconds),
           lambda o: o.exit_seconds),
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default=BEFORE_REF, metavar="REF")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--floods", default=",".join(FLOODS))
    parser.add_argument("--users", default="1,4", help="user counts, comma-separated")
    parser.add_argument("--churn-runs", type=int, default=25_000,
                        help="runs of one writer written to a ledger (a day at one new run "
                             "every 3.5 s)")
    parser.add_argument("--before-users", default="1",
                        help="user counts of the before side (four users at once take the "
                             "before daemon to gigabytes each)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench.hostile_floods needs root (it floods as other user ids)")
    settings = QUICK if args.quick else Settings()
    kinds = [kind for kind in args.floods.split(",") if kind]
    user_counts = {"after": [int(count) for count in args.users.split(",")],
                   "before": [int(count) for count in args.before_users.split(",")]}
    results: dict[tuple[str, str, int], Outcome] = {}
    with tempfile.TemporaryDirectory(prefix="trainmon-floods-") as temporary, \
            before_tree(args.before) if args.before else contextlib.nullcontext() as old:
        root = Path(temporary)
        root.chmod(0o755)
        sides = [("after", benchlib.ROOT / "exporter")]
        if old is not None:
            sides.insert(0, ("before", old))
        for side, exporter in sides:
            for kind in kinds:
                for users in user_counts[side]:
                    outcome = flood_once(exporter, root / f"{side}-{kind}-{users}", kind,
                                         users, settings)
                    results[(side, kind, users)] = outcome
                    print(f"{side} {kind} ×{users}: {outcome}", flush=True)
    shape = (f"{settings.jobs} jobs × {settings.ranks} ranks per user, each rank its own "
             f"run; reports {settings.rounds} rounds; settle {settings.settle_seconds:.0f} s")
    print(f"\n{shape}\n")
    print("| flood | users | side | " + " | ".join(c.name for c in COLUMNS) + " |")
    print("| --- | ---: | --- | " + " | ".join("---:" for _ in COLUMNS) + " |")
    def order(key: tuple[str, str, int]) -> tuple[int, int, int]:
        side, kind, users = key
        return FLOODS.index(kind) if kind in FLOODS else 99, users, side == "after"

    for (side, kind, users), outcome in sorted(results.items(), key=lambda item: order(item[0])):
        cells = []
        for column in COLUMNS:
            text = column.text(outcome)
            if side == "after" and column.within is not None:
                text += " ✓" if column.within(column.value(outcome)) else " ✗"
            cells.append(text)
        print(f"| {kind} | {users} | {side} | " + " | ".join(cells) + " |")
    print("| budget | | | " + " | ".join(c.budget for c in COLUMNS) + " |")
    if args.churn_runs:
        with tempfile.TemporaryDirectory(prefix="trainmon-churn-") as churn:
            megabytes, took = ledger_churn(Path(churn), args.churn_runs)
        print(f"\nOne writer's {args.churn_runs:,} runs of the largest description in the "
              f"ledger: {megabytes:.1f} MB (file and WAL, after the reclaim; budget 64 MB "
              f"per writer per day {'✓' if megabytes <= 64 else '✗'}), written in {took:.0f} s")


if __name__ == "__main__":
    main()
