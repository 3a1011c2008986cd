"""Where profile traces are kept: beside the ledger, under their run, bounded.

A rank's client sends its trace (Chrome/Perfetto JSON, gzip-compressed) as an open
file descriptor beside its ``"type": "profile"`` line (``SCM_RIGHTS`` on the step
socket: ``trainmon.training.receiver``), so the daemon reads only what the
sending process could open itself: it never opens a path a user names. One
worker thread ("profile-traces") takes each accepted upload off a queue of
``MAX_QUEUED``, reads it (a regular file of at most ``max_trace_bytes``), checks it
is a complete gzip stream of at most ``max_uncompressed_bytes`` holding a JSON
object (streamed: the daemon never holds the uncompressed trace) and writes it to::

    <ledger folder>/profiles/<owner>/<run>/rank<N>-<request id>.json.gz

(``owner`` the job's writer identity, ``uid:1000`` as ``uid-1000``: another user
naming the same run id never shares, or evicts from, the folder), mode 0640 in the
ledger's folders (the ``trainmon`` group reads them as it reads the ledger). A
full queue refuses the upload (``busy``): a file system that blocks reads (a
hostile FUSE mount) can hold up profiles, never the step intake.

Bounds (docs/security.md): ``max_traces_per_run`` per run folder, then
``max_traces`` and ``max_total_bytes`` in all; the oldest go first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import stat
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainmon.background import BackgroundThread
from trainmon.logthrottle import LogThrottle
from trainmon.paths import make_state_directory
from trainmon.training.protocol import ProfileReport

log = logging.getLogger(__name__)

#: Uploads waiting for the worker; more are refused (``busy``).
MAX_QUEUED = 2
#: Bytes read or decompressed at a time.
CHUNK_BYTES = 1 << 20
#: A trace's file name, and its mode.
TRACE_SUFFIX = ".json.gz"
TRACE_MODE = 0o640
#: Characters of an owner or run kept in a folder name; the others become ``-``.
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")
#: Why an upload was not kept (label values of ``trainmon_profile_results_total``).
TRACE_PROBLEMS: tuple[str, ...] = ("busy", "too_large", "invalid_trace", "write_error")


class TraceProblem(Exception):
    """An upload not kept: ``reason`` one of ``TRACE_PROBLEMS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class StoredTrace:
    path: Path
    #: Compressed bytes on disk.
    size: int


#: Called by the worker once an upload is decided: the report, and the trace kept or
#: the problem that kept it out.
Done = Callable[[ProfileReport, str, "StoredTrace | TraceProblem"], None]


@dataclass(frozen=True)
class _Upload:
    report: ProfileReport
    owner: str
    descriptor: int
    done: Done


class TraceKeeper:
    """The traces folder, its bounds, and the worker that writes into it."""

    def __init__(
        self,
        directory: Path,
        *,
        max_trace_bytes: int,
        max_uncompressed_bytes: int,
        max_traces_per_run: int,
        max_traces: int,
        max_total_bytes: int,
    ) -> None:
        self.directory = directory
        self._max_trace_bytes = max_trace_bytes
        self._max_uncompressed = max_uncompressed_bytes
        self._per_run = max_traces_per_run
        self._max_traces = max_traces
        self._max_total = max_total_bytes
        self._queue: queue.Queue[_Upload | None] = queue.Queue(MAX_QUEUED)
        self._thread = BackgroundThread("profile-traces", self._run)
        #: The traces kept, oldest first: (modification time, path, bytes).
        self._kept: list[tuple[float, Path, int]] = []
        self._errors = LogThrottle()
        #: Traces deleted to keep the bounds, since start.
        self.evicted = 0
        #: Between ``start()`` and ``stop()``: uploads start the worker.
        self._running = False
        self._starting = threading.Lock()

    def start(self) -> None:
        """Take stock of the traces kept before; the worker starts with the first
        upload (a node that is never profiled runs no thread for it)."""
        try:
            self._make_folder()
        except OSError as error:  # tried again with each trace: counted as write_error
            log.error("cannot make the profile traces' folder %s: %s", self.directory, error)
        self._kept = sorted(_scan(self.directory))
        self._running = True

    def stop(self) -> None:
        self._running = False
        if self._thread.started:
            self._thread.stopping.set()
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(None)  # wakes the worker
        self._thread.stop(timeout=5.0)
        while True:  # uploads nobody will read: their descriptors go back
            try:
                upload = self._queue.get_nowait()
            except queue.Empty:
                break
            if upload is not None:
                os.close(upload.descriptor)

    def submit(self, report: ProfileReport, owner: str, descriptor: int, done: Done) -> None:
        """Queue an upload; the descriptor is the keeper's from now on (closed when
        read, or at once with ``TraceProblem`` ``busy`` when the queue is full)."""
        try:
            self._queue.put_nowait(_Upload(report, owner, descriptor, done))
        except queue.Full:
            os.close(descriptor)
            raise TraceProblem("busy", f"{MAX_QUEUED} traces wait to be written") from None
        with self._starting:
            if self._running:
                self._thread.start()  # nothing once started

    def usage(self) -> tuple[int, int]:
        """Traces kept and their bytes."""
        kept = list(self._kept)
        return len(kept), sum(size for _, _, size in kept)

    def _make_folder(self) -> None:
        """The traces' folder, made in the ledger's folder, which must exist (as the
        ledger's file needs it to): ``OSError`` otherwise."""
        if not self.directory.is_dir():
            if not self.directory.parent.is_dir():
                raise FileNotFoundError(f"the ledger's folder {self.directory.parent} "
                                        "does not exist")
            make_state_directory(self.directory)

    def _run(self) -> None:
        while not self._thread.stopping.is_set():
            upload = self._queue.get()
            if upload is None:
                return
            try:
                outcome: StoredTrace | TraceProblem = self._keep(upload)
            except TraceProblem as problem:
                outcome = problem
            try:
                upload.done(upload.report, upload.owner, outcome)
            except Exception:  # a bug there must not stop the worker
                log.exception("profile result handling failed")

    def _keep(self, upload: _Upload) -> StoredTrace:
        try:
            data = self._read(upload.descriptor)
        finally:
            os.close(upload.descriptor)
        _check_trace(data, self._max_uncompressed)
        report = upload.report
        folder = self.directory / _name(upload.owner) / _name(report.run or "no-run")
        path = folder / f"rank{report.rank}-{report.id}{TRACE_SUFFIX}"
        try:
            self._make_folder()
            make_state_directory(folder)
            _write(path, data)
        except OSError as error:
            if self._errors.allow("write"):
                log.error("cannot keep a profile trace in %s: %s (rate-limited)", folder, error)
            raise TraceProblem("write_error", f"cannot write the trace: {error.strerror}") \
                from None
        self._kept.append((os.stat(path).st_mtime, path, len(data)))
        self._evict(folder)
        return StoredTrace(path, len(data))

    def _read(self, descriptor: int) -> bytes:
        """The whole file behind ``descriptor``: a regular file of at most
        ``max_trace_bytes`` (read from its start, whatever its offset)."""
        found = os.fstat(descriptor)
        if not stat.S_ISREG(found.st_mode):
            raise TraceProblem("invalid_trace", "the trace must be a regular file")
        if found.st_size > self._max_trace_bytes:
            raise TraceProblem("too_large", f"trace of {found.st_size} bytes exceeds "
                                            f"{self._max_trace_bytes}")
        parts: list[bytes] = []
        offset = 0
        while True:
            part = os.pread(descriptor, CHUNK_BYTES, offset)
            if not part:
                return b"".join(parts)
            offset += len(part)
            if offset > self._max_trace_bytes:  # it grew while read
                raise TraceProblem("too_large", f"trace exceeds {self._max_trace_bytes} bytes")
            parts.append(part)

    def _evict(self, folder: Path) -> None:
        """Past a bound, the oldest traces go: the run's own first, then any."""
        kept = self._kept
        in_run = [entry for entry in kept if entry[1].parent == folder]
        doomed = {entry[1] for entry in in_run[:max(0, len(in_run) - self._per_run)]}
        remaining = [entry for entry in kept if entry[1] not in doomed]
        total = sum(size for _, _, size in remaining)
        while remaining and (len(remaining) > self._max_traces or total > self._max_total):
            oldest = remaining.pop(0)
            total -= oldest[2]
            doomed.add(oldest[1])
        for path in doomed:
            with contextlib.suppress(OSError):
                os.unlink(path)
            with contextlib.suppress(OSError):
                os.rmdir(path.parent)  # an emptied run folder
            self.evicted += 1
        self._kept = [entry for entry in kept if entry[1] not in doomed]


def _check_trace(data: bytes, max_uncompressed: int) -> None:
    """``data`` is one complete gzip stream, at most ``max_uncompressed`` bytes
    uncompressed, whose text starts a JSON object; decompressed a chunk at a time."""
    stream = zlib.decompressobj(wbits=31)  # gzip only
    total = 0
    start = b""
    pending = data
    try:
        while pending:
            out = stream.decompress(pending, CHUNK_BYTES)
            pending = stream.unconsumed_tail
            total += len(out)
            if len(start) < 64:
                start += out[:64]
            if total > max_uncompressed:
                raise TraceProblem("too_large", f"trace exceeds {max_uncompressed} bytes "
                                                "uncompressed")
            if stream.eof:
                break
    except zlib.error as error:
        raise TraceProblem("invalid_trace", f"not a gzip stream: {error}") from None
    if not stream.eof or stream.unused_data:
        raise TraceProblem("invalid_trace", "not one complete gzip stream")
    if not start.lstrip().startswith(b"{"):
        raise TraceProblem("invalid_trace", "the trace is not a JSON object")


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file ``path`` (a temporary name renamed over it)."""
    temporary = path.with_name(f".{path.name}.partial")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, TRACE_MODE)
    try:
        os.fchmod(descriptor, TRACE_MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view):]
        os.fsync(descriptor)
    except OSError:
        os.close(descriptor)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    os.close(descriptor)
    os.replace(temporary, path)


def _name(text: str) -> str:
    """``text`` as one folder name: ``uid:1000`` -> ``uid-1000``."""
    return _UNSAFE_NAME.sub("-", text)[:128] or "-"


def _scan(directory: Path) -> list[tuple[float, Path, int]]:
    """The traces under ``directory`` (``<owner>/<run>/*.json.gz``)."""
    found: list[tuple[float, Path, int]] = []
    with contextlib.suppress(OSError):
        for owner in os.scandir(directory):
            if not owner.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                for run in os.scandir(owner.path):
                    if not run.is_dir(follow_symlinks=False):
                        continue
                    with contextlib.suppress(OSError):
                        for entry in os.scandir(run.path):
                            if entry.name.endswith(TRACE_SUFFIX) and entry.is_file(
                                    follow_symlinks=False):
                                info = entry.stat(follow_symlinks=False)
                                found.append((info.st_mtime, Path(entry.path), info.st_size))
    return found
