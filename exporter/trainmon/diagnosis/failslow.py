"""Fail-slow: a rank or a whole job that became slower during its run, and stayed slower.

The diagnosis window (a minute) says what holds a job back *now*; it cannot say
that the job is slower than it was. ``FailSlowDetector`` keeps, per rank, one
*observation* per evaluation interval (every ``window_seconds / 20``, 3 s by
default): the seconds per step of the step and of its parts (``compute``: step
− data wait − the communication waited for; ``data_wait``; ``comm``: the
measured exposed communication, else the comm phases), and the node's evidence
over the same interval (``signals``). An interval without a step gives no
observation: an evaluation pause or a checkpoint leaves a gap, or one long
step, never a level.

The test (docs/diagnosis.md, "Fail-slow") is a robust two-window sequential
test, evaluated at every interval. For each rank and part, the *reference* is
the median of the observations of the ``reference_seconds`` before the last
``test_seconds``, the *current* level the median of the last ``test_seconds``.
A change fires when

- the current level is above the reference by at least ``ratio`` (10 %) of the
  reference step time (so a part's change is weighed by what it costs a step);
- it is *consistent*: at least ``CONSISTENT_SHARE`` of the current observations
  are above the reference by half of that — a few long steps (an evaluation,
  a checkpoint, a long batch) move a median little and this share not at all;
- it is *significant*: above ``SIGNIFICANCE`` standard errors of the current
  median, the noise estimated from the reference's median absolute deviation —
  a job whose steps vary with its batches needs a larger change;
- both windows hold at least ``MIN_OBSERVATIONS`` observations and the reference
  spans at least ``test_seconds`` (the warm-up is left out before either:
  ``warmup_steps`` of each rank, as the verdict does).

A change is named once it has held ``test_seconds`` more since it fired (24 s by
default): a burst of CPU contention on the node ends within that, and the same change
reaches the job's other ranks, or shows in its part, an evaluation or two after it
first shows (named at once, the job's data wait would be named as one rank's, or as the
step's). Once fired, the reference is frozen: the change holds, with its magnitude
updated, until the current level falls back below half the threshold above it.
Where it started is the classic CUSUM estimate: the observation after which the
sum of deviations from the middle of the two levels is lowest.

Who and why (``FailSlow``), from the parts that fired. One change is named per rank
and one for the job, the largest where several parts changed on their own. Per job:

- the compute of some of the job's ranks on the node, not all: those ranks
  (kind ``scheduling``: a rank degraded, its node is the suspect);
- the compute of every rank: the job (kind ``compute``), unless the node's
  evidence names one rank alone (its cgroup throttled, its GPU throttled);
- data wait: the ranks or the job (kind ``storage``);
- communication of every rank while their compute held: the job (kind
  ``communication``) on a job within the node; on a multi-node job the ranks
  wait for a rank elsewhere (kind ``scheduling``, cause ``other_node``: that
  node's own detector names it).

The cause comes from the evidence of the same intervals (``CAUSES``): the
rank's cgroup CPU throttling, its GPU's thermal and power throttling and SM
clocks, its PCIe link, the node's NIC and InfiniBand errors, CPU pressure
(PSI) and steal, the NFS mounts' READ latency, an open Tencent Cloud event;
``unknown`` when none changed.

Pure arithmetic on ``ScrapedSamples``; the diagnosis collector owns one
detector and feeds it (``trainmon.collectors.diagnosis``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from trainmon.clock import WallSteps
from trainmon.diagnosis.samples import Labels, ScrapedSamples, Window

#: The parts of a step a change is looked for in, most specific last; beside them, each
#: process group's exposed communication (``GROUP_PART`` + its name: ``comm:tp``), which
#: says in which parallelism dimension a communication change is.
PARTS = ("step", "compute", "data_wait", "comm")
GROUP_PART = "comm:"
#: A change holds on at least this share of the current observations.
CONSISTENT_SHARE = 0.75
#: ... and is this many standard errors of the current median above the reference.
SIGNIFICANCE = 3.0
#: Observations each window needs at least.
MIN_OBSERVATIONS = 5
#: Observations kept per rank at most (bounds memory whatever the interval).
MAX_OBSERVATIONS = 400
#: A rank not seen for this long past the reference is forgotten (seconds).
FORGET_SECONDS = 600.0
#: Normal consistency constant of the median absolute deviation, and the standard
#: error of a median of n normal observations over that of the mean (sqrt(pi/2)).
MAD_SCALE = 1.4826
MEDIAN_EFFICIENCY = 1.2533

#: The evidence signals, each by the sample it is read from: a counter's rate over an
#: interval, or a gauge's level (``gpu_clocks``, ``pcie_link``, ``instance_event``); of
#: the rank's own process or GPU (``RANK_CAUSES``) or of the node.
SIGNALS = {
    "cpu_throttled": "trainmon_training_rank_cpu_throttled_seconds_total",
    "gpu_thermal": "trainmon_gpu_throttle_seconds_total",
    "gpu_power_cap": "trainmon_gpu_throttle_seconds_total",
    "gpu_clocks": "trainmon_gpu_sm_clock_hertz",
    "pcie_link": "trainmon_gpu_pcie_link_width",
    "pcie_replays": "trainmon_gpu_pcie_replays_total",
    "network_errors": "trainmon_network_receive_errors_total",
    "cpu_pressure": "trainmon_node_pressure_seconds_total",
    "cpu_steal": "trainmon_node_cpu_steal_seconds_total",
    "mount_latency": "trainmon_nfs_operation_rtt_seconds_total",
    "instance_event": "trainmon_tencent_event_info",
}
#: Every sample name the detector reads beyond the verdict's (``measure.MEASURED_SAMPLES``).
FAIL_SLOW_SAMPLES = frozenset({
    *SIGNALS.values(),
    "trainmon_gpu_pcie_link_max_width", "trainmon_network_transmit_errors_total",
    "trainmon_infiniband_errors_total", "trainmon_nfs_operations_total", "trainmon_node_info",
    "trainmon_training_world_size", "trainmon_training_group_comm_exposed_seconds_total",
})
#: GPU throttle reasons behind ``gpu_thermal`` and ``gpu_power_cap``
#: (``trainmon_gpu_throttle_seconds_total{reason}``).
THERMAL_REASONS = ("thermal",)
POWER_REASONS = ("power", "board_limit")


@dataclass(frozen=True)
class Cause:
    """When a signal names a cause: its level over the current window against the
    reference (both per second, or the gauge's level)."""

    name: str
    fired: Callable[[float, float], bool]


#: The causes in the order they are tried, per part that changed; the first whose
#: signal fired is the cause. Thresholds: docs/diagnosis.md, "Fail-slow".
CAUSES: dict[str, Cause] = {cause.name: cause for cause in (
    # seconds throttled per second of the rank's cgroup
    Cause("cpu_throttled", lambda now, before: now >= 0.05 and now >= before + 0.05),
    # seconds per second the GPU's clocks were held down for heat or power
    Cause("gpu_thermal", lambda now, before: now >= 0.2 and now >= before + 0.1),
    Cause("gpu_power_cap", lambda now, before: now >= 0.2 and now >= before + 0.1),
    # SM clock (Hz): 10 % lower
    Cause("gpu_clocks", lambda now, before: before > 0 and now <= 0.9 * before),
    # link width over its maximum: lower than it was
    Cause("pcie_link", lambda now, before: now < before and now < 1.0),
    Cause("pcie_replays", lambda now, before: now > 0 and now > before),
    Cause("network_errors", lambda now, before: now > 0 and now > 2 * before),
    # seconds per second some task waited for a CPU, and stolen by the hypervisor
    Cause("cpu_pressure", lambda now, before: now >= before + 0.25 and now >= 2 * before),
    Cause("cpu_steal", lambda now, before: now >= before + 0.1),
    # mean seconds per NFS READ: half as long again
    Cause("mount_latency", lambda now, before: before > 0 and now >= 1.5 * before),
    Cause("instance_event", lambda now, before: now > before),
)}
PART_CAUSES = {
    "compute": ("cpu_throttled", "gpu_thermal", "gpu_power_cap", "gpu_clocks", "pcie_link",
                "pcie_replays", "cpu_steal", "cpu_pressure", "instance_event"),
    "step": ("cpu_throttled", "gpu_thermal", "gpu_power_cap", "gpu_clocks", "pcie_link",
             "cpu_steal", "cpu_pressure", "network_errors", "instance_event"),
    "data_wait": ("mount_latency", "cpu_throttled", "cpu_pressure", "cpu_steal"),
    "comm": ("network_errors", "pcie_link", "pcie_replays", "instance_event"),
}
#: The causes a rank's own process or GPU shows (the others are the node's, the same
#: for every rank on it): only these single a rank out of a job that slowed as a whole.
RANK_CAUSES = ("cpu_throttled", "gpu_thermal", "gpu_power_cap", "gpu_clocks", "pcie_link",
               "pcie_replays")
#: The cause of a part whose evidence names none.
DEFAULT_CAUSE = {"data_wait": "data_loading"}
#: The kind of a change, by the part that changed and whether one rank or the job.
RANK_KIND = {"compute": "scheduling", "step": "scheduling", "data_wait": "storage",
             "comm": "communication"}
JOB_KIND = {"compute": "compute", "step": "compute", "data_wait": "storage",
            "comm": "communication"}


@dataclass(frozen=True)
class Observation:
    """One rank's evaluation interval."""

    #: Unix time at the interval's start and end (less the wall clock's steps).
    start: float
    end: float
    steps: float
    #: Seconds per step of each of ``PARTS`` the rank tells.
    parts: Mapping[str, float]
    #: Each evidence signal's level over the interval (``SIGNALS``).
    signals: Mapping[str, float]


@dataclass(frozen=True)
class FailSlow:
    """A change the detector holds: who, what, why, since when and by how much."""

    job: str
    #: The rank that degraded; "" when the whole job slowed.
    rank: str
    #: ``compute``, ``data_wait``, ``comm`` or ``step``.
    part: str
    #: The kind of its cause (``RANK_KIND``/``JOB_KIND``).
    kind: str
    #: ``CAUSES``' name, ``data_loading``, ``other_node`` or ``unknown``.
    cause: str
    #: The increase over the reference step time (0.25: 25 % slower).
    ratio: float
    #: Unix time the change started.
    start: float
    #: Seconds per step of the part before and now.
    before_seconds: float
    after_seconds: float
    #: The cause's signal before and now ("" where none).
    evidence_before: float | None = None
    evidence_now: float | None = None
    #: For a communication change, the process group (parallelism dimension) whose exposed
    #: communication grew most ("" where the ranks do not report groups).
    group: str = ""


@dataclass
class _Change:
    """A fired change of one rank's part: its frozen reference and where it began."""

    reference: float
    reference_step: float
    start: float
    current: float
    signals_before: Mapping[str, float]
    #: Unix time it fired.
    fired: float = 0.0
    #: The cause once named: it stays (a later signal does not rename it).
    cause: str = ""


@dataclass
class _Rank:
    job: str
    rank: str
    observations: deque[Observation] = field(
        default_factory=lambda: deque(maxlen=MAX_OBSERVATIONS))
    changes: dict[str, _Change] = field(default_factory=dict)
    #: The rank's step count at its last snapshot (a lower one: a new run).
    count: float = 0.0
    seen: float = 0.0


class FailSlowDetector:
    """Per rank observations and changes; ``update`` once per evaluation."""

    def __init__(self, *, ratio: float, test_seconds: float, reference_seconds: float,
                 warmup_steps: int, comm_phases: Sequence[str] = ("comm",)) -> None:
        self.ratio = ratio
        self.test_seconds = test_seconds
        self.reference_seconds = reference_seconds
        self.warmup_steps = warmup_steps
        self.comm_phases = tuple(comm_phases)
        self._ranks: dict[Labels, _Rank] = {}
        #: The previous snapshot and its time.
        self._previous: tuple[ScrapedSamples, float] | None = None
        #: The wall clock's steps: every time kept here is on their steady time.
        self._wall_steps: WallSteps | None = None

    def update(self, snapshot: ScrapedSamples) -> tuple[FailSlow, ...]:
        """Add the interval since the previous snapshot; the changes that hold now."""
        now = self._time(snapshot)
        previous, self._previous = self._previous, (snapshot, now)
        if previous is not None and now > previous[1]:
            self._observe(previous, snapshot, now)
        for key in [key for key, rank in self._ranks.items()
                    if now - rank.seen > FORGET_SECONDS + self.reference_seconds]:
            del self._ranks[key]
        return self.current(snapshot)

    def current(self, snapshot: ScrapedSamples) -> tuple[FailSlow, ...]:
        now = self._time(snapshot)
        world = {dict(labels).get("job", ""): value for labels, value in
                 snapshot.series("trainmon_training_world_size").items()}
        jobs: dict[str, list[_Rank]] = {}
        for rank in self._ranks.values():
            if now - rank.seen <= self.test_seconds:
                jobs.setdefault(rank.job, []).append(rank)
        found: list[FailSlow] = []
        for job, ranks in sorted(jobs.items()):
            # one change per rank (and one for the job): the largest, when parts of it
            # changed on their own (the data wait and, meanwhile, the compute)
            largest: dict[str, FailSlow] = {}
            for change in self._attribute(job, ranks, world.get(job), now):
                if change.rank not in largest or change.ratio > largest[change.rank].ratio:
                    largest[change.rank] = change
            found += sorted(largest.values(), key=lambda change: change.rank)
        return tuple(found)

    # -- observations ------------------------------------------------------------------

    def _time(self, snapshot: ScrapedSamples) -> float:
        """The snapshot's Unix time less the wall clock's steps (``trainmon.clock``): the
        intervals and windows here hold across a step, and a change's start is the
        wall clock's until one."""
        if self._wall_steps is None:
            self._wall_steps = WallSteps(snapshot.at, snapshot.wall)
        return self._wall_steps.observe(snapshot.at, snapshot.wall)

    def _observe(self, previous: tuple[ScrapedSamples, float], snapshot: ScrapedSamples,
                 now: float) -> None:
        (earlier, then) = previous
        window = Window([earlier, snapshot])
        node = _node_signals(window)
        counts = snapshot.series("trainmon_training_step_seconds_count")
        gpus = _rank_gpus(snapshot)
        for labels, count in counts.items():
            names = dict(labels)
            rank = self._ranks.get(labels)
            if rank is None or count < rank.count:  # new, or a new run: start again
                rank = self._ranks[labels] = _Rank(names.get("job", ""), names.get("rank", ""))
            before, rank.count, rank.seen = rank.count, count, now
            steps = count - before
            if steps <= 0 or before < self.warmup_steps:
                continue
            parts = _parts(window, labels, steps, self.comm_phases)
            if parts is None:
                continue
            signals = {**node, **_rank_signals(window, labels, gpus.get(
                (names.get("job", ""), names.get("rank", "")), ""))}
            rank.observations.append(Observation(then, now, steps, parts, signals))
            self._test(rank, now)

    def _test(self, rank: _Rank, now: float) -> None:
        """Fire, update or clear each part's change of ``rank`` at ``now``."""
        observations = [o for o in rank.observations
                        if o.end > now - self.test_seconds - self.reference_seconds]
        current = [o for o in observations if o.end > now - self.test_seconds]
        reference = [o for o in observations if o.end <= now - self.test_seconds]
        if len(current) < MIN_OBSERVATIONS:
            return
        groups = sorted({part for o in current for part in o.parts
                         if part.startswith(GROUP_PART)})
        for part in (*PARTS, *groups):
            values = [o.parts[part] for o in current if part in o.parts]
            if len(values) < MIN_OBSERVATIONS:  # paused: a change holds until it steps
                continue
            level = _median(values)
            change = rank.changes.get(part)
            if change is not None:
                hold = change.reference + self.ratio / 2 * change.reference_step
                if level < hold:
                    del rank.changes[part]
                else:
                    change.current = level
                continue
            before = [o.parts[part] for o in reference if part in o.parts]
            steps = [o.parts["step"] for o in reference]
            if (len(before) < MIN_OBSERVATIONS
                    or reference[-1].end - reference[0].start < self.test_seconds):
                continue
            base, base_step = _median(before), _median(steps)
            threshold = self.ratio * base_step
            noise = MAD_SCALE * _median([abs(v - base) for v in before])
            high = sum(v >= base + threshold / 2 for v in values)
            if (base_step > 0 and level - base >= threshold
                    and high >= CONSISTENT_SHARE * len(values)
                    and level - base >= SIGNIFICANCE * MEDIAN_EFFICIENCY * noise
                    / len(values) ** 0.5):
                series = [o for o in [*reference, *current] if part in o.parts]
                rank.changes[part] = _Change(
                    reference=base, reference_step=base_step,
                    start=_change_start(series, part, base, level), current=level,
                    signals_before=_signal_medians(reference), fired=now)

    # -- who and why -------------------------------------------------------------------

    def _attribute(self, job: str, ranks: Sequence[_Rank], world_size: float | None,
                   now: float) -> list[FailSlow]:
        """The job's changes that have held ``confirm`` seconds since they fired (a current
        window: a burst of contention that fired ends within it). Until then the
        same change reaches the other ranks, or shows in a part of the step, and is named
        once for what it is."""
        stepping = [rank for rank in ranks if rank.observations]
        if not stepping:
            return []
        confirm = self.test_seconds

        def held(slowed: Sequence[_Rank], part: str) -> bool:
            return bool(slowed) and now - min(
                rank.changes[part].fired for rank in slowed) >= confirm

        fired = {part: [rank for rank in stepping if part in rank.changes] for part in PARTS}
        whole = len(stepping)
        multi_node = world_size is not None and world_size > whole
        found: list[FailSlow] = []
        for part in ("data_wait", "compute"):
            slowed = fired[part]
            if len(slowed) < whole:
                found += [self._rank_change(rank, part) for rank in slowed
                          if held([rank], part)]
                continue
            if not held(slowed, part):
                continue
            # every rank: the job, unless the evidence names one rank of several alone
            # (a job that does not measure its communication: the others' wait for it
            # is in their compute)
            named = [rank for rank in slowed if self._cause(rank, part) in RANK_CAUSES]
            if part == "compute" and whole > 1 and len(named) == 1:
                found.append(self._rank_change(named[0], part))
            else:
                found.append(self._job_change(job, slowed, part))
        if found or fired["data_wait"] or fired["compute"]:
            return found  # a part names it, or will once it held: not the step
        for part in ("comm", "step"):
            if len(fired[part]) == whole and held(fired[part], part):
                # a synchronous job slows as a whole when one rank does: its own process
                # or GPU (a throttled cgroup slows its collectives too) names it
                singled = self._singled_out(stepping)
                if singled is not None:
                    return [singled]
                change = self._job_change(job, fired[part], part)
                if multi_node and (part == "comm" or change.cause == "unknown"):
                    change = _replace_cause(change, "scheduling", "other_node")
                return [change]
        return [self._rank_change(rank, "step") for rank in fired["step"]
                if held([rank], "step")]

    def _singled_out(self, stepping: Sequence[_Rank]) -> FailSlow | None:
        """The change of the one rank of several whose own process or GPU shows a cause
        (``RANK_CAUSES``, on any part that changed), as its compute's or else its step's
        change; None when no rank or more than one does."""
        if len(stepping) < 2:
            return None
        named = [(rank, found) for rank in stepping if (found := self._own_cause(rank))]
        if len(named) != 1:
            return None
        rank, cause = named[0]
        part = next((p for p in ("compute", "step") if p in rank.changes), None)
        if part is None:
            return None
        change = rank.changes[part]
        change.cause = change.cause if change.cause in RANK_CAUSES else cause
        return self._rank_change(rank, part)

    def _own_cause(self, rank: _Rank) -> str:
        """The first of ``RANK_CAUSES`` whose signal fired since any change of the rank
        started ("" if none)."""
        return next((found for change in rank.changes.values()
                     if (found := _fired(rank, change, RANK_CAUSES))), "")

    def _rank_change(self, rank: _Rank, part: str) -> FailSlow:
        change = rank.changes[part]
        cause = self._cause(rank, part) or DEFAULT_CAUSE.get(part, "unknown")
        before, now = self._evidence(rank, cause)
        return FailSlow(
            job=rank.job, rank=rank.rank, part=part, kind=RANK_KIND[part], cause=cause,
            ratio=_ratio(change), start=change.start, before_seconds=change.reference,
            after_seconds=change.current, evidence_before=before, evidence_now=now)

    def _job_change(self, job: str, ranks: Sequence[_Rank], part: str) -> FailSlow:
        """The job's change: its median rank's, the cause the first rank's evidence names."""
        ordered = sorted(ranks, key=lambda rank: _ratio(rank.changes[part]))
        middle = ordered[len(ordered) // 2]
        change = middle.changes[part]
        causes = [(cause, rank) for rank in ranks if (cause := self._cause(rank, part))]
        cause, witness = causes[0] if causes else (DEFAULT_CAUSE.get(part, "unknown"), middle)
        before, now = self._evidence(witness, cause)
        return FailSlow(
            job=job, rank="", part=part, kind=JOB_KIND[part], cause=cause,
            ratio=_ratio(change), start=min(rank.changes[part].start for rank in ranks),
            before_seconds=change.reference, after_seconds=change.current,
            evidence_before=before, evidence_now=now,
            group=_group(ranks) if part == "comm" else "")

    def _cause(self, rank: _Rank, part: str) -> str:
        """The first of the part's causes whose signal changed ("" while none did); once
        named, it stays the change's cause."""
        change = rank.changes.get(part)
        if change is None:
            return ""
        if not change.cause:
            change.cause = _fired(rank, change, PART_CAUSES[part])
        return change.cause

    def _evidence(self, rank: _Rank, cause: str) -> tuple[float | None, float | None]:
        change = next(iter(rank.changes.values()), None)
        if change is None or cause not in SIGNALS:
            return None, None
        now = _signal_medians([o for o in rank.observations if o.start >= change.start])
        return change.signals_before.get(cause), now.get(cause)


def _fired(rank: _Rank, change: _Change, names: Iterable[str]) -> str:
    """The first of ``names`` whose signal fired on ``rank`` since ``change`` started
    ("" if none)."""
    now = _signal_medians([o for o in rank.observations if o.start >= change.start])
    return next((name for name in names if name in now and CAUSES[name].fired(
        now[name], change.signals_before.get(name, 0.0))), "")


def _replace_cause(change: FailSlow, kind: str, cause: str) -> FailSlow:
    return replace(change, kind=kind, cause=cause, evidence_before=None, evidence_now=None)


def _group(ranks: Sequence[_Rank]) -> str:
    """The process group whose exposed communication grew most on ``ranks``."""
    grown: dict[str, float] = {}
    for rank in ranks:
        for part, change in rank.changes.items():
            if part.startswith(GROUP_PART):
                name = part[len(GROUP_PART):]
                grown[name] = grown.get(name, 0.0) + change.current - change.reference
    return max(grown, key=lambda name: grown[name]) if grown else ""


def _ratio(change: _Change) -> float:
    return (change.current - change.reference) / change.reference_step


def _median(values: Iterable[float]) -> float:
    data = sorted(values)
    middle = len(data) // 2
    return data[middle] if len(data) % 2 else (data[middle - 1] + data[middle]) / 2


def _change_start(series: Sequence[Observation], part: str, before: float,
                  after: float) -> float:
    """Where the level moved from ``before`` to ``after``: the start of the observation
    after the lowest point of the cumulative sum of deviations from their middle (each
    observation clipped to ``after``, so that one long step counts as one slow one)."""
    middle = (before + after) / 2
    total, lowest, start = 0.0, 0.0, series[0].start
    for observation in series:
        total += min(observation.parts[part], after) - middle
        if total < lowest:
            lowest, start = total, observation.end
    return start


def _signal_medians(observations: Sequence[Observation]) -> dict[str, float]:
    by_signal: dict[str, list[float]] = {}
    for observation in observations:
        for name, value in observation.signals.items():
            by_signal.setdefault(name, []).append(value)
    return {name: _median(values) for name, values in by_signal.items()}


def _parts(window: Window, labels: Labels, steps: float,
           comm_phases: tuple[str, ...]) -> dict[str, float] | None:
    """Seconds per step of the step and its parts over the two-snapshot ``window``."""
    step = window.increase("trainmon_training_step_seconds_sum", labels)
    if step is None or step <= 0:
        return None
    names = dict(labels)
    wait = window.increase("trainmon_training_data_wait_seconds_total", labels)
    comm = window.increase("trainmon_training_comm_exposed_seconds_total", labels)
    if comm is None:
        phases = [window.increase("trainmon_training_phase_seconds_total",
                                  tuple(sorted({**names, "phase": phase}.items())))
                  for phase in comm_phases]
        known = [value for value in phases if value is not None]
        comm = sum(known) if known else None
    parts = {"step": step / steps}
    parts["compute"] = max(0.0, step - (wait or 0.0) - (comm or 0.0)) / steps
    if wait is not None:
        parts["data_wait"] = wait / steps
    if comm is not None:
        parts["comm"] = comm / steps
    for group_labels in window.label_sets("trainmon_training_group_comm_exposed_seconds_total"):
        found = dict(group_labels)
        if all(found.get(key) == names.get(key) for key in ("job", "owner", "rank")):
            exposed = window.increase("trainmon_training_group_comm_exposed_seconds_total",
                                      group_labels)
            if exposed is not None:
                parts[GROUP_PART + found.get("group", "")] = exposed / steps
    return parts


def _rank_gpus(snapshot: ScrapedSamples) -> dict[tuple[str, str], str]:
    return {(names.get("job", ""), names.get("rank", "")): names.get("gpu", "")
            for labels in snapshot.series("trainmon_training_rank_info")
            for names in (dict(labels),)}


def _rank_signals(window: Window, labels: Labels, gpu: str) -> dict[str, float]:
    """The evidence of the rank's own process and GPU over the interval."""
    signals: dict[str, float] = {}
    names = dict(labels)
    throttled = _rate_where(window, "trainmon_training_rank_cpu_throttled_seconds_total",
                            lambda found: all(found.get(key) == names.get(key)
                                              for key in ("job", "rank", "owner")
                                              if key in found))
    if throttled is not None:
        signals["cpu_throttled"] = throttled
    if not gpu:
        return signals
    on_gpu: Callable[[Mapping[str, str]], bool] = lambda found: found.get("gpu") == gpu  # noqa: E731
    for name, reasons in (("gpu_thermal", THERMAL_REASONS), ("gpu_power_cap", POWER_REASONS)):
        value = _rate_where(window, "trainmon_gpu_throttle_seconds_total",
                            _gpu_reason(gpu, reasons))
        if value is not None:
            signals[name] = value
    clock = _level_where(window, "trainmon_gpu_sm_clock_hertz", on_gpu)
    if clock is not None:
        signals["gpu_clocks"] = clock
    link = _pcie_link(window, gpu)
    if link is not None:
        signals["pcie_link"] = link
    replays = _rate_where(window, "trainmon_gpu_pcie_replays_total", on_gpu)
    if replays is not None:
        signals["pcie_replays"] = replays
    return signals


def _gpu_reason(gpu: str, reasons: Sequence[str]) -> Callable[[Mapping[str, str]], bool]:
    return lambda found: found.get("gpu") == gpu and found.get("reason") in reasons


def _node_signals(window: Window) -> dict[str, float]:
    """The node's evidence over the interval."""
    signals: dict[str, float] = {}
    errors = [value for name in ("trainmon_network_receive_errors_total",
                                 "trainmon_network_transmit_errors_total",
                                 "trainmon_infiniband_errors_total")
              if (value := _rate_where(window, name, lambda found: True)) is not None]
    if errors:
        signals["network_errors"] = sum(errors)
    pressure = _rate_where(window, "trainmon_node_pressure_seconds_total",
                           lambda found: found.get("resource") == "cpu"
                           and found.get("scope") == "some")
    if pressure is not None:
        signals["cpu_pressure"] = pressure
    steal = _rate_where(window, "trainmon_node_cpu_steal_seconds_total", lambda found: True)
    if steal is not None:
        signals["cpu_steal"] = steal
    reads = _rate_where(window, "trainmon_nfs_operations_total",
                        lambda found: found.get("operation") == "READ")
    rtt = _rate_where(window, "trainmon_nfs_operation_rtt_seconds_total",
                      lambda found: found.get("operation") == "READ")
    if reads and rtt is not None:
        signals["mount_latency"] = rtt / reads
    instance = {dict(labels).get("instance_id", "")
                for labels in window.latest("trainmon_node_info")} - {""}
    if instance:
        signals["instance_event"] = float(sum(
            1 for labels in window.latest("trainmon_tencent_event_info")
            if dict(labels).get("instance_id") in instance))
    return signals


def _pcie_link(window: Window, gpu: str) -> float | None:
    """The GPU's PCIe link width over its maximum (1: full). Not the generation: an idle
    GPU lowers it to save power, and a job that slowed for another reason idles its GPU."""
    def latest(name: str) -> float | None:
        return next((value for labels, value in window.latest(name).items()
                     if dict(labels).get("gpu") == gpu), None)

    width, widest = latest("trainmon_gpu_pcie_link_width"), latest(
        "trainmon_gpu_pcie_link_max_width")
    return width / widest if width and widest else None


def _rate_where(window: Window, name: str,
                keep: Callable[[Mapping[str, str]], bool]) -> float | None:
    """The summed rate of the series of ``name`` whose labels ``keep`` takes (None when
    none is in both snapshots)."""
    rates = [rate for labels in window.label_sets(name) if keep(dict(labels))
             and (rate := window.rate(name, labels)) is not None]
    return sum(rates) if rates else None


def _level_where(window: Window, name: str,
                 keep: Callable[[Mapping[str, str]], bool]) -> float | None:
    levels = [value for labels in window.label_sets(name) if keep(dict(labels))
              and (value := window.mean(name, labels)) is not None]
    return sum(levels) / len(levels) if levels else None
