"""The YAML section reader: one mapping of the configuration file → one frozen dataclass.

``Section`` wraps a mapping and its dotted key path. Each accessor takes one
key, validates it and remembers it was read; ``finish()`` then rejects the keys
nobody asked for. Every error names the full key path and what was expected::

    collectors.disk.exclude: not a valid regular expression: unterminated ...

``read_section(GPUConfig, section)`` reads a whole section: one key per field
of the frozen dataclass, the accessor chosen by the field's type, the default
the dataclass's own, bounds and hooks from the field's metadata
(``setting(minimum=5, maximum=3600)``). So a section is declared once, where
its owner keeps it, and nobody writes a parser for it:

============================  ==========================================
field type                    YAML value
============================  ==========================================
``bool``                      ``true``/``false``
``bool | Auto``               ``true``/``false``/``auto``
``bool | None``               ``true``/``false``/``null``
``int``, ``float``            a number within ``minimum``/``maximum``
``str``, ``str | None``       a string (``choices`` or a ``Literal``: one of them)
``Path``, ``Path | None``     a path (an empty string is None)
``re.Pattern[str] | None``    a regular expression
``tuple[str, ...]``           a list of strings
``Mapping[str, str]``         a mapping of strings
``Mapping[str, tuple[...]]``  a mapping of lists of strings
a frozen dataclass            a nested section (``inline``: its keys here)
============================  ==========================================

A field that needs more says so in its metadata: ``parse`` turns or checks the
value read (a ``ValueError`` becomes the key's error), ``read`` replaces the
accessor. A section class may define ``check(self)``, raising ``Invalid(key,
message)`` for rules between its keys; it runs once all keys are read.

String values expand ``${VAR}`` from the environment (``$${`` is a literal
``${``); an unset variable is an error, never an empty secret.

A ``Section`` given an ``errors`` list (the configuration file's root, and
through it every section below) collects every error instead of stopping at the
first: a field that fails keeps its default, a section with an error keeps its
dataclass's defaults and skips its ``check``, and ``raise_errors()`` at the end
raises them all at once (``ConfigErrors``). An unknown key says which known key
of its section it most resembles (``difflib``)::

    collectors.ledger.flush_second: unknown key, did you mean flush_seconds?
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

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
        #: Every error this one stands for, one per line of ``str()``: itself here.
        self.errors: tuple[ConfigError, ...] = (self,)


class ConfigErrors(ConfigError):
    """Several errors of one configuration file, in the order they were read;
    ``path`` and ``message`` are the first's, ``str()`` has one line per error."""

    def __init__(self, errors: Sequence[ConfigError]) -> None:
        first = errors[0]
        super().__init__(first.path, first.message)
        self.args = ("\n".join(str(error) for error in errors),)
        self.errors = tuple(errors)


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
        errors: list[ConfigError] | None = None,
    ) -> None:
        """``errors``: None raises the first error; a list collects them all (shared
        with the sections below), for ``raise_errors()``."""
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
        self._errors = errors

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
        """Reject keys that no accessor read, each with the known key it most resembles."""
        known = sorted(self._read)
        for key in sorted(set(self._data) - self._read):
            self.report(ConfigError(self.key_path(key), _unknown_key(key, known)))

    def report(self, error: ConfigError) -> None:
        """Collect ``error`` when this section collects, else raise it."""
        if self._errors is None:
            raise error from None
        self._errors.append(error)

    def attempt(self, read: Callable[[], T], fallback: T) -> T:
        """``read()``, or ``fallback`` once its ``ConfigError`` is reported."""
        try:
            return read()
        except ConfigError as error:
            self.report(error)
            return fallback

    @property
    def error_count(self) -> int:
        """Errors collected so far, in this section and every other of its file."""
        return len(self._errors or ())

    def raise_errors(self) -> None:
        """Raise what was collected: the error itself if one, ``ConfigErrors`` if more."""
        if self._errors:
            raise self._errors[0] if len(self._errors) == 1 else ConfigErrors(self._errors)

    # -- accessors ------------------------------------------------------------

    def section(self, key: str) -> Section:
        """The mapping under ``key``; when it is not one, an empty section once reported."""
        try:
            return Section(self.raw(key), self.key_path(key), self.environ, self._errors)
        except ConfigError as error:
            self.report(error)
            return Section({}, self.key_path(key), self.environ, self._errors)

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

    def optional_boolean(self, key: str, default: bool | None = None) -> bool | None:
        """``true``, ``false`` or ``null``."""
        value = self.raw(key, default)
        if value is None or isinstance(value, bool):
            return value
        raise ConfigError(self.key_path(key), f"expected true, false or null, got {value!r}")

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


class Invalid(ValueError):
    """A rule between keys of a section failed; ``key`` is relative to the section."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


#: ``read`` hook of a field: ``(section, key, default) -> value``.
Reader = Callable[[Section, str, Any], object]


def setting(
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] | None = None,
    parse: Callable[[Any], object] | None = None,
    read: Reader | None = None,
    inline: bool = False,
) -> dict[str, object]:
    """The metadata of one field of a section class, for ``dataclasses.field``.

    ``minimum``/``maximum``: bounds of a number; ``choices``: the allowed
    strings, in the order the error lists them; ``parse``: a function of the
    value read (never of None) that returns the value to keep or raises
    ``ValueError``; ``read``: reads the key itself; ``inline``: a nested
    section class whose keys sit in this section (``include``/``exclude``).
    """
    found = {
        "minimum": minimum, "maximum": maximum, "choices": choices,
        "parse": parse, "read": read, "inline": inline or None,
    }
    return {name: value for name, value in found.items() if value is not None}


#: A ratio: 0 to 1.
RATIO = setting(minimum=0, maximum=1)

S = TypeVar("S")


def read_section(kind: type[S], section: Section, default: S | None = None) -> S:
    """The frozen dataclass ``kind`` read from ``section``: every field's key, then
    the unknown keys rejected, then ``kind.check`` (the module docstring has the
    rules). ``default`` supplies the defaults (``kind()`` when None). A section
    that collects its errors and has one returns ``default`` (``kind()``), unchecked."""
    base = kind() if default is None else default
    errors_before = section.error_count
    values = _read_fields(kind, section, base)
    section.finish()
    if section.error_count > errors_before:
        return base
    result = kind(**values)
    check = getattr(result, "check", None)
    if check is not None:
        try:
            check()
        except Invalid as error:
            section.report(ConfigError(section.key_path(error.key), error.message))
            return base
    return result


def _read_fields(kind: type[Any], section: Section, default: object) -> dict[str, object]:
    if not dataclasses.is_dataclass(kind):
        raise TypeError(f"{kind!r} is not a dataclass")
    hints = typing.get_type_hints(kind)
    return {
        spec.name: _read_field(section, spec.name, hints[spec.name],
                               getattr(default, spec.name), spec.metadata)
        for spec in dataclasses.fields(kind)
        if spec.init
    }


def _read_field(
    section: Section, key: str, hint: object, default: object, meta: Mapping[str, Any]
) -> object:
    """The field's value; its error reported, the default when the section collects."""
    try:
        if "read" in meta:
            value = meta["read"](section, key, default)
        else:
            value = _read_typed(section, key, hint, default, meta)
    except ConfigError as error:
        section.report(error)
        return default
    parse = meta.get("parse")
    if parse is not None and value is not None:
        try:
            value = parse(value)
        except ValueError as error:
            section.report(ConfigError(section.key_path(key), str(error)))
            return default
    return value


def _read_typed(
    section: Section, key: str, hint: object, default: Any, meta: Mapping[str, Any]
) -> object:
    """The accessor of ``Section`` that the field's type calls for."""
    members = set(typing.get_args(hint)) if _is_union(hint) else {hint}
    optional = type(None) in members
    members.discard(type(None))
    literals = [member for member in members if typing.get_origin(member) is Literal]
    plain = members - set(literals)
    lo, hi = meta.get("minimum"), meta.get("maximum")
    if plain == {bool}:
        if literals == [Auto]:
            return section.enabled(key, default)
        if not literals:
            return section.optional_boolean(key, default) if optional else section.boolean(
                key, default)
    elif literals and not plain and not optional:
        choices = meta.get("choices") or tuple(
            value for member in literals for value in typing.get_args(member))
        return section.choice(key, default, choices)
    elif len(plain) == 1 and not literals:
        (kind,) = plain
        if kind is int and not optional:
            return section.integer(key, default, lo, hi)
        if kind is float and not optional:
            return section.number(key, default, lo, hi)
        if kind is str:
            if "choices" in meta:
                return section.choice(key, default, meta["choices"])
            return section.optional_string(key, default) if optional else section.string(
                key, default)
        if kind is Path:
            text = None if default is None else str(default)
            return section.optional_path(key, text) if optional else section.path_value(
                key, str(text))
        if kind == re.Pattern[str] and optional:
            return section.regex(key, None if default is None else default.pattern)
        if kind == tuple[str, ...] and not optional:
            return section.string_list(key, default)
        if kind == Mapping[str, str] and not optional:
            return section.string_map(key)
        if kind == Mapping[str, tuple[str, ...]] and not optional:
            return section.string_list_map(key)
        if dataclasses.is_dataclass(kind) and isinstance(kind, type) and not optional:
            if meta.get("inline"):
                return kind(**_read_fields(kind, section, default))
            return read_section(kind, section.section(key), default)
    raise TypeError(f"{section.key_path(key)}: no reader for a field of type {hint!r}")


def _unknown_key(key: str, known: list[str]) -> str:
    """The message of an unknown key: the known key it most resembles, or all of them."""
    import difflib  # only for a broken file: the daemon's resident set stays without it

    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"unknown key, did you mean {close[0]}?"
    return f"unknown key (known keys here: {', '.join(known) or 'none'})"


def _is_union(hint: object) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType)


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


@dataclass(frozen=True)
class DeviceFilter:
    """Include/exclude regexes over device names or mount points, read inline
    (``include``/``exclude`` keys of the section); ``^$`` anchor them."""

    include: re.Pattern[str] | None = None
    exclude: re.Pattern[str] | None = None

    def accepts(self, name: str) -> bool:
        if self.include is not None and not self.include.search(name):
            return False
        return not (self.exclude is not None and self.exclude.search(name))
