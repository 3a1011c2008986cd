"""A Prometheus server as the source of runs (``--prometheus URL``), for runs that
spanned many nodes.

Which runs exist and where: ``trainmon_training_run_info{job,run,config_hash}``
(one series per node, ``instance`` = the node daemon's address, scraped with
``honor_labels: true`` so that ``job`` is the training job). A run's span on a
node is the first and last scrape of its ``run_info`` there; its start is
``trainmon_training_run_start_timestamp_seconds`` where that exists.

What it measured, from the training counters of the same nodes restricted to
the times the run was live there (``… and on(instance, job) run_info{run=…}``,
a range query at a step of about a thousandth of the span):

- samples/s (``samples_per_second``, the headline, as the ledger's): on each
  node, the samples of the run's ranks (the increase of
  ``trainmon_training_samples_total`` over the intervals in which they stepped)
  over their active time, from the start of the first step counted to the end of
  the last; summed over the nodes, as ``compare`` adds the nodes' ledgers up. A
  step's end is the rank's ``trainmon_training_last_step_timestamp_seconds`` (the
  sender's clock) and its steps are contiguous, so the steps counted in an
  interval between two points began at that end − their
  Δ``trainmon_training_step_seconds_sum``: both ends are exact to the step,
  whatever the scrape timing, and the idle time after a finished run does not
  count. Its precision is the scrape interval's (the query step's, span / 1000,
  for runs longer than about 4 h at 15 s): the steps a node did before
  Prometheus first scraped the run there, and after it last scraped its ranks (a
  finished run's ranks leave the exposition at once), are counted neither in the
  samples nor in the time, so a run whose first interval was slower (warm-up)
  reads up to that much faster than the ledger's figure, which counts from the
  first step. None when a counted interval has no step end (not scraped);
- samples/s spread (``samples_per_second_median``, ``_p10``): per rank,
  Δ``trainmon_training_samples_total`` / Δ``trainmon_training_step_seconds_sum``
  (samples per second of the rank's training-loop time), summed over the ranks,
  in buckets of ``max(30 s, span / 30)``; the median and p10 over the buckets in
  which any rank stepped;
- step time: the mean step, Δ``trainmon_training_step_seconds_sum`` /
  Δ``trainmon_training_step_seconds_count`` over the span (exact). No
  percentiles: Prometheus holds the step-time histogram's buckets only, and a
  quantile interpolated within a bucket is off by up to the bucket's width
  (``step_seconds_p50``/``_p95`` are None; the node's ledger has them from the
  ranks' step sketches);
- data wait, exposed communication and each phase: Δseconds / Δstep seconds;
- verdicts: seconds for which ``trainmon_bottleneck{job,kind}`` was 1;
- fail-slow (``fail_slow``, as the ledger's): the points of
  ``trainmon_diagnosis_fail_slow_ratio`` of the job and its owner while the run was
  live on the node, one change per rank, part and start
  (``…_fail_slow_start_timestamp_seconds`` at the same point; its kind from
  ``trainmon_diagnosis_finding_info{finding="fail_slow"}``): its largest ratio and
  the time from its first point to its last (``fail_slow_summary``);
- end reason: each node's ``trainmon_training_run_end_timestamp_seconds{reason}``
  (the ledger exports it for an hour after the end; the latest end per node,
  a ``stalled`` one only while it is still exported), combined over the nodes
  (``combined_end_reason``), or the node daemon's record;
- ranks covered: the ranks whose samples Prometheus holds, against the
  job's world size (``RunView.partial``).

The description (config, environment, data paths, versions, git) is not in
Prometheus (details are never labels): it comes from each node daemon's
``GET http://<instance>/api/v1/runs/<run>``. A daemon that does not answer is
named in ``RunView.unavailable``, and ``compare`` says which details are
unknown instead of reporting no change.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests

from trainmon.ledger import combined_end_reason
from trainmon.ledger.summary import MAX_RECORDED_FAIL_SLOW
from trainmon.runs.local import UnknownRun
from trainmon.runs.view import RunView, redacted

log = logging.getLogger(__name__)

#: How far back ``runs`` and ``compare`` look without ``--since`` (seconds).
DEFAULT_LOOKBACK_SECONDS = 30 * 86400.0
#: Resolution of the subqueries that date the runs ``runs`` lists (seconds); a
#: run shorter than this is dated from its raw samples.
DISCOVERY_RESOLUTION_SECONDS = 15
#: Throughput buckets: at least this wide (seconds), about 30 over a run.
MIN_BUCKET_SECONDS = 30.0
BUCKETS_PER_RUN = 30
#: Points of one range query over a run's span, at most.
POINTS_PER_RUN = 1000


class PrometheusError(Exception):
    """Prometheus could not be asked or refused the query (the CLI exits 1)."""


def promql_string(value: str) -> str:
    """``value`` as a PromQL string literal, quotes included."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclass(frozen=True)
class _Placement:
    """One run on one node (a ``run_info`` series)."""

    instance: str
    job: str
    run: str
    config_hash: str
    first_seen: float
    last_seen: float
    started: float | None
    #: The ledger's end reason on this node and its Unix time, when exported.
    end_reason: str | None = None
    ended: float | None = None


class PrometheusSource:
    """Runs as one Prometheus server saw them, descriptions from the node daemons."""

    def __init__(
        self,
        url: str,
        *,
        session: requests.Session | None = None,
        timeout: float = 30.0,
        daemon_scheme: str = "http",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/") if "://" in url else f"http://{url.rstrip('/')}"
        self.http = session if session is not None else requests.Session()
        self.timeout = timeout
        self.daemon_scheme = daemon_scheme
        self.clock = clock

    def close(self) -> None:
        self.http.close()

    # -- the API --------------------------------------------------------

    def _api(self, path: str, params: Mapping[str, str]) -> Any:
        target = f"{self.url}/api/v1/{path}"
        try:
            response = self.http.get(target, params=dict(params), timeout=self.timeout)
        except requests.RequestException as error:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: "
                                  f"{unreachable_reason(error, self.timeout)}") from None
        try:
            body = response.json()
        except ValueError:
            raise PrometheusError(
                f"{target} answered HTTP {response.status_code} without JSON: is {self.url} "
                "a Prometheus server?") from None
        if not isinstance(body, Mapping) or body.get("status") != "success":
            detail = body.get("error") if isinstance(body, Mapping) else None
            raise PrometheusError(f"Prometheus refused {params.get('query', path)!r}: {detail}")
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        data = self._api("query", {"query": expr, "time": f"{at:.3f}"})
        return list(data.get("result") or []) if data.get("resultType") == "vector" else []

    def query_range(self, expr: str, start: float, end: float, step: float
                    ) -> list[dict[str, Any]]:
        data = self._api("query_range", {"query": expr, "start": f"{start:.3f}",
                                         "end": f"{end:.3f}", "step": f"{step:g}"})
        return list(data.get("result") or [])

    # -- discovery --------------------------------------------------------

    def _placements(self, job: str | None, run: str | None, since: float | None,
                    *, exact: bool = False) -> list[_Placement]:
        """The run_info series in the window, with their first and last scrape.

        The series API lists every series that existed (however short); the
        first and last scrape come from a subquery at ``DISCOVERY_RESOLUTION_SECONDS``
        for long runs, and from the raw samples for runs the subquery saw at fewer
        than three of its points (it would date a 20 s run by one point, and measure
        none of it) or when ``exact`` (``compare`` measures between exactly those
        scrapes).
        """
        now = self.clock()
        start = since if since is not None else now - DEFAULT_LOOKBACK_SECONDS
        window = max(DISCOVERY_RESOLUTION_SECONDS, math.ceil(now - start))
        matchers = [f"job={promql_string(job)}" if job else "",
                    f"run={promql_string(run)}" if run else ""]
        selector = "{" + ",".join(m for m in matchers if m) + "}"
        info = f"trainmon_training_run_info{selector}"
        listed = self._api("series", {"match[]": info, "start": f"{start:.3f}",
                                      "end": f"{now:.3f}"})
        keys = {self._key(labels) for labels in listed if isinstance(labels, Mapping)}
        if not keys:
            return []
        seen: dict[tuple[str, str, str, str], tuple[float, float]] = {}
        if not exact:
            res = f"[{window}s:{DISCOVERY_RESOLUTION_SECONDS}s]"
            first = {self._key(s["metric"]): float(s["value"][1])
                     for s in self.query(f"min_over_time(timestamp({info}){res})", now)}
            for series in self.query(f"max_over_time(timestamp({info}){res})", now):
                key = self._key(series["metric"])
                seen[key] = (first.get(key, float(series["value"][1])),
                             float(series["value"][1]))
        short = {key for key, (first_seen, last_seen) in seen.items()
                 if last_seen - first_seen < 2 * DISCOVERY_RESOLUTION_SECONDS}
        for key in (keys - seen.keys()) | short:
            instance, job_name, run_name, config_hash = key
            raw = self._api("query", {
                "query": (f"trainmon_training_run_info{{instance={promql_string(instance)},"
                          f"job={promql_string(job_name)},run={promql_string(run_name)},"
                          f"config_hash={promql_string(config_hash)}}}[{window}s]"),
                "time": f"{now:.3f}"})
            times = [float(t) for series in raw.get("result") or []
                     for t, _ in series.get("values", [])]
            if times:
                seen[key] = (min(times), max(times))
        starts = {(s["metric"].get("instance", ""), s["metric"].get("job", ""),
                   s["metric"].get("run", "")): float(s["value"][1])
                  for s in self.query(
                      f"max_over_time(trainmon_training_run_start_timestamp_seconds"
                      f"{selector}[{window}s])", now)}
        ends = self._ends(selector, window, now)
        return [
            _Placement(instance=key[0], job=key[1], run=key[2], config_hash=key[3],
                       first_seen=first_seen, last_seen=last_seen, started=starts.get(key[:3]),
                       end_reason=ends.get(key[:3], (None, None))[0],
                       ended=ends.get(key[:3], (None, None))[1])
            for key, (first_seen, last_seen) in sorted(seen.items())
        ]

    def _ends(self, selector: str, window: int, now: float
              ) -> dict[tuple[str, str, str], tuple[str, float]]:
        """(instance, job, run) -> (end reason, Unix end time): the latest end each node's
        ledger exported; a ``stalled`` one only while still exported (steps may resume)."""
        metric = f"trainmon_training_run_end_timestamp_seconds{selector}"

        def key(labels: Mapping[str, str]) -> tuple[str, str, str]:
            return labels.get("instance", ""), labels.get("job", ""), labels.get("run", "")

        current = {(*key(s["metric"]), s["metric"].get("reason", ""))
                   for s in self.query(metric, now)}
        ends: dict[tuple[str, str, str], tuple[str, float]] = {}
        for series in self.query(f"max_over_time({metric}[{window}s])", now):
            labels = series["metric"]
            reason, ended = labels.get("reason", ""), float(series["value"][1])
            if not reason or (reason == "stalled" and (*key(labels), reason) not in current):
                continue
            if key(labels) not in ends or ended > ends[key(labels)][1]:
                ends[key(labels)] = (reason, ended)
        return ends

    @staticmethod
    def _key(labels: Mapping[str, str]) -> tuple[str, str, str, str]:
        return (labels.get("instance", ""), labels.get("job", ""), labels.get("run", ""),
                labels.get("config_hash", ""))

    def runs(self, job: str | None = None, since: float | None = None) -> list[RunView]:
        """Every run Prometheus saw since ``since`` (default 30 days), newest first."""
        by_run: dict[tuple[str, str], list[_Placement]] = {}
        for placement in self._placements(job, None, since):
            by_run.setdefault((placement.job, placement.run), []).append(placement)
        views = [self._view(placements, describe=False) for placements in by_run.values()]
        return sorted(views, key=lambda view: view.started, reverse=True)

    def run(self, run: str, job: str | None = None) -> RunView:
        placements = self._placements(job, run, None, exact=True)
        if not placements:
            raise UnknownRun(f"run {run!r}: Prometheus at {self.url} has no "
                             "trainmon_training_run_info for it in the last 30 days")
        jobs = {placement.job for placement in placements}
        if len(jobs) > 1:
            raise UnknownRun(f"run {run!r} belongs to several jobs ({', '.join(sorted(jobs))}): "
                             "give --job")
        return self._view(placements, describe=True)

    # -- one run ---------------------------------------------------------------

    def _view(self, placements: Sequence[_Placement], *, describe: bool) -> RunView:
        first = placements[0]
        start = min(p.first_seen for p in placements)
        end = max(p.last_seen for p in placements)
        started = min((p.started for p in placements if p.started is not None),
                      default=min(p.first_seen for p in placements))
        summary, ranks = self._throughput_only(first.job, first.run, start, end)
        if describe:
            summary = self._summary(summary, first.job, first.run, start, end)
        description: Mapping[str, Any] | None = None
        unavailable: list[str] = []
        described_reason: str | None = None
        world_size: int | None = None
        if describe:
            description, described_reason, world_size, unavailable = self._describe(placements)
            if world_size is None:
                world_size = self._world_size(first.job, first.run, start, end)
        end_reason = combined_end_reason([*(p.end_reason for p in placements), described_reason])
        # ended: the ledger said so, or Prometheus stopped seeing the run
        gone = self.clock() - end > 2 * DISCOVERY_RESOLUTION_SECONDS
        ended = None
        if end_reason is not None or gone:
            ended = max((p.ended for p in placements if p.ended is not None), default=end)
        return RunView(
            job=first.job, run=first.run, config_hash=first.config_hash,
            started=started, ended=ended,
            end_reason=end_reason, world_size=world_size,
            nodes=tuple(sorted({p.instance for p in placements})),
            description=description if describe else None, summary=summary,
            source="prometheus", unavailable=tuple(unavailable), ranks=ranks,
        )

    def _describe(self, placements: Sequence[_Placement]
                  ) -> tuple[Mapping[str, Any] | None, str | None, int | None, list[str]]:
        """The first node daemon's record of the run (description, end reason, world size)."""
        unavailable: list[str] = []
        for placement in sorted(placements, key=lambda p: p.instance):
            target = (f"{self.daemon_scheme}://{placement.instance}/api/v1/runs/"
                      f"{urllib.parse.quote(placement.run, safe='')}")
            try:
                response = self.http.get(target, params={"job": placement.job},
                                         timeout=self.timeout)
                if response.status_code == 404:
                    unavailable.append(f"description: the daemon {placement.instance} has no "
                                       f"record of run {placement.run}")
                    continue
                response.raise_for_status()
                records = response.json()
            except (requests.RequestException, ValueError) as error:
                log.info("cannot read the run description from %s: %s", target, error)
                unavailable.append(f"description: the daemon {placement.instance} did not "
                                   f"answer {target}")
                continue
            if isinstance(records, Mapping):
                records = records.get("runs", [])
            for record in records if isinstance(records, list) else []:
                if isinstance(record, Mapping) and record.get("job") == placement.job and \
                        isinstance(record.get("description"), Mapping):
                    world = record.get("world_size")
                    return (redacted(record["description"]), record.get("end_reason"),
                            world if isinstance(world, int) else None, [])
            unavailable.append(f"description: the daemon {placement.instance} has no record "
                               f"of run {placement.run}")
        return None, None, None, unavailable

    def _joined(self, metric: str, job: str, run: str, by: str = "",
                aggregation: str = "sum") -> str:
        series = f"{metric}{{job={promql_string(job)}}}"
        joined = (f"{series} and on(instance, job) "
                  f"trainmon_training_run_info{{job={promql_string(job)},run={promql_string(run)}}}")
        return f"{aggregation} by (instance, rank{by}) ({joined})"

    def _range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        step = max(1.0, math.ceil((end - start) / POINTS_PER_RUN))
        return self.query_range(expr, start, end, step)

    def _throughput_only(self, job: str, run: str, start: float, end: float
                         ) -> tuple[dict[str, Any], int | None]:
        """The throughput part of the summary, and the ranks it covers (None: no samples)."""
        samples = self._range(self._joined("trainmon_training_samples_total", job, run),
                              start, end)
        loop = self._range(self._joined("trainmon_training_step_seconds_sum", job, run),
                           start, end)
        # a time, not a quantity: never summed (two owners' jobs of one name on a node)
        last_step = self._range(self._joined("trainmon_training_last_step_timestamp_seconds",
                                             job, run, aggregation="max"), start, end)
        ranks = {(s["metric"].get("instance", ""), s["metric"].get("rank", "")) for s in samples}
        return throughput_summary(samples, loop, last_step), len(ranks) or None

    def _summary(self, summary: dict[str, Any], job: str, run: str, start: float, end: float
                 ) -> dict[str, Any]:
        """``summary`` (the throughput part) with step times, shares and verdicts."""
        loop = _increase_by(self._range(
            self._joined("trainmon_training_step_seconds_sum", job, run), start, end), ())
        loop_seconds = sum(loop.values())

        def share(metric: str, by: tuple[str, ...] = ()) -> dict[tuple[str, ...], float]:
            label = "".join(f", {name}" for name in by)
            increases = _increase_by(self._range(self._joined(metric, job, run, label),
                                                 start, end), by)
            return {key: value / loop_seconds for key, value in increases.items()
                    } if loop_seconds > 0 else {}

        data_wait = share("trainmon_training_data_wait_seconds_total")
        exposed = share("trainmon_training_comm_exposed_seconds_total")
        phases = {key[0]: value for key, value in
                  share("trainmon_training_phase_seconds_total", ("phase",)).items()}
        summary["data_wait_ratio"] = data_wait.get((), None)
        # measured exposed communication where ranks measure it, else the comm phase
        summary["comm_exposed_ratio"] = exposed.get((), phases.get("comm"))
        summary["phase_ratios"] = phases
        steps = sum(_increase_by(self._range(
            self._joined("trainmon_training_step_seconds_count", job, run), start, end),
            ()).values())
        summary["step_seconds_p50"] = summary["step_seconds_p95"] = None
        summary["step_seconds_mean"] = loop_seconds / steps if steps > 0 else None
        summary["verdicts"] = self._verdicts(job, run, start, end)
        summary["fail_slow"] = self._fail_slow(job, run, start, end)
        return summary

    def _fail_slow(self, job: str, run: str, start: float, end: float
                   ) -> list[dict[str, object]]:
        """The run's fail-slow changes, from the diagnosis' series of the job and its owner
        while the run was live on each node."""
        live = f"trainmon_training_run_info{{job={promql_string(job)},run={promql_string(run)}}}"

        def series(selector: str, by: str) -> list[dict[str, Any]]:
            return self._range(f"max by (instance, {by}) ({selector} and on(instance, job, "
                               f"owner) {live})", start, end)

        ratios = series(f"trainmon_diagnosis_fail_slow_ratio{{job={promql_string(job)}}}",
                        "rank, part, cause")
        if not ratios:
            return []
        starts = series(f"trainmon_diagnosis_fail_slow_start_timestamp_seconds"
                        f"{{job={promql_string(job)}}}", "rank")
        kinds = series(f"trainmon_diagnosis_finding_info{{job={promql_string(job)},"
                       f"finding=\"fail_slow\"}}", "rank, kind")
        return fail_slow_summary(ratios, starts, kinds)

    def _world_size(self, job: str, run: str, start: float, end: float) -> int | None:
        """The largest ``trainmon_training_world_size`` of the job while the run was live."""
        window = max(1, math.ceil(end - start))
        resolution = max(1, math.ceil(window / POINTS_PER_RUN))
        expr = (f"max(max_over_time((trainmon_training_world_size{{job={promql_string(job)}}} "
                f"and on(instance, job) trainmon_training_run_info{{job={promql_string(job)},"
                f"run={promql_string(run)}}})[{window}s:{resolution}s]))")
        found = self.query(expr, end)
        return int(float(found[0]["value"][1])) if found else None

    def _verdicts(self, job: str, run: str, start: float, end: float) -> dict[str, float]:
        expr = (f"max by (kind) (trainmon_bottleneck{{job={promql_string(job)}}} == 1 "
                f"and on(instance) trainmon_training_run_info{{job={promql_string(job)},"
                f"run={promql_string(run)}}})")
        step = max(1.0, math.ceil((end - start) / POINTS_PER_RUN))
        return {series["metric"].get("kind", ""): len(series["values"]) * step
                for series in self.query_range(expr, start, end, step)}


def unreachable_reason(error: requests.RequestException, timeout: float) -> str:
    """Why a request failed, in a few words ("connection refused", "no answer within
    30 s", "cannot resolve the host name: …"), from the OS error beneath the
    requests/urllib3 wrappers; their own message only when there is none."""
    if isinstance(error, requests.Timeout):
        return f"no answer within {timeout:g} s"
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, socket.gaierror):
            return f"cannot resolve the host name: {current.strerror or current}"
        if isinstance(current, ssl.SSLError):
            return f"TLS failed: {current.reason or current}"
        if type(current).__module__ == "builtins" and isinstance(current, OSError) \
                and current.errno:
            return os.strerror(current.errno).lower()
        for linked in (current.__cause__, current.__context__, getattr(current, "reason", None),
                       *current.args[:1]):
            if isinstance(linked, BaseException):
                pending.append(linked)
    return str(error) or type(error).__name__


def fail_slow_summary(ratios: Sequence[Mapping[str, Any]], starts: Sequence[Mapping[str, Any]],
                      kinds: Sequence[Mapping[str, Any]]) -> list[dict[str, object]]:
    """``summary.fail_slow`` from range results of the ratio (by instance, rank, part,
    cause), the start (by instance, rank) and the ``fail_slow`` finding (by instance,
    rank, kind): one change per rank, part and the start at its points, its largest
    ratio, the span of its points (``seconds``), the latest named cause, at most
    ``MAX_RECORDED_FAIL_SLOW`` of the largest, by start."""
    start_at = {(s["metric"].get("instance", ""), s["metric"].get("rank", "")):
                dict(_points(s)) for s in starts}
    kind_at: dict[tuple[str, str], dict[float, str]] = {}
    for s in kinds:
        at = kind_at.setdefault((s["metric"].get("instance", ""), s["metric"].get("rank", "")),
                                {})
        for t, _ in _points(s):
            at[t] = s["metric"].get("kind", "")
    changes: dict[tuple[str, str, float], dict[str, Any]] = {}
    for s in ratios:
        labels = s["metric"]
        where = (labels.get("instance", ""), labels.get("rank", ""))
        part, cause = labels.get("part", ""), labels.get("cause", "")
        for t, ratio in _points(s):
            begun = start_at.get(where, {}).get(t)
            if begun is None:
                continue
            change = changes.setdefault((where[1], part, begun), {
                "rank": where[1], "part": part, "kind": "", "cause": cause, "ratio": ratio,
                "start": begun, "first": t, "last": t})
            change["ratio"] = max(change["ratio"], ratio)
            if t >= change["last"] and (cause != "unknown" or not change["cause"]):
                change["cause"] = cause
            change["first"], change["last"] = min(change["first"], t), max(change["last"], t)
            change["kind"] = kind_at.get(where, {}).get(t, change["kind"])
    found = [{**{key: value for key, value in change.items() if key not in ("first", "last")},
              "seconds": change["last"] - change["first"]} for change in changes.values()]
    largest = sorted(found, key=lambda change: change["ratio"], reverse=True)
    return sorted(largest[:MAX_RECORDED_FAIL_SLOW], key=lambda change: change["start"])


def _points(series: Mapping[str, Any]) -> list[tuple[float, float]]:
    return [(float(t), float(v)) for t, v in series.get("values", [])]


def _increase(points: Sequence[tuple[float, float]]) -> float:
    """A counter's increase over ``points``, a decrease counting as a reset to 0."""
    total = 0.0
    for (_, before), (_, after) in itertools.pairwise(points):
        total += after - before if after >= before else after
    return total


def _increase_by(result: Sequence[Mapping[str, Any]], by: tuple[str, ...]
                 ) -> dict[tuple[str, ...], float]:
    """Increases summed over instances and ranks, keyed by the ``by`` labels."""
    totals: dict[tuple[str, ...], float] = {}
    for series in result:
        key = tuple(series["metric"].get(name, "") for name in by)
        totals[key] = totals.get(key, 0.0) + _increase(_points(series))
    return totals


def throughput_summary(samples: Sequence[Mapping[str, Any]], loop: Sequence[Mapping[str, Any]],
                       last_step: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """samples/s over the active time of each node, summed, and its median and p10 over
    buckets, steps-time weighted per rank (module docstring). ``samples``, ``loop`` and
    ``last_step``: range results of the ranks' samples, step seconds and last step end."""
    def rank_key(series: Mapping[str, Any]) -> tuple[str, str]:
        return series["metric"].get("instance", ""), series["metric"].get("rank", "")

    loop_by_rank = {rank_key(series): dict(_points(series)) for series in loop}
    step_end_by_rank = {rank_key(series): dict(_points(series)) for series in last_step}
    times = sorted({t for series in samples for t, _ in _points(series)})
    if not times:
        return {"samples_per_second": None, "samples_per_second_median": None,
                "samples_per_second_p10": None, "samples": 0.0, "duration_seconds": None}
    width = max(MIN_BUCKET_SECONDS, (times[-1] - times[0]) / BUCKETS_PER_RUN)
    # per bucket and rank: [Δsamples, Δloop seconds] of the intervals ending in it
    per_bucket: dict[int, dict[tuple[str, str], list[float]]] = {}
    # per node: its ranks' samples counted, the start of the first step counted, the end
    # of the last (the sender's clock)
    active: dict[str, _ActiveTime] = {}
    timed = True
    total_samples = 0.0
    last_active: float | None = None
    for series in samples:
        key = rank_key(series)
        loop_points = loop_by_rank.get(key, {})
        step_ends = step_end_by_rank.get(key, {})
        points = [(t, v, loop_points[t]) for t, v in _points(series) if t in loop_points]
        for (_, s0, l0), (t1, s1, l1) in itertools.pairwise(points):
            if s1 < s0 or l1 <= l0:
                continue  # idle (no step), or a reset that makes the interval unmeasurable
            total_samples += s1 - s0
            last_active = t1 if last_active is None else max(last_active, t1)
            step_end = step_ends.get(t1)
            if step_end is None:
                timed = False
            else:
                active.setdefault(key[0], _ActiveTime()).add(s1 - s0, step_end - (l1 - l0),
                                                            step_end)
            sums = per_bucket.setdefault(int((t1 - times[0]) // width), {}).setdefault(
                key, [0.0, 0.0])
            sums[0] += s1 - s0
            sums[1] += l1 - l0
    bucket_rates = sorted(sum(count / loop for count, loop in ranks.values() if loop > 0)
                          for ranks in per_bucket.values())
    rates = [node.samples / (node.end - node.start) for node in active.values()
             if node.end > node.start]
    return {
        "samples_per_second": sum(rates) if timed and rates else None,
        "samples_per_second_median": _quantile(bucket_rates, 0.5),
        "samples_per_second_p10": _quantile(bucket_rates, 0.1),
        "samples": total_samples,
        "duration_seconds": None if last_active is None else last_active - times[0],
    }


@dataclass
class _ActiveTime:
    """The samples a node's ranks did in the intervals counted, and the steps' span."""

    samples: float = 0.0
    start: float = math.inf
    end: float = -math.inf

    def add(self, samples: float, start: float, end: float) -> None:
        self.samples += samples
        self.start = min(self.start, start)
        self.end = max(self.end, end)


def _quantile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        return None
    position = (len(values) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)
