"""The metric names dashboards may use, and the metric names a PromQL expression uses.

* trainmon's own names come from ``docs/metrics.md`` (every table row whose
  first cell is a backticked metric name); a documented histogram also allows
  its ``_bucket``/``_sum``/``_count`` series.
* dcgm-exporter's come from the checked-in copy of its ``etc/default-counters.csv``:
  uncommented rows are exported by default, commented rows exist but have to be
  enabled by the operator (``opt_in``).
* ``up`` and ``ALERTS`` are Prometheus' own series;
* recording rules: every ``record`` of the shipped ``alerts/*/trainmon.rules.yml``
  (a dashboard may read a rule the bundle loads, e.g. the straggler ratio).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
METRICS_DOC = REPO / "docs" / "metrics.md"
DCGM_COUNTERS = Path(__file__).resolve().parent / "dcgm-exporter-default-counters.csv"
RULE_FILES = tuple(sorted((REPO / "alerts").glob("*/trainmon.rules.yml")))
PROMETHEUS_SERIES = frozenset({"up", "ALERTS"})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

#: PromQL words that look like metric names but are not.
_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "inf", "nan", "atan2",
})
_NAME = re.compile(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_ROW_NAMES = re.compile(r"`([a-z_:][a-z0-9_:]*)`")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (not functions, keywords, labels or numbers).

    ``label_values(selector, label)`` (a Grafana variable query) counts its
    selector's metric.
    """
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"label_values\(([^,()]*),[^)]*\)", r"(\1)", text)
    text = re.sub(r"label_values\([^,()]*\)", " ", text)  # label_values(label): no metric
    names: set[str] = set()
    for match in _NAME.finditer(text):
        token = match.group()
        if text[match.end():].lstrip().startswith("(") or token.lower() in _KEYWORDS:
            continue
        names.add(token)
    return names


@dataclass(frozen=True)
class Contract:
    trainmon: frozenset[str]
    dcgm_default: frozenset[str]
    dcgm_opt_in: frozenset[str]
    recorded: frozenset[str] = frozenset()

    def allows(self, name: str) -> bool:
        if name in PROMETHEUS_SERIES or name in self.dcgm_default or name in self.dcgm_opt_in:
            return True
        if name in self.recorded:
            return True
        if name in self.trainmon:
            return True
        return any(name.endswith(suffix) and name[: -len(suffix)] in self.trainmon
                   for suffix in HISTOGRAM_SUFFIXES)


def trainmon_metrics(doc: Path = METRICS_DOC) -> frozenset[str]:
    """Every metric name in the first column of a table in ``docs/metrics.md``."""
    names: set[str] = set()
    for line in doc.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        first_cell = line.split("|")[1]
        names.update(n for n in _ROW_NAMES.findall(first_cell) if n.startswith("trainmon_"))
    return frozenset(names)


def dcgm_fields(csv: Path = DCGM_COUNTERS) -> tuple[frozenset[str], frozenset[str]]:
    """(default, opt-in) DCGM field names of a dcgm-exporter counters file."""
    default: set[str] = set()
    opt_in: set[str] = set()
    for raw in csv.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        commented = line.startswith("#")
        field = line.lstrip("#").strip().split(",")[0].strip()
        if not re.fullmatch(r"DCGM_(FI|EXP)_[A-Z0-9_]+", field):
            continue
        (opt_in if commented else default).add(field)
    return frozenset(default), frozenset(opt_in - default)


def recording_rules(files: tuple[Path, ...] = RULE_FILES) -> frozenset[str]:
    """Every ``record`` name of the shipped rules files."""
    names: set[str] = set()
    for path in files:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            names.update(str(rule["record"]) for rule in group["rules"] if "record" in rule)
    return frozenset(names)


def load_contract() -> Contract:
    default, opt_in = dcgm_fields()
    return Contract(trainmon_metrics(), default, opt_in, recording_rules())
