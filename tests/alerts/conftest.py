"""Fixtures of the alerting tests; the helper modules of this folder become importable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.alerts.alerts_support.bundle import ALERTMANAGER_CONFIG, run_script
from tests.alerts.alerts_support.stack import Alertmanager, WebhookSink


@pytest.fixture
def sink() -> Iterator[WebhookSink]:
    server = WebhookSink().start()
    yield server
    server.stop()


@pytest.fixture
def retargeted_alertmanager_config(tmp_path: Path, sink: WebhookSink) -> Path:
    """The shipped Alertmanager config with every receiver pointed at the sink."""
    output = tmp_path / "alertmanager.yml"
    result = run_script(
        "alerts/retarget_receivers.py", str(ALERTMANAGER_CONFIG), sink.url, str(output)
    )
    assert result.returncode == 0, result.stderr
    return output


@pytest.fixture
def alertmanager(tmp_path: Path, retargeted_alertmanager_config: Path) -> Iterator[Alertmanager]:
    server = Alertmanager(tmp_path).start(retargeted_alertmanager_config)
    yield server
    server.stop()
