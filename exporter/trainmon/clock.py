"""The wall clock's steps, seen from the monotonic clock, and a Unix time without them.

An NTP step, a VM resume or an operator's ``date -s`` moves the wall clock
(``time.time``) by seconds to hours at once; the monotonic clock
(``time.monotonic``) never jumps. ``WallSteps`` is fed readings of both clocks
(``observe``, at every report, tick or snapshot of its owner): where the wall
clock's offset from the monotonic clock changed by more than
``STEP_TOLERANCE_SECONDS`` between two readings, the wall clock *stepped* by that
change (NTP's slewing moves it far less between two readings). Its *steady* time
is the wall clock less every step since the first reading: Unix time that goes on
like the monotonic clock across steps and is the wall clock to the bit while it
does not step. A component keeps the times it measures intervals between on the
steady time; it shows them as Unix time as the wall clock reckons them now
(``unix``: the wall clock less such a time is its age, also after a step) or as
it said them then (``said``: what is stored as a run's start and end). A Unix
time read now, by this process or by a sender on its own clock, is put on the
steady time with ``steady`` (docs/architecture.md, "Clocks"). Standard library
only; it reads no clock itself.
"""

from __future__ import annotations

from collections import deque

#: A change of the wall clock's offset from the monotonic clock between two readings
#: beyond this is a step (s).
STEP_TOLERANCE_SECONDS = 1.0
#: Steps remembered for ``said`` (a time before the oldest is shown as if it came after
#: the steps forgotten).
MAX_STEPS = 64


class WallSteps:
    """The wall clock's steps since a first reading of both clocks."""

    def __init__(self, monotonic: float, wall: float) -> None:
        self._offset = wall - monotonic
        #: Seconds the wall clock stepped in all since the first reading.
        self.stepped = 0.0
        #: (steady time of a step, ``stepped`` after it), oldest first.
        self._steps: deque[tuple[float, float]] = deque()
        #: ``stepped`` before the oldest step remembered.
        self._forgotten = 0.0

    def observe(self, monotonic: float, wall: float) -> float:
        """Take a reading of both clocks (made together); returns the steady time."""
        offset = wall - monotonic
        if abs(offset - self._offset) > STEP_TOLERANCE_SECONDS:
            self.stepped += offset - self._offset
            if len(self._steps) == MAX_STEPS:
                self._forgotten = self._steps.popleft()[1]
            self._steps.append((wall - self.stepped, self.stepped))
        self._offset = offset
        return wall - self.stepped

    def steady(self, unix: float) -> float:
        """Unix time as the wall clock reckons it now, on the steady time."""
        return unix - self.stepped

    def unix(self, steady: float) -> float:
        """A steady time as Unix time as the wall clock reckons it now."""
        return steady + self.stepped

    def said(self, steady: float) -> float:
        """A steady time as Unix time as the wall clock said it then (before the steps
        that came later)."""
        stepped = self._forgotten
        for at, total in self._steps:
            if at > steady:
                break
            stepped = total
        return steady + stepped
