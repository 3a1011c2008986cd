"""What the GPU tests share: the fake library and its controls."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

from testkit.prometheus import wait_until
from trainmon.collectors.gpu import GPUCollector


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeNVML:
    """The fake loaded into this process, with its two test controls."""

    library: ctypes.CDLL

    def set_time(self, seconds: float) -> None:
        """Freeze the fake's clock at ``seconds`` (negative: back to real time)."""
        self.library.fakenvml_set_time(ctypes.c_double(seconds))

    def calls(self) -> int:
        """NVML calls made so far."""
        self.library.fakenvml_calls.restype = ctypes.c_ulonglong
        return int(self.library.fakenvml_calls())

    def gpm_counts(self) -> tuple[int, int, int]:
        """GPM sample buffers allocated and freed, and samples taken, so far."""
        counts = []
        for name in ("fakenvml_gpm_allocs", "fakenvml_gpm_frees", "fakenvml_gpm_samples"):
            function = getattr(self.library, name)
            function.restype = ctypes.c_ulonglong
            counts.append(int(function()))
        return counts[0], counts[1], counts[2]

    def gpm_buffers_live(self) -> int:
        """GPM sample buffers allocated and not freed."""
        allocs, frees, _ = self.gpm_counts()
        return allocs - frees


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """``testkit.prometheus.wait_until`` polling every 20 ms (AssertionError after ``timeout`` s)."""
    wait_until(condition, timeout, "the condition", interval=0.02)


def gpus(count: int) -> list[str]:
    """The ``gpu`` labels of a node with ``count`` GPUs: ``"0"`` … ``str(count - 1)``."""
    return [str(index) for index in range(count)]


def start_listening(collector: GPUCollector) -> GPUCollector:
    """Start ``collector`` and wait until its XID listener has registered with the fake
    (an XID the fake's clock passes after this is delivered); ``collector`` back."""
    collector.start()
    wait_for(lambda: collector.xid.state == "listening")
    return collector


def poll_at(fake_nvml: FakeNVML, collector: GPUCollector, *seconds: float) -> None:
    """Take a GPM sample of every GPU at each fake NVML time of ``seconds``."""
    assert collector.gpm is not None
    for second in seconds:
        fake_nvml.set_time(second)
        collector.gpm.poll()
