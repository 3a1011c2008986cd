"""The shipped alerting files of the repository, as the tests read them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
VARIANTS = ("dcgm", "tencent-cloud")
ALERTMANAGER_CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"


def rules_path(variant: str) -> Path:
    return REPO / "alerts" / variant / "trainmon.rules.yml"


def shipped_alerts(variant: str) -> list[dict[str, Any]]:
    """Every alerting rule of the variant's shipped rules file."""
    document = yaml.safe_load(rules_path(variant).read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def run_script(script: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run one of the repository's Python tools (``script`` relative to ``cwd``)."""
    return subprocess.run(
        [sys.executable, script, *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )
