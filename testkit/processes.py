"""Running the ranks of a job as real processes, side by side."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_all(commands: Sequence[tuple[Sequence[str], Mapping[str, str]]],
            timeout: float) -> list[str]:
    """Start every (command, environment) at once from the repository, wait for all
    (``timeout`` seconds each; the ones still running are killed), assert that every
    one exited 0, and return their outputs (stdout and stderr together)."""
    processes = [subprocess.Popen(list(command), env=dict(environ), cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for command, environ in commands]
    outputs = []
    try:
        for process in processes:
            output, _ = process.communicate(timeout=timeout)
            outputs.append(output.decode(errors="replace"))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-4000:]
    return outputs
