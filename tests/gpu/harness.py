"""What the GPU tests share: the fake library and its controls."""

from __future__ import annotations

import ctypes
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from support.prometheus import wait_until

FAKE_SOURCES = Path(__file__).parent / "fakenvml"


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


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """``support.prometheus.wait_until`` polling every 20 ms (AssertionError after ``timeout`` s)."""
    wait_until(condition, timeout, "the condition", interval=0.02)
