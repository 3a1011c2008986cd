"""The Prometheus text format (0.0.4) of metric families, written with what repeats remembered.

prometheus_client's ``generate_latest`` formats every sample from nothing:
it validates and escapes the metric name (a regex match each time), sorts and
escapes the label names and values, and builds the family's HELP and TYPE
lines again. On a default node that was about 0.75 ms of each scrape, as much
as the network and disk collectors together (docs/benchmarks.md, "Node
daemon: scrape cost vs node_exporter"). ``TextEncoder`` writes the same bytes
(``tests/core/test_exposition.py`` holds it to ``generate_latest`` family by
family, hostile names and label values included) and remembers, from one
scrape to the next:

- per family (name, type, HELP text): its ``# HELP``/``# TYPE`` lines;
- per series (sample name, label pairs): the escaped ``name{labels} `` that
  starts its line.

Only the value and the timestamp are formatted on every scrape. The memory
is generational: an encoding keeps what it used and drops the rest, so the
remembered entries are at most those of the previous encoding (which the
exposition itself held while it was written), and a label value that
disappears, or a hostile client's churn of job names, is forgotten one scrape
later. Concurrent encodings (two scrapes at once) are safe: each builds its
own generation, and the last to end becomes the one the next reads.

The other formats a client may ask for (``negotiate``): OpenMetrics 1.0.0
(``encode_openmetrics``: what Prometheus asks for first) and the text format
1.0.0 with an escaping scheme for names outside the legacy character set
(``TextEncoder(escaping)``, not remembered across scrapes). Every format writes
the bytes of prometheus_client's encoders for the same families
(``tests/core/test_exposition.py`` holds each to them, hostile names and label
values included), without importing the library: its package brings its HTTP
servers and ``ssl`` with it (``trainmon.core.families`` says why). The escaping
of names follows the schemes of the Prometheus data model (``underscores``,
``dots``, ``values``, ``allow-utf-8``); label values and HELP texts escape
backslash, newline (and in OpenMetrics the double quote of HELP) as the formats
say.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from trainmon.core.families import Metric

#: Content types of the formats written here.
CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_TEXT_1 = "text/plain; version=1.0.0; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"

#: The name escaping schemes (the ``escaping`` parameter of a content type).
UNDERSCORES = "underscores"
DOTS = "dots"
VALUES = "values"
ALLOW_UTF8 = "allow-utf-8"
ESCAPINGS = (UNDERSCORES, DOTS, VALUES, ALLOW_UTF8)

_LEGACY_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LEGACY_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def value_text(value: float) -> str:
    """A sample value as Go formats it (``+Inf``, ``NaN``, ``1.5e+07``), the way every
    Prometheus client writes it."""
    number = float(value)
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    if math.isnan(number):
        return "NaN"
    text = repr(number)
    dot = text.find(".")
    if number > 0 and dot > 6:  # Go switches to an exponent sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


#: Samples the text format moves out of their family, each suffix into a gauge family
#: of its own after it, in sorted order: OpenMetrics' created time, gauge histograms.
_MOVED_SUFFIXES = ("_created", "_gcount", "_gsum")

#: The text format's type for each OpenMetrics type it renames, and the suffix it
#: adds to the family name in HELP and TYPE.
_RENAMED_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram",
                  "unknown": "untyped"}
_NAME_SUFFIXES = {"counter": "_total", "info": "_info"}

_Family = tuple[str, dict[str, str]]  # (HELP and TYPE lines, moved sample name → suffix)
_SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


class TextEncoder:
    """Encodes metric families in the Prometheus text format, as
    ``prometheus_client.generate_latest`` does: 0.0.4 with the default ``underscores``
    escaping of names, 1.0.0 with another ``escaping``."""

    def __init__(self, escaping: str = UNDERSCORES) -> None:
        self._escaping = escaping
        self._families: dict[tuple[str, str, str], _Family] = {}
        self._series: dict[_SeriesKey, str] = {}

    def encode(self, families: Iterable[Metric]) -> bytes:
        """The exposition of ``families``, UTF-8. An exception from a family carries
        that family as its last argument, as the library's does."""
        known_families, known_series = self._families, self._series
        used_families: dict[tuple[str, str, str], _Family] = {}
        used_series: dict[_SeriesKey, str] = {}
        output: list[str] = []
        append = output.append
        for metric in families:
            try:
                key = (metric.name, metric.type, metric.documentation)
                family = known_families.get(key) or _family(*key, self._escaping)
                used_families[key] = family
                header, moved_names = family
                append(header)
                moved: dict[str, list[str]] | None = None
                for sample in metric.samples:
                    series = (sample.name, tuple(sample.labels.items()))
                    start = (known_series.get(series)
                             or _series_start(*series, self._escaping))
                    used_series[series] = start
                    if sample.timestamp is None:
                        line = f"{start}{value_text(sample.value)}\n"
                    else:  # in milliseconds
                        line = (f"{start}{value_text(sample.value)} "
                                f"{int(float(sample.timestamp) * 1000):d}\n")
                    suffix = moved_names.get(sample.name)
                    if suffix is None:
                        append(line)
                    else:
                        moved = moved or {}
                        moved.setdefault(suffix, []).append(line)
            except Exception as exception:
                exception.args = (exception.args or ("",)) + (metric,)
                raise
            for suffix, lines in sorted(moved.items()) if moved else ():
                name = escape_metric_name(metric.name + suffix, self._escaping)
                append(f"# HELP {name} {_help_text(metric.documentation)}\n"
                       f"# TYPE {name} gauge\n")
                output.extend(lines)
        self._families, self._series = used_families, used_series
        return "".join(output).encode("utf-8")


def _family(name: str, kind: str, documentation: str, escaping: str) -> _Family:
    exported = escape_metric_name(name + _NAME_SUFFIXES.get(kind, ""), escaping)
    header = (f"# HELP {exported} {_help_text(documentation)}\n"
              f"# TYPE {exported} {_RENAMED_TYPES.get(kind, kind)}\n")
    return header, {name + suffix: suffix for suffix in _MOVED_SUFFIXES}


def _series_start(name: str, labels: tuple[tuple[str, str], ...], escaping: str) -> str:
    """``name{label="value",...} `` with the labels sorted by name and escaped; under
    ``allow-utf-8`` a name outside the legacy set is quoted inside the braces."""
    pairs = ",".join(f'{escape_label_name(label, escaping)}="{_label_value(value)}"'
                     for label, value in sorted(labels))
    if escaping == ALLOW_UTF8 and not _LEGACY_METRIC_NAME.fullmatch(name):
        return f"{{{escape_metric_name(name, escaping)}{',' if pairs else ''}{pairs}}} "
    if not pairs:
        return f"{escape_metric_name(name, escaping)} "
    return f"{escape_metric_name(name, escaping)}{{{pairs}}} "


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help_text(documentation: str) -> str:
    return documentation.replace("\\", r"\\").replace("\n", r"\n")


def encode_openmetrics(families: Iterable[Metric], escaping: str = UNDERSCORES) -> bytes:
    """The OpenMetrics 1.0.0 text of ``families``, ``# EOF`` last, as prometheus_client's
    ``openmetrics.exposition.generate_latest`` writes it (trainmon's families carry no
    exemplars). An exception from a family carries that family as its last argument."""
    output: list[str] = []
    append = output.append
    for metric in families:
        try:
            name = escape_metric_name(metric.name, escaping)
            append(f"# HELP {name} {_label_value(metric.documentation)}\n"
                   f"# TYPE {name} {metric.type}\n")
            if metric.unit:
                append(f"# UNIT {name} {metric.unit}\n")
            for sample in metric.samples:
                start = _series_start(sample.name, tuple(sample.labels.items()), escaping)
                if sample.timestamp is None:
                    append(f"{start}{value_text(sample.value)}\n")
                else:  # in seconds
                    append(f"{start}{value_text(sample.value)} {sample.timestamp}\n")
        except Exception as exception:
            exception.args = (exception.args or ("",)) + (metric,)
            raise
    append("# EOF\n")
    return "".join(output).encode("utf-8")


def escape_metric_name(name: str, escaping: str = UNDERSCORES) -> str:
    """A metric name in ``escaping``: unchanged where it is in the legacy character set
    (``dots`` excepted, which doubles underscores), else escaped, or quoted under
    ``allow-utf-8``."""
    return _escape_name(name, escaping, _LEGACY_METRIC_NAME, ":")


def escape_label_name(name: str, escaping: str = UNDERSCORES) -> str:
    """A label name in ``escaping``, as ``escape_metric_name`` (no colon allowed)."""
    return _escape_name(name, escaping, _LEGACY_LABEL_NAME, "")


def _escape_name(name: str, escaping: str, legacy: re.Pattern[str], extra: str) -> str:
    if not name:
        return name
    valid = legacy.fullmatch(name) is not None
    if escaping == ALLOW_UTF8:
        return name if valid else f'"{_label_value(name)}"'
    if valid and escaping != DOTS:
        return name

    def allowed(character: str, index: int) -> bool:
        return ("a" <= character <= "z" or "A" <= character <= "Z" or character == "_"
                or ("0" <= character <= "9" and index > 0) or character in extra)

    if escaping == DOTS:
        return "".join("__" if c == "_" else "_dot_" if c == "." else c if allowed(c, i)
                       else "__" for i, c in enumerate(name))
    if escaping == VALUES:
        return "U__" + "".join("__" if c == "_" else c if allowed(c, i)
                               else "_FFFD_" if 0xD800 <= ord(c) <= 0xDFFF
                               else f"_{ord(c):x}_" for i, c in enumerate(name))
    return "".join(c if allowed(c, i) else "_" for i, c in enumerate(name))


def negotiate(accept: str) -> tuple[str, str, str]:
    """The format to answer an ``Accept`` header with, as prometheus_client's
    ``choose_encoder`` picks it: ``(format, escaping, content type)``, the format one of
    ``openmetrics`` and ``text`` (0.0.4, or 1.0.0 with an escaping scheme)."""
    for accepted in (accept or "").split(","):
        media, *parameters = (part.strip() for part in accepted.split(";"))
        values = dict(part.split("=", 1) for part in parameters if "=" in part)
        version = values.get("version", "")
        escaping = values.get("escaping", UNDERSCORES)
        if escaping not in ESCAPINGS:
            escaping = UNDERSCORES
        if media == "application/openmetrics-text":
            if not version:
                return "openmetrics", UNDERSCORES, CONTENT_TYPE_OPENMETRICS
            if _at_least_1(version):
                return ("openmetrics", escaping, f"application/openmetrics-text; "
                        f"version={version}; charset=utf-8; escaping={escaping}")
        elif media == "text/plain" and version and _at_least_1(version):
            return "text", escaping, f"{CONTENT_TYPE_TEXT_1}; escaping={escaping}"
    return "text", UNDERSCORES, CONTENT_TYPE_TEXT


def _at_least_1(version: str) -> bool:
    """``version`` is 1.0.0 or later, compared as the tuple of its dotted numbers (``1``
    is not: ``(1,) < (1, 0, 0)``); a part that is not a number makes it no version."""
    parts = version.split(".")
    return all(part.isdigit() for part in parts) and tuple(map(int, parts)) >= (1, 0, 0)
