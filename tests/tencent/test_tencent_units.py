"""Small pure parts of the puller: the token bucket, endpoints, label names, periods."""

from __future__ import annotations

import itertools
import threading

import pytest

from trainmon.tencent.catalogue import label_name
from trainmon.tencent.client import CBS, CVM, MONITOR, service_url
from trainmon.tencent.planning import snap_period
from trainmon.tencent.ratelimit import TokenBucket


class VirtualTime:
    """monotonic/sleep pair where sleeping advances a per-thread virtual clock."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.starts: list[float] = []
        self.lock = threading.Lock()

    def monotonic(self) -> float:
        return getattr(self.local, "now", 0.0)

    def sleep(self, seconds: float) -> None:
        self.local.now = self.monotonic() + seconds


def test_token_bucket_never_exceeds_the_rate_in_any_second() -> None:
    virtual = VirtualTime()
    bucket = TokenBucket(15.0, monotonic=virtual.monotonic, sleep=virtual.sleep)

    def worker() -> None:
        for _ in range(50):
            bucket.acquire()
            with virtual.lock:
                virtual.starts.append(virtual.monotonic())

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    starts = sorted(virtual.starts)
    assert len(starts) == 200
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) == pytest.approx(1 / 15)
    assert max(sum(1 for s in starts if t <= s < t + 1.0) for t in starts) <= 16
    assert bucket.waited_seconds > 0


def test_token_bucket_burst_allows_back_to_back_requests() -> None:
    virtual = VirtualTime()
    bucket = TokenBucket(10.0, burst=3, monotonic=virtual.monotonic, sleep=virtual.sleep)
    assert [bucket.acquire() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.acquire() == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("https://monitor.tencentcloudapi.com", "https://cvm.tencentcloudapi.com/"),
        ("https://monitor.internal.tencentcloudapi.com", "https://cvm.internal.tencentcloudapi.com/"),
        ("https://monitor.ap-shanghai.tencentcloudapi.com",
         "https://cvm.ap-shanghai.tencentcloudapi.com/"),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/"),
    ],
)
def test_product_hosts_derive_from_the_monitor_endpoint(endpoint: str, expected: str) -> None:
    assert service_url(endpoint, CVM) == expected
    assert service_url(endpoint, MONITOR) == expected.replace("cvm.", "monitor.")
    assert service_url(endpoint, CBS) == expected.replace("cvm.", "cbs.")


@pytest.mark.parametrize(
    ("dimension", "label"),
    [("InstanceId", "instance_id"), ("diskId", "disk_id"), ("minorNumber", "minor_number"),
     ("vm_uuid", "vm_uuid"), ("unInstanceId", "un_instance_id"), ("GPUIndex", "gpu_index"),
     ("type", "tencent_type"), ("region", "tencent_region"), ("9lives", "d_9lives"),
     ("pci-bus.id", "pci_bus_id")],
)
def test_dimension_names_become_snake_case_labels(dimension: str, label: str) -> None:
    assert label_name(dimension) == label


def test_periods_snap_to_what_the_metric_supports() -> None:
    assert snap_period(60, [10, 60, 300]) == 60
    assert snap_period(30, [10, 60, 300]) == 60
    assert snap_period(10, [60, 300, 3600]) == 60
    assert snap_period(7200, [60, 300, 3600]) == 3600
    assert snap_period(60, []) == 60
