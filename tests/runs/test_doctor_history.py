"""``trainmon doctor``'s line about the previous comparable run, read from a real ledger."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.loopback import LoopbackHTTPServer, Reply, Request
from tests.diagnosis.diagnosis_support import StarvedNode
from tests.runs.runs_support import STARTED, record, summary, write_ledger
from trainmon import contract
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.doctor import DoctorOptions, run_doctor

HASH = "sha256:00112233aabbccdd"


@pytest.fixture
def daemon_url() -> Iterator[str]:
    """A daemon whose one job, ``vit``, is data-starved (its verdict: storage)."""
    node = StarvedNode()

    def answer(request: Request) -> Reply:
        return Reply(200, node.text(), "text/plain; version=0.0.4")

    with LoopbackHTTPServer(answer) as server:
        yield server.address


def doctor(url: str, ledger: Path | None, json_out: bool = False) -> str:
    out = io.StringIO()
    run_doctor(DoctorOptions(url=url, seconds=0.4, interval_seconds=0.2, json=json_out,
                             ledger=ledger), DiagnosisConfig(), list, out)
    return out.getvalue()


def history(tmp_path: Path, now: float, *, config_hash: str = HASH, ranks: int = 8) -> Path:
    return write_ledger(tmp_path / "ledger.sqlite3", [
        record("vit-1", job="vit", summary_=summary(samples_per_second_median=1000.0)),
        record("vit-2", job="vit", config_hash=config_hash, started=STARTED + 7200,
               ended=None, end_reason=None, ranks=ranks,
               summary_=summary(samples_per_second_median=now)),
    ])


def test_a_slower_run_names_the_previous_one_and_the_compare(
        tmp_path: Path, daemon_url: str) -> None:
    ledger = history(tmp_path, 780.0)
    text = doctor(daemon_url, ledger)
    assert ("Run history (this node's ledger)\n   vit: samples/s −22 % vs run vit-1 "
            "(2025-12-01 08:00 UTC); trainmon compare vit-1 vit-2") in text
    report = json.loads(doctor(daemon_url, ledger, json_out=True))
    assert report["previous_runs"][0]["change_ratio"] == -0.22


@pytest.mark.parametrize("speed", [1000.0 * (1 - contract.THROUGHPUT_REGRESSION_RATIO) + 1,
                                   1100.0])
def test_no_line_within_the_regression_ratio(tmp_path: Path, daemon_url: str,
                                             speed: float) -> None:
    assert "Run history" not in doctor(daemon_url, history(tmp_path, speed))


def test_fewer_ranks_on_this_node_are_not_a_slowdown(tmp_path: Path, daemon_url: str) -> None:
    """Half the ranks on this node, half the samples/s here: the same per rank."""
    assert "Run history" not in doctor(daemon_url, history(tmp_path, 500.0, ranks=4))
    (tmp_path / "slower").mkdir()
    text = doctor(daemon_url, history(tmp_path / "slower", 390.0, ranks=4))
    assert "vit: samples/s −22 % vs run vit-1" in text


def test_no_line_against_a_run_of_another_config(tmp_path: Path, daemon_url: str) -> None:
    assert "Run history" not in doctor(
        daemon_url, history(tmp_path, 500.0, config_hash="sha256:ffffffffffffffff"))


def test_an_absent_or_foreign_ledger_gives_no_line_and_no_error(
        tmp_path: Path, daemon_url: str) -> None:
    assert "Run history" not in doctor(daemon_url, tmp_path / "absent.sqlite3")
    foreign = tmp_path / "foreign.sqlite3"
    foreign.write_bytes(b"\x00garbage" * 64)
    report = json.loads(doctor(daemon_url, foreign, json_out=True))
    assert report["previous_runs"] == [] and report["jobs"][0]["job"] == "vit"
    assert foreign.read_bytes() == b"\x00garbage" * 64
