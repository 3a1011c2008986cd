"""``DaemonSource`` reads ``GET /api/v1/runs`` page by page (``trainmon.runs.daemon``),
against a stand-in daemon that answers what a test scripts: it follows the ``Link``
cursor on its own URL only, waits out ``503 busy``, and stops at a repeated cursor."""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from trainmon.ledger import RunRecord
from trainmon.runs.daemon import DaemonError, DaemonSource


def record(run: str) -> dict[str, object]:
    now = time.time()
    return RunRecord(job="bert", run=run, node="node-1", config_hash="sha256:00",
                     started=now, ended=None, end_reason=None, updated=now, world_size=1,
                     ranks=1, owner="uid:1000").to_json()


@dataclass
class Answer:
    status: int
    body: object
    headers: dict[str, str] = field(default_factory=dict)


class ScriptedDaemon(http.server.ThreadingHTTPServer):
    """Answers each GET with the next ``Answer``; keeps the (path, query) asked."""

    def __init__(self, answers: list[Answer]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers = answers
        self.asked: list[tuple[str, dict[str, str]]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ScriptedDaemon

    def do_GET(self) -> None:
        parts = urllib.parse.urlsplit(self.path)
        self.server.asked.append((parts.path, dict(urllib.parse.parse_qsl(parts.query))))
        answer = self.server.answers.pop(0)
        body = json.dumps(answer.body).encode()
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[ScriptedDaemon]:
    server = ScriptedDaemon([])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_pages_are_followed_on_the_daemons_own_url_after_a_busy_answer(
        scripted: ScriptedDaemon) -> None:
    scripted.answers += [
        Answer(503, {"error": "busy", "detail": "retry"}, {"Retry-After": "0"}),
        Answer(200, [record("run-2")],
               {"Link": '<http://elsewhere.example/api/v1/runs?limit=1000&cursor=C1>; '
                        'rel="next"'}),
        Answer(200, [record("run-1")]),
    ]
    waits: list[float] = []
    source = DaemonSource(scripted.url, sleep=waits.append)
    assert [view.run for view in source.runs(job="bert")] == ["run-2", "run-1"]
    assert waits == [0.0]
    assert [query.get("cursor") for _, query in scripted.asked] == [None, None, "C1"]
    assert all(path == "/api/v1/runs" and query["job"] == "bert"
               for path, query in scripted.asked)


def test_a_daemon_that_repeats_a_page_is_not_read_forever(scripted: ScriptedDaemon) -> None:
    again = {"Link": '</api/v1/runs?cursor=SAME>; rel="next"'}
    scripted.answers += [Answer(200, [record("run-1")], again),
                         Answer(200, [record("run-1")], again)]
    with pytest.raises(DaemonError, match="answered a page it had answered before"):
        DaemonSource(scripted.url).runs()


def test_busy_until_the_retries_run_out_is_an_error(scripted: ScriptedDaemon) -> None:
    scripted.answers += [Answer(503, {"error": "busy"}, {"Retry-After": "1"})] * 6
    waits: list[float] = []
    with pytest.raises(DaemonError, match="HTTP 503"):
        DaemonSource(scripted.url, sleep=waits.append).runs()
    assert waits == [1.0] * 5
