"""The ``collectors.diagnosis`` configuration section: thresholds of the verdict."""

from __future__ import annotations

from dataclasses import dataclass

from trainmon import contract
from trainmon.settings import ConfigError, Section


@dataclass(frozen=True)
class DiagnosisConfig:
    """Thresholds of the compute/communication/storage/scheduling verdict (docs/diagnosis.md).

    Every ratio is 0-1; docs/diagnosis.md gives the reasoning and sources. The
    thresholds the alert rules and dashboards share come from ``trainmon.contract``.
    """

    enabled: bool = True
    #: Span of the evidence: counters are compared over this many seconds.
    window_seconds: float = 60.0
    #: Fewer steps than this in the window (all ranks together): kind ``none``.
    min_steps: int = 3
    #: storage: data wait / step time of the worst rank at or above this.
    data_wait_ratio: float = contract.DATA_WAIT_RATIO
    #: storage, second rule: a GPU sawtooth at or above this ...
    sawtooth_ratio: float = contract.SAWTOOTH_FLAG
    #: ... with a rising data wait that reached this.
    sawtooth_data_wait_ratio: float = 0.1
    #: communication: communication waited for (measured exposed comm, else the comm
    #: phase) / step time of the rank that waits least at or above this.
    comm_ratio: float = contract.COMM_RATIO
    #: Phase names counted as communication.
    comm_phases: tuple[str, ...] = ("comm",)
    #: communication without a comm phase: a NIC or IB port this busy (of its link rate).
    link_utilization_ratio: float = contract.LINK_SATURATION_RATIO
    #: scheduling: a rank whose per-step work (step - data wait - comm wait) is this many
    #: times the median of the job's ranks (itself included) is a straggler.
    straggler_factor: float = contract.STRAGGLER_FACTOR
    #: A GPU whose mean utilization is below this is idle.
    idle_utilization_ratio: float = contract.GPU_IDLE_RATIO
    #: compute: below this GPU utilization the advice points at host-side overhead.
    busy_utilization_ratio: float = 0.6
    #: compute (GPM): a busy GPU whose SMs are active less than this is launch-bound.
    sm_active_low_ratio: float = contract.GPU_SM_ACTIVE_LOW
    #: compute (GPM): tensor pipes active less than this on active SMs: no mixed precision.
    tensor_idle_ratio: float = contract.GPU_TENSOR_IDLE
    #: compute (GPM): DRAM interface active at least this much: memory-bound.
    dram_active_ceiling_ratio: float = contract.GPU_DRAM_ACTIVE_CEILING
    #: compute: memory used within this share of the total is an out-of-memory risk.
    memory_headroom_ratio: float = contract.GPU_MEMORY_HEADROOM_RATIO
    #: scheduling: a rank without a step for this long has stalled (seconds).
    stall_seconds: float = 120.0
    #: risk, spot instance: a job whose last checkpoint is older than this (seconds).
    checkpoint_max_age_seconds: float = contract.CHECKPOINT_MAX_AGE_SECONDS
    #: risk, NUMA: a GPU process with less than this share of its CPUs on the GPU's node.
    numa_local_ratio_min: float = contract.NUMA_LOCAL_RATIO_MIN
    #: risk, NCCL over sockets: a multi-node job communicating at least this share of
    #: each step, ...
    nccl_socket_min_comm_ratio: float = contract.NCCL_SOCKET_MIN_COMM_RATIO
    #: ... while every ACTIVE RDMA port moves less than this (receive + transmit, B/s) ...
    rdma_idle_bytes_per_second: float = contract.RDMA_IDLE_BYTES_PER_SECOND
    #: ... and an Ethernet NIC moves at least this (receive + transmit, B/s).
    socket_busy_bytes_per_second: float = contract.SOCKET_BUSY_BYTES_PER_SECOND


def parse_diagnosis(section: Section) -> DiagnosisConfig:
    """The ``collectors.diagnosis`` section (docs/diagnosis.md)."""
    default = DiagnosisConfig()

    def ratio(key: str, value: float) -> float:
        return section.number(key, value, 0, 1)

    result = DiagnosisConfig(
        enabled=section.boolean("enabled", default.enabled),
        window_seconds=section.number("window_seconds", default.window_seconds, 5, 3600),
        min_steps=section.integer("min_steps", default.min_steps, 1, 1_000_000),
        data_wait_ratio=ratio("data_wait_ratio", default.data_wait_ratio),
        sawtooth_ratio=ratio("sawtooth_ratio", default.sawtooth_ratio),
        sawtooth_data_wait_ratio=ratio(
            "sawtooth_data_wait_ratio", default.sawtooth_data_wait_ratio
        ),
        comm_ratio=ratio("comm_ratio", default.comm_ratio),
        comm_phases=section.string_list("comm_phases", default.comm_phases),
        link_utilization_ratio=ratio("link_utilization_ratio", default.link_utilization_ratio),
        straggler_factor=section.number("straggler_factor", default.straggler_factor, 1, 100),
        idle_utilization_ratio=ratio("idle_utilization_ratio", default.idle_utilization_ratio),
        busy_utilization_ratio=ratio("busy_utilization_ratio", default.busy_utilization_ratio),
        sm_active_low_ratio=ratio("sm_active_low_ratio", default.sm_active_low_ratio),
        tensor_idle_ratio=ratio("tensor_idle_ratio", default.tensor_idle_ratio),
        dram_active_ceiling_ratio=ratio(
            "dram_active_ceiling_ratio", default.dram_active_ceiling_ratio),
        memory_headroom_ratio=ratio("memory_headroom_ratio", default.memory_headroom_ratio),
        stall_seconds=section.number("stall_seconds", default.stall_seconds, 1, 86400),
        checkpoint_max_age_seconds=section.number(
            "checkpoint_max_age_seconds", default.checkpoint_max_age_seconds, 60, 7 * 86400),
        numa_local_ratio_min=ratio("numa_local_ratio_min", default.numa_local_ratio_min),
        nccl_socket_min_comm_ratio=ratio(
            "nccl_socket_min_comm_ratio", default.nccl_socket_min_comm_ratio),
        rdma_idle_bytes_per_second=section.number(
            "rdma_idle_bytes_per_second", default.rdma_idle_bytes_per_second, 0, 1e12),
        socket_busy_bytes_per_second=section.number(
            "socket_busy_bytes_per_second", default.socket_busy_bytes_per_second, 0, 1e12),
    )
    section.finish()
    if result.idle_utilization_ratio >= result.busy_utilization_ratio:
        raise ConfigError(
            section.key_path("idle_utilization_ratio"),
            "must be below busy_utilization_ratio",
        )
    if result.rdma_idle_bytes_per_second >= result.socket_busy_bytes_per_second:
        raise ConfigError(
            section.key_path("rdma_idle_bytes_per_second"),
            "must be below socket_busy_bytes_per_second",
        )
    if not result.comm_phases:
        raise ConfigError(section.key_path("comm_phases"), "name at least one phase")
    return result
