"""Repository paths and process helpers shared by the deployment tests, and the shipped
Prometheus configuration staged as an operator installs it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
VARIANTS = ("dcgm", "tencent-cloud")
DEPLOY = REPO / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
PROMETHEUS = DEPLOY / "prometheus"
ALERTS = REPO / "alerts"
ALERTMANAGER_CONFIG = DEPLOY / "alertmanager" / "alertmanager.yml"


def tool(name: str) -> str:
    """The path of a program that `make test` installs; a missing one fails the test."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run `make test` (it installs the Debian packages)")
    return path


def run(
    command: Sequence[str],
    *,
    cwd: Path = REPO,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    stdin_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion, capturing its output as text."""
    return subprocess.run(
        list(command),
        input=stdin_text,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def shipped_trainmon_configs() -> list[Path]:
    """Every trainmon configuration file the repository ships for operators."""
    return sorted(
        [
            *(DEPLOY / "examples").glob("*.yml"),
            *KUBERNETES.glob("base/*.yml"),
            *KUBERNETES.glob("overlays/*/*.yml"),
        ]
    )


def stage_prometheus(config: Path, folder: Path, variant: str) -> Path:
    """``folder`` laid out like /etc/prometheus: the config, targets/ and rules/.

    Rules are the variant's rule files from ``alerts/`` (files with ``groups``).
    The path of the staged config is what ``testkit.prometheus.Prometheus.start`` runs.
    """
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(config, folder / "prometheus.yml")
    shutil.copytree(PROMETHEUS / "targets", folder / "targets")
    (folder / "rules").mkdir()
    for path in sorted((ALERTS / variant).glob("*.yml")):
        if "groups" in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}):
            shutil.copy(path, folder / "rules" / path.name)
    return folder / "prometheus.yml"
