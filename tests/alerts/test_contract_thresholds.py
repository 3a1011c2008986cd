"""The generated rules, PrometheusRules and dashboards use the numbers of ``trainmon.contract``.

Every check parses a generated file — ``alerts/<variant>/trainmon.rules.yml``,
``deploy/kubernetes/overlays/<variant>/prometheusrule.yaml``,
``dashboards/<variant>/<kind>.json`` — and compares the threshold it finds
with the contract, so a literal edited into a source (or a generator that
stops reading the contract) fails here. Nothing of the generators is imported.
"""

from __future__ import annotations

import itertools
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.dashboard_files import Dashboard, load_dashboards
from tests.alerts.alerts_support.bundle import REPO, VARIANTS, rules_path, run_script
from trainmon import contract

#: ``<comparison> <number>`` in PromQL (``> 0.2``, ``>= bool 50``).
_COMPARED = re.compile(r"(?:>=|<=|==|!=|>|<)\s*(?:bool\s+)?(-?\d+(?:\.\d+)?)")
_RANGE = re.compile(r"\[\s*(\d+(?:ms|s|m|h|d|w|y))\s*[]:]")


def rule_documents() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(file, rule groups) of every generated rules file and PrometheusRule."""
    for variant in VARIANTS:
        path = rules_path(variant)
        yield str(path.relative_to(REPO)), yaml.safe_load(path.read_text())["groups"]
        manifest = REPO / "deploy" / "kubernetes" / "overlays" / variant / "prometheusrule.yaml"
        yield (str(manifest.relative_to(REPO)),
               yaml.safe_load(manifest.read_text())["spec"]["groups"])


RULE_DOCUMENTS = list(rule_documents())


def rules(groups: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    """Rules by their ``alert`` or ``record`` name."""
    return {str(rule[key]): rule for group in groups for rule in group["rules"] if key in rule}


def numbers_after(expr: str, left: str) -> list[float]:
    """Every number compared with ``left`` (a regex for the left-hand side) in ``expr``."""
    return [float(n) for n in re.findall(left + r"\s*" + _COMPARED.pattern, expr)]


#: alert → (left-hand side, contract value): each comparison it makes against the contract.
ALERT_THRESHOLDS: dict[str, list[tuple[str, float]]] = {
    "TrainmonDataLoaderBottleneck": [
        (r"job_instance:trainmon_training_data_wait:ratio_rate10m", contract.DATA_WAIT_RATIO)],
    "TrainmonCommunicationBound": [
        (r"job:trainmon_training_comm:ratio_rate10m", contract.COMM_RATIO)],
    "TrainmonStragglerRank": [
        (re.escape(contract.STRAGGLER_RATIO_SERIES), contract.STRAGGLER_FACTOR),
        (r"\)\s*\)", contract.STRAGGLER_MIN_EXCESS_SECONDS)],
    "TrainmonGPUSawtooth": [(r"trainmon_gpu_sawtooth_ratio", contract.SAWTOOTH_FLAG)],
    "TrainmonGPUHeldIdle": [(r"\)\s*\)", contract.GPU_IDLE_RATIO)],
    # the daemon's NVML GPM source, in both variants
    "TrainmonGPULowSMActivity": [
        (r"trainmon_gpu_sm_active_ratio\[15m\]\)", contract.GPU_SM_ACTIVE_LOW),
        (r"trainmon_gpu_utilization_ratio\[15m\]\)", contract.GPU_BUSY_UTILIZATION_RATIO)],
    "TrainmonGPUTensorCoresIdle": [
        (r"trainmon_gpu_tensor_active_ratio\[15m\]\)", contract.GPU_TENSOR_IDLE),
        (r"trainmon_gpu_utilization_ratio\[15m\]\)", contract.GPU_BUSY_UTILIZATION_RATIO)],
    "TrainmonGPUMemoryNearlyFull": [
        (r"trainmon_gpu_memory_total_bytes", 1 - contract.GPU_MEMORY_HEADROOM_RATIO)],
    # platform signals (issue 15)
    "TrainmonNCCLOverSockets": [
        (r"job_rank:trainmon_training_comm:ratio_rate10m\{[^}]*\}\)",
         contract.NCCL_SOCKET_MIN_COMM_RATIO),
        (r"trainmon_infiniband_port_up == 1\s*\)", contract.RDMA_IDLE_BYTES_PER_SECOND),
        (r"trainmon_network_transmit_bytes_total\{[^}]*\}\[10m\]\)\s*\)",
         contract.SOCKET_BUSY_BYTES_PER_SECOND)],
    "TrainmonCheckpointOverdue": [
        (r"\(trainmon_training_last_checkpoint_timestamp_seconds\)",
         contract.CHECKPOINT_MAX_AGE_SECONDS)],
    "TrainmonGPUProcessFarNUMA": [
        (r"trainmon_gpu_process_numa_local_ratio", contract.NUMA_LOCAL_RATIO_MIN)],
    # run ledger (issue 16): below 1 − the ratio of the best comparable run
    "TrainmonThroughputRegression": [
        (r"job_run:trainmon_training_throughput_vs_best:ratio",
         1 - contract.THROUGHPUT_REGRESSION_RATIO)],
}
#: variant → alert → comparisons of the variant's other GPU source (DCGM, Cloud Monitor).
VARIANT_ALERT_THRESHOLDS: dict[str, dict[str, list[tuple[str, float]]]] = {
    "dcgm": {
        "TrainmonGPULowSMActivity": [
            (r"DCGM_FI_PROF_SM_ACTIVE\[15m\]\)", contract.GPU_SM_ACTIVE_LOW),
            (r"DCGM_FI_DEV_GPU_UTIL\[15m\]\)", contract.GPU_BUSY_UTILIZATION_RATIO * 100)],
        "TrainmonGPUTensorCoresIdle": [
            (r"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE\[15m\]\)", contract.GPU_TENSOR_IDLE),
            (r"DCGM_FI_DEV_GPU_UTIL\[15m\]\)", contract.GPU_BUSY_UTILIZATION_RATIO * 100)],
        "TrainmonGPUMemoryNearlyFull": [
            (r"DCGM_FI_DEV_FB_FREE\)", 1 - contract.GPU_MEMORY_HEADROOM_RATIO)],
    },
    "tencent-cloud": {
        "TrainmonGPUMemoryNearlyFull": [
            (r"trainmon_tencent_cvm_gpu_memory_total_bytes",
             1 - contract.GPU_MEMORY_HEADROOM_RATIO)],
    },
}
#: The scraped sawtooth fallbacks count crossings of the sampler's busy level (in the
#: recording rule the alert reads).
FALLBACK_BUSY_LEVEL = {
    "dcgm": ("UUID:dcgm_gpu_util_crossings:changes10m", r"DCGM_FI_DEV_GPU_UTIL",
             contract.SAMPLER_BUSY_LEVEL * 100),
    "tencent-cloud": ("instance_id:trainmon_tencent_cvm_gpu_util_crossings:changes30m",
                      r"trainmon_tencent_cvm_gpu_utilization_ratio", contract.SAMPLER_BUSY_LEVEL),
}
#: alert → the contract ratio its description quotes as "(threshold N %)".
QUOTED_PERCENT = {
    "TrainmonDataLoaderBottleneck": contract.DATA_WAIT_RATIO,
    "TrainmonCommunicationBound": contract.COMM_RATIO,
    "TrainmonGPUProcessFarNUMA": contract.NUMA_LOCAL_RATIO_MIN,
    "TrainmonThroughputRegression": contract.THROUGHPUT_REGRESSION_RATIO,
}


@pytest.mark.parametrize(("where", "groups"), RULE_DOCUMENTS, ids=[w for w, _ in RULE_DOCUMENTS])
def test_alert_thresholds_are_the_contracts(where: str, groups: list[dict[str, Any]]) -> None:
    alerts = rules(groups, "alert")
    variant = next(v for v in VARIANTS if f"/{v}/" in f"/{where}")
    checks = [(name, comparison) for name, comparisons in ALERT_THRESHOLDS.items()
              for comparison in comparisons]
    checks += [(name, comparison)
               for name, comparisons in VARIANT_ALERT_THRESHOLDS[variant].items()
               for comparison in comparisons]
    for name, (left, expected) in checks:
        expr = str(alerts[name]["expr"])
        found = numbers_after(expr, left)
        assert found, f"{where}: {name}: no comparison after {left!r} in {expr!r}"
        assert found == pytest.approx([expected] * len(found)), f"{where}: {name}: {expr}"
    for name, ratio in QUOTED_PERCENT.items():
        quoted = re.findall(r"threshold (\d+(?:\.\d+)?) %", alerts[name]["annotations"]
                            ["description"])
        assert [float(q) for q in quoted] == pytest.approx([ratio * 100]), f"{where}: {name}"
    record, left, level = FALLBACK_BUSY_LEVEL[variant]
    found = numbers_after(str(rules(groups, "record")[record]["expr"]), left + r"\s*")
    assert found == pytest.approx([level]), where
    assert record in str(alerts["TrainmonGPUSawtoothScraped"]["expr"]), where


@pytest.mark.parametrize(("where", "groups"), RULE_DOCUMENTS, ids=[w for w, _ in RULE_DOCUMENTS])
def test_platform_alerts_use_and_quote_the_contracts_numbers(
    where: str, groups: list[dict[str, Any]],
) -> None:
    """Both TrainmonCheckpointOverdue twins compare with and quote the contract's age;
    TrainmonNCCLOverSockets quotes its byte rates in MB/s."""
    twins = [rule for group in groups for rule in group["rules"]
             if rule.get("alert") == "TrainmonCheckpointOverdue"]
    assert sorted(rule["labels"]["severity"] for rule in twins) == ["critical", "warning"], where
    for rule in twins:
        found = numbers_after(str(rule["expr"]),
                              r"\(trainmon_training_last_checkpoint_timestamp_seconds\)")
        assert found == pytest.approx([contract.CHECKPOINT_MAX_AGE_SECONDS]), (where, rule["expr"])
        quoted = re.findall(r"limit (\d+(?:\.\d+)?) minutes", rule["annotations"]["description"])
        assert [float(q) for q in quoted] == pytest.approx(
            [contract.CHECKPOINT_MAX_AGE_SECONDS / 60]), where
    nccl = rules(groups, "alert")["TrainmonNCCLOverSockets"]
    quoted = re.findall(r"less than (\d+(?:\.\d+)?) MB/s", nccl["annotations"]["description"])
    assert [float(q) for q in quoted] == pytest.approx(
        [contract.RDMA_IDLE_BYTES_PER_SECOND / 1e6]), where


@pytest.mark.parametrize(("where", "groups"), RULE_DOCUMENTS, ids=[w for w, _ in RULE_DOCUMENTS])
def test_training_recording_rules_use_the_contract_window(
    where: str, groups: list[dict[str, Any]],
) -> None:
    training = [group for group in groups
                if group["name"] in ("trainmon-training.rules", "trainmon-diagnosis.rules")]
    windows = {
        rule["record"]: set(_RANGE.findall(str(rule["expr"])))
        for group in training for rule in group["rules"]
        if "record" in rule and _RANGE.search(str(rule["expr"]))
    }
    assert contract.STRAGGLER_RATIO_SERIES in rules(groups, "record"), where
    assert len(windows) >= 4, f"{where}: expected the rate10m training rules, got {windows}"
    for record, ranges in windows.items():
        assert ranges == {contract.TRAINING_RULE_WINDOW}, f"{where}: {record} selects {ranges}"
        assert record.endswith(contract.TRAINING_RULE_WINDOW), record


@pytest.mark.parametrize(("where", "groups"), RULE_DOCUMENTS, ids=[w for w, _ in RULE_DOCUMENTS])
def test_run_rules_use_the_contracts_window_and_regression_numbers(
    where: str, groups: list[dict[str, Any]],
) -> None:
    """Runs are measured over the training window, compared once they have run for it,
    and TrainmonThroughputRegression waits the contract's window."""
    records = rules(groups, "record")
    rate = records["job_run:trainmon_training_samples_per_second:rate10m"]
    assert set(_RANGE.findall(str(rate["expr"]))) == {contract.TRAINING_RULE_WINDOW}, where
    settled = str(records[
        "job_run:trainmon_training_samples_per_second_per_rank:settled_rate10m"]["expr"])
    offsets = re.findall(r"trainmon_training_run_start_timestamp_seconds offset (\w+)", settled)
    assert offsets == [contract.TRAINING_RULE_WINDOW], (where, settled)
    alert = rules(groups, "alert")["TrainmonThroughputRegression"]
    assert alert["for"] == contract.THROUGHPUT_REGRESSION_WINDOW, where
    assert f"for {contract.THROUGHPUT_REGRESSION_WINDOW}" in alert["annotations"]["description"]


# -- dashboards -------------------------------------------------------------


@dataclass(frozen=True)
class Measure:
    """Panels that show one contract quantity, and the threshold they must use."""

    name: str
    shows: Callable[[dict[str, Any], str], bool]
    threshold: float
    #: Too little is the problem (SM, tensor activity): red below the threshold, so the
    #: step to check is the one where red ends.
    low_is_bad: bool = False


def _unit(panel: dict[str, Any]) -> str:
    return str(panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""))


MEASURES = (
    Measure("data wait", lambda p, q: "trainmon_training_data_wait" in q
            and _unit(p) == "percentunit", contract.DATA_WAIT_RATIO),
    Measure("comm", lambda p, q: 'phase="comm"' in q and _unit(p) == "percentunit",
            contract.COMM_RATIO),
    Measure("sawtooth", lambda p, q: "trainmon_gpu_sawtooth_ratio" in q, contract.SAWTOOTH_FLAG),
    Measure("straggler", lambda p, q: "straggler" in str(p.get("title", "")).lower(),
            contract.STRAGGLER_FACTOR),
    Measure("idle fraction", lambda p, q: "trainmon_gpu_util_idle_samples_total" in q,
            1 - contract.GPU_IDLE_RATIO),
    Measure("SM active", lambda p, q: "trainmon_gpu_sm_active_ratio" in q,
            contract.GPU_SM_ACTIVE_LOW, low_is_bad=True),
    Measure("tensor active", lambda p, q: "trainmon_gpu_tensor_active_ratio" in q,
            contract.GPU_TENSOR_IDLE, low_is_bad=True),
    Measure("DRAM active", lambda p, q: "trainmon_gpu_dram_active_ratio" in q,
            contract.GPU_DRAM_ACTIVE_CEILING),
    Measure("memory used share", lambda p, q: _unit(p) == "percentunit"
            and "/ trainmon_gpu_memory_total_bytes" in q,
            1 - contract.GPU_MEMORY_HEADROOM_RATIO),
    Measure("link utilization", lambda p, q: _unit(p) == "percentunit" and re.search(
        r"/\s*trainmon_(network_speed|infiniband_rate)_bytes", q) is not None,
        contract.LINK_SATURATION_RATIO),
    Measure("checkpoint age", lambda p, q: "time() - " in q
            and "trainmon_training_last_checkpoint_timestamp_seconds" in q,
            contract.CHECKPOINT_MAX_AGE_SECONDS),
    Measure("NUMA local ratio", lambda p, q: "trainmon_gpu_process_numa_local_ratio" in q,
            contract.NUMA_LOCAL_RATIO_MIN, low_is_bad=True),
    Measure("throughput vs best comparable run",
            lambda p, q: "job_run:trainmon_training_throughput_vs_best:ratio" in q,
            1 - contract.THROUGHPUT_REGRESSION_RATIO, low_is_bad=True),
)


def red_steps(panel: dict[str, Any], *, low_is_bad: bool = False) -> list[float]:
    """The values where red starts (or, ``low_is_bad``, where a red base ends)."""
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps")
    steps = list(steps or [])
    if low_is_bad:
        return [float(after["value"]) for before, after in itertools.pairwise(steps)
                if before.get("color") == "red" and after.get("color") != "red"]
    return [float(step["value"]) for step in steps
            if step.get("color") == "red" and step.get("value") is not None]


def checked_panels(dashboards: list[Dashboard], measure: Measure) -> list[str]:
    """Check every panel of ``measure``; the panels that had a threshold to check.

    A panel either draws the quantity (its red threshold step is the contract's)
    or counts what crosses it (the number its query compares with is).
    """
    checked = []
    for dashboard in dashboards:
        for panel in dashboard.data_panels():
            query = " ".join(str(t.get("expr", "")) for t in panel.get("targets", []))
            if not measure.shows(panel, query):
                continue
            where = f"{dashboard.name} · {panel['title']!r}"
            compared = [float(n) for n in _COMPARED.findall(query)]
            values = compared or red_steps(panel, low_is_bad=measure.low_is_bad)
            assert values == pytest.approx([measure.threshold] * len(values)), (
                f"{where}: {measure.name} threshold {values}, contract {measure.threshold}")
            if values:
                checked.append(where)
    return checked


@pytest.mark.parametrize("measure", MEASURES, ids=[m.name for m in MEASURES])
def test_dashboard_thresholds_are_the_contracts(measure: Measure) -> None:
    dashboards = load_dashboards()
    checked = checked_panels(dashboards, measure)
    # every variant draws each quantity somewhere
    assert {where.split("/")[0] for where in checked} == set(VARIANTS), checked


def test_the_straggler_panels_show_the_recording_rule_of_the_alert() -> None:
    straggler_alert = rules(RULE_DOCUMENTS[0][1], "alert")["TrainmonStragglerRank"]
    assert contract.STRAGGLER_RATIO_SERIES in straggler_alert["expr"]
    panels = [
        (dashboard.name, panel) for dashboard in load_dashboards()
        for panel in dashboard.data_panels() if "Straggler" in str(panel.get("title", ""))
    ]
    assert len(panels) == 2 * len(VARIANTS), [name for name, _ in panels]
    for name, panel in panels:
        for target in panel["targets"]:
            assert contract.STRAGGLER_RATIO_SERIES in target["expr"], (name, target["expr"])
            assert "step_seconds" not in target["expr"], (name, target["expr"])


def test_generator_refuses_a_training_rule_whose_window_is_not_the_contracts(
    tmp_path: Path,
) -> None:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "alerts", root / "alerts", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "docs" / "runbooks", root / "docs" / "runbooks")
    shutil.copy(REPO / "docs" / "alerts.md", root / "docs" / "alerts.md")
    source = root / "alerts" / "source" / "common.yml"
    text = source.read_text()
    edited = text.replace(
        "sum by (job, owner, rank, instance) (rate(trainmon_training_step_seconds_sum[10m]))",
        "sum by (job, owner, rank, instance) (rate(trainmon_training_step_seconds_sum[5m]))")
    assert edited != text
    source.write_text(edited)
    result = run_script("alerts/generate.py", "--check", cwd=root)
    assert result.returncode == 2
    assert "job_rank:trainmon_training_step_seconds_sum:rate10m: its name says 10m" in result.stderr
    renamed = edited.replace("job_rank:trainmon_training_step_seconds_sum:rate10m",
                             "job_rank:trainmon_training_step_seconds_sum:rate5m")
    source.write_text(renamed)
    result = run_script("alerts/generate.py", "--check", cwd=root)
    assert result.returncode == 2
    assert "training rules use the contract's window 10m" in result.stderr
