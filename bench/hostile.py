"""Hostile input, before and after: the same probes against two daemons, side by side.

"before" is ``trainmon serve`` from a landed commit (``--before``, default
``BEFORE_REF``, the last commit before the hardening: unbounded junk
bodies, per-read HTTP timeouts), materialised with ``git archive`` into a
temporary folder and run by this venv's python with ``PYTHONPATH`` on its
``exporter/``; "after" is this working tree's ``exporter/``. Where the ref
is not in the repository (a shallow clone, a source tarball), the before
side is skipped with a note, so that ``make bench`` runs it without
arguments. Both daemons run only the training collector (GPU, Tencent and the
node collectors off), with their socket (mode ``0666``) and run ledger in a
temporary folder, on a free loopback port, one after the other.

The probes, each bounded in time (a daemon that does not answer is reported
as "no answer", never waited for):

1. one ``POST /api/v1/steps`` of a 1 MiB body of ``x\\n`` lines (the default
   body limit): time to the answer, the daemon's peak resident memory growth
   (``VmRSS`` sampled every 5 ms and ``VmHWM``, ``/proc/<pid>/status``), and
   the latency of a scraper on a kept-alive connection (20 scrapes/s) during
   the POST vs a quiet window before it;
2. 64 KiB junk datagrams on the step socket, one a second: the daemon's CPU
   time (user + system, ``/proc/<pid>/stat``) per datagram, less the quiet
   window's CPU rate, and scrape p99 during vs quiet;
3. 10 000 job names (``--jobs``), each with a report and a run description (HTTP,
   keep-alive, 32 jobs a POST: within the after side's 64-line payload
   limit): series in ``/metrics`` afterwards, the time of that scrape, and
   SIGTERM-to-exit time (the daemon's last run-ledger write included); run
   last, since it ends the daemon;
4. 1 000 slow connections from 127.0.0.1 sending one header line a second
   (reopened when the daemon closes them) while a scraper on the same address
   (as ``doctor`` and node-local agents are: every local user shares loopback)
   opens a fresh connection per scrape, once a second (2 s timeout, as after a
   Prometheus restart): scrapes answered 200 out of all; the same probe against
   Debian's ``prometheus-node-exporter`` where it is installed, side by side;
5. 100 ``trainmon.client.Reporter`` objects (this tree's client, on the socket)
   flushing at the same moment, their run descriptions included: steps the
   daemon counted vs expected, and the reports the clients counted as dropped
   (this machine's ``net.unix.max_dgram_qlen`` is printed above the table);
6. ``promtool check metrics`` on the exposition taken in probe 3 (every
   family of the run present): problems found.

    .venv/bin/python -m bench.hostile
    .venv/bin/python -m bench.hostile --quick            # under a minute
    .venv/bin/python -m bench.hostile --before HEAD~3 --datagram-seconds 60
    .venv/bin/python -m bench.hostile --before ''        # the working tree only

Prints a markdown table for docs/benchmarks.md; a budget column marks each
after-side figure ✓ or ✗.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import io
import json
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench import benchlib
from trainmon.client import Reporter
from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.training import protocol

#: The landed commit before the hostile-input hardening: the default ``--before``.
BEFORE_REF = "cbd116d"
#: ``config_hash`` of a run without a config (docs/protocol.md: the hash of ``{}``).
EMPTY_CONFIG_HASH = "sha256:44136fa355b3678a"
#: Largest unix datagram the protocol takes (docs/protocol.md).
DATAGRAM_BYTES = 65_536
BODY_BYTES = 1 << 20
POST_PATH = "/api/v1/steps"
SCRAPER_SOURCE = "127.0.0.2"
#: Jobs (a description and a report each) per POST of probe 3, both sides: the after
#: side refuses a payload of more than MAX_PAYLOAD_LINES lines whole.
JOBS_PER_POST = getattr(protocol, "MAX_PAYLOAD_LINES", 64) // 2

FigureCheck = Callable[[float], bool]


# -- the rows of the table ----------------------------------------------------------


@dataclass(frozen=True)
class Row:
    probe: str
    figure: str
    budget: str = "—"
    #: Whether a measured value is within the budget; None: no budget.
    within: FigureCheck | None = None


P1, P2, P3 = "1 MiB junk POST", "64 KiB junk datagrams, 1/s", "jobs with run descriptions"
P4, P5, P6 = "slow clients", "reporters at once", "promtool check metrics"
ROWS = (
    Row(P1, "HTTP status"),
    Row(P1, "time to answer (s)", "< 1 s", lambda v: v < 1.0),
    Row(P1, "peak RSS growth (MiB)", "< 50 MiB", lambda v: v < 50.0),
    Row(P1, "scrape p50 / p99, quiet (ms)"),
    Row(P1, "scrape p50 / p99 during the POST (ms)"),
    Row(P1, "scrape p99 during ÷ quiet", "≤ 2×", lambda v: v <= 2.0),
    Row(P2, "datagrams sent / refused by the socket"),
    Row(P2, "CPU per datagram (ms)", "< 20 ms", lambda v: v < 20.0),
    Row(P2, "scrape p50 / p99 during (ms)"),
    Row(P2, "scrape p99 during ÷ quiet", "≤ 2×", lambda v: v <= 2.0),
    Row(P3, "lines accepted / rejected"),
    Row(P3, "series in /metrics afterwards"),
    Row(P3, "scrape time (s)"),
    Row(P3, "SIGTERM to exit (s)"),
    Row(P4, "scrapes answered 200 / total", "≥ 95 %", lambda v: v >= 0.95),
    Row(P4, "node_exporter, the same probe: answered 200 / total"),
    Row(P5, "steps counted / expected"),
    Row(P5, "reports dropped by the clients", "0", lambda v: v == 0),
    Row(P6, "lint problems", "0", lambda v: v == 0),
)


@dataclass(frozen=True)
class Figure:
    """One cell: its text, and the number a budget is checked against (None: none)."""

    text: str
    value: float | None = None


NO_ANSWER = Figure("no answer")
Report = dict[tuple[str, str], Figure]


@dataclass(frozen=True)
class Settings:
    """Sizes and durations of the probes (``--quick`` shrinks them)."""

    quiet_seconds: float = 10.0
    scrape_interval_seconds: float = 0.05
    post_timeout_seconds: float = 30.0
    datagram_seconds: int = 20
    jobs: int = 10_000
    jobs_deadline_seconds: float = 180.0
    exit_timeout_seconds: float = 30.0
    slow_clients: int = 1000
    slow_seconds: float = 30.0
    reporters: int = 100
    steps_per_reporter: int = 10


QUICK = Settings(quiet_seconds=3.0, datagram_seconds=3, jobs=1_000, slow_seconds=5.0)


# -- the daemon ------------------------------------------------------------------------


@dataclass
class Daemon:
    """A ``trainmon serve`` of one source tree, with its socket and log."""

    process: subprocess.Popen[bytes]
    port: int
    socket_path: Path
    log_path: Path
    #: The last exposition read in full (probe 6 lints it).
    exposition: str = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def scrape(self, timeout: float = 10.0) -> tuple[str, float] | None:
        """(exposition, seconds) of one ``/metrics`` read on a fresh connection; None if
        the daemon did not answer 200 within ``timeout``."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        started = time.perf_counter()
        try:
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            return None
        finally:
            connection.close()
        if response.status != 200:
            return None
        self.exposition = body.decode("utf-8", "replace")
        return self.exposition, time.perf_counter() - started

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def daemon_config(folder: Path) -> Path:
    """A config that both trees read: only keys the before side knows too."""
    config = folder / "trainmon.yml"
    config.write_text(
        f"collectors:\n{benchlib.TRAINING_ONLY}"
        "  tencent: {enabled: false}\n"
        f"  training: {{socket: '{folder / 'steps.sock'}', socket_mode: '0666'}}\n"
        f"  ledger: {{path: '{folder / 'ledger.sqlite3'}'}}\n"
    )
    return config


def tree_environment(exporter: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(exporter)}


def imported_from(exporter: Path) -> Path:
    """The folder ``import trainmon`` resolves to under ``tree_environment(exporter)``."""
    completed = subprocess.run(
        [sys.executable, "-c", "import trainmon; print(trainmon.__file__)"],
        env=tree_environment(exporter), cwd=benchlib.ROOT, capture_output=True, text=True,
        timeout=60, check=True,
    )
    return Path(completed.stdout.strip()).resolve().parent.parent


def start_daemon(exporter: Path, folder: Path) -> Daemon:
    """``trainmon serve`` of the tree whose package folder is ``exporter``."""
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "trainmon.log"
    try:
        started = benchlib.start_trainmon(daemon_config(folder), env=tree_environment(exporter),
                                          log_path=log_path)
    except RuntimeError:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"trainmon did not start:\n{tail}") from None
    daemon = Daemon(started.process, started.port, folder / "steps.sock", log_path)
    deadline = time.monotonic() + 10
    while not daemon.socket_path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return daemon


def archived_exporter(ref: str) -> bytes | None:
    """A tar of ``exporter/`` at ``ref``; None without git or without that commit
    (a shallow clone, a source tarball)."""
    git = ["git", "-C", str(benchlib.ROOT)]
    try:
        verified = subprocess.run(
            [*git, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            capture_output=True, text=True, timeout=60, check=False,
        )
        if verified.returncode != 0:
            return None
        archive = subprocess.run(
            [*git, "archive", "--format=tar", verified.stdout.strip(), "exporter"],
            capture_output=True, timeout=120, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return archive.stdout


@contextlib.contextmanager
def before_tree(ref: str) -> Iterator[Path | None]:
    """The ``exporter/`` folder of ``ref`` in a temporary folder (removed afterwards);
    None if it cannot be had."""
    archive = archived_exporter(ref)
    if archive is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="trainmon-before-") as folder:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(folder, filter="data")
        yield Path(folder) / "exporter"


# -- readings --------------------------------------------------------------------------


def milliseconds(values: Sequence[float]) -> str:
    """``p50 / p99`` of latencies in seconds, as ms; timeouts (inf) as "timeout"."""
    if not values:
        return "no scrapes"

    def text(value: float) -> str:
        return "timeout" if math.isinf(value) else f"{value * 1000:.1f}"

    p50, p99 = benchlib.percentile(values, 0.5), benchlib.percentile(values, 0.99)
    return f"{text(p50)} / {text(p99)} (n={len(values)})"


def ratio(during: Sequence[float], quiet: Sequence[float]) -> Figure:
    if not during or not quiet:
        return Figure("no scrapes")
    value = benchlib.percentile(during, 0.99) / benchlib.percentile(quiet, 0.99)
    return Figure("∞ (timeouts)" if math.isinf(value) else f"{value:.1f}×", value)


@dataclass
class Scrape:
    started: float
    ended: float
    #: Seconds to the whole answer; inf for a failure or timeout.
    seconds: float


class Scraper:
    """A thread reading ``/metrics`` every ``interval`` s over one kept-alive
    connection (reopened when the daemon closes it), remembering every scrape."""

    def __init__(self, port: int, interval: float, timeout: float = 5.0) -> None:
        self.port, self.interval, self.timeout = port, interval, timeout
        self.scrapes: list[Scrape] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 1)

    def between(self, start: float, end: float) -> list[float]:
        """Latencies of the scrapes that overlapped ``[start, end]`` (perf_counter s)."""
        return [s.seconds for s in list(self.scrapes) if s.started <= end and s.ended >= start]

    def _run(self) -> None:
        connection: http.client.HTTPConnection | None = None
        while not self._stop.is_set():
            started = time.perf_counter()
            seconds = math.inf
            for _attempt in (1, 2):  # a kept-alive connection the daemon closed: once more
                current = connection or http.client.HTTPConnection(
                    "127.0.0.1", self.port, timeout=self.timeout)
                connection = current
                try:
                    current.request("GET", "/metrics")
                    response = current.getresponse()
                    response.read()
                    if response.status == 200:
                        seconds = time.perf_counter() - started
                    if response.will_close:
                        current.close()
                        connection = None
                    break
                except (OSError, http.client.HTTPException) as error:
                    current.close()
                    connection = None
                    if isinstance(error, TimeoutError):
                        break
            self.scrapes.append(Scrape(started, time.perf_counter(), seconds))
            self._stop.wait(max(0.0, started + self.interval - time.perf_counter()))
        if connection is not None:
            connection.close()


class MemoryPeak:
    """The peak ``VmRSS`` of ``pid`` while in the block, sampled every 5 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def __enter__(self) -> MemoryPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(2)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, RuntimeError):
                self.peak_kib = max(self.peak_kib, benchlib.memory_kib(self.pid, "VmRSS"))
            self._stop.wait(0.005)


def metric_sum(exposition: str, prefix: str) -> float:
    """The sum of the samples whose line starts with ``prefix``."""
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith(prefix):
            with contextlib.suppress(ValueError, IndexError):
                total += float(line.rsplit(" ", 1)[1])
    return total


def series_count(exposition: str) -> int:
    return sum(1 for line in exposition.splitlines() if line and not line.startswith("#"))


# -- the probes ------------------------------------------------------------------------


def quiet_scrapes(daemon: Daemon, settings: Settings) -> tuple[list[float], float]:
    """Scrape latencies of a quiet window, and the daemon's CPU seconds per second in it."""
    with Scraper(daemon.port, settings.scrape_interval_seconds) as scraper:
        time.sleep(0.3)  # the connection is open
        cpu, began = benchlib.cpu_seconds(daemon.pid), time.perf_counter()
        time.sleep(settings.quiet_seconds)
        cpu_rate = (benchlib.cpu_seconds(daemon.pid) - cpu) / (time.perf_counter() - began)
        return scraper.between(began, time.perf_counter()), cpu_rate


def probe_junk_post(daemon: Daemon, settings: Settings, quiet: list[float]) -> Report:
    body = b"x\n" * (BODY_BYTES // 2)
    report: Report = {(P1, "scrape p50 / p99, quiet (ms)"): Figure(milliseconds(quiet))}
    rss_before = benchlib.memory_kib(daemon.pid, "VmRSS")
    hwm_before = benchlib.memory_kib(daemon.pid, "VmHWM")
    with Scraper(daemon.port, settings.scrape_interval_seconds) as scraper:
        time.sleep(0.3)
        with MemoryPeak(daemon.pid) as memory:
            connection = http.client.HTTPConnection(
                "127.0.0.1", daemon.port, timeout=settings.post_timeout_seconds)
            started = time.perf_counter()
            try:
                connection.request("POST", POST_PATH, body=body,
                                   headers={"Content-Type": "application/x-ndjson"})
                response = connection.getresponse()
                response.read()
                status: int | None = response.status
            except (OSError, http.client.HTTPException):
                status = None
            finally:
                connection.close()
            ended = time.perf_counter()
            time.sleep(0.2)  # what is freed after the answer
        during = scraper.between(started, ended)
    if status is None:
        report[(P1, "HTTP status")] = NO_ANSWER
        report[(P1, "time to answer (s)")] = Figure(
            f"no answer in {settings.post_timeout_seconds:.0f} s", math.inf)
    else:
        report[(P1, "HTTP status")] = Figure(str(status))
        report[(P1, "time to answer (s)")] = Figure(f"{ended - started:.3f}", ended - started)
    hwm_after = benchlib.memory_kib(daemon.pid, "VmHWM")
    peak = hwm_after if hwm_after > hwm_before else memory.peak_kib
    growth = max(0, peak - rss_before) / 1024
    report[(P1, "peak RSS growth (MiB)")] = Figure(f"{growth:.1f}", growth)
    report[(P1, "scrape p50 / p99 during the POST (ms)")] = Figure(milliseconds(during))
    report[(P1, "scrape p99 during ÷ quiet")] = ratio(during, quiet)
    return report


def probe_junk_datagrams(
    daemon: Daemon, settings: Settings, quiet: list[float], quiet_cpu_rate: float
) -> Report:
    junk = (b"x\n" * (DATAGRAM_BYTES // 2))[:DATAGRAM_BYTES]
    sent = refused = 0
    with Scraper(daemon.port, settings.scrape_interval_seconds) as scraper, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * DATAGRAM_BYTES)
        sock.setblocking(False)
        time.sleep(0.3)
        cpu, began = benchlib.cpu_seconds(daemon.pid), time.perf_counter()
        for index in range(settings.datagram_seconds):
            try:
                sock.sendto(junk, str(daemon.socket_path))
                sent += 1
            except OSError:  # a full queue (EAGAIN), or no daemon
                refused += 1
            time.sleep(max(0.0, began + index + 1 - time.perf_counter()))
        seconds = time.perf_counter() - began
        cpu_used = benchlib.cpu_seconds(daemon.pid) - cpu
        during = scraper.between(began, time.perf_counter())
    per_datagram = max(0.0, cpu_used - quiet_cpu_rate * seconds) / max(1, sent) * 1000
    # /proc counts CPU time in clock ticks (10 ms): below one tick over all datagrams
    resolution = 1000 / benchlib.CLOCK_TICKS / max(1, sent)
    cpu_text = (f"< {resolution:.2f}" if per_datagram < resolution else f"{per_datagram:.2f}")
    return {
        (P2, "datagrams sent / refused by the socket"): Figure(f"{sent} / {refused}"),
        (P2, "CPU per datagram (ms)"): Figure(cpu_text, per_datagram),
        (P2, "scrape p50 / p99 during (ms)"): Figure(milliseconds(during)),
        (P2, "scrape p99 during ÷ quiet"): ratio(during, quiet),
    }


def open_slow(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((SLOW_SOURCE, 0))
    sock.setblocking(False)
    sock.connect_ex(("127.0.0.1", port))  # EINPROGRESS: the sends below wait for it
    return sock


def answered_or_closed(sock: socket.socket) -> bool:
    """Whether the daemon sent something (a 503, a 408) or closed the connection."""
    try:
        sock.recv(4096)
    except BlockingIOError:  # nothing yet
        return False
    return True


def slow_clients(port: int, count: int, stop: threading.Event) -> None:
    """``count`` connections each sending one header line a second until ``stop``;
    one the daemon closed (or answered) is opened again."""
    sockets = [open_slow(port) for _ in range(count)]
    lines = [b"GET /metrics HTTP/1.1\r\n" for _ in sockets]
    tick = 0
    try:
        while not stop.is_set():
            for index, sock in enumerate(sockets):
                try:
                    if answered_or_closed(sock):
                        raise ConnectionResetError("the daemon answered or closed it")
                    with contextlib.suppress(BlockingIOError):  # still connecting
                        sock.send(lines[index])
                        lines[index] = f"X-Slow-{tick}: {'a' * 16}\r\n".encode()
                except OSError:
                    sock.close()
                    sockets[index] = open_slow(port)
                    lines[index] = b"GET /metrics HTTP/1.1\r\n"
            tick += 1
            stop.wait(1.0)
    finally:
        for sock in sockets:
            sock.close()


def scrape_from(source: str, port: int, timeout: float) -> bool:
    """One ``/metrics`` read on a fresh connection from ``source``: True if it answered 200."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=timeout, source_address=(source, 0))
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        response.read()
        return response.status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


#: Probe 4's slow connections and its scraper share one address.
SLOW_SOURCE = "127.0.0.1"


def scrapes_beside_slow_clients(port: int, settings: Settings) -> Figure:
    """Probe 4 against whatever listens on ``port``: scrapes answered 200 of all."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * settings.slow_clients + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (
            wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard))
    stop = threading.Event()
    attacker = threading.Thread(target=slow_clients, daemon=True,
                                args=(port, settings.slow_clients, stop))
    attacker.start()
    answered = total = 0
    try:
        stop.wait(1.0)  # every slow connection is open
        deadline = time.perf_counter() + settings.slow_seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            total += 1
            answered += scrape_from(SLOW_SOURCE, port, timeout=2.0)
            stop.wait(max(0.0, started + 1.0 - time.perf_counter()))
    finally:
        stop.set()
        attacker.join(5)
    share = answered / total if total else 0.0
    return Figure(f"{answered} / {total} ({share:.0%})", share)


def node_exporter_beside_slow_clients(settings: Settings) -> Figure:
    """Probe 4 against ``prometheus-node-exporter`` (netdev and diskstats), if installed."""
    started = benchlib.start_node_exporter()
    if started is None:
        return Figure("not installed")
    process, port = started
    try:
        return scrapes_beside_slow_clients(port, settings)
    finally:
        benchlib.stop(process)


def probe_slow_clients(daemon: Daemon, settings: Settings) -> Report:
    return {
        (P4, "scrapes answered 200 / total"): scrapes_beside_slow_clients(daemon.port, settings),
        (P4, "node_exporter, the same probe: answered 200 / total"):
            node_exporter_beside_slow_clients(settings),
    }


def probe_reporter_burst(daemon: Daemon, settings: Settings) -> Report:
    endpoint = f"unix://{daemon.socket_path}"
    reporters = [
        Reporter("burst", rank=rank, local_rank=rank % 8, world_size=settings.reporters, gpu=0,
                 endpoint=endpoint, interval_seconds=3600, environ={}, run="burst-run")
        for rank in range(settings.reporters)
    ]
    try:
        for reporter in reporters:
            for _ in range(settings.steps_per_reporter):
                reporter.step(samples=32)
        barrier = threading.Barrier(len(reporters))

        def flush(reporter: Reporter) -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(10)
            reporter.flush()

        threads = [threading.Thread(target=flush, args=(r,), daemon=True) for r in reporters]
        for thread in threads:
            thread.start()
        joined_by = time.monotonic() + 15
        for thread in threads:
            thread.join(max(0.0, joined_by - time.monotonic()))
        expected = settings.reporters * settings.steps_per_reporter
        counted = 0.0
        deadline = time.monotonic() + 5
        scraped = False
        while time.monotonic() < deadline:
            reading = daemon.scrape()
            if reading is not None:
                scraped = True
                counted = metric_sum(reading[0], 'trainmon_training_steps_total{job="burst"')
                if counted >= expected:
                    break
            time.sleep(0.2)
        dropped = sum(reporter.dropped_reports for reporter in reporters)
    finally:
        for reporter in reporters:
            reporter.close(finished=False)
    return {
        (P5, "steps counted / expected"): (
            Figure(f"{counted:.0f} / {expected}", counted / expected) if scraped else NO_ANSWER),
        (P5, "reports dropped by the clients"): Figure(str(dropped), dropped),
    }


def job_lines(index: int, now: float) -> bytes:
    """A report and a run description of job ``hostile-<index>`` (rank 0 of 1)."""
    job, reporter_id = f"hostile-{index:05d}", f"hostile{index:05d}"
    buckets = [0] * STEP_BUCKET_COUNT
    buckets[4] = 10
    report = {
        "v": 1, "job": job, "rank": 0, "world_size": 1, "reporter_id": reporter_id,
        "steps": 10, "samples": 320, "step_seconds": 2.5, "data_wait_seconds": 0.5,
        "step_buckets": buckets, "run": f"run-{index}", "last_step_time": now,
    }
    description = {
        "v": 1, "type": "run", "job": job, "rank": 0, "reporter_id": reporter_id,
        "run": f"run-{index}", "started": now - 60, "world_size": 1,
        "config_hash": EMPTY_CONFIG_HASH,
    }
    return (json.dumps(description, separators=(",", ":")) + "\n"
            + json.dumps(report, separators=(",", ":")) + "\n").encode()


def probe_many_jobs(daemon: Daemon, settings: Settings) -> Report:
    """Probe 3; ends the daemon (SIGTERM)."""
    now = time.time()
    accepted = rejected = 0
    unanswered = 0
    deadline = time.monotonic() + settings.jobs_deadline_seconds
    sent_jobs = 0
    connection: http.client.HTTPConnection | None = None
    for first in range(0, settings.jobs, JOBS_PER_POST):
        if time.monotonic() > deadline:
            break
        last = min(settings.jobs, first + JOBS_PER_POST)
        body = b"".join(job_lines(index, now) for index in range(first, last))
        sent_jobs = last
        current = connection or http.client.HTTPConnection(
            "127.0.0.1", daemon.port, timeout=settings.post_timeout_seconds)
        connection = current
        try:
            current.request("POST", POST_PATH, body=body,
                            headers={"Content-Type": "application/x-ndjson"})
            response = current.getresponse()
            answer = json.loads(response.read() or b"{}")
            accepted += int(answer.get("accepted", 0))
            rejected += int(answer.get("rejected", 0))
            if response.will_close:
                current.close()
                connection = None
        except (OSError, http.client.HTTPException, ValueError):
            unanswered += 1
            current.close()
            connection = None
    if connection is not None:
        connection.close()
    counts = f"{accepted:,} / {rejected:,}"
    if unanswered:
        counts += f" ({unanswered} POSTs unanswered)"
    if sent_jobs < settings.jobs:
        counts += f" (stopped at {sent_jobs:,} jobs: {settings.jobs_deadline_seconds:.0f} s)"
    report: Report = {(P3, "lines accepted / rejected"): Figure(counts)}
    reading = daemon.scrape(timeout=settings.post_timeout_seconds)
    if reading is None:
        report[(P3, "series in /metrics afterwards")] = NO_ANSWER
        report[(P3, "scrape time (s)")] = NO_ANSWER
    else:
        exposition, seconds = reading
        series = series_count(exposition)
        report[(P3, "series in /metrics afterwards")] = Figure(f"{series:,}", series)
        report[(P3, "scrape time (s)")] = Figure(f"{seconds:.3f}", seconds)
    report[(P3, "SIGTERM to exit (s)")] = sigterm_to_exit(daemon, settings.exit_timeout_seconds)
    return report


def sigterm_to_exit(daemon: Daemon, timeout: float) -> Figure:
    if not daemon.alive():
        return Figure(f"exited before ({daemon.process.returncode})")
    started = time.perf_counter()
    daemon.process.send_signal(signal.SIGTERM)
    try:
        daemon.process.wait(timeout)
    except subprocess.TimeoutExpired:
        daemon.process.kill()
        daemon.process.wait()
        return Figure(f"no exit in {timeout:.0f} s", math.inf)
    seconds = time.perf_counter() - started
    return Figure(f"{seconds:.2f} (exit {daemon.process.returncode})", seconds)


def promtool_problems(exposition: str) -> tuple[Figure, list[str]]:
    """Probe 6: the number of lines ``promtool check metrics`` prints, and the lines."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return Figure("promtool missing"), []
    if not exposition:
        return NO_ANSWER, []
    completed = subprocess.run([promtool, "check", "metrics"], input=exposition,
                               capture_output=True, text=True, timeout=60, check=False)
    lines = (completed.stdout + completed.stderr).splitlines()
    if completed.returncode != 0 and not lines:
        lines = [f"promtool exited with {completed.returncode}"]
    return Figure(str(len(lines)), len(lines)), lines


# -- one daemon, every probe ---------------------------------------------------------


@dataclass
class Outcome:
    report: Report = field(default_factory=dict)
    lint: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def guarded(outcome: Outcome, daemon: Daemon, probe: str, run: Callable[[], Report]) -> None:
    """Run one probe; a probe that fails, or a daemon that is gone, gives "no answer"."""
    if not daemon.alive():
        outcome.report.update({(row.probe, row.figure): NO_ANSWER for row in ROWS
                               if row.probe == probe})
        return
    try:
        outcome.report.update(run())
    except Exception as error:  # a broken probe is reported, the others still run
        outcome.notes.append(f"{probe}: {type(error).__name__}: {error}")
    for row in ROWS:
        if row.probe == probe:
            outcome.report.setdefault((row.probe, row.figure), NO_ANSWER)


def run_probes(daemon: Daemon, settings: Settings) -> Outcome:
    """Every probe against ``daemon``, in an order that ends it (probe 3 last)."""
    outcome = Outcome()
    quiet, quiet_cpu = quiet_scrapes(daemon, settings)
    guarded(outcome, daemon, P1, lambda: probe_junk_post(daemon, settings, quiet))
    guarded(outcome, daemon, P2, lambda: probe_junk_datagrams(daemon, settings, quiet, quiet_cpu))
    guarded(outcome, daemon, P4, lambda: probe_slow_clients(daemon, settings))
    guarded(outcome, daemon, P5, lambda: probe_reporter_burst(daemon, settings))
    guarded(outcome, daemon, P3, lambda: probe_many_jobs(daemon, settings))
    figure, outcome.lint = promtool_problems(daemon.exposition)
    outcome.report[(P6, "lint problems")] = figure
    if daemon.alive():
        benchlib.stop(daemon.process)
    if daemon.process.returncode not in (0, -signal.SIGTERM, -signal.SIGKILL):
        outcome.notes.append(f"exit {daemon.process.returncode}: {daemon.log_tail(5)}")
    return outcome


def measure(exporter: Path, folder: Path, settings: Settings) -> Outcome:
    try:
        daemon = start_daemon(exporter, folder)
    except RuntimeError as error:
        outcome = Outcome(notes=[str(error)])
        outcome.report = {(row.probe, row.figure): NO_ANSWER for row in ROWS}
        return outcome
    try:
        return run_probes(daemon, settings)
    finally:
        benchlib.stop(daemon.process)


# -- the table -------------------------------------------------------------------------


def cell(row: Row, figure: Figure | None, mark: bool) -> str:
    if figure is None:
        return "—"
    if not mark or row.within is None or figure.value is None:
        return figure.text
    return f"{figure.text} {'✓' if row.within(figure.value) else '✗'}"


def title(probe: str, settings: Settings) -> str:
    """A probe's name in the table, with its size."""

    def count(number: float) -> str:
        return f"{number:,.0f}".replace(",", " ")

    sizes = {
        P2: f"64 KiB junk datagrams, 1/s for {settings.datagram_seconds} s",
        P3: f"{count(settings.jobs)} jobs with run descriptions",
        P4: f"{count(settings.slow_clients)} slow clients on the scraper's address, "
            f"{count(settings.slow_seconds)} s",
        P5: f"{settings.reporters} reporters at once",
    }
    return sizes.get(probe, probe)


def table(before: Outcome | None, after: Outcome, settings: Settings) -> list[str]:
    lines = ["| probe | figure | before | after | budget |", "| --- | --- | ---: | ---: | --- |"]
    for row in ROWS:
        key = (row.probe, row.figure)
        old = "skipped" if before is None else cell(row, before.report.get(key), mark=False)
        lines.append(f"| {title(row.probe, settings)} | {row.figure} | {old} | "
                     f"{cell(row, after.report.get(key), mark=True)} | {row.budget} |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default=BEFORE_REF, metavar="REF",
                        help=f"git ref of the before side (default {BEFORE_REF}); '' skips it")
    parser.add_argument("--quick", action="store_true",
                        help="short windows and 1 000 jobs (about a minute in all)")
    parser.add_argument("--datagram-seconds", type=int, help="probe 2's duration (one a second)")
    parser.add_argument("--slow-seconds", type=float, help="probe 4's duration")
    parser.add_argument("--jobs", type=int, help="probe 3's job count")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    for name in ("datagram_seconds", "slow_seconds", "jobs"):
        if getattr(args, name) is not None:
            settings = replace(settings, **{name: getattr(args, name)})

    after_tree = benchlib.ROOT / "exporter"
    notes: list[str] = []
    before: Outcome | None = None
    with tempfile.TemporaryDirectory(prefix="trainmon-hostile-") as folder, \
            before_tree(args.before) if args.before else contextlib.nullcontext() as old_tree:
        if not args.before:
            notes.append("before side skipped (--before '')")
        elif old_tree is None:
            notes.append(f"before side skipped: no commit {args.before} here (a shallow "
                         "clone, a source tarball, or no git)")
        elif imported_from(old_tree) != old_tree:
            notes.append(f"before side skipped: PYTHONPATH={old_tree} does not win over the "
                         f"installed trainmon ({imported_from(old_tree)})")
        else:
            before = measure(old_tree, Path(folder) / "before", settings)
        after = measure(after_tree, Path(folder) / "after", settings)

    qlen = Path("/proc/sys/net/unix/max_dgram_qlen").read_text().strip()
    print(f"before: {args.before or '—'}, after: the working tree; Python "
          f"{sys.version.split()[0]}, {os.cpu_count()} CPUs, loopback, "
          f"net.unix.max_dgram_qlen={qlen}{', --quick' if args.quick else ''}\n")
    print("\n".join(table(before, after, settings)))
    for side, outcome in (("before", before), ("after", after)):
        if outcome is None:
            continue
        notes += [f"{side}: {note}" for note in outcome.notes]
        if outcome.lint:
            notes.append(f"{side}: promtool check metrics:\n"
                         + "\n".join(f"    {line}" for line in outcome.lint))
    if notes:
        print("\n" + "\n".join(f"- {note}" for note in notes))


if __name__ == "__main__":
    main()
