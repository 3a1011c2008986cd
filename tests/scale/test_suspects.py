"""Planted bad nodes among healthy peers, named by the shipped suspect rules on both engines.

64 simulated nodes (``bench/fleet_sim.py``, derived from a real ``trainmon serve --demo``;
counters vary ±20 % and gauges ±10 % per node), 2 of them planted bad by the seed: one
with its GPUs clocked 30 % low under power throttling and its ranks' steps 1.5 × as long,
one with a port counting InfiniBand symbol errors and its InfiniBand subsystem degraded.
Every node is scraped every second by one vmagent into VictoriaMetrics (rules on
vmalert) and by Prometheus, both from the shipped scrape configs, with the shipped
``alerts/dcgm`` rules time-scaled by 0.025 (``alerts/generate.py scale``: 10 min windows
become 15 s, the suspects' one-minute groups run every 1.5 s; a job's node is compared
once it has run there 15 s). Checked: on both engines
``node:trainmon_suspect:reason`` names exactly the planted nodes with the reasons the
simulator planted, and no healthy node once the windows are full, twice 10 s apart; ``trainmon suspects
--prometheus`` prints both with the commands that exclude them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
import yaml

from alerts.generate import main as generate
from bench import fleet_scale, fleet_sim

pytestmark = pytest.mark.integration

NODES = 64
BAD = 2
#: Shipped durations × this: 10 min windows → 15 s, 1 min groups → 1.5 s (a 15 s window
#: of 1 s scrapes still holds 20-60 steps of each simulated rank: ±1 step is within 5 %).
FACTOR = 0.025
INTERVAL_SECONDS = 1.0
DEADLINE_SECONDS = 150.0
#: Two scaled windows (2 × 15 s) after an engine's first suspect record: its windows are full.
WARMUP_SECONDS = 30.0
#: After the planted nodes are named: still exactly them this much later.
RECHECK_SECONDS = 10.0
REPO = Path(__file__).resolve().parents[2]


#: The rule groups under test, and the families the layout of a fleet reads (its jobs, region).
SUSPECT_GROUPS = "trainmon-suspects"
LAYOUT_FAMILIES = frozenset({"trainmon_training_rank_info", "trainmon_node_info"})
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def families_read(rule_files: Sequence[Path], prefix: str) -> frozenset[str]:
    """Every name the groups named ``prefix…`` read, through the recording rules they read
    (any group's): series names, with some words of PromQL among them."""
    groups = [group for path in rule_files for group in yaml.safe_load(path.read_text())["groups"]]
    recorded: dict[str, list[str]] = {}
    for group in groups:
        for rule in group["rules"]:
            if "record" in rule:
                recorded.setdefault(rule["record"], []).append(rule["expr"])
    todo = [rule["expr"] for group in groups if group["name"].startswith(prefix)
            for rule in group["rules"]]
    names: set[str] = set()
    while todo:
        for name in NAME.findall(todo.pop()):
            if name in recorded and name not in names:
                todo.extend(recorded[name])
            names.add(name)
    return frozenset(names - recorded.keys())


def served(templates: Mapping[str, fleet_sim.Template],
           names: frozenset[str]) -> dict[str, fleet_sim.Template]:
    """Each template with only the families that have a sample named in ``names``."""
    return {source: fleet_sim.Template(
        tuple(family for family in template.families
              if any(sample.name in names for sample in family.samples)), template.captured)
        for source, template in templates.items()}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fleet_templates: Path,
          ) -> Iterator[tuple[fleet_scale.Stack, fleet_sim.Fleet]]:
    workdir = tmp_path_factory.mktemp("suspects")
    scaled = workdir / "scaled-rules"
    scaled.mkdir()
    for path in fleet_scale.RULE_FILES:
        assert generate(["scale", "--factor", str(FACTOR), str(path),
                         str(scaled / path.name)]) == 0
    # the nodes serve what the suspect rules read (the layout's families too), not all of
    # the demo's: the engines ingest a sixth as much and the machine's other tests keep
    # their CPU; the simulator process builds the same fleet from the same file and seed
    templates = workdir / "templates.json"
    read = families_read(sorted(scaled.glob("*.yml")), SUSPECT_GROUPS) | LAYOUT_FAMILIES
    fleet_sim.save_templates(served(fleet_sim.load_templates(fleet_templates), read), templates)
    fleet = fleet_sim.Fleet(fleet_sim.load_templates(templates), NODES, bad=BAD)
    assert len(fleet.planted) == BAD
    with fleet_scale.fleet_stack(
            workdir, templates, NODES, interval=INTERVAL_SECONDS, evaluation=INTERVAL_SECONDS,
            shards=1, max_seconds=600, rule_files=sorted(scaled.glob("*.yml")),
            bad=BAD) as running:
        yield running, fleet


def suspects(stack: fleet_scale.Stack, engine: str) -> dict[str, frozenset[str]]:
    """Node → its recorded suspect reasons, on ``engine``."""
    found: dict[str, set[str]] = {}
    try:
        rows = stack.engine(engine).query("node:trainmon_suspect:reason")
    except fleet_scale.TRANSIENT:
        return {}
    for row in rows:
        found.setdefault(row["metric"]["node"], set()).add(row["metric"]["reason"])
    return {node: frozenset(reasons) for node, reasons in found.items()}


def test_exactly_the_planted_nodes_are_suspects_on_both_engines(
    stack: tuple[fleet_scale.Stack, fleet_sim.Fleet],
) -> None:
    running, fleet = stack
    assert {"gpu_clocks", "gpu_throttle", "step_time"} in fleet.planted.values()
    assert {"network_errors", "health"} in fleet.planted.values()
    deadline = time.monotonic() + DEADLINE_SECONDS
    seen: dict[str, dict[str, frozenset[str]]] = {}
    first: dict[str, float] = {}  # engine → when it first recorded any suspect
    while time.monotonic() < deadline:
        seen = {engine: suspects(running, engine) for engine in running.engines}
        if all(found == fleet.planted for found in seen.values()):
            break
        # a healthy node is never named once the engine's windows have filled (within
        # the first windows, the alert's 10-minute hold, scaled, is what guards a page)
        for engine, found in seen.items():
            if found:
                first.setdefault(engine, time.monotonic())
            if time.monotonic() - first.get(engine, time.monotonic()) > WARMUP_SECONDS:
                healthy = {n: r for n, r in found.items() if n not in fleet.planted}
                assert not healthy, (engine, healthy)
        time.sleep(1.0)
    assert seen == {engine: fleet.planted for engine in running.engines}
    time.sleep(RECHECK_SECONDS)
    for engine in running.engines:
        assert suspects(running, engine) == fleet.planted, engine


def test_trainmon_suspects_prints_them_with_the_commands(
    stack: tuple[fleet_scale.Stack, fleet_sim.Fleet],
) -> None:
    running, fleet = stack
    prometheus = running.engine("prometheus")
    deadline = time.monotonic() + DEADLINE_SECONDS
    while suspects(running, "prometheus") != fleet.planted and time.monotonic() < deadline:
        time.sleep(1.0)
    result = subprocess.run(
        [sys.executable, "-m", "trainmon", "suspects", "--prometheus", prometheus.url],
        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    bad = sorted(fleet.planted)
    # every node is compared once each of its per-node series is recorded (a moment apart)
    assert re.match(rf"{BAD} suspect node\(s\) of \d+ compared with their peers", out), out
    assert f"--exclude={','.join(bad)}" in out, out
    for node, reasons in fleet.planted.items():
        assert f"\n{node}\n" in out, out
        for reason in reasons:
            assert f"  {reason} " in out, (node, reason, out)
        assert f"kubectl cordon {node}" in out
        assert f"scontrol update NodeName={node} State=DRAIN" in out
    assert "infiniband mlx5_0:1 degraded: errors (action drain)" in out
    healthy = next(node for node in fleet.nodes if node not in fleet.planted)
    assert healthy not in out
