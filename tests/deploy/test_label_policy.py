"""The label policy of docs/metrics.md ("Label policy") holds for the demo's exposition.

Series per node stay bounded only if no high-volume series carries identity,
run or time labels. The demo (8 GPUs, two 4-rank jobs through the real client,
every collector of the default configuration) is scraped twice while its
ranks step; the checks are exact: label names, the families they appear on,
label values that are times, and series that appear between two scrapes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.daemon import Daemon

pytestmark = pytest.mark.integration

METRICS_DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
READY_SECONDS = 30.0

#: Labels that identify a thing or describe a run: only on `_info` families.
IDENTITY_LABELS = frozenset({
    "pid", "run", "config_hash", "changed", "uuid", "name", "pci_bus_id", "driver_version",
    "version", "commit", "pod", "namespace", "container", "pod_uid", "container_id",
    "slurm_job", "instance_id", "instance_type", "region", "zone",
})
#: Non-`_info` families allowed an identity label, and why (named in docs/metrics.md too).
ALLOWED = {
    # one series per GPU process: bounded by the GPU processes of the node
    "trainmon_gpu_process_numa_local_ratio": {"pid"},
    # one series per run live on the node; the value is the start time
    "trainmon_training_run_start_timestamp_seconds": {"run"},
    # one series per run ended on the node in the last hour (at most 16); the value is
    # the end time
    "trainmon_training_run_end_timestamp_seconds": {"run"},
}
#: Series a rank creates at its first checkpoint (docs/metrics.md, checkpoints).
CHECKPOINT_FAMILIES = frozenset({
    "trainmon_training_checkpoints", "trainmon_training_checkpoint_seconds",
    "trainmon_training_last_checkpoint_timestamp_seconds",
    "trainmon_training_last_checkpoint_duration_seconds",
    "trainmon_training_checkpoint_storage_info",
})
#: Label names that would make a series per step, batch, request or instant.
FORBIDDEN_LABELS = frozenset({
    "step", "global_step", "batch", "batch_id", "iteration", "epoch", "timestamp", "time",
    "ts", "request", "request_id", "trace_id", "span_id",
})
#: A label value that is a time: ISO 8601 (basic or extended) or Unix seconds/ms.
TIME_VALUE = re.compile(
    r"\d{8}T\d{6}|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}|^1\d{9}(\d{3})?(\.\d+)?$"
)


def policy_violations(exposition: str) -> list[str]:
    """Every breach of the label policy in ``exposition``, one line each."""
    violations = []
    for family in text_string_to_metric_families(exposition):
        names = {name for sample in family.samples for name in sample.labels}
        for name in sorted(names & FORBIDDEN_LABELS):
            violations.append(f"{family.name}: label {name!r} is per step/request/time")
        identity = names & IDENTITY_LABELS
        if not family.name.endswith("_info"):
            for name in sorted(identity - ALLOWED.get(family.name, set())):
                violations.append(f"{family.name}: identity label {name!r} off an _info family")
        for sample in family.samples:
            for name, value in sample.labels.items():
                if name not in identity and TIME_VALUE.search(value):
                    violations.append(f"{family.name}: {name}={value!r} is a time")
    return violations


def series_keys(exposition: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """(family, sorted labels) of every sample."""
    return {
        (family.name, tuple(sorted(sample.labels.items())))
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def rank_steps(exposition: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Each rank's ``trainmon_training_steps_total``."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition)
        if family.name == "trainmon_training_steps"
        for sample in family.samples
        if sample.name == "trainmon_training_steps_total"
    }


def test_the_demo_follows_the_label_policy(start_daemon: Callable[..., Daemon]) -> None:
    daemon = start_daemon(args=["--demo"])
    deadline = time.monotonic() + READY_SECONDS
    first = daemon.metrics()
    while len(rank_steps(first)) < 8 and time.monotonic() < deadline:
        time.sleep(0.5)
        first = daemon.metrics()
    assert len(rank_steps(first)) == 8, "the demo never reported its 8 ranks"
    # Let diagnosis move from pseudo-jobs to the reporting jobs, then take two
    # scrapes between which every rank stepped.
    time.sleep(3.0)
    first = daemon.metrics()
    second = first
    while time.monotonic() < deadline + 15:
        time.sleep(1.0)
        second = daemon.metrics()
        before, after = rank_steps(first), rank_steps(second)
        if before.keys() == after.keys() and all(after[k] > before[k] for k in before):
            break
    before, after = rank_steps(first), rank_steps(second)
    assert all(after[key] > before[key] for key in before), (before, after)

    assert policy_violations(first) == []
    assert policy_violations(second) == []
    # While the ranks step, the set of step series stays the same: no label
    # follows the step (a new series per step would show as a difference). A rank's
    # checkpoint series (and its checkpoint phase's) appear at its first checkpoint,
    # once: an event, not a step.
    def step_series(exposition: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        return {key for key in series_keys(exposition)
                if key[0].startswith("trainmon_training_") and key[0] not in CHECKPOINT_FAMILIES
                and ("phase", "checkpoint") not in key[1]}

    training, later = step_series(first), step_series(second)
    assert training == later, training ^ later
    # The allowlist is not stale: the demo exposes every family it excuses.
    families = {family.name for family in text_string_to_metric_families(second)}
    assert set(ALLOWED) <= families


def test_the_checks_catch_each_kind_of_breach() -> None:
    exposition = "\n".join([
        "# TYPE trainmon_bad_step_seconds gauge",
        'trainmon_bad_step_seconds{job="a",step="17"} 1.0',
        "# TYPE trainmon_bad_pid_ratio gauge",
        'trainmon_bad_pid_ratio{gpu="0",pid="4242"} 0.5',
        "# TYPE trainmon_bad_started gauge",
        'trainmon_bad_started{job="a",phase="2026-12-01T13:58:40Z"} 1.0',
        "# TYPE trainmon_good_run_info gauge",
        'trainmon_good_run_info{job="a",run="a-20261201T135840Z",pid="1"} 1.0',
        "",
    ])
    assert policy_violations(exposition) == [
        "trainmon_bad_step_seconds: label 'step' is per step/request/time",
        "trainmon_bad_pid_ratio: identity label 'pid' off an _info family",
        "trainmon_bad_started: phase='2026-12-01T13:58:40Z' is a time",
    ]


def test_the_docs_name_every_exception() -> None:
    text = METRICS_DOCS.read_text(encoding="utf-8")
    _, found, rest = text.partition("\n## Label policy\n")
    assert found, "docs/metrics.md has no 'Label policy' section"
    section = rest.split("\n## ", 1)[0]
    for family, labels in ALLOWED.items():
        assert f"`{family}`" in section, family
        assert all(f"**`{label}`**" in section for label in labels), labels
    for name in ("step", "batch", "iteration", "epoch", "timestamp", "time", "request_id"):
        assert f"`{name}`" in section, name
