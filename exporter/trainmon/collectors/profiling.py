"""Profiling collector: on-demand profiles of training ranks (``trainmon profile``).

A derived collector after the ledger: it wires the profile service
(``trainmon.profiling.service``) to the training collector (its store, the push
rule, the step socket's profile lines: ``TrainingCollector.accept_profiles``)
and to the ledger (traces beside its file, summaries into its records:
``RunRecorder.note_profile``), declares ``POST`` and ``GET /api/v1/profile``, and
exports the service's counters:

- ``trainmon_profile_requests_total{result}``: profile requests by outcome;
- ``trainmon_profile_results_total{result}``: what became of each rank asked, and
  the uploads refused;
- ``trainmon_profile_open_requests``, ``trainmon_profile_traces`` and
  ``trainmon_profile_trace_bytes``: requests under way, traces kept and their bytes;
- ``trainmon_profile_evicted_traces_total``: traces deleted to keep their bounds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from trainmon.collectors.ledger import LedgerCollector
from trainmon.collectors.training import TrainingCollector
from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import CounterMetricFamily, GaugeMetricFamily, Metric
from trainmon.core.routes import GetHandler, PushHandler
from trainmon.paths import profile_requests_path
from trainmon.profiling.requests import ProfileRequests
from trainmon.profiling.service import PROFILE_PATH, ProfileService
from trainmon.profiling.traces import TraceKeeper
from trainmon.section import setting
from trainmon.training.protocol import MAX_PROFILE_STEPS

#: The traces' folder, beside the ledger's file.
TRACES_FOLDER = "profiles"


@dataclass(frozen=True)
class ProfilingConfig:
    """The ``collectors.profiling`` section: on-demand profiles and their bounds
    (docs/security.md)."""

    enabled: bool = True
    #: Steps profiled when the request does not say, and the most it may ask.
    default_steps: int = field(default=5, metadata=setting(minimum=1,
                                                           maximum=MAX_PROFILE_STEPS))
    max_steps: int = field(default=50, metadata=setting(minimum=1, maximum=MAX_PROFILE_STEPS))
    #: Seconds a request waits for its ranks before what is missing counts as expired.
    request_timeout_seconds: float = field(default=300.0,
                                           metadata=setting(minimum=5, maximum=86400))
    #: Requests under way at once (one per job).
    max_open_requests: int = field(default=8, metadata=setting(minimum=1, maximum=1024))
    #: Largest trace kept, compressed and uncompressed (bytes).
    max_trace_bytes: int = field(default=64 << 20,
                                 metadata=setting(minimum=1 << 16, maximum=1 << 34))
    max_uncompressed_trace_bytes: int = field(
        default=1 << 30, metadata=setting(minimum=1 << 16, maximum=1 << 36))
    #: Traces kept per run, and in all, and their bytes in all (the oldest go first).
    max_traces_per_run: int = field(default=8, metadata=setting(minimum=1, maximum=10_000))
    max_traces: int = field(default=256, metadata=setting(minimum=1, maximum=1_000_000))
    max_total_bytes: int = field(default=2 << 30,
                                 metadata=setting(minimum=1 << 20, maximum=1 << 44))


class ProfilingCollector(Collector):
    """Serves and counts on-demand profiles."""

    name = "profiling"

    def __init__(self, service: ProfileService, training: TrainingCollector) -> None:
        self.service = service
        self._training = training

    def start(self) -> None:
        self.service.traces.start()
        path = self._training.socket_path
        self.service.requests.path = None if path is None else profile_requests_path(path)
        self._training.accept_profiles(self.service.take)

    def stop(self) -> None:
        self._training.accept_profiles(None)
        self.service.requests.close()
        self.service.traces.stop()

    def push_routes(self) -> Mapping[str, PushHandler]:
        return {PROFILE_PATH: self.service.handle_request}

    def get_routes(self) -> Mapping[str, GetHandler]:
        return {PROFILE_PATH: self.service.handle_status}

    def health(self) -> Mapping[str, object]:
        traces, size = self.service.traces.usage()
        return {"open_requests": self.service.requests.open_count(), "traces": traces,
                "trace_bytes": size, "directory": str(self.service.traces.directory)}

    def collect(self) -> Iterable[Metric]:
        requested, results = self.service.counts()
        yield _by_result(
            "trainmon_profile_requests_total",
            "Profile requests (trainmon profile) by outcome: accepted, or refused as "
            "forbidden (not the job's owner or root), not_found, invalid, conflict (one "
            "under way for the job), limit (collectors.profiling.max_open_requests).",
            requested)
        yield _by_result(
            "trainmon_profile_results_total",
            "What became of each rank a profile asked: stored, failed (in the training "
            "process), expired (no answer in time); and uploads refused: forbidden, "
            "unsolicited, busy, too_large, invalid_trace, write_error.",
            results)
        traces, size = self.service.traces.usage()
        yield _gauge("trainmon_profile_open_requests",
                     "Profile requests waiting for their ranks.",
                     self.service.requests.open_count())
        yield _gauge("trainmon_profile_traces", "Profile traces kept beside the ledger.",
                     traces)
        evicted = CounterMetricFamily(
            "trainmon_profile_evicted_traces_total",
            "Profile traces deleted to keep collectors.profiling.max_traces_per_run, "
            "max_traces and max_total_bytes (the oldest first).")
        evicted.add_metric([], self.service.traces.evicted)
        yield evicted
        yield _gauge("trainmon_profile_trace_bytes",
                     "Bytes of the profile traces kept beside the ledger (compressed).", size)


def _by_result(name: str, documentation: str, counts: Mapping[str, int]
               ) -> CounterMetricFamily:
    """A counter family with one series per ``result``."""
    family = CounterMetricFamily(name, documentation, labels=["result"])
    for result, count in counts.items():
        family.add_metric([result], count)
    return family


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation)
    family.add_metric([], value)
    return family


def _build(config: ProfilingConfig, wiring: Wiring) -> Collector:
    training = wiring.collector("training", TrainingCollector)
    ledger = wiring.collector("ledger", LedgerCollector)
    store = training.store
    recorder = ledger.recorder
    service = ProfileService(
        ProfileRequests(None, max_open=config.max_open_requests,
                        timeout_seconds=config.request_timeout_seconds),
        TraceKeeper(recorder.config.file.parent / TRACES_FOLDER,
                    max_trace_bytes=config.max_trace_bytes,
                    max_uncompressed_bytes=config.max_uncompressed_trace_bytes,
                    max_traces_per_run=config.max_traces_per_run,
                    max_traces=config.max_traces, max_total_bytes=config.max_total_bytes),
        job_of=store.job_ranks, writer=training.push_writer,
        trusted=lambda: store.trusted_writers, note=recorder.note_profile,
        default_steps=config.default_steps, max_steps=config.max_steps)
    return ProfilingCollector(service, training)


#: Derived, after the ledger it writes into; like the training store and the ledger, its
#: requests and traces survive a configuration reload.
ENTRY = CollectorEntry("profiling", ProfilingConfig, _build, derived=True,
                       requires=("training", "ledger"), survives_reload=True)
