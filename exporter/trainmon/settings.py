"""Typed, path-aware reading of one YAML mapping.

``Section`` wraps a mapping and its dotted key path. Each accessor takes one
key, validates it and remembers it was read; ``finish()`` then rejects the keys
nobody asked for. Every error names the full key path and what was expected::

    collectors.disk.exclude: not a valid regular expression: unterminated ...

String values expand ``${VAR}`` from the environment (``$${`` is a literal
``${``); an unset variable is an error, never an empty secret.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal, TypeVar

T = TypeVar("T")

Auto = Literal["auto"]
_MISSING = object()
_ENV_REFERENCE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or invalid."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def expand_environment(value: str, path: str, environ: Mapping[str, str]) -> str:
    """Replace ``${VAR}`` with its value from ``environ``; ``$${`` escapes."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "${"
        if name not in environ:
            raise ConfigError(path, f"environment variable {name} is not set")
        return environ[name]

    return _ENV_REFERENCE.sub(replace, value)


class Section:
    """A mapping being read key by key, with its path for error messages."""

    def __init__(
        self,
        data: object,
        path: str = "",
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(path or "(top level)", f"expected a mapping, got {_kind(data)}")
        for key in data:
            if not isinstance(key, str):
                raise ConfigError(path or "(top level)", f"keys must be strings, got {key!r}")
        self._data: Mapping[str, object] = data
        self.path = path
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        self._read: set[str] = set()

    # -- plumbing -------------------------------------------------------------

    def key_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self._data

    def raw(self, key: str, default: object = None) -> object:
        """The value as parsed by YAML (strings not expanded)."""
        self._read.add(key)
        return self._data.get(key, default)

    def finish(self) -> None:
        """Reject keys that no accessor read."""
        unknown = sorted(set(self._data) - self._read)
        if unknown:
            known = ", ".join(sorted(self._read)) or "none"
            raise ConfigError(self.key_path(unknown[0]), f"unknown key (known keys here: {known})")

    # -- accessors ------------------------------------------------------------

    def section(self, key: str) -> Section:
        return Section(self.raw(key), self.key_path(key), self.environ)

    def string(self, key: str, default: str) -> str:
        value = self.optional_string(key, default)
        if value is None:
            raise ConfigError(self.key_path(key), "expected a string, got null")
        return value

    def optional_string(self, key: str, default: str | None = None) -> str | None:
        value = self.raw(key, default)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ConfigError(self.key_path(key), f"expected a string, got {_kind(value)}")
        return expand_environment(value, self.key_path(key), self.environ)

    def path_value(self, key: str, default: str) -> Path:
        return Path(self.string(key, default))

    def optional_path(self, key: str, default: str | None = None) -> Path | None:
        value = self.optional_string(key, default)
        return Path(value) if value else None

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise ConfigError(self.key_path(key), f"expected true or false, got {_kind(value)}")
        return value

    def enabled(self, key: str, default: bool | Auto) -> bool | Auto:
        """``true``, ``false`` or ``auto`` (on when the source is present)."""
        value = self.raw(key, default)
        if value == "auto":
            return "auto"
        if isinstance(value, bool):
            return value
        raise ConfigError(self.key_path(key), f"expected true, false or auto, got {value!r}")

    def integer(
        self, key: str, default: int, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.key_path(key), f"expected an integer, got {_kind(value)}")
        self._check_range(key, value, minimum, maximum)
        return value

    def number(
        self,
        key: str,
        default: float,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(self.key_path(key), f"expected a number, got {_kind(value)}")
        if not math.isfinite(value):
            raise ConfigError(self.key_path(key), "expected a finite number")
        self._check_range(key, value, minimum, maximum)
        return float(value)

    def regex(self, key: str, default: str | None) -> re.Pattern[str] | None:
        value = self.optional_string(key, default)
        if value is None:
            return None
        try:
            return re.compile(value)
        except re.error as error:
            raise ConfigError(
                self.key_path(key), f"not a valid regular expression: {error}"
            ) from None

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.string(key, default)
        if value not in choices:
            raise ConfigError(
                self.key_path(key), f"expected one of {', '.join(choices)}, got {value!r}"
            )
        return value

    def string_list(self, key: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        value = self.raw(key, list(default))
        if value is None:
            return ()
        if not isinstance(value, list):
            raise ConfigError(self.key_path(key), f"expected a list of strings, got {_kind(value)}")
        items = []
        for index, item in enumerate(value):
            item_path = f"{self.key_path(key)}[{index}]"
            if not isinstance(item, str):
                raise ConfigError(item_path, f"expected a string, got {_kind(item)}")
            items.append(expand_environment(item, item_path, self.environ))
        return tuple(items)

    def string_map(self, key: str) -> dict[str, str]:
        """A mapping of string to string (e.g. tag filters)."""
        sub = self.section(key)
        result = {name: sub.string(name, "") for name in list(sub._data)}
        sub.finish()
        return result

    def string_list_map(self, key: str) -> dict[str, tuple[str, ...]]:
        """A mapping of string to list of strings (e.g. disks per instance)."""
        sub = self.section(key)
        result = {name: sub.string_list(name) for name in list(sub._data)}
        sub.finish()
        return result

    def parsed(self, key: str, default: str, parse: Callable[[str], T]) -> T:
        """A string turned into another type by ``parse`` (ValueError → ConfigError)."""
        text = self.string(key, default)
        try:
            return parse(text)
        except ValueError as error:
            raise ConfigError(self.key_path(key), str(error)) from None

    def _check_range(
        self, key: str, value: float, minimum: float | None, maximum: float | None
    ) -> None:
        if minimum is not None and value < minimum:
            raise ConfigError(self.key_path(key), f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ConfigError(self.key_path(key), f"must be <= {maximum}, got {value}")


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)
