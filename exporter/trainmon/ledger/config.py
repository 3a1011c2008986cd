"""The ``collectors.ledger`` configuration section (README: configuration reference).

``path`` None means the default (``trainmon.paths``):
``/var/lib/trainmon/ledger.sqlite3`` for root and for the service user that owns
``/var/lib/trainmon`` (the systemd unit's ``StateDirectory``, the DaemonSet's
hostPath), ``$XDG_STATE_HOME/trainmon/ledger.sqlite3`` for any other user,
``$STATE_DIRECTORY/ledger.sqlite3`` under a systemd unit that names one;
``trainmon serve --demo`` uses ``demo-ledger.sqlite3`` beside that default
unless it is set (``trainmon.demo.history``).
``price_per_gpu_hour`` is optional: without it records carry no cost.
Retention: ``retention_days`` for ended runs, then ``max_runs_per_owner``
per writer identity, then ``max_runs`` in all, taken from the owners with the
most rows first (``trainmon.ledger.store``).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path

from trainmon import contract
from trainmon.paths import SYSTEM_LEDGER_PATH, default_ledger_path
from trainmon.settings import Auto, ConfigError, Section

#: The system default (root's, the deployed daemon's); other users': ``file``.
DEFAULT_LEDGER_PATH = SYSTEM_LEDGER_PATH
_CURRENCY = re.compile(r"[A-Z]{3}")


@dataclass(frozen=True)
class LedgerConfig:
    """The run ledger and its recorder (``trainmon.collectors.ledger``)."""

    #: ``auto`` and ``true`` are the same: on, with an unusable file or
    #: directory reported in /healthz; ``false`` drops the collector.
    enabled: bool | Auto = "auto"
    path: Path | None = None
    #: Ended runs older than this are deleted (days).
    retention_days: float = 180.0
    #: Most runs kept; beyond, the oldest runs of the owner (writer identity) holding
    #: the most rows go first, so one user cannot push out the others' history.
    max_runs: int = 10_000
    #: Most runs kept per owner (writer identity); that owner's oldest go first.
    max_runs_per_owner: int = 1_000
    #: Seconds between two reads of the training store and writes to the file.
    flush_seconds: float = 10.0
    #: A run without a step for this long while still reporting has stalled.
    stall_seconds: float = contract.LEDGER_STALL_SECONDS
    price_per_gpu_hour: float | None = None
    #: ISO 4217 code shown beside costs.
    currency: str = "USD"
    #: The node name stored in records; None: the hostname.
    node: str | None = None

    @property
    def file(self) -> Path:
        """``path``, or the default ledger of the user running this process."""
        return default_ledger_path() if self.path is None else self.path

    @property
    def node_name(self) -> str:
        return self.node or socket.gethostname()


def parse_ledger(section: Section) -> LedgerConfig:
    """The ``collectors.ledger`` section."""
    default = LedgerConfig()
    result = LedgerConfig(
        enabled=section.enabled("enabled", "auto"),
        path=section.optional_path("path"),
        retention_days=section.number("retention_days", default.retention_days, 1, 36500),
        max_runs=section.integer("max_runs", default.max_runs, 1, 10_000_000),
        max_runs_per_owner=section.integer("max_runs_per_owner", default.max_runs_per_owner,
                                           1, 10_000_000),
        flush_seconds=section.number("flush_seconds", default.flush_seconds, 0.1, 3600),
        stall_seconds=section.number("stall_seconds", default.stall_seconds, 1, 86400),
        price_per_gpu_hour=_optional_price(section),
        currency=section.string("currency", default.currency),
        node=section.optional_string("node"),
    )
    section.finish()
    if not _CURRENCY.fullmatch(result.currency):
        raise ConfigError(section.key_path("currency"),
                          f"expected a 3-letter ISO 4217 code such as USD or CNY, "
                          f"got {result.currency!r}")
    return result


def _optional_price(section: Section) -> float | None:
    value = section.raw("price_per_gpu_hour")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e6:
        raise ConfigError(section.key_path("price_per_gpu_hour"),
                          f"expected a price >= 0 per GPU hour, or null; got {value!r}")
    return float(value)
