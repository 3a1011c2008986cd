"""Training overview: one job, read the way an engineer checks it — 算 通 存 调.

Top row: the daemon's bottleneck verdict and the headline numbers. Then one row
per question: step time and stragglers (调), the job's runs — this run against
the best earlier run with the same config, and what a million samples cost —,
its goodput — the share of its GPU-seconds that trained, and where the rest
went (the goodput ledger's buckets, each linking its runbook) —, data loading
(存), checkpoints — how old, how long, on which storage (存), gradient sync
(通), the job's GPUs and their sawtooth (算), and the alerts that concern it.
A marker at each run start names what changed since the job's previous run
(the run ledger, ``trainmon_training_run_changes_info``); a marker at each run
end names how it ended (``trainmon_training_run_end_timestamp_seconds``: green
for a clean finish, red for crashed, preempted, lost or stalled).
"""

from __future__ import annotations

from dashboards import promql
from dashboards.activity import add_activity_panels
from dashboards.buckets import bucket_links
from dashboards.builder import RATE, Board, PromAnnotation, dashboard_url, link, query_variable
from dashboards.panels import (
    NODE_GPU,
    Query,
    Step,
    series_links,
    stat_panel,
    state_timeline,
    table_panel,
    timeseries,
    value_mappings,
)
from dashboards.promql import (
    JOB,
    JOB_GPUS,
    OWNED_JOB,
    comm_wait_ratio,
    job_gpus,
    job_ratio,
    per_rank_ratio,
    phase_shares,
)
from dashboards.variant import FLEET, NODE, TITLES, TRAINING, Variant

#: ``trainmon_bottleneck`` kinds and the number each is drawn as (docs/diagnosis.md).
VERDICTS = (
    ("none", 0, "none — not enough data yet", "text"),
    ("compute", 1, "compute 算 — the GPU is the limit", "green"),
    ("communication", 2, "communication 通 — gradient sync", "orange"),
    ("storage", 3, "storage 存 — data loading", "red"),
    ("scheduling", 4, "scheduling 调 — idle GPUs, stragglers, stalls", "purple"),
)
VERDICT = "max(\n  " + "\n  or ".join(
    f'(trainmon_bottleneck{{{OWNED_JOB}, kind="{kind}"}} == 1) * {code}'
    for kind, code, _, _ in VERDICTS
) + "\n)"
VERDICT_MAPPINGS = value_mappings({str(code): (text, color) for _, code, text, color in VERDICTS})

STEP_BUCKETS = f"trainmon_training_step_seconds_bucket{{{JOB}}}"
STEP_SUM = f"trainmon_training_step_seconds_sum{{{JOB}}}"
STEP_COUNT = f"trainmon_training_step_seconds_count{{{JOB}}}"
DATA_WAIT = f"trainmon_training_data_wait_seconds_total{{{JOB}}}"
#: Communication measured inside the job (Reporter.instrument): all seconds with a
#: collective in flight, the exposed part of them, and the collectives' bytes.
COMM_MEASURED = f"trainmon_training_comm_seconds_total{{{JOB}}}"
COMM_EXPOSED = f"trainmon_training_comm_exposed_seconds_total{{{JOB}}}"
GROUP_EXPOSED = f"trainmon_training_group_comm_exposed_seconds_total{{{JOB}}}"
COMM_BYTES = f"trainmon_training_comm_bytes_total{{{JOB}}}"
#: Step time of the ranks that measure their exposed communication.
MEASURED_STEP = f"sum(rate({STEP_SUM}[{RATE}]) and on(node, rank) {COMM_EXPOSED})"
RANK_MEAN_STEP = (
    f"sum by (node, rank) (rate({STEP_SUM}[{RATE}]))"
    f" / sum by (node, rank) (rate({STEP_COUNT}[{RATE}]))"
)
RANK_LEGEND = "rank {{rank}} ({{node}})"
#: The straggler recording rule of the job: labelled job, owner, rank, instance (no node).
STRAGGLER = f'{promql.STRAGGLER_RATIO}{{{OWNED_JOB}}}'
#: Each run of the job by its start (ms, for Grafana's "value as time"), with the
#: keys that changed since the job's previous run in the ledger (`changed`; one
#: node's answer where nodes differ).
RUN_START = (f"max by (job, owner, run) (trainmon_training_run_start_timestamp_seconds"
             f"{{{OWNED_JOB}}}) * 1000")
RUN_STARTS = (
    f"  {RUN_START}\n"
    "* on (job, owner, run) group_left (changed)\n"
    f"  topk by (job, owner, run) (1, trainmon_training_run_changes_info{{{OWNED_JOB}}})\n"
    f"or\n  {RUN_START}"
)
#: Each end of a run of the job (ms) with the ledger's reason, per node that saw it:
#: the clean ends, and the others (crashed, preempted, lost, stalled).
RUN_END = "trainmon_training_run_end_timestamp_seconds"
RUN_FINISHES = (f'max by (job, owner, run, reason, goodput) '
                f'({RUN_END}{{{OWNED_JOB}, reason="finished"}}) * 1000')
RUN_FAILURES = (f'max by (job, owner, run, reason, goodput) '
                f'({RUN_END}{{{OWNED_JOB}, reason!="finished"}}) * 1000')
#: How the run ledger names each end reason, for the markers' text.
RUN_END_TEXT = (
    "How the run ended, as the run ledger of a node that saw it says: finished (its ranks "
    "said so at a clean end), crashed (an exception ended a rank), preempted (SIGTERM: a "
    "scheduler or a spot reclaim), lost (a rank went silent without a word), stalled (no "
    "step for collectors.ledger.stall_seconds). trainmon runs / compare tell the rest. "
    "goodput: the run's productive share of its GPU-seconds on the node that saw it end; "
    "the Goodput row shows the job's, and its GPUs by bucket, at the marker."
)
#: The job's goodput recording rules (over all its nodes: $node does not apply).
JOB_GOODPUT_10M = f'{promql.GOODPUT_10M}{{{OWNED_JOB}}}'
JOB_GOODPUT_1H = f'{promql.GOODPUT_1H}{{{OWNED_JOB}}}'
JOB_BUCKET_GPUS = f'{promql.JOB_BUCKET_GPUS_10M}{{{OWNED_JOB}}}'

#: What the job's ranks cost per second (price per GPU hour of their node × ranks
#: there, one GPU per rank) over its samples per second, per million samples.
COST_PER_MILLION = (
    "1e6 * sum by (currency) (\n"
    f"    count by (instance) ({JOB_GPUS})\n"
    "  * on (instance) group_left (currency) trainmon_ledger_price_per_gpu_hour\n"
    ") / 3600\n"
    f"/ on () group_left () sum(rate(trainmon_training_samples_total{{{JOB}}}[{RATE}]))"
)


def build(variant: Variant) -> Board:
    """The Training overview dashboard of ``variant``."""
    board = variant.board(
        TRAINING,
        "Per training job: is it held back by compute (算), communication (通), "
        "storage (存) or scheduling (调)?",
    )
    board.variable(query_variable(
        "job", "Training job", "label_values(trainmon_training_steps_total, job)",
        "The job name the training processes report (Reporter(job=...)).",
    ))
    board.variable(query_variable(
        "owner", "Owner",
        'label_values(trainmon_training_steps_total{job="$job"}, owner)',
        "Whose job: the writer identity that holds the job on its nodes (uid:<n>, "
        "token:<name>, local). Other users may run jobs of the same name; each is its own "
        "job here (docs/security.md, \"Owners across nodes\").",
    ))
    board.variable(query_variable(
        "node", "Node", f"label_values(trainmon_training_rank_info{{{OWNED_JOB}}}, node)",
        "Nodes the job's ranks run on; narrow it to look at one node's ranks.", multi=True,
    ))
    board.annotation(PromAnnotation(
        "Run starts", RUN_STARTS, title="Run {{run}} started",
        text="Changed since the job's previous run: {{changed}}", tags=("job", "run"),
    ))
    board.annotation(PromAnnotation(
        "Run ends", RUN_FINISHES, title="Run {{run}} ended: {{reason}}, goodput {{goodput}}",
        text=RUN_END_TEXT,
        tags=("job", "run", "reason"), color="green",
    ))
    board.annotation(PromAnnotation(
        "Run failures", RUN_FAILURES, title="Run {{run}} ended: {{reason}}, goodput {{goodput}}",
        text=RUN_END_TEXT,
        tags=("job", "run", "reason"), color="red",
    ))
    _verdict_row(board)
    _step_row(board)
    _runs_row(board)
    _goodput_row(board, variant)
    _data_row(board)
    _checkpoint_row(board)
    _comm_row(board, variant)
    _gpu_row(board, variant)
    variant.training_rows(board, variant)
    _alerts_row(board, variant)
    return board


def _verdict_row(board: Board) -> None:
    board.row("Verdict — 算 compute · 通 communication · 存 storage · 调 scheduling")
    board.add(stat_panel(
        "Bottleneck verdict", "none",
        "What the daemon's diagnosis (trainmon_bottleneck) names as the job's limit, in the "
        "order an engineer checks: GPU first, then storage, then network. Good: compute "
        "(the GPU is the limit, so kernels, AMP and batch size are the levers). storage: "
        "data wait above 20 % of step time; communication: exposed comm above ~30 %; "
        "scheduling: idle "
        "GPUs, stragglers or a stalled job. `trainmon doctor` prints the evidence.",
        [Query(VERDICT, instant=True)],
        mappings=VERDICT_MAPPINGS,
    ), width=6, height=5)
    board.add(state_timeline(
        "Verdict over time", "none",
        "The verdict through the selected time range. Good: one steady color, compute; "
        "a verdict that flips between storage and compute means data loading is marginal.",
        [Query(VERDICT, legend="verdict")],
        minimum=0, maximum=4, mappings=VERDICT_MAPPINGS,
    ), width=18, height=5)
    board.add(stat_panel(
        "Samples/s", "short",
        "Training throughput: samples per second over all ranks. Good: flat at the rate "
        "this model reaches on this hardware; dips line up with data wait or comm spikes.",
        [Query(f"sum(rate(trainmon_training_samples_total{{{JOB}}}[{RATE}]))")],
    ), width=3, height=4)
    board.add(stat_panel(
        "Step time p50", "s",
        "Median step duration over all ranks (histogram trainmon_training_step_seconds). "
        "Good: stable, and close to p95.",
        [Query(f"histogram_quantile(0.5, sum by (le) (rate({STEP_BUCKETS}[{RATE}])))")],
    ), width=3, height=4)
    board.add(stat_panel(
        "Step time p95", "s",
        "95th percentile step duration. Good: within ~20 % of p50; a long tail points at "
        "stragglers, data stalls or checkpoints.",
        [Query(f"histogram_quantile(0.95, sum by (le) (rate({STEP_BUCKETS}[{RATE}])))")],
    ), width=3, height=4)
    board.add(stat_panel(
        "Data-wait ratio", "percentunit",
        "Seconds blocked waiting for the next batch per second of step time, all ranks. "
        "Good: below 10 %; above 20 % the job is storage-bound (raise num_workers, "
        "prefetch, move data to local NVMe).",
        [Query(job_ratio(DATA_WAIT, JOB))],
        steps=(Step(None, "green"), Step(0.1, "yellow"), Step(promql.DATA_WAIT_LIMIT, "red")),
    ), width=3, height=4)
    board.add(stat_panel(
        "Comm ratio", "percentunit",
        "Time the rank that waits least spends waiting for gradient sync per second of its "
        "step time: the exposed communication measured inside the job "
        "(reporter.instrument(model)) where a rank measures it, else its `comm` phase "
        "(reporter.phase(\"comm\")), never both. The least-waiting rank waits only for "
        "the transfer, so fast ranks waiting for a straggler do not count (see Straggler "
        "ratio) — the measure of the TrainmonCommunicationBound alert and the daemon's "
        "communication verdict. Good: below 20 %; above 30 % the job is "
        "communication-bound (check NCCL_IB_*, NCCL_SOCKET_IFNAME, NVLink/IB link rates, "
        "bucket size and overlap).",
        [Query(comm_wait_ratio(JOB, per_rank=False))],
        steps=(Step(None, "green"), Step(0.2, "yellow"), Step(promql.COMM_LIMIT, "red")),
    ), width=3, height=4)
    board.add(stat_panel(
        "Straggler ratio", "none",
        "Largest per-step work (step time minus data wait minus exposed comm, else the "
        "comm phase) of a rank over "
        "the median of the job's ranks on every node, last 10 minutes: the measure of the "
        "TrainmonStragglerRank alert and the daemon's straggler verdict. Step times cannot "
        "show a straggler, as synchronised ranks all wait for it. Good: below 1.1; at "
        f"{promql.STRAGGLER_FACTOR:g} one rank holds every collective back (see Straggler "
        "ratio per rank).",
        [Query(f"max({STRAGGLER})")],
        steps=(Step(None, "green"), Step(1.1, "yellow"), Step(promql.STRAGGLER_FACTOR, "red")),
        decimals=2,
    ), width=3, height=4)
    board.add(stat_panel(
        "Ranks reporting", "short",
        "Ranks of this job whose reports the daemons currently hold (series expire after "
        "the TTL, 5 minutes by default). Good: equals the job's world size.",
        [Query(f"count({JOB_GPUS})")],
    ), width=3, height=4)
    board.add(stat_panel(
        "Since last step", "s",
        "Seconds since the most recent step of any rank. Good: about one step time; "
        "minutes mean the job stalled or finished.",
        [Query(f"time() - max(trainmon_training_last_step_timestamp_seconds{{{JOB}}})")],
        steps=(Step(None, "green"), Step(60, "yellow"), Step(300, "red")),
    ), width=3, height=4)


def _step_row(board: Board) -> None:
    board.row("Step time and stragglers (调)")
    board.add(timeseries(
        "Step time p50 / p95", "s",
        "Step duration percentiles over all ranks. Good: two flat lines close together; "
        "p95 spikes that repeat every N steps are usually checkpoints or evaluation.",
        [
            Query(f"histogram_quantile(0.5, sum by (le) (rate({STEP_BUCKETS}[{RATE}])))", "p50"),
            Query(f"histogram_quantile(0.95, sum by (le) (rate({STEP_BUCKETS}[{RATE}])))", "p95"),
        ],
        minimum=0,
    ), width=8)
    board.add(timeseries(
        "Mean step time per rank", "s",
        "Each rank's mean step duration. Good: all ranks on one line. In synchronous "
        "training every rank waits for the slowest, so equal lines do not rule out a "
        "straggler (see Straggler ratio per rank); a rank above the rest runs on its own.",
        [Query(RANK_MEAN_STEP, RANK_LEGEND)],
        minimum=0,
    ), width=8)
    board.add(timeseries(
        "Straggler ratio per rank", "none",
        "Each rank's per-step work (step time minus data wait minus exposed comm, else the "
        "comm phase) over the "
        "median of the job's ranks on every node, last 10 minutes "
        f"({promql.STRAGGLER_RATIO}). Good: every rank near 1; a rank at "
        f"{promql.STRAGGLER_FACTOR:g} (dashed) or above is the straggler the others wait for "
        "in their collectives — check its node's GPU clocks, throttling and data wait.",
        [Query(STRAGGLER, "rank {{rank}} ({{instance}})")],
        minimum=0, steps=(Step(None, "green"), Step(promql.STRAGGLER_FACTOR, "red")),
    ), width=8)
    board.add(timeseries(
        "Throughput", "short",
        "Samples and steps per second over all ranks. Good: flat; a drop that coincides "
        "with data wait is storage, with comm is communication.",
        [
            Query(f"sum(rate(trainmon_training_samples_total{{{JOB}}}[{RATE}]))", "samples/s"),
            Query(f"sum(rate(trainmon_training_steps_total{{{JOB}}}[{RATE}]))", "steps/s"),
        ],
        minimum=0,
    ), width=24, height=7)


def _runs_row(board: Board) -> None:
    board.row("Runs: this run vs the previous comparable run, cost")
    keep = promql.THROUGHPUT_REGRESSION_KEEP
    board.add(stat_panel(
        "This run vs best comparable run", "percentunit",
        "Samples/s per rank of each live run of the job over those of the best earlier "
        "run of the job with the same config_hash, world size and node count in the last "
        "7 days (no longer running anywhere), once the run has run 10 minutes "
        f"({promql.RUN_VS_BEST}). Good: about 100 %; below {keep:.0%} (red) for 15 minutes "
        "TrainmonThroughputRegression fires — run `trainmon compare <best run> <this run>`. "
        "Empty for a first run, a changed config, another world size or node count and "
        "the first 10 minutes of a run.",
        [Query(f'{promql.RUN_VS_BEST}{{{OWNED_JOB}}}', "{{run}} vs {{best_run}}",
               instant=True)],
        steps=(Step(None, "red"), Step(keep, "green")), show_name=True,
    ), width=6, height=7)
    board.add(timeseries(
        "Samples/s per rank: this run vs best comparable run", "short",
        "Samples per second per rank of each run of the job over 10 minutes (its ranks on "
        "every node; per rank, so that runs on different numbers of GPUs sit side by "
        "side), and the best such throughput of an earlier run with the same config_hash, "
        "world size and node count. Good: this run's line at or above the dashed best; a "
        "run start marker above the chart names the keys that changed since the previous "
        "run.",
        [
            Query(f'{promql.RUN_PER_RANK}{{{OWNED_JOB}}}',
                  "run {{run}} ({{world_size}} ranks, {{nodes}} nodes)"),
            Query(
                f'{promql.RUN_BEST_COMPARABLE}{{{OWNED_JOB}}}'
                f' and on ({promql.RUN_COMPARABLE_BY}) {promql.RUN_PER_RANK}{{{OWNED_JOB}}}',
                "best earlier run {{best_run}} (same config, {{world_size}} ranks, "
                "{{nodes}} nodes)",
            ),
        ],
        minimum=0, dashed=("best earlier run .*",),
    ), width=12, height=7)
    board.add(stat_panel(
        "Cost per million samples", "none",
        "What a million samples of this job cost at the configured GPU price: price per GPU "
        "hour of each node (collectors.ledger.price_per_gpu_hour, "
        "trainmon_ledger_price_per_gpu_hour) × the job's ranks there (one GPU per rank), "
        "summed over its nodes, per second, over its samples per second, × 10⁶; in the "
        "currency shown. Good: lower after a change; the run ledger keeps each run's cost "
        "(trainmon runs). Empty where no price is configured.",
        [Query(COST_PER_MILLION, "{{currency}}")],
        show_name=True, decimals=2,
    ), width=6, height=7)


def _goodput_row(board: Board, variant: Variant) -> None:
    board.row("Goodput: where the job's GPU-hours go")
    low = promql.GOODPUT_LOW
    board.add(stat_panel(
        "Goodput (10 min)", "percentunit",
        "Share of the GPU-seconds the job's ranks held over the last 10 minutes that went "
        "to productive steps, over all its nodes ($node does not apply): the goodput "
        f"ledger's {promql.GOODPUT_10M}. Good: as near 100 % as the job's checkpoints "
        f"allow; TrainmonLowGoodput fires once it stays below {low:.0%} (red) for "
        f"{promql.GOODPUT_LOW_WINDOW}. The chart beside it says which bucket took the rest.",
        [Query(JOB_GOODPUT_10M)],
        steps=(Step(None, "red"), Step(low, "green")),
    ), width=4, height=8)
    board.add(timeseries(
        "Goodput over time", "percentunit",
        "The job's goodput over 10 minutes and over the last hour, all its nodes. Good: "
        f"flat near 100 %; the dashed line is the {low:.0%} of TrainmonLowGoodput. A run end "
        "marker (Run ends, Run failures) above the chart shows the goodput as the run "
        "ended; a crash is followed by lost_progress and startup in the chart beside.",
        [Query(JOB_GOODPUT_10M, "10 min"), Query(JOB_GOODPUT_1H, "1 h")],
        minimum=0, maximum=1, steps=(Step(None, "red"), Step(low, "green")),
    ), width=8, height=8)
    board.add(series_links(timeseries(
        "GPUs by goodput bucket", "short",
        "The job's GPUs (GPU-seconds per second over 10 minutes, all its nodes) by bucket of "
        "the goodput ledger, stacked: the top of the stack is the GPUs it holds, productive "
        "what trains, every other bucket a loss — data_wait (存, the Data loading row), "
        "comm_exposed and straggler_wait (通 and 调, Communication and Straggler ratio per "
        "rank), checkpoint, stalled, startup, idle_allocated (GPUs its processes hold "
        "without a rank reporting), lost_progress (steps redone after a crash) and other. "
        "Good: productive nearly all of it. Click a bucket for its runbook.",
        [Query(JOB_BUCKET_GPUS, "{{bucket}}")],
        minimum=0, stacked=True,
    ), bucket_links(variant, {})), width=12, height=8)


def _data_row(board: Board) -> None:
    board.row("Data loading (存)")
    board.add(timeseries(
        "Data-wait ratio per rank", "percentunit",
        "Share of each rank's step time spent blocked in the data loader (counters). "
        "Good: below 10 % on every rank; the dashed line is the 20 % storage verdict.",
        [Query(per_rank_ratio(DATA_WAIT, JOB), RANK_LEGEND)],
        minimum=0, steps=(Step(None, "green"), Step(promql.DATA_WAIT_LIMIT, "red")),
    ))
    board.add(timeseries(
        "Data wait per step", "s",
        "Mean seconds each step waited for its batch, per rank. Good: near zero; compare "
        "with the step time to see how much of the step it costs.",
        [Query(
            f"sum by (node, rank) (rate({DATA_WAIT}[{RATE}]))"
            f" / sum by (node, rank) (rate({STEP_COUNT}[{RATE}]))",
            RANK_LEGEND,
        )],
        minimum=0,
    ))


def _checkpoint_row(board: Board) -> None:
    board.row("Checkpoints (存): age, duration, storage")
    board.add(timeseries(
        "Checkpoint age", "s",
        "Time since the newest checkpoint of the job's ranks on each node. Good: a "
        "sawtooth that drops at every checkpoint; on a spot instance above "
        f"{promql.CHECKPOINT_MAX_AGE / 60:.0f} min (dashed) is overdue — a reclaim would "
        "lose that much work (TrainmonCheckpointOverdue).",
        [Query(f"time() - max by (node) (trainmon_training_last_checkpoint_timestamp_seconds"
               f"{{{JOB}}})", "{{node}}")],
        minimum=0, steps=(Step(None, "green"), Step(promql.CHECKPOINT_MAX_AGE, "red")),
    ), width=8)
    board.add(timeseries(
        "Last checkpoint duration", "s",
        "How long the job's last checkpoint took on each node (the slowest rank). Good: a "
        "small share of the checkpoint interval; minutes point at slow storage, see the "
        "Node detail's disks and NFS mounts.",
        [Query(f"max by (node) (trainmon_training_last_checkpoint_duration_seconds{{{JOB}}})",
               "{{node}}")],
        minimum=0,
    ), width=8)
    board.add(table_panel(
        "Checkpoint storage", "none",
        "Where the job's checkpoints go: mount point, file system and storage kind. Good: "
        "cloud_disk (CBS), network_fs (CFS, NFS, Lustre) or object_store (COS); local_disk "
        "and ephemeral are lost with a cloud instance (TrainmonCheckpointOnLocalDisk).",
        [Query(f"trainmon_training_checkpoint_storage_info{{{JOB}}}")],
        hidden=("Value", "instance", "job"),
    ), width=8)


def _comm_row(board: Board, variant: Variant) -> None:
    board.row("Communication (通)")
    board.add(timeseries(
        "Comm ratio per rank", "percentunit",
        "Share of each rank's step time spent waiting for communication: its exposed comm "
        "where the rank measures it (reporter.instrument(model)), else its `comm` phase. "
        "Good: below 20 %; the dashed line is the 30 % communication verdict, which the "
        "lowest line must cross (fast ranks above a low straggler are waiting for it, not "
        "for the network). Ranks that neither measure nor report a comm phase are absent.",
        [Query(comm_wait_ratio(JOB, per_rank=True), RANK_LEGEND)],
        minimum=0, steps=(Step(None, "green"), Step(promql.COMM_LIMIT, "red")),
    ), width=8)
    board.add(timeseries(
        "Communication: exposed vs overlapped", "percentunit",
        "Collective time of the ranks that measure it, as a share of their step time: "
        "exposed (the ranks wait with their compute done: it costs step time) and "
        "overlapped (hidden under backward: free). NVML counts NCCL kernels as GPU busy, "
        "so busy GPUs with a high exposed share are still communication-bound. Good: "
        "exposed below 20 % (the dashed line is the 30 % verdict); a large overlapped "
        "share with little exposed is healthy overlap. Empty when no rank measures.",
        [
            Query(f"sum(rate({COMM_EXPOSED}[{RATE}])) / {MEASURED_STEP}", "exposed"),
            Query(
                f"(sum(rate({COMM_MEASURED}[{RATE}])) - sum(rate({COMM_EXPOSED}[{RATE}])))"
                f" / {MEASURED_STEP}",
                "overlapped",
            ),
        ],
        minimum=0, steps=(Step(None, "green"), Step(promql.COMM_LIMIT, "red")),
    ), width=8)
    board.add(timeseries(
        "Exposed communication by parallelism dimension", "percentunit",
        "The exposed communication of the ranks that measure it, split by the process "
        "group it waits in, named by its mesh dimension (trainmon_training_group_comm_"
        "exposed_seconds_total: dp data parallel, tp tensor parallel, pp pipeline stages, "
        "cp context parallel, world the default group), as a share of their step time. "
        "Data-parallel waits are what the network and bucket sizes tune; tensor-parallel "
        "waits are on the critical path by design (keep the TP group inside a node); "
        "pipeline waits are the schedule's bubbles (more microbatches). The dashed line is "
        "the 30 % communication verdict.",
        [Query(f"sum by (group) (rate({GROUP_EXPOSED}[{RATE}])) / on() group_left() "
               f"{MEASURED_STEP}", "{{group}}")],
        minimum=0, steps=(Step(None, "green"), Step(promql.COMM_LIMIT, "red")),
    ), width=8)
    board.add(timeseries(
        "Effective bandwidth vs link rate", "Bps",
        "Bytes of the collectives' buffers per second a collective was in flight, per rank "
        "(rate of trainmon_training_comm_bytes_total over trainmon_training_comm_seconds_total), "
        "and each node's collective bytes per second over the window, against the rate of "
        "one InfiniBand/RoCE port and one NIC of the job's nodes. Good: the in-flight rate "
        "near what nccl-tests all_reduce_perf reaches on these links; far below a port's "
        "rate points at a TCP fallback (NCCL_IB_*, NCCL_SOCKET_IFNAME), a degraded link or "
        "small buckets.",
        [
            Query(f"sum(rate({COMM_BYTES}[{RATE}])) / sum(rate({COMM_MEASURED}[{RATE}]))",
                  "in flight, per rank"),
            Query(f"sum by (node) (rate({COMM_BYTES}[{RATE}]))", "{{node}} collective bytes/s"),
            Query(f"max by (node) (trainmon_infiniband_rate_bytes and on(node) {JOB_GPUS})",
                  "{{node}} InfiniBand port rate"),
            Query(f"max by (node) (trainmon_network_speed_bytes and on(node) {JOB_GPUS})",
                  "{{node}} NIC link rate"),
        ],
        minimum=0,
    ), width=12)
    board.add(timeseries(
        "Step time by phase", "percentunit",
        "Every named phase (comm, checkpoint, …) as a share of step time. Good: comm well "
        "below 30 %, checkpoint a small, periodic share. A comm phase times the whole "
        "collective, overlapped part included; the panels above show what the steps wait for.",
        [Query(phase_shares(JOB), "{{phase}}")],
        minimum=0,
    ), width=12)
    board.add(timeseries(
        "Network throughput of the job's nodes", "Bps",
        "InfiniBand/RoCE and Ethernet bytes per second (receive + transmit) on the nodes "
        "running this job. Good: well below the link rate (Node detail shows the rate); "
        "flat at the link rate while comm is high means the network is the limit.",
        [
            Query(
                f"sum by (node) (rate(trainmon_infiniband_receive_bytes_total[{RATE}])"
                f" + rate(trainmon_infiniband_transmit_bytes_total[{RATE}]))"
                f" and on(node) {JOB_GPUS}",
                "{{node}} InfiniBand",
            ),
            Query(
                f"sum by (node) (rate(trainmon_network_receive_bytes_total[{RATE}])"
                f" + rate(trainmon_network_transmit_bytes_total[{RATE}]))"
                f" and on(node) {JOB_GPUS}",
                "{{node}} Ethernet",
            ),
        ],
        minimum=0,
        # Open the node behind a series in Node detail.
    ).data_links([variant.series_link(NODE, "node")]),
        width=24)


def _gpu_row(board: Board, variant: Variant) -> None:
    board.row("The job's GPUs (算) — sawtooth")
    board.add(state_timeline(
        "GPU utilization (job's GPUs)", "percentunit",
        "Each GPU the job's ranks run on, colored by utilization (red idle → green busy). "
        "Good: solid green. Stripes that alternate red and green are the sawtooth of a "
        "data-starved job: the GPU finishes a batch, then waits for the next one.",
        [Query(job_gpus("trainmon_gpu_utilization_ratio"), NODE_GPU)],
    ), width=24, height=9)
    board.add(timeseries(
        "Sawtooth ratio", "percentunit",
        "Strength of the busy/idle oscillation seen by the daemon's high-rate sampler "
        "(~6 samples/s, which a 15–30 s scrape cannot see): 0 steady, 0.5 one full "
        "busy→idle→busy cycle, 1 two or more in the last two windows. Good: 0; at or "
        "above 0.5 (dashed) the GPU is flagged.",
        [Query(job_gpus("trainmon_gpu_sawtooth_ratio"), NODE_GPU)],
        minimum=0, maximum=1,
        steps=(Step(None, "green"), Step(promql.SAWTOOTH_FLAG, "red")),
    ))
    board.add(timeseries(
        "GPU idle fraction (high-rate sampler)", "percentunit",
        "Share of the driver's utilization samples below the idle threshold. Good: near 0 "
        "while the job runs; a GPU idle 30 % of the time wastes 30 % of what it costs.",
        [Query(job_gpus(f"({promql.idle_fraction('')})"), NODE_GPU)],
        minimum=0, maximum=1,
    ))
    board.add(timeseries(
        "NUMA locality of the job's GPU processes", "percentunit",
        "Share of the CPUs each process on the job's GPUs may run on that are on the GPU's "
        "NUMA node. Good: 1 (bound to the GPU's socket) or about 0.5 (unbound on two "
        f"sockets); below {promql.NUMA_LOCAL_MIN:.0%} (red) it runs on the far socket "
        "(TrainmonGPUProcessFarNUMA). Absent where the host does not report the topology "
        "(virtualised hosts).",
        [Query(job_gpus("trainmon_gpu_process_numa_local_ratio"),
               "{{node}} GPU {{gpu}} pid {{pid}}")],
        minimum=0, maximum=1,
        steps=(Step(None, "red"), Step(promql.NUMA_LOCAL_MIN, "green")),
    ), width=24, height=6)
    board.row("The job's GPUs (算) — how much of each GPU the kernels use")
    add_activity_panels(board, variant, "", NODE_GPU, scope=job_gpus, suffix=" (job's GPUs)")


def _alerts_row(board: Board, variant: Variant) -> None:
    board.row("Alerts")
    board.add(table_panel(
        "Trainmon alerts for this job", "none",
        "Trainmon alerts (pending and firing) whose job is this one or whose node runs one of "
        "its ranks. Good: empty. Each alert's runbook_url gives the next step.",
        [Query(
            f'ALERTS{{alertname=~"Trainmon.*", {OWNED_JOB}}}'
            f' or (ALERTS{{alertname=~"Trainmon.*"}} and on(node) {JOB_GPUS})',
        )],
        hidden=("Value",),
        links=[link(TITLES[FLEET], dashboard_url(variant.uid(FLEET)))],
    ), width=24, height=7)
