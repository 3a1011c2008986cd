"""Run a Containerfile's build steps on this machine, without a container engine.

No Docker or Podman engine runs in the test environment, so the image build is
reproduced here: every stage gets a folder standing for its root file system,
``WORKDIR`` and ``COPY`` act inside it, and each ``RUN`` executes unchanged
with ``/bin/sh -c`` in the stage's working directory. That is faithful only
while a ``RUN`` names no absolute path (which would leave the stage folder),
so such a ``RUN`` is refused. The interpreter on ``PATH`` as ``python`` is the
test's own Python, standing in for the base image's.

Supported: ``FROM image [AS name]``, ``WORKDIR``, ``COPY [--from=stage] src…
dest``, ``RUN`` (shell form), ``ENV`` (for later ``RUN`` steps), ``LABEL``,
``USER``, ``EXPOSE``, ``ENTRYPOINT``/``CMD`` (exec form). Anything else fails.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath


class ContainerfileError(ValueError):
    """An instruction this interpreter does not reproduce faithfully."""


@dataclass
class Stage:
    name: str
    root: Path
    workdir: PurePosixPath = field(default_factory=lambda: PurePosixPath("/"))
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    user: str = ""
    runs: list[str] = field(default_factory=list)

    def host_path(self, path: str | PurePosixPath) -> Path:
        """Where a path of this stage's file system lies on this machine."""
        absolute = self.workdir / path
        return self.root / str(absolute).lstrip("/")


def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, arguments = full.partition(" ")
        result.append((keyword.upper(), arguments.strip()))
    return result


def build(containerfile: Path, context: Path, workspace: Path, python: str) -> Stage:
    """Run every stage of ``containerfile``; returns the final stage."""
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    bin_dir = workspace / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(python)
    for keyword, arguments in instructions(containerfile.read_text(encoding="utf-8")):
        if keyword == "FROM":
            words = arguments.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stage = Stage(name, workspace / f"stage-{name}")
            stage.root.mkdir()
            stages[name] = stage
            continue
        if stage is None:
            raise ContainerfileError(f"{keyword} before FROM")
        if keyword == "WORKDIR":
            stage.workdir = stage.workdir / arguments
            stage.host_path(".").mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            _copy(stage, stages, context, shlex.split(arguments))
        elif keyword == "RUN":
            _run(stage, arguments, bin_dir)
        elif keyword == "ENV":
            stage.env.update(_key_values(arguments))
        elif keyword == "ENTRYPOINT":
            stage.entrypoint = json.loads(arguments)
        elif keyword == "CMD":
            stage.cmd = json.loads(arguments)
        elif keyword == "USER":
            stage.user = arguments
        elif keyword in ("LABEL", "EXPOSE"):
            continue
        else:
            raise ContainerfileError(f"unsupported instruction {keyword}")
    if stage is None:
        raise ContainerfileError("no FROM")
    return stage


def _copy(stage: Stage, stages: dict[str, Stage], context: Path, words: list[str]) -> None:
    source_root = context
    source_stage: Stage | None = None
    if words[0].startswith("--from="):
        source_stage = stages[words.pop(0).removeprefix("--from=")]
    if any(word.startswith("--") for word in words):
        raise ContainerfileError(f"unsupported COPY flag in {words}")
    *sources, destination = words
    target = stage.host_path(destination)
    for source in sources:
        if source_stage is not None:
            origin = source_stage.root / source.lstrip("/")
        else:
            origin = source_root / source
        if origin.is_dir():
            shutil.copytree(origin, target, dirs_exist_ok=True, ignore=_ignored)
        else:
            into = target if destination.endswith("/") else target.parent
            into.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, into / origin.name if destination.endswith("/") else target)


def _ignored(_folder: str, names: list[str]) -> set[str]:
    """What the repository's .dockerignore keeps out of an ``exporter/`` copy."""
    return {name for name in names if name == "__pycache__"}


def _run(stage: Stage, command: str, bin_dir: Path) -> None:
    for word in shlex.split(command):
        if re.match(r"^/", word) or re.search(r"[=:]/", word):
            raise ContainerfileError(
                f"RUN names the absolute path {word!r}; it cannot be reproduced outside a "
                "container: use paths relative to WORKDIR"
            )
    stage.runs.append(command)
    env = {**os.environ, **stage.env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    completed = subprocess.run(
        ["/bin/sh", "-c", command],
        cwd=stage.host_path("."),
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    if completed.returncode != 0:
        raise AssertionError(
            f"RUN {command!r} failed ({completed.returncode}):\n{completed.stdout}\n{completed.stderr}"
        )


def _key_values(arguments: str) -> dict[str, str]:
    pairs = {}
    for word in shlex.split(arguments):
        key, _, value = word.partition("=")
        pairs[key] = value
    return pairs


def entrypoint_command(stage: Stage) -> list[str]:
    """The final image's ENTRYPOINT, its program mapped into the stage folder."""
    program, *arguments = stage.entrypoint
    return [str(stage.host_path(program)), *arguments]

