"""Which filesystem a path lives on, and what kind of storage that is.

Used for checkpoints: a training process reports the path it saved to, and
the daemon says whether that path survives the instance (``network_fs``,
``object_store``, ``cloud_disk``) or goes with it (``local_disk``,
``ephemeral``). Three steps:

- **The mount table** (``parse_mountinfo``), from ``mountinfo`` (man 5 proc):
  ``id parent major:minor root mountpoint options [optional...] - fstype
  source super-options``. The optional fields (``shared:N``, ``master:N``...)
  run up to the lone ``-``; paths carry the kernel's octal escapes for space,
  tab, newline and backslash (``\\040`` ``\\011`` ``\\012`` ``\\134``; newer
  kernels also ``#`` as ``\\043``). A malformed line is skipped (counted in
  ``MountTable.skipped``), never fatal.
- **The mount of a path** (``find_mount``): the mount whose mount point is the
  longest prefix of the path *by components* (``/data2`` is not under
  ``/data``); on the same mount point the later line wins (a mount stacked
  over another hides it). The path is taken as the process wrote it
  (``os.path.abspath``, no symlinks resolved: the daemon cannot resolve them
  inside another mount namespace).
- **The table of the process's namespace** (``MountResolver``): the mount
  table of the reporting process (``<proc>/<pid>/mountinfo``: a container sees
  its own volumes there, with the paths it reports), and only when the daemon
  can tell that process apart. A pid alone does not name it: a container
  without ``hostPID`` reports its own pid, which in the daemon's ``/proc`` is
  another process. So the table is used when

  1. the kernel named the sender (``SCM_CREDENTIALS`` of the unix socket, the
     pid translated into the daemon's namespace, see
     ``trainmon.training.receiver``) and that process is the reporter: the
     same pid, or a process whose innermost ``NSpid`` (``<proc>/<pid>/status``)
     is the reported one; or
  2. the checkpoint (or its folder) exists under ``<proc>/<pid>/root``, which
     the kernel resolves in that process's mount namespace (this needs the
     right to inspect the process: root, or the same user).

  Whose eyes: a path is looked up (stat under ``<proc>/<pid>/root``) with the
  permissions of the user who reported it (a ``Viewer``), not the daemon's:
  the reported pid is used only when that process runs as the viewer (or the
  kernel named it the sender), and a path is stat-ed only when the viewer may
  search every folder above it (owner, group and other ``x`` bits; ACLs are
  not read, so an ACL that grants more reads ``unknown``). Otherwise a user
  could ask a root daemon whether a path it cannot see exists (its storage
  kind against ``unknown``). ``viewer=None``: the daemon's own permissions,
  for trusted writers.

  A reporter that cannot be told apart this way gets the host's table
  (``<proc>/1/mountinfo``) only if the host sees the path (under
  ``<proc>/1/root``), else ``unknown``: never a guess from the wrong
  namespace. A report without a pid (an old client) is resolved in the
  host's table, else the daemon's own (``<proc>/self/mountinfo``). Tables are
  cached per pid for ``cache_seconds`` (reading, parsing and classifying a
  20-line table takes about 0.7 ms, a cached lookup about 30 µs; the collector
  resolves once per job at scrape time, never on the push path).

**Classification** (``classify``), by filesystem type first:

- ``network_fs``: NFS (Tencent CFS is mounted as ``nfs``/``nfs4``; CFS Turbo
  as ``lustre``), SMB, Lustre, CephFS, GlusterFS, BeeGFS, GPFS, and JuiceFS:
  JuiceFS keeps its data in object storage but is a POSIX network filesystem
  with its own metadata engine (consistent, shared, outlives the node), which
  is what matters for a checkpoint;
- ``object_store``: FUSE views of a bucket (``fuse.cosfs``, ``fuse.s3fs``,
  ``fuse.goofys``, ``fuse.geesefs``, ``mountpoint-s3``, ``fuse.rclone``,
  ``gcsfuse``, ``blobfuse``, ``ossfs``): durable, but a write is only safe once
  the close/flush uploaded it, and renames are copies;
- ``ephemeral``: ``tmpfs``, ``ramfs``, ``devtmpfs`` and a container's
  ``overlay``/``aufs`` root (lost with the container);
- block-backed filesystems: the device behind ``major:minor``
  (``<sys>/dev/block/<major>:<minor>``, a symlink into ``/sys/devices``; else
  ``<sys>/class/block/<basename of the source>``, for btrfs, whose mounts
  show an anonymous ``0:N``). A device (or, for a partition, its disk) whose
  serial is a Tencent Cloud Block Storage disk id, ``disk-`` and 8 characters
  of ``[0-9a-z]``, is a ``cloud_disk``; a device-mapper volume (LVM) is one
  when all its ``slaves`` are; any other block device is a ``local_disk``.
- anything else (ZFS datasets, an unreadable sysfs, no mount table): ``unknown``.

The CBS serial rule: Tencent's own CSI driver
(github.com/TencentCloud/kubernetes-csi-tencentcloud, ``driver/cbs/node.go``)
finds an attached CBS disk at ``/dev/disk/by-id/virtio-<disk id>``; udev
names those links ``virtio-<serial>`` from the virtio-blk ``serial`` attribute,
so a virtio disk's ``serial`` is its CBS id. NVMe-attached CBS disks could not
be confirmed from public sources; a ``device/serial`` of the same ``disk-``
form is accepted, and an NVMe disk with any other serial (the local NVMe of
GPU instances such as GT4/GN10X) stays ``local_disk``. The rule only ever
promotes a disk to ``cloud_disk`` on that explicit id, never by guess.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainmon.node.kernelfiles import KernelFileReader

log = logging.getLogger(__name__)

#: Values of the ``storage`` label, most durable first.
STORAGE_KINDS: tuple[str, ...] = (
    "network_fs", "object_store", "cloud_disk", "local_disk", "ephemeral", "unknown",
)
#: Seconds a parsed mount table (and a device's classification) is reused.
DEFAULT_CACHE_SECONDS = 30.0
#: Mount tables cached at once (one per reporting pid).
MAX_CACHED_TABLES = 256

NETWORK_FS_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "ceph", "fuse.ceph-fuse", "glusterfs",
    "fuse.glusterfs", "beegfs", "gpfs", "afs", "fuse.juicefs", "juicefs", "fuse.sshfs",
    "wekafs", "fuse.lizardfs", "fuse.moosefs",
})
OBJECT_STORE_TYPES = frozenset({
    "fuse.cosfs", "fuse.s3fs", "fuse.goofys", "fuse.geesefs", "fuse.mountpoint-s3",
    "fuse.rclone", "fuse.gcsfuse", "fuse.blobfuse", "fuse.blobfuse2", "fuse.ossfs",
    "fuse.s3backer",
})
#: Plain ``fuse`` mounts name their program in the source field.
OBJECT_STORE_SOURCES = frozenset({
    "cosfs", "s3fs", "goofys", "geesefs", "mountpoint-s3", "rclone", "gcsfuse",
    "blobfuse", "blobfuse2", "ossfs",
})
EPHEMERAL_TYPES = frozenset({"tmpfs", "ramfs", "devtmpfs", "overlay", "aufs"})
#: A Tencent Cloud Block Storage disk id, as its virtio serial.
CBS_SERIAL = re.compile(r"disk-[0-9a-z]{8}")

_ESCAPE = re.compile(r"\\([0-3][0-7]{2})")


@dataclass(frozen=True)
class Mount:
    """One line of ``mountinfo``."""

    mount_id: int
    parent_id: int
    major: int
    minor: int
    #: The directory of the filesystem mounted here (not ``/`` for a bind mount).
    root: str
    mountpoint: str
    fstype: str
    #: The mount source: ``/dev/vdb1``, ``10.0.0.8:/cfs``, ``overlay``, ``cosfs``...
    source: str


@dataclass(frozen=True)
class MountTable:
    """A parsed ``mountinfo``: its mounts in file order, and the lines skipped as malformed."""

    mounts: tuple[Mount, ...]
    skipped: int = 0


@dataclass(frozen=True)
class Viewer:
    """The user a path is looked up for: its uid and groups (module docstring)."""

    uid: int
    gids: frozenset[int] = frozenset()

    def may_search(self, folder: os.stat_result) -> bool:
        """Whether this user may pass through ``folder`` (its ``x`` bit for them)."""
        if self.uid == 0:
            return True
        if folder.st_uid == self.uid:
            return bool(folder.st_mode & stat.S_IXUSR)
        if folder.st_gid in self.gids:
            return bool(folder.st_mode & stat.S_IXGRP)
        return bool(folder.st_mode & stat.S_IXOTH)


@dataclass(frozen=True)
class PathStorage:
    """Where a path lives: its mount point, filesystem type and storage kind."""

    mountpoint: str
    fstype: str
    storage: str


def unescape(field: str) -> str:
    """Undo the kernel's octal escapes (``\\040`` → space, ``\\134`` → backslash)."""
    if "\\" not in field:
        return field
    return _ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def parse_mountinfo(text: str) -> MountTable:
    """Every well-formed line of a ``mountinfo`` file."""
    mounts: list[Mount] = []
    skipped = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        mount = _parse_line(line)
        if mount is None:
            skipped += 1
        else:
            mounts.append(mount)
    return MountTable(tuple(mounts), skipped)


def _parse_line(line: str) -> Mount | None:
    fields = line.split(" ")
    try:
        separator = fields.index("-", 6)
    except ValueError:
        return None
    if len(fields) < separator + 3:
        return None
    device = fields[2].split(":")
    try:
        mount_id, parent_id = int(fields[0]), int(fields[1])
        major, minor = int(device[0]), int(device[1])
    except (ValueError, IndexError):
        return None
    mountpoint = unescape(fields[4])
    if not mountpoint.startswith("/"):
        return None
    return Mount(
        mount_id=mount_id,
        parent_id=parent_id,
        major=major,
        minor=minor,
        root=unescape(fields[3]),
        mountpoint=mountpoint,
        fstype=fields[separator + 1],
        source=unescape(fields[separator + 2]),
    )


def find_mount(mounts: Sequence[Mount], path: str) -> Mount | None:
    """The mount ``path`` is on: the longest mount point that is a component
    prefix of it, the later line on the same mount point. ``path`` must be
    absolute; it is normalised (``..``, ``//``) but no symlink is followed."""
    if not path.startswith("/"):
        return None
    parts = _components(path)
    best: Mount | None = None
    best_length = -1
    for mount in mounts:
        point = _components(mount.mountpoint)
        if len(point) >= best_length and parts[:len(point)] == point:
            best, best_length = mount, len(point)
    return best


def _components(path: str) -> list[str]:
    return [part for part in os.path.normpath(path).split("/") if part]


def classify(mount: Mount, sys_root: Path, reader: KernelFileReader | None = None) -> str:
    """The storage kind of ``mount`` (one of ``STORAGE_KINDS``); see the module docstring."""
    fstype = mount.fstype
    if fstype in NETWORK_FS_TYPES:
        return "network_fs"
    if fstype in OBJECT_STORE_TYPES or (
        fstype.startswith("fuse") and mount.source in OBJECT_STORE_SOURCES
    ):
        return "object_store"
    if fstype in EPHEMERAL_TYPES:
        return "ephemeral"
    device = _block_device(mount, sys_root)
    if device is None:
        return "unknown"
    files = reader or KernelFileReader(log)
    return "cloud_disk" if _is_cloud_disk(device, sys_root, files, depth=0) else "local_disk"


def _block_device(mount: Mount, sys_root: Path) -> Path | None:
    """The sysfs directory of the block device behind ``mount``, resolved; None if none."""
    candidates: list[Path] = []
    if mount.major != 0:
        candidates.append(sys_root / "dev" / "block" / f"{mount.major}:{mount.minor}")
    if mount.source.startswith("/dev/"):
        name = os.path.basename(mount.source)
        if name and name not in (".", ".."):
            candidates.append(sys_root / "class" / "block" / name)
    for candidate in candidates:
        try:
            resolved = candidate.resolve(strict=True)
        except (OSError, RuntimeError):  # missing, or a symlink loop
            continue
        if resolved.is_dir():
            return resolved
    return None


def _is_cloud_disk(device: Path, sys_root: Path, files: KernelFileReader, depth: int) -> bool:
    """True when ``device`` (or the disk of a partition) carries a CBS serial, or is a
    device-mapper volume all of whose slaves do."""
    disk = device.parent if (device / "partition").exists() else device
    for serial_file in (disk / "serial", disk / "device" / "serial"):
        serial = files.text(serial_file)
        if serial is not None and CBS_SERIAL.fullmatch(serial):
            return True
    slaves_dir = disk / "slaves"
    if depth >= 4 or not slaves_dir.is_dir():
        return False
    try:
        slaves = sorted(slaves_dir.iterdir())
    except OSError:
        return False
    resolved: list[Path] = []
    for slave in slaves:
        try:
            resolved.append(slave.resolve(strict=True))
        except (OSError, RuntimeError):
            return False
    return bool(resolved) and all(
        _is_cloud_disk(slave, sys_root, files, depth + 1) for slave in resolved
    )


#: The answer when no mount table or no mount tells where a path lives.
UNKNOWN_STORAGE = PathStorage("", "", "unknown")


class MountResolver:
    """Resolves checkpoint paths to ``PathStorage``, with per-pid cached mount tables.

    Thread-safe. ``proc_root`` and ``sys_root`` are the daemon's configured
    ``paths.proc`` / ``paths.sys``.
    """

    def __init__(
        self,
        proc_root: Path,
        sys_root: Path,
        *,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._proc = proc_root
        self._sys = sys_root
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._files = KernelFileReader(log)
        self._lock = threading.Lock()
        self._tables: dict[str, tuple[float, MountTable | None]] = {}
        self._kinds: dict[tuple[int, int, str, str], tuple[float, str]] = {}

    def resolve(
        self, path: str, pid: int | None = None, *, sender_pid: int | None = None,
        viewer: Viewer | None = None,
    ) -> PathStorage:
        """Where ``path`` (as process ``pid`` sees it) lives.

        ``sender_pid``: the process the kernel says sent the report, in the
        daemon's pid namespace. ``viewer``: the user who reported it, whose
        permissions the path is looked up with (None: the daemon's). Without a
        readable mount table of the right namespace or a matching mount, the
        answer is ``PathStorage("", "", "unknown")``: the checkpoint exists, its
        storage is not known.
        """
        with self._lock:
            now = self._clock()
            if viewer is not None and pid is not None and sender_pid is None \
                    and not self._runs_as(pid, viewer.uid):
                pid = None  # another user's process: its root is not this user's to probe
            table = self._reporter_table(path, pid, sender_pid, now, viewer)
            if table is None and pid is not None:
                # the reporter's own namespace is not known: the host's view, if it sees the path
                if self._visible("1", path, viewer) is not True:
                    return UNKNOWN_STORAGE
                table = self._table("1", now)
            elif table is None:
                table = self._table("1", now) or self._table("self", now)
            mount = find_mount(table.mounts, path) if table is not None else None
            if mount is None:
                return UNKNOWN_STORAGE
            return PathStorage(mount.mountpoint, mount.fstype, self._kind(mount, now))

    def _reporter_table(
        self, path: str, pid: int | None, sender_pid: int | None, now: float,
        viewer: Viewer | None,
    ) -> MountTable | None:
        """The mount table of the reporting process, where it can be told apart."""
        if sender_pid is not None and self._is_reporter(sender_pid, pid):
            return self._table(str(sender_pid), now)
        if pid is not None and self._visible(str(pid), path, viewer) is True:
            return self._table(str(pid), now)
        return None

    def _runs_as(self, pid: int, uid: int) -> bool:
        """Whether process ``pid`` runs as ``uid`` (its real or effective uid)."""
        status = self._read(self._proc / str(pid) / "status")
        for line in (status or "").splitlines():
            if line.startswith("Uid:"):
                return str(uid) in line.split()[1:3]
        return False

    def _is_reporter(self, sender_pid: int, pid: int | None) -> bool:
        """Whether the kernel-named sender is the process that reported ``pid``:
        the same number, or a process whose innermost ``NSpid`` is ``pid``."""
        if pid is None or pid == sender_pid:
            return True
        status = self._read(self._proc / str(sender_pid) / "status")
        for line in (status or "").splitlines():
            if line.startswith("NSpid:"):
                return line.split()[-1] == str(pid)
        return False

    def _visible(self, owner: str, path: str, viewer: Viewer | None = None) -> bool | None:
        """Whether ``path`` or its folder exists in the root of process ``owner``
        (``<proc>/<owner>/root``, which the kernel resolves in its mount
        namespace), as far as ``viewer`` may look; None when that cannot be
        checked (no permission)."""
        root = str(self._proc / owner / "root")
        path = os.path.normpath(path)  # no ".." past the process's root
        for candidate in (path, os.path.dirname(path)):
            try:
                if viewer is not None and not _searchable(root, candidate, viewer):
                    return None
                os.stat(root + candidate)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError:
                return None
            return True
        return False

    def _table(self, owner: str, now: float) -> MountTable | None:
        cached = self._tables.get(owner)
        if cached is not None and now - cached[0] < self._cache_seconds:
            return cached[1]
        table = self._read_table(owner)
        if len(self._tables) >= MAX_CACHED_TABLES:
            self._tables = {
                key: entry for key, entry in self._tables.items()
                if now - entry[0] < self._cache_seconds
            }
            if len(self._tables) >= MAX_CACHED_TABLES:
                self._tables.clear()
        self._tables[owner] = (now, table)
        return table

    def _read_table(self, owner: str) -> MountTable | None:
        text = self._read(self._proc / owner / "mountinfo")
        if text is None:
            return None
        table = parse_mountinfo(text)
        if table.skipped:
            log.debug("%s/%s/mountinfo: %d malformed line(s) skipped",
                      self._proc, owner, table.skipped)
        return table if table.mounts else None

    def _read(self, path: Path) -> str | None:
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None
        except OSError as error:  # EACCES on another user's process without privileges
            log.debug("cannot read %s: %s", path, error.strerror or error)
            return None

    def _kind(self, mount: Mount, now: float) -> str:
        key = (mount.major, mount.minor, mount.fstype, mount.source)
        cached = self._kinds.get(key)
        if cached is not None and now - cached[0] < self._cache_seconds:
            return cached[1]
        kind = classify(mount, self._sys, self._files)
        if len(self._kinds) >= MAX_CACHED_TABLES:
            self._kinds.clear()
        self._kinds[key] = (now, kind)
        return kind


def _searchable(root: str, path: str, viewer: Viewer) -> bool:
    """Whether ``viewer`` may search every folder above ``path`` under ``root`` (each is
    stat-ed only once the one above it is known searchable: nothing this user could not
    reach is looked at)."""
    parts = [part for part in path.split("/") if part][:-1]
    folders = [root + "/" + "/".join(parts[:depth]) for depth in range(len(parts) + 1)]
    return all(viewer.may_search(os.stat(folder)) for folder in folders)
