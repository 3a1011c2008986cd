"""``trainmon doctor``'s run history, read from a real ledger: which earlier run a job's
run is measured against and why, and, once the jobs ended, how each one's last run went."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from testkit.loopback import LoopbackHTTPServer, Reply, Request
from tests.runs.runs_support import (
    CONFIG_HASH,
    DOCTOR_NOW,
    STARTED,
    current,
    doctor,
    earlier,
    english_sentences,
    history,
    record,
    summary,
    text_of,
)
from trainmon import contract
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.doctor import DoctorOptions, run_doctor
from trainmon.ledger import RunRecord


def history_line(text: str) -> str:
    lines = text.splitlines()
    index = lines.index("Run history (this node's ledger)")
    return lines[index + 1]


def test_a_slower_run_names_its_baseline_why_and_the_compare(
        tmp_path: Path, daemon_url: str) -> None:
    ledger = history(tmp_path, [earlier("vit-1", 1000.0), current(780.0)])
    assert history_line(text_of(daemon_url, ledger)) == (
        "   vit: run vit-2 at 780 samples/s, −22 % compared with run vit-1 (finished 2 h ago, "
        "same world size 8 on 1 node): slower by more than 20 %; "
        f"trainmon compare vit-1 vit-2 --ledger {ledger}")
    code, document = doctor(daemon_url, ledger, json_out=True)
    [entry] = json.loads(document)["previous_runs"]
    assert code == 1  # the storage verdict decides; the history adds no exit code
    assert (entry["run"], entry["previous_run"], entry["change_ratio"], entry["slower"]) == (
        "vit-2", "vit-1", -0.22, True)
    assert entry["baseline"]["finished"] is True and entry["fastest"] is None
    assert entry["commands"] == [f"trainmon runs --job vit --ledger {ledger}",
                                 f"trainmon compare vit-1 vit-2 --ledger {ledger}"]


@pytest.mark.parametrize("speed", [1000.0 * (1 - contract.THROUGHPUT_REGRESSION_RATIO) + 1,
                                   1100.0])
def test_within_the_regression_share_the_line_names_the_baseline_without_alarm(
        tmp_path: Path, daemon_url: str, speed: float) -> None:
    line = history_line(text_of(daemon_url, history(tmp_path, [earlier("vit-1", 1000.0),
                                                               current(speed)])))
    assert "compared with run vit-1 (finished 2 h ago" in line and "slower" not in line


def test_a_finished_run_is_preferred_to_a_newer_crash_or_a_crash_without_a_rate(
        tmp_path: Path, daemon_url: str) -> None:
    """The demo's story: the run just before crashed (early: no rate, or a rate), the run
    before that finished; the finished one is the baseline."""
    for crashed_speed in (None, 2000.0):
        folder = tmp_path / str(crashed_speed)
        folder.mkdir()
        ledger = history(folder, [
            earlier("vit-1", 1000.0),
            earlier("vit-crash", crashed_speed, started=STARTED + 1800, end_reason="crashed"),
            current(700.0)])
        line = history_line(text_of(daemon_url, ledger))
        assert "−30 % compared with run vit-1 (finished" in line, line


def test_without_a_finished_run_a_crash_with_a_rate_serves_and_says_so(
        tmp_path: Path, daemon_url: str) -> None:
    ledger = history(tmp_path, [
        earlier("vit-empty", None, end_reason="crashed"),
        earlier("vit-1", 1000.0, started=STARTED + 60, end_reason="preempted"),
        current(700.0)])
    assert history_line(text_of(daemon_url, ledger)).startswith(
        "   vit: run vit-2 at 700 samples/s, −30 % compared with run vit-1 (preempted 1 h "
        "ago, same world size 8 on 1 node); no comparable run finished, so its rate over the "
        "whole run: slower by more than 20 %")


@pytest.mark.parametrize(("other", "why"), [
    ({"world_size": 16, "ranks": 8}, "another world size"),
    ({"world_size": 8, "ranks": 4}, "another node count (4 ranks on this node)"),
    ({"config_hash": "sha256:ffffffffffffffff"}, "another config"),
    ({"job": "other"}, "another job"),
])
def test_runs_of_another_shape_are_not_comparable(
        tmp_path: Path, daemon_url: str, other: dict[str, Any], why: str) -> None:
    settings: dict[str, Any] = {"job": "vit", "config_hash": CONFIG_HASH, "world_size": 8,
                                "ranks": 8, **other}
    different = record("vit-0", started=STARTED - 7200, ended=STARTED - 3600,
                       summary_=summary(samples_per_second_median=5000.0), **settings)
    ledger = history(tmp_path, [different, earlier("vit-1", 1000.0), current(900.0)])
    line = history_line(text_of(daemon_url, ledger))
    assert "compared with run vit-1" in line and "vit-0" not in line, why


def test_fewer_ranks_on_this_node_are_a_different_shape_not_a_slowdown(
        tmp_path: Path, daemon_url: str) -> None:
    ledger = history(tmp_path, [earlier("vit-1", 1000.0), current(500.0, ranks=4)])
    assert history_line(text_of(daemon_url, ledger)) == (
        "   vit: run vit-2 at 500 samples/s, no earlier comparable run (same config, world "
        "size 8 on 2 nodes, ended, with a rate)")


def test_the_fastest_run_of_the_week_shows_a_slowdown_that_came_run_by_run(
        tmp_path: Path, daemon_url: str) -> None:
    """Each run a little slower than the one before: the fastest comparable run of the
    alert's look-back shows the whole slowdown."""
    ledger = history(tmp_path, [
        earlier("vit-0", 1000.0, started=STARTED - 7200),
        earlier("vit-1", 850.0),
        earlier("vit-old", 5000.0, started=DOCTOR_NOW - contract.THROUGHPUT_BEST_LOOKBACK_SECONDS
                - 7200),
        current(750.0)])
    lines = text_of(daemon_url, ledger).splitlines()
    index = lines.index("Run history (this node's ledger)")
    assert "−12 % compared with run vit-1" in lines[index + 1]
    assert lines[index + 2] == (
        "      −25 % compared with the fastest comparable run of the last 7 days, vit-0 "
        f"(finished 4 h ago); trainmon compare vit-0 vit-2 --ledger {ledger}")


def test_the_history_in_chinese(tmp_path: Path, daemon_url: str) -> None:
    ledger = history(tmp_path, [earlier("vit-1", 1000.0), current(780.0)])
    text = text_of(daemon_url, ledger, lang="zh")
    assert ("运行历史（本节点的运行台账）\n   vit：运行 vit-2，780 samples/s，与运行 vit-1 相比 "
            "−22 %（2 小时前正常结束，同样的 world size 8，1 个节点）：慢了超过 20 %；"
            f"trainmon compare vit-1 vit-2 --ledger {ledger}") in text


def test_an_absent_or_foreign_ledger_gives_no_history_and_no_error(
        tmp_path: Path, daemon_url: str) -> None:
    assert "Run history" not in text_of(daemon_url, tmp_path / "absent.sqlite3")
    foreign = tmp_path / "foreign.sqlite3"
    foreign.write_bytes(b"\x00garbage" * 64)
    report = json.loads(doctor(daemon_url, foreign, json_out=True)[1])
    assert report["previous_runs"] == [] and report["jobs"][0]["job"] == "vit"
    assert foreign.read_bytes() == b"\x00garbage" * 64


def test_the_running_runs_own_checkpoints_and_goodput(tmp_path: Path, daemon_url: str) -> None:
    """The figures of the run that goes on, from its record, not the job's counters
    (which span its earlier runs) or a window that reaches into the run before."""
    run = current(990.0)
    run = RunRecord(**{**run.__dict__, "summary": {
        **run.summary, "checkpoints": 3, "goodput_ratio": 0.8,
        "gpu_seconds": {"productive": 80.0, "data_wait": 15.0, "startup": 5.0}}})
    ledger = history(tmp_path, [earlier("vit-1", 1000.0), run])
    report = json.loads(doctor(daemon_url, ledger, json_out=True)[1])
    assert report["jobs"][0]["run"]["run"] == "vit-2"
    assert report["jobs"][0]["run"]["checkpoint_saves"] == 3
    assert report["jobs"][0]["run"]["goodput_ratio"] == 0.8


def test_after_the_job_the_last_runs_and_what_to_run_exit_0(
        tmp_path: Path, idle_url: str) -> None:
    ended = RunRecord(**{**earlier("vit-2", 780.0, started=DOCTOR_NOW - 3600 - 720).__dict__,
                         "summary": summary(samples_per_second_median=780.0,
                                            goodput_ratio=0.62,
                                            verdicts={"storage": 3000.0, "compute": 600.0})})
    old = record("bert-1", job="bert", started=DOCTOR_NOW - 3 * 86400, ended=DOCTOR_NOW - 2 * 86400)
    ledger = history(tmp_path, [earlier("vit-1", 1000.0), ended, old])
    code, text = doctor(idle_url, ledger)
    assert code == 0, text
    assert "Could not measure" not in text and "bert" not in text  # ended 2 days ago
    lines = text.splitlines()
    index = lines.index("The last run of each job that ended within 24 h (this node's ledger)")
    assert lines[index + 1:index + 4] == [
        "   vit: run vit-2 finished 12 min ago after 1h00m: 780 samples/s, verdict storage, "
        "goodput 62 %",
        "      −22 % compared with run vit-1 (finished 2 h ago, same world size 8 on 1 node): "
        "slower by more than 20 %",
        f"      see: trainmon runs --job vit --ledger {ledger}; "
        f"trainmon compare vit-1 vit-2 --ledger {ledger}"]
    assert lines[-1] == "No training job runs on this node now; its jobs' last runs are above."
    code, document = doctor(idle_url, ledger, json_out=True)
    report = json.loads(document)
    assert (code, report["status"], report["exit_code"]) == (0, "ended", 0)
    [entry] = report["recent_runs"]
    assert (entry["run"], entry["end_reason"], entry["verdict"], entry["goodput_ratio"],
            entry["previous_run"]) == ("vit-2", "finished", "storage", 0.62, "vit-1")


def test_after_the_job_in_chinese_no_english_sentence_is_left(
        tmp_path: Path, idle_url: str) -> None:
    ledger = history(tmp_path, [earlier("vit-1", 1000.0),
                                earlier("vit-2", 780.0, started=DOCTOR_NOW - 3600 - 720)])
    code, text = doctor(idle_url, ledger, lang="zh")
    assert code == 0
    assert "vit：运行 vit-2 于 12 分钟前正常结束，运行了 1h00m：780 samples/s，结论 算（计算）" in text
    assert text.splitlines()[-1] == "本节点现在没有训练任务在运行；各任务最近一次运行见上。"
    assert english_sentences(text) == []


def test_with_no_recent_run_nothing_could_be_measured_in_either_language(
        tmp_path: Path, idle_url: str) -> None:
    ledger = history(tmp_path, [record("bert-1", job="bert", started=DOCTOR_NOW - 3 * 86400,
                                       ended=DOCTOR_NOW - 2 * 86400)])
    code, text = doctor(idle_url, ledger)
    assert code == 2 and "Could not measure: no GPU and no training job seen" in text
    code, text = doctor(idle_url, ledger, lang="zh")
    assert code == 2 and "无法测量：没有发现 GPU，也没有发现训练任务" in text
    assert english_sentences(text) == []


@pytest.mark.parametrize("mode", ["demo", "real"])
def test_the_demo_daemon_is_read_with_the_demos_own_ledger(tmp_path: Path, mode: str) -> None:
    """``trainmon serve --demo`` keeps its runs apart: doctor reads them there when the
    daemon it read says it is the demo, and only then."""
    demo_ledger = history(tmp_path, [earlier("vit-1", 1000.0),
                                     earlier("vit-2", 780.0, started=DOCTOR_NOW - 3600 - 720)])

    def answer(request: Request) -> Reply:
        return Reply.text("# TYPE trainmon_build_info gauge\n"
                          f'trainmon_build_info{{version="1",mode="{mode}"}} 1\n',
                          "text/plain; version=0.0.4")

    with LoopbackHTTPServer(answer) as server:
        out, err = io.StringIO(), io.StringIO()
        code = run_doctor(DoctorOptions(url=server.address, seconds=0.2, interval_seconds=0.1,
                                        ledger=tmp_path / "absent.sqlite3",
                                        demo_ledger=demo_ledger),
                          DiagnosisConfig(), list, out, err=err, wall_clock=lambda: DOCTOR_NOW)
    if mode == "demo":
        assert code == 0 and "vit: run vit-2 finished 12 min ago" in out.getvalue()
        assert f"the daemon is the demo: reading its ledger {demo_ledger}" in err.getvalue()
    else:
        assert code == 2 and "vit" not in out.getvalue()
