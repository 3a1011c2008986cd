"""GPU-hours: where the fleet's GPU time goes — goodput, badput by bucket, and what it costs.

Every node daemon books each second a rank holds its GPU to one bucket of the
goodput ledger (``trainmon_job_gpu_seconds_total{job,owner,bucket}``, docs/metrics.md);
the recording rules of ``trainmon-goodput*.rules`` (alerts/source/common.yml)
add them up per job (a job is its name and owner: docs/security.md, "Owners across
nodes"), team, bucket and currency over 10 minutes, an hour and a
day (``promql.GOODPUT_10M`` and the names beside it). Rows: the fleet (every job;
the variables do not apply), the jobs of ``$job`` and the teams of ``$team``,
each with its goodput, its badput by bucket and what the badput costs at the
GPU price the nodes are given. Each bucket series links its runbook and the
panel that shows its cause (``dashboards.buckets``); a job opens its Training
overview.
"""

from __future__ import annotations

from dashboards import fleet, promql, training
from dashboards.buckets import PRODUCTIVE, bucket_links
from dashboards.builder import Board, query_variable
from dashboards.panels import (
    Query,
    Step,
    bar_gauge,
    series_links,
    stat_panel,
    table_panel,
    timeseries,
)
from dashboards.promql import (
    FLEET_BUCKET_GPU_HOURS_1D,
    FLEET_BUCKET_GPUS_1H,
    JOB_BUCKET_COST_1D,
    JOB_BUCKET_COST_PER_HOUR_1H,
    JOB_BUCKET_GPU_HOURS_1D,
    JOB_BUCKET_GPUS_10M,
    TEAM_BUCKET_COST_1D,
    TEAM_BUCKET_COST_PER_HOUR_1H,
    TEAM_BUCKET_GPU_HOURS_1D,
    TEAM_BUCKET_GPUS_1H,
)
from dashboards.variant import FLEET, GOODPUT, TRAINING, Variant

#: Every bucket but the productive one: the losses.
BADPUT = f'bucket!="{PRODUCTIVE}"'
JOBS = 'job=~"$job"'
#: A job of the fleet: its name and its owner, whom another user's job of the same
#: name never mixes with.
BY_JOB = "job, owner"
TEAMS = 'team=~"$team"'
#: Red below the goodput of TrainmonLowGoodput.
GOODPUT_STEPS = (Step(None, "red"), Step(promql.GOODPUT_LOW, "green"))
#: The fleet's goodput over 10 minutes, from every job's buckets (no fleet rule has it).
FLEET_GOODPUT_10M = (
    f'sum({JOB_BUCKET_GPUS_10M}{{bucket="{PRODUCTIVE}"}})'
    f" / (sum({JOB_BUCKET_GPUS_10M}) > 0)"
)
#: How the day's series are counted, for their descriptions.
DAY = ("The day is counted in whole hours: the 24 hours up to the last full hour, so the "
       "hour in progress is not in it yet (empty until the rules have seen an hour end).")
PRICE = ("At each node's price per GPU-hour (instance_currency:trainmon_gpu_price_per_hour:max: "
         "collectors.ledger.price_per_gpu_hour, in the tencent-cloud bundle else the Tencent "
         "Cloud price of the instance type), in the currency shown; empty where no node has "
         "a price.")


def build(variant: Variant) -> Board:
    """The GPU-hours dashboard of ``variant``."""
    board = variant.board(
        GOODPUT,
        "Where the GPU-hours go: goodput (the share of the GPU-seconds jobs held that "
        "trained), badput by bucket of the goodput ledger, and what the badput costs — "
        "for the fleet, its jobs and its teams.",
        since="now-24h",
    )
    board.variable(query_variable(
        "job", "Jobs", "label_values(trainmon_job_gpu_seconds_total, job)",
        "Jobs of the Jobs row: every job the nodes' goodput ledgers book (All: all of them).",
        multi=True,
    ))
    board.variable(query_variable(
        "team", "Teams", "label_values(trainmon_job_team_info, team)",
        "Teams of the Teams row: the Kubernetes namespace, Slurm account or user of each "
        "job's processes (trainmon_job_team_info).",
        multi=True,
    ))
    # The panels each bucket links to, in the same variant's other dashboards.
    explaining = {TRAINING: training.build(variant), FLEET: fleet.build(variant)}
    _fleet_row(board, variant, explaining)
    _jobs_row(board, variant)
    _teams_row(board)
    return board


def _fleet_row(board: Board, variant: Variant, explaining: dict[str, Board]) -> None:
    board.row("Fleet: every job (the variables do not apply)")
    low = f"below {promql.GOODPUT_LOW:.0%} (red) is the level of TrainmonLowGoodput"
    board.add(stat_panel(
        "Goodput, 10 min", "percentunit",
        "Productive GPU-seconds over all GPU-seconds every job held in the last 10 minutes. "
        f"Good: as near 100 % as checkpoints and startups allow; {low}.",
        [Query(FLEET_GOODPUT_10M)],
        steps=GOODPUT_STEPS,
    ), width=4, height=4)
    board.add(stat_panel(
        "Goodput, 1 h", "percentunit",
        f"The fleet's goodput over the last hour ({promql.FLEET_GOODPUT_1H}). Good: near "
        f"100 %; {low}.",
        [Query(promql.FLEET_GOODPUT_1H)],
        steps=GOODPUT_STEPS,
    ), width=4, height=4)
    board.add(stat_panel(
        "Goodput, last day", "percentunit",
        f"The fleet's goodput over the last day ({promql.FLEET_GOODPUT_1D}): the figure "
        f"owners act on. Good: near 100 %; {low}. {DAY}",
        [Query(promql.FLEET_GOODPUT_1D)],
        steps=GOODPUT_STEPS,
    ), width=4, height=4)
    board.add(stat_panel(
        "GPUs held and lost", "short",
        "GPUs every job held on average over the last 10 minutes (one GPU per rank, and "
        "GPUs their processes hold without a rank), and of those the GPUs lost to badput "
        "(every bucket but productive). Good: lost a small share of held.",
        [Query(f"sum({JOB_BUCKET_GPUS_10M})", "held"),
         Query(f"sum({JOB_BUCKET_GPUS_10M}{{{BADPUT}}})", "lost")],
        show_name=True, decimals=1,
    ), width=4, height=4)
    board.add(stat_panel(
        "Badput cost per hour", "none",
        f"What the GPU time lost to badput cost per hour, over the last hour. {PRICE} "
        "Good: low against the GPUs' whole cost.",
        [Query(f"sum by (currency) ({JOB_BUCKET_COST_PER_HOUR_1H}{{{BADPUT}}})",
               "{{currency}}")],
        show_name=True, decimals=2,
    ), width=4, height=4)
    board.add(stat_panel(
        "Badput cost, last day", "none",
        f"What the GPU time lost to badput cost over the last day. {PRICE} {DAY} Good: low "
        "against the GPUs' whole cost.",
        [Query(f"sum by (currency) ({JOB_BUCKET_COST_1D}{{{BADPUT}}})", "{{currency}}")],
        show_name=True, decimals=2,
    ), width=4, height=4)
    board.add(timeseries(
        "Fleet goodput over time", "percentunit",
        "The fleet's goodput over 10 minutes and over the last hour. Good: flat near 100 %; "
        f"the dashed line is the {promql.GOODPUT_LOW:.0%} of TrainmonLowGoodput. A dip "
        "shared by many jobs points at shared storage or network; Badput by bucket says "
        "which loss it was.",
        [Query(FLEET_GOODPUT_10M, "10 min"), Query(promql.FLEET_GOODPUT_1H, "1 h")],
        minimum=0, maximum=1, steps=GOODPUT_STEPS,
    ), width=12)
    board.add(series_links(timeseries(
        "Badput by bucket", "short",
        "GPUs lost in each badput bucket over 10 minutes, summed over every job, stacked "
        "(productive, the rest of the GPUs, is left out): data_wait, comm_exposed, "
        "checkpoint, straggler_wait, stalled, startup, idle_allocated, lost_progress, "
        "other. Good: a thin stack. Click a bucket for its runbook and the panel that "
        "shows its cause.",
        [Query(f"sum by (bucket) ({JOB_BUCKET_GPUS_10M}{{{BADPUT}}})", "{{bucket}}")],
        minimum=0, stacked=True,
    ), bucket_links(variant, explaining, badput_only=True)), width=12)
    board.add(series_links(bar_gauge(
        "GPUs by bucket, last hour", "short",
        f"The fleet's GPUs in each bucket over the last hour ({FLEET_BUCKET_GPUS_1H}), "
        "productive included. Good: productive the longest bar by far. Click a bucket for "
        "its runbook and the panel that shows its cause.",
        [Query(FLEET_BUCKET_GPUS_1H, "{{bucket}}", instant=True)],
        steps=(Step(None, "blue"),),
    ), bucket_links(variant, explaining)), width=12)
    board.add(series_links(bar_gauge(
        "GPU-hours by bucket, last day", "short",
        f"The fleet's GPU-hours in each bucket over the last day "
        f"({FLEET_BUCKET_GPU_HOURS_1D}), productive included. {DAY} Good: productive the "
        "longest bar by far. Click a bucket for its runbook and the panel that shows its "
        "cause.",
        [Query(FLEET_BUCKET_GPU_HOURS_1D, "{{bucket}}", instant=True)],
        steps=(Step(None, "blue"),),
    ), bucket_links(variant, explaining)), width=12)


def _largest_loss(series: str, by: str, selector: str) -> str:
    """Each ``by`` group's badput bucket with the most GPUs (none without a loss)."""
    return (f"max by ({by}, bucket) (topk by ({by}) (1, {series}{{{BADPUT}, {selector}}}"
            " > 0))")


def _day_goodput(series: str, by: str, selector: str) -> str:
    """Productive GPU-hours over all GPU-hours of the day, per ``by``."""
    return (f'sum by ({by}) ({series}{{bucket="{PRODUCTIVE}", {selector}}})'
            f" / (sum by ({by}) ({series}{{{selector}}}) > 0)")


def _top_cost(series: str, by: str, selector: str) -> str:
    """The ten ``by`` with the highest badput cost, per currency."""
    return f"topk(10, sum by ({by}, currency) ({series}{{{BADPUT}, {selector}}}))"


def _jobs_row(board: Board, variant: Variant) -> None:
    board.row("Jobs ($job)")
    to_job = variant.row_link(TRAINING, "job", "owner")
    board.add(table_panel(
        "Goodput by job", "percentunit",
        "Each job's goodput over 10 minutes (the TrainmonLowGoodput measure), the last hour "
        "and the last day, the GPUs it held over 10 minutes, its largest loss (the badput "
        "bucket with the most GPUs, 10 minutes) and its GPU-hours of the day, over all its "
        f"nodes. Good: goodput green; below {promql.GOODPUT_LOW:.0%} (red) the largest loss "
        "says where to look (the Fleet row's buckets link their runbooks). "
        f"{DAY} Click a row for the job's Training overview.",
        [
            Query(f"max by ({BY_JOB}) ({promql.GOODPUT_10M}{{{JOBS}}})"),
            Query(f"max by ({BY_JOB}) ({promql.GOODPUT_1H}{{{JOBS}}})"),
            Query(_day_goodput(JOB_BUCKET_GPU_HOURS_1D, BY_JOB, JOBS)),
            Query(f"sum by ({BY_JOB}) ({JOB_BUCKET_GPUS_10M}{{{JOBS}}})"),
            Query(_largest_loss(JOB_BUCKET_GPUS_10M, BY_JOB, JOBS)),
            Query(f"sum by ({BY_JOB}) ({JOB_BUCKET_GPU_HOURS_1D}{{{JOBS}}})"),
        ],
        steps=GOODPUT_STEPS,
        renames={"Value #A": "goodput, 10 min", "Value #B": "goodput, 1 h",
                 "Value #C": "goodput, last day", "Value #D": "GPUs held",
                 "bucket": "largest loss", "Value #E": "GPUs lost to it",
                 "Value #F": "GPU-hours, last day"},
        column_units={"GPUs held": "short", "GPUs lost to it": "short",
                      "GPU-hours, last day": "short"},
        sort_by="GPUs held",
        links=[to_job],
    ), width=24, height=8)
    board.add(timeseries(
        "Badput by job", "short",
        "GPUs each job lost to badput (every bucket but productive) over 10 minutes, "
        "stacked. Good: a thin stack; a job that widens it is the one to open (click it).",
        [Query(f"sum by ({BY_JOB}) ({JOB_BUCKET_GPUS_10M}{{{BADPUT}, {JOBS}}})",
               "{{job}} ({{owner}})")],
        minimum=0, stacked=True,
    ).data_links([variant.series_link(TRAINING, "job", "owner")]), width=8)
    board.add(table_panel(
        "Top jobs by badput cost per hour", "none",
        f"The ten jobs whose badput cost most per hour, over the last hour. {PRICE} Good: "
        "short and small. Click a row for the job's Training overview.",
        [Query(_top_cost(JOB_BUCKET_COST_PER_HOUR_1H, BY_JOB, JOBS))],
        renames={"Value": "badput per hour"}, column_units={"badput per hour": "none"},
        sort_by="badput per hour", decimals=2, links=[to_job],
    ), width=8)
    board.add(table_panel(
        "Top jobs by badput cost, last day", "none",
        f"The ten jobs whose badput cost most over the last day. {PRICE} {DAY} Good: short "
        "and small. Click a row for the job's Training overview.",
        [Query(_top_cost(JOB_BUCKET_COST_1D, BY_JOB, JOBS))],
        renames={"Value": "badput, last day"}, column_units={"badput, last day": "none"},
        sort_by="badput, last day", decimals=2, links=[to_job],
    ), width=8)


def _teams_row(board: Board) -> None:
    board.row("Teams ($team)")
    board.add(table_panel(
        "Goodput by team", "percentunit",
        "Each team's goodput over the last hour and the last day, the GPUs its jobs held "
        "over the last hour, its largest loss (the badput bucket with the most GPUs, last "
        "hour) and its GPU-hours of the day (jobs whose team is not known yet are in no "
        f"team). Good: goodput green; below {promql.GOODPUT_LOW:.0%} (red) the team's jobs "
        f"in the Jobs row say which job loses it. {DAY}",
        [
            Query(f"max by (team) ({promql.TEAM_GOODPUT_1H}{{{TEAMS}}})"),
            Query(f"max by (team) ({promql.TEAM_GOODPUT_1D}{{{TEAMS}}})"),
            Query(f"sum by (team) ({TEAM_BUCKET_GPUS_1H}{{{TEAMS}}})"),
            Query(_largest_loss(TEAM_BUCKET_GPUS_1H, "team", TEAMS)),
            Query(f"sum by (team) ({TEAM_BUCKET_GPU_HOURS_1D}{{{TEAMS}}})"),
        ],
        steps=GOODPUT_STEPS,
        renames={"Value #A": "goodput, 1 h", "Value #B": "goodput, last day",
                 "Value #C": "GPUs held", "bucket": "largest loss",
                 "Value #D": "GPUs lost to it", "Value #E": "GPU-hours, last day"},
        column_units={"GPUs held": "short", "GPUs lost to it": "short",
                      "GPU-hours, last day": "short"},
        sort_by="GPUs held",
    ), width=24, height=8)
    board.add(timeseries(
        "Badput by team", "short",
        "GPUs each team's jobs lost to badput (every bucket but productive) over the last "
        "hour, stacked. Good: a thin stack.",
        [Query(f"sum by (team) ({TEAM_BUCKET_GPUS_1H}{{{BADPUT}, {TEAMS}}})", "{{team}}")],
        minimum=0, stacked=True,
    ), width=8)
    board.add(table_panel(
        "Top teams by badput cost per hour", "none",
        f"The ten teams whose jobs' badput cost most per hour, over the last hour. {PRICE} "
        "Good: short and small.",
        [Query(_top_cost(TEAM_BUCKET_COST_PER_HOUR_1H, "team", TEAMS))],
        renames={"Value": "badput per hour"}, column_units={"badput per hour": "none"},
        sort_by="badput per hour", decimals=2,
    ), width=8)
    board.add(table_panel(
        "Top teams by badput cost, last day", "none",
        f"The ten teams whose jobs' badput cost most over the last day. {PRICE} {DAY} Good: "
        "short and small.",
        [Query(_top_cost(TEAM_BUCKET_COST_1D, "team", TEAMS))],
        renames={"Value": "badput, last day"}, column_units={"badput, last day": "none"},
        sort_by="badput, last day", decimals=2,
    ), width=8)
