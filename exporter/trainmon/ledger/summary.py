"""The measured part of a run record, and how each number is computed.

The recorder (``trainmon.ledger.recorder``) reads the training store every
``flush_seconds`` (a *tick*) and adds, per run, what each of its ranks on this
node did since the previous tick (``Progress``: the increase of the rank's
exported totals). From those:

- **samples/s** (``samples_per_second``, the headline): the samples of the
  run's ranks on this node, once per data-parallel replica (the ranks of a
  tensor, pipeline or context parallel group leave theirs to its lowest rank:
  ``trainmon.ledger.recorder.shares_samples``), over its *active time*, from the
  start of its first step to the end of its last (``active_start``,
  ``active_end``: Unix times). A rank's steps are contiguous (the client times each step from the
  end of the previous one, the first from the start of its loop), so the
  steps a rank did since the previous tick span exactly ``[its last step time
  − their step seconds, its last step time]`` (``ReportingRank.last_step_time``,
  the sender's clock): the first step's start is known to the step, however
  late the first tick comes, and the last step's end however late the run's
  end is noticed. The warm-up counts, as it does in the job's own
  ``samples / elapsed`` (data loader workers spawning, compilation). The
  figure the job itself would print; ``active_seconds`` is its denominator.
- **spread across windows** (``samples_per_second_median`` and ``_p10``, the
  median and the 10th percentile by nearest rank): one *window* per tick (or
  more ticks, until every live rank of the run stepped in it), its rate the sum
  over the ranks of each rank's samples over the real length of its steps in
  the window (from its previous last step to its latest), so a partial window
  (the run's last, ending at its last step) weighs only the time training
  happened, never a whole tick. A window to which a rank contributed its
  totals so far rather than a window's (a rank first seen once the run was
  under way, or whose totals restarted, or the first window after a daemon
  restart) is left out, and so is the run's first window (warm-up) once the
  run has three or more. At most ``MAX_BUCKETS`` windows are kept; beyond,
  neighbours are merged pairwise (length-weighted), which keeps the median
  meaningful over week-long runs.
- **step_seconds_p50/p95**: the median and 95th percentile of the durations of
  every step of the run's ranks on this node, from the step sketch the client
  keeps (``trainmon.training.sketch``, docs/protocol.md ``step_sketch``): the
  increases of the ranks' sketches merged, each within
  ``step_seconds_percentile_error`` (0.01: 1 %; 0.02 once the steps spread over
  more than 256 buckets of 1 %) of the job's own order statistic. None where not
  every step of the run is in the sketch (an older client's ranks): never a
  histogram bucket's midpoint. **step_seconds_mean**: step seconds / steps, exact,
  for every run with a step.
- **data_wait_ratio**: data-wait seconds / step seconds over the run;
  **comm_exposed_ratio**: measured exposed-communication seconds / step
  seconds, else the ``comm`` phase's; **phase_ratios**: each phase's seconds
  / step seconds.
- **verdicts**: seconds during which ``trainmon_bottleneck{job,kind}`` was 1
  for the run's job, one entry per kind that ever was (from one evaluation of
  the diagnosis to the next that still says it, each gap counted at most
  ``MAX_VERDICT_GAP_SECONDS``: ``verdict_gap``); **final_verdict**: the kind
  that held at the latest evaluation while the run went on (its verdict at
  the end, once it ended).
- **checkpoints**: saves the run's ranks on this node completed (None when no
  rank reports checkpoints); **last_checkpoint**: the latest one's ``time``
  (Unix), ``duration_seconds``, ``path`` and where that path lives
  (``mountpoint``, ``fstype``, ``storage``, resolved while the rank was alive
  and never replaced by ``unknown`` afterwards).
- **gpu_seconds**: the GPU-seconds of the run's ranks on this node per bucket
  of the goodput ledger (``trainmon.ledger.goodput``: every second a rank
  holds its GPU in exactly one bucket), and **goodput_ratio**, productive
  over all of them (None before anything is booked);
- **stalls**: the run's stalls, the latest ``MAX_RECORDED_STALLS``: when each
  began (its first stalled rank's last step) and ended (the first tick without a
  stalled rank, or the run's end; None while it lasts), the rank that held the job and where it was
  (``trainmon.training.stalls``), its innermost frame, and where each stalled rank
  was, from the ranks' stall reports (docs/protocol.md, "Stall reports");
- **fail_slow**: the fail-slow changes the diagnosis found during the run
  (``trainmon.diagnosis.failslow``: finding ``fail_slow``), at most
  ``MAX_RECORDED_FAIL_SLOW``, the largest kept, by start: the ``rank`` that
  degraded (``""``: the whole job), the ``part`` of the step that grew, the
  finding's ``kind`` and ``cause``, the largest ``ratio`` seen (0.25: 25 % slower
  than before), its ``start`` (Unix) and the ``seconds`` it held from the first
  evaluation that named it to the last (each gap ``verdict_gap``). A change is one
  (rank, part) named by consecutive evaluations (``FailSlowChange``);
- **profiles**: the on-demand profiles of the run's ranks (``trainmon profile``,
  ``trainmon.profiling``), the latest ``MAX_RECORDED_PROFILES``, oldest first: the
  request ``id``, the ``rank``, when it was received (``time``, Unix), the ``steps``
  profiled and the wall ``seconds`` they took, where the ``trace`` was kept and its
  ``trace_bytes`` (None when it was not: ``error`` says why), and the operators with
  the most self time, on the CPU (``top_cpu``) and on the GPU (``top_device``): each
  ``name``, ``self_seconds``, ``share`` of all operators' self time (0-1) and
  ``calls``, with ``self_cpu_seconds`` and ``self_device_seconds`` in all;
- **gpu_hours**: ranks on this node × duration / 3600 (one GPU per rank);
  **cost** when a price per GPU hour is configured: total = gpu_hours × price,
  per_million_samples = total / samples × 10⁶.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.ledger.goodput import BUCKETS, goodput_ratio
from trainmon.training.protocol import MAX_PROFILE_OPERATORS
from trainmon.training.report_fields import MAX_COMM_GROUPS
from trainmon.training.sketch import MAX_LEVEL as MAX_SKETCH_LEVEL
from trainmon.training.sketch import StepSketch, from_wire, relative_accuracy, to_wire
from trainmon.training.sketch import quantile as sketch_quantile
from trainmon.training.stalls import holding_rank

#: Rate buckets kept per run before neighbours are merged.
MAX_BUCKETS = 2048
#: Stalls kept per run (the latest).
MAX_RECORDED_STALLS = 8
#: A scrape-to-scrape gap longer than this counts only this long toward a verdict.
MAX_VERDICT_GAP_SECONDS = 60.0
#: Fail-slow changes kept per run (the largest; docs/security.md).
MAX_RECORDED_FAIL_SLOW = 8
#: Profiles kept per run (the latest; docs/security.md).
MAX_RECORDED_PROFILES = 8
#: The phase whose share stands in for exposed communication when not measured.
COMM_PHASE = "comm"


@dataclass(frozen=True)
class Progress:
    """What one rank did between two ticks (the increase of its totals)."""

    steps: int = 0
    samples: int = 0
    step_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    step_buckets: Sequence[int] = ()
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    comm_exposed_seconds: float | None = None
    #: Checkpoint saves completed; None when the rank does not report checkpoints.
    checkpoints: int | None = None
    #: Exposed communication per process group (parallelism dimension), where known.
    group_exposed_seconds: Mapping[str, float] = field(default_factory=dict)
    #: The increase of the rank's step sketch; None where its client sends none.
    step_sketch: StepSketch | None = None


@dataclass(frozen=True)
class FailSlowChange:
    """A fail-slow change one evaluation of the diagnosis names for a job
    (``trainmon_diagnosis_fail_slow_ratio`` and its start and finding)."""

    job: str
    #: The writer identity that owns the job (the ``owner`` label).
    owner: str
    #: The rank that degraded; ``""``: the whole job.
    rank: str
    #: ``step``, ``compute``, ``data_wait`` or ``comm``.
    part: str
    #: The finding's kind (``scheduling``, ``storage``...).
    kind: str
    cause: str
    #: How much slower, over the step time before (0.25: 25 % slower).
    ratio: float
    #: Unix time the change started.
    start: float


def verdict_gap(seconds: float) -> float:
    """How much of the time between two evaluations under the same verdict counts
    toward it: at most ``MAX_VERDICT_GAP_SECONDS`` (a daemon that paused or a
    diagnosis that stopped for a while does not credit the whole pause)."""
    return min(max(seconds, 0.0), MAX_VERDICT_GAP_SECONDS)


@dataclass
class RunTotals:
    """A run's accumulated measurements on this node; ``to_state``/``from_state``
    round-trip it through the ledger so a restarted daemon resumes the run."""

    steps: int = 0
    samples: int = 0
    step_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    step_buckets: list[int] = field(default_factory=lambda: [0] * STEP_BUCKET_COUNT)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    comm_exposed_seconds: float | None = None
    #: (samples/s, window seconds) per counted window (module docstring).
    buckets: list[tuple[float, float]] = field(default_factory=list)
    #: Windows seen, counted or not.
    intervals: int = 0
    #: Unix time the run's first step on this node started (the earliest of its ranks').
    active_start: float | None = None
    #: Unix time its latest step on this node ended.
    active_end: float | None = None
    verdict_seconds: dict[str, float] = field(default_factory=dict)
    #: The verdict kind of the latest evaluation while the run went on.
    final_verdict: str | None = None
    #: Checkpoint saves of the run's ranks; None while none reports checkpoints.
    checkpoints: int | None = None
    #: The latest checkpoint: time, duration_seconds, path, mountpoint, fstype, storage.
    last_checkpoint: dict[str, object] | None = None
    #: GPU-seconds of the run's ranks on this node per bucket (``trainmon.ledger.goodput``).
    gpu_seconds: dict[str, float] = field(default_factory=dict)
    #: The run's stalls, oldest first, at most ``MAX_RECORDED_STALLS``: ``since`` and
    #: ``until`` (None while it lasts), the rank that ``holds`` the job, ``where`` it
    #: is and its innermost ``frame``, and where each stalled rank was (``ranks``).
    stalls: list[dict[str, object]] = field(default_factory=list)
    #: The run's exposed communication per process group (``dp``, ``tp``, ``pp``...).
    group_exposed_seconds: dict[str, float] = field(default_factory=dict)
    #: The durations of the run's steps (``trainmon.training.sketch``), from its ranks'
    #: sketches; None while none carries one (older clients).
    step_sketch: StepSketch | None = None
    #: The run's fail-slow changes (module docstring), at most ``MAX_RECORDED_FAIL_SLOW``.
    fail_slow: list[dict[str, object]] = field(default_factory=list)
    #: The run's profiles (module docstring), at most ``MAX_RECORDED_PROFILES``.
    profiles: list[dict[str, object]] = field(default_factory=list)

    def resumed(self) -> RunTotals:
        """What a restarted daemon keeps of a stored run: the rate buckets, verdicts and
        the last checkpoint. The counts start again from zero because the reporters'
        cumulative totals, which a fresh store takes whole, already hold the run's
        counts so far."""
        return RunTotals(buckets=list(self.buckets), intervals=self.intervals,
                         active_start=self.active_start, active_end=self.active_end,
                         group_exposed_seconds=dict(self.group_exposed_seconds),
                         stalls=[dict(stall) for stall in self.stalls],
                         verdict_seconds=dict(self.verdict_seconds),
                         final_verdict=self.final_verdict,
                         last_checkpoint=None if self.last_checkpoint is None
                         else dict(self.last_checkpoint),
                         gpu_seconds=dict(self.gpu_seconds),
                         fail_slow=[dict(change) for change in self.fail_slow],
                         profiles=[dict(profile) for profile in self.profiles])

    def add(self, progress: Progress) -> None:
        self.steps += progress.steps
        self.samples += progress.samples
        self.step_seconds += progress.step_seconds
        self.data_wait_seconds += progress.data_wait_seconds
        for index, count in enumerate(progress.step_buckets[:len(self.step_buckets)]):
            self.step_buckets[index] += count
        for name, seconds in progress.phase_seconds.items():
            self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + seconds
        if progress.comm_exposed_seconds is not None:
            self.comm_exposed_seconds = (self.comm_exposed_seconds or 0.0) + \
                progress.comm_exposed_seconds
        if progress.checkpoints is not None:
            self.checkpoints = (self.checkpoints or 0) + progress.checkpoints
        for group, seconds in progress.group_exposed_seconds.items():
            if group in self.group_exposed_seconds or len(
                    self.group_exposed_seconds) < MAX_COMM_GROUPS:
                self.group_exposed_seconds[group] = (
                    self.group_exposed_seconds.get(group, 0.0) + seconds)
        if progress.step_sketch is not None:
            if self.step_sketch is None:
                self.step_sketch = StepSketch()
            self.step_sketch.merge(progress.step_sketch)

    def add_gpu_seconds(self, booked: Mapping[str, float]) -> None:
        """GPU-seconds a rank's booking just booked, per bucket."""
        for bucket, seconds in booked.items():
            self.gpu_seconds[bucket] = self.gpu_seconds.get(bucket, 0.0) + seconds

    def note_stalls(self, wall: float, stalled: Mapping[int, tuple[str, str, float]],
                    gone: Sequence[int]) -> None:
        """One tick's stalled ranks of the run on this node (rank -> where, innermost
        frame, the Unix time its last step ended) and its ranks gone silent: a stall
        opens with the first stalled rank, names the rank that holds the job
        (``trainmon.training.stalls.holding_rank``) as it learns more, and closes at the
        first tick without one."""
        current = self.stalls[-1] if self.stalls and self.stalls[-1]["until"] is None \
            else None
        if not stalled:
            if current is not None:
                current["until"] = wall
            return
        ordered = sorted(stalled.items())
        rank, where = holding_rank([(str(r), state[0]) for r, state in ordered],
                                   [str(r) for r in sorted(gone)])
        if current is None:
            current = {"since": min(state[2] for _, state in ordered), "until": None}
            self.stalls.append(current)
            del self.stalls[:-MAX_RECORDED_STALLS]
        held = stalled.get(int(rank)) if rank else None
        current.update({"holds": rank, "where": where,
                        "frame": "" if held is None else held[1],
                        "ranks": {str(r): state[0] for r, state in ordered}})

    def note_active(self, start: float, end: float) -> None:
        """A rank's steps spanned ``start`` to ``end`` (Unix): the run's active time
        covers them."""
        self.active_start = start if self.active_start is None else min(self.active_start,
                                                                         start)
        self.active_end = end if self.active_end is None else max(self.active_end, end)

    def active_seconds(self) -> float | None:
        """From the first step's start to the last step's end; None before a step."""
        if self.active_start is None or self.active_end is None:
            return None
        return max(self.active_end - self.active_start, 0.0)

    def add_window(self, rate: float, seconds: float, *, counted: bool = True) -> None:
        """One window of the run: its samples/s (each rank's samples over the real length
        of its steps in it, summed) and its length; ``counted`` False for a window that
        holds a rank's totals so far (module docstring): seen, not kept."""
        if seconds <= 0:
            return
        self.intervals += 1
        if not counted:
            return
        self.buckets.append((rate, seconds))
        if len(self.buckets) > MAX_BUCKETS:
            self.buckets = _merge_pairs(self.buckets)

    def close_stalls(self, until: float) -> None:
        """The run ended: a stall still open ends with it (at ``until``, never before it
        began)."""
        if self.stalls and self.stalls[-1]["until"] is None:
            since = self.stalls[-1].get("since")
            start = float(since) if isinstance(since, (int, float)) else until
            self.stalls[-1]["until"] = max(until, start)

    def add_verdict(self, kind: str, seconds: float) -> None:
        """``seconds`` more under verdict ``kind`` (each gap already ``verdict_gap``)."""
        self.verdict_seconds[kind] = self.verdict_seconds.get(kind, 0.0) + max(seconds, 0.0)

    def note_fail_slow(self, change: FailSlowChange, seconds: float) -> None:
        """One evaluation's word on a fail-slow change of the run: the change whose rank,
        part and start it names held ``seconds`` more (``verdict_gap``; 0 for the
        evaluation that names it first); its ratio is the largest seen, its cause the
        latest one named (``unknown`` never replaces a named one). Beyond
        ``MAX_RECORDED_FAIL_SLOW`` changes the smallest goes."""
        for entry in self.fail_slow:
            if (entry.get("rank"), entry.get("part"), entry.get("start")) == (
                    change.rank, change.part, change.start):
                entry["ratio"] = max(_number_or_none(entry.get("ratio")) or 0.0, change.ratio)
                entry["seconds"] = (_number_or_none(entry.get("seconds")) or 0.0) + max(
                    seconds, 0.0)
                entry["kind"] = change.kind
                if change.cause != "unknown" or not entry.get("cause"):
                    entry["cause"] = change.cause
                return
        self.fail_slow.append({"rank": change.rank, "part": change.part, "kind": change.kind,
                               "cause": change.cause, "ratio": change.ratio,
                               "start": change.start, "seconds": max(seconds, 0.0)})
        _keep_largest(self.fail_slow)

    def note_profile(self, entry: Mapping[str, object]) -> None:
        """One profile of a rank of the run (module docstring); beyond
        ``MAX_RECORDED_PROFILES`` the oldest goes."""
        checked = profile_entries([entry])
        if checked:
            self.profiles.append(checked[0])
            del self.profiles[:-MAX_RECORDED_PROFILES]

    def rates(self) -> list[float]:
        """The counted windows' samples/s (the warm-up one left out once there are three)."""
        rates = [rate for rate, _ in self.buckets]
        return rates[1:] if len(rates) >= 3 else rates

    def summary(
        self,
        *,
        ranks: int,
        duration_seconds: float,
        price_per_gpu_hour: float | None,
        currency: str,
    ) -> dict[str, object]:
        rates = self.rates()
        step = self.step_seconds
        active = self.active_seconds()
        gpu_hours = ranks * max(duration_seconds, 0.0) / 3600.0
        cost: dict[str, object] | None = None
        if price_per_gpu_hour is not None:
            total = gpu_hours * price_per_gpu_hour
            cost = {
                "currency": currency,
                "price_per_gpu_hour": price_per_gpu_hour,
                "total": total,
                "per_million_samples": total / self.samples * 1e6 if self.samples else None,
            }
        comm = self.comm_exposed_seconds
        if comm is None:
            comm = self.phase_seconds.get(COMM_PHASE)
        sketch = self.step_sketch
        if sketch is not None and (self.steps <= 0 or sketch.total() != self.steps):
            sketch = None  # not every step is in it: its percentiles would not be the run's
        return {
            "samples_per_second": self.samples / active if active else None,
            "active_seconds": active,
            "samples_per_second_median": percentile(rates, 0.5),
            "samples_per_second_p10": percentile(rates, 0.1),
            "step_seconds_p50": None if sketch is None else sketch_quantile(sketch, 0.5),
            "step_seconds_p95": None if sketch is None else sketch_quantile(sketch, 0.95),
            "step_seconds_percentile_error": None if sketch is None
            else relative_accuracy(sketch.level),
            "step_seconds_mean": step / self.steps if self.steps else None,
            "data_wait_ratio": self.data_wait_seconds / step if step > 0 else None,
            "comm_exposed_ratio": comm / step if step > 0 and comm is not None else None,
            "comm_exposed_ratio_by_group": {
                group: seconds / step for group, seconds
                in sorted(self.group_exposed_seconds.items())} if step > 0 else {},
            "phase_ratios": {name: seconds / step for name, seconds
                             in sorted(self.phase_seconds.items())} if step > 0 else {},
            "verdicts": dict(sorted(self.verdict_seconds.items())),
            "final_verdict": self.final_verdict,
            "steps": self.steps,
            "samples": self.samples,
            "duration_seconds": max(duration_seconds, 0.0),
            "gpu_hours": gpu_hours,
            "cost": cost,
            "checkpoints": self.checkpoints,
            "last_checkpoint": None if self.last_checkpoint is None
            else dict(self.last_checkpoint),
            "gpu_seconds": {bucket: self.gpu_seconds.get(bucket, 0.0) for bucket in BUCKETS}
            if self.gpu_seconds else {},
            "goodput_ratio": goodput_ratio(self.gpu_seconds),
            "stalls": [dict(stall) for stall in self.stalls],
            "fail_slow": sorted((dict(change) for change in self.fail_slow), key=_start_of),
            "profiles": [dict(profile) for profile in self.profiles],
        }

    def to_state(self) -> dict[str, object]:
        return {
            "steps": self.steps, "samples": self.samples, "step_seconds": self.step_seconds,
            "data_wait_seconds": self.data_wait_seconds, "step_buckets": self.step_buckets,
            "phase_seconds": self.phase_seconds,
            "comm_exposed_seconds": self.comm_exposed_seconds,
            "buckets": [list(bucket) for bucket in self.buckets],
            "intervals": self.intervals, "verdict_seconds": self.verdict_seconds,
            "active_start": self.active_start, "active_end": self.active_end,
            "final_verdict": self.final_verdict, "checkpoints": self.checkpoints,
            "last_checkpoint": self.last_checkpoint, "gpu_seconds": self.gpu_seconds,
            "stalls": self.stalls, "group_exposed_seconds": self.group_exposed_seconds,
            "fail_slow": self.fail_slow,
            "profiles": self.profiles,
            "step_sketch": None if self.step_sketch is None else {
                "level": self.step_sketch.level, "counts": to_wire(self.step_sketch.counts)},
        }

    @classmethod
    def from_state(cls, state: Mapping[str, object]) -> RunTotals:
        """Totals saved by ``to_state``; fresh ones where the state does not parse."""
        try:
            totals = cls(
                steps=int(state["steps"]),  # type: ignore[call-overload]
                samples=int(state["samples"]),  # type: ignore[call-overload]
                step_seconds=float(state["step_seconds"]),  # type: ignore[arg-type]
                data_wait_seconds=float(state["data_wait_seconds"]),  # type: ignore[arg-type]
                step_buckets=[int(v) for v in state["step_buckets"]],  # type: ignore[attr-defined]
                phase_seconds={str(k): float(v) for k, v
                               in state["phase_seconds"].items()},  # type: ignore[attr-defined]
                comm_exposed_seconds=None if state["comm_exposed_seconds"] is None
                else float(state["comm_exposed_seconds"]),  # type: ignore[arg-type]
                buckets=[(float(r), float(s)) for r, s in state["buckets"]],  # type: ignore[attr-defined]
                intervals=int(state["intervals"]),  # type: ignore[call-overload]
                # absent from the states of older daemons
                active_start=_number_or_none(state.get("active_start")),
                active_end=_number_or_none(state.get("active_end")),
                verdict_seconds={str(k): float(v) for k, v
                                 in state["verdict_seconds"].items()},  # type: ignore[attr-defined]
                # absent from the states of older daemons
                final_verdict=_text_or_none(state.get("final_verdict")),
                checkpoints=None if state.get("checkpoints") is None
                else int(state["checkpoints"]),  # type: ignore[call-overload]
                last_checkpoint=_mapping_or_none(state.get("last_checkpoint")),
                gpu_seconds={str(k): float(v) for k, v in (
                    state.get("gpu_seconds") or {}).items()},  # type: ignore[attr-defined]
                stalls=[dict(stall) for stall in state.get("stalls") or []  # type: ignore[attr-defined]
                        if isinstance(stall, Mapping)][-MAX_RECORDED_STALLS:],
                # absent from the states of older daemons
                group_exposed_seconds={str(k): float(v) for k, v in list((
                    state.get("group_exposed_seconds") or {}).items()  # type: ignore[attr-defined]
                    )[:MAX_COMM_GROUPS]},
                # absent from the states of older daemons
                step_sketch=_sketch_or_none(state.get("step_sketch")),
                # absent from the states of older daemons
                fail_slow=fail_slow_entries(state.get("fail_slow")),
                # absent from the states of older daemons
                profiles=profile_entries(state.get("profiles")),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return cls()
        if len(totals.step_buckets) != STEP_BUCKET_COUNT:
            return cls()
        return totals


def fail_slow_entries(value: object) -> list[dict[str, object]]:
    """The fail-slow changes of a saved state or a record's summary, each checked
    (texts, numbers), at most ``MAX_RECORDED_FAIL_SLOW`` of the largest, by start;
    [] where there are none or they do not parse."""
    if not isinstance(value, list):
        return []
    entries: list[dict[str, object]] = []
    for item in value[:4 * MAX_RECORDED_FAIL_SLOW]:
        if not isinstance(item, Mapping):
            continue
        texts = [item.get(key) for key in ("rank", "part", "kind", "cause")]
        numbers = [_number_or_none(item.get(key)) for key in ("ratio", "start", "seconds")]
        if all(isinstance(text, str) for text in texts) and all(
                number is not None for number in numbers):
            entries.append({"rank": texts[0], "part": texts[1], "kind": texts[2],
                            "cause": texts[3], "ratio": numbers[0], "start": numbers[1],
                            "seconds": numbers[2]})
    while len(entries) > MAX_RECORDED_FAIL_SLOW:
        _keep_largest(entries)
    return sorted(entries, key=_start_of)


def profile_entries(value: object) -> list[dict[str, object]]:
    """The profiles of a saved state or a record's summary, each checked (texts,
    numbers, the operator lists), the latest ``MAX_RECORDED_PROFILES``, oldest first;
    [] where there are none or they do not parse."""
    if not isinstance(value, list):
        return []
    entries: list[dict[str, object]] = []
    for item in value[-4 * MAX_RECORDED_PROFILES:]:
        if not isinstance(item, Mapping):
            continue
        request, rank = item.get("id"), item.get("rank")
        steps = item.get("steps")
        time, seconds = _number_or_none(item.get("time")), _number_or_none(item.get("seconds"))
        if not isinstance(request, str) or type(rank) is not int or type(steps) is not int \
                or time is None or seconds is None:
            continue
        trace, size, error = item.get("trace"), item.get("trace_bytes"), item.get("error")
        entries.append({
            "id": request, "rank": rank, "time": time, "steps": steps, "seconds": seconds,
            "trace": trace if isinstance(trace, str) else None,
            "trace_bytes": size if type(size) is int else None,
            "error": error if isinstance(error, str) else None,
            "self_cpu_seconds": _number_or_none(item.get("self_cpu_seconds")),
            "self_device_seconds": _number_or_none(item.get("self_device_seconds")),
            "top_cpu": _operator_entries(item.get("top_cpu")),
            "top_device": _operator_entries(item.get("top_device")),
        })
    return entries[-MAX_RECORDED_PROFILES:]


def _operator_entries(value: object) -> list[dict[str, object]]:
    """A profile's operator list, each ``name``, ``self_seconds``, ``share``, ``calls``."""
    if not isinstance(value, list):
        return []
    operators: list[dict[str, object]] = []
    for item in value[:MAX_PROFILE_OPERATORS]:
        if not isinstance(item, Mapping):
            continue
        name, calls = item.get("name"), item.get("calls")
        seconds, share = _number_or_none(item.get("self_seconds")), _number_or_none(
            item.get("share"))
        if isinstance(name, str) and type(calls) is int and seconds is not None \
                and share is not None:
            operators.append({"name": name, "self_seconds": seconds, "share": share,
                              "calls": calls})
    return operators


def _keep_largest(entries: list[dict[str, object]]) -> None:
    """Drop the smallest change (by ratio) when there are more than
    ``MAX_RECORDED_FAIL_SLOW``."""
    if len(entries) > MAX_RECORDED_FAIL_SLOW:
        del entries[min(range(len(entries)),
                        key=lambda index: _number_or_none(entries[index].get("ratio")) or 0.0)]


def _start_of(entry: Mapping[str, object]) -> float:
    return _number_or_none(entry.get("start")) or 0.0


def _number_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _sketch_or_none(value: object) -> StepSketch | None:
    """A saved step sketch, checked as the wire's (at most ``STEP_SKETCH_MAX_BUCKETS``
    buckets); None where there is none or it does not parse."""
    if not isinstance(value, Mapping):
        return None
    level = value.get("level")
    if type(level) is not int or not 0 <= level <= MAX_SKETCH_LEVEL:
        return None
    try:
        return StepSketch(from_wire(value.get("counts")), level)
    except (ValueError, OverflowError):  # malformed, or over the bound
        return None


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _mapping_or_none(value: object) -> dict[str, object] | None:
    return {str(key): item for key, item in value.items()} if isinstance(value, Mapping) \
        else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0-1) of ``values`` by nearest rank; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    index = max(0, math.ceil(q * len(ordered)) - 1)
    if q == 0.5 and len(ordered) % 2 == 0:
        middle = len(ordered) // 2
        return (ordered[middle - 1] + ordered[middle]) / 2
    return ordered[index]


def _merge_pairs(buckets: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged = []
    for index in range(0, len(buckets) - 1, 2):
        (rate_a, seconds_a), (rate_b, seconds_b) = buckets[index], buckets[index + 1]
        seconds = seconds_a + seconds_b
        merged.append(((rate_a * seconds_a + rate_b * seconds_b) / seconds, seconds))
    if len(buckets) % 2:
        merged.append(buckets[-1])
    return merged
