"""Intake of step reports: the unix datagram socket and ``POST /api/v1/steps``.

Both transports carry the same payload (``protocol``); both end in
``ingest_payload``, which validates every line, feeds the valid ones to the
``TrainingStore`` (step reports to ``ingest``, run descriptions to
``describe``) and counts every rejection by reason.

``SocketReceiver`` owns the unix datagram socket: it creates the folder if
missing and refuses one that another user could change, anywhere from ``/``
down (modes and the rule: ``trainmon.paths``), replaces a stale
socket (refusing to touch a live one or a file that is not a socket), sets
the socket's mode so training users can send, enlarges the receive buffer and
drains it on its own thread, taking each datagram's sender pid from the kernel
(``SO_PASSCRED``) along with it. A datagram may carry one open file descriptor
(``SCM_RIGHTS``): the trace of a ``"type": "profile"`` line, handed with it to the
profile sink (``trainmon.profiling.service``), which owns it from then on; a
descriptor beside anything else is closed at once, and the kernel closes any
beyond the one there is room for.

``StepPushHandler`` is the HTTP route: loopback clients are accepted as they
are, any other client needs ``Authorization: Bearer <token>`` matching the
configured token (constant-time comparison).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import select
import socket
import stat
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

from trainmon.background import BackgroundThread
from trainmon.core.routes import PushRequest, PushResponse
from trainmon.logthrottle import LogThrottle
from trainmon.paths import make_runtime_directory
from trainmon.section import Auto
from trainmon.training.protocol import (
    MAX_DATAGRAM_BYTES,
    ProfileReport,
    ReportError,
    RunDescription,
    StallReport,
    StepReport,
    decode_payload,
)
from trainmon.training.store import TrainingStore
from trainmon.training.writers import LOCAL_WRITER, token_writer, uid_writer

log = logging.getLogger(__name__)

#: Errors of one payload kept for its HTTP answer; the rest are only counted.
MAX_ERRORS_IN_RESPONSE = 10
#: The writer name of a token that stands alone on its line of the token file.
DEFAULT_TOKEN_NAME = "default"
WRITER_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: Shortest accepted bearer token (characters): 64 bits as hex.
MIN_TOKEN_LENGTH = 16
#: How often the socket thread wakes up to check for a stop request (seconds).
POLL_SECONDS = 0.5
#: Most datagrams taken off the socket before they are parsed.
DRAIN_BATCH = 256
#: ``struct ucred`` (pid, uid, gid) of an ``SCM_CREDENTIALS`` control message.
UCRED = struct.Struct("3i")
#: One file descriptor of an ``SCM_RIGHTS`` control message.
DESCRIPTOR = struct.Struct("i")
#: Room for that control message beside each datagram, and for one file descriptor
#: (a profile's trace; the kernel closes any further ones: ``MSG_CTRUNC``).
CREDENTIALS_SPACE = socket.CMSG_SPACE(UCRED.size)
ANCILLARY_SPACE = CREDENTIALS_SPACE + socket.CMSG_SPACE(DESCRIPTOR.size)
#: Takes a profile line, the descriptor of its trace (None: none came) and its writer;
#: owns the descriptor from the call on; raises ``ReportError`` to refuse the line.
ProfileSink = Callable[[ProfileReport, "int | None", str], None]
#: Linux's cap on datagrams waiting in a unix socket's queue (per network namespace).
MAX_DGRAM_QLEN_PATH = Path("/proc/sys/net/unix/max_dgram_qlen")


@dataclass(frozen=True)
class IntakeResult:
    accepted: int = 0
    #: The first ``MAX_ERRORS_IN_RESPONSE`` errors of the payload (``rejected`` counts all).
    errors: list[ReportError] = field(default_factory=list)
    rejected: int = 0


def ingest_payload(
    store: TrainingStore,
    payload: bytes,
    transport: str,
    max_label_length: int,
    sender_pid: int | None = None,
    identity: str = LOCAL_WRITER,
    refusals: LogThrottle | None = None,
    profiles: ProfileSink | None = None,
    attachment: int | None = None,
) -> IntakeResult:
    """Validate every line of ``payload`` and store the valid reports and run
    descriptions of writer ``identity`` (both count as accepted); count the rest.
    Profile lines go to ``profiles`` (refused without one), the first with
    ``attachment``, the file descriptor that came with the payload, which is closed
    here when no profile line takes it.

    The cost is linear in the payload's bytes with a small constant: a payload
    of more than ``MAX_PAYLOAD_LINES`` lines is refused whole before parsing,
    junk lines fail on their first byte, only the first ``MAX_ERRORS_IN_RESPONSE``
    errors are kept (the others are counted), and the store's counters are
    updated once per payload. ``sender_pid``: the sending process in the
    daemon's pid namespace, as the kernel vouches for it (``SCM_CREDENTIALS``);
    None when unknown. ``refusals`` logs (rate-limited) what the caps and the
    ownership rule refused.
    """
    accepted = 0
    errors: list[ReportError] = []
    rejected: dict[str, int] = {}  # reason -> count; stays empty on the usual path
    for item in decode_payload(payload, max_label_length):
        problem: ReportError | None = item if isinstance(item, ReportError) else None
        try:
            if isinstance(item, StepReport):
                store.ingest(item, transport, sender_pid, identity)
                accepted += 1
            elif isinstance(item, RunDescription):
                store.describe(item, transport, sender_pid, identity)
                accepted += 1
            elif isinstance(item, StallReport):
                store.stalled(item, transport, identity)
                accepted += 1
            elif isinstance(item, ProfileReport):
                descriptor, attachment = attachment, None
                if profiles is None:
                    if descriptor is not None:
                        os.close(descriptor)
                    raise ReportError("invalid_field", f"no profiles over {transport}")
                profiles(item, descriptor, identity)
                accepted += 1
        except ReportError as refused:
            problem = refused
            if refusals is not None and refusals.allow(refused.reason, identity):
                log.warning("refused a %s line from %s: %s (rate-limited)",
                            transport, identity, refused)
        if problem is not None:
            rejected[problem.reason] = rejected.get(problem.reason, 0) + 1
            if len(errors) < MAX_ERRORS_IN_RESPONSE:
                errors.append(problem)
    if attachment is not None:  # no profile line took it
        os.close(attachment)
    if not rejected:
        if accepted:
            return IntakeResult(accepted)
        empty = ReportError("malformed", "empty payload")
        rejected[empty.reason] = 1
        errors.append(empty)
    store.reject_counts(rejected)
    return IntakeResult(accepted, errors, sum(rejected.values()))


def read_tokens(path: Path) -> dict[str, str]:
    """The bearer tokens in ``path``: token -> writer name; never logged.

    One token per line, alone (its writer is ``default``) or after its
    writer's name and a space (``ci 3f9a…``); blank lines and ``#`` comments
    are skipped. Names are 1-64 of ``[A-Za-z0-9_.-]``; a token is at least
    ``MIN_TOKEN_LENGTH`` characters without spaces.
    """
    tokens: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) > 2:
            raise ValueError(f"{path}:{number}: expected 'TOKEN' or 'NAME TOKEN'")
        name, token = (DEFAULT_TOKEN_NAME, parts[0]) if len(parts) == 1 else parts
        if not WRITER_NAME_PATTERN.fullmatch(name):
            raise ValueError(f"{path}:{number}: writer names are 1-64 of [A-Za-z0-9_.-]")
        if len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"{path}:{number}: a token needs {MIN_TOKEN_LENGTH}+ characters")
        if token in tokens:
            raise ValueError(f"{path}:{number}: the same token twice")
        tokens[token] = name
    if not tokens:
        raise ValueError(f"token file {path} holds no token")
    return tokens


class StepPushHandler:
    """``POST /api/v1/steps``: who is writing, size check, then ``ingest_payload``.

    The writer is the bearer token's name (``token:<name>``), or, for a
    loopback client without a token when ``loopback_without_token`` allows
    it, the local user the kernel names for its connection (``uid:<n>``,
    ``PushRequest.peer_uid``).
    Anything else is refused: 401 with a wrong or missing token, 403 for a
    client that may not push without one.
    """

    def __init__(
        self,
        store: TrainingStore,
        *,
        tokens: Mapping[str, str] | None = None,
        loopback_without_token: bool | Auto = "auto",
        max_label_length: int,
    ) -> None:
        self._store = store
        self._tokens = [(f"Bearer {token}".encode(), name)
                        for token, name in (tokens or {}).items()]
        # auto: loopback without a token only while no token is configured
        self._loopback_without_token = (
            not self._tokens if loopback_without_token == "auto" else loopback_without_token)
        self._max_label_length = max_label_length
        self._refusals = LogThrottle()

    def __call__(self, request: PushRequest) -> PushResponse:
        identity, denied = self.writer(request)
        if denied is not None:
            self._store.reject("unauthorized")
            return denied
        assert identity is not None
        if request.too_large:
            self._store.reject("too_large")
            return _error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too_large", "body too large")
        result = ingest_payload(self._store, request.body, "http", self._max_label_length,
                                identity=identity, refusals=self._refusals)
        payload: dict[str, object] = {"accepted": result.accepted, "rejected": result.rejected}
        if not result.errors:
            return PushResponse(HTTPStatus.OK, payload)
        payload["errors"] = [
            {"reason": error.reason, "detail": error.detail}
            for error in result.errors
        ]
        payload["error"] = result.errors[0].reason
        status = (HTTPStatus.FORBIDDEN if result.accepted == 0
                  and all(error.reason == "forbidden" for error in result.errors)
                  else HTTPStatus.BAD_REQUEST)
        return PushResponse(status, payload)

    def writer(self, request: PushRequest) -> tuple[str | None, PushResponse | None]:
        """Who ``request`` writes as (the push rule of the class docstring), or the
        refusal to answer; also the rule of the profile requests (``trainmon.profiling``)."""
        header = request.authorization
        if header is not None and self._tokens:
            import hmac  # here: with tokens configured only (it loads libcrypto)

            presented = header.strip().encode()
            # Compare with every token (constant time each): no early exit that
            # would tell how many tokens there are or which one nearly matched.
            found = None
            for expected, name in self._tokens:
                if hmac.compare_digest(presented, expected):
                    found = name
            if found is not None:
                return token_writer(found), None
            return None, _error(HTTPStatus.UNAUTHORIZED, "unauthorized", "invalid bearer token")
        if request.is_loopback and self._loopback_without_token:
            if request.peer_uid is not None:
                return uid_writer(request.peer_uid), None
            return None, _error(
                HTTPStatus.FORBIDDEN, "unauthorized",
                "cannot tell which local user this loopback client is; send a bearer token",
            )
        if not self._tokens:
            return None, _error(
                HTTPStatus.FORBIDDEN, "unauthorized",
                "only loopback clients may push (no token_file is configured)",
            )
        return None, _error(HTTPStatus.UNAUTHORIZED, "unauthorized", "bearer token required")


def _error(status: HTTPStatus, reason: str, detail: str) -> PushResponse:
    return PushResponse(status, {"error": reason, "detail": detail})


class SocketReceiver:
    """The unix datagram socket and the thread that drains it into the store."""

    def __init__(
        self,
        path: Path,
        store: TrainingStore,
        *,
        mode: int = 0o666,
        receive_buffer_bytes: int = 4 << 20,
        max_label_length: int,
        qlen_path: Path = MAX_DGRAM_QLEN_PATH,
        profiles: ProfileSink | None = None,
    ) -> None:
        self.path = path
        self._profiles = profiles
        self._store = store
        self._mode = mode
        self._wanted_buffer = receive_buffer_bytes
        self._max_label_length = max_label_length
        self._socket: socket.socket | None = None
        self._inode = -1
        self._thread = BackgroundThread("training-socket", self._run)
        self._refusals = LogThrottle()
        self.receive_buffer_bytes = 0
        #: Datagrams Linux queues before refusing more (None if unreadable).
        self.max_queued_datagrams = _read_int(qlen_path)

    @property
    def listening(self) -> bool:
        return self._thread.alive

    def start(self) -> None:
        """Bind the socket and start draining it; ``OSError`` on failure, a
        ``trainmon.paths.UnsafePathError`` naming the folder another user could
        change."""
        for made in make_runtime_directory(self.path.parent):
            log.info("created %s (mode %o)", made, stat.S_IMODE(os.stat(made).st_mode))
        _remove_stale_socket(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(str(self.path))
            # By path (a socket's file has no descriptor to fchmod): only root and the
            # daemon's user can change the names in its folder (checked above).
            os.chmod(self.path, self._mode)
            self.receive_buffer_bytes = _enlarge_receive_buffer(sock, self._wanted_buffer)
            # The kernel attaches each sender's pid, translated into our pid
            # namespace (0 when the sender is outside it): which process's mount
            # table a reported checkpoint path belongs to (trainmon.node.mounts).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            # Non-blocking, waited on with poll(): on a socket with a timeout Python
            # waits out the timeout even for MSG_DONTWAIT, which would hold a
            # drained batch back until it filled up.
            sock.setblocking(False)
            self._inode = os.lstat(self.path).st_ino
        except OSError:
            sock.close()
            raise
        self._socket = sock
        self._thread.start()
        log.info(
            "receiving training steps on unix://%s (mode %o, receive buffer %d bytes)",
            self.path, self._mode, self.receive_buffer_bytes,
        )
        if self.max_queued_datagrams is not None and self.max_queued_datagrams < 128:
            log.warning(
                "net.unix.max_dgram_qlen is %d: a burst of more reports than that is refused "
                "(clients retry, then count them as dropped); on nodes with many ranks set "
                "sysctl net.unix.max_dgram_qlen=512", self.max_queued_datagrams,
            )

    def stop(self) -> None:
        """Stop the thread, close and remove the socket; safe to call twice."""
        if self._thread.started:
            self._thread.stopping.set()
            _wake(self.path)
        self._thread.stop(timeout=5 * POLL_SECONDS)
        if self._socket is not None:
            with contextlib.suppress(OSError):
                found = os.lstat(self.path)
                # Only our own socket: a newer daemon may have bound the path since.
                if stat.S_ISSOCK(found.st_mode) and found.st_ino == self._inode:
                    os.unlink(self.path)
            self._socket.close()
            self._socket = None

    def _run(self) -> None:
        sock = self._socket
        assert sock is not None
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        while True:
            # On stop, one last drain: the final reports of runs that ended just
            # before the daemon stopped reach the store (and the ledger's last flush).
            stopping = self._thread.stopping.is_set()
            if not stopping and not poller.poll(POLL_SECONDS * 1000):
                continue
            batch: list[tuple[bytes, list[tuple[int, int, bytes]], int, object]] = []
            try:
                # Empty the kernel queue first (it may hold as few as 10 datagrams),
                # then parse: senders are refused only while the queue is full.
                while len(batch) < DRAIN_BATCH:
                    batch.append(sock.recvmsg(MAX_DATAGRAM_BYTES, ANCILLARY_SPACE))
            except BlockingIOError:
                pass
            except OSError as error:
                if stopping:
                    return
                log.error("training socket receive failed: %s", error)
                continue
            for data, ancillary, flags, _ in batch:
                pid, uid = sender_credentials(ancillary)
                attached = received_descriptors(ancillary)
                if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(attached) > 1:
                    _close_all(attached)
                    self._store.reject("too_large")
                elif uid is None:
                    _close_all(attached)
                    self._store.reject("unauthorized")
                elif data:  # an empty datagram is a wake-up (``_wake``), not a report
                    ingest_payload(self._store, data, "unix", self._max_label_length,
                                   pid, uid_writer(uid), self._refusals, self._profiles,
                                   attached[0] if attached else None)
                else:
                    _close_all(attached)
            if stopping:
                return


def sender_credentials(
    ancillary: list[tuple[int, int, bytes]],
) -> tuple[int | None, int | None]:
    """The sender's pid (None if absent or 0: outside our pid namespace) and uid
    (None if absent) from a datagram's ``SCM_CREDENTIALS``, as the kernel
    vouches for them."""
    for level, kind, data in ancillary:
        credentials = level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
        if credentials and len(data) >= UCRED.size:
            pid, uid, _ = UCRED.unpack_from(data)
            return (pid if pid > 0 else None), uid
    return None, None


def received_descriptors(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The file descriptors a datagram carried (``SCM_RIGHTS``), now this process's."""
    found: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % DESCRIPTOR.size
            found.extend(number for (number,) in DESCRIPTOR.iter_unpack(data[:usable]))
    return found


def _close_all(descriptors: list[int]) -> None:
    for descriptor in descriptors:
        with contextlib.suppress(OSError):
            os.close(descriptor)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _wake(path: Path) -> None:
    """Send an empty datagram so a blocked ``recvmsg`` returns at once."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.sendto(b"", str(path))


def _remove_stale_socket(path: Path) -> None:
    """Unlink a socket nobody listens on; refuse a live socket or a non-socket file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket; not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        log.info("replacing stale training socket %s", path)
        path.unlink()
        return
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f"{path} is in use by another running daemon")


def _enlarge_receive_buffer(sock: socket.socket, wanted: int) -> int:
    """Ask for ``wanted`` bytes (beyond ``rmem_max`` when privileged); return what we got."""
    force = getattr(socket, "SO_RCVBUFFORCE", None)
    if force is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, wanted)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, wanted)
    else:  # pragma: no cover - Linux has SO_RCVBUFFORCE
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, wanted)
    # Linux reports twice the requested size (bookkeeping overhead included).
    return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
