"""The report as the ``doctor --json`` document: the engine's dataclasses, field by field.

``report_json`` writes each engine dataclass of a ``model.Report`` with
``fields_of``: its fields in their declared order, tuples as lists, pairs of
``(name, value)`` as one object (``OBJECT_FIELDS``) and the few fields the
document names after their unit under that name (``JSON_NAMES``:
``utilization`` → ``utilization_ratio``); beside them go what the report adds
(a GPU's job, a checkpoint's age) and the words of ``messages`` in the
report's language (a finding's ``message``, a job's ``kind_name`` and
``advice``). There is no second copy of the fields to keep in step: a field
added to an engine dataclass appears in the document. The keys are stable
(docs/diagnosis.md); the messages follow ``lang``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trainmon.diagnosis.finding import Finding
from trainmon.diagnosis.measure import GPUState, JobGoodput, NcclState
from trainmon.diagnosis.platform_signals import NodePlatform
from trainmon.diagnosis.rules import Evidence, Verdict
from trainmon.report.history import History, history_json
from trainmon.report.messages import finding_text, kind_name, nccl_text
from trainmon.report.model import GPU, Checkpoint, Link, NumaBinding, Report, advice

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: A JSON object, as ``json.dumps`` takes it.
Json = dict[str, object]

#: Engine fields whose key in the document says their unit.
JSON_NAMES: Mapping[type, Mapping[str, str]] = {
    GPUState: {
        "utilization": "utilization_ratio", "sawtooth": "sawtooth_ratio",
        "sm_active": "sm_active_ratio", "sm_occupancy": "sm_occupancy_ratio",
        "tensor_active": "tensor_active_ratio", "dram_active": "dram_active_ratio",
        "pipes": "pipe_active_ratio",
    },
    Evidence: {"pipe_active": "pipe_active_ratio"},
}
#: Engine fields of ``(name, value)`` pairs, written as one object (``{"tensor": 0.4}``).
OBJECT_FIELDS = frozenset({
    (GPUState, "pipes"), (Evidence, "pipe_active"), (NodePlatform, "labels"),
})


def report_json(report: Report) -> Json:
    """The whole report as JSON-ready data, in the document's key order."""
    lang = report.lang
    goodput = {job.job: job for job in report.goodput}
    history = report.history
    return {
        "source": dict(report.source),
        "lang": lang,
        "platform": {
            **fields_of(report.platform.node),
            "termination_seconds": report.platform.termination_seconds,
            "findings": [_finding(finding, lang) for finding in report.platform.findings],
        },
        "gpus": [_gpu(gpu) for gpu in report.gpus],
        "numa": {
            "gpus": [{"gpu": gpu, "numa_node": numa_node}
                     for gpu, numa_node in report.gpu_numa_nodes],
            "processes": [_numa_binding(binding) for binding in report.numa],
        },
        "storage": {
            "jobs": [{"job": v.job, "data_wait_ratio": v.evidence.data_wait_ratio,
                      "rank": v.evidence.worst_data_wait_rank}
                     for v in report.waiting_for_data],
            "disks": [fields_of(disk) for disk in report.disks],
            "checkpoints": [_checkpoint(checkpoint) for checkpoint in report.checkpoints],
            "nfs": [fields_of(mount) for mount in report.nfs],
        },
        "network": {
            "jobs": [{"job": v.job, "comm_ratio": v.evidence.comm_ratio,
                      "comm_source": v.evidence.comm_source,
                      "comm_overlapped_ratio": v.evidence.comm_overlapped_ratio,
                      "comm_bytes_per_second": v.evidence.comm_bytes_per_second}
                     for v in report.communicating],
            "links": [_link(link) for link in report.links],
            "nccl": [_nccl(problem, lang) for problem in report.nccl],
        },
        "jobs": [_job(verdict, lang, goodput.get(verdict.job), history)
                 for verdict in report.verdicts],
        "previous_runs": history_json(history, () if history is None else history.live, lang),
        "recent_runs": history_json(history, () if history is None else history.ended, lang),
        "status": report.status,
        "reason": report.reason,
        "exit_code": report.exit_code,
    }


def fields_of(instance: DataclassInstance) -> Json:
    """An engine dataclass as a JSON object: every field, in order, under its
    document name; tuples as lists, ``OBJECT_FIELDS`` as objects, a dataclass
    inside as its own object."""
    kind = type(instance)
    names = JSON_NAMES.get(kind, {})
    return {
        names.get(field.name, field.name): dict(getattr(instance, field.name))
        if (kind, field.name) in OBJECT_FIELDS else _json_value(getattr(instance, field.name))
        for field in dataclasses.fields(instance)
    }


def _json_value(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return fields_of(value)
    if isinstance(value, (tuple, list)):
        return [_json_value(item) for item in value]
    if isinstance(value, dict):
        return {key: _json_value(item) for key, item in value.items()}
    return value


def _gpu(gpu: GPU) -> Json:
    return {
        **fields_of(gpu.state), "job": gpu.job, "rank": gpu.rank,
        "processes": [{**fields_of(owned.process), "job": owned.job}
                      for owned in gpu.processes],
    }


def _numa_binding(binding: NumaBinding) -> Json:
    process = binding.process
    return {
        "gpu": process.gpu, "pid": process.pid, "job": binding.job,
        "numa_node": binding.numa_node, "local_ratio": process.local_ratio,
        "status": "far" if binding.far else "local",
    }


def _checkpoint(checkpoint: Checkpoint) -> Json:
    state = checkpoint.state
    return {
        "job": state.job,
        "last_timestamp": state.last_timestamp,
        "age_seconds": checkpoint.age_seconds,
        "last_duration_seconds": state.last_duration_seconds,
        "checkpoints": state.checkpoints,
        **fields_of(checkpoint.storage),
    }


def _link(link: Link) -> Json:
    return {**fields_of(link.state), "utilization_ratio": link.state.utilization,
            "port_up": link.port_up}


def _finding(finding: Finding, lang: str) -> Json:
    """Written out: the document puts ``severity`` before ``values``, the dataclass after."""
    return {"kind": finding.kind, "code": finding.code, "severity": finding.severity,
            "values": finding.values,
            "message": finding_text(finding.code, finding.values, lang)}


def _nccl(problem: NcclState, lang: str) -> Json:
    return {**fields_of(problem),
            "message": nccl_text(problem.problem, problem.variable, problem.value, lang)}


def _job(verdict: Verdict, lang: str, goodput: JobGoodput | None,
         history: History | None) -> Json:
    run = None if history is None else history.current(verdict.job)
    return {
        "job": verdict.job,
        "kind": verdict.kind,
        "kind_name": kind_name(verdict.kind, lang),
        "goodput": None if goodput is None else fields_of(goodput),
        "run": None if run is None else run.to_json(),
        "findings": [_finding(finding, lang) for finding in verdict.findings],
        "evidence": fields_of(verdict.evidence),
        "advice": advice(verdict, lang, history),
        "nccl": [_nccl(problem, lang) for problem in verdict.nccl],
    }
