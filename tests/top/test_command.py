"""``trainmon top`` as a command: it needs a terminal, and says so (exit 2) without one."""

from __future__ import annotations

import subprocess

from testkit.daemon import trainmon_command


def test_without_a_terminal_top_says_it_needs_one_and_exits_2() -> None:
    done = subprocess.run([*trainmon_command(), "top", "--url", "127.0.0.1:9"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("trainmon top: needs a terminal (for a one-shot report: "
                           "trainmon doctor)\n")
    assert done.stdout == ""
