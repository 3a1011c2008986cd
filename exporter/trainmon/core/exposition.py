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

The escaping is the library's own (``escape_metric_name`` and
``escape_label_name`` with the ``underscores`` scheme, backslash, newline and
double quote in label values and HELP text), called once per new family or
series; the other formats (OpenMetrics, text 1.0.0 with another escaping)
stay with prometheus_client (``trainmon.http.server``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import utils
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import (
    UNDERSCORES,
    escape_label_name,
    escape_metric_name,
)

#: The library's formatting of a sample value (Go's: ``+Inf``, ``NaN``, ``1.5e+07``).
_value_text: Callable[[float], str] = utils.floatToGoString

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
    """Encodes metric families in the Prometheus text format 0.0.4, as
    ``prometheus_client.generate_latest`` does (``underscores`` escaping)."""

    def __init__(self) -> None:
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
                family = known_families.get(key) or _family(*key)
                used_families[key] = family
                header, moved_names = family
                append(header)
                moved: dict[str, list[str]] | None = None
                for sample in metric.samples:
                    series = (sample.name, tuple(sample.labels.items()))
                    start = known_series.get(series) or _series_start(*series)
                    used_series[series] = start
                    if sample.timestamp is None:
                        line = f"{start}{_value_text(sample.value)}\n"
                    else:  # in milliseconds
                        line = (f"{start}{_value_text(sample.value)} "
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
                name = escape_metric_name(metric.name + suffix, UNDERSCORES)
                append(f"# HELP {name} {_help_text(metric.documentation)}\n"
                       f"# TYPE {name} gauge\n")
                output.extend(lines)
        self._families, self._series = used_families, used_series
        return "".join(output).encode("utf-8")


def _family(name: str, kind: str, documentation: str) -> _Family:
    exported = escape_metric_name(name + _NAME_SUFFIXES.get(kind, ""), UNDERSCORES)
    header = (f"# HELP {exported} {_help_text(documentation)}\n"
              f"# TYPE {exported} {_RENAMED_TYPES.get(kind, kind)}\n")
    return header, {name + suffix: suffix for suffix in _MOVED_SUFFIXES}


def _series_start(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    """``name{label="value",...} `` with the labels sorted by name and escaped."""
    if not labels:
        return f"{escape_metric_name(name, UNDERSCORES)} "
    pairs = ",".join(f'{escape_label_name(label, UNDERSCORES)}="{_label_value(value)}"'
                     for label, value in sorted(labels))
    return f"{escape_metric_name(name, UNDERSCORES)}{{{pairs}}} "


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help_text(documentation: str) -> str:
    return documentation.replace("\\", r"\\").replace("\n", r"\n")
