#!/usr/bin/env python3
"""Assemble the alert rules of both bundle variants, and time-scale them for tests.

The rules are written once, in ``alerts/source/``: ``common.yml`` holds what
the trainmon node daemon tells (both variants), ``dcgm.yml`` and
``tencent-cloud.yml`` what each variant's GPU source adds. This script writes

* ``alerts/<variant>/trainmon.rules.yml`` — common groups + the variant's
  groups, tokens replaced, ``runbook_url`` added from the alert name, the
  source-only ``meaning`` key removed;
* the generated tables of ``docs/alerts.md`` (between the marker comments);
* ``alerts/dcgm-compat/dcgm-compat.rules.yml``, the opt-in DCGM-compatible pack,
  from ``source/dcgm-compat.yml`` alone (recording rules only; the pack's table
  in ``docs/alerts.md`` too).

Every threshold the rules share with the daemon's diagnosis and the
dashboards is a ``@TOKEN@`` in the sources, replaced by its value in
``exporter/trainmon/contract.py`` (``TOKENS`` below), so the numbers have one
home. A recording rule whose name ends in its window (``…:ratio_rate10m``,
``…:mean10m``) must use that window in every range selector, the training
and diagnosis recording rules and the run ledger's (``trainmon-runs.rules``)
``contract.TRAINING_RULE_WINDOW``, and the
recording rule the dashboards read (``contract.STRAGGLER_RATIO_SERIES``) must
exist.

Usage::

    python alerts/generate.py            # write the files
    python alerts/generate.py --check    # exit 1 if a committed file differs
    python alerts/generate.py scale --factor 0.05 RULES.yml OUT.yml

``scale`` is the documented way to shorten the shipped rules for a test:
it multiplies every ``for``, ``keep_firing_for``, range selector, subquery
range and step and ``offset`` by the factor and changes nothing else
(thresholds written in seconds, such as the 600 s of TrainmonTrainingStalled,
stay as they are).

It needs PyYAML and the ``trainmon`` package (for ``trainmon.contract``):
``make generate`` runs it with the project's virtualenv.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from trainmon import contract

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = ROOT / "alerts" / "source"
RUNBOOK_DIR = ROOT / "docs" / "runbooks"
DOC_PATH = ROOT / "docs" / "alerts.md"
VARIANTS = ("dcgm", "tencent-cloud")
RULES_FILE_NAME = "trainmon.rules.yml"

#: Where runbook_url points; the page is ``<base><AlertName>.md``.
RUNBOOK_BASE_URL = contract.RUNBOOK_BASE_URL
#: XID codes that mean a hardware/driver fault needing a GPU reset or node drain
#: (NVIDIA's XID catalogue; docs/runbooks/TrainmonGPUXidCritical.md explains each).
XID_CRITICAL = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140)
TRAINMON_TARGETS = 'job=~"trainmon.*"'
DCGM_TARGETS = 'job=~".*dcgm.*"'

#: Groups whose recording rules use ``contract.TRAINING_RULE_WINDOW``.
TRAINING_RULE_GROUPS = ("trainmon-training.rules", "trainmon-diagnosis.rules",
                        "trainmon-runs.rules")


def _number(value: float) -> str:
    """``value`` as PromQL and prose write it: ``0.2``, ``1.25``, ``50``."""
    return format(round(value, 9), "g")


def _integer(value: float) -> str:
    """A whole number without an exponent: ``10000000``, not ``1e+07``."""
    if value != int(value):
        raise ValueError(f"{value} is used as a whole number in the rules")
    return str(int(value))


def _ratio(ratio_token: str, percent_token: str, value: float) -> dict[str, str]:
    """A 0-1 threshold for PromQL and the same number in percent for prose."""
    return {ratio_token: _number(value), percent_token: _number(value * 100)}


def _xid_last_code(latest: str = "instance_gpu:trainmon_gpu_xid:latest", digits: int = 4,
                   indent: int = 8) -> str:
    """PromQL for the decimal ``xid`` label of ``latest`` as the sample value.

    PromQL cannot turn a label into a number, so each decimal place is read with
    one regex per digit (``.*7.`` = 7 in the tens) and the places are added; a code
    of more than ``digits`` digits keeps only its last ones (NVIDIA's XIDs are < 200).
    Lines after the first are indented by ``indent``, where the token stands.
    """
    places = []
    for place in range(digits):
        tail = "." * place
        terms = [f'{latest}{{xid=~".*{digit}{tail}"}} * 0 + {digit * 10 ** place}'
                 for digit in range(1, 10)]
        places.append("(\n    " + "\n  or ".join([*terms, f"{latest} * 0"]) + "\n  )")
    return "\n+ ".join(places).replace("\n", "\n" + " " * indent)


TOKENS: Mapping[str, str] = {
    "TRAINMON_TARGETS": TRAINMON_TARGETS,
    "DCGM_TARGETS": DCGM_TARGETS,
    # Thresholds shared with the diagnosis and the dashboards (exporter/trainmon/contract.py);
    # *_PERCENT and *_MS are the same numbers for prose.
    "SAWTOOTH_FLAG": _number(contract.SAWTOOTH_FLAG),
    **_ratio("DATA_WAIT_RATIO", "DATA_WAIT_PERCENT", contract.DATA_WAIT_RATIO),
    **_ratio("COMM_RATIO", "COMM_PERCENT", contract.COMM_RATIO),
    "STRAGGLER_FACTOR": _number(contract.STRAGGLER_FACTOR),
    "STRAGGLER_MIN_EXCESS_SECONDS": _number(contract.STRAGGLER_MIN_EXCESS_SECONDS),
    "STRAGGLER_MIN_EXCESS_MS": _number(contract.STRAGGLER_MIN_EXCESS_SECONDS * 1000),
    **_ratio("GPU_IDLE_RATIO", "GPU_IDLE_PERCENT", contract.GPU_IDLE_RATIO),
    **_ratio("SAMPLER_BUSY_LEVEL", "SAMPLER_BUSY_PERCENT", contract.SAMPLER_BUSY_LEVEL),
    # GPU activity (NVML GPM or DCGM profiling) and memory; memory is "nearly full"
    # once less than contract.GPU_MEMORY_HEADROOM_RATIO of it is left.
    **_ratio("GPU_BUSY_UTILIZATION_RATIO", "GPU_BUSY_UTILIZATION_PERCENT",
             contract.GPU_BUSY_UTILIZATION_RATIO),
    **_ratio("GPU_SM_ACTIVE_LOW", "GPU_SM_ACTIVE_LOW_PERCENT", contract.GPU_SM_ACTIVE_LOW),
    **_ratio("GPU_TENSOR_IDLE", "GPU_TENSOR_IDLE_PERCENT", contract.GPU_TENSOR_IDLE),
    **_ratio("GPU_MEMORY_FULL_RATIO", "GPU_MEMORY_FULL_PERCENT",
             1 - contract.GPU_MEMORY_HEADROOM_RATIO),
    # Platform signals (issue 15): NCCL over sockets, checkpoint age on spot
    # instances, NUMA locality. Byte rates are written out in full (no exponent)
    # for PromQL, in MB/s for prose; the checkpoint age also in minutes.
    **_ratio("NCCL_SOCKET_MIN_COMM_RATIO", "NCCL_SOCKET_MIN_COMM_PERCENT",
             contract.NCCL_SOCKET_MIN_COMM_RATIO),
    "RDMA_IDLE_BYTES_PER_SECOND": _integer(contract.RDMA_IDLE_BYTES_PER_SECOND),
    "RDMA_IDLE_MB_PER_SECOND": _number(contract.RDMA_IDLE_BYTES_PER_SECOND / 1e6),
    "SOCKET_BUSY_BYTES_PER_SECOND": _integer(contract.SOCKET_BUSY_BYTES_PER_SECOND),
    "SOCKET_BUSY_MB_PER_SECOND": _number(contract.SOCKET_BUSY_BYTES_PER_SECOND / 1e6),
    "CHECKPOINT_MAX_AGE_SECONDS": _integer(contract.CHECKPOINT_MAX_AGE_SECONDS),
    "CHECKPOINT_MAX_AGE_MINUTES": _number(contract.CHECKPOINT_MAX_AGE_SECONDS / 60),
    **_ratio("NUMA_LOCAL_RATIO_MIN", "NUMA_LOCAL_PERCENT_MIN", contract.NUMA_LOCAL_RATIO_MIN),
    # Run ledger (issue 16): a run more than THROUGHPUT_REGRESSION_RATIO slower than the
    # best earlier run of its job and config hash, for THROUGHPUT_REGRESSION_WINDOW;
    # _KEEP is the share of that run's throughput below which it pages (0.8). Runs are
    # compared once they have run for one TRAINING_RULE_WINDOW (an offset).
    **_ratio("THROUGHPUT_REGRESSION_RATIO", "THROUGHPUT_REGRESSION_PERCENT",
             contract.THROUGHPUT_REGRESSION_RATIO),
    "THROUGHPUT_REGRESSION_KEEP": _number(1 - contract.THROUGHPUT_REGRESSION_RATIO),
    "THROUGHPUT_REGRESSION_WINDOW": contract.THROUGHPUT_REGRESSION_WINDOW,
    # Goodput (issue 26): the productive share of a job's GPU-seconds below which, for
    # GOODPUT_LOW_WINDOW, TrainmonLowGoodput fires.
    **_ratio("GOODPUT_LOW_RATIO", "GOODPUT_LOW_PERCENT", contract.GOODPUT_LOW_RATIO),
    "GOODPUT_LOW_WINDOW": contract.GOODPUT_LOW_WINDOW,
    # A rank's client reports a stall after this many typical steps, at least this long.
    "STALL_TYPICAL_STEPS": f"{contract.STALL_TYPICAL_STEPS:g}",
    "STALL_FLOOR_SECONDS": f"{contract.STALL_FLOOR_SECONDS:g}",
    "TRAINING_RULE_WINDOW": contract.TRAINING_RULE_WINDOW,
    "XID_CRITICAL": "|".join(str(code) for code in XID_CRITICAL),
    "XID_CRITICAL_LIST": ", ".join(str(code) for code in XID_CRITICAL),
    # One single-series vector per critical code, labelled xid="<code>" (a set to join on).
    "DCGM_XID_CRITICAL_CODES": "\n        or ".join(
        f'label_replace(vector(1), "xid", "{code}", "", "")' for code in XID_CRITICAL
    ),
    # The DCGM-compatible pack: the last XID's code as a number (DCGM_FI_DEV_XID_ERRORS).
    "XID_LAST_CODE": _xid_last_code(),
}
#: The opt-in DCGM-compatible pack: source name, output file (docs/alerts.md, "DCGM-compatible
#: series"). Recording rules only, none of the variants' groups.
DCGM_COMPAT = "dcgm-compat"
DCGM_COMPAT_FILE = f"{DCGM_COMPAT}.rules.yml"
DCGM_COMPAT_HEADER = (
    "# GENERATED by alerts/generate.py from alerts/source/dcgm-compat.yml.\n"
    "# Do not edit: change the source, run `python alerts/generate.py`, commit both.\n"
    "# Opt-in: dcgm-exporter's DCGM_FI_* series recorded from trainmon's (docs/alerts.md).\n"
    "# Load it only where no dcgm-exporter is scraped, or every GPU's series doubles.\n"
)
DCGM_BEGIN = "<!-- BEGIN generated DCGM-compatible table (alerts/generate.py) -->"
DCGM_END = "<!-- END generated DCGM-compatible table -->"
SEVERITIES = ("critical", "warning", "info")
SOURCE_ONLY_KEYS = ("meaning",)
HEADER = (
    "# GENERATED by alerts/generate.py from alerts/source/common.yml and "
    "alerts/source/{variant}.yml.\n"
    "# Do not edit: change the source, run `python alerts/generate.py`, commit both.\n"
    "# Variant: {variant} (docs/alerts.md). Scrape trainmon with honor_labels: true.\n"
)
TABLE_BEGIN = "<!-- BEGIN generated alert table (alerts/generate.py) -->"
TABLE_END = "<!-- END generated alert table -->"
RECORD_BEGIN = "<!-- BEGIN generated recording-rule table (alerts/generate.py) -->"
RECORD_END = "<!-- END generated recording-rule table -->"


class SourceError(ValueError):
    """A rule source breaks a convention (name, severity, annotation, runbook)."""


# -- assembling ---------------------------------------------------------------


def load_groups(name: str) -> list[dict[str, Any]]:
    """The rule groups of ``alerts/source/<name>.yml`` with tokens replaced."""
    document = yaml.safe_load((SOURCE_DIR / f"{name}.yml").read_text(encoding="utf-8"))
    groups = document.get("groups") if isinstance(document, dict) else None
    if not isinstance(groups, list):
        raise SourceError(f"{name}.yml: expected a mapping with a `groups` list")
    replaced: list[dict[str, Any]] = _replace_tokens(groups, f"{name}.yml")
    return replaced


def _replace_tokens(node: Any, origin: str) -> Any:
    """``node`` with every ``@TOKEN@`` in its strings replaced (after parsing, so a
    multi-line value cannot break the YAML around it)."""
    if isinstance(node, dict):
        return {key: _replace_tokens(value, origin) for key, value in node.items()}
    if isinstance(node, list):
        return [_replace_tokens(value, origin) for value in node]
    if not isinstance(node, str):
        return node
    for token, value in TOKENS.items():
        node = node.replace(f"@{token}@", value)
    leftover = re.findall(r"@[A-Z_]+@", node)
    if leftover:
        raise SourceError(f"{origin}: unknown token(s) {sorted(set(leftover))}")
    return node


def check_alert(rule: Mapping[str, Any], origin: str) -> None:
    """Raise SourceError unless ``rule`` follows the monitoring-mixin conventions."""
    name = str(rule["alert"])
    if not re.fullmatch(r"Trainmon(?:[A-Z][A-Za-z0-9]*)+", name):
        raise SourceError(f"{origin}: {name}: names are CamelCase with the Trainmon prefix")
    severity = rule.get("labels", {}).get("severity")
    if severity not in SEVERITIES:
        raise SourceError(f"{origin}: {name}: severity must be one of {SEVERITIES}")
    annotations = rule.get("annotations", {})
    for key in ("summary", "description"):
        if not str(annotations.get(key, "")).strip():
            raise SourceError(f"{origin}: {name}: the `{key}` annotation is missing")
    if "runbook_url" in annotations:
        raise SourceError(f"{origin}: {name}: runbook_url is added by the generator")
    if not str(rule.get("meaning", "")).strip():
        raise SourceError(f"{origin}: {name}: `meaning` (the expression in words) is missing")
    if not (RUNBOOK_DIR / f"{name}.md").is_file():
        raise SourceError(f"{origin}: {name}: docs/runbooks/{name}.md does not exist")


_WINDOW_SUFFIX = re.compile(r"(?:rate|mean|sum)((?:\d+(?:ms|s|m|h|d|w|y))+)$")
_RANGE_SELECTOR = re.compile(r"\[\s*((?:\d+(?:ms|s|m|h|d|w|y))+)\s*[]:]")
_LAST_VALUE = re.compile(r"last_over_time\(([^()\[\]]*)\[[^\]]*\]\)")


def check_record(rule: Mapping[str, Any], group: str, origin: str) -> None:
    """Raise SourceError unless a windowed record's name, ranges and the contract agree."""
    name = str(rule["record"])
    suffix = _WINDOW_SUFFIX.search(name)
    if suffix is None:
        return
    window = suffix.group(1)
    # last_over_time(x[10m]) is a lookback for one value, not a window
    ranges = set(_RANGE_SELECTOR.findall(_LAST_VALUE.sub(r"\1", str(rule["expr"]))))
    if ranges - {window}:
        raise SourceError(f"{origin}: {name}: its name says {window} but it selects "
                          f"{sorted(ranges)}")
    if group in TRAINING_RULE_GROUPS and window != contract.TRAINING_RULE_WINDOW:
        raise SourceError(f"{origin}: {name}: training rules use the contract's window "
                          f"{contract.TRAINING_RULE_WINDOW} (exporter/trainmon/contract.py)")


def shipped_rule(rule: Mapping[str, Any], runbook_base_url: str) -> dict[str, Any]:
    """The rule as Prometheus gets it: source-only keys dropped, runbook_url added."""
    shipped = {key: value for key, value in rule.items() if key not in SOURCE_ONLY_KEYS}
    if "alert" in rule:
        annotations = dict(shipped.get("annotations", {}))
        annotations["runbook_url"] = f"{runbook_base_url}{rule['alert']}.md"
        shipped["annotations"] = annotations
    return shipped


def variant_groups(variant: str, runbook_base_url: str) -> list[dict[str, Any]]:
    """Common groups followed by the variant's, checked and ready to dump."""
    groups: list[dict[str, Any]] = []
    names: set[str] = set()
    for origin in ("common", variant):
        for group in load_groups(origin):
            if group["name"] in names:
                raise SourceError(f"{origin}.yml: group {group['name']} is defined twice")
            names.add(group["name"])
            rules = []
            for rule in group["rules"]:
                if "alert" in rule:
                    check_alert(rule, f"{origin}.yml")
                else:
                    check_record(rule, str(group["name"]), f"{origin}.yml")
                rules.append(shipped_rule(rule, runbook_base_url))
            groups.append({**group, "rules": rules})
    records = {rule.get("record") for group in groups for rule in group["rules"]}
    if contract.STRAGGLER_RATIO_SERIES not in records:
        raise SourceError(f"{variant}: no recording rule produces {contract.STRAGGLER_RATIO_SERIES}"
                          " (contract.STRAGGLER_RATIO_SERIES, read by the dashboards)")
    return groups


class _RulesDumper(yaml.SafeDumper):
    """Block scalars for multi-line strings, so expressions stay readable."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else ">" if len(value) > 90 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_RulesDumper.add_representer(str, _represent_str)


def dump_rules(groups: Sequence[Mapping[str, Any]]) -> str:
    return yaml.dump(
        {"groups": list(groups)},
        Dumper=_RulesDumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
    )


def rules_text(variant: str, runbook_base_url: str = RUNBOOK_BASE_URL) -> str:
    """The full content of ``alerts/<variant>/trainmon.rules.yml``."""
    return HEADER.format(variant=variant) + dump_rules(variant_groups(variant, runbook_base_url))


def dcgm_compat_groups() -> list[dict[str, Any]]:
    """The pack's groups, checked: recording rules only, each recorded once."""
    groups = load_groups(DCGM_COMPAT)
    seen: set[str] = set()
    for group in groups:
        for rule in group["rules"]:
            if "record" not in rule:
                raise SourceError(f"{DCGM_COMPAT}.yml: the pack records series; no alerts")
            if rule["record"] in seen:
                raise SourceError(f"{DCGM_COMPAT}.yml: {rule['record']} is recorded twice")
            if not str(rule.get("meaning", "")).strip():
                raise SourceError(f"{DCGM_COMPAT}.yml: {rule['record']}: `meaning` is missing")
            seen.add(str(rule["record"]))
    return [{**group, "rules": [shipped_rule(rule, "") for rule in group["rules"]]}
            for group in groups]


def dcgm_compat_text() -> str:
    """The full content of ``alerts/dcgm-compat/dcgm-compat.rules.yml``."""
    return DCGM_COMPAT_HEADER + dump_rules(dcgm_compat_groups())


# -- docs/alerts.md tables ----------------------------------------------------


def _rows(kind: str) -> Iterable[tuple[str, str, str, str]]:
    """(name, meaning, severity, variant) of every rule of ``kind`` (alert/record)."""
    for origin in ("common", *VARIANTS):
        variant = "both" if origin == "common" else origin
        for group in load_groups(origin):
            for rule in group["rules"]:
                if kind in rule:
                    meaning = " ".join(str(rule.get("meaning", "")).split()).replace("|", "\\|")
                    severity = str(rule.get("labels", {}).get("severity", ""))
                    yield str(rule[kind]), meaning, severity, variant


def alert_table() -> str:
    lines = [
        "| alert | expression in words | severity | variant | runbook |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, meaning, severity, variant in _rows("alert"):
        lines.append(
            f"| `{name}` | {meaning} | {severity} | {variant} | "
            f"[{name}](runbooks/{name}.md) |"
        )
    return "\n".join(lines)


def recording_table() -> str:
    lines = ["| recording rule | meaning | variant |", "| --- | --- | --- |"]
    for name, meaning, _, variant in _rows("record"):
        lines.append(f"| `{name}` | {meaning} | {variant} |")
    return "\n".join(lines)


def dcgm_compat_table() -> str:
    lines = ["| series | DCGM unit and trainmon source |", "| --- | --- |"]
    for group in load_groups(DCGM_COMPAT):
        for rule in group["rules"]:
            meaning = " ".join(str(rule["meaning"]).split()).replace("|", "\\|")
            lines.append(f"| `{rule['record']}` | {meaning} |")
    return "\n".join(lines)


def replace_between(text: str, begin: str, end: str, body: str) -> str:
    start = text.find(begin)
    stop = text.find(end)
    if start < 0 or stop < start:
        raise SourceError(f"docs/alerts.md: markers {begin!r} … {end!r} are missing")
    return text[: start + len(begin)] + "\n" + body + "\n" + text[stop:]


def doc_text() -> str:
    text = DOC_PATH.read_text(encoding="utf-8")
    text = replace_between(text, TABLE_BEGIN, TABLE_END, alert_table())
    text = replace_between(text, RECORD_BEGIN, RECORD_END, recording_table())
    return replace_between(text, DCGM_BEGIN, DCGM_END, dcgm_compat_table())


def outputs(runbook_base_url: str = RUNBOOK_BASE_URL) -> dict[Path, str]:
    """Every generated file and its expected content."""
    files = {
        ROOT / "alerts" / variant / RULES_FILE_NAME: rules_text(variant, runbook_base_url)
        for variant in VARIANTS
    }
    files[ROOT / "alerts" / DCGM_COMPAT / DCGM_COMPAT_FILE] = dcgm_compat_text()
    files[DOC_PATH] = doc_text()
    return files


# -- time scaling -------------------------------------------------------------

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
            "w": 604_800_000, "y": 31_536_000_000}
_DURATION = r"(?:\d+(?:ms|s|m|h|d|w|y))+"
_RANGE = re.compile(rf"\[\s*({_DURATION})\s*(?::\s*({_DURATION})?\s*)?\]")
_OFFSET = re.compile(rf"\boffset\s+(-?)({_DURATION})")


def duration_ms(text: str) -> int:
    """Milliseconds of a Prometheus duration such as ``1h30m`` or ``750ms``."""
    return sum(int(n) * _UNIT_MS[unit] for n, unit in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text))


def format_duration(milliseconds: int) -> str:
    """The shortest exact Prometheus spelling of ``milliseconds`` (at least 1ms)."""
    milliseconds = max(1, milliseconds)
    for unit in ("d", "h", "m", "s"):
        if milliseconds % _UNIT_MS[unit] == 0:
            return f"{milliseconds // _UNIT_MS[unit]}{unit}"
    return f"{milliseconds}ms"


def scale_duration(text: str, factor: float) -> str:
    return format_duration(round(duration_ms(text) * factor))


def scale_expr(expr: str, factor: float) -> str:
    """``expr`` with range selectors, subqueries and offsets multiplied by ``factor``."""

    def scale_range(match: re.Match[str]) -> str:
        selected = scale_duration(match.group(1), factor)
        if ":" not in match.group(0):
            return f"[{selected}]"
        step = match.group(2)
        return f"[{selected}:{scale_duration(step, factor) if step else ''}]"

    expr = _RANGE.sub(scale_range, expr)
    return _OFFSET.sub(
        lambda m: f"offset {m.group(1)}{scale_duration(m.group(2), factor)}", expr
    )


def scale_rules(document: Mapping[str, Any], factor: float) -> dict[str, Any]:
    """A copy of a rules document with every duration multiplied by ``factor``."""
    groups = []
    for group in document["groups"]:
        scaled_group = dict(group)
        if "interval" in group:
            scaled_group["interval"] = scale_duration(str(group["interval"]), factor)
        rules = []
        for rule in group["rules"]:
            scaled = dict(rule)
            scaled["expr"] = scale_expr(str(rule["expr"]), factor)
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    scaled[key] = scale_duration(str(rule[key]), factor)
            rules.append(scaled)
        scaled_group["rules"] = rules
        groups.append(scaled_group)
    return {"groups": groups}


# -- command line ---------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a generated file differs from what is committed")
    parser.add_argument("--runbook-base-url", default=RUNBOOK_BASE_URL,
                        help="prefix of runbook_url (default %(default)s)")
    commands = parser.add_subparsers(dest="command")
    scale = commands.add_parser("scale", help="write a time-scaled copy of a rules file")
    scale.add_argument("--factor", type=float, required=True,
                       help="multiply every duration by this (e.g. 0.05: 5m becomes 15s)")
    scale.add_argument("rules", type=Path)
    scale.add_argument("output", type=Path)
    args = parser.parse_args(argv)

    if args.command == "scale":
        if args.factor <= 0:
            parser.error("--factor must be positive")
        document = yaml.safe_load(args.rules.read_text(encoding="utf-8"))
        scaled = scale_rules(document, args.factor)
        args.output.write_text(
            f"# {args.rules.name} with every duration × {args.factor} "
            "(alerts/generate.py scale); for tests only.\n" + dump_rules(scaled["groups"]),
            encoding="utf-8",
        )
        return 0

    try:
        files = outputs(args.runbook_base_url)
    except SourceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    stale = [path for path, text in files.items()
             if not path.is_file() or path.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print(f"out of date: {path.relative_to(ROOT)} (run `make generate`)",
                  file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
