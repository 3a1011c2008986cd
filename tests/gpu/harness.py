"""What the GPU tests share: the fake library's controls and exposition parsing."""

from __future__ import annotations

import ctypes
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.base import Collector

FAKE_SOURCES = Path(__file__).parent / "fakenvml"
Labels = tuple[tuple[str, str], ...]


def load_builder() -> ModuleType:
    """``fakenvml/build.py`` as a module (it is also a script)."""
    spec = importlib.util.spec_from_file_location("fakenvml_build", FAKE_SOURCES / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


@dataclass(frozen=True)
class Scrape:
    """One rendering of /metrics: ``# TYPE`` lines and every sample."""

    text: str
    types: dict[str, str]
    samples: dict[str, dict[Labels, float]]

    def by_gpu(self, name: str, **labels: str) -> dict[str, float]:
        """Samples of ``name`` (with the extra ``labels``) keyed by their ``gpu`` label."""
        result = {}
        for key, value in self.samples.get(name, {}).items():
            mapping = dict(key)
            if all(mapping.get(k) == v for k, v in labels.items()):
                result[mapping["gpu"]] = value
        return result


def parse(text: str) -> Scrape:
    """Exposition text → Scrape; every family must have a non-empty HELP."""
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line.startswith("# HELP "):
            assert line.split(" ", 3)[3].strip(), line
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            series = samples.setdefault(sample.name, {})
            key = tuple(sorted(sample.labels.items()))
            assert key not in series, f"duplicate {sample.name}{sample.labels}"
            series[key] = sample.value
    return Scrape(text, types, samples)


def render(collector: Collector) -> Scrape:
    """``collector`` alone in a registry, rendered as Prometheus would receive it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return parse(generate_latest(registry).decode())


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
