"""``GET /api/v1/runs`` a page at a time (``trainmon.ledger.api``): every record on
exactly one page, in order, whatever is inserted between pages; ``limit`` and the
body cap; a cursor that is not ours refused; at most two requests at once; and
``trainmon runs`` following the cursor through a real daemon."""

from __future__ import annotations

import json
import os
import queue
import sqlite3
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.daemon import Daemon, trainmon_command
from trainmon.core.routes import GetRequest, JSONResponse
from trainmon.ledger import RunRecord
from trainmon.ledger.api import DEFAULT_LIMIT, MAX_BODY_BYTES, MAX_LIMIT, RUNS_PATH, RunsAPI
from trainmon.ledger.store import Ledger, RecordUpdate

NOW = time.time()


def record(index: int, *, started: float | None = None, job: str = "bert", run: str = "",
           padding: int = 0, owner: str = "uid:1000") -> RunRecord:
    """Run ``index``; ten runs share each start time (ties broken by run id, job, node)."""
    return RunRecord(
        job=job, run=run or f"run-{index:05d}", node="node-1",
        config_hash="sha256:0000000000000000",
        started=NOW - 86_400 + index // 10 if started is None else started,
        ended=None, end_reason=None, updated=NOW, world_size=1, ranks=1,
        description={"config": {f"key{k}": "x" * 250 for k in range(padding)}},
        summary={"steps": index}, owner=owner)


def write(path: Path, records: list[RunRecord]) -> None:
    with Ledger.open(path, readonly=False) as ledger:
        ledger.write([RecordUpdate(item, {}) for item in records])


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite3"


def key(item: dict[str, object]) -> tuple[object, ...]:
    return item["started"], item["run"], item["job"], item["node"]


def next_query(response: JSONResponse, path: str = RUNS_PATH) -> dict[str, str] | None:
    """The query of the ``Link: <...>; rel="next"`` URL (on ``path``), None on the last
    page."""
    link = response.headers.get("Link")
    if link is None:
        return None
    url, relation = link.split(";", 1)
    assert relation.strip() == 'rel="next"'
    parts = urllib.parse.urlsplit(url.strip("<>"))
    assert parts.path == path
    return dict(urllib.parse.parse_qsl(parts.query))


def pages(api: RunsAPI, query: dict[str, str] | None = None,
          between: Callable[[int], None] = lambda _: None) -> Iterator[JSONResponse]:
    """Every page from the first, ``between(n)`` after the n-th."""
    current: dict[str, str] | None = dict(query or {})
    number = 0
    while current is not None:
        response = api.handle_runs(GetRequest(RUNS_PATH, current))
        assert response.status == 200, response.encoded()
        yield response
        number += 1
        between(number)
        current = next_query(response)


def body(response: JSONResponse) -> list[dict[str, object]]:
    listed: list[dict[str, object]] = json.loads(response.encoded())
    return listed


def test_pages_hold_every_record_once_in_order(ledger_path: Path) -> None:
    write(ledger_path, [record(index) for index in range(1_050)])
    api = RunsAPI(ledger_path)
    answers = list(pages(api))
    assert [len(body(page)) for page in answers] == [DEFAULT_LIMIT] * 10 + [50]
    listed = [item for page in answers for item in body(page)]
    with Ledger.open(ledger_path) as ledger:
        assert listed == [item.to_json() for item in ledger.runs()]
    assert sorted(map(key, listed), reverse=True) == list(map(key, listed))
    assert len(set(map(key, listed))) == 1_050


def test_inserts_between_pages_neither_repeat_nor_push_out_records(ledger_path: Path) -> None:
    present = [record(index) for index in range(500)]
    write(ledger_path, present)
    api = RunsAPI(ledger_path)

    newer: set[str] = set()

    def insert(page: int) -> None:  # after each page: a newer run, and one among the old
        newer.add(record(10_000 + page).run)
        write(ledger_path, [record(10_000 + page),
                            record(20_000 + page, started=NOW - 86_400 + 25.0)])

    listed = [key(item) for page in pages(api, {"limit": "60"}, insert) for item in body(page)]
    assert len(listed) == len(set(listed))  # nothing twice
    assert {(r.started, r.run, r.job, r.node) for r in present} <= set(listed)
    assert newer and not newer & {run for _, run, _, _ in listed}  # ahead of every cursor


def test_limit_is_bounded_and_counted(ledger_path: Path) -> None:
    write(ledger_path, [record(index) for index in range(1_200)])
    api = RunsAPI(ledger_path)
    first = api.handle_runs(GetRequest(RUNS_PATH, {"limit": "5000"}))
    following = next_query(first)
    assert len(body(first)) == MAX_LIMIT
    assert following is not None and following["limit"] == str(MAX_LIMIT)
    assert api.counts().cut["max_limit"] == 1
    for bad in ("0", "-3", "ten", "1e3"):
        refused = api.handle_runs(GetRequest(RUNS_PATH, {"limit": bad}))
        assert refused.status == 400 and refused.body == {
            "error": "invalid_query", "detail": f"limit must be a whole number from 1 to {MAX_LIMIT}"}
    assert api.counts().refused["invalid_query"] == 4


def test_a_page_stops_at_the_body_cap(ledger_path: Path) -> None:
    write(ledger_path, [record(index, padding=64) for index in range(300)])  # ~17 KB each
    api = RunsAPI(ledger_path)
    answers = list(pages(api, {"limit": str(MAX_LIMIT), "job": "bert"}))
    sizes = [len(page.encoded()) for page in answers]
    assert len(answers) >= 3 and max(sizes) <= MAX_BODY_BYTES
    assert sum(len(body(page)) for page in answers) == 300
    assert api.counts().cut["max_body_bytes"] == len(answers) - 1
    assert all((next_query(page) or {}).get("job") == "bert" for page in answers[:-1])


def test_a_cursor_that_is_not_ours_is_refused(ledger_path: Path) -> None:
    write(ledger_path, [record(index) for index in range(3)])
    api = RunsAPI(ledger_path)
    for cursor in ("nope", "WyJhIl0", "e30", "W251bGwsIiIsIiIsIiJd", "A" * 5000):
        refused = api.handle_runs(GetRequest(RUNS_PATH, {"cursor": cursor}))
        assert refused.status == 400, cursor
    assert api.counts().refused["invalid_query"] == 5


def test_one_run_is_paged_the_same_way(ledger_path: Path) -> None:
    write(ledger_path, [record(index, job=f"job-{index:03d}", run="shared")
                        for index in range(150)])
    api = RunsAPI(ledger_path)
    path = f"{RUNS_PATH}/shared"
    first = api.handle_run(GetRequest(path, {}))
    following = next_query(first, path)
    assert following is not None and len(body(first)) == DEFAULT_LIMIT
    second = api.handle_run(GetRequest(path, following))
    assert len(body(second)) == 50 and next_query(second, path) is None
    assert {item["job"] for item in body(first) + body(second)} == \
        {f"job-{index:03d}" for index in range(150)}
    assert api.handle_run(GetRequest(f"{RUNS_PATH}/absent", {})).status == 404


def test_at_most_two_requests_are_answered_at_once(ledger_path: Path) -> None:
    """Four requests at once while the file is locked: the two admitted wait for the lock
    (SQLite's busy timeout), the other two are answered 503 busy at once; once the lock
    goes, the two admitted are answered."""
    write(ledger_path, [record(index) for index in range(10)])
    api = RunsAPI(ledger_path)
    holder = sqlite3.connect(ledger_path, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    answers: queue.Queue[JSONResponse] = queue.Queue()
    start = threading.Barrier(4)

    def ask() -> None:
        start.wait()
        answers.put(api.handle_runs(GetRequest(RUNS_PATH, {})))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        early = [answers.get(timeout=4), answers.get(timeout=4)]
    finally:
        holder.close()  # the lock goes: the admitted two read
    for thread in threads:
        thread.join(timeout=30)
    late = [answers.get_nowait(), answers.get_nowait()]
    assert [(answer.status, json.loads(answer.encoded())["error"], answer.headers["Retry-After"])
            for answer in early] == [(503, "busy", "1")] * 2
    assert [len(body(a)) for a in late] == [10, 10]
    assert api.counts().refused["busy"] == 2


def test_runs_follows_the_cursor_through_a_real_daemon(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"  # four owners: each within max_runs_per_owner
    write(path, [record(index, owner=f"uid:{1000 + index % 4}") for index in range(2_345)])
    daemon = start_daemon({"collectors": {"ledger": {"path": str(path)},
                                          "gpu": {"enabled": False}}})
    status, first = daemon.get("/api/v1/runs")
    assert status == 200 and len(json.loads(first)) == DEFAULT_LIMIT
    kept = {name: value for name, value in os.environ.items() if not name.startswith("TRAINMON_")}
    done = subprocess.run([*trainmon_command(), "runs", "--json", "--url", daemon.url],
                          env=kept, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    runs = [run["run"] for run in json.loads(done.stdout)["runs"]]
    assert len(runs) == len(set(runs)) == 2_345
    assert runs[0] == "run-02344" and runs[-1] == "run-00000"
