"""Command line: argument parsing, wiring and exit codes.

This is the only module that assembles parts. Every ``serve`` option can also
come from a ``TRAINMON_*`` environment variable (the flag wins).

Exit codes: 0 success, 1 runtime failure (e.g. the port is taken),
2 invalid configuration or usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from trainmon import __version__
from trainmon.assembly import assemble
from trainmon.collectors import entries
from trainmon.config import Config, PathsConfig, load_config, parse_config
from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry
from trainmon.core.ownprocess import OwnProcessCollector
from trainmon.core.registry import CollectorRegistry
from trainmon.http.listen import ListenAddress, parse_listen_address
from trainmon.http.webconfig import WebConfig, load_web_config
from trainmon.ledger.config import LedgerConfig
from trainmon.section import ConfigError

if TYPE_CHECKING:  # imported where used: it needs requests, which serve does not
    from trainmon.local_daemon import DaemonTrust, LocalDaemon

log = logging.getLogger("trainmon")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
LOG_LEVELS = ("debug", "info", "warning", "error")


def enabled_collectors(config: Config, *, demo: bool) -> list[CollectorEntry[Any]]:
    """The entries of ``trainmon.collectors.MODULES`` that ``config`` turns on, in
    scrape order (the sources, then the derived ones); builds nothing."""
    chosen: list[CollectorEntry[Any]] = []
    for entry in sorted(entries(), key=lambda entry: entry.derived):
        if getattr(config.collectors[entry.name], "enabled", True) is False:
            continue
        if entry.real_only and demo:
            log.info("demo mode: the %s collector is off (its data would be real)", entry.name)
            continue
        if all(name in {e.name for e in chosen} for name in entry.requires):
            chosen.append(entry)
    return chosen


def build_collectors(config: Config, *, demo: bool) -> list[Collector]:
    """Instantiate the enabled collectors, each with its injected boundaries."""
    return assemble(enabled_collectors(config, demo=demo), config, demo=demo).collectors


def collectors_for(data: Mapping[str, object], *, demo: bool = False) -> list[Collector]:
    """The collectors that a configuration mapping (the YAML file's content) turns on,
    built: for tools that run collectors in process (the benchmarks)."""
    return build_collectors(parse_config(data), demo=demo)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    parser = _parser(environ)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_CONFIG
    level = getattr(args, "log_level", "info")
    if level not in LOG_LEVELS:  # a bad TRAINMON_LOG_LEVEL bypasses argparse's choices
        parser.error(f"--log-level: expected one of {', '.join(LOG_LEVELS)}, got {level!r}")
    _setup_logging(level)
    if args.command == "version":
        print(f"trainmon {__version__} (python {sys.version.split()[0]})")
        return EXIT_OK
    if args.command == "check-config":
        return _check_config(Path(args.file), environ)
    if args.command == "doctor":
        return _doctor(args, environ)
    if args.command in ("runs", "compare"):
        return _runs(args, environ)
    if args.command == "suspects":
        return _suspects(args)
    if args.command == "top":
        return _top(args, environ)
    if args.command == "profile":
        return _profile(args, environ)
    return _serve(args, environ)


def _parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    def env(name: str, default: str = "") -> str:
        return environ.get(f"TRAINMON_{name}", default)

    parser = argparse.ArgumentParser(
        prog="trainmon",
        description="GPU-training monitoring: a Prometheus exporter that names the bottleneck.",
    )
    parser.add_argument("--version", action="version", version=f"trainmon {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def env_option(
        command: argparse.ArgumentParser, flag: str, name: str, metavar: str, help_text: str
    ) -> None:
        """``flag`` defaulting to ``$TRAINMON_<name>``, which its help names."""
        command.add_argument(
            flag, default=env(name), metavar=metavar, help=f"{help_text} [TRAINMON_{name}]"
        )

    serve = commands.add_parser("serve", help="run the daemon (node collectors, puller, push)")
    env_option(serve, "--config", "CONFIG", "FILE",
               "YAML configuration file; built-in defaults without one")
    env_option(serve, "--listen", "LISTEN", "ADDR",
               "host:port to serve on, overrides the file's `listen`")
    env_option(serve, "--web-config-file", "WEB_CONFIG_FILE", "FILE",
               "exporter-toolkit web config (TLS, basic auth)")
    serve.add_argument(
        "--demo",
        action="store_true",
        default=env("DEMO", "").lower() in ("1", "true", "yes"),
        help="serve a simulated 8-GPU node with two training jobs [TRAINMON_DEMO]",
    )
    _add_log_level(serve, env("LOG_LEVEL", "info"))

    check = commands.add_parser("check-config", help="validate a configuration file (exit 0/2)")
    check.add_argument("file", metavar="FILE")
    _add_log_level(check, env("LOG_LEVEL", "info"))

    doctor = commands.add_parser(
        "doctor", help="one-shot bottleneck report: GPU, storage, network, verdict (exit 0/1/2)"
    )
    env_option(doctor, "--url", "DOCTOR_URL", "URL",
               "read a running daemon (host:port or URL); without it, the local daemon "
               "when one answers, else sample this node")
    doctor.add_argument("--seconds", type=float, default=10.0, help="how long to measure (10)")
    doctor.add_argument("--lang", choices=("en", "zh"), default="en", help="report language")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    env_option(doctor, "--config", "CONFIG", "FILE",
               "configuration (diagnosis thresholds, local collectors, the local "
               "daemon's listen address)")
    env_option(doctor, "--ledger", "LEDGER", "FILE",
               "run ledger for the previous-run line; default collectors.ledger.path")
    _add_trust_option(doctor, env("TRUST_DAEMON_OWNER"))
    _add_log_level(doctor, env("LOG_LEVEL", "warning"))

    for name, help_text in (
        ("runs", "the run ledger: runs newest first, throughput, cost (exit 0/1/2)"),
        ("compare", "what changed between two runs and how throughput moved (exit 0/1/2)"),
    ):
        history = commands.add_parser(name, help=help_text)
        if name == "compare":
            history.add_argument("run_a", metavar="RUN_A", help="the reference run")
            history.add_argument("run_b", metavar="RUN_B", help="the run compared with it")
        history.add_argument("--job", default=None, help="only this training job")
        if name == "runs":
            history.add_argument("--since", default=None, metavar="WHEN",
                                help="runs started since: 90m, 12h, 2d, 1w or ISO-8601 (UTC)")
        history.add_argument("--json", action="store_true", help="print JSON")
        env_option(history, "--ledger", "LEDGER", "FILE",
                   "ledger file; default the config's collectors.ledger.path, or the "
                   "local daemon's /api/v1/runs when this user cannot read that file")
        env_option(history, "--prometheus", "PROMETHEUS_URL", "URL",
                   "read the runs from a Prometheus server instead of the local ledger")
        env_option(history, "--config", "CONFIG", "FILE",
                   "configuration (the ledger path, the local daemon's listen address)")
        history.add_argument("--url", default=None, metavar="URL",
                             help="read the runs from the daemon at URL (its /api/v1/runs)")
        _add_trust_option(history, env("TRUST_DAEMON_OWNER"))
        _add_log_level(history, env("LOG_LEVEL", "warning"))

    suspects = commands.add_parser(
        "suspects", help="nodes that stand out from their peers, with the evidence and the "
                         "commands that exclude them; runs none of them (exit 0/1/2)")
    suspects.add_argument(
        "--prometheus", default=env("PROMETHEUS_URL"), metavar="URL",
        required=not env("PROMETHEUS_URL"),
        help="the Prometheus (or VictoriaMetrics) server that evaluates trainmon's rules "
             "[TRAINMON_PROMETHEUS_URL]")
    suspects.add_argument("--json", action="store_true", help="print JSON")
    _add_log_level(suspects, env("LOG_LEVEL", "warning"))

    top = commands.add_parser(
        "top", help="live view of a node: jobs, ranks, verdicts, hung and slow ranks (q quits)")
    env_option(top, "--url", "DOCTOR_URL", "URL",
               "read a running daemon (host:port or URL); without it, the local daemon")
    top.add_argument("--prometheus", default=None, metavar="URL",
                     help="read one node's series from a Prometheus server (with --node or "
                          "--job)")
    top.add_argument("--node", default=None, metavar="INSTANCE",
                     help="with --prometheus: the node's instance label")
    top.add_argument("--job", default=None,
                     help="show this training job (with --prometheus: the node that runs it)")
    top.add_argument("--lang", choices=("en", "zh"), default="en", help="language (l toggles)")
    env_option(top, "--config", "CONFIG", "FILE",
               "configuration (diagnosis thresholds, the local daemon's listen address)")
    _add_trust_option(top, env("TRUST_DAEMON_OWNER"))
    _add_log_level(top, env("LOG_LEVEL", "error"))

    profile = commands.add_parser(
        "profile", help="run torch.profiler on ranks of a running job, keep the trace "
                        "beside the ledger, print the top operators (exit 0/1/2)")
    profile.add_argument("job", metavar="JOB", help="the training job (TRAINMON_JOB)")
    chosen = profile.add_mutually_exclusive_group()
    chosen.add_argument("--rank", type=int, action="append", default=None, metavar="N",
                        help="profile rank N (repeatable); default the job's lowest rank "
                             "on this node")
    chosen.add_argument("--all", action="store_true",
                        help="profile every rank of the job on this node")
    profile.add_argument("--steps", type=int, default=None, metavar="K",
                         help="steps to profile (default collectors.profiling.default_steps)")
    profile.add_argument("--wait", type=float, default=300.0, metavar="SECONDS",
                         help="how long to wait for the ranks (300)")
    profile.add_argument("--json", action="store_true", help="print the result as JSON")
    env_option(profile, "--url", "DOCTOR_URL", "URL",
               "the daemon (host:port or URL); without it, the local daemon")
    env_option(profile, "--config", "CONFIG", "FILE",
               "configuration (the local daemon's listen address)")
    _add_trust_option(profile, env("TRUST_DAEMON_OWNER"))
    _add_log_level(profile, env("LOG_LEVEL", "warning"))

    commands.add_parser("version", help="print the version")
    return parser


def _add_trust_option(parser: argparse.ArgumentParser, default: str) -> None:
    """``--trust-daemon-owner``, repeatable; the environment's comma-separated list first."""
    parser.add_argument(
        "--trust-daemon-owner", dest="trust_daemon_owner", action="append",
        default=[name for name in default.split(",") if name.strip()], metavar="USER",
        help="also read a daemon on this node whose port this user (name or uid; 'any': "
             "anyone) listens on; root, the service user and you are trusted already "
             "[TRAINMON_TRUST_DAEMON_OWNER]")


def _trust(args: argparse.Namespace, command: str) -> DaemonTrust | None:
    """The owners of a local daemon the command reads; None (after the message) when
    a name is unknown."""
    from trainmon.local_daemon import DaemonTrust

    try:
        return DaemonTrust.default(args.trust_daemon_owner)
    except ValueError as error:
        print(f"trainmon {command}: {error}", file=sys.stderr)
        return None


def _reading(args: argparse.Namespace, environ: Mapping[str, str], command: str, *,
             remote: bool) -> tuple[Config, DaemonTrust, LocalDaemon | None] | None:
    """What ``doctor`` and ``top`` read by: the configuration (``--config``), the owners of
    a local daemon they trust, and that daemon unless ``remote``; None after the message
    when the configuration or a trusted name is wrong."""
    from trainmon.local_daemon import LocalDaemon

    config_path = Path(args.config) if args.config else None
    try:
        config = load_config(config_path, environ)
    except ConfigError as error:
        _print_config_error("trainmon: invalid configuration: ", error)
        return None
    trust = _trust(args, command)
    if trust is None:
        return None
    local = None if remote else LocalDaemon.of(
        config.listen, config.collectors.training.socket, config_path, environ)
    return config, trust, local


def _add_log_level(parser: argparse.ArgumentParser, default: str | None) -> None:
    parser.add_argument(
        "--log-level",
        default=(default or "info").lower(),
        choices=LOG_LEVELS,
        help="log verbosity [TRAINMON_LOG_LEVEL]",
    )


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _load(
    config_path: str | None,
    web_config_path: str | None,
    listen: str | None,
    environ: Mapping[str, str],
) -> tuple[Config, WebConfig | None]:
    config = load_config(Path(config_path) if config_path else None, environ)
    if listen:
        try:
            config = dataclasses.replace(config, listen=parse_listen_address(listen))
        except ValueError as error:
            raise ConfigError("--listen", str(error)) from None
    web_path = Path(web_config_path) if web_config_path else config.web_config_file
    web = load_web_config(web_path) if web_path else None
    return config, web


def _print_config_error(prefix: str, error: ConfigError) -> None:
    """One line per error of the file, each after ``prefix``."""
    for each in error.errors:
        print(f"{prefix}{each}", file=sys.stderr)


def _check_config(path: Path, environ: Mapping[str, str]) -> int:
    try:
        config, _ = _load(str(path), None, None, environ)
    except ConfigError as error:
        _print_config_error(f"{path}: ", error)
        return EXIT_CONFIG
    enabled = [entry.name for entry in enabled_collectors(config, demo=False)]
    print(f"{path}: OK (collectors: {', '.join(enabled) or 'none'}; listen {config.listen})")
    return EXIT_OK


def _doctor(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from trainmon.doctor import DoctorOptions, run_doctor

    if not 1 <= args.seconds <= 3600:
        print("trainmon doctor: --seconds must be between 1 and 3600", file=sys.stderr)
        return EXIT_CONFIG
    reading = _reading(args, environ, "doctor", remote=bool(args.url))
    if reading is None:
        return EXIT_CONFIG
    config, trust, local = reading
    from trainmon.demo.history import demo_ledger_path

    # the demo keeps its runs in a ledger of its own, unless one is named
    named = bool(args.ledger) or config.collectors.ledger.path is not None
    options = DoctorOptions(
        url=args.url or None, seconds=args.seconds, lang=args.lang, json=args.json,
        ledger=Path(args.ledger) if args.ledger else config.collectors.ledger.file,
        demo_ledger=None if named else demo_ledger_path(config.collectors.ledger.file),
        local_daemon=local, trust=trust,
    )
    # Sampling this node for a few seconds must not write the daemon's run ledger,
    # nor try to bind the step socket a running daemon holds.
    training = config.collectors.training
    if local is not None and local.socket is not None and local.socket == training.socket:
        training = dataclasses.replace(training, socket=None)
    sampling = dataclasses.replace(config, collectors=config.collectors.replace(
        training=training,
        ledger=dataclasses.replace(config.collectors.ledger, enabled=False)))
    return run_doctor(
        options,
        config.collectors.diagnosis,
        lambda: build_collectors(sampling, demo=False),
        sys.stdout,
        err=sys.stderr,
    )


def _runs(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``runs`` and ``compare``: ``--prometheus``, ``--ledger``, or by default the
    user's ledger file when readable, else the local daemon (``trainmon.runs.daemon``)."""
    import time

    from trainmon.local_daemon import LocalDaemon
    from trainmon.runs.commands import RunSource, compare_runs, list_runs
    from trainmon.runs.daemon import default_source, open_daemon
    from trainmon.runs.local import LocalSource
    from trainmon.runs.timespec import parse_since

    trust = _trust(args, args.command)
    if trust is None:
        return EXIT_CONFIG

    def open_source() -> RunSource:
        if args.prometheus:
            from trainmon.runs.prometheus import PrometheusSource

            return PrometheusSource(args.prometheus)
        if args.ledger:
            return LocalSource(Path(args.ledger))
        if args.url:
            return open_daemon(args.url, sys.stderr, trust)
        assert ledger_path is not None and local is not None
        return default_source(ledger_path, local.url, sys.stderr, trust)

    ledger_path, local = None, None
    if not args.ledger and not args.prometheus and not args.url:
        config_path = Path(args.config) if args.config else None
        try:
            config = load_config(config_path, environ)
        except ConfigError as error:
            _print_config_error("trainmon: invalid configuration: ", error)
            return EXIT_CONFIG
        ledger_path = config.collectors.ledger.file
        local = LocalDaemon.of(
            config.listen, config.collectors.training.socket, config_path, environ)
    if args.command == "compare":
        return compare_runs(open_source, args.run_a, args.run_b, job=args.job,
                            as_json=args.json, out=sys.stdout, err=sys.stderr)
    try:
        since = None if args.since is None else parse_since(args.since, time.time())
    except ValueError as error:
        print(f"trainmon runs: {error}", file=sys.stderr)
        return EXIT_CONFIG
    return list_runs(open_source, job=args.job, since=since, as_json=args.json,
                     out=sys.stdout, err=sys.stderr)


def _suspects(args: argparse.Namespace) -> int:
    """``suspects``: the recorded suspect nodes of a Prometheus server (trainmon.runs.suspects)."""
    from trainmon.runs.prometheus import PrometheusSource
    from trainmon.runs.suspects import suspects_command

    return suspects_command(lambda: PrometheusSource(args.prometheus), as_json=args.json,
                            out=sys.stdout, err=sys.stderr)


def _top(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``top``: the live view (trainmon.top)."""
    from trainmon.top.command import TopOptions, run_top

    reading = _reading(args, environ, "top", remote=bool(args.url or args.prometheus))
    if reading is None:
        return EXIT_CONFIG
    config, trust, local = reading
    options = TopOptions(url=args.url or None, prometheus=args.prometheus, node=args.node,
                         job=args.job, lang=args.lang, local_daemon=local, trust=trust)
    return run_top(options, config.collectors.diagnosis, environ=environ)


def _profile(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``profile``: an on-demand profile of a running job (trainmon.runs.profile)."""
    from trainmon.local_daemon import TrustedDaemon, UntrustedDaemon
    from trainmon.runs.profile import profile_command

    reading = _reading(args, environ, "profile", remote=bool(args.url))
    if reading is None:
        return EXIT_CONFIG
    _, trust, local = reading
    url = args.url or (local.url if local is not None else None)
    if not url:
        print("trainmon profile: the local daemon's port is not known; give --url",
              file=sys.stderr)
        return EXIT_FAILURE
    if "://" not in url:
        url = f"http://{url}"
    if not args.url:
        try:
            TrustedDaemon.check(url, trust)
        except UntrustedDaemon as error:
            print(f"trainmon profile: {error}", file=sys.stderr)
            return EXIT_FAILURE
    return profile_command(url, args.job, ranks="all" if args.all else args.rank,
                           steps=args.steps, wait_seconds=args.wait, as_json=args.json,
                           out=sys.stdout, err=sys.stderr)


def _serve(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    try:
        config, web = _load(args.config, args.web_config_file, args.listen, environ)
    except ConfigError as error:
        _print_config_error("trainmon: invalid configuration: ", error)
        return EXIT_CONFIG
    demo_node = None
    if args.demo:
        from trainmon.demo.node import SimulatedNodeFiles

        demo_node = SimulatedNodeFiles()
        own_ledger = config.collectors.ledger.path is None
        config = _demo_config(config, demo_node.root)
        _seed_demo_history(config, demo_node.sys_root, make_folder=own_ledger)
        demo_node.start()

    def reload_config() -> tuple[Config, WebConfig | None]:
        """The configuration again, as loaded above (a reload, ``trainmon.reload``)."""
        loaded, loaded_web = _load(args.config, args.web_config_file, args.listen, environ)
        if demo_node is not None:
            loaded = _demo_config(loaded, demo_node.root)
        return loaded, loaded_web

    config_path = Path(args.config) if args.config else None
    try:
        return _run_server(config, web, demo=args.demo, reload_config=reload_config,
                           config_path=config_path)
    finally:
        if demo_node is not None:
            demo_node.stop()


def _demo_config(config: Config, root: Path) -> Config:
    """The configuration with every node source pointed into the simulated tree, and
    what the configuration leaves unset taken from the simulated node: its own run
    ledger beside the user's (kept after the demo stops, never the real one), its price
    per GPU hour and its placement labels."""
    from trainmon.demo.cvm import PLACEMENT_LABELS
    from trainmon.demo.history import PRICE_PER_GPU_HOUR, demo_ledger_path

    training = dataclasses.replace(config.collectors.training, socket=root / "steps.sock")
    ledger = config.collectors.ledger
    if ledger.path is None:
        ledger = dataclasses.replace(ledger, path=demo_ledger_path(ledger.file))
    if ledger.price_per_gpu_hour is None:
        ledger = dataclasses.replace(ledger, price_per_gpu_hour=PRICE_PER_GPU_HOUR)
    platform = config.collectors.platform
    if not platform.labels:
        platform = dataclasses.replace(platform, labels=dict(PLACEMENT_LABELS))
    return dataclasses.replace(
        config,
        paths=PathsConfig(proc=root / "proc", sys=root / "sys"),
        collectors=config.collectors.replace(training=training, ledger=ledger,
                                             platform=platform),
    )


def _seed_demo_history(config: Config, sys_root: Path, *, make_folder: bool) -> None:
    """The demo's earlier runs in its ledger (once), in a folder made first when the demo
    chose the file (``make_folder``); a ledger it cannot use is logged, and the ledger
    collector reports it as for any daemon."""
    import time

    from trainmon.demo.history import demo_ledger_path, seed_history
    from trainmon.ledger import LedgerError
    from trainmon.paths import make_state_directory

    ledger = config.collectors.ledger
    if ledger.enabled is False:
        return
    try:
        if make_folder:
            make_state_directory(ledger.file.parent)
        seeded = seed_history(ledger, sys_root=sys_root, now=time.time())
    except (LedgerError, OSError) as error:
        log.warning("demo: cannot seed the run history in %s: %s", ledger.file, error)
        return
    own = LedgerConfig().file
    log.info("demo: run ledger %s (%s)%s", ledger.file,
             f"the demo's own, apart from {own} of this user's daemon"
             if ledger.file == demo_ledger_path(own) else "collectors.ledger.path",
             "; earlier runs seeded: " + ", ".join(r.run for r in seeded) if seeded else "")


def _run_server(
    config: Config,
    web: WebConfig | None,
    *,
    demo: bool,
    reload_config: Callable[[], tuple[Config, WebConfig | None]],
    config_path: Path | None,
) -> int:
    from trainmon.http.server import ExporterHTTPServer
    from trainmon.reload import Reloader

    assembly = assemble(enabled_collectors(config, demo=demo), config, demo=demo)
    collectors = assembly.collectors
    # The daemon's own CPU, memory and file descriptors (process_*) first, among the
    # sources: the diagnosis and the collectors after it are evaluated on the
    # registry's clock (trainmon.core.registry), not on scrapes.
    own_process = OwnProcessCollector()
    registry = CollectorRegistry([own_process, *collectors], mode="demo" if demo else "real")
    reloader = Reloader(
        reload_config, lambda chosen: enabled_collectors(chosen, demo=demo), config=config,
        web=web, assembly=assembly, fixed=[own_process], registry=registry, demo=demo,
        config_path=config_path)
    try:
        server = ExporterHTTPServer(
            config.listen, registry, config.http, web, post_routes=registry.push_routes(),
            get_routes=registry.get_routes(), reloader=reloader,
        )
    except OSError as error:
        print(f"trainmon: cannot listen on {config.listen}: {error.strerror}", file=sys.stderr)
        return EXIT_FAILURE

    stopping = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        if not stopping.is_set():
            log.info("received %s, shutting down", signal.Signals(signum).name)
            stopping.set()
            threading.Thread(target=server.shutdown, name="shutdown", daemon=True).start()

    def request_reload(_signum: int, _frame: FrameType | None) -> None:
        reloader.request()  # a byte to the reload thread: nothing here can block

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    registry.start()
    reloader.serve(server)
    signal.signal(signal.SIGHUP, request_reload)
    scheme = "https" if web is not None and web.tls is not None else "http"
    log.info(
        "trainmon %s serving on %s://%s/metrics with collectors: %s%s",
        __version__,
        scheme,
        ListenAddress(config.listen.host, server.port),
        ", ".join(c.name for c in collectors) or "none",
        " (demo mode)" if demo else "",
    )
    stop_demo_jobs = _start_demo_jobs(collectors, server.port, config) if demo else None
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        if stop_demo_jobs is not None:
            stop_demo_jobs()
        reloader.stop()
        server.server_close()
        registry.stop()
    log.info("stopped")
    return EXIT_OK


def _start_demo_jobs(
    collectors: Sequence[Collector], port: int, config: Config
) -> Callable[[], None] | None:
    """The demo's two simulated jobs report through the real client to our receiver;
    the log says how to read their runs. Their last reports, sent when the stop
    function returns, reach the ledger's last flush through the receiver's last drain
    (``CollectorRegistry.stop``), so the runs are recorded finished."""
    import shlex
    import time

    from trainmon.collectors.ledger import LedgerCollector
    from trainmon.collectors.training import TrainingCollector
    from trainmon.demo.history import EARLIER_RUNS
    from trainmon.demo.jobs import (
        DEMO_JOBS,
        restart_run_id,
        run_id,
        start_demo_jobs,
        start_note,
    )

    training = next((c for c in collectors if isinstance(c, TrainingCollector)), None)
    if training is None:
        log.info("demo mode: the training collector is off, so no simulated jobs run")
        return None
    started = time.time()
    # the run that goes on: a job that crashes early goes on in its restart
    runs = {job.name: restart_run_id(job, started) or run_id(job, started)
            for job in DEMO_JOBS}
    stop_jobs = start_demo_jobs(training.socket_endpoint or f"http://127.0.0.1:{port}",
                                started=started)
    if any(isinstance(c, LedgerCollector) for c in collectors):
        ledger = shlex.quote(str(config.collectors.ledger.file))
        log.info("demo: %s", start_note(started))
        log.info("demo: its runs: trainmon runs --ledger %s", ledger)
        for earlier in EARLIER_RUNS:
            log.info("demo: what slowed %s down: trainmon compare %s %s --ledger %s "
                     "(its samples/s from %g s on)", earlier.job.name, earlier.run,
                     runs[earlier.job.name], ledger, _demo_run_delay(earlier.job.name, config))

    return stop_jobs


def _demo_run_delay(job: str, config: Config) -> float:
    """Seconds after the demo's start from which the run of ``job`` that goes on has
    samples/s in the ledger: its restart, if it crashes, and two ledger ticks."""
    from trainmon.demo.jobs import DEMO_JOBS

    simulated = next(each for each in DEMO_JOBS if each.name == job)
    restart = 0.0
    if simulated.crash_after_seconds is not None:
        restart = simulated.crash_after_seconds + simulated.restart_seconds
    flush_seconds: float = config.collectors.ledger.flush_seconds
    return restart + 2 * flush_seconds


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
