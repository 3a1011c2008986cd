"""The diagnosis, scored: real CPU jobs with known faults, the daemon's verdicts graded.

A labelled suite of real ``torch.distributed`` jobs (gloo, CPU;
``testkit/parallel_launch.py``: DDP, FSDP2, FSDP2 with tensor parallelism, a
pipeline, Lightning) runs against one ``trainmon serve`` whose diagnosis window is
shortened to ``WINDOW_SECONDS``; a case is (kind, fault, confounders), and its
truth a class and, for the rank faults, a rank:

=================  ==========================================================  ==========
truth class        faults                                                      rank
=================  ==========================================================  ==========
``compute``        ``healthy``, alone and with each confounder (``eval``,      –
                   ``checkpoint``, ``warmup``, ``varlen``) and with all of them
``storage``        ``storage``                                                 –
``communication``  ``communication`` (network namespaces, a shaped veth)       –
``straggler``      ``slow_rank``                                               the slow one
``hung_rank``      ``hang_loader``, ``hang_collective``, ``hang_lock``,        the culprit
                   ``hang_checkpoint``, ``sigstop``, ``kill``
=================  ==========================================================  ==========

Several cases run at a time (``--parallel``; their ranks mostly sleep), each for a
bounded time: ``STEADY_SECONDS`` after the job's first report for the steady
classes, ``HANG_SECONDS`` after the fault began for the hangs. The daemon is
scraped every second; at each scrape a case's *prediction* is its job's
``hung_rank`` finding (with its rank) if one fired, else its ``straggler`` finding
(with its rank), else its ``trainmon_bottleneck`` kind (``scheduling`` without those
two findings is a wrong class of its own, ``none`` the absence of a verdict). A
prediction is right when its class is the truth's and, for the rank classes, its
rank too.

Scored, per case: the *final* prediction (the most frequent over the last
``FINAL_SCRAPES`` scrapes, ties to the latest); the time to the right verdict
(the first scrape whose prediction is right and stays right for
``STABLE_SCRAPES`` consecutive scrapes, from the job's first report, or from the
fault for the hangs); the time to name the hung rank (the first scrape with a
``hung_rank`` finding naming it, from the fault); on ``compute`` cases every
false finding (a ``scheduling``, ``storage`` or ``communication`` finding of the
verdict's rules; the platform risk findings, ``RISK_FINDINGS``, are not claims
about the bottleneck). Over the suite: precision, recall and F1 per class of the
final predictions, their macro-F1, the times' p50 and p95 (a case that never got
there counts as infinitely late), false findings per healthy job-hour (each
onset once) and whether a healthy job paged (a false ``PAGING_FINDINGS``).

    .venv/bin/python -m bench.diagnosis_score --json bench/results/diagnosis_score.json
    .venv/bin/python -m bench.diagnosis_score --quick           # 5 cases, about 3 minutes
    .venv/bin/python -m bench.diagnosis_score --cases 'fsdp2_tp/*' --parallel 2
    .venv/bin/python -m bench.diagnosis_score --cases ddp/kill --workdir /tmp/k  # keep the logs
    .venv/bin/python -m bench.diagnosis_score --list
    .venv/bin/python -m bench.diagnosis_score --rescore bench/results/diagnosis_score.json

Prints a markdown table for docs/benchmarks.md and the goal lines; the exit code
is 0 whether or not the goals are met (2 only for invalid arguments). With
``--json`` every case's observations (each scrape's prediction and findings) are
written, and ``--rescore`` grades such a file again without running anything.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import math
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from bench import benchlib, headline
from testkit import parallel_launch
from testkit.daemon import Daemon
from testkit.daemon import serve as serve_daemon
from testkit.exposition import Scrape, parse

log = logging.getLogger(__name__)

#: The daemon's diagnosis window (``collectors.diagnosis.window_seconds``; 60 by
#: default), as in tests/diagnosis/test_ddp_scenarios.py.
WINDOW_SECONDS = 15
SCRAPE_INTERVAL_SECONDS = 1.0
#: A steady case is watched this long after its job's first report.
STEADY_SECONDS = 90.0
#: A hang is watched this long after its fault began.
HANG_SECONDS = 60.0
#: A job that has not reported this long after its launch is given up.
REPORT_TIMEOUT_SECONDS = 150.0
#: A right prediction counts once it held on this many consecutive scrapes.
STABLE_SCRAPES = 3
#: The final prediction is the most frequent of the last this many scrapes.
FINAL_SCRAPES = 5
#: Consecutive failed scrapes after which the run gives up.
SCRAPE_FAILURES_TOLERATED = 5
DEFAULT_PARALLEL = 3

#: The truth classes, in the order of the table.
CLASSES = ("compute", "storage", "communication", "straggler", "hung_rank")
#: The truth class of each fault of ``testkit.parallel_launch``.
FAULT_CLASS = {
    "healthy": "compute",
    "storage": "storage",
    "communication": "communication",
    "slow_rank": "straggler",
    "hang_loader": "hung_rank",
    "hang_collective": "hung_rank",
    "hang_lock": "hung_rank",
    "hang_checkpoint": "hung_rank",
    "sigstop": "hung_rank",
    "kill": "hung_rank",
}
#: The classes whose truth names a rank (the fault's rank).
RANK_CLASSES = ("straggler", "hung_rank")
#: Finding kinds that are false on a healthy (compute) job.
FALSE_KINDS = ("scheduling", "storage", "communication")
#: The platform risk findings (docs/diagnosis.md, Metrics): true statements about the
#: node or the checkpoints, not about the bottleneck; never false findings here.
RISK_FINDINGS = ("spot_reclaim", "checkpoint_overdue", "checkpoint_missing",
                 "checkpoint_local_disk", "numa_far", "nccl_over_sockets", "mixed_gpus")
#: Findings that page someone (a hang, a straggler, a stall): on a healthy job, a false page.
PAGING_FINDINGS = ("hung_rank", "straggler", "stalled")
#: The kinds whose healthy case also runs with each confounder and with all of them.
CONFOUNDED_KINDS = ("ddp", "fsdp2_tp", "pipeline")
#: ``--quick``: one case of each class but communication, on four kinds.
QUICK = ("ddp/healthy", "fsdp2_tp/slow_rank", "pipeline/storage", "fsdp2_tp/hang_loader",
         "ddp/kill")
#: ``--quick`` watches steady cases this long (all its cases run at once).
QUICK_STEADY_SECONDS = 60.0

#: The goals: macro-F1 at least, time to the right verdict and to the hung rank
#: (p95, seconds) at most.
GOAL_MACRO_F1 = 0.95
GOAL_RIGHT_VERDICT_P95_SECONDS = 60.0
GOAL_HUNG_RANK_P95_SECONDS = 30.0
#: The published anchors (docs/benchmarks.md, "Diagnosis, scored").
ANCHOR_F1 = "Minder (NSDI'25) F1 0.893"
ANCHOR_VERDICT_TIME = "Holmes (NSDI'25) 30.3 s; Minder 3.6 s"
ANCHOR_HUNG_TIME = "Mycroft: 90 % within 15 s"


# --- the suite ------------------------------------------------------------------------


@dataclass(frozen=True)
class Truth:
    cls: str
    #: The rank the prediction must name (``straggler``, ``hung_rank``), else None.
    rank: str | None = None


@dataclass(frozen=True)
class Case:
    kind: str
    fault: str = "healthy"
    confounders: tuple[str, ...] = ()
    #: The rank the fault hits: the job's last rank (``world_size - 1``).
    fault_rank: int = 1

    @property
    def name(self) -> str:
        """``kind/fault`` and ``+confounder`` each: ``ddp/healthy+eval+varlen``."""
        return "+".join((f"{self.kind}/{self.fault}", *self.confounders))

    @property
    def job(self) -> str:
        """The job name its reports carry."""
        return "score-" + self.name.replace("/", "-").replace("+", "-")

    @property
    def truth(self) -> Truth:
        cls = FAULT_CLASS[self.fault]
        return Truth(cls, str(self.fault_rank) if cls in RANK_CLASSES else None)

    @property
    def hang(self) -> bool:
        """Timed from the fault rather than the first report."""
        return self.truth.cls == "hung_rank"


def build_suite(kinds: Sequence[str], faults_of: Mapping[str, Sequence[str]],
                confounders: Sequence[str], world_sizes: Mapping[str, int]) -> list[Case]:
    """Every kind with every fault it supports (those with a truth class), then the
    healthy case of ``CONFOUNDED_KINDS`` with each confounder and with all of them."""
    cases = [Case(kind, fault, fault_rank=world_sizes[kind] - 1)
             for kind in kinds for fault in faults_of[kind] if fault in FAULT_CLASS]
    for kind in kinds:
        if kind not in CONFOUNDED_KINDS or "healthy" not in faults_of[kind]:
            continue
        mixes: list[tuple[str, ...]] = [(c,) for c in confounders]
        if len(confounders) > 1:
            mixes.append(tuple(confounders))
        cases += [Case(kind, "healthy", mix, world_sizes[kind] - 1) for mix in mixes]
    return cases


def select(cases: Sequence[Case], patterns: Sequence[str]) -> list[Case]:
    """The cases whose name matches one of the globs (``fsdp2_tp/*``, ``*/hang_*``)."""
    return [case for case in cases
            if any(fnmatch.fnmatchcase(case.name, pattern) for pattern in patterns)]


# --- one scrape of one job --------------------------------------------------------------

#: A finding as exported: (kind, finding, rank).
FindingKey = tuple[str, str, str]


@dataclass(frozen=True)
class Prediction:
    cls: str
    rank: str | None = None

    def right(self, truth: Truth) -> bool:
        return self.cls == truth.cls and (truth.rank is None or self.rank == truth.rank)

    def text(self) -> str:
        return self.cls if self.rank is None else f"{self.cls} rank {self.rank or '?'}"


NONE = Prediction("none")


@dataclass(frozen=True)
class Sample:
    """What one scrape said about one job: seconds since the case's launch, the
    prediction, every finding of the job."""

    at: float
    prediction: Prediction
    findings: tuple[FindingKey, ...] = ()


def job_findings(scrape: Scrape, job: str) -> tuple[FindingKey, ...]:
    """The job's ``trainmon_diagnosis_finding_info`` series as (kind, finding, rank)."""
    return tuple(sorted(
        (labels["kind"], labels["finding"], labels.get("rank", ""))
        for labels in scrape.labelsets("trainmon_diagnosis_finding_info")
        if labels.get("job") == job))


def predict(verdict: str | None, findings: Iterable[FindingKey]) -> Prediction:
    """The prediction of a verdict kind (``trainmon_bottleneck``) and the findings."""
    named = {code: rank for _, code, rank in sorted(findings)
             if code in ("hung_rank", "straggler")}
    for code in ("hung_rank", "straggler"):
        if code in named:
            return Prediction(code, named[code])
    if verdict in ("compute", "storage", "communication", "scheduling"):
        return Prediction(verdict)
    return NONE


def observe(scrape: Scrape, job: str, at: float) -> Sample:
    """The job's sample in one scrape of the daemon."""
    verdict = next((dict(key)["kind"] for key, value
                    in scrape.samples.get("trainmon_bottleneck", {}).items()
                    if value == 1 and dict(key).get("job") == job), None)
    findings = job_findings(scrape, job)
    return Sample(at, predict(verdict, findings), findings)


def reported(scrape: Scrape, job: str) -> bool:
    """Whether a rank of the job has reported to the daemon."""
    return any(labels.get("job") == job
               for labels in scrape.labelsets("trainmon_training_rank_info"))


# --- per-case scoring (pure) ------------------------------------------------------------


@dataclass
class CaseRecord:
    """One case as run: its times (seconds since its launch) and every scrape of it."""

    case: Case
    #: ``scored``; ``skipped`` (not run: no namespaces); ``error`` (the harness failed:
    #: no report, the fault never began, a launch error): not graded.
    status: str = "scored"
    note: str = ""
    #: Wall clock (``time.time()``) of the launch; the times below are relative to it.
    started: float = 0.0
    first_report: float | None = None
    fault: float | None = None
    samples: list[Sample] = field(default_factory=list)

    @property
    def since(self) -> float | None:
        """Where the case's clocks start: the fault for hangs, else the first report."""
        return self.fault if self.case.hang else self.first_report


def final_prediction(samples: Sequence[Sample], last: int = FINAL_SCRAPES) -> Prediction:
    """The most frequent prediction of the last ``last`` samples (ties: the latest)."""
    recent = [sample.prediction for sample in samples[-last:]]
    if not recent:
        return NONE
    counts = Counter(recent)
    best = max(counts.values())
    return next(p for p in reversed(recent) if counts[p] == best)


def time_to_right(samples: Sequence[Sample], truth: Truth, since: float | None,
                  stable: int = STABLE_SCRAPES) -> float | None:
    """Seconds from ``since`` to the first sample whose prediction is right and stays
    right for ``stable`` consecutive samples; None if never (or ``since`` is None)."""
    if since is None:
        return None
    after = [sample for sample in samples if sample.at >= since]
    for index in range(len(after) - stable + 1):
        if all(sample.prediction.right(truth) for sample in after[index:index + stable]):
            return after[index].at - since
    return None


def time_to_name(samples: Sequence[Sample], rank: str | None,
                 since: float | None) -> float | None:
    """Seconds from ``since`` to the first sample with a ``hung_rank`` finding naming
    ``rank``; None if never."""
    if since is None or rank is None:
        return None
    return next((sample.at - since for sample in samples if sample.at >= since
                 and any(code == "hung_rank" and named == rank
                         for _, code, named in sample.findings)), None)


@dataclass(frozen=True)
class Episode:
    """A finding from its onset to the scrape it was last seen in."""

    #: As at its onset: the rank it names may change while it lasts (a data wait's
    #: worst rank), the episode goes on.
    finding: FindingKey
    #: Seconds from the clock's start (the first report) to its onset.
    onset: float
    seconds: float


def episodes(samples: Sequence[Sample], since: float | None) -> list[Episode]:
    """Each onset of a finding (its kind and code; whatever rank it names) in the
    samples from ``since`` on — a finding absent from the previous sample starts one —
    with how long it lasted (a sample counts until the next; the last one
    ``SCRAPE_INTERVAL_SECONDS``)."""
    if since is None:
        return []
    after = [sample for sample in samples if sample.at >= since]
    open_: dict[tuple[str, str], Episode] = {}
    done: list[Episode] = []
    for index, sample in enumerate(after):
        until = after[index + 1].at if index + 1 < len(after) else (
            sample.at + SCRAPE_INTERVAL_SECONDS)
        present = {(kind, code): (kind, code, rank) for kind, code, rank
                   in reversed(sample.findings)}  # the first of a code wins
        done += [open_.pop(code) for code in [code for code in open_ if code not in present]]
        for code, finding in present.items():
            episode = open_.get(code, Episode(finding, sample.at - since, 0.0))
            open_[code] = replace(episode, seconds=episode.seconds + until - sample.at)
    done += open_.values()
    return sorted(done, key=lambda episode: (episode.onset, episode.finding))


def is_false_on_healthy(finding: FindingKey) -> bool:
    kind, code, _ = finding
    return kind in FALSE_KINDS and code not in RISK_FINDINGS


def false_findings(record: CaseRecord) -> list[Episode]:
    """The false findings of a compute case from its first report on (none for others)."""
    if record.case.truth.cls != "compute":
        return []
    return [episode for episode in episodes(record.samples, record.first_report)
            if is_false_on_healthy(episode.finding)]


def observed_seconds(record: CaseRecord) -> float:
    """Seconds the case was watched from its first report (the last scrape counting one
    interval)."""
    if record.first_report is None or not record.samples:
        return 0.0
    return max(0.0, record.samples[-1].at + SCRAPE_INTERVAL_SECONDS - record.first_report)


# --- the suite's score (pure) -----------------------------------------------------------


@dataclass(frozen=True)
class ClassScore:
    cls: str
    support: int
    predicted: int
    correct: int

    @property
    def precision(self) -> float | None:
        return self.correct / self.predicted if self.predicted else None

    @property
    def recall(self) -> float | None:
        return self.correct / self.support if self.support else None

    @property
    def f1(self) -> float:
        """0 where precision or recall is undefined or zero."""
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p and r else 0.0


def class_scores(pairs: Sequence[tuple[Truth, Prediction]]) -> list[ClassScore]:
    """Per class: cases of that truth, cases predicted so, and right ones. A prediction
    of the right class naming the wrong rank is wrong: a false positive of its class
    and a miss of the truth's."""
    return [ClassScore(
        cls,
        support=sum(truth.cls == cls for truth, _ in pairs),
        predicted=sum(prediction.cls == cls for _, prediction in pairs),
        correct=sum(truth.cls == cls and prediction.right(truth) for truth, prediction in pairs),
    ) for cls in CLASSES]


def macro_f1(scores: Sequence[ClassScore]) -> float | None:
    """The mean F1 of the classes that some case has as truth or as prediction."""
    present = [score.f1 for score in scores if score.support or score.predicted]
    return sum(present) / len(present) if present else None


def percentile(values: Sequence[float | None], fraction: float) -> float | None:
    """Nearest-rank quantile, a None (never) counting as infinitely late: ``inf`` when
    the quantile falls among those; None for no values."""
    if not values:
        return None
    return benchlib.percentile([math.inf if v is None else v for v in values], fraction)


@dataclass(frozen=True)
class Score:
    cases: int
    classes: list[ClassScore]
    macro_f1: float | None
    right_p50: float | None
    right_p95: float | None
    hung_p50: float | None
    hung_p95: float | None
    healthy_hours: float
    false_onsets: int
    #: False findings per healthy job-hour; None without healthy time.
    false_rate: float | None
    #: The healthy cases that paged, with the finding.
    pages: list[tuple[str, FindingKey]]


def score(records: Sequence[CaseRecord]) -> Score:
    """The suite's figures over its scored cases."""
    scored = [r for r in records if r.status == "scored"]
    pairs = [(r.case.truth, final_prediction(r.samples)) for r in scored]
    classes = class_scores(pairs)
    right = [time_to_right(r.samples, r.case.truth, r.since) for r in scored]
    hangs = [r for r in scored if r.case.hang]
    named = [time_to_name(r.samples, r.case.truth.rank, r.fault) for r in hangs]
    healthy = [r for r in scored if r.case.truth.cls == "compute"]
    hours = sum(observed_seconds(r) for r in healthy) / 3600
    false = [(r.case.name, e) for r in healthy for e in false_findings(r)]
    return Score(
        cases=len(scored), classes=classes, macro_f1=macro_f1(classes),
        right_p50=percentile(right, 0.5), right_p95=percentile(right, 0.95),
        hung_p50=percentile(named, 0.5), hung_p95=percentile(named, 0.95),
        healthy_hours=hours, false_onsets=len(false),
        false_rate=len(false) / hours if hours else None,
        pages=[(name, e.finding) for name, e in false if e.finding[1] in PAGING_FINDINGS],
    )


# --- the report -------------------------------------------------------------------------


def number(value: float | None, spec: str = ".2f", unit: str = "") -> str:
    if value is None:
        return "–"
    if math.isinf(value):
        return "never"
    return f"{format(value, spec)}{unit}"


def class_table(result: Score) -> list[str]:
    lines = ["| class | support | predicted | right | precision | recall | F1 |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {c.cls} | {c.support} | {c.predicted} | {c.correct} | "
              f"{number(c.precision)} | {number(c.recall)} | "
              f"{number(c.f1) if c.support or c.predicted else '–'} |"
              for c in result.classes]
    return lines


def headline_table(result: Score) -> list[str]:
    rate = (f"{number(result.false_rate, '.1f')} ({result.false_onsets} in "
            f"{result.healthy_hours:.2f} h)")
    return [
        "| figure | this run | goal |",
        "| --- | ---: | --- |",
        f"| macro-F1 ({result.cases} cases) | {number(result.macro_f1, '.3f')} | "
        f"≥ {GOAL_MACRO_F1} |",
        f"| time to the right verdict p50 / p95 | {number(result.right_p50, '.0f', ' s')} / "
        f"{number(result.right_p95, '.0f', ' s')} | p95 ≤ {GOAL_RIGHT_VERDICT_P95_SECONDS:.0f} s |",
        f"| time to name the hung rank p50 / p95 | {number(result.hung_p50, '.0f', ' s')} / "
        f"{number(result.hung_p95, '.0f', ' s')} | p95 ≤ {GOAL_HUNG_RANK_P95_SECONDS:.0f} s |",
        f"| false findings per healthy job-hour | {rate} | – |",
        f"| healthy jobs that paged | {len({name for name, _ in result.pages})} | 0 |",
    ]


def case_table(records: Sequence[CaseRecord]) -> list[str]:
    lines = ["| case | truth | final | right | to right verdict | to hung rank | false findings |",
             "| --- | --- | --- | --- | ---: | ---: | --- |"]
    for r in records:
        if r.status != "scored":
            lines.append(f"| {r.case.name} | {r.case.truth.cls} | {r.status}: {r.note} "
                         "| | | | |")
            continue
        final = final_prediction(r.samples)
        named = time_to_name(r.samples, r.case.truth.rank, r.fault) if r.case.hang else None
        false = ", ".join(f"{code}{'@' + rank if rank else ''} {e.seconds:.0f} s"
                          for e in false_findings(r) for _, code, rank in [e.finding])
        truth = Prediction(r.case.truth.cls, r.case.truth.rank).text()
        lines.append(
            f"| {r.case.name} | {truth} | {final.text()} | "
            f"{'yes' if final.right(r.case.truth) else '**no**'} | "
            f"{number(time_to_right(r.samples, r.case.truth, r.since), '.0f', ' s')} | "
            f"{number(named, '.0f', ' s') if r.case.hang else '–'} | {false or '–'} |")
    return lines


def goal_lines(result: Score) -> list[str]:
    """One line per goal: met, NOT met, or nothing to judge it by."""
    def within(value: float | None, bound: float) -> str:
        if value is None:
            return "no case to judge it by"
        return f"{'met' if value <= bound else 'NOT met'} ({number(value, '.0f', ' s')})"

    f1 = result.macro_f1
    f1_met = "met" if f1 is not None and f1 >= GOAL_MACRO_F1 else "NOT met"
    return [
        f"goal macro-F1 ≥ {GOAL_MACRO_F1}: {f1_met} ({number(f1, '.3f')})",
        f"goal right verdict within {GOAL_RIGHT_VERDICT_P95_SECONDS:.0f} s at p95: "
        + within(result.right_p95, GOAL_RIGHT_VERDICT_P95_SECONDS),
        f"goal hung rank within {GOAL_HUNG_RANK_P95_SECONDS:.0f} s at p95: "
        + within(result.hung_p95, GOAL_HUNG_RANK_P95_SECONDS),
        f"goal no false page on healthy runs: {'NOT met' if result.pages else 'met'}"
        + "".join(f"\n    {name}: {code} rank {rank or '–'}"
                  for name, (_, code, rank) in result.pages),
    ]


def record_headline(result: Score) -> None:
    """The headline figures (``make bench``: ``TRAINMON_BENCH_RESULTS``)."""
    source = f"bench.diagnosis_score ({result.cases} cases)"
    if result.macro_f1 is not None:
        headline.record(headline.Figure(
            "diagnosis macro-F1, real CPU jobs (goal ≥ 0.95)", result.macro_f1, spec=".3f",
            anchor=ANCHOR_F1, source=source))
    if result.right_p95 is not None:
        headline.record(headline.Figure(
            "diagnosis: time to the right verdict p95 (s)", result.right_p95, spec=".0f",
            anchor=ANCHOR_VERDICT_TIME, at_most=GOAL_RIGHT_VERDICT_P95_SECONDS, source=source))
    if result.hung_p95 is not None:
        headline.record(headline.Figure(
            "diagnosis: time to name a hung rank p95 (s)", result.hung_p95, spec=".0f",
            anchor=ANCHOR_HUNG_TIME, at_most=GOAL_HUNG_RANK_P95_SECONDS, source=source))
    headline.record(headline.Figure(
        "diagnosis: healthy jobs that paged", float(len({n for n, _ in result.pages})),
        spec=".0f", at_most=0.0, source=source))


# --- observations as JSON ---------------------------------------------------------------


def record_json(record: CaseRecord) -> dict[str, Any]:
    """A case's observations and its per-case figures (``None`` for never)."""
    case, truth = record.case, record.case.truth
    final = final_prediction(record.samples)
    document: dict[str, Any] = {
        "case": case.name, "kind": case.kind, "fault": case.fault,
        "confounders": list(case.confounders), "fault_rank": case.fault_rank,
        "job": case.job, "truth": {"class": truth.cls, "rank": truth.rank},
        "status": record.status, "note": record.note, "started": record.started,
        "first_report_seconds": record.first_report, "fault_seconds": record.fault,
    }
    if record.status == "scored":
        named = time_to_name(record.samples, truth.rank, record.fault) if case.hang else None
        document |= {
            "final": {"class": final.cls, "rank": final.rank},
            "right": final.right(truth),
            "time_to_right_seconds": time_to_right(record.samples, truth, record.since),
            "time_to_name_seconds": named,
            "observed_seconds": observed_seconds(record),
            "false_findings": [
                {"kind": e.finding[0], "finding": e.finding[1], "rank": e.finding[2],
                 "onset_seconds": round(e.onset, 3), "seconds": round(e.seconds, 3)}
                for e in false_findings(record)],
        }
    document["samples"] = [
        [round(s.at, 3), s.prediction.cls, s.prediction.rank, [list(f) for f in s.findings]]
        for s in record.samples]
    return document


def record_from_json(document: dict[str, Any]) -> CaseRecord:
    case = Case(document["kind"], document["fault"], tuple(document["confounders"]),
                int(document["fault_rank"]))
    samples = [Sample(at, Prediction(cls, rank), tuple((k, f, r) for k, f, r in findings))
               for at, cls, rank, findings in document["samples"]]
    return CaseRecord(case, document["status"], document["note"], document["started"],
                      document["first_report_seconds"], document["fault_seconds"], samples)


def write_json(path: Path, records: Sequence[CaseRecord], result: Score,
               settings: dict[str, Any]) -> None:
    document = {
        "settings": settings,
        "score": {
            "cases": result.cases, "macro_f1": result.macro_f1,
            "classes": [{"class": c.cls, "support": c.support, "predicted": c.predicted,
                         "right": c.correct, "precision": c.precision, "recall": c.recall,
                         "f1": c.f1} for c in result.classes],
            # never (inf) is written as null
            "time_to_right_p50_seconds": finite(result.right_p50),
            "time_to_right_p95_seconds": finite(result.right_p95),
            "time_to_name_hung_rank_p50_seconds": finite(result.hung_p50),
            "time_to_name_hung_rank_p95_seconds": finite(result.hung_p95),
            "healthy_job_hours": result.healthy_hours,
            "false_findings": result.false_onsets,
            "false_findings_per_healthy_job_hour": result.false_rate,
            "pages": [{"case": name, "finding": code, "rank": rank}
                      for name, (_, code, rank) in result.pages],
        },
        "cases": [record_json(record) for record in records],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")


def finite(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else value


# --- the runner -------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    parallel: int = DEFAULT_PARALLEL
    steady_seconds: float = STEADY_SECONDS
    hang_seconds: float = HANG_SECONDS
    report_timeout_seconds: float = REPORT_TIMEOUT_SECONDS


def serve(folder: Path) -> Daemon:
    """``trainmon serve`` with the unix step socket ``folder/steps.sock`` and the
    shortened diagnosis window, as the DDP scenarios test runs it; its run ledger in
    ``folder`` (``STATE_DIRECTORY``), never the machine's."""
    config_path = folder / "trainmon.yml"
    config_path.write_text(yaml.safe_dump({"collectors": {
        "training": {"socket": str(folder / "steps.sock")},
        "diagnosis": {"window_seconds": WINDOW_SECONDS},
    }}))
    log_path = folder / "trainmon.log"
    return serve_daemon(config_path, log_path, state_directory=folder, cwd=benchlib.ROOT)


class Active:
    """A case whose job runs: its record grows by one sample per scrape."""

    def __init__(self, record: CaseRecord, job: parallel_launch.RunningJob,
                 settings: Settings) -> None:
        self.record = record
        self.job = job
        self.settings = settings

    def observe(self, scrape: Scrape, now: float) -> None:
        record = self.record
        at = now - record.started
        if record.first_report is None and reported(scrape, record.case.job):
            record.first_report = at
        fault_time = self.job.fault_time
        if record.fault is None and fault_time is not None:
            record.fault = fault_time - record.started
        if record.first_report is not None:
            record.samples.append(observe(scrape, record.case.job, at))

    def finished(self, now: float) -> bool:
        """Whether the case has been watched long enough (or given up: then a note)."""
        record, settings = self.record, self.settings
        at = now - record.started
        if record.first_report is None:
            if at > settings.report_timeout_seconds:
                self.give_up(f"no report within {settings.report_timeout_seconds:.0f} s")
                return True
            return False
        if not record.case.hang:
            if not self.job.alive():
                self.give_up("the job exited")
                return True
            return at >= record.first_report + settings.steady_seconds
        if record.fault is None:
            fault_at = self.job.spec.fault_at
            if at > record.first_report + fault_at + settings.hang_seconds:
                self.give_up(f"the fault did not begin within {fault_at:.0f} s + "
                             f"{settings.hang_seconds:.0f} s of the first report")
                return True
            return False
        return at >= record.fault + settings.hang_seconds

    def give_up(self, reason: str) -> None:
        self.record.status = "error"
        self.record.note = reason
        log.warning("%s: %s; its logs:\n%s", self.record.case.name, reason, self.tail())

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.job.logs()
        except OSError as error:
            return f"(no logs: {error})"
        return "\n".join(text.splitlines()[-lines:])


def run_cases(cases: Sequence[Case], settings: Settings, folder: Path) -> list[CaseRecord]:
    """Every case against one daemon, ``settings.parallel`` at a time, scraped every
    second; a record per case, in the order given."""
    records = {case.name: CaseRecord(case) for case in cases}
    pending = list(cases)
    running: list[Active] = []
    #: Jobs being stopped (up to ``STOP_GRACE_SECONDS`` each) beside the scrapes.
    stopping: list[threading.Thread] = []
    no_namespaces: str | None = None
    with ExitStack() as cleanup:  # the jobs end first (their namespaces with them), then the daemon
        daemon = serve(folder)
        cleanup.callback(daemon.stop)
        cleanup.callback(stop_all, running, stopping)
        endpoint = f"unix://{folder / 'steps.sock'}"
        failures = 0
        next_scrape = time.monotonic()
        while pending or running:
            while pending and len(running) < settings.parallel:
                case = pending.pop(0)
                record = records[case.name]
                if case.fault == "communication" and no_namespaces is not None:
                    record.status, record.note = "skipped", no_namespaces
                    continue
                spec = parallel_launch.JobSpec(
                    kind=case.kind, fault=case.fault, job=case.job,
                    fault_rank=case.fault_rank, confounders=case.confounders)
                record.started = time.time()
                try:
                    job = parallel_launch.launch(spec, endpoint, folder / "jobs")
                except parallel_launch.NamespacesUnavailable as error:
                    no_namespaces = str(error)
                    record.status, record.note = "skipped", no_namespaces
                    continue
                except (OSError, RuntimeError) as error:
                    record.status, record.note = "error", f"launch failed: {error}"
                    log.warning("%s: %s", case.name, record.note)
                    continue
                record.started = job.started or record.started
                running.append(Active(record, job, settings))
                log.info("%s: launched (%d running, %d pending)", case.name, len(running),
                         len(pending))
            # a second after the last one; at once if the last one was late
            next_scrape = max(next_scrape + SCRAPE_INTERVAL_SECONDS, time.monotonic())
            time.sleep(max(0.0, next_scrape - time.monotonic()))
            try:
                scrape = parse(daemon.metrics())
            except (OSError, AssertionError) as error:
                failures += 1
                if failures >= SCRAPE_FAILURES_TOLERATED:
                    raise RuntimeError(f"cannot scrape the daemon: {error}\n{daemon.log()}"
                                       ) from error
                continue
            failures = 0
            now = time.time()
            for active in list(running):
                active.observe(scrape, now)
                if active.finished(now):
                    running.remove(active)
                    stopping.append(threading.Thread(
                        target=active.job.stop, name=f"stop-{active.record.case.job}"))
                    stopping[-1].start()
                    log.info("%s: done, %s", active.record.case.name,
                             final_prediction(active.record.samples).text())
    return [records[case.name] for case in cases]


def stop_all(running: Sequence[Active], stopping: Sequence[threading.Thread]) -> None:
    """Stop the jobs still running and wait for those being stopped."""
    for active in running:
        active.job.stop()
    for thread in stopping:
        thread.join()


def launcher_suite() -> list[Case]:
    """The full suite: every kind, fault and confounder ``testkit.parallel_launch`` offers."""
    kinds = parallel_launch.KINDS
    return build_suite(kinds, {kind: parallel_launch.supported_faults(kind) for kind in kinds},
                       parallel_launch.CONFOUNDERS,
                       {kind: parallel_launch.world_size(kind) for kind in kinds})


# --- the command ------------------------------------------------------------------------


def print_report(records: Sequence[CaseRecord], result: Score) -> None:
    print("\n".join(case_table(records)))
    print()
    print("\n".join(class_table(result)))
    print()
    print("\n".join(headline_table(result)))
    print()
    print("\n".join(goal_lines(result)))
    notes = [f"{r.case.name}: {r.status}: {r.note}" for r in records if r.status != "scored"]
    if notes:
        print("\n" + "\n".join(f"- {note}" for note in notes))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"only {', '.join(QUICK)}, all at once (a few minutes)")
    parser.add_argument("--cases", action="append", metavar="GLOB",
                        help="only the cases matching GLOB (kind/fault+confounders; repeatable)")
    parser.add_argument("--parallel", type=int, metavar="N",
                        help=f"cases at a time (default {DEFAULT_PARALLEL}, --quick: all)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every observation")
    parser.add_argument("--list", action="store_true", help="print the suite and exit")
    parser.add_argument("--rescore", type=Path, metavar="JSON", nargs="+",
                        help="grade the observations of earlier --json files again; run "
                             "nothing (a case in a later file replaces the same case in an "
                             "earlier one: a rerun of some cases)")
    parser.add_argument("--workdir", type=Path, metavar="DIR",
                        help="keep the daemon's and the ranks' logs in DIR (a new folder; "
                             "default: a temporary one, removed)")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    if args.parallel is not None and args.parallel < 1:
        parser.error("--parallel must be at least 1")

    if args.rescore is not None:
        by_name: dict[str, CaseRecord] = {}
        for path in args.rescore:
            for case in json.loads(path.read_text())["cases"]:
                record = record_from_json(case)
                by_name[record.case.name] = record
        records = list(by_name.values())
        print_report(records, score(records))
        return 0

    cases = launcher_suite()
    if args.quick:
        cases = select(cases, QUICK)
    if args.cases:
        cases = select(cases, args.cases)
    if not cases:
        parser.error("no case matches")
    if args.list:
        print("\n".join(f"{case.name}  ({Prediction(case.truth.cls, case.truth.rank).text()})"
                        for case in cases))
        print(f"{len(cases)} cases")
        return 0
    settings = Settings(parallel=args.parallel or (len(cases) if args.quick else
                                                   DEFAULT_PARALLEL))
    if args.quick:
        settings = replace(settings, steady_seconds=QUICK_STEADY_SECONDS)

    began = time.monotonic()
    with ExitStack() as cleanup:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True)
            folder = args.workdir
        else:
            folder = Path(cleanup.enter_context(
                tempfile.TemporaryDirectory(prefix="trainmon-score-")))
        records = run_cases(cases, settings, folder)
    wall = time.monotonic() - began
    result = score(records)
    print(f"{len(cases)} cases, {settings.parallel} at a time, one daemon (diagnosis window "
          f"{WINDOW_SECONDS} s), scraped every {SCRAPE_INTERVAL_SECONDS:.0f} s; steady cases "
          f"{settings.steady_seconds:.0f} s after the first report, hangs "
          f"{settings.hang_seconds:.0f} s after the fault; Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs; wall {wall:.0f} s\n")
    print_report(records, result)
    if args.json is not None:
        write_json(args.json, records, result, {
            "quick": args.quick, "cases": args.cases, "parallel": settings.parallel,
            "steady_seconds": settings.steady_seconds, "hang_seconds": settings.hang_seconds,
            "window_seconds": WINDOW_SECONDS, "wall_seconds": round(wall, 1),
        })
    if not args.quick and not args.cases:
        record_headline(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
