"""Every collective of the process, whatever issued it, and the time waited in it.

The torch side of ``Reporter.instrument`` beside the DDP hook
(``trainmon.client.distributed``); imported only there. Which source is the
authority for what (docs/protocol.md, "Measured communication"):

- **Launches**: the methods of ``ProcessGroup`` (``allreduce``,
  ``_allgather_base``, ``_reduce_scatter_base``, ``send``, ``recv``, ``barrier``...).
  Every ``torch.distributed`` call reaches one of them at run time, sync or
  async, whoever made it (DDP's broadcasts, FSDP1 and FSDP2, pipelining's
  point-to-point ops, DeepSpeed- and Megatron-style code, even through an alias
  bound before instrumentation), so wrapping the class once catches them all.
  **Functional collectives** (``torch.distributed._functional_collectives``:
  DTensor, tensor, sequence and context parallel, and their backward functions)
  reach c10d from C++ and are wrapped where Python calls them, the ops of
  ``torch.ops._c10d_functional``. A launch is counted on its
  group, with its bytes (what this rank contributes), as the group's next
  sequence number.
- **Waits**: ``Work.wait`` (a synchronous call's own wait; FSDP2's and
  pipelining's waits on asynchronous works) and the functional collectives'
  ``wait_tensor`` (an ``AsyncCollectiveTensor``'s first use). On the CPU the
  caller is blocked there: that time is **exposed**, on the group of the work
  waited for. While a thread waits, ``waiting_in`` says in which collective (op,
  group, sequence number, since when): the stall watchdog shows a rank blocked
  in C++ as waiting in that collective, not as its own code.
- **In flight**: a launch's interval ends when it is waited for, or, for a work
  nobody waits for, when a fold (each ``step()``) sees it completed: no callback per
  collective on the CPU (on CUDA, the future's callback records the completion event).
- **DDP gradient buckets** stay with the communication hook (``distributed``),
  whose launches do not count here again.
- **CUDA** (NCCL): a wait is a stream synchronisation, not a block, so waits
  give no exposed time; intervals are CUDA events (``distributed._Record``).

PyTorch's flight recorder (``TORCH_FR_BUFFER_SIZE``) records the same launches
with c10d's own sequence numbers, but on gloo it never marks one completed,
it leaves out point-to-point ops, recording costs about 90 µs per collective
and a dump of 1 000 records about 90 ms to read: the client does not turn it
on (docs/benchmarks.md, "Collectives of any framework").

Group names (``GroupNames``): the mesh dimension a group serves (``DeviceMesh``
dimension names, found on the instrumented model's DTensor parameters and FSDP2
meshes); ``dp`` for DDP's and FSDP's groups; ``pp`` for point-to-point ops on a
group without a mesh name; else a ``mesh_<dim>`` description's dimension,
``world`` for the default group, the group's description (``group`` without one:
``new_group(ranks)``; the lowest rank tells such groups apart). At most
``MAX_COMM_GROUPS`` names; later groups share ``other``.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from trainmon.client.comm import OTHER_GROUP, group_name
from trainmon.client.watchdog import InFlight
from trainmon.training.report_fields import MAX_COMM_GROUPS

log = logging.getLogger(__name__)

_clock = time.perf_counter

#: ``ProcessGroup`` methods timed, with the collective's name and the position of
#: the argument holding what this rank contributes (None: nothing, a barrier).
PROCESS_GROUP_METHODS: dict[str, tuple[str, int | None]] = {
    "allreduce": ("all_reduce", 0),
    "allreduce_coalesced": ("all_reduce", 0),
    "allgather": ("all_gather", 1),
    "_allgather_base": ("all_gather", 1),
    "allgather_coalesced": ("all_gather", 1),
    "allgather_into_tensor_coalesced": ("all_gather", 1),
    "all_gather_single": ("all_gather", 1),
    "all_gather_single_coalesced": ("all_gather", 1),
    "reduce_scatter": ("reduce_scatter", 1),
    "_reduce_scatter_base": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 1),
    "reduce_scatter_single": ("reduce_scatter", 1),
    "reduce_scatter_single_coalesced": ("reduce_scatter", 1),
    "alltoall": ("all_to_all", 1),
    "all_to_all_single": ("all_to_all", 1),
    "alltoall_base": ("all_to_all", 1),
    "broadcast": ("broadcast", 0),
    "reduce": ("reduce", 0),
    "gather": ("gather", 1),
    "scatter": ("scatter", 1),
    "send": ("send", 0),
    "recv": ("recv", 0),
    "recv_anysource": ("recv", 0),
    "barrier": ("barrier", None),
}
#: Point-to-point ops: a pipeline's, unless their group has a mesh name.
POINT_TO_POINT = frozenset({"send", "recv"})
#: Functional collectives timed (the ops of ``torch.ops._c10d_functional``, which
#: the Python entry points, DTensor and the collectives' backward functions call),
#: with the collective's name.
FUNCTIONAL_COLLECTIVES: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
}
DEFAULT_GROUP = "world"
#: Groups made without a description (``new_group(ranks)``): told apart by their root.
ANONYMOUS_GROUP = "group"
#: Functional collectives launched and not yet waited for, at most (results never
#: waited for are forgotten oldest first).
MAX_PENDING_TENSORS = 4096
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:@/+-]+")


@dataclass
class Launch:
    """One collective from launch to completion."""

    group: str
    op: str
    seq: int
    nbytes: int
    start: float
    #: ``perf_counter`` seconds at completion; None until its work completes or
    #: is waited for.
    end: float | None = None
    #: Seconds a caller was blocked waiting for it (CPU).
    waited: float = 0.0
    #: Unix time it started (for the stall line).
    since: float = 0.0
    #: On CUDA, its events (``distributed._Record``); completion finishes it.
    record: Any = None
    #: The CPU work (a weak reference), for a fold to see it completed un-waited.
    work: Any = None
    #: ``perf_counter`` seconds when the launching call returned: a wait that starts
    #: within ``IMMEDIATE_WAIT_SECONDS`` of it is the synchronous call's own.
    returned: float = 0.0


class LaunchSink(Protocol):
    """What the wrappers report to: the process's measuring ``CommMeter``."""

    active: bool

    def launch(self, group: str, op: str, nbytes: int, *, cuda: bool) -> Launch:
        """Count a launch on the group named ``group``; its record."""
        ...

    def waited(self, launch: Launch | None, start: float, end: float) -> None:
        """A thread was blocked from ``start`` to ``end`` (``perf_counter``) for ``launch``
        (None: a work whose launch was not seen)."""
        ...


class GroupNames:
    """The name each process group is reported under (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: id(group) -> (the group, kept alive so its id stays unique; its name).
        self._named: dict[int, tuple[object, str]] = {}
        self._point_to_point: dict[int, str] = {}
        self._used: set[str] = set()
        self._roots: dict[str, int | None] = {}

    def assign(self, group: object, name: str) -> None:
        """Name ``group`` (a mesh dimension, DDP's or FSDP's group); a name given
        first stays."""
        if group is None:
            return
        with self._lock:
            if id(group) not in self._named:
                self._named[id(group)] = (group, self._admit(name, group))

    def assign_meshes(self, meshes: Iterable[Any]) -> None:
        """Name every group of each ``DeviceMesh`` after its dimension."""
        for mesh in meshes:
            for dim, name in enumerate(getattr(mesh, "mesh_dim_names", None) or ()):
                try:
                    group = mesh.get_group(dim)
                except (RuntimeError, ValueError, KeyError):
                    continue
                self.assign(group, name)

    def name(self, group: object, *, point_to_point: bool = False) -> str:
        """The name of ``group`` (None: the default group)."""
        if group is None:
            group = dist.group.WORLD
        key = id(group)
        known = self._named.get(key)
        if known is not None:
            if point_to_point and known[1] in (DEFAULT_GROUP, OTHER_GROUP):
                return self._pipeline_name(group)
            return known[1]
        if point_to_point:
            return self._pipeline_name(group)
        with self._lock:
            if key not in self._named:
                self._named[key] = (group, self._admit(_described(group), group))
            return self._named[key][1]

    def root(self, name: str) -> int | None:
        """The lowest global rank of the group first named ``name``."""
        return self._roots.get(name)

    def _pipeline_name(self, group: object) -> str:
        name = self._point_to_point.get(id(group))
        if name is None:
            with self._lock:
                name = self._point_to_point.setdefault(id(group), self._admit("pp", group))
        return name

    def _admit(self, name: str, group: object) -> str:
        """``name`` if it is used already or a slot is left, else ``OTHER_GROUP``
        (lock held)."""
        name = group_name(_UNSAFE.sub("_", name)) if name else OTHER_GROUP
        if name not in self._used:
            if len(self._used) >= MAX_COMM_GROUPS - 1 and name != OTHER_GROUP:
                name = OTHER_GROUP
            self._used.add(name)
            self._roots.setdefault(name, _lowest_rank(group))
        return name


def _described(group: object) -> str:
    description = str(getattr(group, "group_desc", "") or "")
    if description.startswith("mesh_"):
        return description[len("mesh_"):]
    if group is dist.group.WORLD or description == "default_pg":
        return DEFAULT_GROUP
    if description in ("", "undefined"):  # a new_group() without a description
        return ANONYMOUS_GROUP
    return description


def _lowest_rank(group: object) -> int | None:
    try:
        ranks = dist.get_process_group_ranks(group)  # type: ignore[arg-type]
    except (RuntimeError, ValueError, AttributeError):
        return None
    return min(ranks) if ranks else None


# -- the process-wide wrappers -----------------------------------------------------


class _Current(threading.local):
    #: Set by the DDP hook while it runs: its launches are its bucket's, whose bytes
    #: this adds to; they are not counted here.
    bucket: Callable[[int], None] | None = None


_current = _Current()
#: The meter launches and waits go to (one per process: the latest to instrument).
_sink: weakref.ref[LaunchSink] | None = None
#: Works launched through a wrapper, until waited for or gone.
_works: weakref.WeakKeyDictionary[Any, Launch] = weakref.WeakKeyDictionary()
#: A wait this soon after its launch returned is a synchronous call's: the caller
#: was blocked from the launch on (seconds; an asynchronous wait this soon is
#: counted the same: it costs at most this much more).
IMMEDIATE_WAIT_SECONDS = 1e-3
#: Functional collectives' results not yet waited for, by their storage's address.
_pending_tensors: dict[int, Launch] = {}
#: What each thread waits in now: thread id -> the launch (None: unknown).
_waiting: dict[int, tuple[Launch | None, float]] = {}
_install_lock = threading.Lock()
_installed = False


def measure_into(sink: LaunchSink | None) -> None:
    """Send launches and waits to ``sink`` from now on (None: nowhere); installs the
    wrappers once per process, never undone (other code may hold them)."""
    global _sink
    _install()
    _sink = None if sink is None else weakref.ref(sink)


def measuring(sink: LaunchSink) -> bool:
    """True while ``sink`` is the one launches go to."""
    return _sink is not None and _sink() is sink


def _work_class() -> Any:
    return torch._C._distributed_c10d.Work


def in_bucket_hook(add_bytes: Callable[[int], None] | None) -> None:
    """Tell the wrappers that a DDP hook runs on this thread (None: no longer): its
    launches are its bucket's, their bytes go to ``add_bytes``."""
    _current.bucket = add_bytes


def waiting_in(thread: int | None) -> InFlight | None:
    """The collective ``thread`` (any thread when None) is blocked in now."""
    entry = _waiting.get(thread) if thread is not None else next(iter(_waiting.values()), None)
    if entry is None:
        return None
    launch, since = entry
    if launch is None:
        return InFlight("wait", None, since)
    return InFlight(launch.op, launch.seq, launch.since, launch.group)


def _active_sink() -> LaunchSink | None:
    sink = _sink() if _sink is not None else None
    if sink is None or not sink.active or torch.compiler.is_compiling():
        return None
    return sink


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        group_class = dist.ProcessGroup
        for method, (op, payload) in PROCESS_GROUP_METHODS.items():
            original = getattr(group_class, method, None)
            if original is not None and not getattr(original, "__trainmon_timed__", False):
                setattr(group_class, method, _timed_method(original, op, payload))
        work_class = _work_class()
        work_class.wait = _timed_wait(work_class.wait)
        functional = torch.ops._c10d_functional
        for name, op in FUNCTIONAL_COLLECTIVES.items():
            try:
                original = getattr(functional, name)
            except AttributeError:  # not in this torch
                continue
            if not getattr(original, "__trainmon_timed__", False):
                setattr(functional, name, _timed_functional(original, op))
        waits = getattr(functional, "wait_tensor")  # noqa: B009 (an op looked up by name)
        setattr(functional, "wait_tensor", _timed_wait_tensor(waits))  # noqa: B010
        _installed = True


def _timed_method(original: Callable[..., Any], op: str,
                  payload: int | None) -> Callable[..., Any]:
    point_to_point = op in POINT_TO_POINT

    @functools.wraps(original)
    def method(group: Any, *args: Any, **kwargs: Any) -> Any:
        sink = _active_sink()
        if sink is None:
            return original(group, *args, **kwargs)
        tensors = args[payload] if payload is not None and len(args) > payload else None
        bucket = _current.bucket
        if bucket is not None:  # issued by a DDP hook: the bucket's interval covers it
            bucket(_nbytes(tensors))
            return original(group, *args, **kwargs)
        launch = sink.launch(_NAMES.name(group, point_to_point=point_to_point), op,
                               _nbytes(tensors), cuda=_is_cuda(tensors))
        work = original(group, *args, **kwargs)
        launch.returned = _clock()
        if work is not None:
            try:
                _works[work] = launch
                if launch.record is not None:  # CUDA: the completion event, on its stream
                    work.get_future().then(functools.partial(_completed, launch))
                else:  # CPU: it ends when waited for, or a fold sees it completed
                    launch.work = weakref.ref(work)
            except (AttributeError, RuntimeError, TypeError):  # no future for this op/backend
                pass
        return work

    method.__trainmon_timed__ = True  # type: ignore[attr-defined]
    return method


def _completed(launch: Launch, _future: object) -> None:
    """A CUDA work's future completed (a backend thread): its completion event."""
    launch.record.finish()


def ended_unwaited(launch: Launch) -> bool:
    """Whether a CPU launch nobody waited for has ended (its work completed, or gone);
    then its end is now, as a fold sees it."""
    work = launch.work() if launch.work is not None else None
    try:
        done = work is None or bool(work.is_completed())
    except RuntimeError:  # the work failed: it ended
        done = True
    if done and launch.end is None:
        launch.end = _clock()
    return done


def _timed_wait(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        sink = _active_sink()
        if sink is None:
            return original(work, *args, **kwargs)
        try:
            launch = _works.get(work)
        except TypeError:  # not weak-referenceable: a subclass of another kind
            launch = None

        with _blocked(sink, launch):
            return original(work, *args, **kwargs)

    wait.__trainmon_timed__ = True  # type: ignore[attr-defined]
    return wait


def _timed_functional(original: Any, op: str) -> Callable[..., Any]:
    arguments = [argument.name for argument in original.default._schema.arguments]
    group_at = arguments.index("group_name")

    def collective(*args: Any, **kwargs: Any) -> Any:
        sink = _active_sink()
        if sink is None:
            return original(*args, **kwargs)
        tensors = args[0] if args else next(iter(kwargs.values()), None)
        group_name = kwargs["group_name"] if "group_name" in kwargs else (
            args[group_at] if len(args) > group_at else None)
        launch = sink.launch(_NAMES.name(_named_group(group_name)), op, _nbytes(tensors),
                             cuda=_is_cuda(tensors))
        result = original(*args, **kwargs)
        for tensor in _tensors(result):
            _remember(tensor, launch)
        return result

    collective.__trainmon_timed__ = True  # type: ignore[attr-defined]
    return collective


def _timed_wait_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wait_tensor(tensor: Any) -> Any:
        sink = _active_sink()
        if sink is None:
            return original(tensor)
        with _blocked(sink, _forget(tensor)):
            return original(tensor)

    wait_tensor.__trainmon_timed__ = True  # type: ignore[attr-defined]
    return wait_tensor


class _blocked:
    """Time one wait of the calling thread, and say what it waits in meanwhile."""

    __slots__ = ("launch", "sink", "start", "thread")

    def __init__(self, sink: LaunchSink, launch: Launch | None) -> None:
        self.sink, self.launch = sink, launch

    def __enter__(self) -> None:
        self.thread = threading.get_ident()
        self.start = _clock()
        _waiting[self.thread] = (self.launch, time.time())

    def __exit__(self, *exc_info: object) -> None:
        end = _clock()

        _waiting.pop(self.thread, None)
        self.sink.waited(self.launch, self.start, end)


# -- functional collectives' results ---------------------------------------------


_groups_by_name: dict[str, object] = {}


def _named_group(name: object) -> object:
    """The ``ProcessGroup`` a functional collective names (by its group name)."""
    group = _groups_by_name.get(name) if isinstance(name, str) else None
    if group is None:
        try:
            group = c10d._resolve_process_group(name)  # type: ignore[attr-defined,arg-type]
        except (RuntimeError, ValueError, TypeError, AttributeError, KeyError):
            return None
        if isinstance(name, str) and len(_groups_by_name) < 256:
            _groups_by_name[name] = group
    return group


def _remember(tensor: object, launch: Launch) -> None:
    if not isinstance(tensor, torch.Tensor):
        return
    if len(_pending_tensors) >= MAX_PENDING_TENSORS:
        del _pending_tensors[next(iter(_pending_tensors))]
    _pending_tensors[_storage(tensor)] = launch


def _forget(tensor: object) -> Launch | None:
    """The launch of the result waited for: the collective whose output's storage the
    tensor shares (an ``AsyncCollectiveTensor``'s views wait for their base's)."""
    if not isinstance(tensor, torch.Tensor):
        return None
    return _pending_tensors.pop(_storage(tensor), None)


def _storage(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr() or id(tensor)
    except (RuntimeError, NotImplementedError):  # no storage (a subclass, a meta tensor)
        return id(tensor)


def _tensors(result: object) -> Iterator[object]:
    if isinstance(result, (list, tuple)):
        yield from result
    else:
        yield result


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


#: The process's group names (one process, one set of groups).
_NAMES = GroupNames()


def group_names() -> GroupNames:
    """The process's group names."""
    return _NAMES
