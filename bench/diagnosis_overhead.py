"""What the verdict costs a scrape: the daemon with and without attribution + diagnosis.

Two ``trainmon serve`` daemons run side by side on the same fake 8-GPU node
(``testkit/fakenvml``, through ``LD_LIBRARY_PATH``; 8 GPU processes, one per
GPU, real ``sleep`` processes so ``/proc/<pid>`` exists), and receive the same
step reports: 4 jobs × 4 ranks of ``trainmon.client.Reporter`` threads pushing
over HTTP. Daemon A runs every node collector except ``attribution`` and
``diagnosis`` (what a user gets from a plain exporter); daemon B runs them all.
Both are scraped alternately on loopback, each daemon every ``PACE_SECONDS``
(longer than the diagnosis' minimum evaluation interval, window / 20 = 3 s, as
with Prometheus' usual 15 s, so every scrape of B evaluates the rules); the
table gives the scrape latency, its ratio, the two collectors' own
``trainmon_collector_duration_seconds`` and the exposition size. Then
``trainmon doctor --url`` is timed against B and its exit status printed.

    .venv/bin/python -m bench.diagnosis_overhead            # 30 scrapes each, ~2 min
    .venv/bin/python -m bench.diagnosis_overhead --scrapes 10

Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from bench import benchlib

JOBS = 4
RANKS = 4
#: Seconds between two scrapes of the same daemon: above the default 60 s
#: window / 20 = 3 s, so every scrape of the full daemon evaluates.
PACE_SECONDS = 3.2


def start_daemon(folder: Path, name: str, library: Path, scenario: Path, full: bool
                 ) -> benchlib.Daemon:
    collectors: dict[str, object] = {
        "gpu": {"enabled": True, "process_interval_seconds": 1},
        "training": {"socket": str(folder / f"{name}.sock")},
        "attribution": {"enabled": full},
        "diagnosis": {"enabled": full},
    }
    config = folder / f"{name}.yml"
    config.write_text(json.dumps({"collectors": collectors}))
    return benchlib.start_trainmon(config, env={
        **os.environ, "LD_LIBRARY_PATH": str(library), "FAKENVML_SCENARIO": str(scenario),
    })


def run_ranks(urls: list[str], stop: threading.Event) -> list[threading.Thread]:
    from trainmon.client import Reporter

    def rank_loop(job: int, rank: int) -> None:
        reporters = [Reporter(job=f"job-{job}", rank=rank, world_size=RANKS,
                              gpu=str((job * RANKS + rank) % 8), endpoint=url)
                     for url in urls]
        while not stop.is_set():
            for reporter in reporters:
                reporter.add_data_wait(0.01)
                reporter.add_phase("comm", 0.02 * (job + 1))
            time.sleep(0.1)
            for reporter in reporters:
                reporter.step(samples=32)
        for reporter in reporters:
            reporter.close()

    threads = [threading.Thread(target=rank_loop, args=(job, rank), daemon=True)
               for job in range(JOBS) for rank in range(RANKS)]
    for thread in threads:
        thread.start()
    return threads


def scrape(url: str) -> tuple[float, str]:
    started = time.perf_counter()
    text = requests.get(f"{url}/metrics", timeout=10).text
    return time.perf_counter() - started, text


def durations(text: str) -> dict[str, float]:
    for family in text_string_to_metric_families(text):
        if family.name == "trainmon_collector_duration_seconds":
            return {s.labels["collector"]: s.value for s in family.samples}
    return {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainmon-diag-bench-") as tmp:
        folder = Path(tmp)
        library = benchlib.build_fake_nvml(folder / "lib")
        holders = [subprocess.Popen(["sleep", "600"]) for _ in range(8)]
        scenario = folder / "node.txt"
        scenario.write_text("gpus 8\nsteady * 90 3\n" + "".join(
            f"process {gpu} {holder.pid} 4294967296\n" for gpu, holder in enumerate(holders)))
        plain = start_daemon(folder, "plain", library, scenario, full=False)
        full = start_daemon(folder, "full", library, scenario, full=True)
        plain_url, full_url = plain.url, full.url
        stop = threading.Event()
        threads = run_ranks([plain_url, full_url], stop)
        try:
            time.sleep(5)
            latencies: dict[str, list[float]] = {"plain": [], "full": []}
            texts = {"plain": "", "full": ""}
            own_times: dict[str, list[float]] = {"attribution": [], "diagnosis": []}
            for _ in range(args.scrapes):
                paced = time.monotonic() + PACE_SECONDS
                for name, url in (("plain", plain_url), ("full", full_url)):
                    seconds, texts[name] = scrape(url)
                    latencies[name].append(seconds)
                own = durations(texts["full"])
                for collector, values in own_times.items():
                    values.append(own.get(collector, 0.0))
                time.sleep(max(0.0, paced - time.monotonic()))
            started = time.perf_counter()
            doctor = subprocess.run(
                [sys.executable, "-m", "trainmon", "doctor", "--url", full_url,
                 "--seconds", "3", "--json"], capture_output=True, text=True, check=False)
            doctor_seconds = time.perf_counter() - started
            verdicts = {j["job"]: j["kind"] for j in json.loads(doctor.stdout)["jobs"]}
        finally:
            stop.set()
            for thread in threads:
                thread.join(5)
            for process in (plain.process, full.process, *holders):
                benchlib.stop(process)

    def p(values: list[float], q: float) -> float:
        return benchlib.percentile(values, q / 100) * 1000

    print(f"{args.scrapes} scrapes of each daemon, {PACE_SECONDS} s apart, 8 fake GPUs, "
          f"{JOBS} jobs x {RANKS} ranks\n")
    # Scrapes are paced above window / 20, so every diagnosis duration is an evaluation.
    print("| daemon | scrape p50 | scrape p95 | exposition | attribution collect p50 | "
          "diagnosis collect (evaluation) p50 / p95 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, label in (("plain", "node collectors only"),
                        ("full", "+ attribution + diagnosis")):
        extra = (
            f"{p(own_times['attribution'], 50):.2f} ms | "
            f"{p(own_times['diagnosis'], 50):.2f} ms / {p(own_times['diagnosis'], 95):.2f} ms"
        ) if name == "full" else "— | —"
        print(f"| {label} | {p(latencies[name], 50):.2f} ms | {p(latencies[name], 95):.2f} ms | "
              f"{len(texts[name]) / 1024:.0f} KiB | {extra} |")
    ratio = statistics.median(latencies["full"]) / statistics.median(latencies["plain"])
    print("\nPercentiles are nearest-rank (benchlib.percentile); the ratio uses "
          "statistics.median.")
    print(f"median scrape ratio full / plain: {ratio:.2f}x")
    print(f"`trainmon doctor --url … --seconds 3 --json`: {doctor_seconds:.2f} s wall, "
          f"exit status {doctor.returncode}, verdicts {verdicts}")


if __name__ == "__main__":
    main()
