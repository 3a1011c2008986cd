"""Training step protocol v1: the wire format shared by the client and the daemon.

A payload (one unix datagram or one ``POST /api/v1/steps`` body) holds
newline-delimited JSON objects, one **report** per line. A report carries the
*cumulative* totals of one reporter since it started plus its identity, so a
lost or repeated report loses nothing but freshness. The field-by-field
specification, written for implementers in other languages, is
``docs/protocol.md``; this module is its executable form.

Standard library only: the training-side client imports the constants and
``encode_report`` from here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

PROTOCOL_VERSION = 1
#: The daemon's HTTP route for step reports (also the client's default path).
STEPS_PATH = "/api/v1/steps"

#: Upper bounds (seconds, inclusive, Prometheus ``le``) of the step-time
#: histogram. ``step_buckets`` has one count per bound plus a last count for
#: steps longer than the last bound. Fixed by the protocol version.
STEP_SECONDS_BOUNDS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)
STEP_BUCKET_COUNT = len(STEP_SECONDS_BOUNDS) + 1

#: Largest unix datagram the daemon reads; a longer one is rejected whole.
MAX_DATAGRAM_BYTES = 65_536
#: Largest single report line (bytes of UTF-8, without the newline).
MAX_LINE_BYTES = 16_384
#: Most distinct phase names in one report.
MAX_PHASES = 32
#: Default longest ``job`` and phase name, in characters (daemon-configurable).
DEFAULT_MAX_LABEL_LENGTH = 128
#: Counts and integer fields stay exactly representable as a float64.
MAX_COUNT = 2**53
MAX_RANK = 2**31 - 1
#: Longest ``checkpoint_path`` (bytes of UTF-8): Linux's PATH_MAX. A report
#: line stays within ``MAX_LINE_BYTES`` with it (a report without phases is
#: well under 1 KiB; 32 long phase names add at most about 4.5 KiB).
MAX_PATH_BYTES = 4096

#: Characters allowed in ``job`` and phase names: no quotes, spaces, newlines,
#: control characters or non-ASCII, so every consumer of the exposition (PromQL
#: selectors, Grafana variables, shells) can use the value verbatim.
LABEL_PATTERN = re.compile(r"[A-Za-z0-9_.:@/+-]+")
_LABEL_FORBIDDEN = re.compile(r"[^A-Za-z0-9_.:@/+-]")
REPORTER_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
GPU_PATTERN = re.compile(r"[0-9]{1,4}")

#: Every reason a report can be rejected for; the value set of the ``reason``
#: label of ``trainmon_training_rejected_reports_total``.
REJECT_REASONS: tuple[str, ...] = (
    "malformed",            # not UTF-8, not JSON, not an object, truncated
    "too_large",            # datagram, body or line over its size cap
    "unsupported_version",  # "v" is not 1
    "invalid_field",        # missing field, wrong type, NaN/Inf/negative, inconsistent totals
    "invalid_label",        # job or phase name too long or outside the charset
    "limit",                # more distinct phases for a rank than MAX_PHASES
    "unauthorized",         # HTTP without loopback or a valid bearer token
)


class ReportError(ValueError):
    """A report (or a whole payload) that the daemon refuses, with its reason."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REJECT_REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class StepReport:
    """One validated report: a reporter's identity and its cumulative totals."""

    job: str
    rank: int
    reporter_id: str
    steps: int
    samples: int
    step_seconds: float
    data_wait_seconds: float
    step_buckets: tuple[int, ...]
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    dropped_reports: int = 0
    local_rank: int | None = None
    world_size: int | None = None
    gpu: str | None = None
    pid: int | None = None
    #: Unix time (seconds) at which the reporter's last step ended.
    last_step_time: float | None = None
    #: Communication measured inside the job (``Reporter.instrument``), cumulative;
    #: ``None`` where the reporter does not measure it (unknown, not zero).
    #: Wall (or GPU-timeline) seconds with a collective of the job in flight.
    comm_seconds: float | None = None
    #: The part of the steps spent waiting for communication after the rank's
    #: own compute was done (never more than ``comm_seconds``).
    comm_exposed_seconds: float | None = None
    #: Bytes of the collectives' buffers (the payload each rank contributes).
    comm_bytes: int | None = None
    #: Checkpoints the reporter completed, cumulative; ``None`` where it does
    #: not report checkpoints (unknown, not zero).
    checkpoints: int | None = None
    #: Seconds spent saving those checkpoints, cumulative (``None`` with ``checkpoints``).
    checkpoint_seconds: float | None = None
    #: Unix time (seconds) at which the last checkpoint save completed.
    last_checkpoint_time: float | None = None
    #: Absolute path of the last checkpoint written (as the training process sees it).
    checkpoint_path: str | None = None


def sanitize_label(value: str, max_length: int = DEFAULT_MAX_LABEL_LENGTH) -> str:
    """Map any string onto the label charset (client side): ``"my job"`` → ``"my_job"``."""
    cleaned = _LABEL_FORBIDDEN.sub("_", value)[:max_length]
    return cleaned or "_"


def encode_report(report: Mapping[str, object]) -> bytes:
    """One report as a compact JSON line (with its newline); NaN/Inf raise ``ValueError``."""
    return json.dumps(report, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def decode_payload(
    payload: bytes, max_label_length: int = DEFAULT_MAX_LABEL_LENGTH
) -> Iterator[StepReport | ReportError]:
    """Split a payload into lines and parse each one; blank lines are skipped.

    Yields a ``StepReport`` for each valid line and a ``ReportError`` for each
    invalid one, so one bad line does not cost the others.
    """
    for line in payload.split(b"\n"):
        line = line.rstrip(b"\r")
        if not line.strip():
            continue
        try:
            yield parse_report(line, max_label_length)
        except ReportError as error:
            yield error


def parse_report(line: bytes, max_label_length: int = DEFAULT_MAX_LABEL_LENGTH) -> StepReport:
    """Validate one JSON line into a ``StepReport``; raises ``ReportError``."""
    if len(line) > MAX_LINE_BYTES:
        raise ReportError("too_large", f"line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise ReportError("malformed", "not UTF-8") from None
    try:
        data = _DECODER.decode(text)
    except _NonFiniteNumber as error:
        raise ReportError("invalid_field", f"non-finite number {error}") from None
    except (ValueError, RecursionError) as error:
        raise ReportError("malformed", f"not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ReportError("malformed", "a report must be a JSON object")
    if data.get("v") != PROTOCOL_VERSION or isinstance(data.get("v"), bool):
        raise ReportError("unsupported_version", f"expected \"v\": 1, got {data.get('v')!r}")
    return _build(data, max_label_length)


class _NonFiniteNumber(ValueError):
    pass


def _reject_constant(name: str) -> float:
    raise _NonFiniteNumber(name)


#: JSON's NaN / Infinity / -Infinity extensions are errors, not floats.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _build(data: dict[str, object], max_label_length: int) -> StepReport:
    steps = _count(data, "steps")
    buckets = data.get("step_buckets")
    if (
        not isinstance(buckets, list)
        or len(buckets) != STEP_BUCKET_COUNT
        or not all(type(count) is int for count in buckets)  # not bool, not float
        or min(buckets) < 0
    ):
        raise ReportError(
            "invalid_field", f"step_buckets must be a list of {STEP_BUCKET_COUNT} counts"
        )
    if sum(buckets) != steps:
        raise ReportError("invalid_field", "step_buckets must add up to steps")
    step_seconds = _seconds(data, "step_seconds")
    data_wait = _seconds(data, "data_wait_seconds")
    if data_wait > step_seconds * (1 + 1e-9) + 1e-6:
        raise ReportError("invalid_field", "data_wait_seconds exceeds step_seconds")
    world_size = _optional_int(data, "world_size", 1, MAX_RANK)
    rank = _integer(data, "rank", 0, MAX_RANK)
    if world_size is not None and rank >= world_size:
        raise ReportError("invalid_field", "rank must be below world_size")
    reporter_id = data.get("reporter_id")
    if not isinstance(reporter_id, str) or not REPORTER_ID_PATTERN.fullmatch(reporter_id):
        raise ReportError("invalid_field", "reporter_id must match [A-Za-z0-9_-]{1,64}")
    last_step = data.get("last_step_time")
    comm, exposed, comm_bytes = _comm(data, step_seconds)
    checkpoints, checkpoint_seconds, last_checkpoint, checkpoint_path = _checkpoint(data)
    return StepReport(
        job=_label(data.get("job"), "job", max_label_length),
        rank=rank,
        reporter_id=reporter_id,
        steps=steps,
        samples=_count(data, "samples"),
        step_seconds=step_seconds,
        data_wait_seconds=data_wait,
        step_buckets=tuple(buckets),
        phase_seconds=_phases(data.get("phase_seconds", {}), max_label_length),
        dropped_reports=_count(data, "dropped_reports", default=0),
        local_rank=_optional_int(data, "local_rank", 0, MAX_RANK),
        world_size=world_size,
        gpu=_gpu(data.get("gpu")),
        pid=_optional_int(data, "pid", 1, MAX_RANK),
        last_step_time=None if last_step is None else _seconds(data, "last_step_time"),
        comm_seconds=comm,
        comm_exposed_seconds=exposed,
        comm_bytes=comm_bytes,
        checkpoints=checkpoints,
        checkpoint_seconds=checkpoint_seconds,
        last_checkpoint_time=last_checkpoint,
        checkpoint_path=checkpoint_path,
    )


def _comm(
    data: Mapping[str, object], step_seconds: float
) -> tuple[float | None, float | None, int | None]:
    """The optional measured-communication totals: each absent (None) or valid."""
    comm = None if data.get("comm_seconds") is None else _seconds(data, "comm_seconds")
    exposed = (
        None if data.get("comm_exposed_seconds") is None
        else _seconds(data, "comm_exposed_seconds")
    )
    comm_bytes = None if data.get("comm_bytes") is None else _count(data, "comm_bytes")
    if exposed is not None:
        if comm is None or exposed > comm * (1 + 1e-9) + 1e-6:
            raise ReportError("invalid_field", "comm_exposed_seconds exceeds comm_seconds")
        if exposed > step_seconds * (1 + 1e-9) + 1e-6:
            raise ReportError("invalid_field", "comm_exposed_seconds exceeds step_seconds")
    return comm, exposed, comm_bytes


def _checkpoint(
    data: Mapping[str, object],
) -> tuple[int | None, float | None, float | None, str | None]:
    """The optional checkpoint fields: each absent (None) or valid, and consistent.

    ``checkpoints`` is the anchor: ``checkpoint_seconds`` requires it (and is
    0 when it is absent with it), ``last_checkpoint_time`` and
    ``checkpoint_path`` require ``checkpoints >= 1`` (no checkpoint has no
    time or path). ``checkpoint_path`` is absolute, at most
    ``MAX_PATH_BYTES`` bytes of UTF-8 and free of control characters; it is
    rejected, never rewritten.
    """
    checkpoints = None if data.get("checkpoints") is None else _count(data, "checkpoints")
    seconds = (
        None if data.get("checkpoint_seconds") is None else _seconds(data, "checkpoint_seconds")
    )
    last = (
        None if data.get("last_checkpoint_time") is None
        else _seconds(data, "last_checkpoint_time")
    )
    path = data.get("checkpoint_path")
    if checkpoints is None:
        if seconds is not None or last is not None or path is not None:
            raise ReportError(
                "invalid_field",
                "checkpoint_seconds, last_checkpoint_time and checkpoint_path need checkpoints",
            )
        return None, None, None, None
    if checkpoints == 0 and (last is not None or path is not None):
        raise ReportError(
            "invalid_field", "last_checkpoint_time and checkpoint_path need checkpoints >= 1"
        )
    if path is not None:
        path = _path(path)
    return checkpoints, 0.0 if seconds is None else seconds, last, path


#: C0 controls and DEL; C1 controls (U+0080-U+009F) as well.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _path(value: object) -> str:
    if not isinstance(value, str):
        raise ReportError("invalid_field", "checkpoint_path must be a string")
    if not value.startswith("/"):
        raise ReportError("invalid_field", "checkpoint_path must be an absolute path")
    if _CONTROL.search(value):
        raise ReportError("invalid_field", "checkpoint_path must not hold control characters")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate from a "\ud800" escape
        raise ReportError("invalid_field", "checkpoint_path must be valid Unicode") from None
    if size > MAX_PATH_BYTES:
        raise ReportError(
            "invalid_field", f"checkpoint_path of {size} bytes exceeds {MAX_PATH_BYTES}"
        )
    return value


def _integer(data: Mapping[str, object], key: str, minimum: int, maximum: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReportError("invalid_field", f"{key} must be an integer")
    if not minimum <= value <= maximum:
        raise ReportError("invalid_field", f"{key} must be within {minimum}..{maximum}")
    return value


def _optional_int(data: Mapping[str, object], key: str, minimum: int, maximum: int) -> int | None:
    return None if data.get(key) is None else _integer(data, key, minimum, maximum)


def _count(data: Mapping[str, object], key: str, default: int | None = None) -> int:
    if default is not None and data.get(key) is None:
        return default
    return _integer(data, key, 0, MAX_COUNT)


def _seconds(data: Mapping[str, object], key: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportError("invalid_field", f"{key} must be a number")
    number = float(value)
    if not math.isfinite(number) or number < 0 or number > MAX_COUNT:
        raise ReportError("invalid_field", f"{key} must be finite and non-negative")
    return number


def _label(value: object, what: str, max_length: int) -> str:
    if not isinstance(value, str):
        raise ReportError("invalid_field", f"{what} must be a string")
    if not 1 <= len(value) <= max_length or not LABEL_PATTERN.fullmatch(value):
        raise ReportError(
            "invalid_label", f"{what} must be 1-{max_length} characters of [A-Za-z0-9_.:@/+-]"
        )
    return value


def _phases(value: object, max_label_length: int) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ReportError("invalid_field", "phase_seconds must be an object")
    if len(value) > MAX_PHASES:
        raise ReportError("limit", f"more than {MAX_PHASES} phases")
    return {
        _label(name, "phase name", max_label_length): _seconds(value, name)
        for name in value
    }


def _gpu(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 9999:
        return str(value)
    if isinstance(value, str) and GPU_PATTERN.fullmatch(value):
        return str(int(value))
    raise ReportError("invalid_field", "gpu must be a decimal device index or null")
