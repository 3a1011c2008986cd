"""What measuring every collective costs a training step, per kind of job (issue 34).

``python -m bench.collective_overhead [--rounds 6] [--ops 3000]``

``trainmon.client.collectives`` wraps the ``ProcessGroup`` methods, ``Work.wait`` and
the functional collectives' ops for the whole process once ``instrument()`` ran. Its
cost is per collective, the same on a GPU as here (Python around a C++ call), so it is
measured where the collectives themselves cost next to nothing: a world-size-1 gloo
group, in which a collective is a local copy. Each round runs two fresh processes one
after the other, **bare** (no trainmon at all) and **instrumented**
(``reporter.instrument(model)`` on a plain module: every collective of the process
measured, a ``step()`` every ``OPS_PER_STEP`` collectives, which folds them), each
timing ``--ops`` calls of four shapes:

- ``all_reduce``: ``dist.all_reduce(t)``, synchronous (DDP's broadcasts, a loss
  all-reduce, Megatron-style code);
- ``all_gather async``: ``dist.all_gather_into_tensor(..., async_op=True)`` then
  ``work.wait()`` (FSDP2's all-gathers, pipelining's sends and receives);
- ``functional all_reduce``: ``funcol.all_reduce(...)`` then its ``wait()``
  (DTensor: tensor and sequence parallel);
- ``step()``: the reporter's own step with its fold, per step.

The added cost per collective is the median over rounds of instrumented − bare; the
per-step cost of each kind of job is that times the collectives the kind launches per
step (``COLLECTIVES_PER_STEP``, as the instrumentation counted them on test jobs of
``testkit/parallel_job.py``), set against a 100 ms step (the goal: at most 1 %).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from bench.benchlib import ROOT
from testkit.daemon import free_port

#: Collectives launched per step by each kind of test job, by shape. Counted by the
#: instrumentation (``comm_groups``): FSDP2+TP, dp=2 x tp=2, 90 dp and 45 tp collectives
#: in 15 steps; the 2-stage pipeline of 4 microbatches, 706 pp sends and receives in
#: about 86 steps. FSDP2 alone is taken as FSDP2+TP's dp share (not counted apart);
#: DDP's buckets are timed by its hook, not here.
COLLECTIVES_PER_STEP: dict[str, dict[str, int]] = {
    "fsdp2": {"all_gather async": 6},
    "fsdp2_tp": {"all_gather async": 6, "functional all_reduce": 3},
    "pipeline": {"all_gather async": 8},
    "tensor parallel only": {"functional all_reduce": 3},
}
#: Collectives between two ``step()`` calls in the instrumented worker.
OPS_PER_STEP = 10
REFERENCE_STEP_SECONDS = 0.1


def worker(instrumented: bool, ops: int) -> dict[str, float]:
    """Median seconds per call of each shape, in this process."""
    import torch
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    reporter = None
    if instrumented:
        from trainmon.client import Reporter

        reporter = Reporter(job="bench", endpoint="unix:///nonexistent/trainmon.sock",
                            interval_seconds=60.0)
        reporter.instrument(torch.nn.Linear(1, 1))
    tensor = torch.ones(256)
    gathered = torch.empty(256)

    def all_reduce() -> None:
        dist.all_reduce(tensor)

    def all_gather_async() -> None:
        dist.all_gather_into_tensor(gathered, tensor, async_op=True).wait()

    def functional() -> None:
        funcol.all_reduce(tensor, "sum", dist.group.WORLD).wait()

    def step() -> None:
        if reporter is not None:
            reporter.step()

    shapes: dict[str, Callable[[], None]] = {
        "all_reduce": all_reduce, "all_gather async": all_gather_async,
        "functional all_reduce": functional,
    }
    timings: dict[str, list[float]] = {name: [] for name in [*shapes, "step()"]}
    for name, call in shapes.items():
        for _ in range(100):  # warm-up
            call()
        for index in range(ops):
            started = time.perf_counter()
            call()
            timings[name].append(time.perf_counter() - started)
            if index % OPS_PER_STEP == OPS_PER_STEP - 1:
                started = time.perf_counter()
                step()
                timings["step()"].append(time.perf_counter() - started)
    if reporter is not None:
        reporter.close()
    dist.destroy_process_group()
    return {name: statistics.median(values) for name, values in timings.items()}


def run_worker(variant: str, ops: int) -> dict[str, float]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.collective_overhead", "--worker", variant,
         "--ops", str(ops)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600,
        check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--worker", choices=("bare", "instrumented"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker == "instrumented", args.ops)))
        return
    added: dict[str, list[float]] = {}
    bare_medians: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        bare = run_worker("bare", args.ops)
        instrumented = run_worker("instrumented", args.ops)
        for name, seconds in instrumented.items():
            added.setdefault(name, []).append(seconds - bare[name])
            bare_medians.setdefault(name, []).append(bare[name])
    per_call = {name: statistics.median(values) for name, values in added.items()}
    print(f"Per call, world-size-1 gloo, {args.rounds} rounds x {args.ops} calls "
          "(median of the rounds' medians, µs):\n")
    print("| shape | bare | added by trainmon |")
    print("| --- | ---: | ---: |")
    for name, seconds in per_call.items():
        print(f"| {name} | {statistics.median(bare_medians[name]) * 1e6:.1f} | "
              f"{seconds * 1e6:+.1f} |")
    print(f"\nPer step, against a {REFERENCE_STEP_SECONDS * 1e3:.0f} ms step "
          "(collectives per step x added per call, plus one step()):\n")
    print("| job | collectives per step | added per step | share of the step |")
    print("| --- | --- | ---: | ---: |")
    for kind, counts in COLLECTIVES_PER_STEP.items():
        seconds = per_call["step()"] + sum(per_call[shape] * count
                                           for shape, count in counts.items())
        shown = ", ".join(f"{count} {shape}" for shape, count in counts.items())
        print(f"| {kind} | {shown} | {seconds * 1e6:.1f} µs | "
              f"{seconds / REFERENCE_STEP_SECONDS:.3%} |")


if __name__ == "__main__":
    main()
