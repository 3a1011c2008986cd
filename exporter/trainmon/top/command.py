"""``trainmon top``: the source chosen, then the live view until ``q``.

The source, as for ``doctor``: ``--url`` (a daemon), else ``--prometheus`` with
``--node`` (its ``instance``) or ``--job`` (the node that runs it; the first of
several, which the header names), else the local daemon
(``trainmon.doctor.find_daemon``). Unlike ``doctor``, ``top`` never samples the
node itself: with no daemon answering it says so and keeps asking. Exit codes: 0
after ``q``, 2 for a usage error (no terminal, a job no node runs, a local
daemon whose port is chosen at start).
"""

from __future__ import annotations

import os
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.doctor import MeasurementError, find_daemon, metrics_url
from trainmon.local_daemon import DaemonTrust, LocalDaemon
from trainmon.report.model import Source
from trainmon.runs.profile import ProfileClient
from trainmon.terminal import clean
from trainmon.top.model import WINDOW_SECONDS, Recorder
from trainmon.top.profiles import ProfileFollower
from trainmon.top.render import ScreenState
from trainmon.top.screen import Poller, TerminalError, run_screen
from trainmon.top.source import DaemonSource, FederationSource, SnapshotSource, nodes_of_job

EXIT_OK = 0
EXIT_USAGE = 2


@dataclass(frozen=True)
class TopOptions:
    """The command line of ``trainmon top``."""

    url: str | None = None
    prometheus: str | None = None
    node: str | None = None
    job: str | None = None
    lang: str = "en"
    window_seconds: float = WINDOW_SECONDS
    local_daemon: LocalDaemon | None = None
    trust: DaemonTrust | None = None


def run_top(options: TopOptions, config: DiagnosisConfig, *, err: TextIO = sys.stderr,
            environ: Mapping[str, str] = os.environ) -> int:
    """Choose the source, then run the screen until ``q``; the exit code."""
    try:
        source = _source(options, err)
    except (MeasurementError, ValueError) as error:
        err.write(f"trainmon top: {clean(str(error))}\n")
        return EXIT_USAGE
    if source is None:
        return EXIT_USAGE
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        err.write("trainmon top: needs a terminal (for a one-shot report: trainmon doctor)\n")
        return EXIT_USAGE
    kind: Source = {"kind": "url", "url": source.name}
    poller = Poller(source, Recorder(config, kind, options.window_seconds))
    # p profiles the job shown, asked of the daemon read (not through Prometheus)
    profiles = ProfileFollower(ProfileClient(source.url)) \
        if isinstance(source, DaemonSource) else None
    poller.start()
    try:
        run_screen(poller, ScreenState(lang=options.lang, filter=options.job or ""),
                   colors=not environ.get("NO_COLOR"), profiles=profiles)
    except KeyboardInterrupt:
        pass  # Ctrl-C quits as q does
    except TerminalError as error:
        err.write(f"trainmon top: {clean(str(error))}\n")
        return EXIT_USAGE
    finally:
        poller.stop()
        if profiles is not None:
            profiles.stop()
    return EXIT_OK


def _source(options: TopOptions, err: TextIO) -> SnapshotSource | None:
    trust = options.trust or DaemonTrust.default()
    if options.url:
        return _checked(DaemonSource(options.url, trust))
    if options.prometheus:
        node = options.node
        if node is None:
            if not options.job:
                err.write("trainmon top: --prometheus needs --node or --job\n")
                return None
            nodes = nodes_of_job(options.prometheus, options.job)
            if not nodes:
                err.write(f"trainmon top: no node of {options.prometheus} runs job "
                          f"{clean(options.job)!r} now\n")
                return None
            node = nodes[0]
            if len(nodes) > 1:
                err.write(f"trainmon top: job {clean(options.job)!r} runs on {len(nodes)} "
                          f"nodes; showing {clean(node)} (--node for another: "
                          f"{', '.join(map(clean, nodes[1:]))})\n")
        return FederationSource(options.prometheus, node)
    local = options.local_daemon
    assert local is not None, "the CLI gives the local daemon when no source is named"
    url, found = find_daemon(local)
    if local.url is None:
        err.write(f"trainmon top: {found}; give --url\n")
        return None
    if url is None:
        err.write(f"trainmon top: no daemon answered at {metrics_url(local.url)} "
                  f"({local.origin}); waiting for it\n")
    return DaemonSource(local.url, trust)


def _checked(source: DaemonSource) -> DaemonSource:
    """``source`` once its URL parses (host and port); ``ValueError`` says why not."""
    parts = urllib.parse.urlsplit(source.name)
    if not parts.hostname or (parts.port is None and parts.scheme not in ("http", "https")):
        raise ValueError(f"--url {source.url!r}: not host:port or a URL")
    return source
