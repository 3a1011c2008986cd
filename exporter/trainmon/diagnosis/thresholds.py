"""The ``collectors.diagnosis`` configuration section: the thresholds of the verdict.

Here, beside the rules that read it, because the engine (``rules``, ``risks``)
and ``trainmon doctor`` take it; read by ``trainmon.section.read_section``
with the bounds of its fields' metadata. The defaults of the thresholds that
alert rules and dashboards share come from ``trainmon.contract``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainmon import contract
from trainmon.section import RATIO, Invalid, setting


@dataclass(frozen=True)
class DiagnosisConfig:
    """Thresholds of the compute/communication/storage/scheduling verdict (docs/diagnosis.md).

    Every ratio is 0-1; docs/diagnosis.md gives the reasoning and sources. The
    thresholds the alert rules and dashboards share come from ``trainmon.contract``.
    """

    enabled: bool = True
    #: Span of the evidence: counters are compared over this many seconds.
    window_seconds: float = field(default=60.0, metadata=setting(minimum=5, maximum=3600))
    #: Fewer steps than this in the window (all ranks together): kind ``none``.
    min_steps: int = field(default=3, metadata=setting(minimum=1, maximum=1_000_000))
    #: A rank's first steps left out of its evidence: the rendezvous, compilation, the
    #: first batch and the first collectives make them unlike the rest.
    warmup_steps: int = field(default=5, metadata=setting(minimum=0, maximum=1_000_000))
    #: storage: data wait / step time of the worst rank at or above this.
    data_wait_ratio: float = field(default=contract.DATA_WAIT_RATIO, metadata=RATIO)
    #: storage, second rule: a GPU sawtooth at or above this ...
    sawtooth_ratio: float = field(default=contract.SAWTOOTH_FLAG, metadata=RATIO)
    #: ... with a rising data wait that reached this.
    sawtooth_data_wait_ratio: float = field(default=0.1, metadata=RATIO)
    #: communication: communication waited for (measured exposed comm, else the comm
    #: phase) / step time of the rank that waits least at or above this.
    comm_ratio: float = field(default=contract.COMM_RATIO, metadata=RATIO)
    #: Phase names counted as communication.
    comm_phases: tuple[str, ...] = ("comm",)
    #: communication without a comm phase: a NIC or IB port this busy (of its link rate).
    link_utilization_ratio: float = field(default=contract.LINK_SATURATION_RATIO, metadata=RATIO)
    #: scheduling: a rank whose per-step work (step - data wait - comm wait) is this many
    #: times the median of the job's ranks (itself included) is a straggler.
    straggler_factor: float = field(
        default=contract.STRAGGLER_FACTOR, metadata=setting(minimum=1, maximum=100))
    #: scheduling: a pipeline rank waiting for its neighbouring stages this share of
    #: its step (the rank that waits least) has bubbles worth removing.
    pipeline_bubble_ratio: float = field(
        default=contract.PIPELINE_BUBBLE_RATIO, metadata=RATIO)
    #: A GPU whose mean utilization is below this is idle.
    idle_utilization_ratio: float = field(default=contract.GPU_IDLE_RATIO, metadata=RATIO)
    #: compute: below this GPU utilization the advice points at host-side overhead.
    busy_utilization_ratio: float = field(default=0.6, metadata=RATIO)
    #: compute (GPM): a busy GPU whose SMs are active less than this is launch-bound.
    sm_active_low_ratio: float = field(default=contract.GPU_SM_ACTIVE_LOW, metadata=RATIO)
    #: compute (GPM): tensor pipes active less than this on active SMs: no mixed precision.
    tensor_idle_ratio: float = field(default=contract.GPU_TENSOR_IDLE, metadata=RATIO)
    #: compute (GPM): DRAM interface active at least this much: memory-bound.
    dram_active_ceiling_ratio: float = field(
        default=contract.GPU_DRAM_ACTIVE_CEILING, metadata=RATIO)
    #: compute: memory used within this share of the total is an out-of-memory risk.
    memory_headroom_ratio: float = field(
        default=contract.GPU_MEMORY_HEADROOM_RATIO, metadata=RATIO)
    #: fail-slow: a rank's step, or a part of it, this much slower (of its step time) than
    #: it was, and staying so (docs/diagnosis.md, "Fail-slow").
    fail_slow_ratio: float = field(default=0.1, metadata=setting(minimum=0.02, maximum=10))
    #: ... over the last this many seconds (at least 6 evaluations: window_seconds / 20 each) ...
    fail_slow_test_seconds: float = field(
        default=24.0, metadata=setting(minimum=5, maximum=3600))
    #: ... against the median of the this many seconds before them.
    fail_slow_reference_seconds: float = field(
        default=120.0, metadata=setting(minimum=10, maximum=86400))
    #: scheduling: a rank without a step for this long has stalled (seconds).
    stall_seconds: float = field(default=120.0, metadata=setting(minimum=1, maximum=86400))
    #: risk, spot instance: a job whose last checkpoint is older than this (seconds).
    checkpoint_max_age_seconds: float = field(
        default=contract.CHECKPOINT_MAX_AGE_SECONDS,
        metadata=setting(minimum=60, maximum=7 * 86400),
    )
    #: risk, NUMA: a GPU process with less than this share of its CPUs on the GPU's node.
    numa_local_ratio_min: float = field(default=contract.NUMA_LOCAL_RATIO_MIN, metadata=RATIO)
    #: risk, NCCL over sockets: a multi-node job communicating at least this share of
    #: each step, ...
    nccl_socket_min_comm_ratio: float = field(
        default=contract.NCCL_SOCKET_MIN_COMM_RATIO, metadata=RATIO)
    #: ... while every ACTIVE RDMA port moves less than this (receive + transmit, B/s) ...
    rdma_idle_bytes_per_second: float = field(
        default=contract.RDMA_IDLE_BYTES_PER_SECOND, metadata=setting(minimum=0, maximum=1e12))
    #: ... and an Ethernet NIC moves at least this (receive + transmit, B/s).
    socket_busy_bytes_per_second: float = field(
        default=contract.SOCKET_BUSY_BYTES_PER_SECOND, metadata=setting(minimum=0, maximum=1e12))

    def check(self) -> None:
        """Rules between the keys (``trainmon.section.read_section``)."""
        if self.idle_utilization_ratio >= self.busy_utilization_ratio:
            raise Invalid("idle_utilization_ratio", "must be below busy_utilization_ratio")
        if self.rdma_idle_bytes_per_second >= self.socket_busy_bytes_per_second:
            raise Invalid(
                "rdma_idle_bytes_per_second", "must be below socket_busy_bytes_per_second"
            )
        if self.fail_slow_reference_seconds < self.fail_slow_test_seconds:
            raise Invalid("fail_slow_reference_seconds",
                          "must be at least fail_slow_test_seconds")
        if not self.comm_phases:
            raise Invalid("comm_phases", "name at least one phase")
