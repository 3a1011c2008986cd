"""Helpers for the training telemetry tests (imported by the test modules of tests/training,
tests/client and tests/security, and by tests/conftest.py).

Exposition parsing is ``testkit.exposition`` (``scrape(collector)``,
``parse(text)``). ``report(**changes)`` builds a valid
protocol v1 report as a dict. ``FakeClock`` is the injected monotonic clock.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.core.routes import PushRequest


class FakeClock:
    """A monotonic clock the test advances by hand (seconds)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def report(**changes: object) -> dict[str, object]:
    """A valid report: 10 steps of 0.2 s each (bucket le=0.25), a third of it data wait."""
    buckets = [0] * STEP_BUCKET_COUNT
    buckets[4] = 10
    base: dict[str, object] = {
        "v": 1,
        "job": "resnet50",
        "rank": 0,
        "local_rank": 0,
        "world_size": 8,
        "gpu": "0",
        "pid": 4242,
        "reporter_id": "a1b2c3d4e5f60718",
        "steps": 10,
        "samples": 320,
        "step_seconds": 2.0,
        "data_wait_seconds": 0.5,
        "phase_seconds": {"comm": 0.25},
        "step_buckets": buckets,
        "dropped_reports": 0,
        "last_step_time": 1_700_000_000.0,
    }
    base.update(changes)
    return base


def line(**changes: object) -> bytes:
    return json.dumps(report(**changes)).encode() + b"\n"


def push(
    body: bytes,
    *,
    loopback: bool = True,
    authorization: str | None = None,
    too_large: bool = False,
    known_user: bool = True,
) -> PushRequest:
    """A push as the server hands it over; from loopback, by this test's own user as
    the kernel would name it (``known_user=False``: a user the kernel did not name)."""
    return PushRequest(
        body=body,
        client_host="127.0.0.1" if loopback else "192.0.2.7",
        is_loopback=loopback,
        authorization=authorization,
        too_large=too_large,
        peer_uid=os.geteuid() if loopback and known_user else None,
    )


def send_datagram(path: Path, payload: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(payload, str(path))
