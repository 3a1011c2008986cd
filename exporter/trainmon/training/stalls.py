"""Which rank holds a stalled job: the rule the diagnosis (``hung_rank``) and the run
ledger (each run's stalls) share.

In a synchronous job one rank that stops holds every other rank in its next
collective. Among the job's ranks whose clients report a stall (docs/protocol.md,
"Stall reports"), the rank that holds the others is the first (in rank order) that
is *not* waiting in a collective: in its loader, a checkpoint, a phase or its own
code. With none such, a rank whose reporter went silent (``gone``: killed, out of
memory) holds them; with none either, every stalled rank waits in a collective and
the one that holds them is on another node (``elsewhere``). Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

#: ``where`` of a stalled rank waiting for the others.
COLLECTIVE = "collective"
#: What ``holding_rank`` says when the rank went silent, or is on another node.
GONE = "gone"
ELSEWHERE = "elsewhere"
#: A rank whose reporter (which sends about once a second) sent nothing for this long
#: is gone: finished or dead, no longer stalled.
SILENT_SECONDS = 30.0
#: Longest innermost-frame text (``frame_text``).
MAX_FRAME_TEXT_LENGTH = 160


class FrameLike(Protocol):
    """A frame of a stall report (``trainmon.training.protocol.StallFrame``)."""

    @property
    def file(self) -> str: ...
    @property
    def line(self) -> int: ...
    @property
    def function(self) -> str: ...


def frame_text(frames: Sequence[FrameLike]) -> str:
    """The innermost frame of a stall: ``dataset.py:42 __getitem__`` ("" without one)."""
    if not frames:
        return ""
    frame = frames[0]
    return f"{frame.file.rsplit('/', 1)[-1]}:{frame.line} {frame.function}"[
        :MAX_FRAME_TEXT_LENGTH]


def holding_rank(stalled: Sequence[tuple[str, str]], gone: Sequence[str]) -> tuple[str, str]:
    """(rank, where) of the rank that holds the job, from the stalled ranks' (rank,
    where) and the ranks whose reporters went silent, each in rank order; ("",
    ``ELSEWHERE``) when it is on another node."""
    for rank, where in stalled:
        if where != COLLECTIVE:
            return rank, where
    if gone:
        return gone[0], GONE
    return "", ELSEWHERE
