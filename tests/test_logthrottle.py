"""The one rate limit of repeated log lines (``trainmon.logthrottle``)."""

from __future__ import annotations

import subprocess
import sys

from trainmon.logthrottle import LogThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_occurrence_passes_then_repeats_wait_for_the_interval() -> None:
    clock = Clock()
    throttle = LogThrottle(300.0, clock=clock)
    assert throttle.admit("disk") == 0
    clock.now += 299.0
    assert throttle.admit("disk") is None
    assert throttle.admit("disk") is None
    clock.now += 1.0
    assert throttle.admit("disk") == 2  # two were held back since the last line
    assert not throttle.allow("disk")


def test_keys_are_independent() -> None:
    throttle = LogThrottle(300.0, clock=Clock())
    assert throttle.allow(("GetMonitorData", "RequestLimitExceeded"))
    assert throttle.allow(("GetMonitorData", "AuthFailure"))
    assert not throttle.allow(("GetMonitorData", "RequestLimitExceeded"))


def test_a_new_detail_passes_at_once() -> None:
    throttle = LogThrottle(300.0, clock=Clock())
    assert throttle.allow("gpu", "OSError: gone")
    assert not throttle.allow("gpu", "OSError: gone")
    assert throttle.allow("gpu", "TimeoutError: slow")


def test_without_an_interval_each_key_passes_once() -> None:
    clock = Clock()
    throttle = LogThrottle(None, clock=clock)
    assert throttle.allow("/sys/class/net/eth0/speed")
    clock.now += 1e9
    assert not throttle.allow("/sys/class/net/eth0/speed")


def test_forget_reports_whether_something_was_logged() -> None:
    throttle = LogThrottle(300.0, clock=Clock())
    assert throttle.forget("network") is False
    throttle.allow("network")
    assert throttle.forget("network") is True
    assert throttle.allow("network")  # the condition is new again


def test_memory_is_bounded() -> None:
    throttle = LogThrottle(None, clock=Clock(), max_keys=3)
    for key in "abc":
        assert throttle.allow(key)
    assert throttle.allow("d")  # full: everything is forgotten, then d is remembered
    assert throttle.allow("a")
    assert not throttle.allow("d")


def test_importable_with_the_standard_library_only() -> None:
    """``trainmon.client`` uses it inside training processes without the exporter's deps."""
    code = (
        "import sys; sys.modules['prometheus_client'] = None; sys.modules['yaml'] = None\n"
        "import trainmon.logthrottle, trainmon.client.reporter\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
