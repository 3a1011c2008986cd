"""Run descriptions in the training store and their series; the JSON read routes of the
HTTP server."""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import bcrypt
import pytest

from testkit.exposition import scrape
from tests.ledger.ledger_support import Clocks, description, send, step
from trainmon.collectors.training import TrainingCollector, TrainingConfig
from trainmon.core.registry import CollectorRegistry
from trainmon.core.routes import GetRequest, JSONResponse
from trainmon.http.listen import HTTPConfig, ListenAddress
from trainmon.http.server import ExporterHTTPServer
from trainmon.http.webconfig import WebConfig


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def training(clocks: Clocks) -> Iterator[TrainingCollector]:
    collector = TrainingCollector(TrainingConfig(socket=None, ttl_seconds=60.0),
                                  clock=lambda: clocks.monotonic, wall_clock=lambda: clocks.wall)
    collector.start()
    yield collector
    collector.stop()


def test_a_run_is_one_series_however_many_ranks_describe_it(training: TrainingCollector) -> None:
    send(training,
         description(rank=0, world_size=2, started=1_700_000_010.0),
         description(rank=1, world_size=2, started=1_700_000_005.0,
                     reporter_id="b1b2c3d4e5f60718"),
         description(job="bert", run="run-x", config={}),
         step(5, world_size=2))
    exposition = scrape(training)
    hash_a = description()["config_hash"]
    assert exposition.series("trainmon_training_run_info", "job", "owner", "run",
                             "config_hash") == {
        ("resnet50", "local", "run-a", hash_a): 1.0,
        ("bert", "local", "run-x", description(config={})["config_hash"]): 1.0,
    }
    assert exposition.value("trainmon_training_run_start_timestamp_seconds",
                            job="resnet50", run="run-a") == 1_700_000_005.0
    assert exposition.value("trainmon_training_reports_total", transport="http") == 4.0
    [view] = training.store.snapshot().ranks
    assert view.run == "run-a"


def test_an_ended_or_expired_run_is_no_longer_live(training: TrainingCollector,
                                                   clocks: Clocks) -> None:
    send(training, description(), description(job="bert", run="run-x"))
    send(training, description(ended="finished"))
    runs = scrape(training).labelsets("trainmon_training_run_info")
    assert [labels["run"] for labels in runs] == ["run-x"]
    clocks.advance(61)
    assert scrape(training).labelsets("trainmon_training_run_info") == []
    assert training.store.snapshot().descriptions == {}


def records(request: GetRequest) -> JSONResponse:
    return JSONResponse(200, [{"path": request.path, "query": dict(request.query)}])


@pytest.fixture
def server() -> Iterator[ExporterHTTPServer]:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))
    registry = CollectorRegistry([])
    running = ExporterHTTPServer(
        ListenAddress("127.0.0.1", 0), registry, HTTPConfig(),
        WebConfig(basic_auth_users={"admin": hashed}),
        get_routes={"/api/v1/runs": records, "/api/v1/runs/": records})
    threading.Thread(target=running.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    yield running
    running.shutdown()
    running.server_close()


def get(server: ExporterHTTPServer, path: str, *, method: str = "GET",
        auth: bool = True) -> tuple[int, str]:
    headers = {"Authorization": "Basic " + base64.b64encode(b"admin:pw").decode()} if auth else {}
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", headers=headers,
                                     method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_json_routes_match_exactly_or_below_a_prefix(server: ExporterHTTPServer) -> None:
    status, body = get(server, "/api/v1/runs?job=bert&since=5")
    assert status == 200
    assert json.loads(body) == [{"path": "/api/v1/runs", "query": {"job": "bert", "since": "5"}}]
    status, body = get(server, "/api/v1/runs/run%3A7")
    assert status == 200 and json.loads(body)[0]["path"] == "/api/v1/runs/run:7"
    assert get(server, "/api/v1/runsx")[0] == 404


def test_json_routes_need_the_scrape_credentials_and_refuse_posts(
        server: ExporterHTTPServer) -> None:
    assert get(server, "/api/v1/runs", auth=False)[0] == 401
    assert get(server, "/api/v1/runs", method="POST")[0] == 405
