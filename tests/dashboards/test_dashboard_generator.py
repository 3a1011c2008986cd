"""The committed dashboard JSON and panel reference are what ``python -m dashboards`` generates."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.dashboard_files import DASHBOARDS, KINDS, REPO, VARIANTS

DOCS = REPO / "docs" / "dashboards.md"

pytest.importorskip("grafana_foundation_sdk", reason="the generator needs grafana-foundation-sdk")


def _generator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dashboards", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )


def test_committed_json_matches_the_generator() -> None:
    result = _generator("--check")
    assert result.returncode == 0, result.stderr
    assert f"{len(VARIANTS) * len(KINDS)} dashboards and their panel reference up to date" \
        in result.stdout


def test_regenerating_writes_the_committed_files_byte_for_byte(tmp_path: Path) -> None:
    docs = tmp_path / "dashboards.md"
    docs.write_text(DOCS.read_text(encoding="utf-8").replace("| `percentunit` |", "| `%` |"),
                    encoding="utf-8")
    result = _generator("--out", str(tmp_path), "--docs", str(docs))
    assert result.returncode == 0, result.stderr
    assert docs.read_bytes() == DOCS.read_bytes()
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.json"))
    assert written == sorted(Path(v) / f"{k}.json" for v in VARIANTS for k in KINDS)
    for relative in written:
        assert (tmp_path / relative).read_bytes() == (DASHBOARDS / relative).read_bytes()
        json.loads((tmp_path / relative).read_text(encoding="utf-8"))


def test_check_names_every_drifted_missing_or_stray_file(tmp_path: Path) -> None:
    for variant in VARIANTS:
        shutil.copytree(DASHBOARDS / variant, tmp_path / variant)
    edited = tmp_path / "dcgm" / "node.json"
    model = json.loads(edited.read_text(encoding="utf-8"))
    model["panels"][1]["title"] = "edited by hand"
    edited.write_text(json.dumps(model, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (tmp_path / "tencent-cloud" / "fleet.json").unlink()
    (tmp_path / "dcgm" / "old.json").write_text("{}", encoding="utf-8")
    docs = tmp_path / "dashboards.md"
    docs.write_text(DOCS.read_text(encoding="utf-8").replace("Bottleneck verdict", "Verdict"),
                    encoding="utf-8")

    result = _generator("--check", "--out", str(tmp_path), "--docs", str(docs))

    assert result.returncode == 1
    assert f"{edited}: differs" in result.stderr
    assert f"{tmp_path / 'tencent-cloud' / 'fleet.json'}: missing" in result.stderr
    assert f"{tmp_path / 'dcgm' / 'old.json'}: not produced by the generator" in result.stderr
    assert f"{docs}: the panel reference differs" in result.stderr
