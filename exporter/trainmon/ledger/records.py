"""``RunRecord``: one run as one node's ledger saw it.

The description part is what the run said about itself (its
``RunDescription``, secrets redacted, data paths resolved to their storage);
the summary part is what the recorder measured (``trainmon.ledger.summary``).
Both are JSON mappings so that the ledger, ``GET /api/v1/runs`` and
``trainmon runs --json`` show the same thing; ``to_json()`` is that shape.
``owner`` is the writer identity that owned the run's job (absent from the
records of older daemons: ``""``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Values of ``RunRecord.end_reason`` (None while the run goes on): ``finished``,
#: ``crashed``, ``preempted`` (what the run's ranks said, ``RUN_END_REASONS``), ``lost``
#: (a rank went silent without saying), ``stalled`` (no step for ``stall_seconds``;
#: cleared when steps resume).
END_REASONS = ("finished", "crashed", "preempted", "lost", "stalled")
#: The reasons of a run that is over (a stalled run may resume).
FINAL_END_REASONS = ("finished", "crashed", "preempted", "lost")
#: Reasons written by older trainmon versions, and what they are called now.
RENAMED_END_REASONS = {"vanished": "lost"}
#: The reason of a run from the reasons of its parts (its ranks on one node, or its
#: nodes): the first of these that any part has.
END_REASON_PRECEDENCE = ("crashed", "preempted", "lost", "stalled", "finished")
#: Columns of the ``runs`` table in ``RunRecord`` order (``state`` apart).
COLUMNS = ("job", "run", "node", "config_hash", "started", "ended", "end_reason", "updated",
           "world_size", "ranks", "description", "summary", "owner")


@dataclass(frozen=True)
class RunRecord:
    """One run on one node."""

    job: str
    run: str
    node: str
    config_hash: str
    #: Unix time the run started (the earliest ``started`` of its ranks).
    started: float
    #: Unix time it ended; None while it runs (or stalls).
    ended: float | None
    #: One of ``END_REASONS``; None while it runs.
    end_reason: str | None
    #: Unix time of the latest summary update.
    updated: float
    world_size: int | None
    #: Ranks of the run seen on this node.
    ranks: int
    description: Mapping[str, object] = field(default_factory=dict)
    summary: Mapping[str, object] = field(default_factory=dict)
    #: The writer identity the run belongs to (``uid:1000``, ``token:ci``, ``local``:
    #: ``trainmon.training.writers``); ``""`` for records written before owners were kept.
    owner: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "job": self.job,
            "run": self.run,
            "node": self.node,
            "config_hash": self.config_hash,
            "started": self.started,
            "ended": self.ended,
            "end_reason": self.end_reason,
            "updated": self.updated,
            "world_size": self.world_size,
            "ranks": self.ranks,
            "description": dict(self.description),
            "summary": dict(self.summary),
            "owner": self.owner,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        """The inverse of ``to_json`` (``KeyError``/``TypeError`` on a foreign shape)."""
        return cls(
            job=str(data["job"]), run=str(data["run"]), node=str(data["node"]),
            config_hash=str(data["config_hash"]), started=float(data["started"]),
            ended=None if data["ended"] is None else float(data["ended"]),
            end_reason=current_end_reason(data["end_reason"]), updated=float(data["updated"]),
            world_size=data["world_size"], ranks=int(data["ranks"]),
            description=dict(data["description"]), summary=dict(data["summary"]),
            owner=str(data.get("owner") or ""),
        )

    @classmethod
    def from_row(cls, row: sqlite3.Row | tuple[Any, ...]) -> RunRecord:
        values = dict(zip(COLUMNS, row, strict=True))
        values["description"] = json.loads(values["description"])
        values["summary"] = json.loads(values["summary"])
        return cls.from_json(values)


def current_end_reason(reason: str | None) -> str | None:
    """``reason`` as this version names it (``vanished`` of older ledgers is ``lost``)."""
    return None if reason is None else RENAMED_END_REASONS.get(reason, reason)


def combined_end_reason(reasons: Iterable[str | None]) -> str | None:
    """The reason of a whole from its parts' (``END_REASON_PRECEDENCE``): ``crashed`` if
    any part crashed, else ``preempted``, ``lost``, ``stalled``, ``finished``; None when no
    part has a known reason."""
    present = {current_end_reason(reason) for reason in reasons if reason}
    return next((reason for reason in END_REASON_PRECEDENCE if reason in present), None)
