"""``--since``: a duration back from now (``90m``, ``12h``, ``2d``, ``1w``) or an ISO-8601 time.

A time without a zone is UTC (the ledger and Prometheus both keep Unix seconds).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_since(text: str, now: float) -> float:
    """Unix seconds that ``text`` means at ``now``; ValueError with the accepted forms."""
    match = _DURATION.match(text)
    if match:
        return now - float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"--since: expected a duration such as 90m, 12h, 2d, 1w or an ISO-8601 time "
            f"such as 2026-11-30T08:00, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def utc_text(seconds: float) -> str:
    """``2026-12-01 08:15 UTC``."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
