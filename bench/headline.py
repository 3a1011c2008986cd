"""The headline figures of every benchmark, side by side with their anchors and goals.

A benchmark that measures one of the figures users choose an exporter by calls
``record(...)`` at its end; when ``TRAINMON_BENCH_RESULTS`` names a file (``make
bench`` sets it), the figure is appended there as one JSON line. ``python -m
bench.headline FILE`` prints them all in one table, the last figure of each name
winning (a benchmark run twice reports its latest):

| figure | this run | anchor | goal | met |

A figure without a goal (an ingestion rate, a refresh time without a bound) prints
"–" in the last two columns. Outside ``make bench`` ``record`` does nothing, so a
benchmark run by hand prints its own tables only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

RESULTS_ENV = "TRAINMON_BENCH_RESULTS"


@dataclass(frozen=True)
class Figure:
    #: What was measured, with its unit: "scrape p99 / node_exporter's".
    name: str
    value: float
    #: How the value is printed: a format spec for ``format(value, spec)``.
    spec: str = ".2f"
    #: What it is compared with ("node_exporter 20.3 MiB"), empty if nothing.
    anchor: str = ""
    #: The bound the value must stay at or under (None: none).
    at_most: float | None = None
    #: Which benchmark measured it, for the reader who wants the full table.
    source: str = ""

    def met(self) -> str:
        if self.at_most is None:
            return "–"
        return "yes" if self.value <= self.at_most else "**no**"

    def goal(self) -> str:
        return "–" if self.at_most is None else f"≤ {format(self.at_most, self.spec)}"


def record(figure: Figure, path: str | None = None) -> None:
    """Append ``figure`` to the results file of this ``make bench`` run, if there is one."""
    target = path or os.environ.get(RESULTS_ENV)
    if not target:
        return
    with Path(target).open("a", encoding="utf-8") as results:
        results.write(json.dumps(asdict(figure)) + "\n")


def load(path: Path) -> list[Figure]:
    """The figures of a results file, the last of each name, in the order first seen."""
    figures: dict[str, Figure] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            figure = Figure(**json.loads(line))
            figures[figure.name] = figure
    return list(figures.values())


def table(figures: Sequence[Figure]) -> str:
    rows = ["| figure | this run | anchor | goal | met | benchmark |",
            "| --- | ---: | --- | ---: | --- | --- |"]
    rows += [f"| {f.name} | {format(f.value, f.spec)} | {f.anchor or '–'} | {f.goal()} | "
             f"{f.met()} | {f.source} |" for f in figures]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m bench.headline RESULTS_FILE", file=sys.stderr)
        return 2
    path = Path(args[0])
    figures = load(path) if path.exists() else []
    if not figures:
        print(f"{path}: no headline figures recorded", file=sys.stderr)
        return 1
    print(table(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
