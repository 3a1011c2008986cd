"""A run's on-demand profiles in words (``summary.profiles``: ``trainmon profile``).

The ledger keeps, per profile, the operators with the most self time on the CPU
(``top_cpu``) and on the GPU (``top_device``, empty on a CPU-only job), each with its
``share`` (0-1) of all operators' self time (``trainmon.ledger.summary``, "profiles").
The one formatter of them, used by ``trainmon compare`` and by ``doctor``'s next step
of a compute verdict: ``operators_text``, the first ``TOP_OPERATORS``, ``aten::mm 41 %,
aten::addmm 12 %, …`` (``…`` when the profile holds more). A run's ``latest_profile``
is its newest profile that has operators (a failed one, ``error``, has none);
``top_operators`` says a profile's by GPU time where it has them, else by CPU time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainmon.ledger.summary import profile_entries

#: Operators named before ``…``.
TOP_OPERATORS = 5


def run_profiles(summary: Mapping[str, Any]) -> list[dict[str, object]]:
    """The run's profiles (``summary.profiles``, each checked), oldest first; [] for none
    (or a record of an older daemon)."""
    return profile_entries(summary.get("profiles"))


def latest_profile(summary: Mapping[str, Any]) -> dict[str, object] | None:
    """The run's newest profile with operators; None when it has none (no profile, or
    every one failed)."""
    for entry in reversed(run_profiles(summary)):
        if entry["top_cpu"] or entry["top_device"]:
            return entry
    return None


def operators_text(operators: object, limit: int = TOP_OPERATORS) -> str:
    """``aten::mm 41 %, aten::addmm 12 %, …``: the first ``limit`` operators of a
    profile's ``top_cpu`` or ``top_device`` and their shares of all operators' self
    time; ``-`` for none."""
    entries = [entry for entry in operators if isinstance(entry, Mapping)] if isinstance(
        operators, Sequence) and not isinstance(operators, str) else []
    if not entries:
        return "-"
    words = [f"{entry.get('name', '?')} {_share_text(entry.get('share'))}"
             for entry in entries[:limit]]
    return ", ".join(words + (["…"] if len(entries) > limit else []))


def top_operators(entry: Mapping[str, object]) -> tuple[str, str]:
    """A profile's top operators by GPU self time where it has them (``device``), else by
    CPU self time (``cpu``), and their ``operators_text``."""
    if entry.get("top_device"):
        return "device", operators_text(entry["top_device"])
    return "cpu", operators_text(entry.get("top_cpu"))


def _share_text(share: object) -> str:
    """``0.41`` → ``41 %``; below half a percent ``<1 %``; ``?`` when unknown."""
    if isinstance(share, bool) or not isinstance(share, (int, float)):
        return "?"
    if 0 < share < 0.005:
        return "<1 %"
    return f"{share * 100:.0f} %"
