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
and the one that holds them is on another node (``elsewhere``). The frame a stall
shows (``frame_text``) is the innermost of the rank's own code, not a library's
(``is_library_file``); the stall line keeps the whole stack. Standard library only.
"""

from __future__ import annotations

import re
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
#: Longest frame text (``frame_text``).
MAX_FRAME_TEXT_LENGTH = 160
#: The files of libraries (``is_library_file``), by a directory of their path.
_LIBRARY_PATH = re.compile(
    r"/(?:site-packages|dist-packages|torch|trainmon/client)/"
    r"|/lib(?:64)?/(?:python\d+(?:\.\d+)?t?|pypy\d*(?:\.\d+)?)/")


class FrameLike(Protocol):
    """A frame of a stall report (``trainmon.training.protocol.StallFrame``)."""

    @property
    def file(self) -> str: ...
    @property
    def line(self) -> int: ...
    @property
    def function(self) -> str: ...


def frame_text(frames: Sequence[FrameLike]) -> str:
    """The frame a stall shows: ``dataset.py:42 __getitem__`` ("" without one). The
    innermost of the user's own frames (``is_library_file`` false), so a rank waiting
    inside torch names its ``loss.backward()`` line, not ``graph.py
    _engine_run_backward``; the innermost frame when every frame is a library's."""
    if not frames:
        return ""
    frame = next((each for each in frames if not is_library_file(each.file)), frames[0])
    return f"{frame.file.rsplit('/', 1)[-1]}:{frame.line} {frame.function}"[
        :MAX_FRAME_TEXT_LENGTH]


def is_library_file(path: str) -> bool:
    """Whether a frame's file (as a stall line sends it, ``co_filename``) belongs to
    a library rather than to the job's own code: installed packages (``site-packages``,
    ``dist-packages``), the standard library (``lib/python3.11/``, frozen modules),
    torch itself (a source checkout's ``torch/`` too) and trainmon's client. Told by
    the path alone: the daemon does not know the job's interpreter."""
    return path.startswith("<frozen ") or _LIBRARY_PATH.search(path) is not None


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
