"""The configuration file: YAML → frozen objects, validated before anything binds.

``load_config(path)`` and ``parse_config(mapping)`` return a ``Config``; a
missing file (``path=None``) gives the built-in defaults, which start a useful
node daemon on any Linux machine. Errors are ``ConfigError`` with the key path;
a file with several gets them all at once (``ConfigErrors``, one line each).
The keys are documented in the README's configuration reference.

This module only assembles: the top-level keys (``listen``,
``web_config_file``), the ``http`` section (``trainmon.http.listen``), the
``paths`` section and one ``collectors.<name>`` section per registry entry,
each declared by its owner (``trainmon.collectors.MODULES``) and read by
``trainmon.section.read_section``. Only ``trainmon.cli`` imports it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmon.collectors import entries
from trainmon.http.listen import DEFAULT_LISTEN, HTTPConfig, ListenAddress, parse_listen_address
from trainmon.section import ConfigError, Section, read_section

__all__ = [
    "CollectorsConfig",
    "Config",
    "ConfigError",
    "PathsConfig",
    "load_config",
    "parse_config",
]


@dataclass(frozen=True)
class PathsConfig:
    """The ``paths`` section: where the node's kernel files are (``/host/proc`` in a container)."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")


class CollectorsConfig(Mapping[str, object]):
    """The ``collectors`` sections by collector name, in scrape order.

    ``config.collectors["gpu"]`` and ``config.collectors.gpu`` are the
    ``GPUConfig``; ``replace(gpu=...)`` is a copy with other sections.
    """

    __slots__ = ("_sections",)

    def __init__(self, sections: Mapping[str, object] | None = None) -> None:
        """Every entry's section: those of ``sections``, the defaults for the others."""
        given = dict(sections or {})
        known = {entry.name: entry for entry in entries()}
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise KeyError(f"no collector named {unknown[0]}")
        chosen = {name: given[name] if name in given else entry.section()
                  for name, entry in known.items()}
        object.__setattr__(self, "_sections", chosen)

    def __getitem__(self, name: str) -> object:
        sections: dict[str, object] = object.__getattribute__(self, "_sections")
        return sections[name]

    def __iter__(self) -> Iterator[str]:
        return iter(object.__getattribute__(self, "_sections"))

    def __len__(self) -> int:
        return len(object.__getattribute__(self, "_sections"))

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CollectorsConfig is frozen; use replace()")

    def __repr__(self) -> str:
        return f"CollectorsConfig({dict(self)!r})"

    def replace(self, **sections: object) -> CollectorsConfig:
        return CollectorsConfig({**self, **sections})


@dataclass(frozen=True)
class Config:
    listen: ListenAddress = field(default_factory=lambda: parse_listen_address(DEFAULT_LISTEN))
    web_config_file: Path | None = None
    http: HTTPConfig = field(default_factory=HTTPConfig)
    paths: PathsConfig = PathsConfig()
    collectors: CollectorsConfig = field(default_factory=CollectorsConfig)  # the socket: per user


def load_config(path: Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate ``path``; ``None`` gives the built-in defaults."""
    if path is None:
        return Config()
    import yaml  # here, not above: the built-in defaults need no YAML parser in memory

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError("", f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise ConfigError("", f"{path} is not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError("", f"{path} is not valid YAML{where}: {problem}") from None
    return parse_config(data, environ)


def parse_config(data: object, environ: Mapping[str, str] | None = None) -> Config:
    """The ``Config`` of ``data``, or one ``ConfigError`` naming every error in it."""
    root = Section(data, "", environ, errors=[])
    listen = root.attempt(
        lambda: root.parsed("listen", DEFAULT_LISTEN, parse_listen_address), None)
    web_config_file = root.attempt(lambda: root.optional_path("web_config_file"), None)
    http = read_section(HTTPConfig, root.section("http"))
    paths = read_section(PathsConfig, root.section("paths"))
    collectors = _collectors(root.section("collectors"))
    root.finish()
    root.raise_errors()
    assert listen is not None  # its error was raised above
    return Config(listen=listen, web_config_file=web_config_file, http=http, paths=paths,
                  collectors=collectors)


def _collectors(section: Section) -> CollectorsConfig:
    result = CollectorsConfig({
        entry.name: read_section(entry.section, section.section(entry.name))
        for entry in entries()
    })
    section.finish()
    return result
