"""The numbers the diagnosis, the alert rules and the dashboards share: one home for each.

A threshold that the daemon's verdict (``trainmon.diagnosis``), an alert rule
(``alerts/source/*.yml``, assembled by ``alerts/generate.py``) or a dashboard
panel (``dashboards/*.py``) uses is defined here and read by all of them:

- ``trainmon.diagnosis.thresholds.DiagnosisConfig`` takes its defaults from here
  (a node's ``collectors.diagnosis`` section may still override them);
- ``alerts/generate.py`` substitutes them for the ``@TOKEN@`` placeholders of
  the rule sources (``alerts/generate.py`` lists the tokens);
- the dashboard generator draws them as threshold steps and writes them into
  its queries (``dashboards/promql.py``).

``tests/alerts/test_contract_thresholds.py`` parses the generated rule files,
PrometheusRules and dashboard JSON and fails where a number differs from
this module. The step protocol's fixed histogram bounds live here too
(``STEP_SECONDS_BOUNDS``): the client, the daemon's validator, the training
collector and the run ledger read them. Ratios are 0-1 unless a name says
otherwise. No imports, so that the training-side client and the generators
can read it anywhere. "tuning article §N" below is a section of the article
the project grew from (README.md, "The tuning article").
"""

from __future__ import annotations

#: storage: data-wait seconds over step seconds (0-1) at which a job is
#: storage-bound. The verdict takes the worst rank (``data_wait_ratio``), the
#: alert ``TrainmonDataLoaderBottleneck`` the job's ranks on a node; dashboards
#: draw it red. A fifth of every step spent waiting for input is where raising
#: ``num_workers`` or prefetching starts to pay more than any GPU-side change.
DATA_WAIT_RATIO = 0.2

#: communication: seconds the ranks wait for communication over step seconds
#: (0-1) at which a job is communication-bound (verdict ``comm_ratio``, alert
#: ``TrainmonCommunicationBound``, dashboards' red step). The wait is the
#: exposed communication measured inside the job where a rank measures it,
#: else its comm phase, never both.
COMM_RATIO = 0.3

#: scheduling: the share of a pipeline-parallel rank's step spent waiting for its
#: neighbouring stages (exposed communication of the ``pp`` group, on the rank that
#: waits least) at or above which the pipeline's bubbles are the finding
#: ``pipeline_bubble`` (verdict ``pipeline_bubble_ratio``). GPipe and 1F1B idle
#: (stages - 1) / (microbatches + stages - 1) of each step by design, a third with
#: two stages and two microbatches per stage; past 0.4 more microbatches, or an
#: interleaved schedule, pay.
PIPELINE_BUBBLE_RATIO = 0.4
#: The process-group name of pipeline stages (``comm_groups``): its waits are bubbles,
#: not communication that a faster network would remove.
PIPELINE_GROUP = "pp"

#: ``trainmon_gpu_sawtooth_ratio`` (0-1) at or above which a GPU is flagged:
#: one full busy→idle→busy cycle in the sampler's look-back of two windows
#: (``trainmon.gpu.sampler``). The verdict's ``sawtooth_ratio``, the alert
#: ``TrainmonGPUSawtooth`` and the dashboards' red step.
SAWTOOTH_FLAG = 0.5

#: scheduling: a rank whose per-step *work* (step − data wait − exposed comm
#: where measured, else the comm phase; seconds per step) is this many times
#: the median work of its job's ranks is
#: a straggler. One measure everywhere: the verdict (``straggler_factor``,
#: configurable per node), the alert ``TrainmonStragglerRank`` and the
#: dashboards' "Straggler ratio" panel, the latter two through the recording
#: rule ``STRAGGLER_RATIO_SERIES``. Healthy ranks differ by a few percent;
#: 1.25 leaves room for that jitter, and a rank 1.25× slower costs the
#: synchronous job a fifth of its throughput (1 − 1/1.25), the same share of
#: the step that ``DATA_WAIT_RATIO`` tolerates.
STRAGGLER_FACTOR = 1.25

#: The alert ``TrainmonStragglerRank`` also needs the straggler's work to
#: exceed the median by this many seconds per step, so that jobs with
#: millisecond steps do not page over scheduler noise.
STRAGGLER_MIN_EXCESS_SECONDS = 0.05

#: A GPU busy for less than this share of the time (0-1) is idle: mean
#: utilization over the window (the verdict's ``idle_utilization_ratio``), the
#: share of the sampler's samples at or above ``SAMPLER_IDLE_LEVEL`` (alert
#: ``TrainmonGPUHeldIdle``; dashboards count a GPU idle in more than
#: ``1 − GPU_IDLE_RATIO`` of its samples).
GPU_IDLE_RATIO = 0.05

#: A NIC or InfiniBand port carrying this share (0-1) of its link rate in its
#: busier direction is saturated (the verdict's ``link_utilization_ratio``, the
#: Node detail's link utilization panels).
LINK_SATURATION_RATIO = 0.8

#: The sampler's hysteresis on one utilization sample (0-1): below
#: ``SAMPLER_IDLE_LEVEL`` the GPU is idle, at or above ``SAMPLER_BUSY_LEVEL``
#: busy (``collectors.gpu.idle_threshold``/``busy_threshold`` defaults,
#: ``trainmon.gpu.sampler``). The scraped sawtooth fallbacks of the alert rules
#: count crossings of the busy level.
SAMPLER_IDLE_LEVEL = 0.1
SAMPLER_BUSY_LEVEL = 0.5

#: Rate window (a Prometheus duration) of the training recording rules
#: (``trainmon-training.rules``, ``trainmon-diagnosis.rules``): ten minutes
#: smooth over checkpoints and evaluation passes. Their names end in it
#: (``…:ratio_rate10m``), and ``alerts/generate.py`` refuses a rule whose name
#: and range selectors disagree with it.
TRAINING_RULE_WINDOW = "10m"

#: The recording rule of the straggler measure: each rank's per-step work over
#: the median of its job's ranks on every node, over ``TRAINING_RULE_WINDOW``.
#: Produced by ``alerts/source/common.yml``; read by the alert and the dashboards.
STRAGGLER_RATIO_SERIES = "job_rank:trainmon_training_straggler:ratio_rate10m"

#: compute, GPM (Hopper and newer): a GPU busy by ``trainmon_gpu_utilization_ratio``
#: whose ``trainmon_gpu_sm_active_ratio`` (share of SMs busy over the GPM
#: interval, 0-1; DCGM's SM active) stays below this runs kernels that leave most SMs idle:
#: small kernels, launch-bound or host-overhead-bound steps (finding
#: ``launch_bound``). NVML utilization counts any kernel as busy; DCGM's
#: profiling guide reads SM activity below 0.5 as ineffective use of the GPU
#: (0.8 or more being necessary for effective use).
GPU_SM_ACTIVE_LOW = 0.5

#: compute, GPM: ``trainmon_gpu_tensor_active_ratio`` (share of cycles a tensor
#: pipe is active, 0-1) below this on a GPU whose SMs are active is tensor cores
#: left idle: matrix multiplies in FP32 on the CUDA cores, mixed precision
#: (bf16/AMP, TF32) not in use (finding ``tensor_idle``). A bf16 or TF32
#: transformer keeps them busy for tens of percent of its cycles; a few
#: percent is what convolution or attention kernels alone leave behind.
GPU_TENSOR_IDLE = 0.05

#: compute, GPM: ``trainmon_gpu_dram_active_ratio`` (DRAM bandwidth used over
#: its peak, 0-1) at or above this is memory-bound: the kernels wait for HBM
#: bandwidth, not for math (finding ``memory_bound``). Streaming kernels reach
#: about 0.8-0.9 of the theoretical peak; from 0.7 bandwidth, not arithmetic,
#: sets the pace.
GPU_DRAM_ACTIVE_CEILING = 0.7

#: compute, memory headroom (显存是否够用): a GPU whose
#: ``trainmon_gpu_memory_used_bytes`` is within this share (0-1) of its
#: ``trainmon_gpu_memory_total_bytes`` is at risk of running out of memory
#: (finding ``oom_risk``, naming the job and its GPUs). NVML's "used" includes
#: what PyTorch's caching allocator keeps reserved, so a job near this line
#: has no room left for a longer sequence, a larger batch or fragmentation.
GPU_MEMORY_HEADROOM_RATIO = 0.05

#: The alerts' "looks busy": mean NVML utilization (0-1) over 15 minutes above
#: which a GPU counts as busy for ``TrainmonGPULowSMActivity`` and
#: ``TrainmonGPUTensorCoresIdle`` (``trainmon_gpu_utilization_ratio``, or
#: dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL`` in percent), so that a GPU between
#: jobs or in an evaluation pass does not trip them. Their activity thresholds
#: are ``GPU_SM_ACTIVE_LOW`` and ``GPU_TENSOR_IDLE``; the Node detail's activity
#: panels draw the same lines.
GPU_BUSY_UTILIZATION_RATIO = 0.8

#: Platform signals, NCCL transport (tuning article §2.2: "look at the NCCL log: IB or
#: Socket"). A multi-node job whose ranks wait at least this share (0-1) of each
#: step for communication (the ``COMM_RATIO`` measure: measured exposed
#: communication, else the comm phase, of the rank that waits least) moves enough
#: gradient traffic to show on the links, so ACTIVE RDMA ports that stay idle while
#: an Ethernet NIC is busy mean NCCL fell back to TCP sockets (diagnosis finding
#: ``nccl_over_sockets``, alert ``TrainmonNCCLOverSockets``). A third of
#: ``COMM_RATIO``: the fallback is worth fixing long before the job is
#: communication-bound.
NCCL_SOCKET_MIN_COMM_RATIO = 0.1

#: NCCL transport: an ACTIVE InfiniBand/RoCE port (``trainmon_infiniband_port_up``
#: 1) whose receive + transmit bytes per second stay below this carries no
#: gradient traffic. Subnet management and RoCE keep-alives are kilobytes per
#: second; NCCL over IB moves hundreds of MB/s to GB/s per port.
RDMA_IDLE_BYTES_PER_SECOND = 10e6

#: NCCL transport: an Ethernet NIC (``trainmon_network_*_bytes_total``) whose
#: receive + transmit bytes per second reach this carries bulk traffic: 100 MB/s
#: (0.8 Gbit/s) is far above control and logging traffic and well below what
#: gradients over TCP push through a 10-100 Gbit/s cloud NIC.
SOCKET_BUSY_BYTES_PER_SECOND = 100e6

#: Checkpoint safety (tuning article §4.1, §6.2): on a spot instance, a job whose last
#: checkpoint (``trainmon_training_last_checkpoint_timestamp_seconds``) is older
#: than this many seconds loses that much work when the instance is reclaimed
#: (diagnosis finding ``checkpoint_overdue``, critical while a reclaim is
#: scheduled; alert ``TrainmonCheckpointOverdue``). Half an hour is the usual
#: checkpoint interval of large jobs and what a spot reclaim may cost at most.
CHECKPOINT_MAX_AGE_SECONDS = 1800.0

#: NUMA binding (tuning article §4.3): a GPU process with less than this share (0-1) of
#: its allowed CPUs on its GPU's NUMA node
#: (``trainmon_gpu_process_numa_local_ratio``) runs mostly on the far socket:
#: host-to-device copies and the NIC cross the inter-socket link (diagnosis
#: finding ``numa_far``, alert ``TrainmonGPUProcessFarNUMA``). Below a half
#: most of the process's threads are remote.
NUMA_LOCAL_RATIO_MIN = 0.5

#: Spot reclaim (tuning article §4.1, §6.2): seconds of notice Tencent Cloud gives
#: before it reclaims a spot instance ("Two minutes before the interruption, we
#: will notify you in the form of metadata",
#: https://intl.cloud.tencent.com/document/product/213/17817). The platform
#: poller reads ``spot/termination-time`` every 5 s so that most of it is left
#: (``trainmon_node_spot_termination_timestamp_seconds``); the alert
#: ``TrainmonSpotReclaimScheduled`` and the dashboards can count down from it.
SPOT_RECLAIM_NOTICE_SECONDS = 120.0

#: Run ledger (tuning article §6.3: "compare with history when training got slower"):
#: a run whose samples per second per rank are more than this share (0-1) below
#: the best earlier run of the same job and ``config_hash`` has regressed. The
#: alert ``TrainmonThroughputRegression`` (recording rule
#: ``job_run:trainmon_training_throughput_vs_best:ratio`` below
#: ``1 − THROUGHPUT_REGRESSION_RATIO``) and ``trainmon doctor``'s "vs the previous
#: comparable run" line share it. A fifth, as ``DATA_WAIT_RATIO`` and the straggler
#: factor: run-to-run noise of a fixed benchmark is a few percent, and a fifth of
#: the throughput is a fifth of the GPU hours paid for.
THROUGHPUT_REGRESSION_RATIO = 0.2

#: How long (a Prometheus duration) a run must stay that much slower before
#: ``TrainmonThroughputRegression`` fires (its ``for``): longer than a checkpoint
#: or an evaluation pass, so only a sustained slowdown pages. The rules also wait
#: until a run has run for one ``TRAINING_RULE_WINDOW`` (its warm-up and the
#: previous run's samples out of the rate window) before they compare it.
THROUGHPUT_REGRESSION_WINDOW = "15m"

#: How far back the best earlier run of a job is looked for (seconds): the
#: ``[7d:1h]`` of the recording rule
#: ``job_run:trainmon_training_samples_per_second_per_rank:best7d`` behind
#: ``TrainmonThroughputRegression``, and ``trainmon doctor``'s "fastest comparable
#: run" (``trainmon.runs.baseline.fastest``). A week holds the runs of last
#: week's same weekday, and Prometheus reads 168 hourly points per run for it.
THROUGHPUT_BEST_LOOKBACK_SECONDS = 7 * 86400.0

#: Goodput (issue 26; the tuning article's aim: GPUs busy with matrix multiplies, not
#: waiting for data, gradients or locks): a job whose productive share of the
#: GPU-seconds it held (``job:trainmon_goodput:ratio_rate10m``) stays below this
#: (0-1) for ``GOODPUT_LOW_WINDOW`` raises ``TrainmonLowGoodput``. Half: below it the
#: job spends more of its GPU time waiting, stalled or redoing work than training, a
#: loss no healthy job shows for half an hour (checkpoints and startup take a few
#: percent).
GOODPUT_LOW_RATIO = 0.5

#: How long the goodput must stay that low before ``TrainmonLowGoodput`` fires: longer
#: than a job's startup or a stall short enough to clear by itself.
GOODPUT_LOW_WINDOW = "30m"

#: Run ledger (tuning article §6.3): a run whose ranks still report but have not
#: completed a step for this many seconds is recorded with end reason
#: ``stalled`` (``collectors.ledger.stall_seconds``); it becomes a running run
#: again when steps resume. Ten minutes outlasts a long checkpoint save or an
#: evaluation pass, which are not stalls.
LEDGER_STALL_SECONDS = 600.0

#: The per-node series budget docs/deploy.md promises ("Scaling"): a demo node
#: (8 GPUs, two 4-rank jobs, default configuration) exposes fewer series than
#: this, so one Prometheus or vmagent shard sizes by node count.
#: tests/deploy/test_series_count.py counts the demo against it.
SERIES_PER_NODE_BUDGET = 1100

#: Step protocol v1 (docs/protocol.md, "A report"): the upper bounds (seconds,
#: inclusive, Prometheus ``le``) of the step-time histogram. ``step_buckets``
#: has one count per bound plus a last count for steps longer than the last
#: bound (``STEP_BUCKET_COUNT``). Fixed by the protocol version: the client
#: (``trainmon.client.reporter``) counts its steps into them, the daemon's
#: validator (``trainmon.training.protocol``) checks the count, the training
#: collector exports them as ``le`` and the run ledger
#: (``trainmon.ledger.summary``) reads its percentiles from them.
STEP_SECONDS_BOUNDS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)
STEP_BUCKET_COUNT = len(STEP_SECONDS_BOUNDS) + 1

#: Step protocol v1, ``step_sketch`` (docs/protocol.md): the step-time sketch the run
#: ledger reads its step percentiles from (``trainmon.training.sketch``, DDSketch's log
#: buckets). Fixed by the protocol version like ``STEP_SECONDS_BOUNDS``: the client
#: counts its steps into it, the daemon's validator checks it, the training store and
#: the run ledger merge it. Every quantile it gives is within this share (0-1) of the
#: exact one: a bucket spans a factor (1 + a) / (1 - a), 1.0202 for 1 %.
STEP_SKETCH_RELATIVE_ACCURACY = 0.01
#: The most non-empty buckets one sketch holds (a report, a rank, a run). 256 buckets
#: span at least a factor of 167 (1.0202^256) of step durations, so a job's steps
#: rarely fill them; past it the sketch merges every pair of neighbouring buckets (a
#: level up: 2 %, then 4 %, 8 %). On the wire they take at most about 6 KiB of a report
#: line (3 KiB with counts below a million).
STEP_SKETCH_MAX_BUCKETS = 256
#: The step durations the sketch tells apart, seconds: a shorter step counts as
#: ``STEP_SKETCH_MIN_SECONDS``, a longer one as ``STEP_SKETCH_MAX_SECONDS``.
STEP_SKETCH_MIN_SECONDS = 1e-6
STEP_SKETCH_MAX_SECONDS = 1e6

#: A rank has stalled when no step of it ended for this many typical steps (the median
#: of its steps) ...
STALL_TYPICAL_STEPS = 10.0
#: ... and at least this many seconds. The client's stall watchdog
#: (``trainmon.client.watchdog``) reports where the rank is from then on, and the goodput
#: ledger books the time ``stalled`` (``trainmon.ledger.goodput``). Ten steps keep a
#: job with slow but regular steps (20 s each: 200 s) quiet; ten seconds keep a
#: rank's garbage collection or a slow batch from looking like a hang.
STALL_FLOOR_SECONDS = 10.0


def stall_threshold(typical_step_seconds: float | None) -> float:
    """Seconds without a step that make a stall: ``STALL_TYPICAL_STEPS`` typical steps,
    at least ``STALL_FLOOR_SECONDS`` (the floor alone while the typical step is unknown)."""
    return max(STALL_TYPICAL_STEPS * (typical_step_seconds or 0.0), STALL_FLOOR_SECONDS)

#: Where every runbook link points: the alert rules' ``runbook_url``
#: (``alerts/generate.py``, which may be given another with ``--runbook-base-url``) and
#: the dashboards' bucket links; the page is ``<base><AlertName>.md``.
RUNBOOK_BASE_URL = "https://github.com/trainmon/trainmon/blob/main/docs/runbooks/"
