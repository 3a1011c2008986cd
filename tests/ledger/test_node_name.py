"""The node name in run records: the configured one, the DaemonSet's ``NODE_NAME``
(downward API ``spec.nodeName``, the name Prometheus' ``node`` label carries), the hostname."""

from __future__ import annotations

import pytest

from trainmon.config import parse_config
from trainmon.ledger.config import default_node_name


def hostname() -> str:
    return "ip-10-0-0-7"


def test_node_name_comes_from_the_downward_api_when_set() -> None:
    assert default_node_name({"NODE_NAME": "ip-10-0-0-7.ec2.internal"}, hostname) == \
        "ip-10-0-0-7.ec2.internal"
    assert default_node_name({}, hostname) == "ip-10-0-0-7"


@pytest.mark.parametrize("value", ["", "Node_7", "-gpu", "gpu node", "a" * 254, "gpu\n7"])
def test_a_node_name_kubernetes_would_refuse_is_ignored(value: str) -> None:
    assert default_node_name({"NODE_NAME": value}, hostname) == "ip-10-0-0-7"


def test_the_configured_node_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-3")
    assert parse_config({}).collectors.ledger.node_name == "gpu-node-3"
    configured = parse_config({"collectors": {"ledger": {"node": "gpu-07"}}})
    assert configured.collectors.ledger.node_name == "gpu-07"
