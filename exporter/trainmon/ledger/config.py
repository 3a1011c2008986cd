"""The ``collectors.ledger`` configuration section (README: configuration reference).

Here because the ledger's store, the recorder and the demo's history read it;
read by ``trainmon.section.read_section`` with the bounds of its fields' metadata.

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

import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainmon import contract
from trainmon.paths import SYSTEM_LEDGER_PATH, default_ledger_path
from trainmon.section import Auto, ConfigError, Section, setting

#: The system default (root's, the deployed daemon's); other users': ``file``.
DEFAULT_LEDGER_PATH = SYSTEM_LEDGER_PATH
_CURRENCY = re.compile(r"[A-Z]{3}")
#: Set by the DaemonSet from the downward API (``spec.nodeName``): the node's name as
#: the cluster, and so Prometheus' ``node`` label, knows it (docs/deploy.md).
NODE_NAME_VARIABLE = "NODE_NAME"
#: A Kubernetes node name: a DNS subdomain (RFC 1123), at most 253 characters.
_NODE_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")


def default_node_name(environ: Mapping[str, str] | None = None,
                      hostname: Callable[[], str] = socket.gethostname) -> str:
    """``$NODE_NAME`` when it holds a valid Kubernetes node name, else the hostname.

    On Kubernetes the hostname may differ from the node's name (EKS: ``ip-10-0-0-7``
    for ``ip-10-0-0-7.ec2.internal``); anything else in the variable is ignored.
    """
    value = (os.environ if environ is None else environ).get(NODE_NAME_VARIABLE, "")
    return value if _NODE_NAME.fullmatch(value) else hostname()


def _currency(code: str) -> str:
    if not _CURRENCY.fullmatch(code):
        raise ValueError(f"expected a 3-letter ISO 4217 code such as USD or CNY, got {code!r}")
    return code


def _optional_price(section: Section, key: str, default: float | None) -> float | None:
    value = section.raw(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e6:
        raise ConfigError(section.key_path(key),
                          f"expected a price >= 0 per GPU hour, or null; got {value!r}")
    return float(value)


@dataclass(frozen=True)
class LedgerConfig:
    """The run ledger and its recorder (``trainmon.collectors.ledger``)."""

    #: ``auto`` and ``true`` are the same: on, with an unusable file or
    #: directory reported in /healthz; ``false`` drops the collector.
    enabled: bool | Auto = "auto"
    path: Path | None = None
    #: Ended runs older than this are deleted (days).
    retention_days: float = field(default=180.0, metadata=setting(minimum=1, maximum=36500))
    #: Most runs kept; beyond, the oldest runs of the owner (writer identity) holding
    #: the most rows go first, so one user cannot push out the others' history.
    max_runs: int = field(default=10_000, metadata=setting(minimum=1, maximum=10_000_000))
    #: Most runs kept per owner (writer identity); that owner's oldest go first.
    max_runs_per_owner: int = field(
        default=1_000, metadata=setting(minimum=1, maximum=10_000_000))
    #: Seconds between two reads of the training store and writes to the file.
    flush_seconds: float = field(default=10.0, metadata=setting(minimum=0.1, maximum=3600))
    #: A run without a step for this long while still reporting has stalled.
    stall_seconds: float = field(
        default=contract.LEDGER_STALL_SECONDS, metadata=setting(minimum=1, maximum=86400))
    price_per_gpu_hour: float | None = field(
        default=None, metadata=setting(read=_optional_price))
    #: ISO 4217 code shown beside costs.
    currency: str = field(default="USD", metadata=setting(parse=_currency))
    #: The node name stored in records; None: ``$NODE_NAME``, else the hostname.
    node: str | None = None

    @property
    def file(self) -> Path:
        """``path``, or the default ledger of the user running this process."""
        return default_ledger_path() if self.path is None else self.path

    @property
    def node_name(self) -> str:
        return self.node or default_node_name()
