"""``trainmon doctor``: a one-shot bottleneck report for a human (or ``--json``).

The command on top of the engine (``trainmon.diagnosis``), its report
(``trainmon.report``) and the run ledger's history (``trainmon.runs``); the
CLI wires it. Two ways to measure, both ending in the same
``trainmon.diagnosis`` pipeline the daemon runs:

- ``--url``: scrape a running daemon's ``/metrics`` about once a second for
  ``--seconds`` and parse the text with prometheus_client's parser;
- no ``--url``: the local daemon (``trainmon.local_daemon``: the listen
  address of ``--config`` / ``$TRAINMON_CONFIG``, else ``:19400``, asked on
  loopback) is read the same way when it answers, and a line on stderr says
  which daemon was read and why;
- no ``--url`` and no daemon answering: run the node collectors in this
  process (GPU sampler, training socket, network, InfiniBand, disk,
  attribution and whatever else the CLI's collector table builds — the
  platform, NUMA and NFS sources included; only ``LOCAL_EXCLUDED`` are left
  out) for ``--seconds`` and snapshot their families the same way. When a
  daemon holds the training socket but did not answer over HTTP (it listens
  elsewhere), the socket stays with it (sampled without it: the stderr line
  says so) and ``--url`` is the way to see step telemetry.

A daemon on this node (found, or ``--url`` on a local address) is read only
when the kernel names a trusted owner for its listening socket
(``trainmon.local_daemon.TrustedDaemon``: root, the service user, the caller,
``--trust-daemon-owner``); otherwise nothing is scraped, the report says why
and the exit code is 2. A line on stderr names the pid and uid read, and the
same socket must still listen after the last scrape. Everything printed that
came from the daemon or the ledger goes through ``trainmon.terminal``.

The report starts with the platform (instance, zone, spot state, a scheduled
reclaim), then goes GPU → storage → network, the order an engineer checks, and
gives each job's verdict with its evidence, its risk findings and the next
action (``--lang en|zh``). With the node's run ledger (``--ledger``, default
``collectors.ledger.path``; the demo's own ledger, ``demo_ledger``, when the
daemon read says it is ``trainmon serve --demo`` and no ledger is named), a
"Run history" line per job measures its latest run against the previous
comparable run (``trainmon.runs.baseline``: which and why, and whether it is
slower by more than ``contract.THROUGHPUT_REGRESSION_RATIO``) and names the
``trainmon compare`` to run; the run's checkpoint saves and goodput are that
run's; a compute verdict's next step names the top operators of the latest
profile of the job's latest run (``trainmon profile``; ``trainmon.runs.profiles``),
or, without one, the ``trainmon profile`` to run; once no job reports, the last
run of each job that ended within a day is listed (``trainmon.runs.regression``;
JSON: ``previous_runs``, ``recent_runs``). Exit codes: 0 nothing needs action (or, status ``ended``,
no GPU and no job now and the ledger shows how the recent jobs ended), 1 a
bottleneck was found (communication, storage or scheduling) or a critical or
warning risk (status ``risk``: a spot reclaim, an overdue checkpoint...), 2
nothing could be measured (daemon unreachable, no GPU and no job and no
recent run, or jobs without enough steps yet).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import requests

from trainmon import contract
from trainmon.core.collector import Collector
from trainmon.core.registry import CollectorRegistry
from trainmon.diagnosis.measure import MEASURED_SAMPLES
from trainmon.diagnosis.samples import ScrapedSamples, Window
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.ledger import RunRecord
from trainmon.local_daemon import DaemonTrust, LocalDaemon, TrustedDaemon, UntrustedDaemon, answers
from trainmon.report.document import report_json
from trainmon.report.history import History, LatestProfile, PastRun, RunHistory
from trainmon.report.messages import reason_text
from trainmon.report.model import Source, build_report, unmeasured_report, with_history
from trainmon.report.render import render_text
from trainmon.runs.baseline import rate
from trainmon.runs.profiles import latest_profile, top_operators
from trainmon.runs.regression import RECENT_SECONDS, JobHistory, read_history
from trainmon.runs.render import largest_loss, top_verdict
from trainmon.runs.view import RunView, number
from trainmon.terminal import clean, escape_json

log = logging.getLogger(__name__)

#: Collectors that ``doctor`` never runs in process: the verdict itself, and the
#: cloud puller (its API calls are rate-limited and not about this node).
LOCAL_EXCLUDED = ("diagnosis", "tencent")
#: The samples ``doctor`` keeps of each snapshot: the engine's, and the build (whether the
#: daemon is the demo).
DOCTOR_SAMPLES = MEASURED_SAMPLES | {"trainmon_build_info"}

Sleep = Callable[[float], None]


class MeasurementError(Exception):
    """The source could not be read (daemon unreachable, not Prometheus text...): the
    English text, and its key in ``messages.REASONS`` with the values to word it."""

    def __init__(self, code: str, target: str, detail: str) -> None:
        self.code = code
        self.values = (("target", target), ("detail", detail))
        super().__init__(reason_text(code, "en", dict(self.values)))


@dataclass(frozen=True)
class DoctorOptions:
    """The command line of ``trainmon doctor``."""

    #: A daemon to read (``host:port`` or a URL); None: sample this node.
    url: str | None = None
    #: How long to measure (seconds).
    seconds: float = 10.0
    #: Time between two snapshots (seconds).
    interval_seconds: float = 1.0
    lang: str = "en"
    json: bool = False
    #: HTTP timeout of one scrape (seconds).
    timeout_seconds: float = 5.0
    #: The node's run ledger, for the run history and the recent jobs' last runs; None:
    #: none.
    ledger: Path | None = None
    #: The ledger read instead when the daemon read is the demo (``trainmon serve
    #: --demo``: ``trainmon_build_info{mode="demo"}``), which keeps its runs apart; None:
    #: ``ledger`` whatever the daemon (a ledger given on the command line or configured).
    demo_ledger: Path | None = None
    #: Without ``url``: the daemon expected on this node, read when it answers.
    local_daemon: LocalDaemon | None = None
    #: Whose daemon on this node is read; None: ``DaemonTrust.default()``.
    trust: DaemonTrust | None = None


def run_doctor(
    options: DoctorOptions,
    config: DiagnosisConfig,
    local_collectors: Callable[[], Sequence[Collector]],
    out: TextIO,
    *,
    session: requests.Session | None = None,
    sleep: Sleep = time.sleep,
    err: TextIO | None = None,
    wall_clock: Callable[[], float] = time.time,
) -> int:
    """Measure, diagnose, print the report (text or JSON); return the exit code.

    ``err`` gets the line that says which daemon was found (or none), when
    ``options.local_daemon`` was looked for, and which process was read (or why
    not), and the line naming the demo's ledger when that is read. ``wall_clock``
    dates the ledger's runs ("finished 2 h ago")."""
    def note(line: str) -> None:
        if err is not None:
            err.write(clean(line) + "\n")

    url = options.url
    if url is None and options.local_daemon is not None:
        url, found = find_daemon(options.local_daemon, session)
        note(f"trainmon doctor: {found}")
    source: Source = {"kind": "url", "url": metrics_url(url)} if url else {"kind": "local"}
    window: Window | None = None
    try:
        if url:
            daemon = TrustedDaemon.check(url, options.trust or DaemonTrust.default())
            note(f"trainmon: reading {daemon.describe()}")
            window = scrape_url(url, options.seconds, options.interval_seconds,
                                timeout=options.timeout_seconds, session=session, sleep=sleep)
            daemon.confirm()
        else:
            window = sample_collectors(local_collectors(), options.seconds,
                                       options.interval_seconds, sleep=sleep)
    except UntrustedDaemon as error:
        note(f"trainmon doctor: {error}")
        report = unmeasured_report(source, str(error), options.lang, code="untrusted",
                                   values=(("detail", str(error)),))
    except MeasurementError as error:
        report = unmeasured_report(source, str(error), options.lang, code=error.code,
                                   values=error.values)
    else:
        assert window is not None
        report = build_report(window, config, source, options.lang)
    ledger = options.ledger
    if options.demo_ledger is not None and window is not None and is_demo(window):
        ledger = options.demo_ledger
        note(f"trainmon doctor: the daemon is the demo: reading its ledger {ledger}")
    if ledger is not None:
        report = with_history(report, ledger_history(
            ledger, [verdict.job for verdict in report.verdicts], wall_clock()))
    if options.json:
        out.write(escape_json(json.dumps(report_json(report), indent=2,
                                         ensure_ascii=False)) + "\n")
    else:
        out.write(render_text(report))
    return report.exit_code


def is_demo(window: Window) -> bool:
    """The window was read from ``trainmon serve --demo``."""
    return any(dict(labels).get("mode") == "demo"
               for labels in window.latest("trainmon_build_info"))


def ledger_history(path: Path, jobs: Sequence[str], now: float) -> History | None:
    """The ledger's part of the report (``trainmon.runs.regression``) as the report's
    facts; None without a usable ledger."""
    found = read_history(path, jobs, now)
    if found is None:
        return None
    return History(
        ledger=str(path), now=now, threshold=contract.THROUGHPUT_REGRESSION_RATIO,
        lookback_seconds=contract.THROUGHPUT_BEST_LOOKBACK_SECONDS,
        recent_seconds=RECENT_SECONDS,
        live=tuple(_run_history(entry) for entry in found.live),
        ended=tuple(_run_history(entry) for entry in found.ended))


def _run_history(entry: JobHistory) -> RunHistory:
    baseline = entry.baseline
    return RunHistory(
        run=past_run(entry.run),
        baseline=None if baseline is None else past_run(baseline.record),
        baseline_finished=baseline is not None and baseline.finished,
        change_ratio=entry.change_ratio, slower=entry.slower,
        fastest=None if entry.fastest is None else past_run(entry.fastest),
        fastest_change_ratio=entry.fastest_change_ratio)


def past_run(record: RunRecord) -> PastRun:
    """A ledger record as the report shows it."""
    summary = record.summary
    view = RunView.from_records([record])
    verdict = top_verdict(summary)
    loss = largest_loss(summary)
    checkpoints = number(summary.get("checkpoints"))
    profile = latest_profile(summary)
    return PastRun(
        record=record, samples_per_second=rate(record),
        verdict=None if verdict == "-" else verdict,
        goodput_ratio=number(summary.get("goodput_ratio")),
        largest_loss=None if loss is None else loss[0],
        largest_loss_share=None if loss is None else loss[1],
        checkpoint_saves=None if checkpoints is None else int(checkpoints),
        duration_seconds=view.duration_seconds,
        profile=None if profile is None else LatestProfile(profile, *top_operators(profile)))


def find_daemon(daemon: LocalDaemon, session: requests.Session | None = None
                ) -> tuple[str | None, str]:
    """The local daemon's URL when it answers (else None), and a sentence saying so."""
    if daemon.url is not None and answers(daemon.url, session):
        return daemon.url, f"read the daemon at {daemon.url} ({daemon.origin})"
    if daemon.url is None:
        note = f"the daemon's port is chosen when it starts ({daemon.origin})"
    else:
        note = f"no daemon answered at {daemon.url} ({daemon.origin})"
    if daemon.socket is not None:
        return None, (f"{note}; a daemon holds {daemon.socket} but is listening elsewhere: "
                      "give --url to read it; sampling this node without its step socket")
    return None, f"{note}; sampling this node"


def scrape_url(
    url: str,
    seconds: float,
    interval: float,
    *,
    timeout: float = 5.0,
    session: requests.Session | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    sleep: Sleep = time.sleep,
) -> Window:
    """Snapshots of ``url``'s ``/metrics`` every ``interval`` for ``seconds``."""
    target = metrics_url(url)
    http = session if session is not None else requests.Session()

    def snapshot() -> ScrapedSamples:
        return read_metrics(http, target, timeout=timeout, at=clock(), wall=wall_clock())

    return _sample(snapshot, seconds, interval, clock, sleep)


def read_metrics(http: requests.Session, target: str, *, timeout: float, at: float,
                 wall: float, names: frozenset[str] = DOCTOR_SAMPLES) -> ScrapedSamples:
    """One snapshot of the Prometheus text at ``target`` (a daemon's ``/metrics``), its
    samples of ``names``, taken at ``at`` (monotonic) and ``wall`` (Unix seconds);
    ``MeasurementError`` when it cannot be read or is not Prometheus text."""
    try:
        response = http.get(target, timeout=timeout, headers={"Accept": "text/plain"})
        response.raise_for_status()
        return ScrapedSamples.from_text(response.text, at, wall, names)
    except requests.RequestException as error:
        raise MeasurementError("cannot_read", target, request_error_text(error)) from None
    except ValueError as error:
        raise MeasurementError("not_prometheus", target, str(error)) from None


def request_error_text(error: requests.RequestException) -> str:
    """The useful end of a requests error (``[Errno 111] Connection refused``)."""
    text = str(error)
    match = re.search(r"\[Errno -?\d+\][^'\")]*", text)
    return match.group(0).strip() if match else text[:300]


def metrics_url(url: str) -> str:
    """``http://host:19400`` → ``http://host:19400/metrics``; a path given is kept."""
    if "://" not in url:
        url = f"http://{url}"
    scheme, _, rest = url.partition("://")
    return url if "/" in rest.rstrip("/") else f"{scheme}://{rest.rstrip('/')}/metrics"


def sample_collectors(
    collectors: Sequence[Collector],
    seconds: float,
    interval: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    sleep: Sleep = time.sleep,
) -> Window:
    """Start ``collectors`` here, snapshot them every ``interval`` for ``seconds``, stop them.

    They run in a ``CollectorRegistry`` as in the daemon: one that is absent or
    fails is reported (logged) and the report goes on without it.
    """
    registry = CollectorRegistry(
        [collector for collector in collectors if collector.name not in LOCAL_EXCLUDED]
    )
    registry.start()

    def snapshot() -> ScrapedSamples:
        return ScrapedSamples.from_families(
            registry.collect(), clock(), wall_clock(), DOCTOR_SAMPLES
        )

    try:
        return _sample(snapshot, seconds, interval, clock, sleep)
    finally:
        registry.stop()


def _sample(
    snapshot: Callable[[], ScrapedSamples], seconds: float, interval: float,
    clock: Callable[[], float], sleep: Sleep,
) -> Window:
    snapshots = [snapshot()]
    deadline = snapshots[0].at + seconds
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            break
        sleep(min(interval, remaining))
        snapshots.append(snapshot())
    return Window(snapshots)


