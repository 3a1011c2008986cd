"""NFS client statistics per mount from ``/proc/<pid>/mountstats``.

Tencent CFS, like most cloud file storage, is NFS v3 or v4 underneath, so the
kernel's NFS client counters are where a data loader's waits on shared
storage show up (the tuning article's §2.3 and §6.2): how many bytes crossed the
wire and how long each kind of request took.

Which file. ``<proc>/1/mountstats`` lists the mounts of pid 1's mount
namespace: on a bare-metal node and in a DaemonSet with ``hostPID`` (or the
host's ``/proc`` at ``/host/proc``) that is the host's, where kubelet and the
CSI drivers mount the pods' NFS/CFS volumes. It is mode 0400, so a daemon
that is not root gets ``EACCES`` and falls back to ``<proc>/self/mountstats``,
its own namespace (the host's for a systemd service: hardening options make a
private namespace, but mounts still propagate into it). Either is re-chosen
on every read.

Format (``fs/nfs/super.c`` ``nfs_show_stats`` and ``net/sunrpc/stats.c``
``rpc_clnt_show_stats``; stable since ``statvers=1.0``, 2.6.17; the lines
under ``device`` start with a tab)::

    device 10.0.0.8:/cfs mounted on /mnt/cfs with fstype nfs4 statvers=1.1
        opts:   rw,vers=4.1,rsize=1048576,...
        age:    3600
        events: <27 event counters>
        bytes:  normalread normalwrite directread directwrite
                serverread serverwrite readpages writepages      (one line)
        RPC iostats version: 1.1  p/v: 100003/4 (nfs)
        xprt:   tcp ...
        per-op statistics
                READ: ops trans timeouts bytes_sent bytes_recv queue rtt execute [errors]

(``queue``, ``rtt`` and ``execute`` in milliseconds.)

Every mount has a ``device ... mounted on ... with fstype ...`` line (``no
device ...`` where the kernel knows no device name), unindented; only
``nfs`` and ``nfs4`` ones carry statistics and only those are returned. Device
and mount point are escaped by the kernel (``seq_escape``: space ``\\040``, tab
``\\011``, newline ``\\012``, backslash ``\\134``) and unescaped as in
``mountinfo`` (``trainmon.node.mounts.unescape``). The per-op ``errors``
column (a ninth number) comes with newer kernels (5.x); it is optional, and
columns a later kernel may append are ignored.

A mount can disappear while the file is read, leaving a truncated entry: a
line that does not parse is skipped (its counters omitted), the rest of that
mount and every other mount are kept, and the problem is reported to the
caller, which logs it once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainmon.core.collector import CollectorUnavailable
from trainmon.core.files import decode_text, read_file
from trainmon.node.mounts import unescape

log = logging.getLogger(__name__)

NFS_FSTYPES = frozenset({"nfs", "nfs4"})

#: The ``bytes:`` counters in kernel order (``enum nfs_stat_bytecounters``).
BYTE_COUNTERS = (
    "normal_read", "normal_write", "direct_read", "direct_write",
    "server_read", "server_write", "read_pages", "write_pages",
)  # fmt: skip

_DEVICE = re.compile(
    r"(?:device (?P<device>\S+)|no device) mounted on (?P<mountpoint>\S+)"
    r" with fstype (?P<fstype>\S+)"
)
_SERVER = re.compile(r"(?P<server>\[[^\]]*\]|[^:]*):(?P<export>.*)")
_OPERATION = re.compile(r"(?P<name>[A-Z][A-Z0-9_]*):((?:\s+\d+){8,})")


@dataclass(frozen=True)
class NFSOperation:
    """Per-op RPC statistics of one NFS operation, cumulative since the mount."""

    #: Requests issued (``ops``).
    operations: int
    #: Transmissions, retransmissions included (``trans``).
    transmissions: int
    #: Major timeouts.
    timeouts: int
    bytes_sent: int
    bytes_received: int
    #: Time requests waited in the RPC client's queue before being sent, seconds.
    queue_seconds: float
    #: Time from sending to the server's reply, summed over requests, seconds.
    rtt_seconds: float
    #: Time from queueing to completion (queue + RTT + client work), seconds.
    execute_seconds: float
    #: Requests that completed with an error status (newer kernels; ``None`` before).
    errors: int | None


@dataclass(frozen=True)
class NFSMount:
    """One NFS mount of ``mountstats``; absent readings are ``None`` or left out."""

    device: str
    mountpoint: str
    fstype: str
    #: The server part of ``device`` (host name, IPv4, or ``[IPv6]``).
    server: str
    #: The exported path on the server.
    export: str
    #: NFS protocol version from ``opts: vers=`` (``3``, ``4.1``...), else
    #: ``4`` for ``nfs4`` and empty when unknown.
    version: str
    #: ``BYTE_COUNTERS`` name → bytes (``*_pages``: pages), cumulative; empty when
    #: the ``bytes:`` line is missing or malformed.
    bytes: Mapping[str, int] = field(default_factory=dict)
    #: Operation name (``READ``, ``GETATTR``...) → its statistics.
    operations: Mapping[str, NFSOperation] = field(default_factory=dict)


@dataclass(frozen=True)
class MountstatsReading:
    """What one read of a ``mountstats`` file gave."""

    path: Path
    mounts: tuple[NFSMount, ...]
    #: Lines that did not parse, as ``"<mount point>: <what>"`` (truncated entries).
    problems: tuple[str, ...] = ()


def parse_mountstats(text: str) -> tuple[list[NFSMount], list[str]]:
    """The NFS mounts of a ``mountstats`` text, and the lines that did not parse."""
    mounts: list[NFSMount] = []
    problems: list[str] = []
    current: _MountBuilder | None = None
    for line in text.splitlines():
        if line and not line[0].isspace():  # a new entry; its statistics lines are indented
            if current is not None:
                mounts.append(current.build())
            current = None
            match = _DEVICE.match(line)
            if match is None:
                problems.append(f"unparsable mount line {line[:120]!r}")
            elif match.group("fstype") in NFS_FSTYPES and match.group("device"):
                current = _MountBuilder(
                    unescape(match.group("device")),
                    unescape(match.group("mountpoint")),
                    match.group("fstype"),
                )
            continue
        if current is not None and line.strip():
            problem = current.add_line(line.strip())
            if problem is not None:
                problems.append(f"{current.mountpoint}: {problem}")
    if current is not None:
        mounts.append(current.build())
    return mounts, problems


class _MountBuilder:
    """Collects the lines of one NFS mount entry."""

    def __init__(self, device: str, mountpoint: str, fstype: str) -> None:
        self.device = device
        self.mountpoint = mountpoint
        self.fstype = fstype
        self.version = "4" if fstype == "nfs4" else ""
        self.bytes: dict[str, int] = {}
        self.operations: dict[str, NFSOperation] = {}
        self._in_operations = False

    def add_line(self, line: str) -> str | None:
        """Take one stripped line; a description of the problem if it does not parse."""
        if self._in_operations:
            match = _OPERATION.fullmatch(line)
            if match is None:
                return f"unparsable per-op line {line[:120]!r}"
            values = [int(value) for value in match.group(2).split()]
            self.operations[match.group("name")] = NFSOperation(
                operations=values[0],
                transmissions=values[1],
                timeouts=values[2],
                bytes_sent=values[3],
                bytes_received=values[4],
                queue_seconds=values[5] / 1000,
                rtt_seconds=values[6] / 1000,
                execute_seconds=values[7] / 1000,
                errors=values[8] if len(values) > 8 else None,
            )
            return None
        key, _, rest = line.partition(":")
        if line == "per-op statistics":
            self._in_operations = True
        elif key == "opts":
            for option in rest.strip().split(","):
                name, _, value = option.partition("=")
                if name in ("vers", "nfsvers") and value:
                    self.version = value
        elif key == "bytes":
            fields = rest.split()
            if len(fields) < len(BYTE_COUNTERS) or not all(f.isdigit() for f in fields):
                return f"malformed bytes line {line[:120]!r}"
            self.bytes = dict(zip(BYTE_COUNTERS, (int(f) for f in fields), strict=False))
        return None

    def build(self) -> NFSMount:
        match = _SERVER.fullmatch(self.device)
        server, export = (match.group("server"), match.group("export")) if match else ("", "")
        return NFSMount(
            device=self.device,
            mountpoint=self.mountpoint,
            fstype=self.fstype,
            server=server,
            export=export,
            version=self.version,
            bytes=self.bytes,
            operations=self.operations,
        )


class MountstatsReader:
    """Reads ``<proc>/1/mountstats``, falling back to ``<proc>/self/mountstats``."""

    def __init__(self, proc_root: Path) -> None:
        self.candidates = (proc_root / "1" / "mountstats", proc_root / "self" / "mountstats")
        self._fallback_logged = False

    def read(self) -> MountstatsReading:
        """The NFS mounts now. Raises ``CollectorUnavailable`` when neither file can be
        read (no procfs, or a kernel without ``mountstats``)."""
        reasons = []
        for path in self.candidates:
            try:
                text = decode_text(read_file(path), "utf-8")
            except (FileNotFoundError, NotADirectoryError):
                reasons.append(f"{path} does not exist")
                continue
            except OSError as error:
                reasons.append(f"{path}: {error.strerror or error}")
                continue
            if reasons and not self._fallback_logged:
                self._fallback_logged = True
                log.info(
                    "reading %s instead (%s): only this process's mount namespace is seen",
                    path,
                    "; ".join(reasons),
                )
            mounts, problems = parse_mountstats(text)
            return MountstatsReading(path, tuple(mounts), tuple(problems))
        raise CollectorUnavailable("; ".join(reasons))
