"""``trainmon top`` as a command: a bad source or no terminal is a usage error (exit 2)."""

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


def test_a_url_that_does_not_parse_is_a_usage_error() -> None:
    done = subprocess.run([*trainmon_command(), "top", "--url", "http://[bad"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (2, "trainmon top: Invalid IPv6 URL\n")


def test_prometheus_without_a_node_or_a_job_is_a_usage_error() -> None:
    done = subprocess.run([*trainmon_command(), "top", "--prometheus", "127.0.0.1:9"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (
        2, "trainmon top: --prometheus needs --node or --job\n")
