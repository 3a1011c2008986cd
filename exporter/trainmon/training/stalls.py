"""Which rank holds a stalled job: the rule the diagnosis (``hung_rank``) and the run
ledger (each run's stalls) share.

In a synchronous job one rank that stops holds every other rank in its next
collective. Among the job's ranks whose clients report a stall (docs/protocol.md,
"Stall reports"), the rank that holds the others is the first (in rank order) that
is *not* waiting in a collective: in its loader, a checkpoint, a phase or its own
code. With none such, the rank *missing* from the collectives the others wait in:
by process group and sequence number, the rank of the group whose last launch on
it came before the collective they wait in (``missing_rank``; a rank waiting in
a collective its peers never join is found so: they wait in collectives it has
not reached). With none either, a rank whose reporter went silent (``gone``:
killed, out of memory) holds them; else every stalled rank waits in a collective
and the one that holds them is on another node (``elsewhere``). Standard library
only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

#: ``where`` of a stalled rank waiting for the others.
COLLECTIVE = "collective"
#: What ``holding_rank`` says when the rank went silent, or is on another node.
GONE = "gone"
ELSEWHERE = "elsewhere"
#: What it says of a rank missing from the others' collectives that reports no stall
#: of its own (stopped, or its reports lost): where it is, nobody tells.
MISSING = "missing"
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


def holding_rank(stalled: Sequence[tuple[str, str]], gone: Sequence[str],
                 missing: str = "") -> tuple[str, str]:
    """(rank, where) of the rank that holds the job, from the stalled ranks' (rank,
    where), the ranks whose reporters went silent, each in rank order, and the rank
    missing from the collectives the others wait in (``missing_rank``; "" when none
    is known); ("", ``ELSEWHERE``) when it is on another node."""
    for rank, where in stalled:
        if where != COLLECTIVE:
            return rank, where
    if missing:
        if missing in gone:
            return missing, GONE
        return missing, dict(stalled).get(missing, MISSING)
    if gone:
        return gone[0], GONE
    return "", ELSEWHERE


def missing_rank(waits: Sequence[tuple[str, str, str, int]],
                 launched: Mapping[str, Mapping[tuple[str, str], int]]) -> str:
    """The rank missing from the collectives the stalled ranks wait in: for each rank
    waiting in a collective of a group, (rank, group, root, sequence number), the
    ranks of the same group (name and lowest rank) whose last launch on it
    (``launched``: rank -> (group, root) -> sequence number) came before it are
    behind; the rank behind in the most of those collectives, the lowest of a tie
    ("" when none is behind). A rank waiting in a collective its peers never join is
    found so too: its peers wait in collectives it has not reached."""
    behind: dict[str, int] = {}
    for waiter, group, root, seq in waits:
        for rank, groups in launched.items():
            if rank == waiter:
                continue
            last = groups.get((group, root))
            if last is not None and last < seq:
                behind[rank] = behind.get(rank, 0) + 1
    if not behind:
        return ""
    most = max(behind.values())
    return min((rank for rank, count in behind.items() if count == most), key=_rank_order)


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (2**31, rank)
