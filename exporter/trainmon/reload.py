"""Configuration reload of a running ``trainmon serve``: SIGHUP, ``POST /-/reload``
and the file watcher, as Prometheus does.

``Reloader`` is the one place a reload happens. Its triggers:

- ``SIGHUP``: the signal handler only calls ``request()``, which writes a byte
  to a pipe (safe in a signal handler); the ``config-reload`` thread wakes on it;
- ``reload.watch_interval_seconds``: the same thread reads the file that often
  (at most ``trainmon.config.MAX_CONFIG_BYTES``) and reloads when its content,
  not its inode, changed: a Kubernetes ConfigMap volume swaps a symlink;
- ``POST /-/reload`` (``trainmon.http.server``): ``answer_reload()`` reloads in
  the request's worker, allowed from a loopback peer, or with valid basic-auth
  credentials when the web config has users; 403 otherwise.

Reloads are serialized (one lock) and at least ``reload.min_interval_seconds``
apart: a request sooner gets 429 with ``Retry-After``, a signal or a file change
sooner waits for the interval.

A reload loads and validates the whole file with the loader the start used, so
its errors read the same. An invalid file changes nothing: one log line with
every error, ``trainmon_config_last_reload_successful`` 0. A valid one is
applied: the keys only a restart applies (``listen``, ``web_config_file``,
``http``, ``paths``, the web config's TLS, the sections of the collectors
``Assembly.pinned()`` names (the training store, but for its ``live_keys``: the
token file, read again at every reload, the store's caps, TTL and trusted writers;
the run ledger), and the
coming or going of those ``Assembly.followed()`` names: the GPU collector and
attribution the ledger books with) keep their running value, named in one log
line and counted in ``trainmon_config_keys_awaiting_restart``; the rest takes
effect at once:
``trainmon.assembly`` keeps every collector whose section and inputs did not
change, the registry swaps the set (``CollectorRegistry.replace``), the server
its routes and its basic-auth users and headers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from trainmon.assembly import Assembly, assemble
from trainmon.config import Config, read_config_bytes
from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry
from trainmon.core.families import CounterMetricFamily, GaugeMetricFamily, Metric
from trainmon.core.registry import CollectorRegistry
from trainmon.core.routes import JSONResponse
from trainmon.http.server import ExporterHTTPServer
from trainmon.http.webconfig import WebConfig
from trainmon.section import ConfigError

log = logging.getLogger(__name__)

#: The top-level keys only a restart applies: the socket, its server, the roots.
RESTART_ONLY = ("listen", "web_config_file", "http", "paths")
RESULTS = ("success", "failure")
#: Why a ``POST /-/reload`` was refused (``trainmon_config_reload_requests_refused_total``).
REFUSALS = ("forbidden", "too_soon")

Loader = Callable[[], tuple[Config, WebConfig | None]]
Chooser = Callable[[Config], Sequence[CollectorEntry[Any]]]


@dataclass(frozen=True)
class Outcome:
    """What one reload did."""

    trigger: str
    #: None: applied; else the errors, one line each, and nothing changed.
    error: str | None = None
    #: The keys whose new value waits for a restart.
    restart_required: tuple[str, ...] = ()

    @property
    def successful(self) -> bool:
        return self.error is None


class Reloader:
    """Reloads the daemon's configuration; the object ``POST /-/reload`` asks."""

    def __init__(
        self,
        load: Loader,
        choose: Chooser,
        *,
        config: Config,
        web: WebConfig | None,
        assembly: Assembly,
        fixed: Sequence[Collector],
        registry: CollectorRegistry,
        demo: bool,
        config_path: Path | None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``load``: the configuration and web config as at start; ``choose``: the
        entries a configuration enables; ``fixed``: collectors before the assembly's
        in the registry (the daemon's own process), kept as they are."""
        self._load = load
        self._choose = choose
        self._config = config
        self._web = web
        self._assembly = assembly
        self._fixed = list(fixed)
        self._registry = registry
        self._server: ExporterHTTPServer | None = None
        self._demo = demo
        self._path = config_path
        self._clock = clock
        #: Held through a reload: one at a time.
        self._lock = threading.Lock()
        self._counts_lock = threading.Lock()
        self._stopping = threading.Event()
        self._last_reload: float | None = None
        #: The file's content hash when the watcher, or the latest reload, read it.
        self._digest_seen = self._digest()
        self._successful = True
        self._success_timestamp = wall_clock()
        self._wall_clock = wall_clock
        self._reloads = dict.fromkeys(RESULTS, 0)
        self._refused = dict.fromkeys(REFUSALS, 0)
        self._awaiting_restart: tuple[str, ...] = ()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._thread = threading.Thread(target=self._run, name="config-reload", daemon=True)

    def serve(self, server: ExporterHTTPServer) -> None:
        """Start the reload thread; ``server`` gets the new routes and access rules."""
        self._server = server
        self._thread.start()

    def stop(self) -> None:
        """End the thread, wait for a reload in progress; later requests are refused."""
        self._stopping.set()
        self._wake()
        with self._lock:  # a reload in progress ends first
            pass
        if self._thread.ident is not None:
            self._thread.join(5.0)
        # the pipe stays open: a signal handler may still write to it, never to a
        # descriptor the process reuses (it is closed with the process)

    # -- triggers ---------------------------------------------------------------

    def request(self) -> None:
        """Ask the reload thread for a reload; safe in a signal handler."""
        if not self._stopping.is_set():
            self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: a full pipe holds a request
            os.write(self._wake_write, b"\0")

    def answer_reload(self, *, loopback: bool, authenticated: bool) -> JSONResponse:
        """``POST /-/reload``: reload now, from a loopback peer or an authenticated one."""
        if not (loopback or authenticated):
            self._count_refusal("forbidden")
            return JSONResponse(HTTPStatus.FORBIDDEN, {
                "error": "reload is allowed from loopback, or with basic-auth credentials "
                         "when the web config has users"})
        if not self._lock.acquire(blocking=False):
            return self._too_soon(self._config.reload.min_interval_seconds)
        try:
            wait = self._wait_left()
            if wait > 0 or self._stopping.is_set():
                return self._too_soon(wait)
            outcome = self._reload("http")
        except Exception:  # the server answers 500 whatever went wrong
            log.exception("reload (http) failed")
            return JSONResponse(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error"})
        finally:
            self._lock.release()
        body: dict[str, object] = {"status": "success" if outcome.successful else "failure",
                                   "restart_required": list(outcome.restart_required)}
        if not outcome.successful:
            body["error"] = outcome.error
        return JSONResponse(
            HTTPStatus.OK if outcome.successful else HTTPStatus.INTERNAL_SERVER_ERROR, body)

    def _too_soon(self, wait: float) -> JSONResponse:
        self._count_refusal("too_soon")
        return JSONResponse(
            HTTPStatus.TOO_MANY_REQUESTS,
            {"error": "a reload is running or ran within reload.min_interval_seconds"},
            {"Retry-After": str(max(1, round(wait + 0.5)))})

    def _count_refusal(self, reason: str) -> None:
        with self._counts_lock:
            self._refused[reason] += 1

    def _wait_left(self) -> float:
        """Seconds until another reload may run (callers hold the lock)."""
        if self._last_reload is None:
            return 0.0
        return self._last_reload + self._config.reload.min_interval_seconds - self._clock()

    # -- the thread -------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            interval = self._config.reload.watch_interval_seconds
            readable, _, _ = select.select([self._wake_read], [], [], interval or None)
            if self._stopping.is_set():
                return
            if readable:
                os.read(self._wake_read, 4096)  # requests while one waits are one reload
                trigger = "signal"
            elif self._path is not None and self._digest() != self._digest_seen:
                trigger = "file"
            else:
                continue
            try:
                self._reload_when_allowed(trigger, self._clock())
            except Exception:  # the thread must outlive any one bad reload
                log.exception("reload (%s) failed", trigger)

    def _reload_when_allowed(self, trigger: str, requested: float) -> None:
        """Reload once ``reload.min_interval_seconds`` passed since the last one,
        unless a reload that began after ``requested`` served the request already."""
        while not self._stopping.is_set():
            with self._lock:
                if self._last_reload is not None and self._last_reload >= requested:
                    return
                wait = self._wait_left()
                if wait <= 0:
                    self._reload(trigger)
                    return
            self._stopping.wait(wait)

    def _digest(self) -> bytes | None:
        """The configuration file's content hash; None when it cannot be read."""
        if self._path is None:
            return None
        try:
            import hashlib  # here: with a configuration file only (libcrypto)

            return hashlib.sha256(read_config_bytes(self._path)).digest()
        except ConfigError:
            return None

    # -- one reload -------------------------------------------------------------

    def _reload(self, trigger: str) -> Outcome:
        """Load, validate, then apply (callers hold the lock)."""
        self._last_reload = self._clock()
        self._digest_seen = self._digest()
        try:
            config, web = self._load()
            config, web, restart = _settle(
                self._config, config, self._web, web, self._assembly,
                lambda chosen: {entry.name for entry in self._choose(chosen)})
            assembly = assemble(self._choose(config), config, demo=self._demo,
                                previous=self._assembly)
        except ConfigError as error:
            return self._failed(trigger, "; ".join(
                str(each).replace("\n", " ") for each in error.errors))
        except Exception as error:  # a factory that raises: the running set stays
            log.debug("building the reloaded collectors failed", exc_info=True)
            return self._failed(trigger, f"building the collectors failed: "
                                         f"{type(error).__name__}: {error}")
        self._apply(trigger, config, web, assembly)
        if restart:
            log.warning("reload (%s): %s changed; the running value is kept until the next "
                        "restart", trigger, ", ".join(restart))
        self._awaiting_restart = restart
        with self._counts_lock:
            self._successful = True
            self._success_timestamp = self._wall_clock()
            self._reloads["success"] += 1
        return Outcome(trigger, restart_required=restart)

    def _failed(self, trigger: str, error: str) -> Outcome:
        log.error("reload (%s) failed, the running configuration is kept: %s", trigger, error)
        with self._counts_lock:
            self._successful = False
            self._reloads["failure"] += 1
        return Outcome(trigger, error=error)

    def _apply(self, trigger: str, config: Config, web: WebConfig | None,
               assembly: Assembly) -> None:
        old, new = self._assembly.collectors, assembly.collectors
        built = [c.name for c in new if all(c is not each for each in old)]
        dropped = [c.name for c in old if all(c is not each for each in new)]
        rebuilt = [name for name in built if name in dropped]

        def follow() -> None:
            for change in assembly.followups:
                change()

        self._registry.replace([*self._fixed, *assembly.collectors], follow)
        if self._server is not None:
            self._server.replace_routes(self._registry.push_routes(),
                                        self._registry.get_routes())
            self._server.replace_access(web)
        self._config, self._web, self._assembly = config, web, assembly
        log.info("reload (%s): configuration applied; collectors started: %s; rebuilt: %s; "
                 "stopped: %s; kept: %d", trigger,
                 ", ".join(name for name in built if name not in rebuilt) or "none",
                 ", ".join(rebuilt) or "none",
                 ", ".join(name for name in dropped if name not in rebuilt) or "none",
                 len(new) - len(built))

    # -- metrics ----------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        """The reload's self-metrics (docs/metrics.md, Self)."""
        successful = GaugeMetricFamily(
            "trainmon_config_last_reload_successful",
            "1 if the last configuration reload (or the start) succeeded, 0 if it failed "
            "and the daemon runs the configuration it had.")
        successful.add_metric([], 1.0 if self._successful else 0.0)
        timestamp = GaugeMetricFamily(
            "trainmon_config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful configuration reload (or of the start).")
        timestamp.add_metric([], self._success_timestamp)
        reloads = CounterMetricFamily(
            "trainmon_config_reloads",
            "Configuration reloads (SIGHUP, POST /-/reload, a changed file), by result.",
            labels=["result"])
        for result in RESULTS:
            reloads.add_metric([result], float(self._reloads[result]))
        refused = CounterMetricFamily(
            "trainmon_config_reload_requests_refused",
            "POST /-/reload requests refused: forbidden (neither loopback nor "
            "authenticated, 403), too_soon (a reload running, or the last one within "
            "reload.min_interval_seconds, 429).",
            labels=["reason"])
        for reason in REFUSALS:
            refused.add_metric([reason], float(self._refused[reason]))
        awaiting = GaugeMetricFamily(
            "trainmon_config_keys_awaiting_restart",
            "Keys of the last applied configuration whose new value only a restart "
            "applies (listen, http, paths, the training and ledger sections...); the "
            "daemon runs their old value.")
        awaiting.add_metric([], float(len(self._awaiting_restart)))
        return [successful, timestamp, reloads, refused, awaiting]


def _settle(
    running: Config, loaded: Config, running_web: WebConfig | None, loaded_web: WebConfig | None,
    running_assembly: Assembly, present: Callable[[Config], set[str]],
) -> tuple[Config, WebConfig | None, tuple[str, ...]]:
    """``loaded`` with every key that only a restart applies set back to its running
    value, and those keys that changed (``collectors.training.window_seconds``): the
    top-level ones, the sections of the pinned collectors, and those of the followed
    ones that would come or go (``present``: the names a configuration builds)."""
    changed: list[str] = []
    kept: dict[str, Any] = {}
    for key in RESTART_ONLY:
        before, after = getattr(running, key), getattr(loaded, key)
        if before != after:
            changed.extend(_changed_keys(key, before, after))
            kept[key] = before
    sections: dict[str, object] = {}

    def keep(name: str, live: Sequence[str] = ()) -> None:
        """The running section of ``name``, but for its ``live`` keys."""
        before: Any = running.collectors[name]
        after = loaded.collectors[name]
        if live:
            before = dataclasses.replace(
                before, **{key: getattr(after, key) for key in live})
        if before != after:
            changed.extend(_changed_keys(f"collectors.{name}", before, after))
        sections[name] = before

    live_keys = {part.entry.name: part.entry.live_keys for part in running_assembly.parts}
    for name in sorted(running_assembly.pinned()):
        keep(name, live_keys[name])
    followed = running_assembly.followed()
    was = {part.entry.name for part in running_assembly.parts}
    while True:  # keeping one may bring back another (attribution requires gpu)
        settled = dataclasses.replace(loaded, **kept,
                                      collectors=loaded.collectors.replace(**sections))
        now = present(settled)
        moved = sorted(name for name in followed - set(sections)
                       if (name in now) != (name in was))
        if not moved:
            break
        for name in moved:
            keep(name)
    if "web_config_file" in kept:  # a web config from another file: all of it waits
        return settled, running_web, tuple(changed)
    web = loaded_web
    running_tls = running_web.tls if running_web else None
    if (loaded_web.tls if loaded_web else None) != running_tls:
        changed.append("web_config_file: tls_server_config")
        web = dataclasses.replace(loaded_web or WebConfig(), tls=running_tls)
    return settled, web, tuple(changed)


def _changed_keys(key: str, before: object, after: object) -> list[str]:
    """The fields of a section that differ (the section itself if it is not one)."""
    if not (dataclasses.is_dataclass(before) and type(before) is type(after)):
        return [key]
    return [f"{key}.{field.name}" for field in dataclasses.fields(before)
            if getattr(before, field.name) != getattr(after, field.name)]
