"""``trainmon doctor``'s run history names the fail-slow changes the ledger recorded for
the job's run and the run it is measured against, in English and Chinese."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.loopback import LoopbackHTTPServer, Reply, Request
from tests.diagnosis.diagnosis_support import StarvedNode
from tests.runs.runs_support import STARTED, record, summary, write_ledger
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.doctor import DoctorOptions, run_doctor
from trainmon.ledger import RunRecord

HASH = "sha256:00112233aabbccdd"
#: doctor's clock: two hours after the previous run ended.
NOW = STARTED + 3600 + 7200


@pytest.fixture
def daemon_url() -> Iterator[str]:
    """A daemon whose one job, ``vit``, is data-starved (its verdict: storage)."""
    node = StarvedNode()

    def answer(request: Request) -> Reply:
        return Reply(200, node.text(), "text/plain; version=0.0.4")

    with LoopbackHTTPServer(answer) as server:
        yield server.address


@pytest.fixture
def idle_url() -> Iterator[str]:
    """A daemon that sees no GPU and no job (its jobs ended)."""
    def answer(request: Request) -> Reply:
        return Reply.text("# TYPE trainmon_build_info gauge\n"
                          'trainmon_build_info{version="1",mode="real"} 1\n',
                          "text/plain; version=0.0.4")

    with LoopbackHTTPServer(answer) as server:
        yield server.address


def doctor(url: str, ledger: Path, *, json_out: bool = False, lang: str = "en"
           ) -> tuple[int, str]:
    out = io.StringIO()
    code = run_doctor(DoctorOptions(url=url, seconds=0.4, interval_seconds=0.2, json=json_out,
                                    ledger=ledger, lang=lang),
                      DiagnosisConfig(), list, out, wall_clock=lambda: NOW)
    return code, out.getvalue()


def text_of(url: str, ledger: Path, **kwargs: Any) -> str:
    return doctor(url, ledger, **kwargs)[1]


def current(speed: float) -> RunRecord:
    """``vit-2``, the run that goes on."""
    return record("vit-2", job="vit", config_hash=HASH, started=NOW - 600, ended=None,
                  end_reason=None, summary_=summary(samples_per_second_median=speed))


def earlier(run: str, speed: float, *, started: float = STARTED) -> RunRecord:
    return record(run, job="vit", config_hash=HASH, started=started, ended=started + 3600,
                  end_reason="finished", summary_=summary(samples_per_second_median=speed))


def history(tmp_path: Path, records: list[RunRecord]) -> Path:
    return write_ledger(tmp_path / "ledger.sqlite3", records)


def english_sentences(text: str) -> list[str]:
    """Runs of four or more English words outside the commands a line names."""
    without_commands = re.sub(r"trainmon [a-z]+ [^；;\n]*", "", text)
    return re.findall(r"[A-Za-z]{2,}(?:[ ,]+[A-Za-z]{2,}){3,}", without_commands)


#: 10:45:00 UTC, a quarter of an hour before doctor's clock.
AT = NOW - 900
THROTTLED = {"rank": "1", "part": "compute", "kind": "scheduling", "cause": "cpu_throttled",
             "ratio": 0.35, "start": AT, "seconds": 300.0}
SLOWER_DATA = {"rank": "", "part": "data_wait", "kind": "storage", "cause": "data_loading",
               "ratio": 0.12, "start": AT - 600, "seconds": 60.0}


def with_fail_slow(run: RunRecord, *changes: dict[str, object]) -> RunRecord:
    return RunRecord(**{**run.__dict__, "summary": {**run.summary, "fail_slow": list(changes)}})


def lines_with(text: str, word: str) -> list[str]:
    return [line for line in text.splitlines() if word in line]


def test_the_running_runs_fail_slow_is_under_its_history_line(
        tmp_path: Path, daemon_url: str) -> None:
    ledger = history(tmp_path, [earlier("vit-1", 1000.0),
                                with_fail_slow(current(780.0), SLOWER_DATA, THROTTLED)])
    text = text_of(daemon_url, ledger)
    lines = text.splitlines()
    index = lines.index("Run history (this node's ledger)")
    assert lines[index + 2] == (
        "      fail-slow in run vit-2: rank 1 became 35% slower at 10:45:00 UTC for 5m00s: "
        "its compute per step grew; its cgroup's CPU quota throttles it "
        "(and 1 more: trainmon compare)")
    assert len(lines_with(text, "fail-slow in run")) == 1  # the baseline had none
    [entry] = json.loads(doctor(daemon_url, ledger, json_out=True)[1])["previous_runs"]
    assert entry["fail_slow"] == [SLOWER_DATA, THROTTLED]
    assert entry["baseline"]["fail_slow"] == []


def test_the_fail_slow_in_chinese(tmp_path: Path, daemon_url: str) -> None:
    ledger = history(tmp_path, [earlier("vit-1", 1000.0),
                                with_fail_slow(current(780.0), THROTTLED)])
    [line] = lines_with(text_of(daemon_url, ledger, lang="zh"), "fail-slow")
    assert line == ("      运行 vit-2 中出现 fail-slow：rank 1 从 10:45:00 UTC 起慢了 35%，"
                    "持续 5m00s：每步计算时间变长了；它所在 cgroup 的 CPU 配额在限流")
    assert english_sentences(line) == []


def test_after_the_job_both_runs_fail_slow_in_either_language(
        tmp_path: Path, idle_url: str) -> None:
    ended = RunRecord(**{**earlier("vit-2", 780.0, started=NOW - 3600 - 720).__dict__,
                         "summary": summary(samples_per_second_median=780.0,
                                            fail_slow=[THROTTLED])})
    baseline = with_fail_slow(earlier("vit-1", 1000.0), SLOWER_DATA)
    ledger = history(tmp_path, [baseline, ended])
    code, text = doctor(idle_url, ledger)
    assert code == 0
    assert lines_with(text, "fail-slow") == [
        "      fail-slow in run vit-2: rank 1 became 35% slower at 10:45:00 UTC for 5m00s: "
        "its compute per step grew; its cgroup's CPU quota throttles it",
        "      fail-slow in run vit-1: the job became 12% slower at 10:35:00 UTC for 1m00s: "
        "its data wait per step grew; its data loading got slower"]
    code, text = doctor(idle_url, ledger, lang="zh")
    assert code == 0 and len(lines_with(text, "fail-slow")) == 2
    assert english_sentences(text) == []
    [entry] = json.loads(doctor(idle_url, ledger, json_out=True)[1])["recent_runs"]
    assert (entry["fail_slow"], entry["baseline"]["fail_slow"]) == ([THROTTLED], [SLOWER_DATA])


def test_a_run_without_fail_slow_adds_no_line(tmp_path: Path, daemon_url: str) -> None:
    ledger = history(tmp_path, [earlier("vit-1", 1000.0), current(780.0)])
    assert "fail-slow" not in text_of(daemon_url, ledger)
