"""The generic section reader: one frozen dataclass → the keys of one YAML mapping.

``read_section`` takes the accessor from each field's type, the default from the
dataclass and the bounds and hooks from the field's metadata; these cases use
small section classes of their own, so they hold for any collector's section.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from trainmon.section import (
    RATIO,
    Auto,
    ConfigError,
    DeviceFilter,
    Invalid,
    Section,
    read_section,
    setting,
)


def _scaled(text: str) -> int:
    if not text.endswith("x"):
        raise ValueError(f"expected a number and x, got {text!r}")
    return int(text[:-1]) * 10


def _doubled(section: Section, key: str, default: int) -> int:
    return section.integer(key, default // 2, 0, 100) * 2


@dataclass(frozen=True)
class Window:
    seconds: float = field(default=60.0, metadata=setting(minimum=5, maximum=3600))
    phases: tuple[str, ...] = ("comm",)


@dataclass(frozen=True)
class Example:
    """A section class with one field of each kind the reader knows."""

    enabled: bool | Auto = "auto"
    verbose: bool = False
    spot: bool | None = None
    count: int = field(default=3, metadata=setting(minimum=1, maximum=10))
    ratio: float = field(default=0.5, metadata=RATIO)
    name: str = "node"
    note: str | None = None
    mode: str = field(default="fast", metadata=setting(choices=("fast", "slow")))
    size: str = field(default="10x", metadata=setting(parse=_scaled))
    even: int = field(default=4, metadata=setting(read=_doubled))
    root: Path = Path("/proc")
    token_file: Path | None = None
    pattern: re.Pattern[str] | None = None
    names: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    lists: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    window: Window = Window()
    devices: DeviceFilter = field(
        default=DeviceFilter(exclude=re.compile("^lo$")), metadata=setting(inline=True))

    def check(self) -> None:
        if self.verbose and self.mode == "slow":
            raise Invalid("mode", "slow cannot be verbose")


def read(data: object, environ: Mapping[str, str] | None = None) -> Example:
    return read_section(Example, Section(data, "collectors.example", environ or {}))


def error_of(data: object) -> str:
    with pytest.raises(ConfigError) as caught:
        read(data)
    return str(caught.value)


def test_an_empty_section_gives_the_dataclass_defaults() -> None:
    assert read({}) == Example(size=100)  # the default passes through ``parse`` too
    assert read(None).window == Window()


def test_each_field_type_takes_its_value() -> None:
    example = read({
        "enabled": False, "verbose": True, "spot": None, "count": 10, "ratio": 1,
        "name": "${NODE}", "note": "n", "mode": "fast", "size": "7x", "even": 6,
        "root": "/host/proc", "token_file": "", "pattern": "^a", "names": ["a", "b"],
        "labels": {"rack": "r1"}, "lists": {"i-1": ["d-1"]},
        "window": {"seconds": 5, "phases": ["allreduce"]},
        "include": "^eth", "exclude": "^eth1$",
    }, environ={"NODE": "gpu-7"})

    assert example.enabled is False and example.verbose is True and example.spot is None
    assert (example.count, example.ratio) == (10, 1.0) and isinstance(example.ratio, float)
    assert (example.name, example.note, example.mode) == ("gpu-7", "n", "fast")
    assert (example.size, example.even) == (70, 12)
    assert example.root == Path("/host/proc") and example.token_file is None
    assert example.pattern is not None and example.pattern.pattern == "^a"
    assert example.names == ("a", "b")
    assert example.labels == {"rack": "r1"} and example.lists == {"i-1": ("d-1",)}
    assert example.window == Window(5.0, ("allreduce",))
    assert example.devices.accepts("eth0") and not example.devices.accepts("eth1")
    assert not example.devices.accepts("lo0")


def test_an_inline_filter_keeps_its_default_pattern_until_a_key_replaces_it() -> None:
    assert not read({}).devices.accepts("lo")
    assert read({"exclude": None}).devices.accepts("lo")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"count": 0}, "collectors.example.count: must be >= 1, got 0"),
        ({"count": 11}, "collectors.example.count: must be <= 10, got 11"),
        ({"count": 2.5}, "collectors.example.count: expected an integer, got a number"),
        ({"ratio": 1.5}, "collectors.example.ratio: must be <= 1, got 1.5"),
        ({"ratio": True}, "collectors.example.ratio: expected a number, got a boolean"),
        ({"window": {"seconds": 1}}, "collectors.example.window.seconds: must be >= 5, got 1"),
        ({"enabled": "yes"}, "collectors.example.enabled: expected true, false or auto, got 'yes'"),
        ({"spot": "no"}, "collectors.example.spot: expected true, false or null, got 'no'"),
        ({"mode": "medium"}, "collectors.example.mode: expected one of fast, slow, got 'medium'"),
        ({"size": "7"}, "collectors.example.size: expected a number and x, got '7'"),
        ({"even": 101}, "collectors.example.even: must be <= 100, got 101"),
        ({"pattern": "("}, "collectors.example.pattern: not a valid regular expression: "),
        ({"include": "("}, "collectors.example.include: not a valid regular expression: "),
        ({"names": ["a", 1]}, "collectors.example.names[1]: expected a string, got an integer"),
        ({"labels": {"a": 1}}, "collectors.example.labels.a: expected a string, got an integer"),
        ({"name": "${UNSET}"}, "collectors.example.name: environment variable UNSET is not set"),
        ({"window": []}, "collectors.example.window: expected a mapping, got a list"),
        ({"verbose": True, "mode": "slow"}, "collectors.example.mode: slow cannot be verbose"),
    ],
)
def test_errors_name_the_key_path(data: object, message: str) -> None:
    assert error_of(data).startswith(message)


def test_unknown_keys_are_rejected_after_the_known_ones_are_read() -> None:
    message = error_of({"count": 2, "xyzzy": 3})
    assert message.startswith("collectors.example.xyzzy: unknown key (known keys here: ")
    assert "count" in message and "include" in message  # the inline filter's keys count
    assert error_of({"window": {"frames": 5}}) == (
        "collectors.example.window.frames: unknown key (known keys here: phases, seconds)")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"cuont": 3}, "collectors.example.cuont: unknown key, did you mean count?"),
        ({"exlude": "x"}, "collectors.example.exlude: unknown key, did you mean exclude?"),
        ({"window": {"secs": 5}},
         "collectors.example.window.secs: unknown key, did you mean seconds?"),
    ],
)
def test_an_unknown_key_names_the_known_key_it_resembles(data: object, message: str) -> None:
    assert error_of(data) == message


def test_a_collecting_section_reports_every_error_and_raises_them_together() -> None:
    """Given an error list, a bad field keeps its default and reading goes on; a
    section with an error skips its ``check`` (its defaults would be checked)."""
    errors: list[ConfigError] = []
    root = Section({"example": {"count": 0, "cuont": 1, "verbose": True, "mode": "slow",
                                "window": {"seconds": 1}, "labels": []}},
                   "", {}, errors=errors)
    read_section(Example, root.section("example"))
    root.finish()
    assert [str(error) for error in errors] == [
        "example.count: must be >= 1, got 0",
        "example.labels: expected a mapping, got a list",
        "example.window.seconds: must be >= 5, got 1",
        "example.cuont: unknown key, did you mean count?",
    ]
    with pytest.raises(ConfigError) as caught:
        root.raise_errors()
    assert caught.value.errors == tuple(errors)
    assert str(caught.value).splitlines() == [str(error) for error in errors]
    assert (caught.value.path, caught.value.message) == ("example.count", "must be >= 1, got 0")


def test_a_collecting_section_with_one_error_raises_that_error() -> None:
    errors: list[ConfigError] = []
    root = Section({"x": {"level": "off"}}, "", {}, errors=errors)

    @dataclass(frozen=True)
    class Level:
        level: Auto = "auto"

    assert read_section(Level, root.section("x")) == Level()
    with pytest.raises(ConfigError) as caught:
        root.raise_errors()
    assert caught.value is errors[0] and caught.value.errors == (caught.value,)
    Section({}, "", {}, errors=[]).raise_errors()  # nothing collected: nothing raised


def test_a_bad_value_is_reported_before_an_unknown_key() -> None:
    assert error_of({"aaa": 1, "count": 0}) == "collectors.example.count: must be >= 1, got 0"


def test_the_check_runs_only_on_read_sections() -> None:
    """Direct construction (tests, the CLI's replacements) is not validated again."""
    assert Example(verbose=True, mode="slow").mode == "slow"


def test_a_field_type_without_a_reader_is_a_programming_error() -> None:
    @dataclass(frozen=True)
    class Odd:
        values: list[int] = field(default_factory=list)

    with pytest.raises(TypeError, match="no reader for a field of type"):
        read_section(Odd, Section({}, "odd"))


def test_a_literal_field_takes_its_choices_from_the_type() -> None:
    @dataclass(frozen=True)
    class Chosen:
        speed: Auto | None = None

    @dataclass(frozen=True)
    class Level:
        level: Auto = "auto"

    assert read_section(Level, Section({"level": "auto"}, "x")).level == "auto"
    with pytest.raises(ConfigError, match=r"^x\.level: expected one of auto, got 'off'$"):
        read_section(Level, Section({"level": "off"}, "x"))
    with pytest.raises(TypeError):
        read_section(Chosen, Section({}, "x"))
