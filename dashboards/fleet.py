"""Fleet: every node and GPU at once — idle and sawtooth GPUs, exporters, XIDs, jobs, placement.

Ranked panels link to the Node detail of a node and the Training overview of
a job, so the fleet view is where an investigation starts.
"""

from __future__ import annotations

from dashboards import promql
from dashboards.builder import RATE, Board, query_variable
from dashboards.panels import (
    NODE_GPU,
    RED_FROM_ONE,
    UP_DOWN,
    Query,
    Step,
    bar_gauge,
    stat_panel,
    state_timeline,
    table_panel,
    timeseries,
    value_mappings,
)
from dashboards.promql import FLEET
from dashboards.variant import FLEET as FLEET_KIND
from dashboards.variant import NODE, TRAINING, Variant

#: trainmon_collector_success + trainmon_collector_available.
COLLECTOR_STATES = value_mappings(
    {"2": ("ok", "green"), "1": ("failing", "red"), "0": ("no source", "blue")}
)
TRAINMON_ALERTS = 'ALERTS{alertname=~"Trainmon.*"}'
TRAINMON_ALERTS_FIRING = 'ALERTS{alertname=~"Trainmon.*", alertstate="firing"}'


def build(variant: Variant) -> Board:
    """The Fleet dashboard of ``variant``."""
    board = variant.board(
        FLEET_KIND,
        "All nodes and GPUs: idle and sawtooth GPUs, exporters up, XID events, jobs "
        "ranked by data wait.",
    )
    board.variable(query_variable(
        "node", "Nodes", promql.NODE_VARIABLE,
        "Restrict the fleet to some nodes (All: every node running trainmon).", multi=True,
    ))
    _glance_row(board)
    _gpu_row(board, variant)
    _jobs_row(board, variant)
    _placement_row(board, variant)
    variant.fleet_rows(board, variant)
    _health_row(board, variant)
    return board


def _glance_row(board: Board) -> None:
    board.row("At a glance")
    board.add(stat_panel(
        "Nodes", "short", "Nodes with a trainmon daemon Prometheus scrapes. Good: all of them.",
        [Query(f"count(trainmon_build_info{{{FLEET}}})")],
    ), width=3, height=4)
    board.add(stat_panel(
        "GPUs up", "short",
        "GPUs readable through NVML across the fleet, of those found. Good: equal.",
        [Query(f"sum({promql.FLEET_GPUS_UP}{{{FLEET}}})", "up"),
         Query(f"sum({promql.FLEET_GPUS}{{{FLEET}}})", "found")],
        show_name=True,
    ), width=3, height=4)
    board.add(stat_panel(
        "Idle GPUs", "short",
        f"GPUs idle in more than {promql.IDLE_FRACTION:.0%} of the high-rate samples of the "
        "last 5 minutes. Good: "
        "as many as are free on purpose; idle GPUs held by a job are wasted (调).",
        [Query(f"sum({promql.FLEET_GPUS_IDLE}{{{FLEET}}}) or vector(0)")],
        steps=(Step(None, "green"), Step(1, "yellow")),
    ), width=3, height=4)
    board.add(stat_panel(
        "Sawtooth GPUs", "short",
        f"GPUs whose sawtooth ratio is {promql.SAWTOOTH_FLAG} or more: busy/idle cycles, "
        "usually a data-starved job. Good: 0.",
        [Query(f"sum({promql.FLEET_GPUS_SAWTOOTH}{{{FLEET}}}) or vector(0)")],
        steps=RED_FROM_ONE,
    ), width=3, height=4)
    board.add(stat_panel(
        "Scrape targets down", "short",
        "Prometheus targets on these nodes whose last scrape failed (up == 0): trainmon, "
        "dcgm-exporter or anything else scraped there. Good: 0.",
        [Query(f"count(up{{{FLEET}}} == 0) or vector(0)")],
        steps=RED_FROM_ONE,
    ), width=3, height=4)
    board.add(stat_panel(
        "XID events in range", "short",
        "NVIDIA driver XID errors across the fleet in the selected range. Good: 0.",
        [Query(f"sum(increase(trainmon_gpu_xid_errors_total{{{FLEET}}}[$__range]))"
               " or vector(0)")],
        steps=RED_FROM_ONE,
    ), width=3, height=4)
    board.add(stat_panel(
        "Training jobs", "short",
        "Jobs with at least one rank reporting to a daemon on these nodes (a job name "
        "two users run counts twice: each is its own job).",
        [Query(f"count(count by (job, owner) ({promql.FLEET_JOB_RANKS}{{{FLEET}}}))"
               " or vector(0)")],
    ), width=3, height=4)
    board.add(stat_panel(
        "Alerts firing", "short",
        "Trainmon alerts firing now (pending ones are in the Alerts table below). Good: 0.",
        [Query(f"count({TRAINMON_ALERTS_FIRING}) or vector(0)")],
        steps=RED_FROM_ONE,
    ), width=3, height=4)


def _gpu_row(board: Board, variant: Variant) -> None:
    board.row("GPUs")
    to_node = [variant.series_link(NODE, "node")]
    board.add(state_timeline(
        "GPU utilization, least busy GPU per node", "percentunit",
        "Each node's least busy GPU (red idle → green busy), each minute; the Node detail "
        "shows every GPU. Good: solid green where jobs run; red/green stripes are sawtooth "
        "GPUs, solid red rows nodes with an idle GPU.",
        [Query(f"{promql.FLEET_LEAST_BUSY_GPU}{{{FLEET}}}", "{{node}}")],
    ).data_links(to_node), width=24, height=10)
    board.add(state_timeline(
        "Tensor pipe active, least active GPU per node", "percentunit",
        "Each node's least active GPU's tensor-pipe activity, each minute: red below "
        f"{promql.TENSOR_IDLE:.0%}, green above. Good: green where mixed-precision training "
        "runs; red rows under a busy GPU mean no tensor cores (check bf16/AMP). "
        + variant.activity_source,
        [Query(f"{promql.FLEET_LEAST_TENSOR_ACTIVE_GPU}{{{FLEET}}}", "{{node}}")],
        steps=(Step(None, "red"), Step(promql.TENSOR_IDLE, "green")),
    ).data_links(to_node), width=24, height=10)
    board.add(bar_gauge(
        "Most idle GPUs", "percentunit",
        "The ten GPUs with the largest idle share of the high-rate samples over the selected "
        "range. Good: only GPUs nobody holds; click a bar for its node.",
        [Query(
            "topk(10, rate(trainmon_gpu_util_idle_samples_total"
            f"{{{FLEET}}}[$__range]) / rate(trainmon_gpu_util_samples_total{{{FLEET}}}"
            "[$__range]))",
            NODE_GPU, instant=True,
        )],
        maximum=1, steps=(Step(None, "green"), Step(0.3, "yellow"),
                          Step(promql.IDLE_FRACTION, "red")),
        links=to_node,
    ))
    board.add(bar_gauge(
        "Strongest sawtooth", "percentunit",
        "The ten GPUs with the highest sawtooth ratio now. Good: all 0; at 0.5 and above "
        "the GPU is flagged (see the Training overview of the job on it).",
        [Query(f"topk(10, trainmon_gpu_sawtooth_ratio{{{FLEET}}})", NODE_GPU, instant=True)],
        maximum=1, steps=(Step(None, "green"), Step(promql.SAWTOOTH_FLAG, "red")),
        links=to_node,
    ))


def _jobs_row(board: Board, variant: Variant) -> None:
    board.row("Jobs")
    to_job = [variant.series_link(TRAINING, "job", "owner")]
    board.add(bar_gauge(
        "Top jobs by data wait", "percentunit",
        "Jobs ranked by data wait over step time in the selected range. Good: all below "
        "10 %; above 20 % the job is storage-bound. Click a bar for the job.",
        [Query(
            "topk(10, sum by (job, owner) (rate(trainmon_training_data_wait_seconds_total"
            f"{{{FLEET}}}[$__range])) / sum by (job, owner) ("
            f"rate(trainmon_training_step_seconds_sum{{{FLEET}}}[$__range])))",
            "{{job}} ({{owner}})", instant=True,
        )],
        maximum=1,
        steps=(Step(None, "green"), Step(0.1, "yellow"), Step(promql.DATA_WAIT_LIMIT, "red")),
        links=to_job,
    ), width=8)
    board.add(table_panel(
        "Bottleneck verdict by job", "none",
        "Each job's current verdict from the daemon's diagnosis. Good: compute (the GPU is "
        "the limit) or none while a job starts.",
        [Query(f"max by (job, owner, kind) (trainmon_bottleneck{{{FLEET}}} == 1)")],
        hidden=("Value",),
        links=[variant.row_link(TRAINING, "job", "owner")],
    ), width=8)
    board.add(timeseries(
        "Samples/s by job", "short",
        "Training throughput of every job. Good: flat lines; a dip shared by several jobs "
        "points at shared storage or network.",
        [Query(f"sum by (job, owner) (rate(trainmon_training_samples_total{{{FLEET}}}"
               f"[{RATE}]))", "{{job}} ({{owner}})")],
        minimum=0,
    ).data_links(to_job), width=8)


def _placement_row(board: Board, variant: Variant) -> None:
    board.row("Placement and spot instances")
    board.add(table_panel(
        "Zones and leaf switches per job", "short",
        "How many availability zones and leaf switches the nodes of each job's ranks are "
        "in (trainmon_node_info zone and leaf; nodes without them are not counted). Good: "
        "1 and 1 — across zones every collective pays inter-zone latency, across leaves "
        "extra hops through the spine (TrainmonJobSpansZones, TrainmonJobSpansLeaves).",
        [Query(promql.JOB_ZONES), Query(promql.JOB_LEAVES)],
        steps=(Step(None, "green"), Step(2, "red")),
        renames={"Value #A": "zones", "Value #B": "leaf switches"},
        links=[variant.row_link(TRAINING, "job", "owner")],
    ), width=8)
    board.add(table_panel(
        "Nodes: instance and placement", "none",
        "Every node's provider, instance type, region, zone and configured placement "
        "labels (leaf, rack). Click a row for the node.",
        [Query(f"trainmon_node_info{{{FLEET}}}")],
        hidden=("Value", "instance", "job"),
        links=[variant.row_link(NODE, "node")],
    ), width=10)
    board.add(stat_panel(
        "Spot instances", "short",
        "Nodes on spot (竞价) instances, which the cloud can reclaim with two minutes' "
        "notice, and of those the ones with a reclaim scheduled now. Good: no reclaim; "
        "jobs on spot nodes checkpoint often.",
        [Query(f"count(trainmon_node_spot_instance{{{FLEET}}} == 1) or vector(0)", "spot"),
         Query(f"count(trainmon_node_spot_termination_timestamp_seconds{{{FLEET}}})"
               " or vector(0)", "reclaim scheduled")],
        show_name=True,
    ), width=6)


def _health_row(board: Board, variant: Variant) -> None:
    board.row("Exporters, XIDs and alerts")
    to_node = [variant.row_link(NODE, "node")]
    board.add(table_panel(
        "Scrape targets", "none",
        "Every Prometheus target on these nodes (job here is the scrape job) and whether its "
        "last scrape worked. Good: all up.",
        [Query(f"up{{{FLEET}}}")],
        mappings=UP_DOWN, steps=(Step(None, "red"), Step(1, "green")), links=to_node,
    ), width=8)
    board.add(table_panel(
        "trainmon collectors", "none",
        "Each node's collectors: ok, failing (the source exists but the last collection "
        "failed; /healthz says why) or no source (e.g. no InfiniBand on this node). Good: "
        "no failing row.",
        [Query(f"min by (node, collector) (trainmon_collector_success{{{FLEET}}}"
               f" + trainmon_collector_available{{{FLEET}}})")],
        mappings=COLLECTOR_STATES, steps=(Step(None, "blue"), Step(1, "red"), Step(2, "green")),
        links=to_node,
    ), width=8)
    board.add(table_panel(
        "XID events", "short",
        "GPUs that have had an XID since their daemon started: count in the selected range "
        "and when the last one happened. Good: no count above 0.",
        [Query(f"sum by (node, gpu, xid) (increase(trainmon_gpu_xid_errors_total{{{FLEET}}}"
               "[$__range]))"),
         Query(f"max by (node, gpu, xid) (trainmon_gpu_xid_last_timestamp_seconds{{{FLEET}}})"
               " * 1000")],
        steps=RED_FROM_ONE,
        renames={"Value #A": "XIDs in range", "Value #B": "last XID at"},
        column_units={"last XID at": "dateTimeAsIso"},
        links=to_node,
    ), width=8)
    board.add(table_panel(
        "Trainmon alerts", "none",
        "Every Trainmon alert that is pending or firing, with its labels. Good: empty; "
        "each alert's runbook_url has the next step.",
        [Query(TRAINMON_ALERTS)],
        hidden=("Value",),
    ), width=24, height=7)
