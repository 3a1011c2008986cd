"""The frame a stall shows (``trainmon.training.stalls.frame_text``): the innermost of
the job's own code, not torch's ``graph.py _engine_run_backward`` (issue 36).

The rule on the paths that real layouts give (a venv, conda, Debian's
dist-packages, a torch source checkout, trainmon installed editable), then two real
hangs inside ``loss.backward()``: a torch autograd hook that blocks in the standard
library, on a thread of this process, and a real DDP job on gloo whose rank 0 waits
in its gradient all-reduce while rank 1 is stuck in its dataset
(``testkit/ddp_job.py hang``). Both must name the ``loss.backward()`` line while the
stall line keeps the whole stack.
"""

from __future__ import annotations

import inspect
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.exposition import parse
from tests.diagnosis.diagnosis_support import HANG_JOB as JOB
from tests.diagnosis.diagnosis_support import start_hang_ranks as start_ranks
from tests.diagnosis.diagnosis_support import stop_hang_ranks as stop
from trainmon.client import Reporter, watchdog
from trainmon.client.watchdog import RankState, StallWatch
from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.training.protocol import StallFrame
from trainmon.training.stalls import frame_text, is_library_file

REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE_SECONDS = 20.0
#: The hang job's bound from its start to rank 0's stall (its stall threshold is the
#: contract's 10 s floor: a subprocess cannot be given a quicker one).
DDP_DEADLINE_SECONDS = 150.0

VENV = "/home/me/.venv/lib/python3.11/site-packages"


@pytest.mark.parametrize("path", [
    f"{VENV}/torch/autograd/graph.py",
    f"{VENV}/lightning/pytorch/loops/fit_loop.py",
    "/opt/conda/lib/python3.10/site-packages/transformers/trainer.py",
    "/usr/lib/python3/dist-packages/numpy/core/fromnumeric.py",
    "/usr/lib/python3.12/threading.py",
    "/root/.pyenv/versions/3.11.7/lib/python3.11/queue.py",
    "/usr/lib64/python3.13t/selectors.py",
    "<frozen importlib._bootstrap>",
    "/home/me/src/pytorch/torch/nn/parallel/distributed.py",  # a source build of torch
    "/home/me/src/trainmon/exporter/trainmon/client/reporter.py",  # trainmon, editable
])
def test_a_librarys_file_is_told_by_its_path(path: str) -> None:
    assert is_library_file(path)


@pytest.mark.parametrize("path", [
    "/work/train.py",
    "/home/me/mytorch/train.py",
    "/home/me/lib/models/resnet.py",
    "/home/me/trainmon-jobs/train.py",
    "<string>",
    "<ipython-input-3-5f1c>",
])
def test_the_jobs_own_file_is_not_a_library(path: str) -> None:
    assert not is_library_file(path)


def frames(*files: str) -> tuple[StallFrame, ...]:
    return tuple(StallFrame(file=file, line=index + 10, function=f"f{index}")
                 for index, file in enumerate(files))


def test_the_innermost_frame_of_the_jobs_own_code_is_shown() -> None:
    backward = frames(f"{VENV}/torch/autograd/graph.py", f"{VENV}/torch/autograd/__init__.py",
                      f"{VENV}/torch/_tensor.py", "/work/train.py", "/work/launch.py")
    assert frame_text(backward) == "train.py:13 f3"
    assert frame_text(frames("/work/dataset.py", f"{VENV}/torch/utils/data/fetch.py",
                             "/work/train.py")) == "dataset.py:10 f0"


def test_a_stack_of_libraries_only_shows_its_innermost_frame() -> None:
    assert frame_text(frames("/usr/lib/python3.12/threading.py",
                             f"{VENV}/transformers/trainer.py")) == "threading.py:10 f0"
    assert frame_text(()) == ""


# -- a real hang inside loss.backward() -------------------------------------------------


@pytest.fixture
def quick_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "stall_threshold", lambda typical: 0.5)


def backward_line(function: Callable[..., object]) -> int:
    """The line of ``function`` that calls ``loss.backward()``."""
    lines, first = inspect.getsourcelines(function)
    return first + next(index for index, text in enumerate(lines) if "loss.backward()" in text)


def train_until_a_hook_blocks(reporter: Reporter, gradients: queue.Queue[None],
                              blocked_at: int) -> None:
    """Real forward and backward passes; at step ``blocked_at`` the loss's gradient
    hook is ``Queue.get``, which waits (in the standard library, called from torch's
    engine) until the test puts an item."""
    import torch

    weights = torch.randn(16, 16, requires_grad=True)
    for step in reporter.track(range(1000)):
        loss = (torch.randn(8, 16) @ weights).square().mean()
        if step == blocked_at:
            loss.register_hook(gradients.get)  # type: ignore[arg-type]
        loss.backward()  # type: ignore[no-untyped-call]
        reporter.step(samples=8)
        if step == blocked_at:
            return


def stall_info(daemon: Daemon, job: str) -> dict[str, dict[str, str]]:
    return {labels["rank"]: labels
            for labels in parse(daemon.metrics()).labelsets("trainmon_training_stall_info")
            if labels["job"] == job}


@pytest.mark.integration
@pytest.mark.usefixtures("quick_watchdog")
def test_a_hook_blocking_in_backward_names_the_backward_line_and_keeps_the_stack(
    start_daemon: Callable[..., Daemon], tmp_path: Path,
) -> None:
    daemon = start_daemon()
    gradients: queue.Queue[None] = queue.Queue()
    reporters: list[Reporter] = []

    def train() -> None:
        with Reporter("hooked", rank=0, world_size=1, environ={}, interval_seconds=0.2,
                      endpoint=f"unix://{tmp_path / 'steps-0.sock'}") as reporter:
            reporters.append(reporter)
            train_until_a_hook_blocks(reporter, gradients, blocked_at=20)

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while "0" not in (info := stall_info(daemon, "hooked")):
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.1)
        # the whole stack, as the stall line sends it: what the watchdog sees now
        line = StallWatch(Reporter.track.__code__, clock=lambda: 1e9).look(RankState(
            thread=thread.ident or 0, steps=20, last_step=0.0,
            buckets=[20] + [0] * (STEP_BUCKET_COUNT - 1), phase=None, checkpointing=False,
            in_flight=None))
    finally:
        gradients.put(None)
        thread.join(timeout=10)
    assert not thread.is_alive() and reporters
    expected = f"test_stall_frames.py:{backward_line(train_until_a_hook_blocks)}"
    assert info["0"]["frame"] == f"{expected} train_until_a_hook_blocks"
    assert line is not None
    sent = [(Path(str(frame["file"])).name, frame["function"])
            for frame in line["frames"]]  # type: ignore[attr-defined]
    assert sent[:5] == [("threading.py", "wait"), ("queue.py", "get"),
                        ("graph.py", "_engine_run_backward"), ("__init__.py", "backward"),
                        ("_tensor.py", "backward")]
    assert sent[5] == ("test_stall_frames.py", "train_until_a_hook_blocks")


@pytest.mark.integration
def test_a_ddp_rank_waiting_in_its_gradient_all_reduce_names_its_backward_line(
    tmp_path: Path, start_daemon: Callable[..., Daemon],
) -> None:
    """Rank 1's dataset blocks at step 30; rank 0 goes on into its next backward, where
    DDP waits for the all-reduce rank 1 never joins: inside torch, under
    ``_engine_run_backward``, and its stall names ``ddp_job.py``'s backward line."""
    from testkit import ddp_job

    socket = str(tmp_path / "steps.sock")
    daemon = start_daemon(config={"collectors": {"training": {"socket": socket}}})
    release = tmp_path / "release"
    ranks = start_ranks(tmp_path, socket, release)
    try:
        deadline = time.monotonic() + DDP_DEADLINE_SECONDS
        while not {"0", "1"} <= set(info := stall_info(daemon, JOB)):
            assert time.monotonic() < deadline, daemon.log()
            assert all(process.poll() is None for process in ranks), daemon.log()
            time.sleep(0.5)
    finally:
        stop(ranks, release)
    assert info["0"]["where"] == "collective"
    assert info["0"]["frame"] == f"ddp_job.py:{backward_line(ddp_job.run_hang)} run_hang"
    assert info["1"]["frame"].startswith("ddp_job.py:")
    assert info["1"]["frame"].endswith(" __getitem__")

