"""``--prometheus`` reads a run's fail-slow changes from the diagnosis' series: the
arithmetic over query results, and a real Prometheus scraping a fake node daemon."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from testkit.prometheus import Prometheus, wait_until
from tests.runs.runs_support import PhasedNode, scrape_every_second
from trainmon.ledger.summary import MAX_RECORDED_FAIL_SLOW
from trainmon.runs.prometheus import PrometheusSource, fail_slow_summary

T0 = 1_800_000_000.0


def series(labels: dict[str, str], values: list[tuple[float, float]]) -> dict[str, object]:
    return {"metric": {"instance": "n1:19400", **labels},
            "values": [[t, str(v)] for t, v in values]}


def test_one_change_per_rank_part_and_start_with_its_largest_ratio_and_span() -> None:
    ratios = [series({"rank": "1", "part": "compute", "cause": "unknown"},
                     [(T0, 0.2), (T0 + 15, 0.3)]),
              series({"rank": "1", "part": "compute", "cause": "cpu_throttled"},
                     [(T0 + 30, 0.25), (T0 + 45, 0.22), (T0 + 300, 0.4)]),
              series({"rank": "", "part": "data_wait", "cause": "data_loading"},
                     [(T0 + 60, 0.15)])]
    starts = [series({"rank": "1"}, [(T0 + t, T0 - 20) for t in (0, 15, 30, 45)]
                     + [(T0 + 300, T0 + 280)]),
              series({"rank": ""}, [(T0 + 60, T0 + 50)])]
    kinds = [series({"rank": "1", "kind": "scheduling"}, [(T0 + t, 1) for t in (0, 15, 30, 45,
                                                                                300)]),
             series({"rank": "", "kind": "storage"}, [(T0 + 60, 1)])]
    assert fail_slow_summary(ratios, starts, kinds) == [
        {"rank": "1", "part": "compute", "kind": "scheduling", "cause": "cpu_throttled",
         "ratio": 0.3, "start": T0 - 20, "seconds": 45.0},
        {"rank": "", "part": "data_wait", "kind": "storage", "cause": "data_loading",
         "ratio": 0.15, "start": T0 + 50, "seconds": 0.0},
        {"rank": "1", "part": "compute", "kind": "scheduling", "cause": "cpu_throttled",
         "ratio": 0.4, "start": T0 + 280, "seconds": 0.0},
    ]


def test_the_largest_changes_are_kept_and_a_point_without_a_start_is_none() -> None:
    count = MAX_RECORDED_FAIL_SLOW + 2
    ratios = [series({"rank": str(i), "part": "step", "cause": "unknown"},
                     [(T0 + i, 0.1 + i / 100)]) for i in range(count)]
    starts = [series({"rank": str(i)}, [(T0 + i, T0 + i)]) for i in range(1, count)]
    changes = fail_slow_summary(ratios, starts, [])
    assert [c["rank"] for c in changes] == [str(i) for i in range(2, count)]
    assert {c["kind"] for c in changes} == {""}


# -- a real Prometheus -------------------------------------------------------------------

STARTED = time.time() - 60
OWNER = "uid:1000"


def metrics(phase: int) -> str:
    """A node daemon whose run ``r1`` slows on rank 1 (phase 1), then recovers (phase 2);
    another owner's job of the same name slows too, and is not the run's."""
    lines = ["# TYPE trainmon_training_run_info gauge",
             f'trainmon_training_run_info{{job="llama",owner="{OWNER}",run="r1",'
             'config_hash="sha256:0"} 1']
    if phase == 1:
        lines += [
            "# TYPE trainmon_diagnosis_fail_slow_ratio gauge",
            f'trainmon_diagnosis_fail_slow_ratio{{job="llama",owner="{OWNER}",rank="1",'
            'part="compute",cause="cpu_throttled"} 0.35',
            'trainmon_diagnosis_fail_slow_ratio{job="llama",owner="uid:1001",rank="0",'
            'part="step",cause="unknown"} 0.9',
            "# TYPE trainmon_diagnosis_fail_slow_start_timestamp_seconds gauge",
            f'trainmon_diagnosis_fail_slow_start_timestamp_seconds{{job="llama",'
            f'owner="{OWNER}",rank="1"}} {STARTED + 30}',
            'trainmon_diagnosis_fail_slow_start_timestamp_seconds{job="llama",'
            f'owner="uid:1001",rank="0"}} {STARTED}',
            "# TYPE trainmon_diagnosis_finding_info gauge",
            f'trainmon_diagnosis_finding_info{{job="llama",owner="{OWNER}",'
            'kind="scheduling",finding="fail_slow",rank="1"} 1']
    return "\n".join(lines) + "\n"


@pytest.fixture
def node() -> Iterator[PhasedNode]:
    with PhasedNode(metrics) as node:
        yield node


@pytest.mark.integration
def test_a_runs_fail_slow_is_read_from_prometheus_for_its_owner_only(
        node: PhasedNode, prometheus: Prometheus) -> None:
    scrape_every_second(prometheus, node.address)
    wait_until(lambda: len(prometheus.query(
        "count_over_time(trainmon_diagnosis_fail_slow_ratio[1m]) >= 4")) == 2,
        30, "four scrapes of the slowed run")
    node.move_to(2)
    wait_until(lambda: not prometheus.query("trainmon_diagnosis_fail_slow_ratio"), 30,
               "the recovered change gone stale")
    source = PrometheusSource(prometheus.url)
    try:
        view = source.run("r1", job="llama")
    finally:
        source.close()
    [change] = view.summary["fail_slow"]
    assert (change["rank"], change["part"], change["kind"], change["cause"], change["ratio"],
            change["start"]) == ("1", "compute", "scheduling", "cpu_throttled", 0.35,
                                 pytest.approx(STARTED + 30))
    assert change["seconds"] >= 3.0
