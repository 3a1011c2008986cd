"""The daemon's collectors built from a configuration, at start and again at a reload.

``assemble(entries, config, demo=...)`` builds the enabled entries (in the order
``trainmon.cli.enabled_collectors`` gives), each with a ``Wiring`` whose
``built`` mapping records which collectors its factory looked up (the ledger
asks for the training store, the GPU collector's process lists, attribution's
attributor). Each ``Part`` keeps its section and those lookups, so that
``assemble(..., previous=assembly)`` can keep what a new configuration did not
change: a part is kept, the same instance with its state, when its section is
equal to the new one and every collector its factory looked up is, in the new
assembly, the same instance (or still absent); any other is built anew. A
rebuilt GPU collector so rebuilds attribution and numa, which read it. A part
whose section differs only in its entry's ``live_keys`` is kept too: its entry's
``reconfigure`` (which every reload calls, a file the section names may have
changed: the training collector's token file) is one of the ``followups``.

``Assembly.pinned()`` names the parts a reload must keep whatever the new
configuration says (``trainmon.reload``): the entries that ``survives_reload``
(the training store, the run ledger) and, transitively, the collectors they were
built with, unless the entry can ``rewire`` itself to their new instances (the
ledger follows a rebuilt GPU collector and attribution): then only whether each
of them is there is pinned (``Assembly.followed()``), and the kept instance's
change is one of the assembly's ``followups``, made once the new ones run
(``CollectorRegistry.replace``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainmon.config import Config
from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring


@dataclass(frozen=True)
class Part:
    """One built collector, with what it was built from."""

    entry: CollectorEntry[Any]
    #: Its ``collectors.<name>`` section.
    section: object
    collector: Collector
    #: The collectors its factory looked up (``Wiring.built``), by name: the instance
    #: it got, or None for a name it asked about that was not built.
    used: Mapping[str, Collector | None]


@dataclass(frozen=True)
class Assembly:
    """The built collectors of one configuration, in scrape order."""

    parts: tuple[Part, ...] = ()
    #: The changes kept parts make to follow rebuilt inputs (``CollectorEntry.rewire``),
    #: to run once the new collectors run.
    followups: tuple[Callable[[], None], ...] = ()

    @property
    def collectors(self) -> list[Collector]:
        return [part.collector for part in self.parts]

    def pinned(self) -> frozenset[str]:
        """The parts a reload keeps: those whose entry ``survives_reload``, and every
        collector they were built with, transitively, unless the entry can rewire."""
        by_name = {part.entry.name: part for part in self.parts}
        pinned = {name for name, part in by_name.items() if part.entry.survives_reload}
        waiting = list(pinned)
        while waiting:
            part = by_name[waiting.pop()]
            if part.entry.rewire is not None:
                continue
            for name, collector in part.used.items():
                if collector is not None and name not in pinned and name in by_name:
                    pinned.add(name)
                    waiting.append(name)
        return frozenset(pinned)

    def followed(self) -> frozenset[str]:
        """The collectors pinned parts that rewire were built with, or asked for: a
        reload may rebuild them, but not add or remove them."""
        by_name = {part.entry.name: part for part in self.parts}
        return frozenset(name for pinned in self.pinned()
                         if by_name[pinned].entry.rewire is not None
                         for name in by_name[pinned].used)


class _Lookups(Mapping[str, Collector]):
    """The collectors built so far, recording each name a factory looks up."""

    def __init__(self, built: Mapping[str, Collector]) -> None:
        self._built = dict(built)
        self.used: dict[str, Collector | None] = {}

    def __getitem__(self, name: str) -> Collector:
        self.used[name] = self._built.get(name)
        return self._built[name]

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self.used[name] = self._built.get(name)
        return name in self._built

    def __iter__(self) -> Iterator[str]:
        self.used.update(self._built)  # a factory that looks at all depends on all
        return iter(self._built)

    def __len__(self) -> int:
        return len(self._built)


def assemble(
    entries: Sequence[CollectorEntry[Any]],
    config: Config,
    *,
    demo: bool,
    previous: Assembly | None = None,
) -> Assembly:
    """Build ``entries`` (the enabled ones, in order) from ``config``, keeping the
    parts of ``previous`` that nothing changed, or that rewire to what changed. Builds,
    starts nothing: the registry starts the new collectors
    (``CollectorRegistry.start``/``replace``). ``RuntimeError`` rather than building
    anew a part of ``previous`` whose entry ``survives_reload``."""
    before = {part.entry.name: part for part in previous.parts} if previous else {}
    built: dict[str, Collector] = {}
    parts: list[Part] = []
    followups: list[Callable[[], None]] = []
    for entry in entries:
        section = config.collectors[entry.name]
        old = before.get(entry.name)
        part = None
        if old is not None and _takes(entry, old.section, section):
            changes: list[Callable[[], None]] = []
            if entry.reconfigure is not None:
                changes.append(functools.partial(entry.reconfigure, old.collector, section))
            if all(built.get(name) is collector for name, collector in old.used.items()):
                part = Part(entry, section, old.collector, old.used)
            elif entry.rewire is not None:
                lookups = _Lookups(built)
                wiring = Wiring(config.paths.proc, config.paths.sys, demo, lookups)
                change = entry.rewire(old.collector, wiring)
                if change is not None:
                    part = Part(entry, section, old.collector, dict(lookups.used))
                    changes.append(change)
            if part is not None:
                followups.extend(changes)
        if part is None:
            if old is not None and entry.survives_reload:
                raise RuntimeError(f"the {entry.name} collector would be built anew and "
                                   "lose what it holds; restart the daemon instead")
            lookups = _Lookups(built)
            wiring = Wiring(config.paths.proc, config.paths.sys, demo, lookups)
            part = Part(entry, section, entry.build(section, wiring), dict(lookups.used))
        built[entry.name] = part.collector
        parts.append(part)
    return Assembly(tuple(parts), tuple(followups))


def _takes(entry: CollectorEntry[Any], running: Any, section: object) -> bool:
    """Whether an instance built with the ``running`` section can take ``section``: the
    same, or other only in the entry's ``live_keys`` (applied by ``reconfigure``)."""
    if running == section:
        return True
    if entry.reconfigure is None or not entry.live_keys:
        return False
    live = {key: getattr(section, key) for key in entry.live_keys}
    return bool(dataclasses.replace(running, **live) == section)
