"""PromQL pieces shared by several dashboards.

Label conventions (docs/dashboards.md, "Labels the queries rely on"):

* ``node`` is added to every series by Prometheus relabelling (the node the
  target runs on), so trainmon, dcgm-exporter and node_exporter series join on it;
* ``gpu`` is the NVML index as a decimal string, in trainmon and dcgm-exporter alike;
* ``job`` on ``trainmon_training_*`` series is the training job's name: trainmon
  is scraped with ``honor_labels: true`` so the pushed label wins over the
  scrape job's. On every other series ``job`` is the scrape job;
* ``owner`` on the series of a training job (training, diagnosis, goodput) is the
  writer identity that holds the job on its node (docs/security.md, "Owners across
  nodes"): a job across nodes is (job, owner), and a panel of one job selects both,
  so another user's job of the same name never mixes into it.

Thresholds named here are the ones ``trainmon doctor`` and the alert rules use
(docs/diagnosis.md, "Thresholds"): each is read from ``trainmon.contract``,
their one home.
"""

from __future__ import annotations

from dataclasses import dataclass

from dashboards.builder import RATE
from trainmon import contract

#: Data loading should never take more than a fifth of a step (docs/diagnosis.md, "Thresholds").
DATA_WAIT_LIMIT = contract.DATA_WAIT_RATIO
#: Gradient sync above this share of the step makes the job communication-bound.
COMM_LIMIT = contract.COMM_RATIO
#: ``trainmon_gpu_sawtooth_ratio`` at or above this is flagged (one full cycle).
SAWTOOTH_FLAG = contract.SAWTOOTH_FLAG
#: A GPU idle in more than this fraction of the high-rate samples is "idle"
#: (busy in under ``contract.GPU_IDLE_RATIO`` of them, as TrainmonGPUHeldIdle).
IDLE_FRACTION = round(1 - contract.GPU_IDLE_RATIO, 9)
#: A link at this share of its rate is saturated.
LINK_SATURATION = contract.LINK_SATURATION_RATIO
#: Each rank's per-step work over the median of its job's ranks (a recording rule
#: of alerts/source/common.yml; it has the labels job, rank and instance).
STRAGGLER_RATIO = contract.STRAGGLER_RATIO_SERIES
#: At this straggler ratio one rank holds the job back.
STRAGGLER_FACTOR = contract.STRAGGLER_FACTOR

#: SM activity below this on a busy GPU is launch-bound (``TrainmonGPULowSMActivity``).
SM_ACTIVE_LOW = contract.GPU_SM_ACTIVE_LOW
#: Tensor-pipe activity below this on a busy GPU is no mixed precision
#: (``TrainmonGPUTensorCoresIdle``).
TENSOR_IDLE = contract.GPU_TENSOR_IDLE
#: DRAM activity at or above this is memory-bandwidth bound.
DRAM_ACTIVE_CEILING = contract.GPU_DRAM_ACTIVE_CEILING
#: Memory used at or above this share of the total is nearly full
#: (``TrainmonGPUMemoryNearlyFull``: less than ``GPU_MEMORY_HEADROOM_RATIO`` left).
MEMORY_FULL = round(1 - contract.GPU_MEMORY_HEADROOM_RATIO, 9)
#: A checkpoint older than this (seconds) on a spot instance is overdue
#: (``TrainmonCheckpointOverdue``).
CHECKPOINT_MAX_AGE = contract.CHECKPOINT_MAX_AGE_SECONDS
#: A GPU process with less than this share of its CPUs on its GPU's NUMA node runs on
#: the far socket (``TrainmonGPUProcessFarNUMA``).
NUMA_LOCAL_MIN = contract.NUMA_LOCAL_RATIO_MIN
#: Run ledger recording rules of alerts/source/common.yml (``trainmon-runs.rules``),
#: labelled job, run, config_hash and the run's shape (world_size, nodes): each live
#: run's samples/s per rank, the best earlier run of the same job, config and shape
#: (``best_run``), and the one over the other.
RUN_PER_RANK = "job_run:trainmon_training_samples_per_second_per_rank:rate10m"
RUN_BEST_COMPARABLE = "job_config:trainmon_training_samples_per_second_per_rank:best7d"
RUN_VS_BEST = "job_run:trainmon_training_throughput_vs_best:ratio"
#: The labels two runs are comparable by (the rules' ``on (…)`` of the ratio).
RUN_COMPARABLE_BY = "job, owner, config_hash, world_size, nodes"
#: A run below this share of the best comparable run's throughput has regressed
#: (``TrainmonThroughputRegression``: 1 − ``contract.THROUGHPUT_REGRESSION_RATIO``).
THROUGHPUT_REGRESSION_KEEP = round(1 - contract.THROUGHPUT_REGRESSION_RATIO, 9)
#: A job's goodput below this (0-1) for ``GOODPUT_LOW_WINDOW`` raises ``TrainmonLowGoodput``.
GOODPUT_LOW = contract.GOODPUT_LOW_RATIO
GOODPUT_LOW_WINDOW = contract.GOODPUT_LOW_WINDOW
#: Goodput recording rules of alerts/source/common.yml (trainmon-goodput*.rules), over
#: every node: each job's productive share of the GPU-seconds it held (10 minutes: the
#: alert's; 1 hour) and its GPUs in each bucket over 10 minutes (``job``, ``bucket``).
GOODPUT_10M = "job:trainmon_goodput:ratio_rate10m"
GOODPUT_1H = "job:trainmon_goodput:ratio_rate1h"
JOB_BUCKET_GPUS_10M = "job_bucket:trainmon_job_gpu_seconds:rate10m"
#: The fleet's, the teams' (labelled ``team``) and the cost's (``currency``, from the
#: price rule instance_currency:trainmon_gpu_price_per_hour:max): the hour's
#: (GPUs, goodput, cost per hour) and the day's, summed from the hour's at each full
#: hour (GPU-hours, goodput, cost; none before the rules have seen a full hour).
FLEET_BUCKET_GPUS_1H = "bucket:trainmon_job_gpu_seconds:rate1h"
FLEET_GOODPUT_1H = ":trainmon_goodput:ratio_rate1h"
FLEET_BUCKET_GPU_HOURS_1D = "bucket:trainmon_job_gpu_hours:sum1d"
JOB_BUCKET_GPU_HOURS_1D = "job_bucket:trainmon_job_gpu_hours:sum1d"
TEAM_BUCKET_GPU_HOURS_1D = "team_bucket:trainmon_job_gpu_hours:sum1d"
FLEET_GOODPUT_1D = ":trainmon_goodput:ratio_sum1d"
TEAM_BUCKET_GPUS_1H = "team_bucket:trainmon_job_gpu_seconds:rate1h"
TEAM_GOODPUT_1H = "team:trainmon_goodput:ratio_rate1h"
TEAM_GOODPUT_1D = "team:trainmon_goodput:ratio_sum1d"
JOB_BUCKET_COST_PER_HOUR_1H = "job_bucket_currency:trainmon_gpu_cost_per_hour:rate1h"
TEAM_BUCKET_COST_PER_HOUR_1H = "team_bucket_currency:trainmon_gpu_cost_per_hour:rate1h"
JOB_BUCKET_COST_1D = "job_bucket_currency:trainmon_gpu_cost:sum1d"
TEAM_BUCKET_COST_1D = "team_bucket_currency:trainmon_gpu_cost:sum1d"
#: Placement recording rules of alerts/source/common.yml (labelled ``job`` only):
#: distinct zones and leaf switches under the job's ranks.
JOB_ZONES = "job:trainmon_placement_zones:count"
JOB_LEAVES = "job:trainmon_placement_leaves:count"

#: Nodes running the node daemon: its node collectors report, a cloud puller's do not.
NODE_VARIABLE = 'label_values(trainmon_collector_success{collector=~"gpu|network|disk"}, node)'
#: The selected job and its owner (the job's recording rules, over every node).
OWNED_JOB = 'job="$job", owner="$owner"'
#: Training series of the selected job (and node filter) in the Training overview.
JOB = f'{OWNED_JOB}, node=~"$node"'
#: One row per (node, gpu) used by a rank of the selected job: ``X and on(node, gpu) JOB_GPUS``.
JOB_GPUS = f"trainmon_training_rank_info{{{JOB}}}"
#: GPUs of the selected node in the Node detail.
NODE_GPUS = 'node="$node", gpu=~"$gpu"'
#: Every node picked in the Fleet dashboard.
FLEET = 'node=~"$node"'
#: Per-node recording rules of the trainmon-fleet.rules group (alerts/source/common.yml;
#: the tensor one of each variant's trainmon-gpu-activity): the fleet's stats and timelines
#: read one series per node, not one per GPU or rank.
FLEET_GPUS = "node:trainmon_gpus:count"
FLEET_GPUS_UP = "node:trainmon_gpus_up:sum"
FLEET_GPUS_IDLE = "node:trainmon_gpus_idle:count"
FLEET_GPUS_SAWTOOTH = "node:trainmon_gpus_sawtooth:count"
FLEET_LEAST_BUSY_GPU = "node:trainmon_gpu_utilization_ratio:min"
FLEET_LEAST_TENSOR_ACTIVE_GPU = "node:gpu_tensor_active_ratio:min"
FLEET_JOB_RANKS = "job_node:trainmon_training_ranks:count"
#: The dcgm variant's (its trainmon-dcgm-fleet.rules).
FLEET_DCGM_GPUS = "node:dcgm_gpus:count"
FLEET_DCGM_GPUS_XID = "node:dcgm_gpus_xid:count"


def job_gpus(expr: str) -> str:
    """``expr`` (per node and gpu) restricted to the GPUs the selected job's ranks run on.

    A set operation, so several ranks on one GPU or a job on many nodes never
    makes the query fail the way a ``group_left`` join would.
    """
    return f"{expr} and on(node, gpu) {JOB_GPUS}"


def idle_fraction(selector: str) -> str:
    """Share of the daemon's high-rate utilization samples that were idle (0–1).

    ``selector`` is a label matcher list such as ``NODE_GPUS``, or "" for every GPU.
    """
    matchers = f"{{{selector}}}" if selector else ""
    return (
        f"rate(trainmon_gpu_util_idle_samples_total{matchers}[{RATE}])"
        f" / rate(trainmon_gpu_util_samples_total{matchers}[{RATE}])"
    )


def per_rank_ratio(numerator: str, selector: str, *, window: str = RATE) -> str:
    """``numerator`` seconds per second of step time, per rank (0–1)."""
    return (
        f"sum by (node, rank) (rate({numerator}[{window}]))"
        f" / sum by (node, rank) (rate(trainmon_training_step_seconds_sum{{{selector}}}[{window}]))"
    )


def job_ratio(numerator: str, selector: str, *, window: str = RATE) -> str:
    """``numerator`` seconds per second of step time over all ranks (0–1)."""
    return (
        f"sum(rate({numerator}[{window}]))"
        f" / sum(rate(trainmon_training_step_seconds_sum{{{selector}}}[{window}]))"
    )


def comm_wait(selector: str, *, by: str = "node, rank", window: str = RATE) -> str:
    """Seconds per second each rank (``by``) waited for communication.

    The exposed communication measured inside the job
    (``trainmon_training_comm_exposed_seconds_total``) where the rank measures
    it, else its ``comm`` phase: ``or`` keeps the left side's series and adds
    only ranks (label sets ``by``) it lacks, so a rank never counts both. The
    same choice as the diagnosis and the recording rule
    ``job_rank:trainmon_training_comm_wait_seconds:rate10m``.
    """
    return (
        f"(sum by ({by}) (rate(trainmon_training_comm_exposed_seconds_total{{{selector}}}"
        f"[{window}]))"
        f" or sum by ({by}) (rate(trainmon_training_phase_seconds_total"
        f'{{{selector}, phase="comm"}}[{window}])))'
    )


def comm_wait_ratio(selector: str, *, per_rank: bool, window: str = RATE) -> str:
    """``comm_wait`` over step time (0–1), per rank (by node, rank) or the job's.

    The job's is the ratio of the rank that waits least (``min`` of the per-rank
    ratios): in synchronous training the last rank to reach a collective waits
    only for the transfer, the others also for that rank, so time fast ranks
    spend waiting for a straggler is not shown as communication — the measure of
    the daemon's ``comm_ratio`` and of the recording rule
    ``job:trainmon_training_comm:ratio_rate10m`` behind
    ``TrainmonCommunicationBound``. A rank without a step in the range divides
    0 by 0: ``min`` passes over its NaN (the rule leaves it out with ``> 0``; a
    comparison here would read as a threshold to the contract test).
    """
    step = f"rate(trainmon_training_step_seconds_sum{{{selector}}}[{window}])"
    ratio = f"{comm_wait(selector, window=window)} / sum by (node, rank) ({step})"
    return ratio if per_rank else f"min({ratio})"


def phase_shares(selector: str, *, window: str = RATE) -> str:
    """Each phase's seconds per second of step time over all ranks (0–1), by ``phase``.

    The step-time sum has no ``phase`` label, so it divides every phase
    (``ignoring(phase) group_left``).
    """
    return (
        f"sum by (phase) (rate(trainmon_training_phase_seconds_total{{{selector}}}[{window}]))"
        " / ignoring(phase) group_left()"
        f" sum(rate(trainmon_training_step_seconds_sum{{{selector}}}[{window}]))"
    )


@dataclass(frozen=True)
class Activity:
    """A per-GPU activity ratio (0–1) that two sources measure from the same counters.

    ``daemon`` is the trainmon daemon's NVML GPM series (Hopper and newer GPUs),
    ``dcgm`` dcgm-exporter's DCGM profiling field; both are labelled ``gpu``.
    """

    daemon: str
    dcgm: str


SM_ACTIVE = Activity("trainmon_gpu_sm_active_ratio", "DCGM_FI_PROF_SM_ACTIVE")
TENSOR_ACTIVE = Activity("trainmon_gpu_tensor_active_ratio", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
DRAM_ACTIVE = Activity("trainmon_gpu_dram_active_ratio", "DCGM_FI_PROF_DRAM_ACTIVE")


def _matchers(selector: str) -> str:
    return f"{{{selector}}}" if selector else ""


def daemon_activity(activity: Activity, selector: str) -> str:
    """The daemon's GPM reading of ``activity`` (``selector``: label matchers or "")."""
    return f"{activity.daemon}{_matchers(selector)}"


def either_activity(activity: Activity, selector: str) -> str:
    """DCGM's reading of ``activity`` where dcgm-exporter exports the field, the daemon's
    GPM reading for every other GPU.

    ``or on(node, gpu)`` keeps each GPU once: DCGM profiling and NVML GPM share
    the GPU's performance counters, so a node runs one of them, and the
    alerts (``alerts/source/dcgm.yml``) make the same choice. Parenthesized,
    so it can be combined with ``and`` (which binds tighter than ``or``).
    """
    m = _matchers(selector)
    return f"({activity.dcgm}{m} or on(node, gpu) {activity.daemon}{m})"


def daemon_memory_share(selector: str) -> str:
    """Share of each GPU's memory in use (0–1), as the daemon reads it through NVML."""
    m = _matchers(selector)
    return f"(trainmon_gpu_memory_used_bytes{m} / trainmon_gpu_memory_total_bytes{m})"


def either_memory_share(selector: str) -> str:
    """The daemon's memory share, and DCGM's (``FB_USED / (FB_USED + FB_FREE)``) for GPUs
    the daemon does not see: the choice of ``TrainmonGPUMemoryNearlyFull``."""
    m = _matchers(selector)
    return (
        f"(trainmon_gpu_memory_used_bytes{m} / trainmon_gpu_memory_total_bytes{m}"
        f" or on(node, gpu) DCGM_FI_DEV_FB_USED{m}"
        f" / (DCGM_FI_DEV_FB_USED{m} + DCGM_FI_DEV_FB_FREE{m}))"
    )
