"""``bench.diagnosis_score``: the scoring math on hand-made observations, and the
``--quick`` subset against real jobs.

The unit tests build the samples a scrape gives (or the exposition text itself) and
check the figures the benchmark prints: precision, recall and F1 per class, the
macro-F1, the nearest-rank percentiles with never-right cases, the time to the
right verdict under flapping predictions, false findings per healthy job-hour and
the false pages. The integration test runs ``python -m bench.diagnosis_score
--quick`` and checks that the harness observed every case and wrote a well-formed
report; the accuracy goals are the benchmark's to report, not asserted here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import diagnosis_score as ds
from bench.benchlib import ROOT
from testkit.exposition import parse

COMPUTE = ds.Truth("compute")
STRAGGLER_1 = ds.Truth("straggler", "1")
HUNG_1 = ds.Truth("hung_rank", "1")
#: Wall-clock budget of the ``--quick`` run.
QUICK_TIMEOUT_SECONDS = 230


def p(cls: str, rank: str | None = None) -> ds.Prediction:
    return ds.Prediction(cls, rank)


def timeline(*predictions: ds.Prediction, start: float = 0.0) -> list[ds.Sample]:
    """One sample a second from ``start``."""
    return [ds.Sample(start + i, prediction) for i, prediction in enumerate(predictions)]


def with_findings(*findings: tuple[ds.FindingKey, ...], start: float = 0.0) -> list[ds.Sample]:
    return [ds.Sample(start + i, p("compute"), f) for i, f in enumerate(findings)]


# --- the prediction of one scrape ---------------------------------------------------------

EXPOSITION = """\
# HELP trainmon_bottleneck verdict
# TYPE trainmon_bottleneck gauge
trainmon_bottleneck{job="a",kind="compute"} 0
trainmon_bottleneck{job="a",kind="scheduling"} 1
trainmon_bottleneck{job="b",kind="storage"} 1
trainmon_bottleneck{job="b",kind="scheduling"} 0
# HELP trainmon_diagnosis_finding_info findings
# TYPE trainmon_diagnosis_finding_info gauge
trainmon_diagnosis_finding_info{job="a",kind="scheduling",finding="straggler",rank="3"} 1
trainmon_diagnosis_finding_info{job="a",kind="scheduling",finding="hung_rank",rank="1"} 1
trainmon_diagnosis_finding_info{job="b",kind="storage",finding="data_wait",rank="0"} 1
trainmon_diagnosis_finding_info{job="b",kind="storage",finding="checkpoint_local_disk",rank=""} 1
# HELP trainmon_training_rank_info ranks
# TYPE trainmon_training_rank_info gauge
trainmon_training_rank_info{job="b",rank="0",gpu="",pid="7"} 1
"""


def test_a_scrape_predicts_the_hung_rank_first_then_the_straggler_then_the_verdict() -> None:
    scrape = parse(EXPOSITION)
    a = ds.observe(scrape, "a", 12.0)
    assert a.prediction == p("hung_rank", "1") and a.at == 12.0
    assert ("scheduling", "straggler", "3") in a.findings
    b = ds.observe(scrape, "b", 12.0)
    assert b.prediction == p("storage")
    assert b.findings == (("storage", "checkpoint_local_disk", ""),
                          ("storage", "data_wait", "0"))
    assert ds.observe(scrape, "c", 12.0) == ds.Sample(12.0, ds.NONE)
    assert ds.reported(scrape, "b") and not ds.reported(scrape, "a")


def test_scheduling_without_a_rank_finding_and_none_are_wrong_classes_of_their_own() -> None:
    assert ds.predict("scheduling", [("scheduling", "stalled", "")]) == p("scheduling")
    assert ds.predict("scheduling", [("scheduling", "straggler", "2")]) == p("straggler", "2")
    assert ds.predict("none", []) == ds.NONE
    assert ds.predict(None, []) == ds.NONE
    assert ds.predict("compute", [("compute", "gpu_bound", "")]) == p("compute")
    # right class, wrong rank: wrong
    assert not p("hung_rank", "0").right(HUNG_1)
    assert not p("hung_rank", "").right(HUNG_1)
    assert p("hung_rank", "1").right(HUNG_1)
    assert p("compute").right(COMPUTE) and not p("scheduling").right(COMPUTE)


def test_the_final_prediction_is_the_most_frequent_of_the_last_scrapes_ties_to_the_latest(
) -> None:
    flapping = timeline(p("none"), p("none"), p("none"), p("storage"), p("compute"),
                        p("storage"), p("compute"), p("compute"))
    assert ds.final_prediction(flapping) == p("compute")  # 3 of the last 5
    tie = timeline(p("compute"), p("storage"), p("compute"), p("storage"))
    assert ds.final_prediction(tie, last=4) == p("storage")
    assert ds.final_prediction([]) == ds.NONE


# --- time to the right verdict and to the hung rank ---------------------------------------


def test_the_right_verdict_counts_from_the_first_of_three_consecutive_right_scrapes() -> None:
    samples = timeline(p("none"), p("compute"), p("storage"), p("compute"), p("compute"),
                       p("storage"), p("compute"), p("compute"), p("compute"), p("storage"),
                       start=10.0)
    # right at 11, 13-14, 16-18: the first run of three begins at 16
    assert ds.time_to_right(samples, COMPUTE, since=10.0) == 6.0
    assert ds.time_to_right(samples, COMPUTE, since=10.0, stable=2) == 3.0
    assert ds.time_to_right(samples, COMPUTE, since=None) is None
    assert ds.time_to_right(samples, ds.Truth("storage"), since=10.0) is None
    # two right scrapes at the very end are not yet a verdict
    assert ds.time_to_right(timeline(p("none"), p("compute"), p("compute")), COMPUTE, 0.0) is None


def test_a_hang_is_timed_from_its_fault_and_needs_the_right_rank() -> None:
    before = [p("compute")] * 5
    after = [p("compute"), p("hung_rank", "0"), p("hung_rank", "0"), p("hung_rank", "0"),
             p("hung_rank", "1"), p("hung_rank", "1"), p("hung_rank", "1")]
    samples = timeline(*before, *after)
    assert ds.time_to_right(samples, HUNG_1, since=5.0) == 4.0
    # the findings themselves: the first naming rank 1
    samples = [ds.Sample(s.at, s.prediction, ((("scheduling", "hung_rank", s.prediction.rank),)
                                              if s.prediction.cls == "hung_rank" else ()))
               for s in samples]
    assert ds.time_to_name(samples, "1", since=4.5) == 4.5
    assert ds.time_to_name(samples, "2", since=4.5) is None
    assert ds.time_to_name(samples, "1", since=None) is None


# --- precision, recall, F1 ----------------------------------------------------------------


def test_precision_recall_and_f1_per_class_with_a_wrong_rank_counted_against_both() -> None:
    pairs = [
        (COMPUTE, p("compute")), (COMPUTE, p("compute")), (COMPUTE, p("storage")),
        (ds.Truth("storage"), p("storage")), (ds.Truth("storage"), ds.NONE),
        (STRAGGLER_1, p("straggler", "1")), (STRAGGLER_1, p("straggler", "0")),
    ]
    scores = {s.cls: s for s in ds.class_scores(pairs)}
    compute, storage, straggler = scores["compute"], scores["storage"], scores["straggler"]
    assert (compute.support, compute.predicted, compute.correct) == (3, 2, 2)
    assert compute.precision == 1.0 and compute.recall == pytest.approx(2 / 3)
    assert compute.f1 == pytest.approx(0.8)
    assert (storage.precision, storage.recall, storage.f1) == (0.5, 0.5, 0.5)
    assert (straggler.predicted, straggler.correct, straggler.f1) == (2, 1, 0.5)
    # classes no case has or predicts are left out of the mean
    assert scores["communication"].precision is None and scores["communication"].recall is None
    assert ds.macro_f1(list(scores.values())) == pytest.approx((0.8 + 0.5 + 0.5) / 3)


def test_a_class_only_predicted_counts_in_the_macro_f1_with_zero() -> None:
    scores = ds.class_scores([(COMPUTE, p("compute")), (COMPUTE, p("communication"))])
    by_class = {s.cls: s for s in scores}
    assert by_class["communication"].precision == 0.0 and by_class["communication"].f1 == 0.0
    assert by_class["compute"].f1 == pytest.approx(2 / 3)  # P 1, R 0.5
    assert ds.macro_f1(scores) == pytest.approx(1 / 3)
    assert ds.macro_f1(ds.class_scores([])) is None


def test_percentiles_are_nearest_rank_and_a_never_counts_as_infinitely_late() -> None:
    assert ds.percentile([30.0, 10.0, 20.0, 40.0], 0.5) == 30.0
    assert ds.percentile([30.0, 10.0, None, 20.0], 0.5) == 30.0
    assert ds.percentile([30.0, 10.0, None, 20.0], 0.95) == math.inf
    assert ds.percentile([float(v) for v in range(1, 101)], 0.95) == 96.0
    assert ds.percentile([], 0.5) is None
    assert ds.number(math.inf, ".0f", " s") == "never" and ds.number(None) == "–"


# --- false findings on healthy jobs -------------------------------------------------------

STRAGGLER = ("scheduling", "straggler", "1")
DATA_WAIT = ("storage", "data_wait", "0")
RISK = ("storage", "checkpoint_local_disk", "")
GPU_BOUND = ("compute", "gpu_bound", "")


def test_each_onset_of_a_finding_is_one_episode_with_its_duration() -> None:
    samples = with_findings((), (STRAGGLER,), (STRAGGLER, DATA_WAIT), (), (STRAGGLER,),
                            (STRAGGLER,), start=100.0)
    found = ds.episodes(samples, since=100.0)
    assert found == [ds.Episode(STRAGGLER, 1.0, 2.0), ds.Episode(DATA_WAIT, 2.0, 1.0),
                     ds.Episode(STRAGGLER, 4.0, 2.0)]  # the last one lasts one interval
    assert ds.episodes(samples, since=104.0) == [ds.Episode(STRAGGLER, 0.0, 2.0)]
    assert ds.episodes(samples, since=None) == []
    # a finding whose named rank changes goes on: one onset, the rank of its onset
    worst_1 = ("storage", "data_wait", "1")
    moving = with_findings((DATA_WAIT,), (worst_1,), (DATA_WAIT, RISK), (), (worst_1,))
    assert ds.episodes(moving, since=0.0) == [
        ds.Episode(DATA_WAIT, 0.0, 3.0), ds.Episode(RISK, 2.0, 1.0),
        ds.Episode(worst_1, 4.0, 1.0)]


def record(case: ds.Case, samples: list[ds.Sample], first_report: float = 0.0,
           fault: float | None = None) -> ds.CaseRecord:
    return ds.CaseRecord(case, started=1.9e9, first_report=first_report, fault=fault,
                         samples=samples)


def test_false_findings_per_healthy_job_hour_and_the_false_pages() -> None:
    healthy = ds.Case("ddp")
    # one hour of scrapes, a straggler twice, a data wait once, a risk and a compute finding
    findings: list[tuple[ds.FindingKey, ...]] = [(GPU_BOUND, RISK)] * 3600
    findings[100:110] = [(GPU_BOUND, STRAGGLER)] * 10
    findings[200:205] = [(GPU_BOUND, STRAGGLER, DATA_WAIT)] * 5
    findings[900:960] = [(DATA_WAIT,)] * 60
    noisy = record(healthy, with_findings(*findings))
    assert [(e.finding, e.onset, e.seconds) for e in ds.false_findings(noisy)] == [
        (STRAGGLER, 100.0, 10.0), (STRAGGLER, 200.0, 5.0), (DATA_WAIT, 200.0, 5.0),
        (DATA_WAIT, 900.0, 60.0)]
    assert ds.observed_seconds(noisy) == 3600.0
    quiet = record(ds.Case("fsdp2_tp", confounders=("eval",), fault_rank=3),
                   with_findings(*[(GPU_BOUND,)] * 3600))
    # a straggler on a straggler case is no false finding, nor is its time healthy time
    straggling = record(ds.Case("ddp", "slow_rank"),
                        [ds.Sample(i, p("straggler", "1"), (STRAGGLER,)) for i in range(600)])
    result = ds.score([noisy, quiet, straggling])
    assert result.healthy_hours == pytest.approx(2.0)
    assert result.false_onsets == 4 and result.false_rate == pytest.approx(2.0)
    assert result.pages == [("ddp/healthy", STRAGGLER), ("ddp/healthy", STRAGGLER)]
    assert "NOT met" in ds.goal_lines(result)[-1]
    assert ds.score([quiet]).pages == [] and ds.score([quiet]).false_rate == 0.0


def test_the_score_of_a_suite_and_its_report() -> None:
    healthy = record(ds.Case("ddp"), timeline(p("none"), *[p("compute")] * 10))
    slow = record(ds.Case("fsdp2_tp", "slow_rank", fault_rank=3),
                  timeline(*[p("compute")] * 20, *[p("straggler", "3")] * 10), first_report=2.0)
    hung = record(ds.Case("fsdp2_tp", "hang_loader", fault_rank=3),
                  [ds.Sample(i, p("hung_rank", "3") if i >= 30 else p("compute"),
                             (("scheduling", "hung_rank", "3"),) if i >= 30 else ())
                   for i in range(40)], first_report=1.0, fault=20.0)
    killed = record(ds.Case("ddp", "kill"), timeline(*[p("compute")] * 40), fault=20.0)
    skipped = ds.CaseRecord(ds.Case("ddp", "communication"), "skipped", "no namespaces")
    records = [healthy, slow, hung, killed, skipped]
    result = ds.score(records)
    assert result.cases == 4
    assert {c.cls: (c.support, c.correct) for c in result.classes if c.support} == {
        "compute": (1, 1), "straggler": (1, 1), "hung_rank": (2, 1)}
    # compute 1 (P 0.5: the kill predicted compute), straggler 1, hung_rank 2/3
    assert result.macro_f1 == pytest.approx((2 / 3 + 1 + 2 / 3) / 3)
    # to the right verdict: healthy 1, slow 18, hung 10, killed never (nearest rank: the third)
    assert (result.right_p50, result.right_p95) == (18.0, math.inf)
    assert (result.hung_p50, result.hung_p95) == (math.inf, math.inf)
    lines = ds.case_table(records)
    assert len(lines) == 2 + len(records)
    assert "| ddp/communication | communication | skipped: no namespaces |" in lines[-1]
    assert "| fsdp2_tp/hang_loader | hung_rank rank 3 | hung_rank rank 3 | yes | 10 s | 10 s |" \
        in "\n".join(lines)
    assert ds.class_table(result)[2].startswith("| compute | 1 | 2 | 1 | 0.50 | 1.00 | 0.67 |")
    goals = ds.goal_lines(result)
    assert goals[1].endswith("NOT met (never)") and goals[3].endswith("met")


# --- the suite and the observations file --------------------------------------------------


def test_the_suite_crosses_kinds_with_their_faults_and_confounds_three_kinds() -> None:
    faults = ("healthy", "storage", "slow_rank", "kill", "unknown_fault")
    faults_of = {"ddp": faults, "fsdp2_tp": faults, "pipeline": faults,
                 "lightning": ("healthy", "storage")}
    sizes = {"ddp": 2, "fsdp2_tp": 4, "pipeline": 2, "lightning": 2}
    suite = ds.build_suite(tuple(faults_of), faults_of, ("eval", "warmup"), sizes)
    names = [case.name for case in suite]
    assert len(names) == len(set(names)) == 3 * 4 + 2 + 3 * 3
    assert "ddp/healthy+eval+warmup" in names and "lightning/healthy+eval" not in names
    by_name = {case.name: case for case in suite}
    assert by_name["fsdp2_tp/slow_rank"].truth == ds.Truth("straggler", "3")
    assert by_name["pipeline/kill"].truth == ds.Truth("hung_rank", "1")
    assert by_name["ddp/healthy+warmup"].job == "score-ddp-healthy-warmup"
    assert [c.name for c in ds.select(suite, ["fsdp2_tp/*"])][:2] == [
        "fsdp2_tp/healthy", "fsdp2_tp/storage"]
    assert len(ds.select(suite, ds.QUICK)) == 4  # all of the quick five but hang_loader


def test_observations_round_trip_through_json_and_rescore(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    healthy = record(ds.Case("ddp"), with_findings(*[(GPU_BOUND,)] * 5, (STRAGGLER,)),
                     first_report=0.5)
    hung = record(ds.Case("ddp", "sigstop"),
                  [ds.Sample(i, p("hung_rank", "1"), (("scheduling", "hung_rank", "1"),))
                   for i in range(5)], fault=1.0)
    starved = record(ds.Case("ddp", "storage"), timeline(*[p("compute")] * 5))
    records = [healthy, hung, starved,
               ds.CaseRecord(ds.Case("ddp", "communication"), "skipped", "x")]
    path = tmp_path / "score.json"
    ds.write_json(path, records, ds.score(records), {"quick": False})
    document = json.loads(path.read_text())
    assert document["score"]["time_to_right_p50_seconds"] == 0.5
    assert document["score"]["time_to_right_p95_seconds"] is None  # never: the starved one
    assert [case["time_to_right_seconds"] for case in document["cases"][:3]] == [0.5, 0.0, None]
    assert document["cases"][1]["time_to_name_seconds"] == 0.0
    assert "final" not in document["cases"][3] and document["cases"][3]["note"] == "x"
    assert document["cases"][0]["false_findings"] == [
        {"kind": "scheduling", "finding": "straggler", "rank": "1", "onset_seconds": 4.5,
         "seconds": 1.0}]
    assert [ds.record_from_json(case) for case in document["cases"]] == records
    assert ds.main(["--rescore", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| ddp/sigstop | hung_rank rank 1 | hung_rank rank 1 | yes | 0 s | 0 s | – |" in out
    assert "goal no false page on healthy runs: NOT met\n    ddp/healthy: straggler rank 1" in out


# --- the quick subset, for real ----------------------------------------------------------


@pytest.mark.integration
@pytest.mark.timeout(QUICK_TIMEOUT_SECONDS + 60)
def test_the_quick_subset_observes_every_case_and_reports(tmp_path: Path) -> None:
    path = tmp_path / "quick.json"
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "bench.diagnosis_score", "--quick", "--json", str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=QUICK_TIMEOUT_SECONDS, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    print(f"--quick took {time.monotonic() - began:.0f} s\n{result.stdout}")
    document = json.loads(path.read_text())
    cases = {case["case"]: case for case in document["cases"]}
    assert set(cases) == set(ds.QUICK), output
    for name, case in cases.items():
        assert case["status"] == "scored", f"{name}: {case['note']}\n{output}"
        assert case["samples"], f"{name}: no observation\n{output}"
        assert case["final"]["class"] in (*ds.CLASSES, "scheduling", "none")
        if case["truth"]["class"] == "hung_rank":
            assert case["fault_seconds"] is not None, name
    score = document["score"]
    assert score["cases"] == len(ds.QUICK)
    assert [c["class"] for c in score["classes"]] == list(ds.CLASSES)
    assert 0.0 <= score["macro_f1"] <= 1.0
    assert score["healthy_job_hours"] > 0 and score["false_findings_per_healthy_job_hour"] >= 0
    # the stdout report: the case table, the class table, the headline and four goal lines
    for row in (*ds.QUICK, *ds.CLASSES, "macro-F1", "goal macro-F1", "goal right verdict",
                "goal hung rank", "goal no false page"):
        assert row in result.stdout, row
    # what is asserted of the diagnosis itself: a healthy DDP job is compute, nothing paged
    assert cases["ddp/healthy"]["final"] == {"class": "compute", "rank": None}, output
    assert score["pages"] == [], output
