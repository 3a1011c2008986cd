"""Cost of the step sketch (``trainmon.training.sketch``, issue 36), in process.

- **client**: ``StepSketch.add`` per step beside what ``Reporter.step()`` already did
  for the histogram (``bisect`` into ``STEP_SECONDS_BOUNDS`` and a list increment),
  on the step durations of a tight loop (microseconds, with the scheduler's pauses:
  the sketch goes up a level) and of a steady job (0.3 s ± 10 %);
- **daemon**: ``ingest_payload`` of one report into a ``TrainingStore``, as the
  receiver applies it: an older client's report (no sketch), a steady job's (40
  buckets, 5 steps more per report) and the worst a client sends (all 256 buckets
  grown since the previous report), with each line's bytes.

Best of several rounds (the machine's other work only adds). The client's cost in
``Reporter.step()`` itself is ``python -m bench.training_client``.

    .venv/bin/python -m bench.step_sketch
"""

from __future__ import annotations

import json
import random
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence

from trainmon.contract import STEP_BUCKET_COUNT, STEP_SECONDS_BOUNDS, STEP_SKETCH_MAX_BUCKETS
from trainmon.training.receiver import ingest_payload
from trainmon.training.sketch import StepSketch
from trainmon.training.store import TrainingStore

ROUNDS = 7
REPORTS = 2000


def per_call(call: Callable[[float], None], values: Sequence[float]) -> float:
    """Nanoseconds per call over ``values``, best of ``ROUNDS``."""
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for value in values:
            call(value)
        best = min(best, (time.perf_counter() - started) / len(values) * 1e9)
    return best


def client_rows() -> list[tuple[str, float, float]]:
    generator = random.Random(1)
    loads = {
        "tight loop (2 µs steps, Pareto pauses)": [
            2e-6 * generator.paretovariate(1.2) for _ in range(200_000)],
        "steady job (0.3 s ± 10 %)": [generator.gauss(0.3, 0.03) for _ in range(200_000)],
    }
    rows = []
    for name, durations in loads.items():
        buckets = [0] * STEP_BUCKET_COUNT

        def histogram(seconds: float, buckets: list[int] = buckets) -> None:
            buckets[bisect_left(STEP_SECONDS_BOUNDS, seconds)] += 1

        sketch = StepSketch()
        rows.append((name, per_call(histogram, durations), per_call(sketch.add, durations)))
    return rows


def reports(count: int, width: int, per_report: int) -> list[bytes]:
    """``count`` cumulative report lines of one reporter: ``width`` sketch buckets (0: no
    sketch, an older client), ``per_report`` more steps each (all ``width`` at 256)."""
    generator = random.Random(2)
    counts: dict[int, int] = {}
    steps = 0
    lines = []
    for _ in range(count):
        if width == STEP_SKETCH_MAX_BUCKETS:
            for index in range(-200, -200 + width):
                counts[index] = counts.get(index, 0) + 1
            steps += width
        else:
            for _ in range(per_report):
                index = -80 + generator.randrange(max(width, 1))
                counts[index] = counts.get(index, 0) + 1
            steps += per_report
        buckets = [0] * STEP_BUCKET_COUNT
        buckets[4] = steps
        report: dict[str, object] = {
            "v": 1, "job": "bench", "rank": 0, "local_rank": 0, "world_size": 8, "gpu": "0",
            "pid": 4242, "reporter_id": "a1b2c3d4e5f60718", "steps": steps,
            "samples": 32 * steps, "step_seconds": 0.2 * steps,
            "data_wait_seconds": 0.05 * steps, "phase_seconds": {"comm": 0.01 * steps},
            "step_buckets": buckets}
        if width:
            report["step_sketch"] = {str(index): count for index, count in counts.items()}
            report["step_sketch_level"] = 0
        report.update({"dropped_reports": 0, "last_step_time": 1_700_000_000.0})
        lines.append(json.dumps(report, separators=(",", ":")).encode() + b"\n")
    return lines


def ingest_microseconds(lines: list[bytes]) -> float:
    """Microseconds per report applied, best of ``ROUNDS`` fresh stores."""
    best = float("inf")
    for _ in range(ROUNDS):
        store = TrainingStore()
        started = time.perf_counter()
        for line in lines:
            ingest_payload(store, line, "unix", 128)
        best = min(best, (time.perf_counter() - started) / len(lines) * 1e6)
    return best


def main() -> None:
    print("| client, per step | histogram (ns) | sketch (ns) |")
    print("| --- | ---: | ---: |")
    for name, histogram, sketch in client_rows():
        print(f"| {name} | {histogram:.0f} | {sketch:.0f} |")
    print()
    print("| daemon, per report | line bytes | µs applied |")
    print("| --- | ---: | ---: |")
    for name, width in (("older client, no sketch", 0),
                        ("steady job: 40 buckets, 5 steps a report", 40),
                        ("worst: 256 buckets, all grown", STEP_SKETCH_MAX_BUCKETS)):
        lines = reports(REPORTS, width, 5)
        print(f"| {name} | {len(lines[-1]) - 1} | {ingest_microseconds(lines):.0f} |")


if __name__ == "__main__":
    main()
