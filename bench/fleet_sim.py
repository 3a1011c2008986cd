"""A loopback fleet: many trainmon-shaped nodes served from one process.

The template is a real ``trainmon serve --demo`` (8 simulated GPUs, NICs, IB
ports, disks, two 4-rank training jobs), scraped twice a few seconds apart:
``capture_template`` keeps every sample with its labels, the value of the
second scrape and, for counters and clock-like timestamps, the slope between
the two. The fake dcgm-exporter of ``testkit/fake_dcgm_exporter.py``
gives the dcgm-exporter template the same way. ``Fleet`` derives one
exposition per node from them:

* node ``gpu-node-NNNN`` has its own GPU UUIDs (dcgm-exporter's ``UUID`` is the
  same GPU's), instance id, zone, leaf switch and rack; PCI bus ids stay the
  template's, as on identical servers;
* nodes come in allocations of 1–4 consecutive nodes sharing 1–4 training jobs
  over their 8 GPUs each (8, 4+4, 4+2+2 or 2+2+2+2 GPUs per node), so multi-node
  jobs exist; a job's ranks are offset per node (node p of the allocation holds
  ranks p·s … p·s+s-1 for s GPUs per node); its per-rank and per-job series are
  the template's, re-labelled (job name, rank, GPU, run name);
* counters start at a per-node share of the template value and advance at the
  same share of its rate (one share per GPU, rank or node, so ratios between
  counters stay the demo's); gauges vary ±5 % around a per-node value, slowly
  in time; integers and 0/1 flags stay; timestamps keep the template's age.

``FleetServer`` (``python -m bench.fleet_sim``) answers
``/nodes/<node>/metrics`` and ``/nodes/<node>/dcgm-exporter/metrics`` on one
loopback port from a ``ThreadingHTTPServer``; a body is rendered once per node
per scrape interval (both engines then read the same values), from label
parts rendered at start. ``/stats`` counts the scrapes per node and client
(``User-Agent`` product). ``write_targets`` writes the file_sd lists the
shipped scrape configs read (``targets/trainmon.yml``,
``targets/dcgm-exporter.yml``): one target per node, told apart by
``__metrics_path__``, with ``node`` and ``instance`` (``<node>:19400``, as the
shipped target lists would give) set.

Bad nodes (``Fleet(..., bad=2)``, ``--bad-nodes 2``; issue 37) are planted among the
healthy ones, chosen by the seed: the first has its GPUs' SM clocks at
``SLOW_CLOCK_FACTOR`` of the rest under power throttling (``SLOW_THROTTLE_SHARE`` of
the time) and its ranks' steps ``SLOW_STEP_FACTOR`` times as long (a node whose jobs span
at least ``STEP_PEER_NODES`` nodes where there is one, so that its job's other nodes
compare it); the second counts ``LINK_ERRORS_PER_SECOND`` InfiniBand symbol errors a
second on one port and reports that InfiniBand subsystem degraded in
``trainmon_health_status``; further ones alternate. ``Fleet.planted`` names each bad node
with the suspect reasons (``node:trainmon_suspect:reason``) the shipped rules should give
it. The families those rules read that the demo may not export
(``trainmon_gpu_sm_clock_max_hertz``, ``trainmon_health_status``) are added where the
template lacks them: the maximum clock is the demo's clock, every node reports one healthy
InfiniBand subsystem.

This is a library and a server for ``bench/fleet_scale.py``, not a benchmark
(``make bench`` skips it).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger(__name__)

GPUS_PER_NODE = 8
#: GPUs per node of each of a node's jobs, by the node's job count.
JOB_SPLITS: dict[int, tuple[int, ...]] = {1: (8,), 2: (4, 4), 3: (4, 2, 2), 4: (2, 2, 2, 2)}
#: Nodes per allocation (nodes sharing the same jobs), drawn per allocation.
ALLOCATION_SIZES = (1, 1, 2, 2, 3, 4)
NODES_PER_LEAF = 16
NODES_PER_RACK = 4
NODES_PER_ZONE = 250
TRAINMON_PORT = 19400
DCGM_PORT = 9400
#: Seconds between the two template scrapes (counter slopes).
TEMPLATE_GAP_SECONDS = 5.0
TEMPLATE_DEADLINE_SECONDS = 60.0
#: Share of the template value a node's counters and gauges get: uniform in 1 ± this.
COUNTER_SPREAD = 0.2
GAUGE_SPREAD = 0.1
#: Relative amplitude of a gauge's variation in time, and its angular step per interval.
GAUGE_WOBBLE = 0.05
WOBBLE_STEP = 0.3
PLACEMENT_LABELS = {"leaf": "leaf-000", "rack": "rack-000"}
SOURCES = ("trainmon", "dcgm-exporter")
#: Planted bad nodes (``Fleet(bad=…)``): the slow GPU node's clocks, power-throttled share
#: of the time and step time; the bad link's symbol errors per second.
SLOW_CLOCK_FACTOR = 0.7
SLOW_THROTTLE_SHARE = 0.6
SLOW_STEP_FACTOR = 1.5
LINK_ERRORS_PER_SECOND = 2.0
#: The step comparison needs a job on this many nodes (the rule's minimum).
STEP_PEER_NODES = 3
#: The health series a node reports where the template has none (a daemon exports one
#: ``ok`` series with ``device=""`` for a subsystem whose devices are all healthy), and
#: what the planted node reports instead: the port, degraded by its errors.
HEALTH_SUBSYSTEM = ("subsystem", "infiniband")
HEALTH_OK = (HEALTH_SUBSYSTEM, ("device", ""), ("reason", "ok"), ("action", "none"))
HEALTH_DEGRADED = {"device": "mlx5_0:1", "reason": "errors", "action": "drain"}
COUNTER_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


@dataclass(frozen=True)
class TemplateSample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    #: Increase per second (counters, clock-like timestamps); 0 for the rest.
    slope: float
    #: ``counter``, ``timestamp`` or ``gauge``.
    kind: str


@dataclass(frozen=True)
class TemplateFamily:
    header: str
    samples: tuple[TemplateSample, ...]


@dataclass(frozen=True)
class Template:
    """One source's exposition: families in order, captured at ``captured`` (Unix s)."""

    families: tuple[TemplateFamily, ...]
    captured: float

    def to_json(self) -> dict[str, Any]:
        return {"captured": self.captured, "families": [
            {"header": f.header, "samples": [[s.name, list(map(list, s.labels)), s.value,
                                              s.slope, s.kind] for s in f.samples]}
            for f in self.families]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Template:
        return cls(tuple(
            TemplateFamily(f["header"], tuple(
                TemplateSample(name, tuple((k, v) for k, v in labels), value, slope, kind)
                for name, labels, value, slope, kind in f["samples"]))
            for f in data["families"]), float(data["captured"]))

    @property
    def series(self) -> int:
        return sum(len(f.samples) for f in self.families)


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def parse_template(first: str, second: str, first_at: float, second_at: float) -> Template:
    """A template from two scrapes of one source, ``second_at - first_at`` seconds apart."""
    gap = second_at - first_at
    earlier = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(first) for s in family.samples
    }
    families = []
    for family in text_string_to_metric_families(second):
        samples = []
        for sample in family.samples:
            before = earlier.get((sample.name, tuple(sorted(sample.labels.items()))))
            change = 0.0 if before is None else (sample.value - before) / gap
            if family.type in COUNTER_TYPES:
                kind, slope = "counter", max(change, 0.0)
            elif sample.name.endswith("_timestamp_seconds"):
                kind, slope = "timestamp", 1.0 if abs(change - 1.0) < 0.5 else 0.0
            else:
                kind, slope = "gauge", 0.0
            samples.append(TemplateSample(sample.name, tuple(sample.labels.items()),
                                          float(sample.value), slope, kind))
        header = (f"# HELP {family.name} {_escape_help(family.documentation)}\n"
                  f"# TYPE {family.name} {family.type}\n")
        families.append(TemplateFamily(header, tuple(samples)))
    return Template(tuple(families), second_at)


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def _demo_complete(text: str) -> bool:
    """Every GPU and every rank of the demo's two 4-rank jobs is in the scrape, and
    diagnosis reports only those jobs (no ``pid:`` pseudo-jobs left)."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    gpus = sum(line.startswith("trainmon_gpu_up{") for line in lines)
    ranks = sum(line.startswith("trainmon_training_steps_total{") for line in lines)
    return gpus == GPUS_PER_NODE and ranks == GPUS_PER_NODE and 'job="pid:' not in text


def capture_templates(folder: Path) -> dict[str, Template]:
    """Templates of both sources: a real ``trainmon serve --demo`` (with placement labels,
    its socket and ledger in ``folder``) and the fake dcgm-exporter's rendering."""
    from bench import benchlib
    from testkit import fake_dcgm_exporter

    config = folder / "trainmon.yml"
    config.write_text(yaml.safe_dump({"collectors": {
        "platform": {"labels": PLACEMENT_LABELS},
        "training": {"socket": str(folder / "steps.sock")},
        "ledger": {"path": str(folder / "ledger.sqlite3")},
    }}))
    daemon = benchlib.start_trainmon(config, quiet=True, args=["--demo"])
    try:
        deadline = time.monotonic() + TEMPLATE_DEADLINE_SECONDS
        first = _scrape(daemon.url + "/metrics")
        while not _demo_complete(first):
            if time.monotonic() > deadline:
                raise RuntimeError("the demo never reported all 8 GPUs and ranks")
            time.sleep(0.5)
            first = _scrape(daemon.url + "/metrics")
        first_at = time.time()
        time.sleep(TEMPLATE_GAP_SECONDS)
        second = _scrape(daemon.url + "/metrics")
        second_at = time.time()
    finally:
        daemon.stop()
    rows = fake_dcgm_exporter.counters()
    return {
        "trainmon": parse_template(first, second, first_at, second_at),
        "dcgm-exporter": parse_template(
            fake_dcgm_exporter.render(rows, first_at), fake_dcgm_exporter.render(rows, second_at),
            first_at, second_at),
    }


def save_templates(templates: Mapping[str, Template], path: Path) -> None:
    path.write_text(json.dumps({name: t.to_json() for name, t in templates.items()}))


def load_templates(path: Path) -> dict[str, Template]:
    return {name: Template.from_json(data) for name, data in json.loads(path.read_text()).items()}


@dataclass(frozen=True)
class NodeJob:
    """A training job as one node sees it."""

    name: str
    template_job: str
    gpus: tuple[int, ...]
    #: The node's first rank (position in the allocation × GPUs per node of the job).
    first_rank: int
    world_size: int


@dataclass(frozen=True)
class NodeLayout:
    name: str
    index: int
    jobs: tuple[NodeJob, ...]
    zone: str
    leaf: str
    rack: str


def fleet_layout(nodes: int, template_jobs: Sequence[str], seed: int, region: str,
                 ) -> list[NodeLayout]:
    """Nodes ``gpu-node-0000`` … in allocations of consecutive nodes sharing their jobs."""
    rng = random.Random(f"{seed}/layout")
    layouts: list[NodeLayout] = []
    allocation = 0
    while len(layouts) < nodes:
        size = min(rng.choice(ALLOCATION_SIZES), nodes - len(layouts))
        split = JOB_SPLITS[rng.randint(1, len(JOB_SPLITS))]
        for position in range(size):
            index = len(layouts)
            jobs, gpu = [], 0
            for number, gpus in enumerate(split):
                jobs.append(NodeJob(
                    name=f"train-{allocation:04d}-{number}",
                    template_job=template_jobs[(allocation + number) % len(template_jobs)],
                    gpus=tuple(range(gpu, gpu + gpus)), first_rank=position * gpus,
                    world_size=gpus * size))
                gpu += gpus
            layouts.append(NodeLayout(
                f"gpu-node-{index:04d}", index, tuple(jobs),
                zone=f"{region}-{1 + (index // NODES_PER_ZONE) % 4}",
                leaf=f"leaf-{index // NODES_PER_LEAF:03d}",
                rack=f"rack-{index // NODES_PER_RACK:04d}"))
        allocation += 1
    return layouts


def gpu_uuid(node: str, gpu: str) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'gpu{gpu}.{node}.fleet')}"


class Exposition:
    """One target's samples: label parts rendered once, values per interval (numpy).

    Samples whose value never changes (flags, sizes, counters at rest) are
    rendered whole once; only the others are formatted per interval."""

    def __init__(self, prefixes: list[str], base: list[float], slope: list[float],
                 wobble: list[float], phase: list[float], upper: list[float],
                 whole: list[bool]) -> None:
        self.prefixes = prefixes
        changing = [i for i in range(len(prefixes)) if slope[i] or wobble[i]]
        self.changing = changing
        self.lines = [prefix + repr(value) for prefix, value in zip(prefixes, base, strict=True)]
        self.changing_prefixes = [prefixes[i] for i in changing]
        self.base = np.array([base[i] for i in changing])
        self.slope = np.array([slope[i] for i in changing])
        self.wobble = np.array([wobble[i] for i in changing])
        self.phase = np.array([phase[i] for i in changing])
        self.upper = np.array([upper[i] for i in changing])
        #: Counters of whole numbers (bytes, packets, steps): rounded down, as they count.
        self.whole = np.array([whole[i] for i in changing], dtype=bool)

    @property
    def series(self) -> int:
        return len(self.prefixes)

    def names(self) -> list[str]:
        """The metric name of every sample, in order."""
        return [prefix.rsplit("\n", 1)[-1].split("{", 1)[0].split(" ", 1)[0]
                for prefix in self.prefixes]

    def render(self, elapsed: float, tick: int) -> bytes:
        """The exposition ``elapsed`` seconds after the fleet's start, interval ``tick``."""
        values = self.base + self.slope * elapsed
        values += self.wobble * np.sin(self.phase + tick * WOBBLE_STEP)
        np.clip(values, 0.0, self.upper, out=values)
        values[self.whole] = np.floor(values[self.whole])
        lines = self.lines.copy()
        for position, prefix, value in zip(self.changing, self.changing_prefixes,
                                           values.tolist(), strict=True):
            lines[position] = prefix + repr(value)
        lines.append("")
        return "\n".join(lines).encode()


@dataclass(frozen=True)
class Plant:
    """What is wrong with one planted bad node: ``slow_gpu`` (clocks, throttling, steps)
    or ``bad_link`` (InfiniBand errors, a degraded health subsystem)."""

    kind: str

    def adjust(self, sample: TemplateSample, labels: list[tuple[str, str]],
               value: float | None, slope: float | None,
               ) -> tuple[float | None, float | None, list[tuple[str, str]]]:
        """The sample's value, counter rate and labels on this node."""
        named = dict(labels)
        if self.kind == "slow_gpu":
            if sample.name == "trainmon_gpu_sm_clock_hertz":
                value = float(round(sample.value * SLOW_CLOCK_FACTOR))
            elif sample.name == "trainmon_gpu_throttle_seconds_total" \
                    and named.get("reason") == "power":
                slope = SLOW_THROTTLE_SHARE
            elif sample.name == "trainmon_training_step_seconds_sum":
                slope = sample.slope * SLOW_STEP_FACTOR
        elif self.kind == "bad_link":
            if sample.name == "trainmon_infiniband_errors_total" \
                    and named.get("counter") == "symbol" and named.get("device") == "mlx5_0":
                slope = LINK_ERRORS_PER_SECOND
            elif sample.name == "trainmon_health_status" \
                    and named.get(HEALTH_SUBSYSTEM[0]) == HEALTH_SUBSYSTEM[1]:
                value = 1.0
                labels = [(k, HEALTH_DEGRADED.get(k, v)) for k, v in labels]
        return value, slope, labels

    def reasons(self, node: NodeLayout, spans: Mapping[str, int]) -> frozenset[str]:
        """The suspect reasons the shipped rules give this node."""
        if self.kind == "bad_link":
            return frozenset({"network_errors", "health"})
        step = any(spans[job.name] >= STEP_PEER_NODES for job in node.jobs)
        return frozenset({"gpu_clocks", "gpu_throttle", *(("step_time",) if step else ())})


def supplemented(template: Template) -> Template:
    """``template`` with ``trainmon_gpu_sm_clock_max_hertz`` (the GPU's clock) and
    ``trainmon_health_status`` (one healthy InfiniBand subsystem) where it has none."""
    names = {sample.name for family in template.families for sample in family.samples}
    added = []
    if "trainmon_gpu_sm_clock_max_hertz" not in names:
        clocks = [s for f in template.families for s in f.samples
                  if s.name == "trainmon_gpu_sm_clock_hertz"]
        added.append(TemplateFamily(
            "# HELP trainmon_gpu_sm_clock_max_hertz Maximum SM clock (simulated).\n"
            "# TYPE trainmon_gpu_sm_clock_max_hertz gauge\n",
            tuple(TemplateSample("trainmon_gpu_sm_clock_max_hertz", s.labels, s.value, 0.0,
                                 "gauge") for s in clocks)))
    if "trainmon_health_status" not in names:
        added.append(TemplateFamily(
            "# HELP trainmon_health_status Health of a subsystem (simulated).\n"
            "# TYPE trainmon_health_status gauge\n",
            (TemplateSample("trainmon_health_status", HEALTH_OK, 0.0, 0.0, "gauge"),)))
    return Template((*template.families, *added), template.captured)


@dataclass
class _Builder:
    """Collects one node's samples for one source."""

    rng: random.Random
    prefixes: list[str] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    slope: list[float] = field(default_factory=list)
    wobble: list[float] = field(default_factory=list)
    phase: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    whole: list[bool] = field(default_factory=list)
    shares: dict[tuple[str, ...], float] = field(default_factory=dict)
    header: str = ""
    plant: Plant | None = None

    def share(self, entity: tuple[str, ...], spread: float) -> float:
        key = (*entity, f"{spread}")
        if key not in self.shares:
            self.shares[key] = 1.0 + self.rng.uniform(-spread, spread)
        return self.shares[key]

    def add(self, sample: TemplateSample, labels: Iterable[tuple[str, str]],
            entity: tuple[str, ...], shift: float, value: float | None = None,
            slope: float | None = None) -> None:
        """One sample; ``value`` fixes a gauge's value, ``slope`` a counter's rate (a bad
        node's), else both follow the template at the entity's share."""
        if self.plant is not None:
            labels = list(labels)
            value, slope, labels = self.plant.adjust(sample, labels, value, slope)
        rendered = ",".join(f'{k}="{_escape_value(v)}"' for k, v in labels)
        self.prefixes.append(f"{self.header}{sample.name}{{{rendered}}} " if rendered
                             else f"{self.header}{sample.name} ")
        self.header = ""
        center = sample.value if value is None else value
        wobble, upper = 0.0, math.inf
        if sample.kind == "counter":
            share = self.share(entity, COUNTER_SPREAD)
            base, slope = center * share, sample.slope * share if slope is None else slope
        elif sample.kind == "timestamp":
            base, slope = center + shift, sample.slope
        elif value is not None or center.is_integer():  # flags, counts, sizes
            base, slope = center, 0.0
        else:
            base, slope = center * self.share(entity, GAUGE_SPREAD), 0.0
            wobble = abs(base) * GAUGE_WOBBLE
            if "_ratio" in sample.name:
                upper = 1.0
        self.base.append(base)
        self.slope.append(0.0 if slope is None else slope)
        self.wobble.append(wobble)
        self.phase.append(self.rng.uniform(0.0, 2 * math.pi))
        self.upper.append(upper)
        self.whole.append(sample.kind == "counter" and center.is_integer())

    def build(self) -> Exposition:
        return Exposition(self.prefixes, self.base, self.slope, self.wobble, self.phase,
                          self.upper, self.whole)


def _template_ranks(template: Template) -> dict[str, dict[str, str]]:
    """Template job → rank → GPU, from ``trainmon_training_rank_info``."""
    ranks: dict[str, dict[str, str]] = {}
    for family in template.families:
        for sample in family.samples:
            if sample.name == "trainmon_training_rank_info":
                labels = dict(sample.labels)
                ranks.setdefault(labels["job"], {})[labels["rank"]] = labels.get("gpu", "")
    if not ranks:
        raise ValueError("the template has no trainmon_training_rank_info: no training jobs")
    return ranks


def _node_labels(labels: tuple[tuple[str, str], ...], node: NodeLayout,
                 ) -> list[tuple[str, str]]:
    """A node-level sample's labels on ``node``: its GPU UUIDs, instance id and placement."""
    gpu = dict(labels).get("gpu", "")
    placement = {"zone": node.zone, "leaf": node.leaf, "rack": node.rack,
                 "hostname": node.name, "instance_id": f"ins-{node.index:08d}"}
    out = []
    for key, value in labels:
        if key in ("uuid", "UUID"):
            value = gpu_uuid(node.name, gpu)
        elif key in placement:
            value = placement[key]
        out.append((key, value))
    return out


def build_node(templates: Mapping[str, Template], node: NodeLayout, seed: int,
               started: float, plant: Plant | None = None) -> dict[str, Exposition]:
    """Each source's exposition for ``node``; timestamps shifted to ``started``; what
    ``plant`` says is wrong with it, if anything."""
    rng = random.Random(f"{seed}/{node.name}")
    ranks = _template_ranks(templates["trainmon"])
    out = {}
    for source, template in templates.items():
        builder = _Builder(rng, plant=plant if source == "trainmon" else None)
        shift = started - template.captured
        for family in template.families:
            builder.header = family.header
            for sample in family.samples:
                labels = dict(sample.labels)
                job = labels.get("job")
                if job is None:
                    gpu = labels.get("gpu")
                    entity = ("gpu", gpu) if gpu is not None else ("node",)
                    builder.add(sample, _node_labels(sample.labels, node), entity, shift)
                    continue
                if job not in ranks:
                    continue  # a diagnosis pseudo-job of the template: not a training job
                for node_job in node.jobs:
                    if node_job.template_job != job:
                        continue
                    if labels.get("rank", ""):
                        _add_rank_samples(builder, sample, node_job, ranks[job], shift)
                    else:
                        renamed = [(k, v.replace(job, node_job.name)) for k, v in sample.labels]
                        size = (float(node_job.world_size)
                                if sample.name == "trainmon_training_world_size" else None)
                        builder.add(sample, renamed, ("job", node_job.name), shift, size)
            builder.header = ""
        out[source] = builder.build()
    return out


def _add_rank_samples(builder: _Builder, sample: TemplateSample, job: NodeJob,
                      template_ranks: Mapping[str, str], shift: float) -> None:
    """The template rank's series once for every local rank of ``job`` that maps onto it."""
    template_rank = int(dict(sample.labels)["rank"])
    for local, gpu in enumerate(job.gpus):
        if local % len(template_ranks) != template_rank:
            continue
        rank = str(job.first_rank + local)
        labels = []
        for key, value in sample.labels:
            if key == "job":
                value = job.name
            elif key == "rank":
                value = rank
            elif key == "gpu":
                value = str(gpu)
            labels.append((key, value))
        builder.add(sample, labels, ("rank", job.name, rank), shift)


class Fleet:
    """``Fleet(templates, nodes=100)``: every node's expositions and their series counts."""

    def __init__(self, templates: Mapping[str, Template], nodes: int, *, seed: int = 17,
                 started: float | None = None, dcgm: bool = True, bad: int = 0) -> None:
        self.started = time.time() if started is None else started
        self.sources = SOURCES if dcgm else SOURCES[:1]
        chosen = {source: templates[source] for source in self.sources}
        chosen["trainmon"] = supplemented(chosen["trainmon"])
        region = _template_region(templates["trainmon"])
        self.layout = fleet_layout(nodes, sorted(_template_ranks(templates["trainmon"])),
                                   seed, region)
        plants = self._plants(bad, seed)
        spans = {job: len(nodes) for job, nodes in self.jobs().items()}
        #: Planted bad node → the suspect reasons the shipped rules should give it.
        self.planted = {node.name: plants[node.name].reasons(node, spans)
                        for node in self.layout if node.name in plants}
        self.expositions = {node.name: build_node(chosen, node, seed, self.started,
                                                  plants.get(node.name))
                            for node in self.layout}

    def _plants(self, bad: int, seed: int) -> dict[str, Plant]:
        """``bad`` nodes chosen by the seed: slow GPUs first (on a node whose jobs span
        ``STEP_PEER_NODES`` nodes where there is one), then a bad link, alternating."""
        if not 0 <= bad <= len(self.layout):
            raise ValueError(f"bad nodes: {bad} of {len(self.layout)} nodes")
        rng = random.Random(f"{seed}/bad")
        spans = {job: len(nodes) for job, nodes in self.jobs().items()}
        order = rng.sample([node.name for node in self.layout], len(self.layout))
        wide = [node.name for node in self.layout
                if any(spans[job.name] >= STEP_PEER_NODES for job in node.jobs)]
        if wide:
            first = rng.choice(wide)
            order.remove(first)
            order.insert(0, first)
        kinds = ("slow_gpu", "bad_link")
        return {name: Plant(kinds[i % 2]) for i, name in enumerate(order[:bad])}

    @property
    def nodes(self) -> list[str]:
        return [node.name for node in self.layout]

    def series_per_node(self, source: str = "trainmon") -> dict[str, int]:
        """Node → samples of one scrape of its ``source`` target (each is one series)."""
        return {node: sources[source].series for node, sources in self.expositions.items()
                if source in sources}

    def series_by_name(self) -> Counter[str]:
        """Metric name → series of one scrape of every target of every source."""
        names: Counter[str] = Counter()
        for sources in self.expositions.values():
            for exposition in sources.values():
                names.update(exposition.names())
        return names

    @property
    def total_series(self) -> int:
        """Series of one scrape of every target of every source."""
        return sum(sum(self.series_per_node(source).values()) for source in self.sources)

    def jobs(self) -> dict[str, set[str]]:
        """Training job → the nodes it runs on."""
        jobs: dict[str, set[str]] = {}
        for node in self.layout:
            for job in node.jobs:
                jobs.setdefault(job.name, set()).add(node.name)
        return jobs

    def write_targets(self, folder: Path, address: str) -> None:
        """file_sd lists ``trainmon.yml`` and ``dcgm-exporter.yml`` (empty without dcgm)
        in ``folder``, every target at ``address`` (host:port)."""
        folder.mkdir(parents=True, exist_ok=True)
        paths = {"trainmon": ("metrics", TRAINMON_PORT),
                 "dcgm-exporter": ("dcgm-exporter/metrics", DCGM_PORT)}
        for source, (path, port) in paths.items():
            targets = [
                {"targets": [address],
                 "labels": {"__metrics_path__": f"/nodes/{node}/{path}", "node": node,
                            "instance": f"{node}:{port}"}}
                for node in self.nodes
            ] if source in self.sources else []
            (folder / f"{source}.yml").write_text(yaml.safe_dump(targets, sort_keys=False))


def _template_region(template: Template) -> str:
    for family in template.families:
        for sample in family.samples:
            if sample.name == "trainmon_node_info":
                return dict(sample.labels).get("region", "region")
    return "region"


class FleetServer:
    """Serves a ``Fleet`` on ``127.0.0.1:port``; bodies cached per node per ``interval``."""

    def __init__(self, fleet: Fleet, interval: float, port: int = 0,
                 clock: Callable[[], float] = time.time) -> None:
        self.fleet = fleet
        self.interval = interval
        self.clock = clock
        self._cache: dict[tuple[str, str], tuple[int, bytes]] = {}
        self._lock = threading.Lock()
        self.scrapes: Counter[tuple[str, str, str]] = Counter()
        routes = {f"/nodes/{node}/metrics": (node, "trainmon") for node in fleet.nodes}
        routes.update({f"/nodes/{node}/dcgm-exporter/metrics": (node, "dcgm-exporter")
                       for node in fleet.nodes})
        self.routes = routes
        server = self

        class Handler(BaseHTTPRequestHandler):
            # keep-alive: each scraper keeps its connection per target, as with real nodes
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server._answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        ThreadingHTTPServer.request_queue_size = 1024
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def body(self, node: str, source: str) -> bytes:
        now = self.clock()
        tick = int(now // self.interval)
        with self._lock:
            cached = self._cache.get((node, source))
        if cached is not None and cached[0] == tick:
            return cached[1]
        body = self.fleet.expositions[node][source].render(
            tick * self.interval - self.fleet.started, tick)
        with self._lock:
            self._cache[(node, source)] = (tick, body)
        return body

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?", 1)[0]
        if path == "/stats":
            body = json.dumps(self.stats()).encode()
            content_type = "application/json"
        elif path == "/healthz":
            body, content_type = b"ok\n", "text/plain"
        elif path in self.routes and self.routes[path][1] in self.fleet.sources:
            node, source = self.routes[path]
            body = self.body(node, source)
            client = request.headers.get("User-Agent", "").split("/", 1)[0]
            with self._lock:
                self.scrapes[(node, source, client)] += 1
            content_type = "text/plain; version=0.0.4; charset=utf-8"
        else:
            request.send_error(404)
            return
        request.send_response(200)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    def stats(self) -> dict[str, Any]:
        """``scrapes``: [node, source, client, count] rows."""
        with self._lock:
            rows = [[*key, count] for key, count in sorted(self.scrapes.items())]
        return {"scrapes": rows}

    def start(self) -> FleetServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a simulated trainmon fleet on loopback.")
    parser.add_argument("--templates", type=Path, required=True,
                        help="JSON written by save_templates")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--interval", type=float, default=15.0,
                        help="seconds a rendered body is reused (the scrape interval)")
    parser.add_argument("--started", type=float, help="the fleet's start, Unix seconds")
    parser.add_argument("--no-dcgm", action="store_true", help="no dcgm-exporter targets")
    parser.add_argument("--bad-nodes", type=int, default=0,
                        help="plant this many bad nodes (slow GPUs, a bad link; by the seed)")
    parser.add_argument("--targets", type=Path, required=True,
                        help="folder for the file_sd lists")
    parser.add_argument("--ready-file", type=Path, required=True,
                        help="written with host:port once serving")
    parser.add_argument("--max-seconds", type=float, default=3600.0,
                        help="stop serving after this long at the latest")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    fleet = Fleet(load_templates(args.templates), args.nodes, seed=args.seed,
                  started=args.started, dcgm=not args.no_dcgm, bad=args.bad_nodes)
    if fleet.planted:
        logger.warning("planted bad nodes: %s", {n: sorted(r) for n, r in fleet.planted.items()})
    server = FleetServer(fleet, args.interval).start()
    fleet.write_targets(args.targets, server.address)
    args.ready_file.write_text(server.address)
    try:
        threading.Event().wait(args.max_seconds)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
