"""``connection_budget``: ``http.max_connections`` fitted under the open-file limit.

Each case runs in a child process whose limits it sets (``preexec_fn``), so this
test process keeps its own.
"""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

PROBE = """
import logging, resource
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from trainmon.http.limits import connection_budget
print(connection_budget(1024), *resource.getrlimit(resource.RLIMIT_NOFILE))
"""


def budget_under(soft: int, hard: int) -> tuple[list[int], str]:
    """(the budget, then the soft and hard limits after it) in a child started under
    ``soft``/``hard``; and what it logged."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
    return [int(value) for value in done.stdout.split()], done.stderr


def test_the_soft_limit_is_raised_where_the_hard_one_allows() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024 + 256:
        pytest.skip(f"the hard limit here is {hard}")
    (budget, soft_after, _), logged = budget_under(256, hard)
    assert (budget, soft_after) == (1024, 1024 + 256)
    assert logged == ""


def test_a_low_hard_limit_lowers_the_cap_and_says_so() -> None:
    (budget, soft_after, hard_after), logged = budget_under(200, 200)
    assert (budget, soft_after, hard_after) == (150, 200, 200)  # a quarter kept for the rest
    assert "http.max_connections lowered from 1024 to 150: the open-file limit is 200" in logged
