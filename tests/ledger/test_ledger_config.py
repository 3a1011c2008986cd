"""The ``collectors.ledger`` section: defaults, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmon import contract
from trainmon.config import parse_config
from trainmon.paths import default_ledger_path
from trainmon.section import ConfigError


def test_defaults() -> None:
    ledger = parse_config({}).collectors.ledger
    assert ledger.file == default_ledger_path()  # the suite's $STATE_DIRECTORY
    assert default_ledger_path(environ={}, euid=0) == Path("/var/lib/trainmon/ledger.sqlite3")
    assert default_ledger_path(environ={"STATE_DIRECTORY": "/var/lib/x:/var/lib/y"}) == Path(
        "/var/lib/x/ledger.sqlite3")
    assert (ledger.enabled, ledger.retention_days, ledger.max_runs, ledger.flush_seconds) == (
        "auto", 180.0, 10_000, 10.0)
    assert ledger.stall_seconds == contract.LEDGER_STALL_SECONDS
    assert ledger.max_runs_per_owner == 1000
    assert (ledger.price_per_gpu_hour, ledger.currency) == (None, "USD")


def test_a_price_and_currency() -> None:
    ledger = parse_config({"collectors": {"ledger": {
        "path": "/srv/ledger.db", "price_per_gpu_hour": 12, "currency": "CNY",
        "node": "gpu-07"}}}).collectors.ledger
    assert (ledger.file, ledger.price_per_gpu_hour, ledger.currency, ledger.node_name) == (
        Path("/srv/ledger.db"), 12.0, "CNY", "gpu-07")


@pytest.mark.parametrize(("settings", "where", "message"), [
    ({"currency": "dollars"}, "collectors.ledger.currency", "ISO 4217"),
    ({"price_per_gpu_hour": "cheap"}, "collectors.ledger.price_per_gpu_hour", "price"),
    ({"price_per_gpu_hour": -1}, "collectors.ledger.price_per_gpu_hour", "price"),
    ({"flush_seconds": 0}, "collectors.ledger.flush_seconds", ""),
    ({"max_runs": 0}, "collectors.ledger.max_runs", ""),
    ({"max_runs_per_owner": 0}, "collectors.ledger.max_runs_per_owner", ""),
    ({"max_runs_per_owner": 10**8}, "collectors.ledger.max_runs_per_owner", ""),
    ({"max_runs_per_owner": "many"}, "collectors.ledger.max_runs_per_owner", "integer"),
    ({"enabled": "sometimes"}, "collectors.ledger.enabled", "auto"),
    ({"retention": 3}, "collectors.ledger.retention", "unknown key"),
])
def test_errors_name_the_key(settings: dict[str, object], where: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"collectors": {"ledger": settings}})
    assert str(caught.value).startswith(where) and message in str(caught.value)
