"""``make stack``: the whole bundle on loopback, without containers.

Starts ``trainmon serve --demo`` (a simulated 8-GPU node with two training
jobs), the distribution's Prometheus with the shipped configuration and the
variant's rules, and the distribution's Alertmanager with the shipped routing;
prints the URLs; stops everything on Ctrl-C (SIGINT) or SIGTERM.

Prometheus runs ``deploy/prometheus/prometheus-<variant>.yml`` unchanged from
a working folder laid out like /etc/prometheus: ``rules/`` holds the rule files
of ``alerts/<variant>/`` and ``targets/`` the loopback addresses. Alertmanager
runs ``deploy/alertmanager/alertmanager.yml`` with every receiver pointed at a
local sink that prints each notification (``alerts/retarget_receivers.py``);
``--send-notifications`` keeps the configured receivers instead.

Exit codes: 0 stopped on request, 1 a component failed, 2 cannot start
(missing program, port taken, bad arguments).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import yaml

from deploy.bundle import (
    ALERTMANAGER_CONFIG,
    PROMETHEUS_DIR,
    REPO_ROOT,
    VARIANTS,
    BundleError,
    prometheus_config,
    rule_files,
)
from deploy.notifications import NotificationSink

log = logging.getLogger("deploy.stack")

EXIT_STOPPED = 0
EXIT_FAILED = 1
EXIT_CANNOT_START = 2
READY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 15.0
#: The node label the demo target gets (the relabelling would otherwise use the host).
DEMO_NODE = "demo-node"
_PR_SET_PDEATHSIG = 1


@dataclass
class Component:
    """One program of the stack, its readiness URL and its log file."""

    name: str
    command: list[str]
    ready_url: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("wb") as log_file:
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                # Its own session: Ctrl-C reaches only the stack, which stops the
                # components in order; the parent-death signal covers a killed stack.
                start_new_session=True,
                preexec_fn=_terminate_with_parent,
            )

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.ready_url, timeout=2) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in %.0f s; killing it", self.name, STOP_TIMEOUT_SECONDS)
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])


def _terminate_with_parent() -> None:
    """In the child before exec: get SIGTERM when the stack process dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def find_program(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


def port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def address(host: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def url(host: str, port: int, path: str = "/") -> str:
    return f"http://{address(host, port)}{path}"


def prepare_prometheus(workdir: Path, variant: str, targets: dict[str, list[str]]) -> Path:
    """``workdir/prometheus``: the shipped config, the variant's rules and loopback targets."""
    folder = workdir / "prometheus"
    (folder / "rules").mkdir(parents=True)
    (folder / "targets").mkdir()
    shutil.copy(prometheus_config(variant), folder / "prometheus.yml")
    for path in rule_files(variant):
        shutil.copy(path, folder / "rules" / path.name)
    for shipped in sorted((PROMETHEUS_DIR / "targets").glob("*.yml")):
        addresses = targets.get(shipped.stem, [])
        groups: list[dict[str, object]] = []
        if addresses:
            group: dict[str, object] = {"targets": addresses}
            if shipped.stem == "trainmon":
                group["labels"] = {"node": DEMO_NODE}
            groups.append(group)
        (folder / "targets" / shipped.name).write_text(yaml.safe_dump(groups), encoding="utf-8")
    return folder / "prometheus.yml"


def prepare_alertmanager(workdir: Path, sink_url: str | None) -> Path:
    """The shipped config, or a copy whose receivers all lead to ``sink_url``."""
    if sink_url is None:
        return ALERTMANAGER_CONFIG
    output = workdir / "alertmanager.yml"
    completed = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "alerts" / "retarget_receivers.py"),
            str(ALERTMANAGER_CONFIG),
            sink_url,
            str(output),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise BundleError(f"cannot retarget the Alertmanager receivers: {completed.stderr}")
    return output


def build_components(
    args: argparse.Namespace, workdir: Path, prometheus: str, alertmanager: str, sink: str | None
) -> list[Component]:
    host = args.host
    trainmon_address = address(host, args.trainmon_port)
    alertmanager_address = address(host, args.alertmanager_port)
    prometheus_address = address(host, args.prometheus_port)
    prometheus_file = prepare_prometheus(
        workdir,
        args.variant,
        {"trainmon": [trainmon_address], "alertmanager": [alertmanager_address]},
    )
    alertmanager_file = prepare_alertmanager(workdir, sink)
    return [
        Component(
            "trainmon",
            [sys.executable, "-m", "trainmon", "serve", "--demo", "--listen", trainmon_address],
            url(host, args.trainmon_port, "/healthz"),
            workdir / "trainmon.log",
        ),
        Component(
            "alertmanager",
            [
                alertmanager,
                f"--config.file={alertmanager_file}",
                f"--storage.path={workdir / 'alertmanager-data'}",
                f"--web.listen-address={alertmanager_address}",
                "--cluster.listen-address=",  # no gossip port: a single instance
            ],
            url(host, args.alertmanager_port, "/-/ready"),
            workdir / "alertmanager.log",
        ),
        Component(
            "prometheus",
            [
                prometheus,
                f"--config.file={prometheus_file}",
                f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                f"--web.listen-address={prometheus_address}",
            ],
            url(host, args.prometheus_port, "/-/ready"),
            workdir / "prometheus.log",
        ),
    ]


def wait_until_ready(
    components: Sequence[Component], stopping: threading.Event
) -> Component | None:
    """Wait for every component; returns the one that failed, if any."""
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    pending = list(components)
    while pending and not stopping.is_set():
        for component in list(pending):
            if component.exited():
                return component
            if component.is_ready():
                pending.remove(component)
        if time.monotonic() > deadline:
            return pending[0]
        stopping.wait(0.2)
    return None


def run(args: argparse.Namespace) -> int:
    prometheus = find_program("prometheus")
    alertmanager = find_program("prometheus-alertmanager", "alertmanager")
    if prometheus is None or alertmanager is None:
        print(
            "make stack needs Prometheus and Alertmanager: "
            "apt-get install prometheus prometheus-alertmanager",
            file=sys.stderr,
        )
        return EXIT_CANNOT_START
    for option in ("trainmon_port", "prometheus_port", "alertmanager_port"):
        port = getattr(args, option)
        if not port_is_free(args.host, port):
            flag = "--" + option.replace("_", "-")
            print(f"port {port} on {args.host} is taken; use {flag}", file=sys.stderr)
            return EXIT_CANNOT_START

    stopping = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    if args.workdir:
        workdir = Path(args.workdir)
        if workdir.exists() and any(workdir.iterdir()):
            print(f"--workdir {workdir} is not empty", file=sys.stderr)
            return EXIT_CANNOT_START
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="trainmon-stack-"))
    sink = None if args.send_notifications else NotificationSink(_notify)
    components: list[Component] = []
    try:
        if sink is not None:
            sink.start()
        components = build_components(
            args, workdir, prometheus, alertmanager, sink.url if sink else None
        )
        for component in components:
            component.start()
        failed = wait_until_ready(components, stopping)
        if failed is not None:
            print(f"{failed.name} did not come up:\n{failed.log_tail()}", file=sys.stderr)
            return EXIT_FAILED
        if stopping.is_set():
            return EXIT_STOPPED
        print_banner(args, workdir, sink is not None)
        while not stopping.wait(0.5):
            for component in components:
                if component.exited():
                    print(f"{component.name} exited:\n{component.log_tail()}", file=sys.stderr)
                    return EXIT_FAILED
        print("stopping…", flush=True)
        return EXIT_STOPPED
    except BundleError as error:
        print(f"cannot start the stack: {error}", file=sys.stderr)
        return EXIT_CANNOT_START
    finally:
        for component in reversed(components):
            component.stop()
        if sink is not None:
            sink.stop()
        if not (args.workdir or args.keep_workdir):
            shutil.rmtree(workdir, ignore_errors=True)


def _notify(line: str) -> None:
    print(f"notification → {line}", flush=True)


def print_banner(args: argparse.Namespace, workdir: Path, local_sink: bool) -> None:
    host = args.host
    receivers = (
        "printed here (the shipped receivers, pointed at a local sink)"
        if local_sink
        else "sent to the receivers of deploy/alertmanager/alertmanager.yml"
    )
    print(
        f"trainmon stack is up ({args.variant} variant). Ctrl-C stops it.\n"
        f"  trainmon (demo)  {url(host, args.trainmon_port, '/metrics')}\n"
        f"  Prometheus       {url(host, args.prometheus_port, '/alerts')}\n"
        f"  Alertmanager     {url(host, args.alertmanager_port, '/')}\n"
        f"  notifications    {receivers}\n"
        f"  logs and data    {workdir}",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make stack ARGS=...",
        description="trainmon --demo, Prometheus and Alertmanager on loopback.",
    )
    parser.add_argument("--variant", choices=VARIANTS, default="dcgm")
    parser.add_argument("--host", default="127.0.0.1", help="address every component binds")
    parser.add_argument("--trainmon-port", type=int, default=19400)
    parser.add_argument("--prometheus-port", type=int, default=9090)
    parser.add_argument("--alertmanager-port", type=int, default=9093)
    parser.add_argument(
        "--workdir", help="empty folder for configs, data and logs, kept afterwards"
    )
    parser.add_argument(
        "--keep-workdir", action="store_true", help="keep the temporary folder after stopping"
    )
    parser.add_argument(
        "--send-notifications",
        action="store_true",
        help="use the configured receivers instead of printing notifications",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
