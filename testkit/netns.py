"""Network namespaces, veth pairs and ``tc`` shaping for tests that need a real link.

``NetworkLab`` creates what a test asks for and removes all of it on
``close()`` (it is a context manager), in reverse order, also after a failure
half-way: qdiscs, veth pairs, namespaces. Every name carries the test
process's id, so concurrent test runs never collide, and nothing is created
in the root namespace: a veth pair always joins two namespaces of the lab.

::

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with NetworkLab("ddp") as lab:
        a, b = lab.namespace("a"), lab.namespace("b")
        link = lab.veth(a, b, "10.203.0.1/24", "10.203.0.2/24")
        lab.shape(link.namespace_a, link.interface_a, rate="300mbit")
        subprocess.Popen(lab.exec_in(a, ["python", "-c", "..."]))

Processes started inside a namespace must be ended by the test before the
lab closes (a namespace's name is removed at once, the namespace itself only
when its last process exits).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

#: Seconds one ``ip``/``tc`` command may take.
COMMAND_TIMEOUT_SECONDS = 10.0
#: Linux limit on interface names (IFNAMSIZ - 1).
MAX_INTERFACE_NAME = 15


class NetworkLabError(RuntimeError):
    """An ``ip`` or ``tc`` command failed; the message holds its output."""


def run_command(argv: Sequence[str]) -> str:
    """Run one ``ip``/``tc`` command; its stdout, or ``NetworkLabError`` with stderr."""
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True,
                                timeout=COMMAND_TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NetworkLabError(f"{' '.join(argv)}: {error}") from error
    if result.returncode != 0:
        raise NetworkLabError(
            f"{' '.join(argv)} exited with {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def unavailable_reason() -> str | None:
    """Why namespaces cannot be created here (a skip reason), or None when they can.

    Probes by creating and deleting one namespace, since root in a container
    without ``CAP_SYS_ADMIN`` still cannot.
    """
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (iproute2) to build network namespaces"
    probe = f"tmprobe{os.getpid()}"
    try:
        run_command(["ip", "netns", "add", probe])
    except NetworkLabError as error:
        return f"cannot create a network namespace: {error}"
    try:
        run_command(["ip", "netns", "del", probe])
    except NetworkLabError as error:
        return f"cannot delete the probe network namespace {probe}: {error}"
    return None


@dataclass(frozen=True)
class VethLink:
    """A veth pair whose ends sit in two namespaces, with their IPv4 addresses."""

    namespace_a: str
    interface_a: str
    address_a: str  # without the prefix length
    namespace_b: str
    interface_b: str
    address_b: str


class NetworkLab:
    """Namespaces, veth pairs and qdiscs of one test, removed again by ``close()``."""

    def __init__(self, tag: str, run: Callable[[Sequence[str]], str] = run_command) -> None:
        # Short enough that tag + pid + a suffix still fit an interface name.
        self._prefix = f"tm{tag[:3]}{os.getpid() % 100_000}"
        self._run = run
        self._undo: list[list[str]] = []
        self._namespaces: list[str] = []
        self._veths = 0

    def namespace(self, suffix: str) -> str:
        """Create namespace ``<prefix>-<suffix>`` with its loopback up; its name."""
        name = f"{self._prefix}-{suffix}"
        self._run(["ip", "netns", "add", name])
        self._undo.append(["ip", "netns", "del", name])
        self._namespaces.append(name)
        self._run(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    def veth(self, namespace_a: str, namespace_b: str, cidr_a: str, cidr_b: str) -> VethLink:
        """A veth pair from ``namespace_a`` to ``namespace_b`` (namespaces of this lab),
        ends addressed ``cidr_a``/``cidr_b`` (``10.203.0.1/24``) and up."""
        for namespace in (namespace_a, namespace_b):
            if namespace not in self._namespaces:
                raise ValueError(f"{namespace} is not a namespace of this lab")
        self._veths += 1
        end_a = f"{self._prefix}v{self._veths}a"[-MAX_INTERFACE_NAME:]
        end_b = f"{self._prefix}v{self._veths}b"[-MAX_INTERFACE_NAME:]
        # Created inside namespace_a, so that nothing ever appears in the root namespace.
        self._run(["ip", "-n", namespace_a, "link", "add", end_a, "type", "veth",
                   "peer", "name", end_b, "netns", namespace_b])
        self._undo.append(["ip", "-n", namespace_a, "link", "del", end_a])
        for namespace, end, cidr in ((namespace_a, end_a, cidr_a), (namespace_b, end_b, cidr_b)):
            self._run(["ip", "-n", namespace, "addr", "add", cidr, "dev", end])
            self._run(["ip", "-n", namespace, "link", "set", end, "up"])
        return VethLink(namespace_a, end_a, cidr_a.split("/")[0],
                        namespace_b, end_b, cidr_b.split("/")[0])

    def shape(self, namespace: str, interface: str, rate: str = "300mbit",
              burst: str = "64kb", latency: str = "50ms") -> None:
        """Limit what ``interface`` sends with a token bucket (``tc … root tbf``)."""
        self._run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", interface,
                   "root", "tbf", "rate", rate, "burst", burst, "latency", latency])
        self._undo.append(["ip", "netns", "exec", namespace, "tc", "qdisc", "del",
                           "dev", interface, "root"])

    def qdiscs(self, namespace: str, interface: str) -> str:
        """``tc -s qdisc show dev interface`` inside ``namespace`` (statistics included)."""
        return self._run(["ip", "netns", "exec", namespace, "tc", "-s", "qdisc", "show",
                          "dev", interface])

    @staticmethod
    def exec_in(namespace: str, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` inside ``namespace`` (environment kept)."""
        return ["ip", "netns", "exec", namespace, *argv]

    def close(self) -> None:
        """Remove everything created, newest first; raise the first failure at the end."""
        failures: list[str] = []
        while self._undo:
            try:
                self._run(self._undo.pop())
            except NetworkLabError as error:
                failures.append(str(error))
        self._namespaces.clear()
        if failures:
            raise NetworkLabError("cleanup failed: " + "; ".join(failures))

    def __enter__(self) -> NetworkLab:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
