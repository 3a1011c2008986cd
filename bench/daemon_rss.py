"""Resident memory of ``trainmon serve`` with built-in defaults (no GPU), optionally A/B.

Each run starts a daemon without ``--config`` on a free loopback port, with the
systemd unit's environment (``PYTHONOPTIMIZE=2``; ``--plain`` adds runs without it), scrapes
``/metrics`` ``testkit.footprint.SCRAPES`` times and reads ``VmRSS``/``VmHWM``
(``testkit.footprint.measure_serve``, the measurement tests/test_footprint.py
holds to its ceiling). With ``--compare DIR`` (a source folder of another
version, e.g. ``git archive HEAD~1 exporter | tar -x -C /tmp/before``, then
``/tmp/before/exporter``) the runs alternate between that tree and this one, so
both see the same machine.

    .venv/bin/python -m bench.daemon_rss                          # 5 runs
    .venv/bin/python -m bench.daemon_rss --runs 3 --compare /tmp/before/exporter

Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics

from bench import benchlib, headline
from testkit.footprint import SERVE_RSS_CEILING_MIB, Footprint, measure_serve

#: Issue 25's goal for the default daemon (the test's ceiling, SERVE_RSS_CEILING_MIB, is above it).
RSS_GOAL_MIB = 30.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--compare", metavar="DIR",
                        help="source folder (holding trainmon/) of the version to compare")
    parser.add_argument("--plain", action="store_true",
                        help="also run each tree without the unit's PYTHONOPTIMIZE")
    args = parser.parse_args()
    trees = {"this tree": str(benchlib.ROOT / "exporter")}
    if args.compare:
        trees = {args.compare: args.compare, **trees}
    variants = {f"{name}{suffix}": {"PYTHONPATH": source, **extra}
                for name, source in trees.items()
                for suffix, extra in ((("", {}),) + (((", plain", {"PYTHONOPTIMIZE": ""}),)
                                                     if args.plain else ()))}
    results: dict[str, list[Footprint]] = {name: [] for name in variants}
    for _ in range(args.runs):
        for name, env in variants.items():  # alternate: all see the same machine load
            results[name].append(measure_serve(env=env))
    print(f"`trainmon serve`, built-in defaults, no GPU; {args.runs} runs each, alternating; "
          f"ceiling {SERVE_RSS_CEILING_MIB} MiB\n")
    print("| tree | VmRSS MiB, each run | median | peak (VmHWM) max | threads |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, runs in results.items():
        each = ", ".join(f"{run.rss_mib:.1f}" for run in runs)
        print(f"| {name} | {each} | {statistics.median(r.rss_mib for r in runs):.1f} | "
              f"{max(r.peak_rss_mib for r in runs):.1f} | {runs[-1].threads} |")
    headline.record(headline.Figure(
        "daemon RSS, default collectors, no GPU (MiB)",
        statistics.median(r.rss_mib for r in results["this tree"]), spec=".1f",
        anchor="node_exporter ≈ 20 (bench.node_scrape)", at_most=RSS_GOAL_MIB,
        source="bench.daemon_rss"))


if __name__ == "__main__":
    main()
