"""Helpers of the security tests (imported by the test modules and the conftest): a
real local user, and the type of the ``as_user`` fixture that sends as one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LocalUser:
    name: str
    uid: int
    gid: int


AsUser = Callable[..., list[dict[str, object]]]
