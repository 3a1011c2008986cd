"""Fixtures for the GPU tests: the fake ``libnvidia-ml.so.1`` and its scenarios.

The fake (``fakenvml/``) is compiled once per session by the shared
``fake_nvml_dir``/``old_driver_dir`` fixtures (tests/conftest.py). Subprocess tests load it
the way a user's machine would, through ``LD_LIBRARY_PATH`` (``gpu_env``).
In-process tests cannot change ``LD_LIBRARY_PATH`` after start-up, so
``fake_nvml`` loads the compiled file by path first; the dynamic loader then
answers pynvml's ``CDLL("libnvidia-ml.so.1")`` with it (same soname). Without
``FAKENVML_SCENARIO`` the fake reports "driver not loaded", so other test
folders in the same session still see a machine without a usable GPU.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from testkit import exposition
from testkit.exposition import Scrape
from tests.gpu.gpu_support import Clock, FakeNVML
from trainmon.collectors.gpu import GPUCollector, GPUConfig
from trainmon.core.collector import Collector
from trainmon.gpu.nvml import NVML


@pytest.fixture(scope="session")
def fake_nvml(fake_nvml_dir: Path) -> FakeNVML:
    loaded = pynvml.nvmlLib
    path = fake_nvml_dir / "libnvidia-ml.so.1"
    if loaded is not None and getattr(loaded, "_name", None) != str(path):
        pytest.skip("a real NVML library is already loaded in this process")
    return FakeNVML(ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL))


@pytest.fixture
def scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_nvml: FakeNVML
) -> Iterator[Callable[[str], Path]]:
    """``scenario(text)`` makes the in-process fake follow ``text`` (fake time 0)."""

    def use(text: str) -> Path:
        path = tmp_path / f"scenario-{len(list(tmp_path.glob('scenario-*')))}.txt"
        path.write_text(text)
        monkeypatch.setenv("FAKENVML_SCENARIO", str(path))
        fake_nvml.set_time(0.0)
        return path

    yield use
    fake_nvml.set_time(-1.0)


@pytest.fixture
def gpu_env(fake_nvml_dir: Path, tmp_path: Path) -> Callable[..., dict[str, str]]:
    """``gpu_env(text, library_dir=None)``: environment for a subprocess on the fake."""

    def environment(text: str, library_dir: Path | None = None) -> dict[str, str]:
        path = tmp_path / "scenario.txt"
        path.write_text(text)
        return {
            "LD_LIBRARY_PATH": str(library_dir or fake_nvml_dir),
            "FAKENVML_SCENARIO": str(path),
        }

    return environment


@pytest.fixture
def scrape() -> Callable[[Collector], Scrape]:
    return exposition.scrape


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_collector(clock: Clock) -> Iterator[Callable[..., GPUCollector]]:
    """``make_collector(**gpu_settings)``: a GPU collector on the fake, on the test's clock."""
    collectors: list[GPUCollector] = []

    def make(**settings: Any) -> GPUCollector:
        config = dataclasses.replace(GPUConfig(retry_seconds=5.0), **settings)
        nvml = NVML(retry_seconds=config.retry_seconds, clock=clock)
        collector = GPUCollector(nvml, config, clock=clock)
        collectors.append(collector)
        return collector

    yield make
    for collector in collectors:
        collector.stop()


@pytest.fixture
def live(fake_nvml: FakeNVML) -> Callable[[], int]:
    """Buffers this test holds: allocated since it began and not freed."""
    before = fake_nvml.gpm_buffers_live()
    return lambda: fake_nvml.gpm_buffers_live() - before
