"""A loopback stand-in for NVIDIA dcgm-exporter on an 8-GPU node.

It serves ``/metrics`` the way dcgm-exporter 4.x renders it
(``internal/pkg/rendermetrics/render_metrics.go``): one family per field of the
checked-in ``default-counters.csv`` (plus the opt-in fields asked for), each
sample labelled ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``,
``hostname`` and the ``DCGM_FI_DRIVER_VERSION`` attribute, values in DCGM's
own units (MHz, MiB, %, W, °C; profiling fields as 0–1 ratios; PCIe as
bytes/s). Like the trainmon demo, GPUs 0–3 saw-tooth (a data-starved job)
and GPUs 4–7 are steadily busy. ``devices`` limits it to some GPUs, as
``dcgm-exporter --devices g:0-5`` does: the others are then the daemon's alone,
which is how the dashboard tests see both sources of an either-source panel.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

from testkit.loopback import LoopbackHTTPServer, Reply, Request
from testkit.metric_contract import DCGM_COUNTERS

GPUS = 8
DRIVER_VERSION = "550.54.15"
MODEL = "NVIDIA H100 80GB HBM3"
HOSTNAME = "gpu-node-1"
SAWTOOTH_PERIOD_SECONDS = 4.0


def _busy(gpu: int, now: float) -> float:
    """0–1 activity: GPUs 0–3 alternate busy/idle every half period, 4–7 stay busy."""
    if gpu >= 4:
        return 0.93 + 0.02 * math.sin(now + gpu)
    return 0.95 if (now % SAWTOOTH_PERIOD_SECONDS) < SAWTOOTH_PERIOD_SECONDS / 2 else 0.03


#: Field → value(gpu, now, busy) in the field's DCGM unit; other fields read 0.
VALUES: dict[str, Callable[[int, float, float], float]] = {
    "DCGM_FI_DEV_SM_CLOCK": lambda g, t, b: 1980.0 if b > 0.5 else 345.0,
    "DCGM_FI_DEV_MEM_CLOCK": lambda g, t, b: 2619.0,
    "DCGM_FI_DEV_GPU_TEMP": lambda g, t, b: 38.0 + 30.0 * b,
    "DCGM_FI_DEV_MEMORY_TEMP": lambda g, t, b: 42.0 + 25.0 * b,
    "DCGM_FI_DEV_POWER_USAGE": lambda g, t, b: 90.0 + 560.0 * b,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda g, t, b: 4.0e8 + t * 4.0e5,
    "DCGM_FI_DEV_GPU_UTIL": lambda g, t, b: round(100.0 * b),
    "DCGM_FI_DEV_MEM_COPY_UTIL": lambda g, t, b: round(40.0 * b),
    "DCGM_FI_DEV_FB_USED": lambda g, t, b: 61_440.0 if g < 4 else 71_680.0,
    "DCGM_FI_DEV_FB_FREE": lambda g, t, b: 81_559.0 - (61_440.0 if g < 4 else 71_680.0),
    "DCGM_FI_DEV_FB_RESERVED": lambda g, t, b: 521.0,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": lambda g, t, b: 0.0 if g < 4 else 9.0e7 * b,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": lambda g, t, b: b,
    "DCGM_FI_PROF_SM_ACTIVE": lambda g, t, b: 0.85 * b,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": lambda g, t, b: 0.45 * b,
    "DCGM_FI_PROF_DRAM_ACTIVE": lambda g, t, b: 0.35 * b,
    "DCGM_FI_PROF_PCIE_TX_BYTES": lambda g, t, b: 2.0e8 * b,
    "DCGM_FI_PROF_PCIE_RX_BYTES": lambda g, t, b: 1.5e9 * b,
}


def counters(opt_in: Iterable[str] = ()) -> list[tuple[str, str, str]]:
    """(field, Prometheus type, help) rows dcgm-exporter would load: defaults + ``opt_in``."""
    wanted = set(opt_in)
    rows = []
    for raw in DCGM_COUNTERS.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        commented = line.startswith("#")
        parts = [part.strip() for part in line.lstrip("#").split(",", 2)]
        if len(parts) != 3 or not parts[0].startswith("DCGM_"):
            continue
        if commented and parts[0] not in wanted:
            continue
        rows.append((parts[0], parts[1], parts[2]))
    return rows


def render(rows: list[tuple[str, str, str]], now: float,
           devices: Iterable[int] = range(GPUS)) -> str:
    """The exposition text dcgm-exporter would serve at ``now`` for the GPUs ``devices``."""
    watched = sorted(set(devices))
    attributes = {field: "" for field, kind, _ in rows if kind == "label"}
    if "DCGM_FI_DRIVER_VERSION" in attributes:
        attributes["DCGM_FI_DRIVER_VERSION"] = DRIVER_VERSION
    lines = []
    for field, kind, help_text in rows:
        if kind == "label":
            continue
        lines += [f"# HELP {field} {help_text}", f"# TYPE {field} {kind}"]
        for gpu in watched:
            labels = (
                f'gpu="{gpu}",UUID="GPU-6b7d6c2e-0000-4000-8000-00000000000{gpu}",'
                f'pci_bus_id="00000000:{0x18 + gpu * 0x10:02X}:00.0",device="nvidia{gpu}",'
                f'modelName="{MODEL}",hostname="{HOSTNAME}"'
                + "".join(f',{name}="{value}"' for name, value in attributes.items())
            )
            value = VALUES[field](gpu, now, _busy(gpu, now)) if field in VALUES else 0.0
            lines.append(f"{field}{{{labels}}} {value:g}")
    return "\n".join(lines) + "\n"


class FakeDCGMExporter(LoopbackHTTPServer):
    """``with FakeDCGMExporter(opt_in=(...)) as fake: fake.url`` serves /metrics on loopback."""

    def __init__(self, opt_in: Iterable[str] = (), clock: Callable[[], float] = time.time,
                 devices: Iterable[int] = range(GPUS)) -> None:
        self.rows = counters(opt_in)
        self.clock = clock
        #: NVML indices of the GPUs it watches (``--devices``); every GPU by default.
        self.devices = tuple(sorted(set(devices)))
        if not set(self.devices) <= set(range(GPUS)):
            raise ValueError(f"devices {self.devices}: the node has GPUs 0-{GPUS - 1}")
        self.scrapes = 0
        super().__init__(self._answer)

    def _answer(self, request: Request) -> Reply:
        if request.path != "/metrics":
            return Reply.text("not found", status=404)
        self.scrapes += 1
        return Reply.text(render(self.rows, self.clock(), self.devices),
                          "text/plain; version=0.0.4; charset=utf-8")
