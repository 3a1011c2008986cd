"""Where the bundle's parts live in the repository, shared by the deploy tools.

The two bundle variants (docs/architecture.md) each have rules in ``alerts/<variant>/``,
a Prometheus configuration ``deploy/prometheus/prometheus-<variant>.yml`` and
a Kubernetes overlay ``deploy/kubernetes/overlays/<variant>/``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("dcgm", "tencent-cloud")
ALERTS_DIR = REPO_ROOT / "alerts"
PROMETHEUS_DIR = REPO_ROOT / "deploy" / "prometheus"
KUBERNETES_DIR = REPO_ROOT / "deploy" / "kubernetes"
ALERTMANAGER_CONFIG = REPO_ROOT / "deploy" / "alertmanager" / "alertmanager.yml"


class BundleError(ValueError):
    """A part of the bundle is missing or not what the tools expect."""


def prometheus_config(variant: str) -> Path:
    """The shipped Prometheus configuration of ``variant`` (static targets)."""
    return PROMETHEUS_DIR / f"prometheus-{variant}.yml"


def rule_files(variant: str, alerts_dir: Path = ALERTS_DIR) -> list[Path]:
    """The Prometheus rule files of ``variant``, sorted by name.

    Every ``alerts/<variant>/*.yml`` whose top level has a ``groups`` list is a
    rule file; anything else there (a promtool test file, say) is not.
    """
    folder = alerts_dir / variant
    if not folder.is_dir():
        raise BundleError(f"{folder} does not exist: no rules for the {variant} variant")
    return [path for path in sorted(folder.glob("*.yml")) if _is_rule_file(path)]


def rule_groups(variant: str, alerts_dir: Path = ALERTS_DIR) -> list[dict[str, Any]]:
    """Every rule group of ``variant``, in file order then group order."""
    groups: list[dict[str, Any]] = []
    for path in rule_files(variant, alerts_dir):
        groups.extend(_load_mapping(path)["groups"])
    return groups


def _is_rule_file(path: Path) -> bool:
    document = _load_mapping(path)
    return isinstance(document.get("groups"), list)


def _load_mapping(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise BundleError(f"cannot read {path}: {error}") from None
    return document if isinstance(document, dict) else {}


def write_or_check(outputs: Mapping[Path, str], *, check: bool, source: str) -> int:
    """Write each generated file whose text changed, or with ``check`` only list them.

    ``source`` names what the files are generated from, for the message. Returns the
    exit status of a generator: 0 written or up to date, 1 stale (``check``).
    """
    stale: list[Path] = []
    for path, text in outputs.items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        names = ", ".join(str(path) for path in stale)
        print(f"stale: {names} differ(s) from {source}; run `make generate`", file=sys.stderr)
        return 1
    return 0
