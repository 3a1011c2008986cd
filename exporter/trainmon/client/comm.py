"""The one interface between the reporter and whatever measures communication.

Standard library only. ``Reporter`` holds a ``CommSource`` (``Reporter.instrument``
makes one: ``trainmon.client.distributed.CommMeter``, which imports torch) and
hands it a ``CommSink`` (itself) to add what completed. Neither side imports the
other: the torch side knows the reporter only as this protocol.

Per process group the source keeps ``GroupTotals``, cumulative, named by the
group's parallelism dimension (``dp``, ``tp``, ``pp``, ``cp``, ``ep``...) where
there is one; they travel as the report's ``comm_groups`` (docs/protocol.md,
"Measured communication").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from trainmon.client.watchdog import InFlight
from trainmon.training.report_fields import LABEL_PATTERN, MAX_COMM_GROUPS, MAX_GROUP_NAME_LENGTH

#: Where groups past ``MAX_COMM_GROUPS`` (and names the protocol refuses) are counted.
OTHER_GROUP = "other"


class CommSink(Protocol):
    """What a communication source adds its completed intervals to (``Reporter``)."""

    def add_comm(self, seconds: float, exposed_seconds: float | None = None,
                 nbytes: int = 0) -> None: ...


@dataclass
class GroupTotals:
    """What one process group (one parallelism dimension) carried so far."""

    #: Collectives launched on it (point-to-point sends and receives included).
    collectives: int = 0
    #: Bytes of their buffers (what this rank contributes).
    bytes: int = 0
    #: Seconds with one of its collectives in flight (their union, on the CPU clock;
    #: on the GPU timeline the sum of their intervals).
    seconds: float = 0.0
    #: Seconds the rank waited for them; None while nothing tells.
    exposed_seconds: float | None = None
    #: The lowest global rank of the group (with the name, it tells the group apart
    #: from the other groups of its dimension).
    root: int | None = None

    def wire(self, step_seconds: float) -> dict[str, object]:
        """The report's ``comm_groups`` value (``seq`` is the launch count). Exposed
        time is sent as at most the group's seconds in flight and the rank's step
        seconds, as the protocol demands (a wait before the first step, such as
        FSDP's first all-gather, or clipped by an earlier fold, exceeds them); all
        three only grow, so the value sent does too."""
        value: dict[str, object] = {
            "collectives": self.collectives, "bytes": self.bytes, "seconds": self.seconds,
        }
        if self.exposed_seconds is not None:
            value["exposed_seconds"] = min(self.exposed_seconds, self.seconds, step_seconds)
        if self.collectives:
            value["seq"] = self.collectives
        if self.root is not None:
            value["root"] = self.root
        return value


def group_name(name: str) -> str:
    """``name`` as the protocol takes it, else ``OTHER_GROUP``."""
    name = name[:MAX_GROUP_NAME_LENGTH]
    return name if LABEL_PATTERN.fullmatch(name) else OTHER_GROUP


def merged_groups(step_seconds: float, *sources: dict[str, dict[str, object]] | None
                  ) -> dict[str, dict[str, object]] | None:
    """The ``comm_groups`` of several sources in one (the instrumentation's and
    ``Reporter.add_comm``'s): a group's counts and seconds added, its last sequence
    number the highest, its exposed time again at most its seconds and
    ``step_seconds`` (two sources' each within the step may add up past it); past
    ``MAX_COMM_GROUPS`` names, the rest in ``OTHER_GROUP``."""
    present = [groups for groups in sources if groups]
    if len(present) < 2:
        return present[0] if present else None
    merged: dict[str, dict[str, object]] = {}
    for groups in present:
        for name, value in groups.items():
            if name not in merged and len(merged) >= MAX_COMM_GROUPS - 1:
                name = OTHER_GROUP
            into = merged.setdefault(name, {"collectives": 0, "bytes": 0, "seconds": 0.0})
            for key, number in value.items():
                if key == "root":
                    into.setdefault(key, number)
                elif key == "seq":
                    into[key] = max(int(into.get(key, 0)), int(number))  # type: ignore[call-overload]
                else:
                    into[key] = into.get(key, 0) + number  # type: ignore[operator]
    for value in merged.values():
        if "exposed_seconds" in value:
            value["exposed_seconds"] = min(float(value["exposed_seconds"]),  # type: ignore[arg-type]
                                           float(value["seconds"]),  # type: ignore[arg-type]
                                           step_seconds)
    return merged


class CommSource(Protocol):
    """Communication measured by instrumentation, folded into the totals.

    ``fold()`` hands what completed since the last call to the sink's
    ``add_comm``; ``step()``, the sender thread and ``close()`` call it. It must
    not block (events still in flight wait for the next call).
    """

    def fold(self) -> None: ...

    def close(self) -> None: ...

    def in_flight(self, thread: int | None = None) -> InFlight | None:
        """The collective ``thread`` waits in, else the oldest launched and not
        completed, for the stall watchdog (``trainmon.client.watchdog``); None when
        none is, or when it cannot tell."""
        ...

    def launched_collectives(self) -> int | None:
        """Collectives launched so far (the report's ``collective_seq``); None when it
        does not count them."""
        ...

    def groups(self, step_seconds: float) -> dict[str, dict[str, object]] | None:
        """The report's ``comm_groups``: each group's totals (``GroupTotals.wire``,
        exposed time at most ``step_seconds``, the rank's); None before any group
        carried anything."""
        ...
