"""Communication measured inside DDP and FSDP jobs: the torch side of ``Reporter.instrument``.

Imported only by ``Reporter.instrument()`` (it needs torch); the rest of the
client stays standard-library only. Definitions and limits for users are in
docs/protocol.md, "Measured communication"; the mechanisms:

- **DDP** (``DistributedDataParallel``): a communication hook that times
  the default all-reduce or the user's hook. A gradient bucket's interval
  runs from the call of the hook (the bucket is ready) to the completion of
  the future it returns; its bytes are those of the collectives the hook
  issues (seen through the wrappers below), else the bucket buffer's. The
  default (no hook given, or ``allreduce_hook``) is done by the timer
  itself: the bucket divided by the group size and all-reduced with the
  process group's own ``allreduce``, the collective DDP's built-in C++ hook
  issues, and one ``then`` callback that records the completion and unwraps
  the result, instead of ``allreduce_hook``'s Python path
  (``dist.all_reduce``) and a second callback around it. A bucket's record
  is a plain list (``[launch, completion, bytes, closes the round]``), the
  cheapest thing to make once per bucket on the training thread. A backward
  pass is one **round**, closed by the bucket DDP marks ``is_last()``: the
  last bucket becomes ready when the rank's own backward compute is done,
  so the round's **exposed** time is ``max(completion) - launch(last
  bucket)``, what the rank waits after its compute. A slow rank launches
  its last bucket late and waits little; the ranks waiting for it wait
  long.
- **Process-group collectives** (FSDP2's ``all_gather_single`` /
  ``reduce_scatter_single``, FSDP1's ``*_into_tensor`` / ``*_tensor``, and
  ``all_reduce``, ``broadcast``... issued on an instrumented model's
  groups): the ``torch.distributed`` functions are wrapped once per process.
  Calls on other groups go straight through. A synchronous call on CPU
  blocks the caller: all of it is comm and exposed. An ``async_op=True``
  call ends when its work's future completes; its exposed part is not
  observable (the caller's ``wait()`` is C++) and stays unknown.
- **CUDA** (NCCL): a future completes with stream semantics, before the GPU
  has run the collective, so intervals are CUDA events on the GPU timeline:
  one on the current stream at launch, one in the future's callback (whose
  current stream waits for the collective). Events are resolved later with
  non-blocking ``query()``; unfinished ones wait for the next fold, nothing
  ever synchronizes. A synchronous call's exposed part is known only on the
  device's default stream (the compute stream waits for it); on side
  streams (FSDP's) it stays unknown.

Intervals are folded into ``Reporter.add_comm`` at each ``step()``, by the
sender thread and at ``close()``: ``comm_seconds`` adds the union of the
completed intervals (clipped to start after what earlier folds covered, so
nothing is counted twice), ``comm_bytes`` their bytes. The fold stays in
``step()`` because exposed time counts in the step it ended in (at most
that step's length): on CPU a round has completed when ``backward()``
returns, so the ``step()`` after it folds it; folded once a second on the
sender thread, a second's rounds would count in one step. A ``step()``
with nothing pending returns at once; one after a CPU round folds it in one
pass over its records (``_fold_cpu_rounds``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from trainmon.client import collectives
from trainmon.client.collectives import Launch
from trainmon.client.comm import OTHER_GROUP, CommSink, GroupTotals
from trainmon.client.watchdog import InFlight
from trainmon.logthrottle import LogThrottle

if TYPE_CHECKING:
    from torch._C._distributed_c10d import GradBucket

log = logging.getLogger(__name__)

_clock = time.perf_counter

#: Records a meter holds between folds before it drops new ones (a loop that
#: never calls step() while the sender thread is stuck must not grow memory).
MAX_PENDING_RECORDS = 65_536

#: ``torch.distributed`` collectives timed on instrumented groups, with the
#: argument holding what each rank contributes (its bytes are ``comm_bytes``).
COLLECTIVE_PAYLOADS: dict[str, str] = {
    "all_reduce": "tensor",
    "broadcast": "tensor",
    "all_gather": "tensor",
    "all_gather_into_tensor": "input_tensor",
    "all_gather_single": "input_tensor",
    "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input",
    "reduce_scatter_single": "input",
    "all_to_all_single": "input",
}

HookFn = Callable[[Any, "GradBucket"], "torch.futures.Future[torch.Tensor]"]

#: A DDP bucket's record, made once per bucket and step on the training thread:
#: a list ``[launch, completion, bytes, closes the round, collective, sequence
#: number]``, indexed by these. Launch and completion are ``perf_counter`` seconds on
#: CPU, events on CUDA; completion is None until the future's callback (a backend
#: thread) writes it. The collective's name and the bucket's sequence number among the
#: rank's buckets (``CommMeter.add_bucket``) tell the stall watchdog what is in flight.
LAUNCH, COMPLETION, BYTES, CLOSES_ROUND, COLLECTIVE, SEQUENCE = range(6)
BucketRecord = list[Any]


class _Record:
    """One CUDA collective from launch to completion, as events on the GPU timeline.

    ``end_event`` is written by the completion callback (a backend thread).
    """

    __slots__ = ("blocking", "end_event", "group", "nbytes", "start_event")

    def __init__(self, group: str, nbytes: int = 0) -> None:
        self.group = group
        self.nbytes = nbytes
        #: The caller's stream waited for all of it (exposed = its duration).
        self.blocking = False
        self.end_event: torch.cuda.Event | None = None
        event = _timing_event()
        event.record()
        self.start_event = event

    def finish(self, _future: object = None) -> None:
        """Mark completion (the work's future callback)."""
        try:
            event = _timing_event()
            event.record()  # the current stream waits for the collective
            self.end_event = event
        except RuntimeError as error:  # a CUDA error here must not fail the collective
            log.debug("trainmon: cannot time a collective: %s", error)

    def complete(self) -> bool:
        """True once the interval is known (never blocks)."""
        return (
            self.end_event is not None
            and bool(self.end_event.query())  # type: ignore[no-untyped-call]
            and bool(self.start_event.query())  # type: ignore[no-untyped-call]
        )


def _timing_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


class CommMeter:
    """One reporter's measured communication: records in flight, folded on demand.

    Implements ``trainmon.client.comm.CommSource`` for the reporter and
    ``trainmon.client.collectives.LaunchSink`` for the process-wide wrappers.
    """

    def __init__(self, sink: CommSink) -> None:
        self._sink = weakref.ref(sink)
        self._lock = threading.Lock()
        self._buckets: list[BucketRecord] = []
        #: CUDA launches (events), CPU launches and CPU waits not folded yet.
        self._collectives: list[_Record] = []
        self._launches: list[Launch] = []
        self._waits: list[tuple[str, float, float]] = []
        # What earlier folds covered, per timeline: later intervals start after it.
        self._cpu_tail = -math.inf
        self._wait_tail = -math.inf
        self._gpu_tail: torch.cuda.Event | None = None
        #: Per group, where its CPU intervals folded so far end.
        self._group_tails: dict[str, float] = {}
        self._failures = LogThrottle()
        self.active = True
        #: DDP buckets launched so far: the last one's sequence number.
        self.launched = 0
        #: The group DDP's buckets are reported under.
        self.bucket_group = "dp"
        #: Per group, what it carried (``CommSource.groups``).
        self.totals: dict[str, GroupTotals] = {}
        #: A launch or wait outside DDP's buckets was seen: the one-pass fold of
        #: bucket rounds alone no longer gives each group's share.
        self._mixed = False

    # -- what the hook and the wrappers report (training and backend threads) ------

    def add_bucket(self, record: BucketRecord) -> None:
        """Keep a DDP bucket's record until a fold (the hook, on the training thread)."""
        self.launched += 1
        record.append(self.launched)
        with self._lock:
            totals = self._group(self.bucket_group)
            totals.collectives += 1
            totals.bytes += record[BYTES]
        self._keep(record, self._buckets)

    def launch(self, group: str, op: str, nbytes: int, *, cuda: bool) -> Launch:
        """Count a launch on ``group`` (``LaunchSink.launch``)."""
        with self._lock:
            totals = self._group(group)
            totals.collectives += 1
            totals.bytes += nbytes
            seq = totals.collectives
            self._mixed = True
        launch = Launch(group, op, seq, nbytes, _clock(), since=time.time())
        if cuda:
            launch.record = _Record(group, nbytes)
            self._keep(launch.record, self._collectives)
        else:
            self._keep(launch, self._launches)
        return launch

    def waited(self, launch: Launch | None, start: float, end: float) -> None:
        """A thread was blocked for ``launch`` from ``start`` to ``end``
        (``LaunchSink.waited``): on the CPU, exposed time of its group."""
        if launch is not None and launch.record is not None:  # CUDA: a stream wait
            if torch.cuda.current_stream() == torch.cuda.default_stream():
                launch.record.blocking = True
            return
        if launch is not None:
            if start - launch.returned <= collectives.IMMEDIATE_WAIT_SECONDS:
                start = launch.start  # a synchronous call: blocked from its launch on
                launch.end = end
            elif launch.end is None:
                launch.end = end
        self._mixed = True
        self._keep((OTHER_GROUP if launch is None else launch.group, start, end), self._waits)

    def launched_collectives(self) -> int | None:
        """DDP buckets launched so far (``CommSource.launched_collectives``); None before
        the first, or for a model whose collectives are not DDP buckets."""
        return self.launched or None

    def groups(self, step_seconds: float) -> dict[str, dict[str, object]] | None:
        """Each group's totals as the report carries them (``CommSource.groups``)."""
        with self._lock:
            if not self.totals:
                return None
            return {name: totals.wire(step_seconds) for name, totals in self.totals.items()}

    def in_flight(self, thread: int | None = None) -> InFlight | None:
        """The collective ``thread`` waits in, else the oldest DDP bucket launched and
        not completed (``CommSource.in_flight``, read by the sender thread while the
        training thread may append)."""
        waiting = collectives.waiting_in(thread)
        if waiting is not None:
            return waiting
        for record in tuple(self._buckets):
            if record[COMPLETION] is None:
                launch = record[LAUNCH]
                since = None
                if isinstance(launch, float):  # CPU: a perf_counter reading
                    since = time.time() - (_clock() - launch)
                return InFlight(record[COLLECTIVE], record[SEQUENCE], since, self.bucket_group)
        return None

    def _group(self, name: str) -> GroupTotals:
        """The totals of ``name`` (lock held)."""
        totals = self.totals.get(name)
        if totals is None:
            totals = self.totals[name] = GroupTotals(root=collectives.group_names().root(name))
        return totals

    def _keep(self, record: Any, records: list[Any]) -> None:
        if len(records) < MAX_PENDING_RECORDS:
            records.append(record)  # list.append is atomic; fold takes records under the lock
        elif self._failures.allow("overflow"):
            log.warning("trainmon: %d collectives pending without a fold; dropping new ones",
                        len(records))

    def fold(self) -> None:
        """Hand the completed rounds and collectives to the reporter; never raises."""
        if not (self._buckets or self._collectives or self._launches or self._waits):
            return
        try:
            with self._lock:
                measured = self._take_completed()
        except (RuntimeError, ValueError) as error:  # CUDA errors, on the training thread
            if self._failures.allow("fold", str(error)):
                log.warning("trainmon: cannot resolve communication timings: %s", error)
            return
        sink = self._sink()
        if measured is not None and sink is not None:
            sink.add_comm(*measured)

    def close(self) -> None:
        """Stop measuring: hooks and wrappers pass straight through from now on."""
        self.active = False
        if collectives.measuring(self):
            collectives.measure_into(None)

    # -- folding (lock held) ---------------------------------------------------

    def _take_completed(self) -> tuple[float, float | None, int] | None:
        buckets = self._buckets
        rounds, taken = _complete_rounds(buckets)
        if taken:
            records = buckets[:taken]
            del buckets[:taken]  # in place: a hook may append meanwhile (CUDA backward)
            if not self._mixed:  # the usual DDP step: one CPU round
                folded = _fold_cpu_rounds(records, self._cpu_tail)
                if folded is not None:
                    seconds, exposed, nbytes, self._cpu_tail = folded
                    self._group_tails[self.bucket_group] = self._cpu_tail
                    self._credit(self.bucket_group, seconds, exposed)
                    return seconds, exposed, nbytes
        done: list[_Record] = []
        if self._collectives:
            done = [record for record in self._collectives if record.complete()]
            if done:
                finished = {id(record) for record in done}
                self._collectives = [r for r in self._collectives if id(r) not in finished]
        launches: list[Launch] = []
        if self._launches:
            launches = [launch for launch in self._launches
                        if launch.end is not None or collectives.ended_unwaited(launch)]
            if launches:
                self._launches = [launch for launch in self._launches if launch.end is None]
        waits, self._waits = self._waits, []
        if not rounds and not done and not launches and not waits:
            return None
        cpu, gpu = _Timeline(), _Timeline()
        # GPU records as (launch, completion) events, in order: rounds, then collectives.
        events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        event_groups: list[str] = []
        group_spans: dict[str, list[tuple[float, float]]] = {}
        nbytes = 0
        for round_ in rounds:
            cpu_spans: list[tuple[float, float]] = []
            for record in round_:
                nbytes += record[BYTES]
                launch = record[LAUNCH]
                if launch.__class__ is float:
                    cpu_spans.append((launch, record[COMPLETION]))
                else:
                    events.append((launch, record[COMPLETION]))
                    event_groups.append(self.bucket_group)
            if cpu_spans:
                cpu.add_round(cpu_spans)
                group_spans.setdefault(self.bucket_group, []).extend(cpu_spans)
            if len(cpu_spans) < len(round_):
                gpu.rounds.append(len(round_) - len(cpu_spans))
        round_waits = sum(cpu.waits)
        if round_waits:
            self._credit(self.bucket_group, 0.0, round_waits)
        for launch in launches:
            nbytes += launch.nbytes
            span = (launch.start, _end(launch))
            cpu.add_collective(span, False)
            group_spans.setdefault(launch.group, []).append(span)
        for group, start, end in waits:  # what was waited for was in flight meanwhile
            cpu.add_collective((start, end), False)
            group_spans.setdefault(group, []).append((start, end))
        gpu_blocking: list[bool] = [False] * len(events)
        for collective in done:
            nbytes += collective.nbytes
            assert collective.end_event is not None
            events.append((collective.start_event, collective.end_event))
            event_groups.append(collective.group)
            gpu_blocking.append(collective.blocking)
        seconds = exposed = 0.0
        if cpu.spans:
            comm, wait, self._cpu_tail = cpu.fold(self._cpu_tail)
            seconds, exposed = seconds + comm, exposed + wait
        for group, spans in group_spans.items():
            length, self._group_tails[group] = _union_length(
                spans, self._group_tails.get(group, -math.inf))
            self._credit(group, length, None)
        if waits:
            waited, self._wait_tail = _union_length(
                [(start, end) for _, start, end in waits], self._wait_tail)
            exposed += waited
            for group, start, end in waits:
                self._credit(group, 0.0, end - start)
        if events:
            clip = self._gpu_spans(events, gpu, gpu_blocking, event_groups)
            comm, wait, _ = gpu.fold(clip)
            seconds, exposed = seconds + comm, exposed + wait
            if gpu.waits:
                self._credit(self.bucket_group, 0.0, sum(gpu.waits))
        exposed_known = bool(rounds) or bool(waits) or any(record.blocking for record in done)
        return seconds, (exposed if exposed_known else None), nbytes

    def _credit(self, group: str, seconds: float, exposed: float | None) -> None:
        """Add to ``group``'s totals (lock held)."""
        totals = self._group(group)
        totals.seconds += seconds
        if exposed is not None:
            totals.exposed_seconds = (totals.exposed_seconds or 0.0) + exposed

    def _gpu_spans(
        self,
        events: list[tuple[torch.cuda.Event, torch.cuda.Event]],
        timeline: _Timeline,
        blocking: list[bool],
        groups: list[str],
    ) -> float:
        """Fill ``timeline`` with the GPU-timeline seconds of each (launch,
        completion) pair relative to the first launch event; where the previous
        fold's intervals ended on that scale. Each pair's duration counts for its
        group (``groups``; their sum, on the GPU timeline).

        ``timeline.rounds`` holds the size of each round (the first pairs of
        ``events``, in order), ``blocking`` a flag per pair. Offsets stay small:
        elapsed times are float32 milliseconds, which lose precision over hours,
        so each fold takes a fresh reference.
        """
        reference = events[0][0]
        spans = [(reference.elapsed_time(launch) / 1e3, reference.elapsed_time(completion) / 1e3)
                 for launch, completion in events]
        for (start, end), group, blocked in zip(spans, groups, blocking, strict=True):
            self._credit(group, max(0.0, end - start), max(0.0, end - start) if blocked else None)
        sizes, timeline.rounds = timeline.rounds, []
        begin = 0
        for size in sizes:
            timeline.add_round(spans[begin:begin + size])
            begin += size
        for span, blocked in zip(spans[begin:], blocking[begin:], strict=True):
            timeline.add_collective(span, blocked)
        latest = max(range(len(spans)), key=lambda index: spans[index][1])
        clip = -math.inf
        if self._gpu_tail is not None:
            clip = reference.elapsed_time(self._gpu_tail) / 1e3
        self._gpu_tail = events[latest][1]
        return clip


class _Timeline:
    """The completed intervals of one timeline (CPU seconds, or GPU seconds from
    a reference event) in one fold: (launch, completion) spans, those the caller
    was blocked for, and per round the exposed wait."""

    __slots__ = ("blocking", "rounds", "spans", "waits")

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self.blocking: list[tuple[float, float]] = []
        #: Exposed wait of each round: max(completion) - launch(its last bucket).
        self.waits: list[float] = []
        #: GPU only, until ``CommMeter._gpu_spans`` converts them: the rounds' sizes.
        self.rounds: list[int] = []

    def add_round(self, spans: list[tuple[float, float]]) -> None:
        self.spans += spans
        last_launch = spans[-1][0]
        self.waits.append(max(0.0, max(map(itemgetter(1), spans)) - last_launch))

    def add_collective(self, span: tuple[float, float], blocking: bool) -> None:
        self.spans.append(span)
        if blocking:
            self.blocking.append(span)

    def fold(self, clip: float) -> tuple[float, float, float]:
        """(union of the intervals, exposed time, where the intervals end): only
        what lies after ``clip``, where the previous fold's intervals ended, counts."""
        comm, covered_until = _union_length(self.spans, clip)
        exposed = sum(self.waits)
        if self.blocking:
            exposed += _union_length(self.blocking, clip)[0]
        return comm, exposed, covered_until


def _end(launch: Launch) -> float:
    assert launch.end is not None
    return launch.end


def _fold_cpu_rounds(
    records: list[BucketRecord], covered_until: float
) -> tuple[float, float, int, float] | None:
    """(union of the intervals after ``covered_until``, exposed time, bytes, where
    the union ends) of complete CPU rounds in one pass, as ``_Timeline.fold`` would
    give them; None unless every record is a CPU one, in launch order (then the
    general fold sorts them)."""
    comm = exposed = 0.0
    nbytes = 0
    previous_launch = round_end = -math.inf
    for launch, completion, size, closes_round, _, _ in records:
        if launch.__class__ is not float or launch < previous_launch:
            return None
        previous_launch = launch
        nbytes += size
        if completion > covered_until:
            comm += completion - (launch if launch > covered_until else covered_until)
            covered_until = completion
        if completion > round_end:
            round_end = completion
        if closes_round:
            if round_end > launch:
                exposed += round_end - launch
            round_end = -math.inf
    return comm, exposed, nbytes, covered_until


def _complete_rounds(buckets: list[BucketRecord]) -> tuple[list[list[BucketRecord]], int]:
    """The complete rounds at the head of the launch-ordered bucket records, and
    how many records they hold."""
    rounds: list[list[BucketRecord]] = []
    begin = 0
    for index, record in enumerate(buckets):
        completion = record[COMPLETION]
        if completion is None or (completion.__class__ is not float
                                  and not _events_done(record)):
            break
        if record[CLOSES_ROUND]:
            rounds.append(buckets[begin:index + 1])
            begin = index + 1
    return rounds, begin


def _events_done(record: BucketRecord) -> bool:
    """True once both events of a CUDA bucket record have run (never blocks)."""
    return (bool(record[COMPLETION].query())
            and bool(record[LAUNCH].query()))


def _union_length(
    intervals: Iterable[tuple[float, float]], covered_until: float = -math.inf
) -> tuple[float, float]:
    """Total length the intervals cover after ``covered_until`` (overlaps counted
    once), and where the covered part ends (``covered_until`` if they end before)."""
    total = 0.0
    for start, end in sorted(intervals):
        if end <= covered_until:
            continue
        total += end - max(start, covered_until)
        covered_until = end
    return total, covered_until


# -- DDP ---------------------------------------------------------------------------


class _BucketTimer:
    """The DDP communication hook: times each bucket around ``hook(state, bucket)``
    (``allreduce_hook``: done here, with one callback per bucket)."""

    # DDP checks the hook's signature; string annotations would not pass.
    __signature__ = inspect.Signature([
        inspect.Parameter("state", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("bucket", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    ])

    def __init__(self, meter: CommMeter | None, hook: HookFn) -> None:
        #: None until ``instrument()`` attaches one (``timed_comm_hook``).
        self.meter = meter
        self.hook = hook
        self._allreduce = hook is allreduce_hook
        #: What a bucket in flight is waiting in: the all-reduce, else the user's hook.
        self._collective = "all_reduce" if self._allreduce else "comm_hook"
        # DDP keys checks (bf16 needs NCCL ≥ 2.10) and its logs on the hook's name.
        self.__name__ = getattr(hook, "__name__", "comm_hook")
        self.__qualname__ = getattr(hook, "__qualname__", self.__name__)

    def __call__(
        self, state: object, bucket: GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        meter = self.meter
        if meter is None or not meter.active:
            return self.hook(state, bucket)
        buffer = bucket.buffer()
        cuda = buffer.is_cuda
        record: BucketRecord = [_launch_event() if cuda else _clock(), None, 0, bucket.is_last(),
                                self._collective]
        if self._allreduce and not buffer.is_complex() and not torch.compiler.is_compiling():
            # allreduce_hook's collective, as DDP's built-in hook issues it.
            group = cast("dist.ProcessGroup", state if state is not None else dist.group.WORLD)
            buffer.div_(group.size())
            collectives.in_bucket_hook(_ignore_bytes)  # the bucket's own all-reduce
            try:
                future = group.allreduce([buffer]).get_future()
            finally:
                collectives.in_bucket_hook(None)
            record[BYTES] = buffer.numel() * buffer.element_size()
            meter.add_bucket(record)

            def reduced(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
                _complete(record, cuda)
                return done.value()[0]

            return future.then(reduced)
        collectives.in_bucket_hook(functools.partial(_add_bytes, record))
        try:
            hooked = self.hook(state, bucket)
        finally:
            collectives.in_bucket_hook(None)
        if not record[BYTES]:  # no collective seen through torch.distributed
            record[BYTES] = buffer.numel() * buffer.element_size()
        meter.add_bucket(record)

        def completed(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            _complete(record, cuda)
            return done.value()

        return hooked.then(completed)


def _ignore_bytes(nbytes: int) -> None:
    """The bucket's own all-reduce: its bytes are the buffer's, counted by the timer."""


def _add_bytes(record: BucketRecord, nbytes: int) -> None:
    """A collective the user's hook issued for the bucket: its bytes are the bucket's."""
    record[BYTES] += nbytes


def _launch_event() -> torch.cuda.Event:
    event = _timing_event()
    event.record()
    return event


def _complete(record: BucketRecord, cuda: bool) -> None:
    """Write a bucket's completion (its future's callback, a backend thread)."""
    try:
        if cuda:
            event = _timing_event()
            event.record()  # the current stream waits for the collective
            record[COMPLETION] = event
        else:
            record[COMPLETION] = _clock()
    except RuntimeError as error:  # a CUDA error here must not fail the collective
        log.debug("trainmon: cannot time a gradient bucket: %s", error)


def timed_comm_hook(hook: HookFn) -> HookFn:
    """A DDP communication hook that runs ``hook`` and is timed once
    ``Reporter.instrument()`` is called on the model it is registered on.

    For frameworks that register the user's hook themselves (Lightning's
    ``DDPStrategy(ddp_comm_hook=...)``): register this instead.
    """
    return _BucketTimer(None, hook)


def _instrument_ddp(
    meter: CommMeter, model: DistributedDataParallel, hook: HookFn | None, state: object
) -> bool:
    hooks = [registered for registered, _ in getattr(model, "_comm_hooks", [])]
    timers = [registered for registered in hooks if isinstance(registered, _BucketTimer)]
    if timers:  # registered through timed_comm_hook: start timing it
        timers[0].meter = meter
        return True
    registered = [getattr(h, "__qualname__", repr(h)) for h in hooks]
    builtin = model._get_ddp_logging_data().get("comm_hook")  # type: ignore[no-untyped-call]
    if registered or (builtin and builtin != "builtin_allreduce"):
        log.warning(
            "trainmon: this DistributedDataParallel model already has the communication hook %s "
            "(DDP takes one); pass it to instrument(model, comm_hook=..., comm_state=...) "
            "instead of registering it. Communication is not measured.",
            registered[0] if registered else builtin,
        )
        return False
    if hook is None:
        hook, state = allreduce_hook, model.process_group
    model.register_comm_hook(state, _BucketTimer(meter, hook))
    return True


# -- FSDP ------------------------------------------------------------------------


def _fsdp_groups(model: nn.Module) -> list[object]:
    """The process groups of the FSDP2 (``fully_shard``) and FSDP1 modules in ``model``."""
    groups: list[object] = []
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
    except ImportError:
        return groups
    for module in model.modules():
        if isinstance(module, FSDPModule):
            param_group = module._get_fsdp_state()._fsdp_param_group
            if param_group is None:
                continue
            for info in (param_group.mesh_info, param_group.post_forward_mesh_info):
                if info is None:
                    continue
                groups.extend(info.mesh.get_all_groups())
                groups.append(getattr(info, "reduce_scatter_process_group", None))
        elif isinstance(module, FSDP1):
            groups.append(module.process_group)
            groups.append(getattr(module, "_inter_node_pg", None))
    unique: dict[int, object] = {id(group): group for group in groups if group is not None}
    return list(unique.values())


# -- the entry point ---------------------------------------------------------------

#: Models already instrumented, with their meter (instrumenting twice is a no-op).
_INSTRUMENTED: weakref.WeakKeyDictionary[nn.Module, CommMeter] = weakref.WeakKeyDictionary()


def instrument(
    sink: CommSink,
    model: object,
    *,
    comm_hook: HookFn | None = None,
    comm_state: object = None,
    source: object = None,
) -> CommMeter | None:
    """Measure the communication of ``model``'s job into ``sink`` (the reporter);
    the meter, or None if it cannot be measured (one warning says why).

    A DDP model gets the bucket timer; any model of a process whose
    ``torch.distributed`` is initialised has every collective of the process
    measured (``trainmon.client.collectives``), its groups named after the mesh
    dimensions its DTensor parameters and FSDP2 modules live on, DDP's and FSDP's
    groups ``dp`` where no mesh names them. ``source`` is the reporter's current
    meter, reused for a second model.
    """
    if not isinstance(model, nn.Module):
        log.warning("trainmon: instrument() got a %s, not a torch.nn.Module; "
                    "communication is not measured", type(model).__name__)
        return None
    known = _INSTRUMENTED.get(model)
    if known is not None:
        if known is not source:
            log.warning("trainmon: this model is already instrumented by another reporter")
        return known if known is source else None
    if not (dist.is_available() and dist.is_initialized()):
        log.warning("trainmon: instrument() needs an initialised torch.distributed process "
                    "group (%s has none); communication is not measured", type(model).__name__)
        return None
    meter = source if isinstance(source, CommMeter) else CommMeter(sink)
    names = collectives.group_names()
    names.assign_meshes(_meshes(model))
    if isinstance(model, DistributedDataParallel):
        if not _instrument_ddp(meter, model, comm_hook, comm_state):
            return None
        names.assign(model.process_group, "dp")
        meter.bucket_group = names.name(model.process_group)
    elif comm_hook is not None:
        log.warning("trainmon: comm_hook is for DistributedDataParallel models; "
                    "ignored for %s", type(model).__name__)
    for group in _fsdp_groups(model):
        names.assign(group, "dp")
    collectives.measure_into(meter)
    _INSTRUMENTED[model] = meter
    return meter


def _meshes(model: nn.Module) -> list[object]:
    """The device meshes of ``model``'s DTensor parameters and FSDP2 modules."""
    meshes: dict[int, object] = {}
    for parameter in model.parameters():
        mesh = getattr(parameter, "device_mesh", None)
        if mesh is not None:
            meshes.setdefault(id(mesh), mesh)
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return list(meshes.values())
    for module in model.modules():
        if isinstance(module, FSDPModule):
            param_group = module._get_fsdp_state()._fsdp_param_group
            if param_group is not None:
                mesh = param_group.mesh_info.mesh
                meshes.setdefault(id(mesh), mesh)
    return list(meshes.values())
