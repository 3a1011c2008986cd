"""The shipped alerting files of the repository, as the tests read them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from testkit.prometheus import Prometheus

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


def scrape_with_scaled_rules(prometheus: Prometheus, port: int, folder: Path,
                             factor: float, variant: str = "dcgm") -> None:
    """Start ``prometheus`` scraping the daemon on ``port`` every second (``honor_labels``,
    ``node="node-a"``) with the variant's shipped rules time-scaled by ``factor``
    (``alerts/generate.py scale``), evaluated every second."""
    scaled_rules = folder / "trainmon.rules.yml"
    scaled = run_script("alerts/generate.py", "scale", "--factor", str(factor),
                        str(rules_path(variant)), str(scaled_rules))
    assert scaled.returncode == 0, scaled.stderr
    prometheus.start({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(scaled_rules)],
        "scrape_configs": [{
            "job_name": "trainmon",
            "honor_labels": True,
            "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": {"node": "node-a"}}],
        }],
    })
