"""Hand-built ledger records for the ``trainmon runs`` / ``compare`` tests, and the
``trainmon doctor`` run history over them (job ``vit``)."""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from testkit.loopback import LoopbackHTTPServer, Reply, Request
from testkit.prometheus import Prometheus
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.doctor import DoctorOptions, run_doctor
from trainmon.ledger import Ledger, RecordUpdate, RunRecord

STARTED = 1_764_576_000.0  # 2025-12-01 08:00 UTC
CONFIG_HASH = "sha256:00112233aabbccdd"
#: doctor's clock in the run-history tests: two hours after ``earlier``'s run ended.
DOCTOR_NOW = STARTED + 3600 + 7200


def description(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "config": {"lr": 0.1, "batch_size": 256, "model.layers": 24},
        "environment": {"NCCL_IB_DISABLE": "0", "OMP_NUM_THREADS": "8"},
        "data_paths": [{"path": "/data/imagenet", "mountpoint": "/data", "fstype": "ext4",
                        "storage": "local_disk"}],
        "versions": {"python": "3.11.9", "torch": "2.4.0", "trainmon": "0.16.0"},
        "git": {"commit": "a" * 40, "dirty": False},
        "host": "gpu-node-1",
        "framework": {},
    }
    base.update(overrides)
    return base


def summary(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "samples_per_second_median": 1210.0,
        "samples_per_second_p10": 1150.0,
        "step_seconds_p50": 0.21,
        "step_seconds_p95": 0.25,
        "data_wait_ratio": 0.05,
        "comm_exposed_ratio": 0.10,
        "phase_ratios": {"comm": 0.10, "checkpoint": 0.01},
        "verdicts": {"compute": 3500.0, "none": 100.0},
        "steps": 17000,
        "samples": 4_352_000,
        "duration_seconds": 3600.0,
        "gpu_hours": 8.0,
        "cost": None,
    }
    base.update(overrides)
    return base


def record(run: str, *, job: str = "llama", node: str = "gpu-node-1",
           config_hash: str = CONFIG_HASH, started: float = STARTED,
           ended: float | None = STARTED + 3600, end_reason: str | None = "finished",
           world_size: int | None = 8, ranks: int = 8,
           description_: Mapping[str, Any] | None = None,
           summary_: Mapping[str, Any] | None = None) -> RunRecord:
    return RunRecord(
        job=job, run=run, node=node, config_hash=config_hash, started=started, ended=ended,
        end_reason=end_reason, updated=ended or started, world_size=world_size, ranks=ranks,
        description=dict(description() if description_ is None else description_),
        summary=dict(summary() if summary_ is None else summary_),
    )


def write_ledger(path: Path, records: Sequence[RunRecord]) -> Path:
    """A real ledger file holding ``records`` (as the daemon's recorder writes them)."""
    ledger = Ledger.open(path, readonly=False)
    try:
        ledger.write([RecordUpdate(item, {}) for item in records])
    finally:
        ledger.close()
    return path


def history(tmp_path: Path, records: Sequence[RunRecord]) -> Path:
    """``records`` in a real ledger file under ``tmp_path``."""
    return write_ledger(tmp_path / "ledger.sqlite3", records)


def current(speed: float, **kwargs: Any) -> RunRecord:
    """``vit-2``, the run that goes on: started after every other (``record``'s arguments
    in ``kwargs`` replace those of the job)."""
    settings: dict[str, Any] = {"job": "vit", "config_hash": CONFIG_HASH,
                                "started": DOCTOR_NOW - 600, "ended": None, "end_reason": None}
    settings.update(kwargs)
    return record("vit-2", summary_=summary(samples_per_second_median=speed), **settings)


def earlier(run: str, speed: float | None, *, started: float = STARTED,
            end_reason: str = "finished", **kwargs: Any) -> RunRecord:
    """An hour-long run of ``vit`` that ended (at ``speed`` samples/s median)."""
    return record(run, job="vit", config_hash=CONFIG_HASH, started=started,
                  ended=started + 3600, end_reason=end_reason,
                  summary_=summary(samples_per_second_median=speed), **kwargs)


def doctor(url: str, ledger: Path | None, *, json_out: bool = False, lang: str = "en",
           now: float = DOCTOR_NOW) -> tuple[int, str]:
    """``trainmon doctor`` on the daemon at ``url`` with ``ledger``: exit code and output."""
    out = io.StringIO()
    code = run_doctor(DoctorOptions(url=url, seconds=0.4, interval_seconds=0.2, json=json_out,
                                    ledger=ledger, lang=lang),
                      DiagnosisConfig(), list, out, wall_clock=lambda: now)
    return code, out.getvalue()


def text_of(url: str, ledger: Path | None, **kwargs: Any) -> str:
    """``doctor``'s output alone."""
    return doctor(url, ledger, **kwargs)[1]


def english_sentences(text: str) -> list[str]:
    """Runs of four or more English words outside the commands a line names."""
    without_commands = re.sub(r"trainmon [a-z]+ [^；;\n]*", "", text)
    return re.findall(r"[A-Za-z]{2,}(?:[ ,]+[A-Za-z]{2,}){3,}", without_commands)


class PhasedNode:
    """A fake node daemon's /metrics on loopback that a test moves through phases: in
    phase ``n`` (1 at first) it answers ``text_of_phase(n)``. A context manager."""

    def __init__(self, text_of_phase: Callable[[int], str]) -> None:
        self._text_of_phase = text_of_phase
        self._phase = 1
        self._lock = threading.Lock()
        self._server = LoopbackHTTPServer(self._answer)

    @property
    def address(self) -> str:
        """``host:port`` to scrape."""
        return self._server.address

    def move_to(self, phase: int) -> None:
        """Answer ``text_of_phase(phase)`` from the next scrape on."""
        with self._lock:
            self._phase = phase

    def _answer(self, request: Request) -> Reply:
        with self._lock:
            phase = self._phase
        return Reply.text(self._text_of_phase(phase), "text/plain; version=0.0.4")

    def __enter__(self) -> PhasedNode:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()


def scrape_every_second(prometheus: Prometheus, address: str) -> None:
    """Start ``prometheus`` scraping the daemon at ``address`` every second as job
    ``trainmon``, keeping the daemon's own ``job`` labels (as deploy/ configures it)."""
    prometheus.start({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "trainmon", "honor_labels": True,
                            "static_configs": [{"targets": [address]}]}],
    })
