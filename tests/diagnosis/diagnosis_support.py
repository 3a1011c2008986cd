"""Helpers for the diagnosis tests (imported by the test modules and the conftest).

``job_verdicts(scrape)`` reads the per-job bottleneck from a rendering
(``support.exposition``). ``ProcTree`` and ``SysTree`` write miniature ``/proc`` and ``/sys`` trees. ``ContractSource`` is a
data source that emits metric-contract samples the test sets (a stand-in for
the GPU, training and node collectors below the diagnosis collector).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import Metric

from tests.support.exposition import Labels, Scrape, labels
from trainmon.core.collector import Collector


def job_verdicts(scrape: Scrape) -> dict[str, str]:
    """job → the kind whose trainmon_bottleneck is 1."""
    return {dict(k)["job"]: dict(k)["kind"]
            for k, v in scrape.samples.get("trainmon_bottleneck", {}).items() if v == 1}


class ProcTree:
    """A miniature ``/proc``: ``add(pid, cgroup=..., environ={...}, interfaces=[...])``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(
        self,
        pid: int,
        cgroup: str = "0::/\n",
        environ: Mapping[str, str] | None = None,
        interfaces: Iterable[str] | None = None,
    ) -> Path:
        directory = self.root / str(pid)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup").write_text(cgroup)
        if environ is not None:
            (directory / "environ").write_bytes(
                b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))
        if interfaces is not None:
            (directory / "net").mkdir(exist_ok=True)
            header = ("Inter-|   Receive                            |  Transmit\n"
                      " face |bytes    packets errs drop fifo frame compressed multicast|"
                      "bytes    packets errs drop fifo colls carrier compressed\n")
            rows = "".join(f"{name:>6}: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n" for name in interfaces)
            (directory / "net" / "dev").write_text(header + rows)
        return directory


class SysTree:
    """A miniature ``/sys``: RDMA ports and network interfaces."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "class" / "net").mkdir(parents=True, exist_ok=True)

    def hca(self, device: str, port: int = 1, state: str = "4: ACTIVE",
            link_layer: str = "InfiniBand") -> None:
        directory = self.root / "class" / "infiniband" / device / "ports" / str(port)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "state").write_text(state + "\n")
        (directory / "link_layer").write_text(link_layer + "\n")

    def interface(self, name: str) -> None:
        (self.root / "class" / "net" / name).mkdir(parents=True, exist_ok=True)


@dataclass(eq=False)
class ContractSource(Collector):
    """Emits metric-contract samples whose exact sample names and values the test sets.

    ``source.samples["trainmon_training_steps_total"][labels(job="a", rank="0")] = 10``
    (counters by their ``_total`` name, histograms by ``_sum``/``_count``).
    """

    name: str = "contract"
    samples: dict[str, dict[Labels, float]] = field(default_factory=dict)

    def set(self, sample: str, value: float, /, **label_values: str) -> None:
        self.samples.setdefault(sample, {})[labels(**label_values)] = value

    def add(self, sample: str, increase: float, /, **label_values: str) -> None:
        series = self.samples.setdefault(sample, {})
        key = labels(**label_values)
        series[key] = series.get(key, 0.0) + increase

    def collect(self) -> Iterable[Metric]:
        families: list[Metric] = []
        for name, series in self.samples.items():
            family = Metric(name, "test samples", "untyped")
            for label_set, value in series.items():
                family.add_sample(name, dict(label_set), value)
            families.append(family)
        return families
