"""``trainmon runs`` and ``trainmon compare`` over a source (the local ledger, the
local daemon or Prometheus), printing text or ``--json``; the CLI builds the
source (``trainmon.runs.daemon.default_source`` without a flag).

A run is named by its id or by a unique prefix of it (``trainmon compare 4cf45b15
2249a018`` for torchrun's 36-character ids: ``resolve_run``); a prefix that
begins several run ids is an error that lists them.

Exit codes: 0 done; 1 the source failed at run time (Prometheus or the daemon
unreachable or refusing); 2 usage: an unknown run or an ambiguous prefix, an
unusable ledger file (``LedgerError``,
its message printed as it is), a bad ``--since``, a daemon on this node whose
listener has no trusted owner (``trainmon.local_daemon.UntrustedDaemon``).

What is printed went through ``trainmon.terminal``: the text renderers clean
every line, ``--json`` escapes what a terminal would act on, and error
messages (which may quote a daemon's answer) are cleaned.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Protocol, TextIO

from trainmon.ledger import LedgerError
from trainmon.local_daemon import UntrustedDaemon
from trainmon.runs.compare import compare
from trainmon.runs.daemon import DaemonError
from trainmon.runs.local import UnknownRun
from trainmon.runs.prometheus import PrometheusError
from trainmon.runs.render import render_comparison, render_runs
from trainmon.runs.view import RunView
from trainmon.terminal import clean, escape_json

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
#: Run ids an ambiguous prefix error lists before "and N more".
MAX_LISTED_CANDIDATES = 10


class RunSource(Protocol):
    """``LocalSource``, ``DaemonSource`` or ``PrometheusSource``."""

    def runs(self, job: str | None = None, since: float | None = None) -> list[RunView]: ...
    def run(self, run: str, job: str | None = None) -> RunView: ...
    def close(self) -> None: ...


def _guarded(open_source: Callable[[], RunSource], work: Callable[[RunSource], str],
             err: TextIO) -> tuple[int, str]:
    try:
        source = open_source()
        try:
            return EXIT_OK, work(source)
        finally:
            source.close()
    except (LedgerError, UntrustedDaemon) as error:
        err.write(clean(f"trainmon: {error}\n"))
        return EXIT_USAGE, ""
    except UnknownRun as error:
        err.write(clean(f"trainmon: {error.args[0]}\n"))
        return EXIT_USAGE, ""
    except (PrometheusError, DaemonError) as error:
        err.write(clean(f"trainmon: {error}\n"))
        return EXIT_FAILURE, ""


def list_runs(open_source: Callable[[], RunSource], *, job: str | None, since: float | None,
              as_json: bool, out: TextIO, err: TextIO) -> int:
    """``trainmon runs``: newest first."""
    def work(source: RunSource) -> str:
        views = source.runs(job=job, since=since)
        if as_json:
            return escape_json(json.dumps({"runs": [view.to_json() for view in views]},
                                          indent=2, ensure_ascii=False)) + "\n"
        return render_runs(views)

    code, text = _guarded(open_source, work, err)
    out.write(text)
    return code


def compare_runs(open_source: Callable[[], RunSource], run_a: str, run_b: str, *,
                 job: str | None, as_json: bool, out: TextIO, err: TextIO) -> int:
    """``trainmon compare RUN_A RUN_B``: A is the reference."""
    def work(source: RunSource) -> str:
        comparison = compare(resolve_run(source, run_a, job), resolve_run(source, run_b, job))
        if as_json:
            return escape_json(json.dumps(comparison.to_json(), indent=2,
                                          ensure_ascii=False)) + "\n"
        return render_comparison(comparison)

    code, text = _guarded(open_source, work, err)
    out.write(text)
    return code


def resolve_run(source: RunSource, run: str, job: str | None) -> RunView:
    """The run whose id is ``run``, else the one run whose id begins with it (of ``job``
    when given); ``UnknownRun`` when none does, or, naming them, when several do."""
    try:
        return source.run(run, job=job)
    except UnknownRun as unknown:
        if not run:
            raise
        candidates = sorted({(view.run, view.job) for view in source.runs(job=job)
                             if view.run.startswith(run)})
        if not candidates:
            raise unknown from None
        ids = sorted({found for found, _ in candidates})
        if len(ids) > 1:
            listed = ", ".join(ids[:MAX_LISTED_CANDIDATES])
            more = len(ids) - MAX_LISTED_CANDIDATES
            raise UnknownRun(
                f"run {run!r} is ambiguous: it begins {len(ids)} run ids: {listed}"
                + (f" and {more} more" if more > 0 else "")
                + "; give more of the id") from None
        if len(candidates) > 1:
            jobs = ", ".join(sorted(name for _, name in candidates))
            raise UnknownRun(f"run {run!r} ({ids[0]}) belongs to several jobs ({jobs}): "
                             "give --job") from None
        return source.run(ids[0], job=job)
