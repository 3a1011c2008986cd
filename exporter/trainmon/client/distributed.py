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

from trainmon.client.watchdog import InFlight
from trainmon.logthrottle import LogThrottle

if TYPE_CHECKING:
    from torch._C._distributed_c10d import GradBucket

    from trainmon.client.reporter import Reporter

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
    """One process-group collective from launch to completion, on one timeline.

    CPU records carry ``perf_counter`` seconds, CUDA records events. ``end`` /
    ``end_event`` are written by the completion callback (a backend thread).
    """

    __slots__ = ("blocking", "end", "end_event", "nbytes", "start", "start_event")

    def __init__(self, cuda: bool, nbytes: int = 0) -> None:
        self.nbytes = nbytes
        #: The caller was blocked for all of it (exposed = its duration).
        self.blocking = False
        self.start = math.nan
        self.end: float | None = None
        self.start_event: torch.cuda.Event | None = None
        self.end_event: torch.cuda.Event | None = None
        if cuda:
            event = _timing_event()
            event.record()
            self.start_event = event
        else:
            self.start = _clock()

    def finish(self, _future: object = None) -> None:
        """Mark completion (future callback, or after a blocking call)."""
        try:
            if self.start_event is not None:
                event = _timing_event()
                event.record()  # the current stream waits for the collective
                self.end_event = event
            else:
                self.end = _clock()
        except RuntimeError as error:  # a CUDA error here must not fail the collective
            log.debug("trainmon: cannot time a collective: %s", error)

    def complete(self) -> bool:
        """True once the interval is known (never blocks)."""
        if self.start_event is None:
            return self.end is not None
        return (
            self.end_event is not None
            and bool(self.end_event.query())  # type: ignore[no-untyped-call]
            and bool(self.start_event.query())  # type: ignore[no-untyped-call]
        )


def _timing_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


class CommMeter:
    """One reporter's measured communication: records in flight, folded on demand.

    Implements ``trainmon.client.reporter.CommSource``.
    """

    def __init__(self, reporter: Reporter) -> None:
        self._reporter = weakref.ref(reporter)
        self._lock = threading.Lock()
        self._buckets: list[BucketRecord] = []
        self._collectives: list[_Record] = []
        # What earlier folds covered, per timeline: later intervals start after it.
        self._cpu_tail = -math.inf
        self._gpu_tail: torch.cuda.Event | None = None
        self._failures = LogThrottle()
        self.active = True
        #: DDP buckets launched so far: the last one's sequence number.
        self.launched = 0

    def add_bucket(self, record: BucketRecord) -> None:
        """Keep a DDP bucket's record until a fold (the hook, on the training thread)."""
        self.launched += 1
        record.append(self.launched)
        self._keep(record, self._buckets)

    def launched_collectives(self) -> int | None:
        """DDP buckets launched so far (``CommSource.launched_collectives``); None before
        the first, or for a model whose collectives are not DDP buckets (FSDP)."""
        return self.launched or None

    def in_flight(self) -> InFlight | None:
        """The oldest DDP bucket launched and not completed (``CommSource.in_flight``,
        read by the sender thread while the training thread may append)."""
        for record in tuple(self._buckets):
            if record[COMPLETION] is None:
                launch = record[LAUNCH]
                since = None
                if isinstance(launch, float):  # CPU: a perf_counter reading
                    since = time.time() - (_clock() - launch)
                return InFlight(record[COLLECTIVE], record[SEQUENCE], since)
        return None

    def _keep(self, record: BucketRecord | _Record, records: list[Any]) -> None:
        if len(records) < MAX_PENDING_RECORDS:
            records.append(record)  # list.append is atomic; fold takes records under the lock
        elif self._failures.allow("overflow"):
            log.warning("trainmon: %d collectives pending without a fold; dropping new ones",
                        len(records))

    def fold(self) -> None:
        """Hand the completed rounds and collectives to the reporter; never raises."""
        if not (self._buckets or self._collectives):
            return
        try:
            with self._lock:
                measured = self._take_completed()
        except (RuntimeError, ValueError) as error:  # CUDA errors, on the training thread
            if self._failures.allow("fold", str(error)):
                log.warning("trainmon: cannot resolve communication timings: %s", error)
            return
        reporter = self._reporter()
        if measured is not None and reporter is not None:
            reporter.add_comm(*measured)

    def close(self) -> None:
        """Stop measuring: hooks and wrappers pass straight through from now on."""
        self.active = False
        _unregister_groups(self)

    def time_collective(
        self, call: Callable[[], Any], *, cuda: bool, nbytes: int, async_op: bool
    ) -> Any:
        """Run one collective on an instrumented group and record its interval."""
        record = _Record(cuda, nbytes)
        result = call()
        if async_op:
            try:
                result.get_future().then(record.finish)
            except (AttributeError, RuntimeError):  # no future for this op/backend
                return result
        else:
            record.blocking = not cuda or torch.cuda.current_stream() == torch.cuda.default_stream()
            record.finish()
        self._keep(record, self._collectives)
        return result

    # -- folding (lock held) ---------------------------------------------------

    def _take_completed(self) -> tuple[float, float | None, int] | None:
        buckets = self._buckets
        rounds, taken = _complete_rounds(buckets)
        if taken:
            records = buckets[:taken]
            del buckets[:taken]  # in place: a hook may append meanwhile (CUDA backward)
            if not self._collectives:  # the usual DDP step: one CPU round
                folded = _fold_cpu_rounds(records, self._cpu_tail)
                if folded is not None:
                    seconds, exposed, nbytes, self._cpu_tail = folded
                    return seconds, exposed, nbytes
        done: list[_Record] = []
        if self._collectives:
            done = [record for record in self._collectives if record.complete()]
            if done:
                finished = {id(record) for record in done}
                self._collectives = [r for r in self._collectives if id(r) not in finished]
        if not rounds and not done:
            return None
        cpu, gpu = _Timeline(), _Timeline()
        # GPU records as (launch, completion) events, in order: rounds, then collectives.
        events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
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
            if cpu_spans:
                cpu.add_round(cpu_spans)
            if len(cpu_spans) < len(round_):
                gpu.rounds.append(len(round_) - len(cpu_spans))
        gpu_blocking: list[bool] = [False] * len(events)
        for collective in done:
            nbytes += collective.nbytes
            if collective.start_event is None:
                cpu.add_collective((collective.start, _end(collective)), collective.blocking)
            else:
                assert collective.end_event is not None
                events.append((collective.start_event, collective.end_event))
                gpu_blocking.append(collective.blocking)
        seconds = exposed = 0.0
        if cpu.spans:
            comm, wait, self._cpu_tail = cpu.fold(self._cpu_tail)
            seconds, exposed = seconds + comm, exposed + wait
        if events:
            clip = self._gpu_spans(events, gpu, gpu_blocking)
            comm, wait, _ = gpu.fold(clip)
            seconds, exposed = seconds + comm, exposed + wait
        exposed_known = bool(rounds) or any(record.blocking for record in done)
        return seconds, (exposed if exposed_known else None), nbytes

    def _gpu_spans(
        self,
        events: list[tuple[torch.cuda.Event, torch.cuda.Event]],
        timeline: _Timeline,
        blocking: list[bool],
    ) -> float:
        """Fill ``timeline`` with the GPU-timeline seconds of each (launch,
        completion) pair relative to the first launch event; where the previous
        fold's intervals ended on that scale.

        ``timeline.rounds`` holds the size of each round (the first pairs of
        ``events``, in order), ``blocking`` a flag per pair. Offsets stay small:
        elapsed times are float32 milliseconds, which lose precision over hours,
        so each fold takes a fresh reference.
        """
        reference = events[0][0]
        spans = [(reference.elapsed_time(launch) / 1e3, reference.elapsed_time(completion) / 1e3)
                 for launch, completion in events]
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


def _end(record: _Record) -> float:
    assert record.end is not None
    return record.end


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
            future = group.allreduce([buffer]).get_future()
            record[BYTES] = buffer.numel() * buffer.element_size()
            meter.add_bucket(record)

            def reduced(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
                _complete(record, cuda)
                return done.value()[0]

            return future.then(reduced)
        _in_hook.record = record
        try:
            hooked = self.hook(state, bucket)
        finally:
            _in_hook.record = None
        if not record[BYTES]:  # no collective seen through torch.distributed
            record[BYTES] = buffer.numel() * buffer.element_size()
        meter.add_bucket(record)

        def completed(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            _complete(record, cuda)
            return done.value()

        return hooked.then(completed)


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


# -- process-group collectives ---------------------------------------------------


class _HookContext(threading.local):
    #: The DDP bucket whose hook runs on this thread: its collectives are its bytes.
    record: BucketRecord | None = None


_in_hook = _HookContext()
#: id(process group) -> (the group, kept alive so its id stays unique; its meter).
_GROUP_METERS: dict[int, tuple[object, weakref.ref[CommMeter]]] = {}
_install_lock = threading.Lock()
_installed = False


def _register_groups(meter: CommMeter, groups: Iterable[object]) -> None:
    with _install_lock:
        for group in groups:
            if group is None:
                continue
            known = _GROUP_METERS.get(id(group))
            other = known[1]() if known else None
            if other is not None and other is not meter and other.active:
                log.warning("trainmon: a process group is instrumented by two reporters; "
                            "the later one measures it")
            _GROUP_METERS[id(group)] = (group, weakref.ref(meter))


def _unregister_groups(meter: CommMeter) -> None:
    with _install_lock:
        for key, (_, owner) in list(_GROUP_METERS.items()):
            if owner() in (meter, None):
                del _GROUP_METERS[key]


def _install_collective_wrappers() -> None:
    """Wrap the ``torch.distributed`` collectives, once per process, never undone.

    Other code (and other wrappers installed after ours) may hold the wrapped
    functions, so they stay; on groups no live meter measures they only pass
    the call through (a dict lookup).
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        for name, payload in COLLECTIVE_PAYLOADS.items():
            original = getattr(dist, name, None)
            if original is not None and not getattr(original, "__trainmon_timed__", False):
                setattr(dist, name, _timed_collective(original, payload))
        _installed = True


def _timed_collective(original: Callable[..., Any], payload: str) -> Callable[..., Any]:
    parameters = list(inspect.signature(original).parameters)
    payload_at = parameters.index(payload)
    group_at = parameters.index("group")
    async_at = parameters.index("async_op")

    def argument(args: tuple[Any, ...], kwargs: dict[str, Any], name: str, at: int) -> Any:
        if name in kwargs:
            return kwargs[name]
        return args[at] if len(args) > at else None

    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        bucket = _in_hook.record
        if (bucket is None and not _GROUP_METERS) or torch.compiler.is_compiling():
            return original(*args, **kwargs)
        tensors = argument(args, kwargs, payload, payload_at)
        if bucket is not None:  # issued by a DDP hook: the bucket's interval covers it
            bucket[BYTES] += _nbytes(tensors)
            return original(*args, **kwargs)
        group = argument(args, kwargs, "group", group_at)
        entry = _GROUP_METERS.get(id(group if group is not None else dist.group.WORLD))
        meter = entry[1]() if entry is not None else None
        if meter is None or not meter.active:
            return original(*args, **kwargs)
        return meter.time_collective(
            lambda: original(*args, **kwargs),
            cuda=_is_cuda(tensors), nbytes=_nbytes(tensors),
            async_op=bool(argument(args, kwargs, "async_op", async_at)),
        )

    collective.__trainmon_timed__ = True  # type: ignore[attr-defined]
    return collective


def _nbytes(tensors: object) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    if isinstance(tensors, (list, tuple)):
        return sum(_nbytes(tensor) for tensor in tensors)
    return 0


def _is_cuda(tensors: object) -> bool:
    if isinstance(tensors, torch.Tensor):
        return tensors.is_cuda
    if isinstance(tensors, (list, tuple)) and tensors:
        return _is_cuda(tensors[0])
    return False


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
    reporter: Reporter,
    model: object,
    *,
    comm_hook: HookFn | None = None,
    comm_state: object = None,
    source: object = None,
) -> CommMeter | None:
    """Measure ``model``'s communication into ``reporter``; the meter, or None if
    the model cannot be measured (one warning says why).

    ``source`` is the reporter's current meter, reused for a second model.
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
    meter = source if isinstance(source, CommMeter) else CommMeter(reporter)
    if isinstance(model, DistributedDataParallel):
        if not _instrument_ddp(meter, model, comm_hook, comm_state):
            return None
        groups: list[object] = [model.process_group]
    else:
        if comm_hook is not None:
            log.warning("trainmon: comm_hook is for DistributedDataParallel models; "
                        "ignored for %s", type(model).__name__)
        groups = _fsdp_groups(model)
        if not groups:
            log.warning(
                "trainmon: instrument() found no DistributedDataParallel or FSDP in %s; "
                "communication is not measured", type(model).__name__,
            )
            return None
    _install_collective_wrappers()
    _register_groups(meter, groups)
    _INSTRUMENTED[model] = meter
    return meter
