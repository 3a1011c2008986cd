"""``Reporter``: step telemetry from inside a training loop. Standard library only.

::

    reporter = Reporter(job="resnet50")
    for batch in reporter.track(loader):      # time blocked in next() is data wait
        loss = train_step(batch)
        with reporter.phase("comm"):          # optional named phases
            sync()
        reporter.step()                       # ends one step of x.shape[0] samples
    reporter.close()

(``batch`` is ``(x, y)``; ``step()`` counts the tracked batch's leading
dimension, ``trainmon.client.batches``; ``step(samples=n)`` says it.)

``model = reporter.instrument(DDP(net))`` measures the communication of a
``DistributedDataParallel`` or FSDP model inside the job (``distributed``,
which imports torch, is loaded only then); ``add_comm()`` adds communication
measured elsewhere. ``with reporter.checkpoint(path): torch.save(...)`` counts
and times a checkpoint save and records where it went (``checkpoint_saved()``
for saves timed elsewhere); the daemon tells what storage that path is on.

Each reporter also describes its **run** (``run``): an id shared by the job's
ranks (the launcher's, else rank 0's, agreed through ``torch.distributed``'s
store: ``trainmon.client.agreement``; until then the sender thread sends
nothing, for at most ``PENDING_LIMIT_SECONDS``, and a single process settles
at once), the user's ``config`` (hashed, secrets
redacted), the NCCL/TORCH/CUDA/OMP environment, ``data_paths``, versions and
the git commit (``trainmon.client.run``). ``describe()`` adds to it; the
sender thread sends it at start, on change and every minute, and the last one
says how the run ended (``finished``, ``crashed``, ``preempted``; the hooks that
tell are ``trainmon.client.ending``), so the daemon's ledger can compare runs. The
description never travels alone: it rides in the payload of a report (the
line before it; the ended one the line after the final report; the protocol
allows several lines per payload), so it is delivered, or fails and is
retried, with that report.

A step runs from the end of the previous ``step()`` to this one (the first
from the first ``next()`` of ``track()``, or from construction); its
duration counts in the step-time histogram and in a sketch of 1 % buckets
(``trainmon.training.sketch``) whose percentiles the run ledger records.
Everything is aggregated in process; a daemon thread sends the cumulative
totals about once a second and ``close()`` sends the last ones, within
``CLOSE_TIMEOUT_SECONDS`` in all however the daemon behaves. Nothing here
blocks or raises into the training loop; reports that cannot be delivered (no
daemon, a queue still full after the sender's retries, an HTTP daemon that does
not answer in time) are counted and the count travels with the next delivered
report.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from trainmon.client.agreement import RunAgreement, Settlement
from trainmon.client.batches import samples_in, tuple_length_mistake
from trainmon.client.comm import (
    OTHER_GROUP,
    CommSource,
    GroupTotals,
    group_name,
    merged_groups,
)
from trainmon.client.ending import ProcessEnding
from trainmon.client.identity import detect_gpu, named_identity, rank_identity
from trainmon.client.profiling import ProfileAgent, RequestWatch
from trainmon.client.run import DataPaths, RunDescriber, launcher_run_id, process_run_id
from trainmon.client.transport import (
    Sender,
    UnixDatagramSender,
    default_endpoint,
    open_sender,
)
from trainmon.client.watchdog import RankState, StallWatch
from trainmon.contract import STEP_BUCKET_COUNT, STEP_SECONDS_BOUNDS
from trainmon.logthrottle import LogThrottle
from trainmon.paths import profile_requests_path
from trainmon.training.protocol import (
    DEFAULT_JOB,
    JOB_VARIABLE,
    RUN_END_REASONS,
    encode_report,
    job_name,
    sanitize_label,
)
from trainmon.training.report_fields import (
    DEFAULT_MAX_LABEL_LENGTH,
    MAX_COMM_GROUPS,
    MAX_PATH_BYTES,
    MAX_PHASES,
    PROTOCOL_VERSION,
    build_report,
)
from trainmon.training.sketch import StepSketch

log = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M")

DEFAULT_INTERVAL_SECONDS = 1.0
#: Longest ``close()`` takes, seconds: waiting for a delivery in flight on the
#: sender thread (at most ``HTTP_TIMEOUT_SECONDS``), then one last payload (the
#: final totals and the ended run description) in the time left.
CLOSE_TIMEOUT_SECONDS = 4.0
#: Phase name that absorbs phases beyond the protocol's MAX_PHASES.
OTHER_PHASE = "other"
#: Raw phase names whose cleaned form is remembered; names past this many are
#: cleaned on every call (bounds memory when callers pass unbounded names).
MAX_CACHED_PHASE_NAMES = 4 * MAX_PHASES

#: The phase checkpoint saves are timed in (also for failed saves).
CHECKPOINT_PHASE = "checkpoint"
#: Longest a never-entered ``checkpoint()`` object waits for the reporter's lock
#: when it goes away, seconds (it may go away inside it: then it is recorded later).
UNTIMED_LOCK_SECONDS = 0.1

_perf_counter = time.perf_counter


class Reporter:
    """Aggregates one process's steps and sends them to the trainmon daemon.

    ``rank``, ``local_rank`` and ``world_size`` default to the launcher's
    environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``); ``job`` to
    ``TRAINMON_JOB``; ``endpoint`` to ``TRAINMON_ENDPOINT`` or the socket of
    the local daemon (``transport.default_endpoint``); ``token`` to ``TRAINMON_TOKEN``;
    ``gpu`` (NVML index) is detected when it can be (see ``identity``).

    ``run`` names the run (default: ``TRAINMON_RUN_ID``, the launcher's job
    id, else rank 0's fresh id once ``torch.distributed`` is initialised, else
    a fresh id); ``run``, ``rank``, ``local_rank`` and ``world_size`` hold the
    settled values from the first report on (``trainmon.client.agreement``).
    ``config`` is the run's configuration (a mapping, nested ones
    flattened), ``data_paths`` where its data comes from; both go into the
    run description (``describe()`` adds more later).
    """

    def __init__(
        self,
        job: str | None = None,
        *,
        rank: int | None = None,
        local_rank: int | None = None,
        world_size: int | None = None,
        gpu: int | str | None = None,
        endpoint: str | None = None,
        token: str | None = None,
        interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        environ: Mapping[str, str] | None = None,
        run: str | None = None,
        config: object = None,
        data_paths: DataPaths | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        raw_job = job if job is not None else env.get(JOB_VARIABLE, DEFAULT_JOB)
        self.job = job_name(env, job)
        if self.job != raw_job:
            log.warning("trainmon job name is sent as %r (allowed: A-Za-z0-9_.:@/+-)",
                        self.job)
        identity = rank_identity(env, rank, local_rank, world_size)
        self.rank, self.local_rank, self.world_size = (
            identity.rank, identity.local_rank, identity.world_size,
        )
        self._environ = env
        self._gpu_fixed = gpu is not None
        self.gpu: str | None = str(gpu) if gpu is not None else detect_gpu(env, self.local_rank)
        self.reporter_id = secrets.token_hex(8)
        #: Unix time at which the reporter (the run, for this process) started.
        self.started = time.time()
        agreed_run = launcher_run_id(run, env)
        self.run = agreed_run or process_run_id(self.started)
        self._run_describer = RunDescriber(
            job=self.job, rank=self.rank, reporter_id=self.reporter_id,
            world_size=self.world_size, run=self.run, started=self.started, environ=env,
            config=config, data_paths=data_paths,
        )
        self.endpoint = endpoint or env.get("TRAINMON_ENDPOINT") or default_endpoint(env)
        self._sender: Sender = open_sender(self.endpoint, token or env.get("TRAINMON_TOKEN"))
        self._interval = max(0.05, float(interval_seconds))

        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._step_start = _perf_counter()
        self._steps = 0
        self._samples = 0
        self._step_seconds = 0.0
        self._data_wait = 0.0
        self._buckets = [0] * STEP_BUCKET_COUNT
        # Each step's duration, 1 % apart (trainmon.training.sketch): the ledger's p50/p95.
        self._sketch = StepSketch()
        self._phases: dict[str, float] = {}
        # Wait and phase time of the step in progress; committed by step().
        self._pending_wait = 0.0
        self._pending_phases: dict[str, float] = {}
        # Raw phase name -> name sent (at most MAX_CACHED_PHASE_NAMES entries),
        # and the distinct names sent, OTHER_PHASE excluded (fewer than MAX_PHASES).
        self._phase_names: dict[str, str] = {}
        self._phase_set: set[str] = set()
        self._dropped = 0
        # Measured communication (add_comm): None until the first add, so an
        # unmeasured reporter sends no comm fields (unknown, not zero).
        self._comm_seconds: float | None = None
        self._comm_bytes = 0
        self._comm_exposed: float | None = None
        # Exposed comm of the step in progress, committed by step() (at most
        # the step's duration, so the total never exceeds step_seconds).
        self._pending_exposed = 0.0
        #: Per group, what ``add_comm(group=...)`` added.
        self._groups: dict[str, GroupTotals] = {}
        # Set by instrument(); step() folds it when present.
        self._comm_source: CommSource | None = None
        # Checkpoints: None until the first checkpoint()/checkpoint_saved(),
        # so a reporter that never checkpoints sends no checkpoint fields.
        self._checkpoints: int | None = None
        self._checkpoint_seconds = 0.0
        self._last_checkpoint_time: float | None = None
        self._checkpoint_path: str | None = None
        self._bad_paths_logged = LogThrottle()
        # checkpoint() objects never entered, recorded at their end (_Checkpoint.__del__)
        self._untimed_checkpoints: list[tuple[str | os.PathLike[str], float]] = []
        self._untimed_warned = False
        # Samples of step() without samples=: the batch track() yielded last (None
        # once a step counted it), the steps done when it came, and the samples of
        # the batches before it in the same step (gradient accumulation).
        self._batch: object = None
        self._batch_step = 0
        self._carried_samples = 0
        self._carried_step = 0
        # None: nothing tracked yet; True: check the first explicit samples= against
        # the tracked batch (a tuple length?); False: checked.
        self._check_samples: bool | None = None
        # Delivery failures are logged once per 5 minutes.
        self._failures_logged = LogThrottle()
        self._description_errors = LogThrottle()

        self._closed = False
        self._closing = threading.Event()
        #: The thread that drives the reporter (``track()``'s, else the constructor's),
        #: what the stall watchdog looks at; the innermost open ``phase()`` and the open
        #: ``checkpoint()`` blocks it reports (``trainmon.client.watchdog``).
        self._driver = threading.get_ident()
        self._open_phase: str | None = None
        self._checkpointing = 0
        self._stall_watch = StallWatch(Reporter.track.__code__)
        # Last: it may settle (and call _settle) at once, which needs the above.
        self._agreement = RunAgreement(
            job=self.job, run=self.run, run_agreed=agreed_run is not None, identity=identity,
            named=named_identity(env, rank, local_rank, world_size), environ=env,
            on_settle=self._settle,
        )
        self._agreement.poll()
        sender = self._sender
        socket_path = sender.path if isinstance(sender, UnixDatagramSender) else None
        #: Profiles the daemon asks of this rank (``trainmon.client.profiling``): only
        #: over the unix socket, beside which the daemon publishes its requests.
        self._profiles = ProfileAgent(
            self, RequestWatch(None if socket_path is None
                               else str(profile_requests_path(socket_path)), socket_path),
            self._profile_line, self._send_attached)
        self._thread = threading.Thread(
            target=self._run, name=f"trainmon-reporter-{self.job}", daemon=True
        )
        self._thread.start()
        _ENDING.watch(self)

    # -- the training loop's API ----------------------------------------------

    def step(self, samples: int | None = None) -> None:
        """End one step that processed ``samples`` samples (about a microsecond).

        Without ``samples``, the step counts the batches ``track()`` yielded
        since the previous step by their leading dimension
        (``trainmon.client.batches``: ``(x, y)`` counts ``x.shape[0]``, a
        dict its first tensor's); 0 without ``track()``. An explicit
        ``samples`` always wins; one that equals the length of the tracked
        tuple, list or dict batch while its leading dimension differs
        (``samples=len((x, y))`` is 2) is logged once.
        """
        now = _perf_counter()
        if samples is None:  # the tracked batch (inline: this is the usual path)
            batch = self._batch
            if batch is not None:
                self._batch = None  # counted once
                samples = samples_in(batch)
            else:
                samples = 0
            if self._carried_samples:
                samples += self._take_carried()
        elif samples.__class__ is not int or samples < 0:
            samples = _as_count(samples)
        elif self._check_samples:
            self._check_explicit_samples(samples)
        if self._comm_source is not None:
            self._comm_source.fold()
        lock = self._lock
        lock.acquire()  # cheaper than `with` on this hot path
        try:
            duration = now - self._step_start
            self._step_start = now
            self._steps += 1
            self._samples += samples
            self._step_seconds += duration
            self._buckets[bisect_left(STEP_SECONDS_BOUNDS, duration)] += 1
            self._sketch.add(duration)
            if self._pending_wait:
                self._data_wait += min(self._pending_wait, duration)
                self._pending_wait = 0.0
            if self._pending_phases:
                self._commit_phases()
            if self._pending_exposed:
                self._commit_exposed(duration)
        finally:  # a KeyboardInterrupt must not leave the lock held
            lock.release()

    def track(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yield from ``iterable``, counting the time blocked in ``next()`` as data wait.

        The batch yielded last is kept (until the next one) for ``step()``
        without ``samples``; the thread iterating drives the reporter (an
        uncaught exception in it ends the run ``crashed``, see ``ending``).
        """
        self._refresh_gpu()
        clock = _perf_counter
        started = clock()
        if self._steps == 0 and not self._pending_wait:
            with self._lock:
                self._step_start = started  # the first step starts with the loop
        _ENDING.drives(self)  # this thread's uncaught exception ends the run
        self._driver = threading.get_ident()
        if self._check_samples is None:
            self._check_samples = True
        iterator = iter(iterable)  # DataLoader starts its workers here: that is waiting too
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                self.add_data_wait(clock() - started)
                self._batch = None  # counted, or never to be: let it go
                return
            self.add_data_wait(clock() - started)
            previous = self._batch
            if previous is not None and self._batch_step == self._steps:
                self._carry(previous)  # no step() since: one step of several batches
            self._batch = item
            self._batch_step = self._steps
            yield item
            started = clock()

    def phase(self, name: str) -> _Phase:
        """Context manager timing a named part of the step (``comm``, ``checkpoint``…)."""
        return _Phase(self, self._phase_name(name))

    def add_data_wait(self, seconds: float) -> None:
        """Add data-wait time measured elsewhere (framework callbacks) to the current step."""
        if seconds > 0 and math.isfinite(seconds):
            with self._lock:
                self._pending_wait += seconds

    def add_phase(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to phase ``name`` of the current step."""
        if seconds > 0 and math.isfinite(seconds):
            key = self._phase_name(name)
            with self._lock:
                self._pending_phases[key] = self._pending_phases.get(key, 0.0) + seconds

    def checkpoint(self, path: str | os.PathLike[str]) -> _Checkpoint:
        """Context manager timing one checkpoint save to ``path``::

            with reporter.checkpoint("/mnt/cfs/run1/step-1000.pt"):
                torch.save(state, "/mnt/cfs/run1/step-1000.pt")

        On success the save counts (``checkpoints``), its seconds go to
        ``checkpoint_seconds`` and to the ``checkpoint`` phase, and its time
        and absolute path (``os.path.abspath``, symlinks kept) are recorded.
        On an exception only the phase time counts, and the exception goes on.
        From the first ``checkpoint()`` on, reports carry ``checkpoints``
        (``0`` while the first save runs), so the daemon knows the job
        checkpoints. A path the protocol cannot carry (over 4096 bytes,
        control characters) is not sent; the checkpoint still counts.

        Called without ``with`` (``reporter.checkpoint(path)`` after a save),
        the returned object is never entered: when it goes away (at once, in
        CPython, for a bare call) it records a checkpoint saved at the time
        of the call, in 0 s, and logs once how to time it. An object that is
        entered records only at the end of its block, so nothing counts twice.
        """
        self._record_untimed()
        with self._lock:
            if self._checkpoints is None:
                self._checkpoints = 0
        return _Checkpoint(self, path)

    def checkpoint_saved(self, path: str | os.PathLike[str] | None, seconds: float) -> None:
        """Record a checkpoint saved to ``path`` in ``seconds`` (timed by the caller).

        The same as a successful ``with checkpoint(path):`` block of that
        length. Negative or non-finite ``seconds`` count as 0; never raises.
        """
        if not (isinstance(seconds, (int, float)) and 0 <= seconds < math.inf):
            log.debug("trainmon: checkpoint_saved(seconds=%r) counted as 0", seconds)
            seconds = 0.0
        self._record_untimed()
        sent = self._checkpoint_path_of(path)
        finished = time.time()
        with self._lock:
            self._record_checkpoint(sent, seconds, finished)
        self.add_phase(CHECKPOINT_PHASE, seconds)

    def add_comm(
        self, seconds: float, exposed_seconds: float | None = None, nbytes: int = 0,
        *, group: str | None = None, collectives: int = 1,
    ) -> None:
        """Add measured communication: ``seconds`` with a collective in flight,
        of which ``exposed_seconds`` the rank waited with its own compute done
        (``None``: not known), moving ``nbytes`` bytes of collective buffers.
        ``group`` names the process group (parallelism dimension: ``dp``, ``tp``,
        ``pp``...) it belongs to, which then counts ``collectives`` more collectives
        and travels in the report's ``comm_groups`` (a name the protocol refuses, or one
        past ``MAX_COMM_GROUPS``, is counted as ``other``).

        Thread-safe (collective callbacks arrive on backend threads). From the
        first call on, reports carry ``comm_seconds`` and ``comm_bytes``; from
        the first call with ``exposed_seconds``, ``comm_exposed_seconds``.
        Exposed time is clamped to ``seconds`` here and counts when the step
        in progress ends, at most that step's duration (exposed time after the
        last step belongs to no step and is dropped, like data wait). Negative
        or non-finite values are ignored, never raised.
        """
        if not (isinstance(seconds, (int, float)) and 0 <= seconds < math.inf):
            log.debug("trainmon: ignoring add_comm(seconds=%r)", seconds)
            return
        exposed: float | None = None
        if exposed_seconds is not None:
            if isinstance(exposed_seconds, (int, float)) and 0 <= exposed_seconds < math.inf:
                exposed = min(float(exposed_seconds), float(seconds))
            else:
                log.debug("trainmon: ignoring add_comm(exposed_seconds=%r)", exposed_seconds)
        count = nbytes if nbytes.__class__ is int and nbytes >= 0 else _as_count(nbytes)
        with self._lock:
            self._comm_seconds = (self._comm_seconds or 0.0) + seconds
            self._comm_bytes += count
            if exposed is not None:
                if self._comm_exposed is None:
                    self._comm_exposed = 0.0
                self._pending_exposed += exposed
            if group is not None:
                self._add_group(str(group), seconds, exposed, count, collectives)

    def _add_group(self, name: str, seconds: float, exposed: float | None, nbytes: int,
                   collectives: int) -> None:
        """``add_comm``'s share of one group (lock held)."""
        name = group_name(name)
        if name not in self._groups and len(self._groups) >= MAX_COMM_GROUPS - 1:
            name = OTHER_GROUP
        totals = self._groups.setdefault(name, GroupTotals())
        totals.collectives += collectives if collectives.__class__ is int and collectives > 0 else 0
        totals.bytes += nbytes
        totals.seconds += seconds
        if exposed is not None:
            totals.exposed_seconds = (totals.exposed_seconds or 0.0) + exposed

    def instrument(
        self,
        model: M,
        *,
        comm_hook: Callable[[Any, Any], Any] | None = None,
        comm_state: object = None,
    ) -> M:
        """Measure the communication of ``model`` (DDP or FSDP) and return it.

        ``model = reporter.instrument(DistributedDataParallel(net))``. DDP gets a
        communication hook that times each gradient bucket, wrapping
        ``comm_hook`` (called with ``comm_state``) or the default all-reduce;
        FSDP's collectives are timed on its process groups. See
        docs/protocol.md, "Measured communication". Imports torch (only
        here). Never raises into training: a model it cannot measure is
        returned unmeasured with one warning; instrumenting a model twice is
        a no-op. A run id still pending (``trainmon.client.agreement``) is
        looked for here too: the model's process group is initialised.
        """
        if self._agreement.pending:
            self._agreement.poll(wait=False)
            self._refresh_gpu()  # the local rank may have changed; this is the training thread
        try:
            from trainmon.client import distributed
        except ImportError as missing:
            log.warning("trainmon: instrument() needs torch.distributed (%s); "
                        "communication is not measured", missing)
            return model
        try:
            source = distributed.instrument(
                self, model, comm_hook=comm_hook, comm_state=comm_state,
                source=self._comm_source,
            )
        except Exception:  # whatever torch raises here must not stop training
            log.warning("trainmon: cannot instrument %s; communication is not measured",
                        type(model).__name__, exc_info=True)
            return model
        if source is not None:
            self._comm_source = source
        return model

    def describe(
        self,
        config: object = None,
        data_paths: DataPaths | None = None,
        framework: object = None,
    ) -> None:
        """Add to the run description: ``config`` keys (merged, the hash
        follows), ``data_paths`` (added) and ``framework`` settings (merged;
        what a framework callback knows). A change is sent by the sender
        thread within a second; nothing is sent from the calling thread.
        Never raises for odd values (they are sent as their ``str()``).
        """
        self._run_describer.update(config=config, data_paths=data_paths, framework=framework)

    def run_description(self) -> dict[str, object]:
        """The run description as it is sent now (see docs/protocol.md)."""
        return self._run_describer.description()

    @property
    def config_hash(self) -> str:
        """``"sha256:"`` + 16 hex digits over the redacted config."""
        return self._run_describer.config_hash

    def close(self, finished: bool = True, *, ended: str | None = None) -> None:
        """Send the final totals and stop the sender thread; safe to call twice.

        Returns within ``CLOSE_TIMEOUT_SECONDS``: it waits for a delivery the
        sender thread has in flight for at most the time left, then sends the
        final totals in one payload within the time left (an undeliverable
        one is counted, never waited for longer).

        The run description sent last says how the run ended (``ended``, in
        the same payload as the final totals): ``"finished"`` by default,
        ``"crashed"`` with ``finished=False`` (as when a ``with`` block is
        left on an exception), or ``ended=`` one of ``RUN_END_REASONS``
        (``"preempted"``: stopped from outside). A process that received
        SIGTERM says ``"preempted"`` whatever is asked (``trainmon.client.ending``,
        which also closes the reporters left open when the process ends).
        Raises ``ValueError`` for another ``ended``.
        """
        if ended is None:
            ended = "finished" if finished else "crashed"
        elif ended not in RUN_END_REASONS:
            raise ValueError(f"ended must be one of {', '.join(RUN_END_REASONS)}, not {ended!r}")
        with self._lock:  # one close, even from a signal's closing thread and the loop at once
            if self._closed:
                return
            self._closed = True
        give_up = time.monotonic() + CLOSE_TIMEOUT_SECONDS
        _ENDING.forget(self)
        self._closing.set()
        self._thread.join(timeout=max(0.0, give_up - time.monotonic()))
        self._profiles.abandon(give_up)
        source = self._comm_source
        if source is not None:
            source.fold()  # what completed since the last step
            source.close()
        self._record_untimed()
        self._batch = None
        with self._lock:
            # Phase time after the last step (a final validation, a checkpoint)
            # still counts; data wait without a step to contain it does not.
            self._commit_phases()
        self._deliver(ended=_ENDING.reason(ended), give_up=give_up)
        self._sender.close()

    def flush(self) -> bool:
        """Send the current totals now (with the run description when it is due);
        True if they were delivered."""
        return self._deliver()

    def _deliver(self, ended: str | None = None, give_up: float | None = None) -> bool:
        """Send one payload: the run description when it is due, then the
        current totals; with ``ended``, the totals, then the ended description.
        ``give_up``: the monotonic time by which this must be done (None: the
        sender's own bound; given by ``close()``). Nothing is sent while the
        run id is pending (False; the totals are cumulative, so nothing is
        lost), except the last payload (``ended`` or ``give_up`` given),
        which settles it first."""
        agreement = self._agreement
        if agreement.pending:
            if ended is None and give_up is None:
                return False
            agreement.finish(None if give_up is None else max(0.0, give_up - time.monotonic()))
        timeout: float | None = None
        if give_up is None:
            self._send_lock.acquire()
        elif not self._send_lock.acquire(timeout=max(0.0, give_up - time.monotonic())):
            with self._lock:  # the sender thread still holds it: no time left
                self._dropped += 1
            return False
        try:
            describer = self._run_describer
            described = ended is not None or describer.due()
            description = self._description_line(ended) if described else b""
            report = encode_report(self.report())
            if ended is None and give_up is None:
                report += self._stall_line()
            # the run is known before its first report; "ended" is the last line sent
            payload = (report + description) if ended else (description + report)
            if give_up is not None:
                timeout = max(0.0, give_up - time.monotonic())
            delivered = self._sender.send(payload, timeout)
            if description:
                describer.sent(delivered)
            if delivered:
                return True
            with self._lock:
                self._dropped += 1
            self._log_failure()
            return False
        finally:
            self._send_lock.release()

    def report(self) -> dict[str, object]:
        """The protocol v1 report of the current totals (see docs/protocol.md): a
        value for every field of ``report_fields.REPORT_FIELDS``, in its order,
        ``None`` for what this reporter does not know (unmeasured communication, no
        checkpoint yet), which ``build_report`` leaves out as the schema says."""
        source = self._comm_source
        with self._lock:
            last_step = self._step_start if self._steps else None
            comm = self._comm_seconds
            checkpoints = self._checkpoints
            measured = comm is not None
            saved = checkpoints is not None
            values: dict[str, object] = {
                "v": PROTOCOL_VERSION,
                "job": self.job,
                "rank": self.rank,
                "local_rank": self.local_rank,
                "world_size": self.world_size,
                "gpu": self.gpu,
                "pid": os.getpid(),
                "reporter_id": self.reporter_id,
                "run": self.run,
                "steps": self._steps,
                "samples": self._samples,
                "step_seconds": self._step_seconds,
                "data_wait_seconds": self._data_wait,
                "phase_seconds": dict(self._phases),
                "step_buckets": list(self._buckets),
                "step_sketch": dict(self._sketch.counts),
                "step_sketch_level": self._sketch.level,
                "dropped_reports": self._dropped,
                "comm_seconds": comm,
                "comm_bytes": self._comm_bytes if measured else None,
                "comm_exposed_seconds": self._comm_exposed if measured else None,
                "checkpoints": checkpoints,
                "checkpoint_seconds": self._checkpoint_seconds if saved else None,
                "last_checkpoint_time": self._last_checkpoint_time if saved else None,
                "checkpoint_path": self._checkpoint_path if saved else None,
                "last_step_time": None,
                "collective_seq": None if source is None else source.launched_collectives(),
                "comm_groups": merged_groups(
                    self._step_seconds,
                    None if source is None else source.groups(self._step_seconds),
                    {name: totals.wire(self._step_seconds)
                     for name, totals in self._groups.items()}),
            }
        if last_step is not None:
            values["last_step_time"] = time.time() - (_perf_counter() - last_step)
        return build_report(values)

    @property
    def dropped_reports(self) -> int:
        """Reports that could not be delivered so far."""
        return self._dropped

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, error: BaseException | None,
                 traceback: object) -> None:
        """Close: ``finished`` unless an exception (other than ``SystemExit(0)``) leaves."""
        clean = error is None or (isinstance(error, SystemExit) and error.code in (0, None))
        self.close(finished=clean)

    # -- internals -------------------------------------------------------------

    def _take_carried(self) -> int:
        """The samples of the batches ``track()`` yielded before the last one since
        the previous step (0 when a step that counted explicitly came between)."""
        carried = self._carried_samples if self._carried_step == self._steps else 0
        self._carried_samples = 0
        return carried

    def _carry(self, batch: object) -> None:
        """``batch`` was not followed by a step: it belongs to the next one."""
        if self._carried_samples and self._carried_step != self._steps:
            self._carried_samples = 0  # left from a step that counted explicitly
        self._carried_samples += samples_in(batch)
        self._carried_step = self._steps

    def _check_explicit_samples(self, samples: int) -> None:
        """Once: is an explicit ``samples`` the length of the tracked batch's tuple?"""
        batch = self._batch
        if batch is None:
            return
        self._check_samples = False
        if tuple_length_mistake(batch, samples):
            log.warning(
                "trainmon: step(samples=%d) counts the %d items of the %s batch, not its "
                "%d samples (its leading dimension); pass the batch size (e.g. len(labels)) "
                "or leave samples out to count the tracked batch",
                samples, samples, type(batch).__name__, samples_in(batch))

    def _untimed_checkpoint(self, path: str | os.PathLike[str], saved: float) -> None:
        """A ``checkpoint()`` object ends never entered: record a 0 s save at ``saved``.

        Runs in ``_Checkpoint.__del__``, which may run on any thread at any
        time, even inside this reporter's lock: the lock is waited for only
        ``UNTIMED_LOCK_SECONDS``, else the save is recorded by the next
        ``checkpoint()``, ``checkpoint_saved()`` or ``close()``.
        """
        if not self._untimed_warned:
            self._untimed_warned = True
            log.warning(
                "trainmon: reporter.checkpoint(%.200r) was not used with `with`; recorded as "
                "a checkpoint saved at that call, in 0 s. Time the save with "
                "`with reporter.checkpoint(path): torch.save(...)`, or report it with "
                "reporter.checkpoint_saved(path, seconds)", path)
        sent = self._checkpoint_path_of(path)
        if not self._lock.acquire(timeout=UNTIMED_LOCK_SECONDS):
            self._untimed_checkpoints.append((path, saved))
            return
        try:
            self._record_checkpoint(sent, 0.0, saved)
        finally:
            self._lock.release()

    def _record_untimed(self) -> None:
        """Record the untimed checkpoints ``_untimed_checkpoint`` had to leave."""
        pending = self._untimed_checkpoints
        while pending:
            path, saved = pending.pop(0)
            sent = self._checkpoint_path_of(path)
            with self._lock:
                self._record_checkpoint(sent, 0.0, saved)

    def _record_checkpoint(self, path: str | None, seconds: float, finished: float) -> None:
        """Count one save of ``seconds`` that ended at ``finished`` (lock held); the
        last checkpoint's time and path stay those of the latest save."""
        self._checkpoints = (self._checkpoints or 0) + 1
        self._checkpoint_seconds += seconds
        last = self._last_checkpoint_time
        if last is None or finished >= last:
            self._last_checkpoint_time = finished
            self._checkpoint_path = path

    def _commit_phases(self) -> None:
        """Move the pending phase time into the totals (lock held)."""
        phases = self._phases
        for name, seconds in self._pending_phases.items():
            phases[name] = phases.get(name, 0.0) + seconds
        self._pending_phases.clear()

    def _commit_exposed(self, duration: float) -> None:
        """Move the pending exposed comm into the total, at most ``duration`` (lock held)."""
        assert self._comm_exposed is not None and self._comm_seconds is not None
        total = self._comm_exposed + min(self._pending_exposed, duration)
        self._comm_exposed = min(total, self._comm_seconds)
        self._pending_exposed = 0.0

    def _run(self) -> None:
        agreement = self._agreement
        while not self._closing.wait(self._interval):
            source = self._comm_source
            if source is not None:
                source.fold()  # bounds what instrumentation holds between steps
            if agreement.pending:
                agreement.poll()
            self.flush()
            self._profiles.poll(self.job, self.rank)

    def _profile_line(self, fields: dict[str, object]) -> bytes:
        """A ``"type": "profile"`` line of this rank (``trainmon.client.profiling``)."""
        return encode_report({"v": PROTOCOL_VERSION, "type": "profile", "job": self.job,
                              "rank": self.rank, "world_size": self.world_size,
                              "reporter_id": self.reporter_id, "run": self.run, **fields})

    def _send_attached(self, payload: bytes, descriptor: int | None) -> bool:
        """Deliver a profile line, with its trace's descriptor when there is one."""
        sender = self._sender
        if descriptor is not None and isinstance(sender, UnixDatagramSender):
            return sender.send_attached(payload, descriptor)
        return sender.send(payload)

    def _stall_line(self) -> bytes:
        """The stall line to send after the report while the rank's steps have
        stopped (``trainmon.client.watchdog``); b"" otherwise, or when it cannot be
        built (that costs the stall report, never the totals)."""
        source = self._comm_source
        with self._lock:
            steps, last_step, buckets = self._steps, self._step_start, list(self._buckets)
            phase = self._open_phase
        try:
            state = RankState(
                thread=self._driver, steps=steps, last_step=last_step, buckets=buckets,
                phase=phase, checkpointing=self._checkpointing > 0,
                in_flight=None if source is None else source.in_flight(self._driver))
            line = self._stall_watch.look(state)
            if line is None:
                return b""
            return encode_report({"v": line.pop("v"), "type": line.pop("type"), "job": self.job,
                                  "rank": self.rank, "world_size": self.world_size,
                                  "reporter_id": self.reporter_id, "run": self.run, **line})
        except (ValueError, RuntimeError) as error:  # a frame that cannot be told
            if self._failures_logged.allow("stall", str(error)):
                log.warning("trainmon: cannot describe a stall: %s", error)
            return b""

    def _settle(self, settled: Settlement) -> None:
        """Take the agreed run id and identity (``RunAgreement.on_settle``), before
        anything is sent."""
        with self._lock:
            self.run, self.rank = settled.run, settled.rank
            self.local_rank, self.world_size = settled.local_rank, settled.world_size
        self._run_describer.settle(run=settled.run, rank=settled.rank,
                                   world_size=settled.world_size)

    def _description_line(self, ended: str | None) -> bytes:
        """The run description line to send with the totals (send lock held);
        b"" when it cannot be built: that costs the description, not the report."""
        describer = self._run_describer
        try:
            return describer.line(ended=ended)
        except Exception as error:  # a bug or a hostile object must not stop the sender
            if self._description_errors.allow("build"):  # the type only: no values logged
                log.warning("trainmon: cannot build the run description (%s)",
                            type(error).__name__)
            describer.sent(False)
            return b""

    def _phase_name(self, name: str) -> str:
        """The phase name as sent: sanitized, and ``OTHER_PHASE`` past the phase cap."""
        known = self._phase_names.get(name)
        if known is not None:
            return known
        cleaned = sanitize_label(str(name), DEFAULT_MAX_LABEL_LENGTH)
        with self._lock:
            sent = self._phase_set
            if cleaned not in sent:
                if cleaned == OTHER_PHASE or len(sent) >= MAX_PHASES - 1:
                    cleaned = OTHER_PHASE
                else:
                    sent.add(cleaned)
            if len(self._phase_names) < MAX_CACHED_PHASE_NAMES:
                self._phase_names[name] = cleaned
        return cleaned

    def _checkpoint_path_of(self, path: str | os.PathLike[str] | None) -> str | None:
        """``path`` made absolute, or None when the protocol cannot carry it."""
        if path is None:
            return None
        try:
            absolute = os.path.abspath(os.fspath(path))
            size = len(absolute.encode("utf-8"))
        except (TypeError, ValueError, UnicodeError) as error:
            problem = f"not a path ({error})"
        else:
            if size > MAX_PATH_BYTES:
                problem = f"{size} bytes, over {MAX_PATH_BYTES}"
            elif any(ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F for char in absolute):
                problem = "control characters"
            else:
                return absolute
        if self._bad_paths_logged.allow("path"):
            log.warning("trainmon: checkpoint path %.200r not reported: %s", path, problem)
        return None

    def _refresh_gpu(self) -> None:
        if not self._gpu_fixed:
            detected = detect_gpu(self._environ, self.local_rank)
            if detected is not None:
                self.gpu = detected

    def _log_failure(self) -> None:
        if self._failures_logged.allow("delivery"):
            log.warning(
                "trainmon: cannot deliver step reports (%s); training continues, "
                "%d report(s) undelivered so far", self._sender.last_error, self._dropped,
            )


class _Phase:
    """Times one ``with reporter.phase(name):`` block."""

    __slots__ = ("_name", "_outer", "_reporter", "_started")

    def __init__(self, reporter: Reporter, name: str) -> None:
        self._reporter = reporter
        self._name = name
        self._started = 0.0
        #: The phase this one is inside (the stall watchdog reports the innermost).
        self._outer: str | None = None

    def __enter__(self) -> _Phase:
        reporter = self._reporter
        self._outer, reporter._open_phase = reporter._open_phase, self._name
        self._started = _perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        reporter = self._reporter
        reporter.add_phase(self._name, _perf_counter() - self._started)
        reporter._open_phase = self._outer


class _Checkpoint:
    """Times one ``with reporter.checkpoint(path):`` block; never entered, it
    records an untimed save when it goes away (``Reporter.checkpoint``)."""

    __slots__ = ("_called", "_entered", "_path", "_reporter", "_started")

    def __init__(self, reporter: Reporter, path: str | os.PathLike[str]) -> None:
        self._reporter = reporter
        self._path = path
        self._started = 0.0
        self._called = time.time()
        self._entered = False

    def __enter__(self) -> _Checkpoint:
        self._entered = True
        self._reporter._checkpointing += 1
        self._started = _perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        seconds = _perf_counter() - self._started
        self._reporter._checkpointing -= 1
        if exc_type is None:
            self._reporter.checkpoint_saved(self._path, seconds)
        else:  # the save failed: its time was still spent, nothing was saved
            self._reporter.add_phase(CHECKPOINT_PHASE, seconds)

    def __del__(self) -> None:
        if not self._entered:
            self._entered = True
            self._reporter._untimed_checkpoint(self._path, self._called)


def _as_count(samples: object) -> int:
    """``samples`` as a non-negative int (numpy/torch scalars welcome); 0 if it is not one."""
    try:
        value: int = int(samples)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        log.debug("trainmon: ignoring samples=%r (not an integer)", samples)
        return 0
    return max(value, 0)


#: How this process's runs end (finished, crashed, preempted): its hooks.
_ENDING = ProcessEnding(close_timeout=CLOSE_TIMEOUT_SECONDS)
