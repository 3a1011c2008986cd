"""Fixtures of the ``trainmon doctor`` run-history tests: the daemons doctor reads."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.loopback import LoopbackHTTPServer, Reply, Request
from tests.diagnosis.diagnosis_support import StarvedNode


@pytest.fixture
def daemon_url() -> Iterator[str]:
    """A daemon whose one job, ``vit``, is data-starved (its verdict: storage)."""
    node = StarvedNode()

    def answer(request: Request) -> Reply:
        return Reply(200, node.text(), "text/plain; version=0.0.4")

    with LoopbackHTTPServer(answer) as server:
        yield server.address


@pytest.fixture
def idle_url() -> Iterator[str]:
    """A daemon that sees no GPU and no job (its jobs ended)."""

    def answer(request: Request) -> Reply:
        return Reply.text("# TYPE trainmon_build_info gauge\n"
                          'trainmon_build_info{version="1",mode="real"} 1\n',
                          "text/plain; version=0.0.4")

    with LoopbackHTTPServer(answer) as server:
        yield server.address
