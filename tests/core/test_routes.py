"""Routes are declared in the collector contract and gathered by the registry.

``Collector.push_routes()`` and ``Collector.get_routes()`` are the one place
a collector says what it serves; ``CollectorRegistry.push_routes()`` /
``get_routes()`` put every collector's routes in one table for the HTTP
server, and a route two collectors claim is a wiring error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from prometheus_client.core import Metric

from trainmon.collectors.ledger import LedgerCollector
from trainmon.collectors.training import TrainingCollector, TrainingConfig
from trainmon.core.collector import Collector
from trainmon.core.registry import CollectorRegistry
from trainmon.core.routes import (
    GetHandler,
    GetRequest,
    JSONResponse,
    PushHandler,
    PushRequest,
    PushResponse,
)
from trainmon.ledger.config import LedgerConfig
from trainmon.ledger.recorder import RunRecorder


class Serving(Collector):
    """A collector that serves the routes it is given."""

    def __init__(self, name: str, *, push: Mapping[str, PushHandler] | None = None,
                 get: Mapping[str, GetHandler] | None = None) -> None:
        self.name = name
        self._push = dict(push or {})
        self._get = dict(get or {})

    def collect(self) -> Iterable[Metric]:
        return []

    def push_routes(self) -> Mapping[str, PushHandler]:
        return self._push

    def get_routes(self) -> Mapping[str, GetHandler]:
        return self._get


def accept(request: PushRequest) -> PushResponse:
    return PushResponse(200, {"accepted": len(request.body)})


def answer(request: GetRequest) -> JSONResponse:
    return JSONResponse(200, {"path": request.path})


class Silent(Collector):
    name = "silent"

    def collect(self) -> Iterable[Metric]:
        return []


def test_the_registry_gathers_every_collectors_routes() -> None:
    registry = CollectorRegistry([
        Serving("a", push={"/api/v1/a": accept}),
        Silent(),  # the contract's defaults: no routes
        Serving("b", get={"/api/v1/b": answer, "/api/v1/b/": answer}),
    ])

    assert registry.push_routes() == {"/api/v1/a": accept}
    assert registry.get_routes() == {"/api/v1/b": answer, "/api/v1/b/": answer}


@pytest.mark.parametrize("kind", ["push", "get"])
def test_a_route_claimed_twice_is_a_wiring_error(kind: str) -> None:
    first = Serving("a", **{kind: {"/api/v1/x": accept if kind == "push" else answer}})
    second = Serving("b", **{kind: {"/api/v1/x": accept if kind == "push" else answer}})
    registry = CollectorRegistry([first, second])

    gather = registry.push_routes if kind == "push" else registry.get_routes
    with pytest.raises(ValueError, match="two collectors claim the route /api/v1/x"):
        gather()


def test_the_daemons_collectors_declare_their_routes(tmp_path: Path) -> None:
    training = TrainingCollector(TrainingConfig(socket=None))
    ledger = LedgerCollector(RunRecorder(LedgerConfig(path=tmp_path / "ledger.sqlite3", node="n"),
                                         training.store, training.storage_of))
    registry = CollectorRegistry([training, ledger])

    assert set(registry.push_routes()) == {"/api/v1/steps"}
    assert set(registry.get_routes()) == {"/api/v1/runs", "/api/v1/runs/"}
    missing = registry.get_routes()["/api/v1/runs/"](GetRequest("/api/v1/runs/r1"))
    assert missing.status == 503  # no ledger file yet: the route answers, not the wiring
