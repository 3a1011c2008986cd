"""Sawtooth detection: the shipped alert vs. what a DCGM-stack user writes today.

For square-wave GPU utilization (periods 2, 5, 10, 30 and 120 s) and a few
signals that must *not* page, this reports whether and how soon each rule
fires:

(a) ``TrainmonGPUSawtooth`` (shipped) on the daemon's sawtooth ratio: the
    6 Hz driver samples of the synthetic trace go through the real
    ``trainmon.gpu.sampler.UtilizationTrack``; its ratio is scraped every 15 s;
(b) rules on ``DCGM_FI_DEV_GPU_UTIL`` scraped every 15 s, as people write them:
    b1 threshold ``avg_over_time(util[10m]) < 50`` for 10m ("GPU underutilised"),
    b2 ``stddev_over_time(util[10m]) > 20`` for 10m ("utilization unstable");
(c) ``TrainmonGPUSawtoothScraped`` (shipped fallback) on the same DCGM series.

A scraped DCGM value is the busy share of the last second before the scrape
(NVML's utilization sample period is 1/6–1 s depending on the product; the
longest is used). Each signal runs 10 min steady at 95 % (warm-up), then
30 min of the pattern; latency counts from the pattern's start. Scrapes land
at 6 different phases of the signal (offsets 0–12.5 s), so a result reads
"fired for k of 6 phases, median latency". The rules are evaluated by
``promtool test rules`` (the real Prometheus rule engine, 15 s evaluation
interval) on the shipped ``alerts/dcgm/trainmon.rules.yml``; the first firing
time is read from the ``ALERTS`` series promtool reports.

    .venv/bin/python -m bench.alerts_sawtooth

Needs ``promtool`` (Debian ``prometheus``); takes about 20 s; prints a
markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from trainmon.gpu.sampler import Hysteresis, UtilizationTrack

REPO = Path(__file__).resolve().parent.parent
SHIPPED_RULES = REPO / "alerts" / "dcgm" / "trainmon.rules.yml"
SAMPLE_HZ = 6
SCRAPE_SECONDS = 15
WARMUP_SECONDS = 600
PATTERN_SECONDS = 1800
PHASES = (0.0, 2.5, 5.0, 7.5, 10.0, 12.5)
NVML_WINDOW_SECONDS = 1.0
BUSY = 0.97
#: (alertname, scrape phase index) → (first firing time in promtool's clock, firing at the end)
Results = dict[tuple[str, str], tuple[float | None, bool]]

USER_RULES = {
    "groups": [{
        "name": "what-dcgm-users-write",
        "rules": [
            {"alert": "UserGPUUnderutilised",
             "expr": "avg_over_time(DCGM_FI_DEV_GPU_UTIL[10m]) < 50", "for": "10m"},
            {"alert": "UserGPUUtilizationUnstable",
             "expr": "stddev_over_time(DCGM_FI_DEV_GPU_UTIL[10m]) > 20", "for": "10m"},
        ],
    }],
}
RULES = (
    ("a", "TrainmonGPUSawtooth", "(a) shipped, 6 Hz sampler"),
    ("b1", "UserGPUUnderutilised", "(b1) DCGM avg < 50 %"),
    ("b2", "UserGPUUtilizationUnstable", "(b2) DCGM stddev > 20"),
    ("c", "TrainmonGPUSawtoothScraped", "(c) shipped DCGM fallback"),
)


# -- signals: busy share (0-1) as a function of time (s) after the warm-up -------


@dataclass(frozen=True)
class Signal:
    name: str
    busy: Callable[[float], float]
    should_page: bool


def square(period: float, duty: float = 0.5) -> Callable[[float], float]:
    return lambda t: BUSY if (t % period) < duty * period else 0.0


def _noisy(level: float, spread: float, seed: int) -> Callable[[float], float]:
    rng = random.Random(seed)
    cache: dict[int, float] = {}

    def busy(t: float) -> float:
        tick = int(t * SAMPLE_HZ)
        if tick not in cache:
            cache[tick] = min(1.0, max(0.0, level + rng.uniform(-spread, spread)))
        return cache[tick]

    return busy


SIGNALS = (
    *(Signal(f"square wave, {p:g} s period", square(p), True) for p in (2, 5, 10, 30, 120)),
    Signal("10 s period, 65 % busy (the demo's)", square(10, 0.65), True),
    Signal("steady 95 % (must not page)", _noisy(0.95, 0.02, 1), False),
    Signal("steady 50 % ± 5 % (must not page)", _noisy(0.5, 0.05, 2), False),
    Signal("idle (must not page)", lambda t: 0.0, False),
    Signal("busy once for 60 s, then idle (must not page)",
           lambda t: BUSY if t < 60 else 0.0, False),
    Signal("30 s checkpoint stall every 10 min (must not page)",
           lambda t: 0.0 if (t % 600) < 30 else 0.95, False),
)


def busy_at(signal: Signal, t: float) -> float:
    """Busy share at absolute time ``t`` (warm-up first)."""
    return 0.95 if t < WARMUP_SECONDS else signal.busy(t - WARMUP_SECONDS)


def window_share(signal: Signal, start: float, end: float, steps: int = 24) -> float:
    """Mean busy share over [start, end) (numerical, ``steps`` points)."""
    width = (end - start) / steps
    return sum(busy_at(signal, start + (i + 0.5) * width) for i in range(steps)) / steps


# -- the series each rule reads ---------------------------------------------------


def sampler_ratios(signal: Signal, phase: float) -> list[float]:
    """The daemon's trainmon_gpu_sawtooth_ratio at each scrape (scrape k at k·15 s + phase)."""
    track = UtilizationTrack(window_seconds=60.0, hysteresis=Hysteresis())
    period = 1.0 / SAMPLE_HZ
    total = WARMUP_SECONDS + PATTERN_SECONDS
    ratios: list[float] = []
    sample = 1
    for k in range(total // SCRAPE_SECONDS + 1):
        scrape_at = k * SCRAPE_SECONDS + phase
        while sample * period <= scrape_at:
            end = sample * period
            track.add(round(end * 1e6), window_share(signal, end - period, end, steps=4))
            sample += 1
        ratios.append(track.sawtooth_ratio())
    return ratios


def dcgm_values(signal: Signal, phase: float) -> list[int]:
    """DCGM_FI_DEV_GPU_UTIL (percent) at each scrape: the busy share of the last second."""
    total = WARMUP_SECONDS + PATTERN_SECONDS
    values = []
    for k in range(total // SCRAPE_SECONDS + 1):
        at = k * SCRAPE_SECONDS + phase
        values.append(round(100 * window_share(signal, at - NVML_WINDOW_SECONDS, at)))
    return values


# -- promtool --------------------------------------------------------------------


def promtool_first_firing(workdir: Path, signal: Signal, promtool: str) -> Results:
    """(alertname, phase index) → (first firing time in s of promtool time, firing at end)."""
    series = []
    for index, phase in enumerate(PHASES):
        ratios = sampler_ratios(signal, phase)
        series.append({
            "series": "trainmon_gpu_sawtooth_ratio"
                      f'{{instance="bench",job="trainmon",gpu="{index}"}}',
            "values": " ".join(f"{value:g}" for value in ratios),
        })
        series.append({
            "series": f'DCGM_FI_DEV_GPU_UTIL{{instance="bench",job="dcgm",gpu="{index}",'
                      f'UUID="GPU-{index}",Hostname="bench",modelName="synthetic"}}',
            "values": " ".join(str(value) for value in dcgm_values(signal, phase)),
        })
    end = WARMUP_SECONDS + PATTERN_SECONDS
    first = f'min_over_time(timestamp(ALERTS{{alertstate="firing"}})[{end}s:{SCRAPE_SECONDS}s])'
    tests = {
        "rule_files": [str(SHIPPED_RULES), str(workdir / "user.rules.yml")],
        "evaluation_interval": f"{SCRAPE_SECONDS}s",
        "tests": [{
            "interval": f"{SCRAPE_SECONDS}s",
            "input_series": series,
            "promql_expr_test": [
                {"expr": f"floor({first} / 100)", "eval_time": f"{end}s", "exp_samples": []},
                {"expr": f"{first} % 100", "eval_time": f"{end}s", "exp_samples": []},
                {"expr": 'ALERTS{alertstate="firing"}', "eval_time": f"{end}s",
                 "exp_samples": []},
            ],
        }],
    }
    test_path = workdir / "bench.test.yml"
    test_path.write_text(yaml.safe_dump(tests, sort_keys=False))
    output = subprocess.run(
        [promtool, "test", "rules", str(test_path)], capture_output=True, text=True, timeout=300
    )
    return _parse(output.stdout + output.stderr)


_GOT = re.compile(r"\{([^{}]*)\} ([-+0-9.eE]+)")


def _parse(output: str) -> Results:
    """Read promtool's 'got:' lines of the three expressions above (in order)."""
    blocks = [line for line in output.splitlines() if line.strip().startswith("got:")]
    hundreds: dict[tuple[str, str], float] = {}
    rest: dict[tuple[str, str], float] = {}
    at_end: set[tuple[str, str]] = set()
    targets = (hundreds, rest, None)
    expressions = re.findall(r'expr: "(.*)", time', output)
    for expression, line in zip(expressions, blocks, strict=True):
        target = targets[0] if expression.startswith("floor(") else (
            targets[1] if "% 100" in expression else None)
        for labels, value in _GOT.findall(line):
            pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            key = (pairs["alertname"], pairs["gpu"])
            if target is None:
                at_end.add(key)
            else:
                target[key] = float(value)
    keys = hundreds.keys() | at_end
    return {key: (100 * hundreds[key] + rest[key] if key in hundreds else None, key in at_end)
            for key in keys}


# -- report ---------------------------------------------------------------------


def latencies(results: Results, alert: str) -> tuple[list[float], int]:
    """Latencies (s from the pattern's start) of the phases that fired, and how many
    of those were still firing at the end."""
    found = []
    still_firing = 0
    for index, phase in enumerate(PHASES):
        fired, firing_at_end = results.get((alert, str(index)), (None, False))
        if fired is not None:
            found.append(fired + phase - WARMUP_SECONDS)
            still_firing += firing_at_end
    return found, still_firing


def cell(results: Results, alert: str) -> str:
    found, still_firing = latencies(results, alert)
    if not found:
        return f"no (0/{len(PHASES)})"
    stopped = "" if still_firing == len(found) else f", {len(found) - still_firing} stopped"
    return f"{len(found)}/{len(PHASES)} after {_minutes(statistics.median(found))}{stopped}"


def summary(rows: Sequence[tuple[Signal, Results]]) -> list[str]:
    """Per rule: sawtooth cases caught, median latency (and × the shipped alert's),
    false pages on the signals that must not page."""
    should = [results for signal, results in rows if signal.should_page]
    should_not = [results for signal, results in rows if not signal.should_page]
    lines = [
        "| rule | sawtooth cases caught | median latency | latency × (a) | "
        "false alerts on must-not-page signals |",
        "| --- | --- | --- | --- | --- |",
    ]
    reference: float | None = None
    for _, alert, title in RULES:
        caught = [value for results in should for value in latencies(results, alert)[0]]
        false = sum(len(latencies(results, alert)[0]) for results in should_not)
        median = statistics.median(caught) if caught else None
        if reference is None:
            reference = median
        ratio = f"{median / reference:.1f}×" if median and reference else "—"
        lines.append(
            f"| {title} | {len(caught)}/{len(should) * len(PHASES)} | "
            f"{_minutes(median) if median is not None else '—'} | {ratio} | "
            f"{false}/{len(should_not) * len(PHASES)} |"
        )
    return lines


def _minutes(seconds: float) -> str:
    sign = "-" if seconds < 0 else ""
    return f"{sign}{math.floor(abs(seconds) / 60):d} min {abs(seconds) % 60:02.0f} s"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    promtool = shutil.which("promtool")
    if promtool is None:
        print("promtool not found: install Debian's prometheus package", file=sys.stderr)
        return 2
    started = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory(prefix="trainmon-bench-alerts-") as tmp:
        workdir = Path(tmp)
        (workdir / "user.rules.yml").write_text(yaml.safe_dump(USER_RULES, sort_keys=False))
        for signal in SIGNALS:
            rows.append((signal, promtool_first_firing(workdir, signal, promtool)))
    print(f"Sawtooth detection, {len(PHASES)} scrape phases per signal, 15 s scrape and "
          f"evaluation; latency from the pattern's start ({time.monotonic() - started:.0f} s)\n")
    print("| signal | " + " | ".join(title for _, _, title in RULES) + " |")
    print("| --- " * (len(RULES) + 1) + "|")
    for signal, results in rows:
        print(f"| {signal.name} | " + " | ".join(cell(results, a) for _, a, _ in RULES) + " |")
    print()
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
