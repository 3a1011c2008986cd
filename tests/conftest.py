"""Fixtures shared by every test folder: running a real ``trainmon serve``, a real
Prometheus, simulated training ranks, and the fake ``libnvidia-ml.so.1``
(``testkit/fakenvml``) compiled once per session; and the fixtures of more than one
folder: an in-process ``TrainingCollector`` on a fake clock (``clock``,
``make_collector``, ``socket_path``: tests/training, tests/client, tests/demo; helpers in
``tests.training.training_support``) and miniature ``/proc`` and ``/sys`` trees
(``proc``, ``sys_tree``: tests/attribution, tests/diagnosis; helpers in
``tests.diagnosis.diagnosis_support``). A folder's own fixture of the same name
(``clock`` and ``make_collector`` in tests/gpu and tests/tencent) wins there."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
import yaml

from testkit.daemon import Daemon, free_port, trainmon_command, wait_ready
from testkit.fakenvml import build as fake_nvml_build
from testkit.prometheus import Prometheus
from testkit.workloads import Workload
from tests.diagnosis.diagnosis_support import ProcTree, SysTree
from tests.training.training_support import FakeClock
from trainmon.collectors.training import TrainingCollector, TrainingConfig

__all__ = ["Daemon", "free_port", "trainmon_command", "wait_ready"]


#: Files that keep both cores busy for minutes (simulated fleets with both engines;
#: multi-process torch jobs) and whose assertions are about time (a change named
#: within 60 s, a rate within 5 %, every scrape on time). Under ``make test`` the
#: files of one lane run one after another on one worker, so two of them never load
#: the machine at once; the lanes start first, the other files fill the other workers.
#: (Files whose timing needs the machine to itself are marked ``quiet`` instead: the
#: Makefile runs them after the rest.)
CPU_LANES: dict[str, tuple[str, ...]] = {
    "engines": (
        "tests/scale/test_fleet.py",
        "tests/scale/test_suspects.py",
        "tests/client/test_instrument.py",
        "tests/ledger/test_goodput_ddp.py",
    ),
    "torch-jobs": (
        "tests/ledger/test_rate_acceptance.py",
        "tests/diagnosis/test_diagnosis_score.py",
        "tests/ledger/test_parallel_rate_acceptance.py",
    ),
    "parallel-jobs": (
        "tests/diagnosis/test_hung_rank.py",
        "tests/diagnosis/test_parallel_jobs.py",
        "tests/diagnosis/test_parallel_scenarios.py",
        "tests/diagnosis/test_ddp_scenarios.py",
    ),
}
_LANE_OF = {path: lane for lane, paths in CPU_LANES.items() for path in paths}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of ``CPU_LANES`` first, then the other files with integration tests, in
    their order, then the rest: under ``pytest -n N --dist loadfile`` (``make test``) the
    long files, which wait on engine clocks and training processes, start at once and
    the short ones fill the gaps, instead of a long file starting last and running
    alone. Every worker collects the same order, as xdist requires."""
    long_files = {item.path for item in items if item.get_closest_marker("integration")}
    items.sort(key=lambda item: (item.nodeid.split("::", 1)[0] not in _LANE_OF,
                                 item.path not in long_files))  # stable: order kept within


@pytest.hookimpl(optionalhook=True)  # a hook of xdist: unknown under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` with the files of a lane in ``CPU_LANES`` as one unit of work;
    any other ``--dist`` as xdist has it."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LaneScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return _LANE_OF.get(path, path)

    return LaneScheduling(config, log)  # type: ignore[arg-type]


@pytest.fixture(scope="session", autouse=True)
def state_folders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every daemon the suite starts without a configured ledger or socket uses folders
    of the session (``$STATE_DIRECTORY``/``$RUNTIME_DIRECTORY``, as under systemd), never
    the machine's /var/lib/trainmon or /run/trainmon; tests of those defaults build
    their processes' environment themselves."""
    saved = {name: os.environ.get(name) for name in ("STATE_DIRECTORY", "RUNTIME_DIRECTORY")}
    os.environ["STATE_DIRECTORY"] = str(tmp_path_factory.mktemp("state"))
    os.environ["RUNTIME_DIRECTORY"] = str(tmp_path_factory.mktemp("runtime"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Start ``trainmon serve`` with an optional config mapping; waits until /healthz answers.

    ``start_daemon(config={...}, args=[...], env={...})``. The listen address is
    always a free loopback port; the training socket and the run ledger default
    into tmp_path.
    """
    daemons: list[Daemon] = []

    def start(
        config: Mapping[str, object] | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        wait: bool = True,
    ) -> Daemon:
        port = free_port()
        index = len(daemons)
        settings: dict[str, object] = dict(config or {})
        collectors = dict(settings.get("collectors", {}))  # type: ignore[call-overload]
        training = dict(collectors.get("training", {}))
        training.setdefault("socket", str(tmp_path / f"steps-{index}.sock"))
        collectors["training"] = training
        # never the machine's /var/lib/trainmon: each test daemon has its own ledger
        ledger = dict(collectors.get("ledger", {}))
        ledger.setdefault("path", str(tmp_path / f"ledger-{index}.sqlite3"))
        collectors["ledger"] = ledger
        settings["collectors"] = collectors
        config_path = tmp_path / f"trainmon-{index}.yml"
        config_path.write_text(yaml.safe_dump(settings))
        log_path = tmp_path / f"trainmon-{index}.log"
        command = [
            *trainmon_command(),
            "serve",
            "--config",
            str(config_path),
            "--listen",
            f"127.0.0.1:{port}",
            *args,
        ]
        process = subprocess.Popen(
            command,
            stdout=log_path.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        daemon = Daemon(process, port, log_path, config_path)
        daemons.append(daemon)
        if wait:
            wait_ready(daemon)
        return daemon

    yield start
    for daemon in daemons:
        daemon.stop()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    server = Prometheus(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def workload() -> Iterator[Callable[[str], Workload]]:
    """``workload(endpoint)``: ranks reporting to a client endpoint, stopped at teardown."""
    started: list[Workload] = []

    def start(endpoint: str) -> Workload:
        started.append(Workload(endpoint))
        return started[-1]

    yield start
    for running in started:
        running.stop()


def _build_fake_nvml(directory: Path, old_driver: bool = False) -> Path:
    """Compile the fake NVML into ``directory``; skip only when there is no C compiler.

    A compiler error (a broken ``fakenvml.c``) fails the tests that need the fake.
    """
    if fake_nvml_build.compiler() is None:
        pytest.skip("no C compiler to build the fake NVML library")
    try:
        return Path(fake_nvml_build.build(directory, old_driver=old_driver)).parent
    except subprocess.CalledProcessError as error:
        pytest.fail(f"cannot build the fake NVML library:\n{error.stderr}{error.stdout}")


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the compiled fake ``libnvidia-ml.so.1`` (for ``LD_LIBRARY_PATH``)."""
    return _build_fake_nvml(tmp_path_factory.mktemp("fakenvml"))


@pytest.fixture(scope="session")
def old_driver_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake built as an old driver (no field values, energy, event wait v2...)."""
    return _build_fake_nvml(tmp_path_factory.mktemp("fakenvml-old"), old_driver=True)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_collector(
    clock: FakeClock,
) -> Iterator[Callable[..., TrainingCollector]]:
    """``make_collector(**config)``: a started TrainingCollector (socket off unless given)."""
    started: list[TrainingCollector] = []

    def make(**settings: object) -> TrainingCollector:
        settings.setdefault("socket", None)
        collector = TrainingCollector(
            TrainingConfig(**settings),  # type: ignore[arg-type]
            clock=clock,
            wall_clock=lambda: 1_700_000_100.0,
        )
        collector.start()
        started.append(collector)
        return collector

    yield make
    for collector in started:
        collector.stop()


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / "run" / "trainmon" / "steps.sock"


@pytest.fixture
def proc(tmp_path: Path) -> ProcTree:
    return ProcTree(tmp_path / "proc")


@pytest.fixture
def sys_tree(tmp_path: Path) -> SysTree:
    return SysTree(tmp_path / "sys")
