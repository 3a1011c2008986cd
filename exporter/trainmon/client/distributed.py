"""Communication measured inside DDP and FSDP jobs: the torch side of ``Reporter.instrument``.

Imported only by ``Reporter.instrument()`` (it needs torch); the rest of the
client stays standard-library only. Definitions and limits for users are in
docs/protocol.md, "Measured communication"; the mechanisms:

- **DDP** (``DistributedDataParallel``): a communication hook that wraps the
  default all-reduce (``allreduce_hook``) or the user's hook. A gradient
  bucket's interval runs from the call of the hook (the bucket is ready) to
  the completion of the future it returns; its bytes are those of the
  collectives the hook issues (seen through the wrappers below), else the
  bucket buffer's. A backward pass is one **round**, closed by the bucket DDP
  marks ``is_last()``: the last bucket becomes ready when the rank's own
  backward compute is done, so the round's **exposed** time is
  ``max(completion) - launch(last bucket)``, what the rank waits after its
  compute. A slow rank launches its last bucket late and waits little; the
  ranks waiting for it wait long.
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
nothing is counted twice), ``comm_bytes`` their bytes.
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
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

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


class _Record:
    """One collective or DDP bucket from launch to completion, on one timeline.

    CPU records carry ``perf_counter`` seconds, CUDA records events. ``end`` /
    ``end_event`` are written by the completion callback (a backend thread).
    """

    __slots__ = ("blocking", "end", "end_event", "last", "nbytes", "start", "start_event")

    def __init__(self, cuda: bool, nbytes: int = 0) -> None:
        self.nbytes = nbytes
        #: The caller was blocked for all of it (exposed = its duration).
        self.blocking = False
        #: DDP bucket that closes a round (``GradBucket.is_last()``).
        self.last = False
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
        self._buckets: list[_Record] = []
        self._collectives: list[_Record] = []
        # What earlier folds covered, per timeline: later intervals start after it.
        self._cpu_tail = -math.inf
        self._gpu_tail: torch.cuda.Event | None = None
        self._failures = LogThrottle()
        self.active = True

    def add(self, record: _Record, *, bucket: bool) -> None:
        records = self._buckets if bucket else self._collectives
        if len(records) < MAX_PENDING_RECORDS:
            records.append(record)  # list.append is atomic; fold swaps under the lock
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
        self.add(record, bucket=False)
        return result

    # -- folding (lock held) ---------------------------------------------------

    def _take_completed(self) -> tuple[float, float | None, int] | None:
        rounds, self._buckets = _complete_rounds(self._buckets)
        done = [record for record in self._collectives if record.complete()]
        if done:
            finished = {id(record) for record in done}
            self._collectives = [r for r in self._collectives if id(r) not in finished]
        if not rounds and not done:
            return None
        records = [record for round_ in rounds for record in round_] + done
        cpu = [record for record in records if record.start_event is None]
        gpu = [record for record in records if record.start_event is not None]
        seconds = exposed = 0.0
        if cpu:
            spans = {id(record): (record.start, _end(record)) for record in cpu}
            comm, wait = _fold_timeline(spans, self._cpu_tail, records, rounds)
            seconds, exposed = seconds + comm, exposed + wait
            self._cpu_tail = max(self._cpu_tail, *(end for _, end in spans.values()))
        if gpu:
            spans, clip = self._gpu_spans(gpu)
            comm, wait = _fold_timeline(spans, clip, records, rounds)
            seconds, exposed = seconds + comm, exposed + wait
        exposed_known = bool(rounds) or any(record.blocking for record in records)
        nbytes = sum(record.nbytes for record in records)
        return seconds, (exposed if exposed_known else None), nbytes

    def _gpu_spans(self, records: list[_Record]) -> tuple[dict[int, tuple[float, float]], float]:
        """GPU-timeline seconds of each record relative to the first launch event,
        and where the previous fold's intervals ended on that scale.

        Offsets stay small: elapsed times are float32 milliseconds, which lose
        precision over hours, so each fold takes a fresh reference.
        """
        reference = records[0].start_event
        assert reference is not None
        spans: dict[int, tuple[float, float]] = {}
        latest: tuple[float, torch.cuda.Event] | None = None
        for record in records:
            assert record.start_event is not None and record.end_event is not None
            start = reference.elapsed_time(record.start_event) / 1e3
            end = reference.elapsed_time(record.end_event) / 1e3
            spans[id(record)] = (start, end)
            if latest is None or end > latest[0]:
                latest = (end, record.end_event)
        clip = -math.inf
        if self._gpu_tail is not None:
            clip = reference.elapsed_time(self._gpu_tail) / 1e3
        if latest is not None:
            self._gpu_tail = latest[1]
        return spans, clip


def _fold_timeline(
    spans: dict[int, tuple[float, float]],
    clip: float,
    records: list[_Record],
    rounds: list[list[_Record]],
) -> tuple[float, float]:
    """(union of the intervals, exposed time) of the records of one timeline.

    ``spans`` holds (start, end) seconds of the timeline's records by id;
    starts are clipped to ``clip``, where the previous fold's intervals ended.
    """
    comm = _union_length([(max(start, clip), end) for start, end in spans.values()])
    exposed = _union_length([
        (max(spans[id(record)][0], clip), spans[id(record)][1])
        for record in records if record.blocking and id(record) in spans
    ])
    for round_ in rounds:
        mine = [spans[id(record)] for record in round_ if id(record) in spans]
        if mine:
            last_launch = mine[-1][0]
            exposed += max(0.0, max(end for _, end in mine) - last_launch)
    return comm, exposed


def _end(record: _Record) -> float:
    assert record.end is not None
    return record.end


def _complete_rounds(buckets: list[_Record]) -> tuple[list[list[_Record]], list[_Record]]:
    """Split launch-ordered bucket records into complete rounds and the rest."""
    rounds: list[list[_Record]] = []
    begin = 0
    for index, record in enumerate(buckets):
        if record.last:
            round_ = buckets[begin:index + 1]
            if not all(member.complete() for member in round_):
                break
            rounds.append(round_)
            begin = index + 1
    return rounds, buckets[begin:]


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total = 0.0
    covered_until = -math.inf
    for start, end in sorted(intervals):
        if end <= covered_until:
            continue
        total += end - max(start, covered_until)
        covered_until = end
    return total


# -- DDP ---------------------------------------------------------------------------


class _BucketTimer:
    """The DDP communication hook: times each bucket around ``hook(state, bucket)``."""

    # DDP checks the hook's signature; string annotations would not pass.
    __signature__ = inspect.Signature([
        inspect.Parameter("state", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("bucket", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    ])

    def __init__(self, meter: CommMeter | None, hook: HookFn) -> None:
        #: None until ``instrument()`` attaches one (``timed_comm_hook``).
        self.meter = meter
        self.hook = hook
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
        record = _Record(buffer.is_cuda)
        record.last = bucket.is_last()
        _in_hook.record = record
        try:
            future = self.hook(state, bucket)
        finally:
            _in_hook.record = None
        if not record.nbytes:  # no collective seen through torch.distributed
            record.nbytes = buffer.numel() * buffer.element_size()
        meter.add(record, bucket=True)

        def completed(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            record.finish()
            return done.value()

        return future.then(completed)


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
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        hook, state = allreduce_hook, model.process_group
    model.register_comm_hook(state, _BucketTimer(meter, hook))
    return True


# -- process-group collectives ---------------------------------------------------


class _HookContext(threading.local):
    #: The DDP bucket whose hook runs on this thread: its collectives are its bytes.
    record: _Record | None = None


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
            bucket.nbytes += _nbytes(tensors)
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
