"""The configuration file: YAML → frozen objects, validated before anything binds.

``load_config(path)`` and ``parse_config(mapping)`` return a ``Config``; a
missing file (``path=None``) gives the built-in defaults, which start a useful
node daemon on any Linux machine. Errors are ``ConfigError`` with the key path;
a file with several gets them all at once (``ConfigErrors``, one line each).
The keys are documented in the README's configuration reference.

This module only assembles: the top-level keys (``listen``,
``web_config_file``), the ``http`` section (``trainmon.http.listen``), the
``paths`` and ``reload`` sections and one ``collectors.<name>`` section per registry entry,
each declared by its owner (``trainmon.collectors.MODULES``) and read by
``trainmon.section.read_section``. Only the wiring imports it: ``trainmon.cli``,
``trainmon.assembly`` and ``trainmon.reload``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmon.collectors import entries
from trainmon.http.listen import DEFAULT_LISTEN, HTTPConfig, ListenAddress, parse_listen_address
from trainmon.section import ConfigError, Invalid, Section, read_section, setting

__all__ = [
    "CollectorsConfig",
    "Config",
    "ConfigError",
    "PathsConfig",
    "ReloadConfig",
    "load_config",
    "parse_config",
    "read_config_bytes",
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


#: The largest configuration file read (a reload and the file watcher read it again).
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class ReloadConfig:
    """The ``reload`` section: how a running ``trainmon serve`` takes a new
    configuration (``trainmon.reload``, docs/deploy.md)."""

    #: Read the configuration file this often and reload when its content changed
    #: (a Kubernetes ConfigMap volume); 0: only on SIGHUP and ``POST /-/reload``.
    watch_interval_seconds: float = field(default=0.0, metadata=setting(minimum=0,
                                                                        maximum=3600))
    #: The shortest time between two reloads: a ``POST /-/reload`` sooner is refused
    #: (429), a signal or a file change sooner waits for it.
    min_interval_seconds: float = field(default=1.0, metadata=setting(minimum=0.1,
                                                                      maximum=3600))

    def check(self) -> None:
        if 0 < self.watch_interval_seconds < 1:
            raise Invalid("watch_interval_seconds", "must be 0 (off) or >= 1")


@dataclass(frozen=True)
class Config:
    listen: ListenAddress = field(default_factory=lambda: parse_listen_address(DEFAULT_LISTEN))
    web_config_file: Path | None = None
    http: HTTPConfig = field(default_factory=HTTPConfig)
    paths: PathsConfig = PathsConfig()
    reload: ReloadConfig = ReloadConfig()
    collectors: CollectorsConfig = field(default_factory=CollectorsConfig)  # the socket: per user


def read_config_bytes(path: Path) -> bytes:
    """The content of the configuration file ``path``, at most ``MAX_CONFIG_BYTES``."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ConfigError("", f"cannot read {path}: {error.strerror or error}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError("", f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
    return data


def load_config(path: Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate ``path``; ``None`` gives the built-in defaults."""
    if path is None:
        return Config()
    import yaml  # here, not above: the built-in defaults need no YAML parser in memory

    try:
        text = read_config_bytes(path).decode("utf-8")
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
    reload = read_section(ReloadConfig, root.section("reload"))
    collectors = _collectors(root.section("collectors"))
    root.finish()
    root.raise_errors()
    assert listen is not None  # its error was raised above
    return Config(listen=listen, web_config_file=web_config_file, http=http, paths=paths,
                  reload=reload, collectors=collectors)


def _collectors(section: Section) -> CollectorsConfig:
    result = CollectorsConfig({
        entry.name: read_section(entry.section, section.section(entry.name))
        for entry in entries()
    })
    section.finish()
    return result
