"""Training collector: per-job, per-rank step telemetry pushed by training processes.

Reports arrive on the unix datagram socket (``SocketReceiver``) and through
``POST /api/v1/steps`` (``StepPushHandler``, registered via ``push_routes()``);
both feed one ``TrainingStore``. ``collect()`` only reads a snapshot of it.
Metric names follow the contract; ``docs/metrics.md`` ("Training") documents
each one.

Checkpoints: the store keeps each rank's counts and last checkpoint; at
scrape time the collector takes each job's most recent checkpoint path and
asks ``trainmon.node.mounts.MountResolver`` (cached mount tables, in the
reporting process's mount namespace) what storage it is on, so the push path
never touches ``/proc``.

Owners: every series of a job carries ``owner`` beside ``job``, the writer
identity that holds the job in the store (``uid:<n>``, ``token:<name>``,
``local``; ``trainmon.training.writers``); on one node a job has one owner,
across nodes ``(job, owner)`` is what the rules aggregate (docs/security.md,
"Owners across nodes").

Runs: ``trainmon_training_run_info{job,owner,run,config_hash}`` and
``trainmon_training_run_start_timestamp_seconds{job,owner,run}`` come from the run
descriptions in the store (one series per job and run, however many ranks
describe it; a run whose description says it ended is no longer live). The
run ledger's recorder (``trainmon.ledger.recorder``, wired by
``trainmon.collectors.ledger``) reads the same store and exports
``trainmon_training_run_changes_info``, which needs the ledger's history.

Process groups: a report's ``comm_groups`` (communication per dp, tp, pp...
group of a DeviceMesh) become ``trainmon_training_group_*{job,owner,rank,group}``, the
store's monotonic totals per group (``_GroupFamilies``); a stalled collective's
group is the ``group`` label of ``trainmon_training_stall_info``.

Ended ranks: a rank whose run said it ended (its description's ``ended``;
``Reporter.close()`` sends it after the final totals) keeps its series, with
those final totals, until the TTL, and gets
``trainmon_training_rank_end_timestamp_seconds{job,owner,rank}``: the diagnosis
and ``doctor`` leave it out, so an ended job is not taken for a live one that
stopped stepping. Which run a rank is in: that of its latest report, else
that of its description; the first report of its next run makes it live again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pwd
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from trainmon.contract import STEP_SECONDS_BOUNDS
from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from trainmon.core.routes import PushHandler, PushRequest, PushResponse
from trainmon.logthrottle import LogThrottle
from trainmon.node.mounts import MountResolver, PathStorage, Viewer
from trainmon.paths import default_socket_path
from trainmon.section import Auto, Section, setting
from trainmon.training.protocol import STEPS_PATH, ProfileReport, ReportError
from trainmon.training.receiver import (
    ProfileSink,
    SocketReceiver,
    StepPushHandler,
    read_tokens,
)
from trainmon.training.report_fields import CommGroup
from trainmon.training.stalls import frame_text
from trainmon.training.store import LastCheckpoint, RankView, TrainingStore, TrainingStoreView
from trainmon.training.writers import LOCAL_WRITER, ROOT_WRITER, uid_writer, writer_uid

log = logging.getLogger(__name__)

_BUCKET_BOUNDS = [repr(bound) for bound in STEP_SECONDS_BOUNDS] + ["+Inf"]
#: The labels of a job: its name and its owner, the writer identity that holds the job on
#: this node (``trainmon.training.writers``: ``uid:<n>``, ``token:<name>``, ``local``),
#: so that rules across nodes keep one user's series of a job name apart from another's
#: (docs/security.md, "Owners across nodes").
_JOB = ["job", "owner"]
_RANK = [*_JOB, "rank"]


#: A writer identity in ``trusted_writers`` (``trainmon.training.writers``).
_WRITER = re.compile(r"uid:[0-9]{1,10}|token:[A-Za-z0-9_.-]{1,64}")


def _file_mode(section: Section, key: str, default: int) -> int:
    """An octal permission string such as ``"0660"`` (quoted: YAML reads 0660 as a number)."""

    def octal(text: str) -> int:
        if not re.fullmatch(r"0?[0-7]{3}", text):
            raise ValueError(f"expected octal permission bits such as \"0660\", got {text!r}")
        return int(text, 8)

    return section.parsed(key, f"{default:04o}", octal)


def _writers(writers: tuple[str, ...]) -> tuple[str, ...]:
    for writer in writers:
        if not _WRITER.fullmatch(writer):
            raise ValueError(f"expected uid:<number> or token:<name>, got {writer!r}")
    return writers


@dataclass(frozen=True)
class TrainingConfig:
    """The ``collectors.training`` section: the step intake and its caps (docs/security.md)."""

    enabled: bool = True
    #: None: HTTP only. Default ``/run/trainmon/steps.sock`` for root (and the
    #: service user owning ``/run/trainmon``), else under ``$XDG_RUNTIME_DIR``
    #: (``trainmon.paths``).
    socket: Path | None = field(default_factory=default_socket_path)
    token_file: Path | None = None
    ttl_seconds: float = field(default=300.0, metadata=setting(minimum=1, maximum=86400))
    max_jobs: int = field(default=64, metadata=setting(minimum=1, maximum=100_000))
    max_ranks_per_job: int = field(default=1024, metadata=setting(minimum=1, maximum=1_000_000))
    #: Permission bits of the socket file; 0o666 lets any local user send (as
    #: loopback HTTP already does); use 0o660 with a shared group to restrict.
    socket_mode: int = field(default=0o666, metadata=setting(read=_file_mode))
    #: Requested SO_RCVBUF of the socket (bytes); Linux caps it at rmem_max
    #: unless the daemon may use SO_RCVBUFFORCE (root / CAP_NET_ADMIN).
    receive_buffer_bytes: int = field(
        default=4 << 20, metadata=setting(minimum=4096, maximum=1 << 30))
    #: Span of trainmon_training_data_wait_ratio (seconds).
    window_seconds: float = field(default=60.0, metadata=setting(minimum=1, maximum=3600))
    #: Longest accepted job and phase name (characters).
    max_label_length: int = field(default=128, metadata=setting(minimum=8, maximum=1024))
    #: Jobs one writer may hold at once (its oldest makes room for its next).
    max_jobs_per_writer: int = field(default=16, metadata=setting(minimum=1, maximum=100_000))
    #: Ranks one untrusted writer may report at once, over all its jobs (its further
    #: new ranks are refused, ``limit``, until some expire).
    max_ranks_per_writer: int = field(default=256, metadata=setting(minimum=1,
                                                                    maximum=1_000_000))
    #: Distinct runs (job, run id) one untrusted writer's ranks and descriptions may
    #: name at once.
    max_runs_per_writer: int = field(default=32, metadata=setting(minimum=1, maximum=100_000))
    #: Bytes of run descriptions one untrusted writer may hold at once
    #: (``trainmon.training.store.description_size``).
    max_description_bytes_per_writer: int = field(
        default=1 << 20, metadata=setting(minimum=64 << 10, maximum=1 << 30))
    #: Writers (``uid:N``, ``token:NAME``) that may report for any job, beside
    #: root and the daemon itself (docs/security.md).
    trusted_writers: tuple[str, ...] = field(default=(), metadata=setting(parse=_writers))
    #: Loopback HTTP clients without a token, identified by the kernel as their
    #: local user: ``auto`` allows them while no token_file is set.
    loopback_without_token: bool | Auto = "auto"


class TrainingCollector(Collector):
    """Receives step reports and exports them as ``trainmon_training_*`` families."""

    name = "training"

    def __init__(
        self,
        config: TrainingConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        proc_root: Path = Path("/proc"),
        sys_root: Path = Path("/sys"),
    ) -> None:
        self._config = config
        self._mounts = MountResolver(proc_root, sys_root, clock=clock)
        self._mount_errors = LogThrottle()
        self.store = TrainingStore(
            **_store_limits(config), window_seconds=config.window_seconds,
            clock=clock, wall_clock=wall_clock,
        )
        # Until start() has read the token file, only loopback clients the kernel
        # names may push, and only where the configuration lets them without a token.
        self._push = StepPushHandler(
            self.store, loopback_without_token=config.loopback_without_token,
            max_label_length=config.max_label_length,
        )
        self._receiver: SocketReceiver | None = None
        #: Where profile lines go (``accept_profiles``: the profiling collector).
        self._profiles: ProfileSink | None = None
        self._socket_error: str | None = None
        self._token_error: str | None = None

    def start(self) -> None:
        """Read the token file, then bind the socket.

        Neither failure stops the collector: an unreadable token file leaves
        HTTP pushes open to the loopback clients the kernel names (unless
        ``loopback_without_token`` is false); a socket that cannot be bound
        (no permission on ``/run/trainmon``...) leaves HTTP only. Both are
        logged and shown in ``/healthz``; the socket also in
        ``trainmon_training_socket_up``.
        """
        config = self._config
        self._take_tokens(config, "only loopback clients may push steps")
        if config.socket is None:
            return
        receiver = SocketReceiver(
            config.socket,
            self.store,
            mode=config.socket_mode,
            receive_buffer_bytes=config.receive_buffer_bytes,
            max_label_length=config.max_label_length,
            profiles=self._take_profile,
        )
        try:
            receiver.start()
        except OSError as error:
            self._socket_error = f"{error.strerror or error} ({config.socket})"
            log.error(
                "cannot receive training steps on unix://%s: %s; HTTP %s still works",
                config.socket, error.strerror or error, STEPS_PATH,
            )
            return
        self._receiver = receiver

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.stop()
            self._receiver = None

    def reconfigure(self, config: TrainingConfig) -> None:
        """A configuration reload (``trainmon.reload``), the keys of ``LIVE_KEYS``: the
        token file is read again (its path and content may have changed),
        ``loopback_without_token`` taken, and the store's caps, TTL and trusted writers
        changed in place (``TrainingStore.reconfigure``: what it holds stays); the socket
        and its settings stay as started. An unreadable token file keeps the tokens read
        before."""
        self._config = dataclasses.replace(
            self._config, **{key: getattr(config, key) for key in LIVE_KEYS})
        self.store.reconfigure(**_store_limits(self._config))
        self._take_tokens(self._config, "the tokens read before stay in use")

    def _take_tokens(self, config: TrainingConfig, otherwise: str) -> None:
        """The HTTP push rule of ``config``: its token file's tokens, or none; when the
        file cannot be read, the rule in force stays (``otherwise`` says which)."""
        tokens = None
        if config.token_file is not None:
            try:
                tokens = read_tokens(config.token_file)
            except (OSError, ValueError, UnicodeDecodeError) as error:
                self._token_error = f"cannot read token_file {config.token_file}: {error}"
                log.error("%s; %s", self._token_error, otherwise)
                return
        self._token_error = None
        self._push = StepPushHandler(
            self.store, tokens=tokens, loopback_without_token=config.loopback_without_token,
            max_label_length=config.max_label_length,
        )

    def accept_profiles(self, sink: ProfileSink | None) -> None:
        """Hand the profile lines (and their traces) of the socket to ``sink`` from
        now on; None: refuse them."""
        self._profiles = sink

    def _take_profile(self, report: ProfileReport, descriptor: int | None,
                      identity: str) -> None:
        sink = self._profiles
        if sink is None:
            if descriptor is not None:
                os.close(descriptor)
            raise ReportError("invalid_field", "this daemon takes no profiles")
        sink(report, descriptor, identity)

    def push_writer(self, request: PushRequest) -> tuple[str | None, PushResponse | None]:
        """Who an HTTP request writes as by the push rule (``StepPushHandler.writer``)."""
        return self._push.writer(request)

    @property
    def socket_path(self) -> Path | None:
        """The socket's path while it is bound."""
        return None if self._receiver is None else self._receiver.path

    @property
    def socket_endpoint(self) -> str | None:
        """``unix://…`` for clients in this process (the demo jobs), while the socket is bound."""
        if self._receiver is None or not self._receiver.listening:
            return None
        return f"unix://{self._receiver.path}"

    def handle_push(self, request: PushRequest) -> PushResponse:
        """The ``POST /api/v1/steps`` handler."""
        return self._push(request)

    def push_routes(self) -> Mapping[str, PushHandler]:
        return {STEPS_PATH: self.handle_push}

    def health(self) -> Mapping[str, object]:
        snapshot_counts = self.store.counts()
        state: dict[str, object] = {
            "socket": str(self._config.socket) if self._config.socket else None,
            "socket_listening": self._receiver is not None and self._receiver.listening,
            **snapshot_counts,
        }
        if self._receiver is not None:
            state["receive_buffer_bytes"] = self._receiver.receive_buffer_bytes
            state["max_dgram_qlen"] = self._receiver.max_queued_datagrams
        if self._socket_error is not None:
            state["socket_error"] = self._socket_error
        if self._token_error is not None:
            state["token_error"] = self._token_error
        if self._config.socket is not None and not state["socket_listening"]:
            # HTTP pushes still work, but every report sent to the socket is lost
            state["state"] = "degraded"
            state["error"] = self._socket_error or (
                f"the training socket {self._config.socket} is not being drained")
        return state

    def collect(self) -> Iterable[Metric]:
        snapshot = self.store.snapshot()
        yield from _rank_families(snapshot)
        yield from self._checkpoint_families(snapshot)
        yield from _run_families(snapshot)
        yield from self._intake_families(snapshot)

    def storage_of(self, path: str, pid: int | None, sender_pid: int | None,
                   owner: str = LOCAL_WRITER) -> PathStorage:
        """The storage of a path a training process of writer ``owner`` named (its mount
        namespace when the kernel vouches for the sender), looked up with that writer's
        permissions (``path_viewer``); ``unknown`` when it cannot be told."""
        return self._storage(path, pid, sender_pid, owner)

    def _checkpoint_families(self, snapshot: TrainingStoreView) -> Iterable[Metric]:
        count = CounterMetricFamily(
            "trainmon_training_checkpoints_total",
            "Checkpoints the rank reported saving (Reporter.checkpoint); only ranks that "
            "report checkpoints.",
            labels=_RANK,
        )
        seconds = CounterMetricFamily(
            "trainmon_training_checkpoint_seconds_total",
            "Seconds the rank spent saving checkpoints; only ranks that report checkpoints.",
            labels=_RANK,
        )
        last_time = GaugeMetricFamily(
            "trainmon_training_last_checkpoint_timestamp_seconds",
            "Unix time at which the job's latest checkpoint on this node (any rank) completed.",
            labels=_JOB,
        )
        last_duration = GaugeMetricFamily(
            "trainmon_training_last_checkpoint_duration_seconds",
            "Seconds the job's latest checkpoint on this node took to save "
            "(the mean when a report covered several).",
            labels=_JOB,
        )
        storage = GaugeMetricFamily(
            "trainmon_training_checkpoint_storage_info",
            "Where the job's latest checkpoint path lives: its mount point, filesystem type "
            "and storage kind (local_disk, cloud_disk, network_fs, object_store, ephemeral, "
            "unknown); always 1.",
            labels=[*_JOB, "mountpoint", "fstype", "storage"],
        )
        latest: dict[tuple[str, str], LastCheckpoint] = {}
        latest_path: dict[tuple[str, str], tuple[LastCheckpoint, RankView]] = {}
        for view in snapshot.ranks:
            totals = view.totals
            labels = [view.job, view.owner, str(view.rank)]
            if totals.checkpoints is not None:
                count.add_metric(labels, totals.checkpoints)
                seconds.add_metric(labels, totals.checkpoint_seconds or 0.0)
            last = view.last_checkpoint
            if last is None:
                continue
            job = (view.job, view.owner)
            if job not in latest or last.time > latest[job].time:
                latest[job] = last
            if last.path is not None and (
                job not in latest_path or last.time > latest_path[job][0].time
            ):
                latest_path[job] = (last, view)
        for job, last in latest.items():
            last_time.add_metric(list(job), last.time)
            last_duration.add_metric(list(job), last.duration_seconds)
        for job, (last, view) in latest_path.items():
            assert last.path is not None
            where = self._storage(last.path, view.pid, view.sender_pid, view.owner)
            storage.add_metric([*job, where.mountpoint, where.fstype, where.storage], 1.0)
        return [count, seconds, last_time, last_duration, storage]

    def _storage(self, path: str, pid: int | None, sender_pid: int | None,
                 owner: str) -> PathStorage:
        """The storage of ``path``; ``unknown`` (logged, rate-limited) when sysfs or
        procfs cannot be read, so one unreadable file never fails the scrape."""
        try:
            where = self._mounts.resolve(path, pid, sender_pid=sender_pid,
                                         viewer=path_viewer(owner))
        except OSError as error:
            if self._mount_errors.allow("resolve", str(error)):
                log.warning("cannot tell the storage of checkpoint path %s: %s", path, error)
            return PathStorage("", "", "unknown")
        self._mount_errors.forget("resolve")
        return where

    def _intake_families(self, snapshot: TrainingStoreView) -> Iterable[Metric]:
        yield _counter_by(
            "trainmon_training_reports_total",
            "Step reports accepted, by transport (unix socket or http).",
            "transport", snapshot.accepted,
        )
        yield _counter_by(
            "trainmon_training_rejected_reports_total",
            "Step reports (lines, datagrams or bodies) refused, by reason; see docs/protocol.md.",
            "reason", snapshot.rejected,
        )
        yield _counter_by(
            "trainmon_training_evicted_ranks_total",
            "Ranks dropped with their series: silent past the TTL, or least recently "
            "updated when max_jobs / max_ranks_per_job was reached.",
            "reason", snapshot.evicted,
        )
        if self._config.socket is not None:
            up = GaugeMetricFamily(
                "trainmon_training_socket_up",
                "1 while the unix datagram socket for step reports is bound and drained.",
            )
            up.add_metric([], 1.0 if self._receiver is not None and self._receiver.listening
                          else 0.0)
            yield up


def _run_families(snapshot: TrainingStoreView) -> Iterable[Metric]:
    info = GaugeMetricFamily(
        "trainmon_training_run_info",
        "A run of the job live on this node, with the hash of its configuration; always 1. "
        "Descriptions are in the run ledger (trainmon runs), not in labels.",
        labels=[*_JOB, "run", "config_hash"],
    )
    started = GaugeMetricFamily(
        "trainmon_training_run_start_timestamp_seconds",
        "Unix time at which the run started (its earliest rank on this node).",
        labels=[*_JOB, "run"],
    )
    ended = GaugeMetricFamily(
        "trainmon_training_rank_end_timestamp_seconds",
        "Unix time at which the rank's run said it ended (its run description's ended); "
        "the rank's series stay, with their final totals, until the TTL; absent while live.",
        labels=_RANK,
    )
    for view in snapshot.ranks:
        end = _run_end(view, snapshot)
        if end is not None:
            ended.add_metric([view.job, view.owner, str(view.rank)], end)
    runs: dict[tuple[str, str, str], tuple[str, float]] = {}
    for (job, _), kept in sorted(snapshot.descriptions.items()):
        description = kept.description
        if description.ended is not None:
            continue
        key = (job, kept.owner, description.run)
        known = runs.get(key)
        if known is None or description.started < known[1]:
            runs[key] = (description.config_hash, description.started)
    for (job, owner, run), (config_hash, start) in sorted(runs.items()):
        info.add_metric([job, owner, run, config_hash], 1.0)
        started.add_metric([job, owner, run], start)
    return [info, started, ended]


def _run_end(view: RankView, snapshot: TrainingStoreView) -> float | None:
    """When the run the rank is in said it ended (None while it is live): its
    description's arrival, when that description is of the run its latest report
    names (or that names none); else, when the store remembers that run ended (the
    rank's next run described before its first report), the rank's last report."""
    described = snapshot.descriptions.get((view.job, view.rank))
    if described is not None and view.run in (None, described.description.run):
        return described.received if described.description.ended is not None else None
    ended = None if view.run is None else snapshot.ended_runs.get((view.job, view.run))
    if ended is not None and ended.owner == view.owner:
        return view.last_report_time
    return None


def _counter_by(
    name: str, documentation: str, label: str, counts: Mapping[str, int]
) -> CounterMetricFamily:
    """A counter family with one sample per ``label`` value of ``counts``."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value, count in counts.items():
        family.add_metric([value], count)
    return family


def _rank_families(snapshot: TrainingStoreView) -> Iterable[Metric]:
    steps = CounterMetricFamily(
        "trainmon_training_steps_total", "Training steps completed by the rank.", labels=_RANK
    )
    samples = CounterMetricFamily(
        "trainmon_training_samples_total", "Training samples processed by the rank.", labels=_RANK
    )
    step_seconds = HistogramMetricFamily(
        "trainmon_training_step_seconds",
        "Duration of training steps (end of one step() to the next), in seconds.",
        labels=_RANK,
    )
    data_wait = CounterMetricFamily(
        "trainmon_training_data_wait_seconds_total",
        "Seconds the rank's training loop was blocked waiting for the next batch.",
        labels=_RANK,
    )
    phases = CounterMetricFamily(
        "trainmon_training_phase_seconds_total",
        "Seconds spent in named phases of steps (e.g. comm, checkpoint).",
        labels=[*_RANK, "phase"],
    )
    ratio = GaugeMetricFamily(
        "trainmon_training_data_wait_ratio",
        "Data wait divided by step time over the configured window (0-1); "
        "alerts should use the counters.",
        labels=_RANK,
    )
    last_step = GaugeMetricFamily(
        "trainmon_training_last_step_timestamp_seconds",
        "Unix time at which the rank's last step ended.",
        labels=_RANK,
    )
    last_report = GaugeMetricFamily(
        "trainmon_training_last_report_timestamp_seconds",
        "Unix time of the rank's latest accepted report; clients report about once a "
        "second while alive, stepping or not, so this tells a stalled job from a dead one.",
        labels=_RANK,
    )
    info = GaugeMetricFamily(
        "trainmon_training_rank_info",
        "Joins a rank to the GPU (NVML index, empty if unknown) and process it runs on; always 1.",
        labels=[*_RANK, "gpu", "pid"],
    )
    world_size = GaugeMetricFamily(
        "trainmon_training_world_size",
        "Number of ranks the job's processes report being part of.",
        labels=_JOB,
    )
    dropped = CounterMetricFamily(
        "trainmon_training_dropped_reports_total",
        "Reports the rank's client could not deliver (daemon down, socket full), "
        "as told by its later reports.",
        labels=_RANK,
    )
    resets = CounterMetricFamily(
        "trainmon_training_reporter_resets_total",
        "Reporter restarts (new reporter_id or totals going backwards) absorbed "
        "into the rank's monotonic counters.",
        labels=_RANK,
    )
    comm = CounterMetricFamily(
        "trainmon_training_comm_seconds_total",
        "Seconds with a collective of the job in flight, measured inside the rank "
        "(Reporter.instrument or add_comm); only ranks that measure it.",
        labels=_RANK,
    )
    comm_exposed = CounterMetricFamily(
        "trainmon_training_comm_exposed_seconds_total",
        "Seconds the rank waited for communication after its own compute was done "
        "(the part of comm_seconds not overlapped with compute); only ranks that measure it.",
        labels=_RANK,
    )
    comm_bytes = CounterMetricFamily(
        "trainmon_training_comm_bytes_total",
        "Bytes of the collectives' buffers the rank contributed; only ranks that measure it.",
        labels=_RANK,
    )
    stalled = GaugeMetricFamily(
        "trainmon_training_stalled",
        "1 while the rank's client reports its steps stopped (its stall watchdog: no step "
        "for 10 typical steps and at least 10 s, docs/protocol.md), else 0.",
        labels=_RANK,
    )
    stall_since = GaugeMetricFamily(
        "trainmon_training_stall_start_timestamp_seconds",
        "Unix time the rank's last step ended before its stall; only while it stalls.",
        labels=_RANK,
    )
    stall_info = GaugeMetricFamily(
        "trainmon_training_stall_info",
        "Where a stalled rank's training thread is: where (data_loader, collective, "
        "checkpoint, phase, code), the open phase, the collective in flight and its "
        "sequence number, the innermost frame (file name, line, function) and the "
        "collective's process group (dp, tp, pp...; empty where unknown), from the "
        "client's stall report; always 1.",
        labels=[*_RANK, "where", "phase", "collective", "seq", "frame", "group"],
    )
    collective_seq = GaugeMetricFamily(
        "trainmon_training_collective_seq",
        "Collectives the rank launched so far (Reporter.instrument's DDP gradient buckets), "
        "as its latest report says: in a hung job, the rank behind the others holds it; "
        "only ranks that measure it.",
        labels=_RANK,
    )
    groups = _GroupFamilies()
    world_sizes: dict[tuple[str, str], int] = {}
    for view in snapshot.ranks:
        labels = [view.job, view.owner, str(view.rank)]
        groups.add(labels, view.totals.comm_groups)
        if view.collective_seq is not None:
            collective_seq.add_metric(labels, view.collective_seq)
        stall = view.stall
        stalled.add_metric(labels, 0.0 if stall is None else 1.0)
        if stall is not None:
            stall_since.add_metric(labels, stall.since)
            stall_info.add_metric([*labels, stall.where, stall.phase or "",
                                   stall.collective or "",
                                   "" if stall.collective_seq is None
                                   else str(stall.collective_seq),
                                   frame_text(stall.frames),
                                   stall.collective_group or ""], 1.0)
        totals = view.totals
        steps.add_metric(labels, totals.steps)
        samples.add_metric(labels, totals.samples)
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip(_BUCKET_BOUNDS, totals.step_buckets, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        step_seconds.add_metric(labels, buckets, totals.step_seconds)
        data_wait.add_metric(labels, totals.data_wait_seconds)
        for phase, seconds in sorted(totals.phase_seconds.items()):
            phases.add_metric([*labels, phase], seconds)
        if view.data_wait_ratio is not None:
            ratio.add_metric(labels, view.data_wait_ratio)
        if view.last_step_time is not None:
            last_step.add_metric(labels, view.last_step_time)
        last_report.add_metric(labels, view.last_report_time)
        pid = "" if view.pid is None else str(view.pid)
        info.add_metric([*labels, view.gpu or "", pid], 1.0)
        dropped.add_metric(labels, totals.dropped_reports)
        resets.add_metric(labels, view.counter_resets)
        if totals.comm_seconds is not None:
            comm.add_metric(labels, totals.comm_seconds)
        if totals.comm_exposed_seconds is not None:
            comm_exposed.add_metric(labels, totals.comm_exposed_seconds)
        if totals.comm_bytes is not None:
            comm_bytes.add_metric(labels, totals.comm_bytes)
        if view.world_size is not None:
            job = (view.job, view.owner)
            world_sizes[job] = max(world_sizes.get(job, 0), view.world_size)
    for job, size in world_sizes.items():
        world_size.add_metric(list(job), size)
    return [steps, samples, step_seconds, data_wait, phases, ratio, last_step, last_report, info,
            world_size, dropped, resets, comm, comm_exposed, comm_bytes, stalled, stall_since,
            stall_info, collective_seq, *groups.families()]


class _GroupFamilies:
    """The per-process-group families (``comm_groups`` of the reports): one series per
    rank and group, only for what the rank reports (an unknown is no sample)."""

    def __init__(self) -> None:
        group = [*_RANK, "group"]
        self.collectives = CounterMetricFamily(
            "trainmon_training_group_collectives_total",
            "Collectives the rank launched on the process group (dp, tp, pp, cp, ep, "
            "world...), as its client reports them (comm_groups); only ranks that report "
            "groups.",
            labels=group,
        )
        self.bytes = CounterMetricFamily(
            "trainmon_training_group_comm_bytes_total",
            "Bytes of the buffers of the rank's collectives on the process group (its "
            "payload, not wire bytes), as its client reports them (comm_groups).",
            labels=group,
        )
        self.seconds = CounterMetricFamily(
            "trainmon_training_group_comm_seconds_total",
            "Seconds with a collective of the process group in flight on the rank (GPU "
            "timeline on CUDA), as its client reports them (comm_groups); overlapped "
            "communication included.",
            labels=group,
        )
        self.exposed = CounterMetricFamily(
            "trainmon_training_group_comm_exposed_seconds_total",
            "Seconds the rank's training thread waited for the process group's collectives "
            "after its own compute was done, as its client reports them (comm_groups); "
            "only where the client knows it.",
            labels=group,
        )
        self.seq = GaugeMetricFamily(
            "trainmon_training_group_collective_seq",
            "Sequence number of the last collective the rank launched on the process group "
            "(c10d's collective_seq_id on it), as its latest report says (comm_groups); root "
            "is the group's lowest global rank (empty where unknown); only where known.",
            labels=[*group, "root"],
        )

    def add(self, rank: list[str], groups: Mapping[str, CommGroup]) -> None:
        for name, group in sorted(groups.items()):
            labels = [*rank, name]
            self.collectives.add_metric(labels, group.collectives)
            self.bytes.add_metric(labels, group.bytes)
            self.seconds.add_metric(labels, group.seconds)
            if group.exposed_seconds is not None:
                self.exposed.add_metric(labels, group.exposed_seconds)
            if group.seq is not None:
                root = "" if group.root is None else str(group.root)
                self.seq.add_metric([*labels, root], group.seq)

    def families(self) -> list[Metric]:
        return [self.collectives, self.bytes, self.seconds, self.exposed, self.seq]


def _build(config: TrainingConfig, wiring: Wiring) -> Collector:
    return TrainingCollector(config, proc_root=wiring.proc_root, sys_root=wiring.sys_root)


def _reconfigure(collector: Collector, config: TrainingConfig) -> None:
    if isinstance(collector, TrainingCollector):
        collector.reconfigure(config)


class _StoreLimits(TypedDict):
    ttl_seconds: float
    max_jobs: int
    max_ranks_per_job: int
    max_jobs_per_writer: int
    max_ranks_per_writer: int
    max_runs_per_writer: int
    max_description_bytes_per_writer: int
    trusted_writers: tuple[str, ...]


def _store_limits(config: TrainingConfig) -> _StoreLimits:
    """The store's caps, TTL and trusted writers in ``config``."""
    return {
        "ttl_seconds": config.ttl_seconds,
        "max_jobs": config.max_jobs,
        "max_ranks_per_job": config.max_ranks_per_job,
        "max_jobs_per_writer": config.max_jobs_per_writer,
        "max_ranks_per_writer": config.max_ranks_per_writer,
        "max_runs_per_writer": config.max_runs_per_writer,
        "max_description_bytes_per_writer": config.max_description_bytes_per_writer,
        # The daemon's own user (its demo jobs report over the socket) is trusted too.
        "trusted_writers": (*config.trusted_writers, uid_writer(os.geteuid())),
    }


#: The keys of ``collectors.training`` a reload applies in place (the rest, the socket
#: and what its receiver was made with: at a restart).
LIVE_KEYS = ("token_file", "loopback_without_token", "ttl_seconds", "max_jobs",
             "max_ranks_per_job", "max_jobs_per_writer", "max_ranks_per_writer",
             "max_runs_per_writer", "max_description_bytes_per_writer", "trusted_writers")

#: Its store of reports survives a configuration reload (trainmon.reload), which reads
#: its token file again.
ENTRY = CollectorEntry("training", TrainingConfig, _build, survives_reload=True,
                       live_keys=LIVE_KEYS, reconfigure=_reconfigure)


#: The user whose permissions a path named by a token writer is looked up with: only
#: what everyone may see (``nobody``).
NOBODY_UID = 65534


def path_viewer(owner: str) -> Viewer | None:
    """Whose permissions the paths writer ``owner`` names are looked up with
    (``trainmon.node.mounts``, docs/security.md): the daemon's own for itself and root;
    the user's (and its groups') for ``uid:N``; a user without a name on this node, or
    a token, sees what everyone may."""
    if owner in (LOCAL_WRITER, ROOT_WRITER, uid_writer(os.geteuid())):
        return None
    uid = writer_uid(owner)
    if uid is None:
        return Viewer(NOBODY_UID)
    try:
        user = pwd.getpwuid(uid)
        groups = frozenset(os.getgrouplist(user.pw_name, user.pw_gid))
    except (KeyError, OSError):
        groups = frozenset()
    return Viewer(uid, groups)
