"""Suspect nodes from a Prometheus server: ``trainmon suspects --prometheus URL``.

The shipped rules (``alerts/source/common.yml``, ``trainmon-suspects.rules``) compare
each node with its peers and record ``node:trainmon_suspect:reason{node, reason}`` for a
node beyond a threshold, valued with its deviation. This module reads those series and,
as evidence for each reason, the per-node series the rule compared (the node's figure
and the median of its peer group, computed here from the same recorded series), the
node's unhealthy subsystems (``trainmon_health_status > 0`` with reason and action) and
its CVM's open Tencent Cloud events. It then writes the commands that exclude the nodes
from scheduling — Slurm ``--exclude=`` and ``scontrol update … State=DRAIN``, Kubernetes
``kubectl cordon`` and a ``trainmon.io/suspect`` taint — for a person to run: nothing
here runs them, and nothing else in trainmon drains a node.

Every label printed comes from Prometheus, so it is cleaned of control characters
(``trainmon.terminal``) and the node names in the commands are shell-quoted.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from trainmon.runs.prometheus import PrometheusError, PrometheusSource, promql_string
from trainmon.terminal import escape_json, one_line

#: The recorded series the rules write, one per node and reason.
SUSPECT_SERIES = "node:trainmon_suspect:reason"
#: Reason → (the per-node series its rule compares, the label naming the peer group,
#: what the figure is). Reasons without an entry (step_time, health, cloud_event) have
#: their own evidence below.
PEER_SERIES: Mapping[str, tuple[str, str, str]] = {
    "gpu_clocks": ("node_model:trainmon_gpu_sm_clock:ratio", "name",
                   "busy GPUs' SM clock / max clock"),
    "gpu_throttle": ("node_model:trainmon_gpu_throttle:max_ratio_rate10m", "name",
                     "most throttled GPU's share of time"),
    "gpu_xid": ("node_model:trainmon_gpu_critical_xids:increase30m", "name",
                "critical XIDs in 30 min"),
    "gpu_ecc": ("node_model:trainmon_gpu_uncorrected_ecc_errors:increase30m", "name",
                "uncorrected ECC errors in 30 min"),
    "network_errors": ("node_type:trainmon_network_errors:rate10m", "instance_type",
                       "NIC + InfiniBand errors per second"),
    "link_speed": ("node_type:trainmon_infiniband_active_rate_bytes:sum", "instance_type",
                   "ACTIVE InfiniBand ports' rate, bytes/s"),
}
STEP_SERIES = "job_instance:trainmon_training_work_seconds_per_step:max_rate10m"
#: The taint the Kubernetes command sets (``<key>=<reason>:NoSchedule``).
TAINT_KEY = "trainmon.io/suspect"
_TAINT_VALUE = re.compile(r"[^A-Za-z0-9_.-]")


class QuerySource(Protocol):
    """What the module asks of Prometheus (``PrometheusSource`` in the CLI)."""

    def query(self, expr: str, at: float) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Reason:
    """One reason a node is a suspect: the rule's deviation and what it compared."""

    name: str
    #: The recorded deviation (0.3 = 30 % worse than the median; an excess where the
    #: median is zero; the status or event count for health and cloud_event).
    deviation: float
    #: The node's own figure and its peer group's median, where the rule compares peers.
    value: float | None = None
    median: float | None = None
    #: The peer group (a GPU model, an instance type) and how many nodes it has.
    group: str = ""
    peers: int = 0
    #: What the figure is, in words.
    figure: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.name, "deviation": self.deviation, "value": self.value,
                "median": self.median, "group": self.group, "peers": self.peers,
                "figure": self.figure}


@dataclass(frozen=True)
class Suspect:
    node: str
    reasons: tuple[Reason, ...]
    #: Unhealthy subsystems: "infiniband mlx5_0:1 failed: port_down (action drain)".
    health: tuple[str, ...] = ()
    #: Open cloud events: "GpuFault (gpu_fault, abnormal)".
    events: tuple[str, ...] = ()
    #: Jobs whose ranks here are slower than the job's median node: "llama (uid:1) 1.5×".
    jobs: tuple[str, ...] = ()

    @property
    def reason_names(self) -> list[str]:
        return [reason.name for reason in self.reasons]

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "reasons": [r.to_json() for r in self.reasons],
                "health": list(self.health), "events": list(self.events),
                "jobs": list(self.jobs), "commands": node_commands(self)}


@dataclass(frozen=True)
class SuspectReport:
    suspects: tuple[Suspect, ...]
    #: Nodes the GPU and network rules compared (any per-node series present).
    compared: int = 0
    commands: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {"suspects": [s.to_json() for s in self.suspects], "compared_nodes": self.compared,
                "commands": list(self.commands)}


def _labels(sample: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): one_line(str(v)) for k, v in dict(sample.get("metric") or {}).items()}


def _value(sample: Mapping[str, Any]) -> float:
    return float(sample["value"][1])


def find_suspects(source: QuerySource, at: float) -> SuspectReport:
    """The suspect nodes Prometheus records at ``at``, with their evidence."""
    found: dict[str, list[Reason]] = {}
    for sample in source.query(SUSPECT_SERIES, at):
        labels = _labels(sample)
        node, name = labels.get("node", ""), labels.get("reason", "")
        if node and name:
            found.setdefault(node, []).append(Reason(name, _value(sample)))
    compared: set[str] = set()
    evidence: dict[tuple[str, str], Reason] = {}
    for peer_reason, (series, group_label, figure) in PEER_SERIES.items():
        groups: dict[str, dict[str, float]] = {}
        for sample in source.query(series, at):
            labels = _labels(sample)
            groups.setdefault(labels.get(group_label, ""), {})[labels.get("node", "")] = \
                _value(sample)
        for group, values in groups.items():
            compared.update(values)
            median = statistics.median(values.values())
            for node in found:
                if node in values:
                    evidence[(node, peer_reason)] = Reason(
                        peer_reason, 0.0, values[node], median, group, len(values), figure)
    suspects = []
    for node in sorted(found):
        reasons: list[Reason] = []
        for reason in sorted(found[node], key=lambda r: r.name):
            known = evidence.get((node, reason.name))
            reasons.append(Reason(reason.name, reason.deviation, known.value, known.median,
                                  known.group, known.peers, known.figure)
                           if known else reason)
        names = {reason.name for reason in reasons}
        suspects.append(Suspect(
            node, tuple(reasons),
            health=_health(source, node, at) if "health" in names else (),
            events=_events(source, node, at) if "cloud_event" in names else (),
            jobs=_slow_jobs(source, node, at) if "step_time" in names else ()))
    chosen = tuple(suspects)
    return SuspectReport(chosen, len(compared), tuple(exclusion_commands(chosen)))


def _rows(source: QuerySource, expr: str, at: float,
          row: Callable[[dict[str, str], float], str]) -> tuple[str, ...]:
    """``row(labels, value)`` of each sample ``expr`` answers at ``at``, sorted."""
    return tuple(sorted(row(_labels(sample), _value(sample))
                        for sample in source.query(expr, at)))


def _health(source: QuerySource, node: str, at: float) -> tuple[str, ...]:
    def row(labels: dict[str, str], status: float) -> str:
        state = "failed" if status >= 2 else "degraded"
        return (f"{labels.get('subsystem', '?')} {labels.get('device', '?')} {state}: "
                f"{labels.get('reason', '?')} (action {labels.get('action', '?')})")

    return _rows(source, f"trainmon_health_status{{node={promql_string(node)}}} > 0", at, row)


def _events(source: QuerySource, node: str, at: float) -> tuple[str, ...]:
    selector = f'node={promql_string(node)},instance_id!=""'
    expr = ("trainmon_tencent_event_info * on (instance_id) group_left () topk by "
            f"(instance_id) (1, group by (instance_id) (trainmon_node_info{{{selector}}}))")
    return _rows(source, expr, at, lambda labels, _: (
        f"{labels.get('event', '?')} ({labels.get('category', '?')}, "
        f"{labels.get('status', '?')}) on {labels.get('instance_id', '?')}"))


def _slow_jobs(source: QuerySource, node: str, at: float) -> tuple[str, ...]:
    expr = (f"{STEP_SERIES} / on (job, owner) group_left () quantile by (job, owner) "
            f"(0.5, {STEP_SERIES}) * on (instance) group_left () "
            f"group by (instance) (trainmon_build_info{{node={promql_string(node)}}})")
    return _rows(source, expr, at, lambda labels, ratio: (
        f"{labels.get('job', '?')} ({labels.get('owner', '?')}) {ratio:.2f}× its median node"))


def _taint_value(reason: str) -> str:
    """A Kubernetes label value (63 characters of [A-Za-z0-9_.-])."""
    return _TAINT_VALUE.sub("_", reason)[:63].strip("_.-") or "suspect"


def node_commands(suspect: Suspect) -> list[str]:
    """The commands that exclude one node, for a person to run."""
    node = shlex.quote(suspect.node)
    reasons = ",".join(suspect.reason_names)
    drain_reason = shlex.quote(f"trainmon: {reasons}")
    return [
        f"scontrol update NodeName={node} State=DRAIN Reason={drain_reason}",
        f"kubectl cordon {node}",
        f"kubectl taint nodes {node} {TAINT_KEY}={_taint_value(suspect.reason_names[0])}"
        ":NoSchedule",
    ]


def exclusion_commands(suspects: Sequence[Suspect]) -> list[str]:
    """Slurm's ``--exclude=`` for every suspect, then each node's own commands."""
    if not suspects:
        return []
    names = ",".join(suspect.node for suspect in suspects)
    commands = [f"--exclude={shlex.quote(names)}"]
    for suspect in suspects:
        commands.extend(node_commands(suspect))
    return commands


def _number(value: float) -> str:
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
        return f"{value:.3g}"
    return f"{value:.3f}".rstrip("0").rstrip(".")


def render(report: SuspectReport) -> str:
    """The report as text: each node, its reasons and evidence, then the commands."""
    if not report.suspects:
        return (f"No suspect node (node:trainmon_suspect:reason is empty; "
                f"{report.compared} nodes compared with their peers).\n")
    lines = [f"{len(report.suspects)} suspect node(s) of {report.compared} compared with "
             "their peers. Nothing was drained: the commands below are for you to run.", ""]
    for suspect in report.suspects:
        lines.append(suspect.node)
        for reason in suspect.reasons:
            text = f"  {reason.name:<15} {_number(reason.deviation):>8}"
            if reason.value is not None and reason.median is not None:
                text += (f"  {reason.figure}: {_number(reason.value)}, median "
                         f"{_number(reason.median)} over {reason.peers} nodes"
                         f"{' of ' + reason.group if reason.group else ''}")
            lines.append(text)
        lines.extend(f"  {'':<15} {'':>8}  {row}" for row in (*suspect.health, *suspect.events,
                                                              *suspect.jobs))
        lines.append("")
    names = ",".join(suspect.node for suspect in report.suspects)
    lines.append("Exclude them from new jobs (Slurm):")
    lines.append(f"  sbatch --exclude={shlex.quote(names)} …   (or srun, salloc)")
    lines.append("Drain them (Slurm: running jobs finish, nothing new starts):")
    lines.extend(f"  {node_commands(s)[0]}" for s in report.suspects)
    lines.append("Kubernetes: cordon them, or taint them so that only tolerating pods land:")
    for suspect in report.suspects:
        lines.extend(f"  {command}" for command in node_commands(suspect)[1:])
    return "\n".join(lines) + "\n"


def suspects_command(open_source: Callable[[], PrometheusSource], *, as_json: bool,
                     out: TextIO, err: TextIO, clock: Callable[[], float] = time.time) -> int:
    """``trainmon suspects``: 0 with the report printed, 1 when Prometheus cannot answer."""
    source = open_source()
    try:
        report = find_suspects(source, clock())
    except PrometheusError as error:
        err.write(f"trainmon suspects: {one_line(str(error))}\n")
        return 1
    finally:
        source.close()
    if as_json:
        out.write(escape_json(json.dumps(report.to_json(), indent=2, ensure_ascii=False)) + "\n")
    else:
        out.write(render(report))
    return 0
