"""``Finding``: one diagnosis rule that fired, shared by the verdict rules and the risk checks.

Its own module so that ``rules`` (the bottleneck verdict) and ``risks`` (the
platform signals beside it) build the same type without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Severities of the risk findings (``risks``), most urgent first. The verdict
#: findings carry none (``""``): the verdict's kind says what to do with them.
SEVERITIES = ("critical", "warning")


@dataclass(frozen=True)
class Finding:
    """One rule that fired: its kind, its code and the numbers behind it."""

    kind: str
    code: str
    values: dict[str, float | str] = field(default_factory=dict)
    #: ``critical`` or ``warning`` for the risk findings (``risks``); empty for the
    #: bottleneck rules, which never need one.
    severity: str = ""
