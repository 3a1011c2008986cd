"""What a collector module declares so that the daemon can run it: its registry entry.

Each module of ``trainmon.collectors`` ends with one ``ENTRY = CollectorEntry(...)``:
its name, its configuration section (a frozen dataclass that
``trainmon.section.read_section`` reads from ``collectors.<name>``; the
``enabled`` default of that class says whether the collector is on by
default), what it needs and the factory that builds it. The order of the
collectors is ``trainmon.collectors.MODULES``; the CLI builds the enabled
entries in that order, each with a ``Wiring``. Nothing here knows a collector.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from trainmon.core.collector import Collector

S = TypeVar("S")
C = TypeVar("C", bound=Collector)


@dataclass(frozen=True)
class Wiring:
    """What a collector factory may use besides its own config section."""

    #: The ``/proc`` and ``/sys`` roots (``paths.proc``, ``paths.sys``; the demo's tree).
    proc_root: Path
    sys_root: Path
    #: ``trainmon serve --demo``: the factory plugs in the simulated source.
    demo: bool
    #: The collectors built before this one, by name (those of ``requires`` among them).
    built: Mapping[str, Collector]

    def collector(self, name: str, kind: type[C]) -> C:
        """The collector ``name`` built before this one, which must be a ``kind``."""
        found = self.built[name]
        if not isinstance(found, kind):
            raise TypeError(f"expected the {name} collector to be a {kind.__name__}, got {found!r}")
        return found


@dataclass(frozen=True)
class CollectorEntry(Generic[S]):
    """One collector of the daemon, as its module declares it."""

    name: str
    #: The ``collectors.<name>`` section class. The collector is on unless its
    #: ``enabled`` is false (``auto`` sources such as the GPU decide at start
    #: whether they are present).
    section: type[S]
    build: Callable[[S, Wiring], Collector]
    #: Reads the collectors before it (their families or their state): built and
    #: scraped after the sources, in the order of ``trainmon.collectors.MODULES``.
    derived: bool = False
    #: Collectors it reads; without them it is not built.
    requires: tuple[str, ...] = ()
    #: Off in demo mode, where its data would be real.
    real_only: bool = False
    #: Holds what a configuration reload must not lose (the training store, the run
    #: ledger): a reload keeps the instance, so its section, and those of the
    #: collectors it was built with, take effect at the next restart (``trainmon.reload``).
    survives_reload: bool = False
    #: How a kept instance follows the collectors it was built with when a reload
    #: rebuilds them (the same ones present): given it and the new wiring, the change
    #: to make once the new ones run, or None when it cannot. Without it, those
    #: collectors of a ``survives_reload`` entry change only at a restart too.
    rewire: Callable[[Collector, Wiring], Callable[[], None] | None] | None = None
    #: The keys of its section a kept instance takes at a reload (the training
    #: collector's token file), through ``reconfigure``, which every reload calls with
    #: the section (a file it names may have changed); the others wait for a restart.
    live_keys: tuple[str, ...] = ()
    reconfigure: Callable[[Collector, S], None] | None = None
