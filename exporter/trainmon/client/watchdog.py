"""The stall watchdog: where a rank's training thread is once its steps stop (issue 27).

Standard library only, and nothing on the training thread: the reporter's sender
thread calls ``StallWatch.look`` about once a second with what the reporter
already keeps (its steps, the end of its last step, its step histogram), and
sends the stall line it returns (docs/protocol.md, "Stall reports") with its
report. ``step()`` costs the same as without it.

- **When.** No step ended for ``contract.stall_threshold`` of the typical step:
  ten typical steps and at least ten seconds. The typical step is the upper bound
  of the step histogram's median bucket (``contract.STEP_SECONDS_BOUNDS``), so a
  rank is never called stalled early. Not before the first step: a first step
  has nothing to compare with (compilation, the first batch, the rendezvous).
- **Where** (``protocol.STALL_WHERE``), from the training thread's Python stack
  (``sys._current_frames()``: no signal, nothing injected into the loop) and
  what the reporter knows, first match wins:

  * ``data_loader``: the tracked iterator's generator (``Reporter.track``) is on
    the stack: the thread is inside its ``next()``;
  * ``checkpoint``: inside ``with reporter.checkpoint(path)``;
  * ``collective``: a collective the thread waits in, or one in flight, as the
    instrumentation tells (``CommSource.in_flight``: its name, process group,
    sequence number, start; waits inside C++ included: an asynchronous work's
    ``wait()``, a functional collective's ``wait_tensor``), else a
    ``torch.distributed`` collective's frame on the stack (``all_reduce``,
    ``barrier``... in ``distributed_c10d.py``);
  * ``phase``: inside ``with reporter.phase(name)`` (the innermost open one);
  * ``code``: none of these (user code: a lock never released, a busy loop).

- **Frames**: innermost first, at most ``protocol.MAX_STALL_FRAMES``: the file,
  the line, the function, and the line's source (``linecache``) stripped, at most
  ``MAX_FRAME_CODE_LENGTH`` characters, ``REDACTED`` where it names a secret
  (``protocol.is_secret_name``); the file, the function and the line go through
  the secret rule of run descriptions (``redact_text``: URL credentials, secret
  parameters, token shapes; a presigned-URL loader names its code by the URL)
  before they are cut to their lengths; the daemon applies the same rules again.

The stall line repeats with each report while the stall lasts; a report whose
steps moved past the stall's clears it in the daemon, so a lost line costs
nothing.
"""

from __future__ import annotations

import linecache
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import CodeType, FrameType

from trainmon.contract import STEP_SECONDS_BOUNDS, stall_threshold
from trainmon.training.protocol import (
    MAX_FRAME_CODE_LENGTH,
    MAX_FRAME_FILE_LENGTH,
    MAX_FRAME_FUNCTION_LENGTH,
    MAX_STALL_FRAMES,
    REDACTED,
    is_secret_name,
    redact_text,
)
from trainmon.training.report_fields import PROTOCOL_VERSION

#: ``torch.distributed`` functions whose frame on the stack means "in a collective".
COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "all_to_all", "all_to_all_single", "barrier", "broadcast", "broadcast_object_list",
    "gather", "monitored_barrier", "recv", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "scatter", "send",
})
#: The module that holds them.
COLLECTIVES_FILE = "distributed_c10d.py"
#: The deepest a stack is walked (a runaway recursion stays cheap to look at).
MAX_STACK_DEPTH = 512
#: Control characters, which the protocol refuses in texts: sent as spaces.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class InFlight:
    """A collective the instrumentation launched and has not seen complete."""

    op: str
    #: Its sequence number among the rank's collectives on the process group.
    seq: int | None
    #: Unix time it started; None where the clock is the GPU's (CUDA events).
    since: float | None
    #: Its process group's name (``dp``, ``tp``, ``pp``... as in ``comm_groups``).
    group: str | None = None


@dataclass(frozen=True)
class RankState:
    """What the reporter knows of its training thread, read by the sender thread."""

    #: ``threading.get_ident()`` of the thread that drives the reporter.
    thread: int
    steps: int
    #: ``time.perf_counter()`` at the end of the last step (or the loop's start).
    last_step: float
    #: The step-duration histogram (``contract.STEP_SECONDS_BOUNDS``, not cumulative).
    buckets: Sequence[int]
    #: The innermost open ``phase()``, if any.
    phase: str | None
    #: Inside ``checkpoint()``.
    checkpointing: bool
    in_flight: InFlight | None


def typical_step(buckets: Sequence[int]) -> float | None:
    """The upper bound of the median step's bucket; None before any step (or when the
    median lies in the last, unbounded bucket: then the last bound)."""
    total = sum(buckets)
    if total == 0:
        return None
    seen = 0
    for bound, count in zip(STEP_SECONDS_BOUNDS, buckets, strict=False):
        seen += count
        if 2 * seen >= total:
            return bound
    return STEP_SECONDS_BOUNDS[-1]


class StallWatch:
    """Tells, for one reporter, whether its rank has stalled and where it is."""

    def __init__(self, loader_code: CodeType, *,
                 clock: Callable[[], float] = time.perf_counter,
                 wall_clock: Callable[[], float] = time.time) -> None:
        #: The code of ``Reporter.track``: its frame on the stack is "in the loader".
        self._loader_code = loader_code
        self._clock = clock
        self._wall_clock = wall_clock

    def look(self, state: RankState) -> dict[str, object] | None:
        """The stall line's fields (without ``job``, ``rank``, ``reporter_id``,
        ``run``, which the reporter adds) when the rank has stalled, else None."""
        if state.steps == 0:
            return None
        stalled_for = self._clock() - state.last_step
        if stalled_for <= stall_threshold(typical_step(state.buckets)):
            return None
        frame = sys._current_frames().get(state.thread)
        stack = _stack(frame)
        line: dict[str, object] = {
            "v": PROTOCOL_VERSION, "type": "stall", "steps": state.steps,
            "since": self._wall_clock() - stalled_for, "where": self._where(state, stack),
        }
        if state.phase is not None:
            line["phase"] = state.phase
        collective = state.in_flight
        if collective is not None:
            described: dict[str, object] = {"op": collective.op, "seq": collective.seq,
                                             "since": collective.since}
            if collective.group is not None:
                described["group"] = collective.group
            line["collective"] = described
        elif line["where"] == "collective":
            line["collective"] = {"op": next(f.f_code.co_name for f in stack
                                             if _is_collective(f))}
        line["frames"] = [_frame(f) for f in stack[:MAX_STALL_FRAMES]]
        return line

    def _where(self, state: RankState, stack: list[FrameType]) -> str:
        if any(f.f_code is self._loader_code for f in stack):
            return "data_loader"
        if state.checkpointing:
            return "checkpoint"
        if state.in_flight is not None or any(_is_collective(f) for f in stack):
            return "collective"
        if state.phase is not None:
            return "phase"
        return "code"


def _stack(frame: FrameType | None) -> list[FrameType]:
    """The thread's frames, innermost first."""
    frames: list[FrameType] = []
    while frame is not None and len(frames) < MAX_STACK_DEPTH:
        frames.append(frame)
        frame = frame.f_back
    return frames


def _is_collective(frame: FrameType) -> bool:
    code = frame.f_code
    return code.co_name in COLLECTIVES and code.co_filename.endswith(COLLECTIVES_FILE)


def _frame(frame: FrameType) -> dict[str, object]:
    code = frame.f_code
    source = _text(linecache.getline(code.co_filename, frame.f_lineno or 0).strip())
    source = source[:MAX_FRAME_CODE_LENGTH]
    return {
        "file": _text(code.co_filename)[-MAX_FRAME_FILE_LENGTH:],
        "line": frame.f_lineno or 0,
        "function": _text(code.co_name)[:MAX_FRAME_FUNCTION_LENGTH],
        "code": REDACTED if is_secret_name(source) else source,
    }


def _text(value: str) -> str:
    """``value`` as the protocol takes it: through the secret rule (``redact_text``), no
    control characters, no lone surrogates."""
    cleaned = _CONTROL.sub(" ", redact_text(value))
    return cleaned.encode("utf-8", "replace").decode("utf-8")
