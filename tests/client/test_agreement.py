"""One run id per launched job without a launcher id (``trainmon.client.agreement``).

The settle rules on ``RunAgreement`` with a stand-in ``torch.distributed``
module over a real ``HashStore``; then real gloo jobs reporting to real
daemons: plain ``torchrun`` (no ``--rdzv-id``), ``torch.multiprocessing.spawn``,
and four hand-started ranks on two "nodes" (two daemons). Each rank's
reporter must settle on one run id, its rank and the world size, and each
daemon's ledger must hold one run of that id with its ranks (a run that ended
cleanly leaves ``/metrics``; the ledger keeps it).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from testkit import processes
from testkit.daemon import Daemon, free_port
from testkit.prometheus import wait_until
from tests.client.agreement_job import JOB
from trainmon.client import Reporter
from trainmon.client.agreement import (
    PENDING_LIMIT_SECONDS,
    STORE_KEY_PREFIX,
    RunAgreement,
    Settlement,
)
from trainmon.client.identity import named_identity, rank_identity
from trainmon.training.protocol import RunDescription, StepReport, decode_payload

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_SECONDS = 150
#: Variables of the test's own environment that would name the run or the ranks.
LAUNCHER_PREFIXES = ("TRAINMON_", "TORCHELASTIC_", "SLURM_", "OMPI_", "MASTER_")
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")


# -- the settle rules ------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_distributed(rank: int, world_size: int, store: object) -> SimpleNamespace:
    """What the agreement reads of an initialised ``torch.distributed``."""
    return SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True,
        get_rank=lambda: rank, get_world_size=lambda: world_size,
        distributed_c10d=SimpleNamespace(_get_default_store=lambda: store),
    )


def agreement(environ: Mapping[str, str], modules: Mapping[str, Any], *,
              run: str = "own-run", run_agreed: bool = False, clock: Clock | None = None,
              settled: list[Settlement] | None = None, **identity: int) -> RunAgreement:
    return RunAgreement(
        job="llm", run=run, run_agreed=run_agreed,
        identity=rank_identity(environ, **identity), named=named_identity(environ, **identity),
        environ=environ, on_settle=(settled if settled is not None else []).append,
        clock=clock or Clock(), modules=modules,
    )


def spawned_child() -> dict[str, Any]:
    return {"multiprocessing": SimpleNamespace(parent_process=lambda: object())}


@pytest.mark.parametrize(("modules", "pending"), [
    ({}, False),  # threads simulating ranks, a launcher of the program's own
    (spawned_child(), True),
    ({"torch.distributed": fake_distributed(1, 4, None)}, True),
])
def test_a_world_size_given_only_as_an_argument_is_no_sign(
        modules: dict[str, Any], pending: bool) -> None:
    waiting = agreement({}, modules, rank=1, world_size=4)
    assert waiting.pending is pending
    assert (waiting.settlement.rank, waiting.settlement.world_size) == (1, 4)


@pytest.mark.parametrize(
    ("environ", "modules", "run_agreed", "pending"),
    [
        ({}, {}, False, False),  # a single process
        ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h"}, {}, False, False),
        ({"WORLD_SIZE": "1"}, spawned_child(), False, False),  # a named world size is believed
        ({"MASTER_ADDR": "h"}, {}, False, True),
        ({"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "WORLD_SIZE": "2"}, {}, False, True),
        ({"OMPI_COMM_WORLD_SIZE": "4"}, {}, False, True),
        ({}, spawned_child(), False, True),
        ({}, {"torch.distributed": fake_distributed(0, 2, None)}, False, True),
        ({}, {"multiprocessing": SimpleNamespace(parent_process=lambda: None)}, False, False),
        # a launcher id, rank and world size named: nothing left to agree
        ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, {}, True, False),
        # a launcher id, no rank: mp.spawn under TRAINMON_RUN_ID learns its rank
        ({}, spawned_child(), True, True),
    ],
)
def test_what_settles_at_once(environ: dict[str, str], modules: dict[str, Any],
                              run_agreed: bool, pending: bool) -> None:
    settled: list[Settlement] = []
    waiting = agreement(environ, modules, run_agreed=run_agreed, settled=settled)
    assert waiting.pending is pending
    assert settled == []  # the values it started with are the settled ones
    if not pending:
        assert waiting.settlement.run == "own-run"


def test_a_single_process_reporter_sends_at_once() -> None:
    with tempfile.TemporaryDirectory(prefix="tm-", dir="/tmp") as folder, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sink:
        sink.bind(f"{folder}/steps.sock")
        reporter = Reporter("single", endpoint=f"unix://{folder}/steps.sock", environ={},
                            interval_seconds=60)
        assert reporter.flush()
        lines = list(decode_payload(sink.recv(65_536)))
        reporter.close()
    assert [type(line) for line in lines] == [RunDescription, StepReport]
    assert lines[0].run == reporter.run and (lines[0].rank, lines[0].world_size) == (0, 1)


def test_rank_zero_publishes_and_the_others_take_its_id() -> None:
    store = torch.distributed.HashStore()
    environ = {"TORCHELASTIC_RESTART_COUNT": "3"}
    first: list[Settlement] = []
    modules = spawned_child()  # torch.distributed is initialised after the reporter started
    other = agreement(environ, modules, run="rank1-own", settled=first)
    other.poll()
    assert other.pending
    modules["torch.distributed"] = fake_distributed(1, 2, store)
    other.poll()
    assert other.pending  # rank 0 has not published yet
    zero = agreement(environ, {"torch.distributed": fake_distributed(0, 2, store)},
                     run="rank0-own")
    zero.poll()
    assert not zero.pending
    assert zero.settlement == Settlement("rank0-own", 0, 0, 2)
    assert store.get("trainmon/run/llm/3") == b"rank0-own"
    other.poll()
    # no variable named the ranks: rank, local rank and world size come from the group
    assert first == [Settlement("rank0-own", 1, 1, 2)]
    assert not other.pending


def test_named_ranks_win_over_the_group_and_local_rank_follows_local_world_size() -> None:
    store = torch.distributed.HashStore()
    store.set("trainmon/run/llm/0", "agreed")
    settled: list[Settlement] = []
    environ = {"LOCAL_WORLD_SIZE": "2"}
    waiting = agreement(environ, {"torch.distributed": fake_distributed(3, 4, store)},
                        settled=settled)
    waiting.poll()
    assert settled == [Settlement("agreed", 3, 1, 4)]
    assert not waiting.pending
    explicit: list[Settlement] = []
    agreement({"WORLD_SIZE": "8", "RANK": "5"},
              {"torch.distributed": fake_distributed(3, 4, store)}, settled=explicit,
              local_rank=2).poll()
    assert explicit == [Settlement("agreed", 5, 2, 8)]


def test_pending_ends_at_the_bound_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    settled: list[Settlement] = []
    waiting = agreement({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, {},
                        clock=clock, settled=settled)
    clock.now += PENDING_LIMIT_SECONDS - 0.5
    waiting.poll()
    assert waiting.pending and settled == []
    clock.now += 1.0
    with caplog.at_level(logging.WARNING, "trainmon.client.agreement"):
        waiting.poll()
        waiting.poll()
        waiting.finish()
    assert settled == [Settlement("own-run", 1, 0, 2)]
    [warning] = caplog.records
    assert "torch.distributed was not initialised within 120 s" in warning.getMessage()


class BrokenStore:
    def set(self, key: str, value: str) -> None:
        raise RuntimeError("connection reset by peer")

    def check(self, keys: list[str]) -> bool:
        raise RuntimeError("connection reset by peer")


def published(value: str) -> object:
    store = torch.distributed.HashStore()
    store.set("trainmon/run/llm/0", value)
    return store


@pytest.mark.parametrize(
    ("distributed", "reason"),
    [
        (SimpleNamespace(**{**vars(fake_distributed(1, 2, None)),
                            "distributed_c10d": SimpleNamespace()}),
         "AttributeError"),
        (fake_distributed(1, 2, BrokenStore()), "connection reset by peer"),
        (fake_distributed(0, 2, BrokenStore()), "connection reset by peer"),
        (fake_distributed(1, 2, published("not a/run id")), "not a run id"),
        (SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                         get_rank=lambda: 1 / 0), "ZeroDivisionError"),
    ],
)
def test_failures_settle_on_the_own_id_with_one_warning(
    distributed: object, reason: str, caplog: pytest.LogCaptureFixture,
) -> None:
    settled: list[Settlement] = []
    with caplog.at_level(logging.WARNING, "trainmon.client.agreement"):
        waiting = agreement({}, {**spawned_child(), "torch.distributed": distributed},
                            settled=settled)
        waiting.poll()
    assert not waiting.pending
    [settlement] = settled
    assert settlement.run == "own-run"
    [warning] = caplog.records
    assert reason in warning.getMessage()


def test_a_pending_reporter_sends_nothing_until_close_settles_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert not torch.distributed.is_initialized()  # this test process is no rank of a job
    environ = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    with tempfile.TemporaryDirectory(prefix="tm-", dir="/tmp") as folder, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sink:
        sink.bind(f"{folder}/steps.sock")
        sink.setblocking(False)
        reporter = Reporter("pending", endpoint=f"unix://{folder}/steps.sock",
                            environ=environ, interval_seconds=0.05)
        reporter.step(samples=4)
        assert not reporter.flush()
        with pytest.raises(BlockingIOError):
            sink.recv(65_536)
        with caplog.at_level(logging.WARNING, "trainmon.client.agreement"):
            reporter.close()
        sink.setblocking(True)
        lines = list(decode_payload(sink.recv(65_536)))
    assert reporter.dropped_reports == 0
    [warning] = caplog.records
    assert "before the reporter closed" in warning.getMessage()
    report, description = lines  # the final totals, then the ended description
    assert isinstance(description, RunDescription) and isinstance(report, StepReport)
    assert (description.run, description.rank, description.world_size) == (reporter.run, 1, 2)
    assert (report.run, report.steps, report.samples) == (reporter.run, 1, 4)


def test_the_protocol_page_states_the_bound_and_the_key() -> None:
    text = (REPO / "docs" / "protocol.md").read_text()
    assert f"**{PENDING_LIMIT_SECONDS:g} s** (`PENDING_LIMIT_SECONDS`)" in text
    assert f"`{STORE_KEY_PREFIX}/<job>/<TORCHELASTIC_RESTART_COUNT, else 0>`" in text


# -- real jobs, real daemons -------------------------------------------------------------


def clean_environment(**variables: str) -> dict[str, str]:
    """This process's environment without anything that names a run or a rank."""
    environ = {name: value for name, value in os.environ.items()
               if not name.startswith(LAUNCHER_PREFIXES) and name not in LAUNCHER_VARIABLES}
    return {**environ, "OMP_NUM_THREADS": "1", **variables}


def run_all(commands: list[tuple[list[str], dict[str, str]]]) -> None:
    """Run every (command, environment) at once; all must succeed and agree."""
    for output in processes.run_all(commands, JOB_TIMEOUT_SECONDS):
        assert "did not agree" not in output, output[-4000:]


def settled_ranks(results: Path, world_size: int) -> str:
    """The one run id every rank settled on, after checking their identities."""
    settled = {rank: json.loads((results / f"{rank}.json").read_text())
               for rank in range(world_size)}
    runs = {result["run"] for result in settled.values()}
    assert len(runs) == 1, settled
    for rank, result in settled.items():
        assert (result["rank"], result["world_size"]) == (rank, world_size), settled
        assert result["delivered_while_training"] and result["dropped"] == 0, settled
    return runs.pop()


def recorded_run(daemon: Daemon, ranks: int, world_size: int) -> str:
    """The job's one run in the daemon's ledger, once it finished with ``ranks`` ranks."""
    records: list[dict[str, Any]] = []

    def finished() -> bool:
        status, body = daemon.get(f"/api/v1/runs?job={JOB}")
        assert status == 200, body
        records[:] = json.loads(body)
        return any(record["end_reason"] == "finished" for record in records)

    wait_until(finished, 30, "the run finished in the ledger", interval=0.2)
    [record] = records
    assert (record["ranks"], record["world_size"]) == (ranks, world_size), record
    return str(record["run"])


@pytest.fixture
def daemons(start_daemon: Callable[..., Daemon]) -> Iterator[Callable[[], tuple[Daemon, str]]]:
    """``start()``: a daemon (ledger flushed every 0.2 s) and its client endpoint."""
    with tempfile.TemporaryDirectory(prefix="tm-", dir="/tmp") as folder:
        count = [0]

        def start() -> tuple[Daemon, str]:
            count[0] += 1
            path = f"{folder}/steps-{count[0]}.sock"
            daemon = start_daemon(config={"collectors": {
                "training": {"socket": path}, "ledger": {"flush_seconds": 0.2}}})
            return daemon, f"unix://{path}"

        yield start


@pytest.mark.integration
def test_plain_torchrun_ranks_share_one_run(daemons: Callable[[], tuple[Daemon, str]],
                                            tmp_path: Path) -> None:
    daemon, endpoint = daemons()
    run_all([([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(free_port()), "-m", "tests.client.agreement_job",
               "env", str(tmp_path)],
              clean_environment(TRAINMON_ENDPOINT=endpoint))])
    run = settled_ranks(tmp_path, 2)
    assert recorded_run(daemon, ranks=2, world_size=2) == run


@pytest.mark.integration
def test_mp_spawn_workers_share_one_run(daemons: Callable[[], tuple[Daemon, str]],
                                        tmp_path: Path) -> None:
    daemon, endpoint = daemons()
    run_all([([sys.executable, "-m", "tests.client.agreement_job", "spawn", str(tmp_path),
               "--port", str(free_port())],
              clean_environment(TRAINMON_ENDPOINT=endpoint))])
    run = settled_ranks(tmp_path, 2)
    assert recorded_run(daemon, ranks=2, world_size=2) == run


@pytest.mark.integration
def test_two_nodes_share_one_run(daemons: Callable[[], tuple[Daemon, str]],
                                 tmp_path: Path) -> None:
    nodes = [daemons(), daemons()]
    port = str(free_port())
    run_all([([sys.executable, "-m", "tests.client.agreement_job", "env", str(tmp_path)],
              clean_environment(RANK=str(rank), LOCAL_RANK=str(rank % 2), WORLD_SIZE="4",
                                MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                                TRAINMON_ENDPOINT=nodes[rank // 2][1]))
             for rank in range(4)])
    run = settled_ranks(tmp_path, 4)
    assert [recorded_run(daemon, ranks=2, world_size=4) for daemon, _ in nodes] == [run, run]
