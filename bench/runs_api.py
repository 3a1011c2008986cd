"""``GET /api/v1/runs`` over a large ledger, before and after its pages: the daemon's
memory while clients read every record.

Issue 35 measured one request answering 237 MB of JSON and four parallel
requests taking the daemon to 3.5 GB. This benchmark builds a ledger of
``--records`` runs with 13.5 KB run descriptions (17 500 records: about the
issue's 237 MB of JSON), gives a copy to a daemon of each tree ("before": a
landed commit, ``--before``, default ``bench.hostile_floods.BEFORE_REF``;
"after": this working tree) and has ``--clients`` clients read every record at
once, as ``trainmon runs`` does: before, one answer each; after, the pages, each
following the ``Link`` cursor and waiting out a ``503 busy``. Readings: the
daemon's peak ``VmRSS`` (every 5 ms) above its resident memory before the reads,
the largest answer, the seconds until every client has every record, and the
``busy`` answers.

    .venv/bin/python -m bench.runs_api                    # about 2 minutes
    .venv/bin/python -m bench.runs_api --records 3000     # a smaller ledger
    .venv/bin/python -m bench.runs_api --before ''        # the working tree only

Prints a markdown table for docs/security.md.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench import benchlib
from bench.hostile import MemoryPeak, before_tree, tree_environment
from bench.hostile_floods import BEFORE_REF
from trainmon.ledger import RunRecord
from trainmon.ledger.store import Ledger, RecordUpdate

#: Records of the issue's ledger (13.5 KB descriptions: 237 MB of JSON).
RECORDS = 17_500
#: Owners the records are spread over (each well within ``max_runs_per_owner``).
OWNERS = 32
CLIENTS = 4
#: Keys of 256 characters in each description's config: 13.5 KB with the rest.
DESCRIPTION_KEYS = 52
#: Records written per transaction while building the ledger.
BATCH = 500


@dataclass
class Reading:
    side: str
    baseline_kib: int
    peak_kib: int
    seconds: float
    #: Records each client read.
    records: list[int]
    largest_answer_bytes: int
    busy_answers: int
    errors: list[str] = field(default_factory=list)


def build_ledger(path: Path, records: int) -> None:
    now = time.time()
    config = {f"key{index:02d}": "x" * 256 for index in range(DESCRIPTION_KEYS)}
    with Ledger.open(path, readonly=False) as ledger:
        for first in range(0, records, BATCH):
            ledger.write([RecordUpdate(RunRecord(
                job=f"job-{index % 64}", run=f"run-{index:06d}", node="node-1",
                config_hash="sha256:0000000000000000", started=now - records + index,
                ended=now - records + index + 0.5, end_reason="finished", updated=now,
                world_size=8, ranks=8, description={"config": config},
                summary={"steps": index}, owner=f"uid:{10_000 + index % OWNERS}"), {})
                for index in range(first, min(first + BATCH, records))])


def daemon_config(folder: Path, ledger: Path) -> Path:
    """Keys both trees know; retention wide enough to keep every record."""
    config = folder / "trainmon.yml"
    config.write_text(
        f"collectors:\n{benchlib.TRAINING_ONLY}"
        "  tencent: {enabled: false}\n"
        f"  training: {{socket: '{folder / 'steps.sock'}'}}\n"
        f"  ledger: {{path: '{ledger}', max_runs: 1000000, max_runs_per_owner: 1000000}}\n")
    return config


def read_everything(url: str, paged: bool, counts: list[int], sizes: list[int],
                    busy: list[int], errors: list[str], index: int) -> None:
    """Every record of ``url``'s ``/api/v1/runs``: one answer, or the pages."""
    http = requests.Session()
    query: dict[str, str] = {"limit": "1000"} if paged else {}
    try:
        while True:
            response = http.get(f"{url}/api/v1/runs", params=query, timeout=600, stream=True)
            if response.status_code == 503 and paged:
                busy[index] += 1
                response.close()
                time.sleep(float(response.headers.get("Retry-After", "1")))
                continue
            if response.status_code != 200:
                errors.append(f"HTTP {response.status_code}")
                return
            size = 0
            records = 0
            for chunk in response.iter_content(1 << 20):  # counted, never kept
                size += len(chunk)
                records += chunk.count(b'"config_hash"')
            sizes[index] = max(sizes[index], size)
            counts[index] += records
            link = response.links.get("next", {}).get("url")
            if not paged or not link:
                return
            query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(link).query))
    except requests.RequestException as error:
        errors.append(str(error)[:200])
    finally:
        http.close()


def ledger_open(url: str, timeout: float = 60.0) -> None:
    """Until ``/healthz`` says the recorder opened the ledger (its first tick done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = requests.get(f"{url}/healthz", timeout=5).json()
        entry = health.get("collectors", health).get("ledger", {})
        if entry.get("open") and entry.get("stored_runs") is not None:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the daemon at {url} did not open its ledger in {timeout:.0f} s")


def measure(side: str, exporter: Path, ledger: Path, folder: Path, clients: int,
            paged: bool) -> Reading:
    folder.mkdir(parents=True)
    copy = folder / "ledger.sqlite3"
    shutil.copyfile(ledger, copy)
    daemon = benchlib.start_trainmon(daemon_config(folder, copy),
                                     env=tree_environment(exporter),
                                     log_path=folder / "trainmon.log")
    try:
        ledger_open(daemon.url)
        baseline = benchlib.memory_kib(daemon.process.pid, "VmRSS")
        counts, sizes, busy = [0] * clients, [0] * clients, [0] * clients
        errors: list[str] = []
        threads = [threading.Thread(target=read_everything,
                                    args=(daemon.url, paged, counts, sizes, busy, errors, i))
                   for i in range(clients)]
        started = time.monotonic()
        with MemoryPeak(daemon.process.pid) as peak:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return Reading(side, baseline, peak.peak_kib, time.monotonic() - started, counts,
                       max(sizes), sum(busy), errors)
    finally:
        daemon.stop()


def table(readings: list[Reading], records: int, clients: int) -> str:
    lines = [f"{clients} clients reading all {records} records (13.5 KB descriptions):", "",
             "| tree | daemon RSS before → peak (MiB) | growth (MiB) | largest answer (MB) "
             "| every record read in (s) | records per client | 503 busy |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for reading in readings:
        growth = (reading.peak_kib - reading.baseline_kib) / 1024
        lines.append(
            f"| {reading.side} | {reading.baseline_kib / 1024:.0f} → "
            f"{reading.peak_kib / 1024:.0f} | {growth:.0f}"
            f" | {reading.largest_answer_bytes / 1e6:.1f} | {reading.seconds:.1f} | "
            f"{', '.join(map(str, reading.records))} | {reading.busy_answers} |"
            + (f" errors: {'; '.join(reading.errors[:3])}" if reading.errors else ""))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=RECORDS)
    parser.add_argument("--clients", type=int, default=CLIENTS)
    parser.add_argument("--before", default=BEFORE_REF,
                        help="the landed commit to compare with ('' for none)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainmon-runs-api-") as temporary:
        root = Path(temporary)
        root.chmod(0o700)
        (root / "source").mkdir(mode=0o700)
        ledger = root / "source" / "ledger.sqlite3"
        build_ledger(ledger, options.records)
        readings: list[Reading] = []
        if options.before:
            with before_tree(options.before) as exporter:
                if exporter is None:
                    print(f"({options.before} not available: the after side only)")
                else:
                    readings.append(measure(f"before ({options.before})", exporter, ledger,
                                            root / "before", options.clients, paged=False))
        readings.append(measure("after", benchlib.ROOT / "exporter", ledger, root / "after",
                                options.clients, paged=True))
    print(table(readings, options.records, options.clients))


if __name__ == "__main__":
    main()
