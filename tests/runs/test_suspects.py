"""``trainmon suspects --prometheus URL``: what it prints from a Prometheus HTTP API.

A loopback server answers ``/api/v1/query`` as Prometheus does, from the series the
shipped rules record (``node:trainmon_suspect:reason`` and the per-node series they
compare); the command runs as a process. The end-to-end case, rules evaluated by real
engines over a simulated fleet, is tests/scale/test_suspects.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from testkit.loopback import LoopbackHTTPServer, Reply, Request

MODEL = "NVIDIA H800"


def sample(value: float, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [1700000000.0, str(value)]}


#: Instant query → its result vector. A query not listed answers an empty vector.
ANSWERS: Mapping[str, list[dict[str, Any]]] = {
    "node:trainmon_suspect:reason": [
        sample(0.3, __name__="node:trainmon_suspect:reason", node="gpu-07", reason="gpu_clocks"),
        sample(0.57, __name__="node:trainmon_suspect:reason", node="gpu-07",
               reason="gpu_throttle"),
        sample(1, __name__="node:trainmon_suspect:reason", node="gpu-12", reason="health"),
        # a hostile label: escape sequences never reach the terminal
        sample(2, __name__="node:trainmon_suspect:reason", node="gpu-13\x1b[2J",
               reason="cloud_event"),
    ],
    "node_model:trainmon_gpu_sm_clock:ratio": [
        sample(0.7 if node == "gpu-07" else 1.0, node=node, name=MODEL)
        for node in ("gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07")
    ],
    'trainmon_health_status{node="gpu-12"} > 0': [
        sample(1, node="gpu-12", subsystem="infiniband", device="mlx5_0:1",
               reason="symbol_errors", action="drain"),
    ],
}


def answer(request: Request) -> Reply:
    parsed = urllib.parse.urlparse(request.path)
    if parsed.path != "/api/v1/query":
        return Reply.json({"status": "error", "error": "not found"}, status=404)
    expr = urllib.parse.parse_qs(parsed.query)["query"][0]
    return Reply.json({"status": "success",
                       "data": {"resultType": "vector", "result": ANSWERS.get(expr, [])}})


@pytest.fixture
def prometheus() -> Iterator[LoopbackHTTPServer]:
    with LoopbackHTTPServer(answer) as server:
        yield server


def suspects(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainmon", "suspects", *args],
                          capture_output=True, text=True, timeout=60)


def test_each_suspect_with_its_evidence_and_the_commands(prometheus: LoopbackHTTPServer,
                                                          ) -> None:
    result = suspects("--prometheus", prometheus.url)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("3 suspect node(s) of 5 compared with their peers. Nothing was "
                          "drained"), out
    assert "\x1b" not in out
    lines = out.splitlines()
    node = lines.index("gpu-07")
    assert lines[node + 1] == ("  gpu_clocks           0.3  busy GPUs' SM clock / max clock: "
                               f"0.7, median 1 over 5 nodes of {MODEL}")
    assert lines[node + 2].startswith("  gpu_throttle        0.57")
    assert "infiniband mlx5_0:1 degraded: symbol_errors (action drain)" in out
    assert "sbatch --exclude=gpu-07,gpu-12,gpu-13 …" in out
    assert ("scontrol update NodeName=gpu-07 State=DRAIN "
            "Reason='trainmon: gpu_clocks,gpu_throttle'") in out
    assert "kubectl cordon gpu-12" in out
    assert "kubectl taint nodes gpu-07 trainmon.io/suspect=gpu_clocks:NoSchedule" in out
    assert "kubectl taint nodes gpu-12 trainmon.io/suspect=health:NoSchedule" in out


def test_json_carries_the_same(prometheus: LoopbackHTTPServer) -> None:
    result = suspects("--prometheus", prometheus.url, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [s["node"] for s in report["suspects"]] == ["gpu-07", "gpu-12", "gpu-13"]
    clocks = report["suspects"][0]["reasons"][0]
    assert clocks == {"reason": "gpu_clocks", "deviation": 0.3, "value": 0.7, "median": 1.0,
                      "group": MODEL, "peers": 5, "figure": "busy GPUs' SM clock / max clock"}
    assert report["compared_nodes"] == 5
    assert report["commands"][0] == "--exclude=gpu-07,gpu-12,gpu-13"


def test_no_suspect_says_so() -> None:
    def empty(request: Request) -> Reply:
        return Reply.json({"status": "success", "data": {"resultType": "vector", "result": []}})

    with LoopbackHTTPServer(empty) as server:
        result = suspects("--prometheus", server.url)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ("No suspect node (node:trainmon_suspect:reason is empty; "
                             "0 nodes compared with their peers).\n")


def test_an_unreachable_prometheus_is_a_clear_error() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    result = suspects("--prometheus", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip() == (f"trainmon suspects: cannot reach Prometheus at "
                                     f"http://127.0.0.1:{port}: connection refused")


def test_a_server_that_is_not_prometheus_is_a_clear_error() -> None:
    with LoopbackHTTPServer(lambda request: Reply.text("hello")) as server:
        result = suspects("--prometheus", server.url)
    assert result.returncode == 1
    assert "without JSON: is" in result.stderr and "a Prometheus server?" in result.stderr
