"""Helpers of the security tests (imported by the test modules and the conftest): a
real local user, the type of the ``as_user`` fixture that sends as one, and a Python
interpreter such a user may run."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class LocalUser:
    name: str
    uid: int
    gid: int


AsUser = Callable[..., list[dict[str, object]]]


def python_for_everyone() -> str:
    """A Python interpreter other local users may run (the suite's own may sit in /root)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        path = Path(candidate)
        if path.exists() and all(os.stat(parent).st_mode & 0o001
                                 for parent in path.resolve().parents):
            return candidate
    pytest.skip("no Python interpreter that other local users can run")
