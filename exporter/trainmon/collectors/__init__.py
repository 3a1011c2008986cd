"""One collector per data source; see ``trainmon.core.collector.Collector`` for the contract.

A collector adapts its source's typed readings (``trainmon.node``,
``trainmon.gpu``, ``trainmon.training``, ``trainmon.tencent``...) to metric
families, and every exported name is spelled out in full where it is made.
Each module also declares, beside its collector, its ``collectors.<name>``
configuration section (a frozen dataclass read by
``trainmon.section.read_section``, unless a subsystem below keeps it) and its
registry entry, ``ENTRY = CollectorEntry(...)`` (``trainmon.core.entry``).
``MODULES`` is the one list of them, in scrape order. Only the wiring
(``trainmon.cli``, ``trainmon.config``) imports these modules; the sources
never do (``tests/test_layering.py``).
"""

from __future__ import annotations

import importlib
from typing import Any

from trainmon.core.entry import CollectorEntry

#: Every collector of the daemon, in scrape order: the sources first, then the
#: derived collectors in this order (attribution and numa, which read the GPU
#: collector; pressure, which reads the training store's ranks; the diagnosis,
#: which reads the families collected before it, and from which on everything
#: is evaluated on the registry's clock; health, which sums the node's evidence
#: up per subsystem; the ledger, which records the diagnosis' verdicts with each
#: run; profiling, which keeps its traces beside the ledger and its summaries in it).
MODULES: tuple[str, ...] = (
    "network",
    "infiniband",
    "disk",
    "nfs",
    "gpu",
    "training",
    "platform",
    "tencent",
    "attribution",
    "numa",
    "pressure",
    "diagnosis",
    "health",
    "ledger",
    "profiling",
)


def entries() -> tuple[CollectorEntry[Any], ...]:
    """The ``ENTRY`` of every module of ``MODULES``, in that order."""
    found = []
    for name in MODULES:
        entry = importlib.import_module(f"{__name__}.{name}").ENTRY
        if not isinstance(entry, CollectorEntry) or entry.name != name:
            raise TypeError(f"{__name__}.{name}.ENTRY is not the entry of {name}: {entry!r}")
        found.append(entry)
    return tuple(found)
