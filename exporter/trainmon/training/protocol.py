"""Training step protocol v1: the wire format shared by the client and the daemon.

A payload (one unix datagram or one ``POST /api/v1/steps`` body) holds
newline-delimited JSON objects, one **report** per line. A report carries the
*cumulative* totals of one reporter since it started plus its identity, so a
lost or repeated report loses nothing but freshness. A line with
``"type": "run"`` is instead a **run description** (``RunDescription``): what
the run is (its id, configuration, environment, data, versions), sent at
start, on change, every minute and at the end, so the daemon's run ledger can
compare it with earlier runs. The field-by-field specification, written for
implementers in other languages, is ``docs/protocol.md``; this module is its
executable form. A report's fields are defined once, in
``trainmon.training.report_fields`` (``REPORT_FIELDS``): the client builds its
reports from that table and ``parse`` validates them against it.

Standard library only: the training-side client imports the constants,
``encode_report`` and the secret rule (``trainmon.training.redaction``, re-exported
here: ``is_secret_name``, ``redact_text``...) from here, so the client and the
daemon redact exactly the same way.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import cast

from trainmon.contract import STEP_BUCKET_COUNT, STEP_SKETCH_MAX_BUCKETS

# the secret rule (``trainmon.training.redaction``), re-exported for the client and the daemon
from trainmon.training.redaction import REDACTED as REDACTED
from trainmon.training.redaction import SECRET_NAME_PARTS as SECRET_NAME_PARTS
from trainmon.training.redaction import is_secret_name as is_secret_name
from trainmon.training.redaction import redact_code as redact_code
from trainmon.training.redaction import redact_text as redact_text
from trainmon.training.redaction import redact_value as redact_value
from trainmon.training.report_fields import (
    COMM_GROUP_FIELDS,
    DEFAULT_MAX_LABEL_LENGTH,
    GPU_PATTERN,
    LABEL_PATTERN,
    MAX_COMM_GROUPS,
    MAX_COUNT,
    MAX_GPU_INDEX,
    MAX_GROUP_NAME_LENGTH,
    MAX_PATH_BYTES,
    MAX_PHASES,
    MAX_RANK,
    PROTOCOL_VERSION,
    REPORT_FIELDS,
    REPORTER_ID_PATTERN,
    RUN_ID_PATTERN,
    CommGroup,
    ReportField,
)
from trainmon.training.sketch import from_wire as sketch_from_wire

#: The daemon's HTTP route for step reports (also the client's default path).
STEPS_PATH = "/api/v1/steps"

#: Largest unix datagram the daemon reads; a longer one is rejected whole.
MAX_DATAGRAM_BYTES = 65_536
#: Largest single report line (bytes of UTF-8, without the newline).
MAX_LINE_BYTES = 16_384
#: Most lines in one payload (datagram or POST body). The Python client sends
#: one or two (a report and its run description); a payload with more is
#: refused whole, counted once as ``too_large``, before any line is parsed, so
#: the cost of a hostile payload stays linear in its bytes with a tiny constant
#: (``payload.count``), however many lines it holds.
MAX_PAYLOAD_LINES = 64
_LABEL_FORBIDDEN = re.compile(r"[^A-Za-z0-9_.:@/+-]")

#: Every reason a report can be rejected for; the value set of the ``reason``
#: label of ``trainmon_training_rejected_reports_total``.
REJECT_REASONS: tuple[str, ...] = (
    "malformed",            # not UTF-8, not JSON, not an object, truncated
    "too_large",            # datagram, body or line over its size cap
    "unsupported_version",  # "v" is not 1
    "invalid_field",        # missing field, wrong type, NaN/Inf/negative, inconsistent totals
    "invalid_label",        # job or phase name too long or outside the charset
    "limit",                # over a cap: phases of a rank, jobs (docs/security.md)
    "unauthorized",         # no identity: no valid bearer token, no known loopback user
    "forbidden",            # the job belongs to another writer (docs/security.md)
)

_RUN_ID_FORBIDDEN = re.compile(r"[^A-Za-z0-9_.:-]")
#: ``config_hash``: "sha256:" + the first 16 hex digits of the digest.
CONFIG_HASH_PATTERN = re.compile(r"sha256:[0-9a-f]{16}")
#: Most keys of ``config``, ``environment`` and ``framework`` (each).
MAX_DESCRIPTION_KEYS = 64
#: Longest key of ``config`` / ``framework`` and name in ``environment``, characters.
MAX_DESCRIPTION_KEY_LENGTH = 128
#: Longest string value in ``config``, ``environment`` and ``framework``, characters.
MAX_DESCRIPTION_VALUE_LENGTH = 256
#: Most ``data_paths``.
MAX_DATA_PATHS = 8
#: Most ``versions`` entries; their names and values.
MAX_VERSIONS = 16
VERSION_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_VERSION_LENGTH = 128
#: ``host``: a hostname's characters, at most 253 of them.
HOST_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,253}")
#: Environment variable names (POSIX portable names).
ENVIRONMENT_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: A git commit id: SHA-1 (40 hex digits) or SHA-256 (64) object names.
GIT_COMMIT_PATTERN = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
#: The values of ``ended``, how the process says its run ended: ``finished``
#: (a clean end), ``crashed`` (an exception ended it: ``sys.excepthook``,
#: ``threading.excepthook`` on the training thread, a failed ``mp.spawn``
#: worker), ``preempted`` (SIGTERM: a scheduler, a spot reclaim). A run whose
#: reporters fall silent without a word is ``lost``; the daemon concludes that.
RUN_END_REASONS: tuple[str, ...] = ("finished", "crashed", "preempted")
#: Seconds between repeats of an unchanged run description (a restarted
#: daemon learns the run within this long).
RUN_DESCRIPTION_INTERVAL_SECONDS = 60.0

#: ``where`` of a stall line: what the rank's training thread is doing when its steps
#: stopped (docs/protocol.md, "Stall reports").
STALL_WHERE: tuple[str, ...] = ("data_loader", "collective", "checkpoint", "phase", "code")
#: Most frames of a stall line, innermost first; their fields' longest texts.
MAX_STALL_FRAMES = 16
MAX_FRAME_FILE_LENGTH = 256
MAX_FRAME_FUNCTION_LENGTH = 128
MAX_FRAME_CODE_LENGTH = 160
#: A collective's name (``all_reduce``, ``barrier``...): letters, digits and ``_``.
COLLECTIVE_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

#: A profile request's id (``"type": "profile"`` lines; ``trainmon.profiling``).
PROFILE_ID_PATTERN = re.compile(r"[0-9a-f]{8,64}")
#: Most operators of each list of a profile line (``top_cpu``, ``top_device``).
MAX_PROFILE_OPERATORS = 10
#: Longest operator name of a profile line, characters (``aten::...`` names are short;
#: a user's ``record_function`` label may not be).
MAX_OPERATOR_NAME_LENGTH = 200
#: Longest ``error`` text of a profile line, characters.
MAX_PROFILE_ERROR_LENGTH = 300
#: Most steps one profile may cover (``trainmon profile --steps``).
MAX_PROFILE_STEPS = 1000


class ReportError(ValueError):
    """A report (or a whole payload) that the daemon refuses, with its reason."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REJECT_REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class StepReport:
    """One validated report: a reporter's identity and its cumulative totals.

    One attribute per field of ``REPORT_FIELDS`` but ``v``, of the same name.
    """

    job: str
    rank: int
    reporter_id: str
    steps: int
    samples: int
    step_seconds: float
    data_wait_seconds: float
    step_buckets: tuple[int, ...]
    #: Step durations by sketch bucket (``trainmon.training.sketch``) at
    #: ``step_sketch_level``, cumulative; None from clients that do not send it.
    step_sketch: Mapping[int, int] | None = None
    #: 0 (buckets of 1 %) to ``sketch.MAX_LEVEL``; None without ``step_sketch``.
    step_sketch_level: int | None = None
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
    #: The run this reporter belongs to (``RUN_ID_PATTERN``); None from old clients.
    run: str | None = None
    #: Collectives the rank launched so far (``Reporter.instrument``'s DDP buckets): the
    #: rank whose count lags the others' holds a hung job; None where not measured.
    collective_seq: int | None = None
    #: Communication per process group, by the group's name (``dp``, ``tp``, ``pp``...),
    #: cumulative; None where the reporter does not measure it (unknown, not zero).
    comm_groups: Mapping[str, CommGroup] | None = None


#: A value of ``config`` / ``framework``: JSON scalars only.
ConfigValue = str | int | float | bool | None


@dataclass(frozen=True)
class RunDescription:
    """One validated run description: what a reporter's run is, not how it goes.

    Secret-looking keys (``is_secret_name``) already hold ``REDACTED`` here,
    whatever the sender did, and every string (values, keys, data paths, versions)
    went through the secret rule (``redact_text``: URL credentials, secret
    parameters, token shapes), so nothing downstream can store or export a secret.
    """

    job: str
    rank: int
    reporter_id: str
    run: str
    #: Unix time (seconds) at which the reporter started.
    started: float
    world_size: int | None
    #: ``"sha256:"`` + 16 hex digits over the whole redacted config (``config_hash``),
    #: also over keys the sender had to leave out of ``config``.
    config_hash: str
    config: Mapping[str, ConfigValue]
    #: NCCL_*, TORCH_*, PYTORCH_*, CUDA_*, OMP_* variables of the process.
    environment: Mapping[str, str]
    #: Absolute paths of the training data, as the training process sees them.
    data_paths: tuple[str, ...]
    #: ``python``, ``trainmon``, and ``torch`` / ``cuda`` / ``nccl`` when known.
    versions: Mapping[str, str]
    git_commit: str | None
    #: Uncommitted changes: None (unknown) from the Python client.
    git_dirty: bool | None
    host: str
    #: What a framework callback knows: hyper-parameters, batch size, precision.
    framework: Mapping[str, ConfigValue]
    #: None while the run goes on, ``"finished"`` in the last description of a clean end.
    ended: str | None = None


@dataclass(frozen=True)
class StallFrame:
    """One Python frame of a stalled rank's training thread; its texts went through the
    secret rule (``redact_text``, ``redact_code``)."""

    file: str
    line: int
    function: str
    #: The source line (stripped), ``REDACTED`` where it names a secret; "" unknown.
    code: str = ""


@dataclass(frozen=True)
class StallReport:
    """A rank whose steps stopped, and where its training thread is (a ``"type":
    "stall"`` line: docs/protocol.md, "Stall reports"). It holds while the rank's
    steps stay at ``steps``; a report with more steps clears it."""

    job: str
    rank: int
    reporter_id: str
    run: str | None
    #: The rank's completed steps when its thread was looked at.
    steps: int
    #: Unix time its last step ended (or its loop started): the stall's start.
    since: float
    where: str
    #: The named phase the thread is in (``where`` ``phase``), else None.
    phase: str | None
    #: The collective in flight (``where`` ``collective``): its name, its sequence
    #: number on the process group, the Unix time it started; None where unknown.
    collective: str | None
    collective_seq: int | None
    collective_since: float | None
    #: Innermost first.
    frames: tuple[StallFrame, ...]
    #: The process group of the collective in flight (``dp``, ``tp``...; the
    #: ``comm_groups`` names of its reports); None where unknown.
    collective_group: str | None = None


@dataclass(frozen=True)
class ProfiledOperator:
    """One operator of a profile's summary: its name, its self time over the profiled
    steps, that time's share of all operators' self time, and how often it ran."""

    name: str
    self_seconds: float
    share: float
    calls: int


@dataclass(frozen=True)
class ProfileReport:
    """What a rank's profile of a few steps found (a ``"type": "profile"`` line:
    docs/protocol.md, "Profiles"); its trace travels beside it, as a file descriptor
    (``trainmon.profiling``). ``error`` set: the profile failed, and says why."""

    job: str
    rank: int
    reporter_id: str
    run: str | None
    #: The request it answers (``trainmon profile``).
    id: str
    #: Steps profiled, and the wall seconds they took under the profiler.
    steps: int
    seconds: float
    #: The operators with the most self time on the CPU and on the device (GPU), most
    #: first, at most ``MAX_PROFILE_OPERATORS`` each; and all operators' self time.
    top_cpu: tuple[ProfiledOperator, ...] = ()
    top_device: tuple[ProfiledOperator, ...] = ()
    self_cpu_seconds: float | None = None
    self_device_seconds: float | None = None
    error: str | None = None


#: One valid line of a payload.
Line = StepReport | RunDescription | StallReport | ProfileReport


def config_hash(config: Mapping[str, ConfigValue]) -> str:
    """``"sha256:"`` + the first 16 hex digits of SHA-256 over the canonical JSON
    (sorted keys, ``,``/``:`` separators, ASCII escapes) of the flattened,
    redacted config; ``{}`` when there is none."""
    canonical = json.dumps(
        dict(config), sort_keys=True, separators=(",", ":"), allow_nan=False,
    )
    import hashlib  # here: a description is rare; the daemon loads libcrypto only then

    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def sanitize_run_id(value: str) -> str:
    """Map any string onto the run id charset (client side): ``"exp 7/a"`` → ``"exp_7_a"``."""
    cleaned = _RUN_ID_FORBIDDEN.sub("_", value)[:64]
    return cleaned or "_"


def sanitize_label(value: str, max_length: int = DEFAULT_MAX_LABEL_LENGTH) -> str:
    """Map any string onto the label charset (client side): ``"my job"`` → ``"my_job"``."""
    cleaned = _LABEL_FORBIDDEN.sub("_", value)[:max_length]
    return cleaned or "_"


#: The environment variable that names a process's training job ...
JOB_VARIABLE = "TRAINMON_JOB"
#: ... and the job of a process that names none.
DEFAULT_JOB = "unnamed"


def job_name(environ: Mapping[str, str], job: str | None = None) -> str:
    """The job a process reports for: ``job``, else ``TRAINMON_JOB``, else ``unnamed``,
    with URL credentials cut out and mapped onto the label charset. The client names
    its reports so, and the daemon a GPU process that does not report (its
    ``idle_allocated`` GPU-seconds, docs/metrics.md)."""
    raw = job if job is not None else environ.get(JOB_VARIABLE, DEFAULT_JOB)
    # URL credentials out first: the label charset keeps ``:``, ``/`` and ``@``
    return sanitize_label(redact_text(str(raw)), DEFAULT_MAX_LABEL_LENGTH)


#: One encoder for every line: ``json.dumps`` with options builds a new one per call.
_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def encode_report(report: Mapping[str, object]) -> bytes:
    """One report as a compact JSON line (with its newline); NaN/Inf raise ``ValueError``."""
    return _ENCODE(report).encode() + b"\n"


def decode_payload(
    payload: bytes, max_label_length: int = DEFAULT_MAX_LABEL_LENGTH
) -> Iterator[Line | ReportError]:
    """Split a payload into lines and parse each one; blank lines are skipped.

    Yields a ``StepReport``, ``RunDescription``, ``StallReport`` or ``ProfileReport``
    for each valid line and a
    ``ReportError`` for each invalid one, so one bad line does not cost the others.
    A payload of more than ``MAX_PAYLOAD_LINES`` lines yields one ``too_large``
    error and nothing else.
    """
    lines = payload.count(b"\n") + (0 if payload.endswith(b"\n") else 1)
    if lines > MAX_PAYLOAD_LINES:
        yield ReportError(
            "too_large", f"payload of {lines} lines exceeds {MAX_PAYLOAD_LINES} lines")
        return
    for line in payload.split(b"\n"):
        line = line.rstrip(b"\r")
        if not line.strip():
            continue
        try:
            yield parse(line, max_label_length)
        except ReportError as error:
            yield error


def parse(
    line: bytes, max_label_length: int = DEFAULT_MAX_LABEL_LENGTH
) -> Line:
    """Validate one JSON line: a step report (``type`` absent or ``"step"``), a run
    description (``"type": "run"``), a stall report (``"type": "stall"``) or a
    profile's result (``"type": "profile"``); raises ``ReportError``."""
    data = _decode_line(line)
    kind = data.get("type", "step")
    if kind == "step":
        return _build(data, max_label_length)
    if kind == "run":
        return _build_description(data, max_label_length)
    if kind == "stall":
        return _build_stall(data, max_label_length)
    if kind == "profile":
        return _build_profile(data, max_label_length)
    raise ReportError("invalid_field",
                      f"unknown type {str(kind)[:32]!r} (expected step, run, stall or profile)")


def parse_report(line: bytes, max_label_length: int = DEFAULT_MAX_LABEL_LENGTH) -> StepReport:
    """Validate one step report line into a ``StepReport``; raises ``ReportError``
    (``invalid_field`` for a line of another ``type``)."""
    parsed = parse(line, max_label_length)
    if not isinstance(parsed, StepReport):
        raise ReportError("invalid_field", "a run description, not a step report")
    return parsed


def _decode_line(line: bytes) -> dict[str, object]:
    """Size, UTF-8, JSON, object and version checks common to every line type."""
    if len(line) > MAX_LINE_BYTES:
        raise ReportError("too_large", f"line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    if line[:1] != b"{" and not line.lstrip(b" \t").startswith(b"{"):  # junk: refused at once
        raise ReportError("malformed", "a report must be a JSON object")
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
    return data


class _NonFiniteNumber(ValueError):
    pass


def _reject_constant(name: str) -> float:
    raise _NonFiniteNumber(name)


#: JSON's NaN / Infinity / -Infinity extensions are errors, not floats.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _build(data: dict[str, object], max_label_length: int) -> StepReport:
    """Check every field of ``REPORT_FIELDS`` in order, then their relations."""
    values: dict[str, object] = {}
    get = data.get
    for name, check, spec, absent_if_none in _FIELD_CHECKS:
        value = get(name)
        if value is None and absent_if_none and (spec.nullable or name not in data):
            values[name] = (
                None if spec.absent is None else check(spec, spec.absent, max_label_length))
        else:
            values[name] = check(spec, value, max_label_length)
    for relation in _RELATIONS:
        relation(values)
    return StepReport(**values)  # type: ignore[arg-type]  # checked above, by kind


# -- the checks of each kind of field: (field, value, max_label_length) -> checked value


def _check_integer(spec: ReportField, value: object, max_label_length: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReportError("invalid_field", f"{spec.name} must be an integer")
    if not spec.minimum <= value <= spec.maximum:
        raise ReportError(
            "invalid_field", f"{spec.name} must be within {spec.minimum}..{spec.maximum}")
    return value


def _check_number(spec: ReportField, value: object, max_label_length: int) -> float:
    return _seconds_value(spec.name, value)


def _check_label(spec: ReportField, value: object, max_label_length: int) -> str:
    return _label(value, spec.name, max_label_length)


def _check_reporter_id(spec: ReportField, value: object, max_label_length: int) -> str:
    if not isinstance(value, str) or not REPORTER_ID_PATTERN.fullmatch(value):
        raise ReportError("invalid_field", f"{spec.name} must match [A-Za-z0-9_-]{{1,64}}")
    return value


def _check_run_id(spec: ReportField, value: object, max_label_length: int) -> str:
    return _run_id(value)


def _check_gpu(spec: ReportField, value: object, max_label_length: int) -> str | None:
    return _gpu(value)


def _check_path(spec: ReportField, value: object, max_label_length: int) -> str:
    return redact_text(_path(value, spec.name))


def _check_buckets(spec: ReportField, value: object, max_label_length: int) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or len(value) != STEP_BUCKET_COUNT
        or not all(type(count) is int for count in value)  # not bool, not float
        or min(value) < 0
    ):
        raise ReportError(
            "invalid_field", f"{spec.name} must be a list of {STEP_BUCKET_COUNT} counts"
        )
    return tuple(value)


def _check_sketch(spec: ReportField, value: object, max_label_length: int) -> dict[int, int]:
    """A step sketch (``trainmon.training.sketch.from_wire``): ``limit`` past
    ``STEP_SKETCH_MAX_BUCKETS`` buckets, ``invalid_field`` for anything malformed."""
    try:
        return sketch_from_wire(value, STEP_SKETCH_MAX_BUCKETS)
    except OverflowError as error:
        raise ReportError("limit", f"{spec.name} {error}") from None
    except ValueError as error:
        raise ReportError("invalid_field", f"{spec.name}: {error}") from None


def _check_phases(spec: ReportField, value: object, max_label_length: int) -> dict[str, float]:
    return _phases(value, max_label_length)


def _check_comm_groups(
    spec: ReportField, value: object, max_label_length: int
) -> dict[str, CommGroup]:
    """At most ``MAX_COMM_GROUPS`` groups (``limit`` past it), each named by the label
    rules within ``MAX_GROUP_NAME_LENGTH`` (``invalid_label``), each an object of the
    keys of ``COMM_GROUP_FIELDS`` only, checked by kind and ``at_most`` within it."""
    if not isinstance(value, dict):
        raise ReportError("invalid_field", f"{spec.name} must be an object")
    if len(value) > MAX_COMM_GROUPS:
        raise ReportError("limit", f"more than {MAX_COMM_GROUPS} {spec.name}")
    return {
        _label(name, f"{spec.name} name", MAX_GROUP_NAME_LENGTH):
            _comm_group(f"{spec.name}.{name}", group, max_label_length)
        for name, group in value.items()
    }


def _comm_group(what: str, value: object, max_label_length: int) -> CommGroup:
    if not isinstance(value, dict):
        raise ReportError("invalid_field", f"{what} must be an object")
    unknown = value.keys() - _GROUP_FIELDS_BY_NAME.keys()
    if unknown:
        raise ReportError("invalid_field", f"{what} has an unknown key "
                                           f"{str(min(unknown))[:32]!r}")
    values: dict[str, object] = {}
    try:
        for spec in COMM_GROUP_FIELDS:
            item = value.get(spec.name)
            values[spec.name] = (
                None if item is None and not spec.required
                else _CHECKS[spec.kind](spec, item, max_label_length))
        for relation in _GROUP_RELATIONS:
            relation(values)
    except ReportError as error:
        raise ReportError(error.reason, f"{what}.{error.detail}") from None
    return CommGroup(**values)  # type: ignore[arg-type]  # checked above, by kind


_FieldCheck = Callable[[ReportField, object, int], object]
_CHECKS: Mapping[str, _FieldCheck] = {
    "integer": _check_integer, "number": _check_number, "label": _check_label,
    "reporter_id": _check_reporter_id, "run_id": _check_run_id, "gpu": _check_gpu,
    "path": _check_path, "buckets": _check_buckets, "phases": _check_phases,
    "comm_groups": _check_comm_groups, "sketch": _check_sketch,
}
_GROUP_FIELDS_BY_NAME: Mapping[str, ReportField] = {spec.name: spec for spec in COMM_GROUP_FIELDS}
#: (name, check, field, None means absent) of every field but ``v`` (checked by
#: ``_decode_line`` for every line type), in ``REPORT_FIELDS`` order.
_FIELD_CHECKS: tuple[tuple[str, _FieldCheck, ReportField, bool], ...] = tuple(
    (spec.name, _CHECKS[spec.kind], spec, not spec.required)
    for spec in REPORT_FIELDS if spec.kind != "version")


# -- the relations between fields, compiled from the schema once ---------------------

_Relation = Callable[[dict[str, object]], None]


def _adds_up_to(name: str, total: str) -> _Relation:
    """The counts of a list, or the values of an object (a sketch), add up to ``total``;
    an absent field (None) is not checked."""
    message = f"{name} must add up to {total}"

    def check(values: dict[str, object]) -> None:
        counts = values[name]
        if counts is None:
            return
        if isinstance(counts, Mapping):
            counts = counts.values()
        if sum(counts) != values[total]:  # type: ignore[call-overload]
            raise ReportError("invalid_field", message)
    return check


def _below(name: str, bound: str) -> _Relation:
    message = f"{name} must be below {bound}"

    def check(values: dict[str, object]) -> None:
        limit = values[bound]
        if limit is not None and values[name] >= limit:  # type: ignore[operator]
            raise ReportError("invalid_field", message)
    return check


def _at_most(name: str, bound: str) -> _Relation:
    """Not above ``bound`` (relative slack 1e-9, absolute 1e-6); a missing bound fails."""
    message = f"{name} exceeds {bound}"

    def check(values: dict[str, object]) -> None:
        value, limit = values[name], values[bound]
        if value is not None and (
                limit is None or value > limit * (1 + 1e-9) + 1e-6):  # type: ignore[operator]
            raise ReportError("invalid_field", message)
    return check


def _groups_at_most(name: str, bound: str) -> _Relation:
    """Each group's ``exposed_seconds`` not above ``bound`` (``_at_most``'s slack)."""

    def check(values: dict[str, object]) -> None:
        groups = cast("Mapping[str, CommGroup] | None", values[name])
        limit = cast("float | None", values[bound])
        for group_name, group in (groups or {}).items():
            exposed = group.exposed_seconds
            if exposed is not None and (limit is None or exposed > limit * (1 + 1e-9) + 1e-6):
                raise ReportError("invalid_field",
                                  f"{name}.{group_name}.exposed_seconds exceeds {bound}")
    return check


def _needs(anchor: str, dependents: list[ReportField]) -> _Relation:
    """The fields that need ``anchor``: none of them without it, those that need it at
    some count only with that many; ``default_with_needed`` where absent with it."""
    names = [spec.name for spec in dependents]
    thresholds = [
        (least, [spec.name for spec in dependents if spec.needs_at_least >= least])
        for least in sorted({spec.needs_at_least for spec in dependents if spec.needs_at_least})
    ]
    missing = f"{_and(names)} need {anchor}"
    short = {least: f"{_and(fields)} need {anchor} >= {least}" for least, fields in thresholds}
    defaults = [(spec.name, spec.default_with_needed) for spec in dependents
                if spec.default_with_needed is not None]

    def check(values: dict[str, object]) -> None:
        count = values[anchor]
        if count is None:
            if any(values[name] is not None for name in names):
                raise ReportError("invalid_field", missing)
            return
        for least, fields in thresholds:
            if count < least and any(  # type: ignore[operator]
                    values[name] is not None for name in fields):
                raise ReportError("invalid_field", short[least])
        for name, default in defaults:
            if values[name] is None:
                values[name] = default
    return check


def _and(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _relations() -> tuple[_Relation, ...]:
    """Every relation of ``REPORT_FIELDS``, in its order (``needs``: once, at the first
    field that needs the anchor)."""
    relations: list[_Relation] = []
    anchors: set[str] = set()
    for spec in REPORT_FIELDS:
        if spec.adds_up_to is not None:
            relations.append(_adds_up_to(spec.name, spec.adds_up_to))
        if spec.below is not None:
            relations.append(_below(spec.name, spec.below))
        bounded = _groups_at_most if spec.kind == "comm_groups" else _at_most
        relations.extend(bounded(spec.name, bound) for bound in spec.at_most)
        if spec.needs is not None and spec.needs not in anchors:
            anchors.add(spec.needs)
            relations.append(_needs(spec.needs, [
                other for other in REPORT_FIELDS if other.needs == spec.needs]))
    return tuple(relations)


_RELATIONS = _relations()
#: ``at_most`` within one ``comm_groups`` value (``exposed_seconds`` ≤ ``seconds``).
_GROUP_RELATIONS: tuple[_Relation, ...] = tuple(
    _at_most(spec.name, bound) for spec in COMM_GROUP_FIELDS for bound in spec.at_most)


#: C0 controls and DEL; C1 controls (U+0080-U+009F) as well.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _path(value: object, what: str = "checkpoint_path") -> str:
    if not isinstance(value, str):
        raise ReportError("invalid_field", f"{what} must be a string")
    if not value.startswith("/"):
        raise ReportError("invalid_field", f"{what} must be an absolute path")
    if _CONTROL.search(value):
        raise ReportError("invalid_field", f"{what} must not hold control characters")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate from a "\ud800" escape
        raise ReportError("invalid_field", f"{what} must be valid Unicode") from None
    if size > MAX_PATH_BYTES:
        raise ReportError(
            "invalid_field", f"{what} of {size} bytes exceeds {MAX_PATH_BYTES}"
        )
    return value


def _integer(data: Mapping[str, object], key: str, minimum: int, maximum: int) -> int:
    return _integer_value(key, data.get(key), minimum, maximum)


def _integer_value(key: str, value: object, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReportError("invalid_field", f"{key} must be an integer")
    if not minimum <= value <= maximum:
        raise ReportError("invalid_field", f"{key} must be within {minimum}..{maximum}")
    return value


def _optional_int(data: Mapping[str, object], key: str, minimum: int, maximum: int) -> int | None:
    return None if data.get(key) is None else _integer(data, key, minimum, maximum)


def _seconds(data: Mapping[str, object], key: str) -> float:
    return _seconds_value(key, data.get(key))


def _seconds_value(key: str, value: object) -> float:
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
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_GPU_INDEX:
        return str(value)
    if isinstance(value, str) and GPU_PATTERN.fullmatch(value):
        return str(int(value))
    raise ReportError("invalid_field", "gpu must be a decimal device index or null")


def _identity(data: dict[str, object]) -> tuple[int, int | None, str]:
    """``rank``, ``world_size`` and ``reporter_id``, shared by both kinds of line."""
    world_size = _optional_int(data, "world_size", 1, MAX_RANK)
    rank = _integer(data, "rank", 0, MAX_RANK)
    if world_size is not None and rank >= world_size:
        raise ReportError("invalid_field", "rank must be below world_size")
    reporter_id = data.get("reporter_id")
    if not isinstance(reporter_id, str) or not REPORTER_ID_PATTERN.fullmatch(reporter_id):
        raise ReportError("invalid_field", "reporter_id must match [A-Za-z0-9_-]{1,64}")
    return rank, world_size, reporter_id


# -- run descriptions -----------------------------------------------------------


def _build_description(data: dict[str, object], max_label_length: int) -> RunDescription:
    """Validate a ``"type": "run"`` line; secrets are redacted on the way in."""
    rank, world_size, reporter_id = _identity(data)
    digest = data.get("config_hash")
    if not isinstance(digest, str) or not CONFIG_HASH_PATTERN.fullmatch(digest):
        raise ReportError("invalid_field", "config_hash must be sha256: and 16 hex digits")
    ended = data.get("ended")
    if ended is not None and ended not in RUN_END_REASONS:
        raise ReportError("invalid_field", f"ended must be one of {', '.join(RUN_END_REASONS)}")
    host = data.get("host", "")
    if not isinstance(host, str) or (host and not HOST_PATTERN.fullmatch(host)):
        raise ReportError("invalid_field", "host must be 1-253 characters of [A-Za-z0-9_.-]")
    commit, dirty = _git(data.get("git"))
    return RunDescription(
        job=_label(data.get("job"), "job", max_label_length),
        rank=rank,
        reporter_id=reporter_id,
        run=_run_id(data.get("run")),
        started=_seconds(data, "started"),
        world_size=world_size,
        config_hash=digest,
        config=_settings(data.get("config", {}), "config"),
        environment=_environment(data.get("environment", {})),
        data_paths=_data_paths(data.get("data_paths", [])),
        versions=_versions(data.get("versions", {})),
        git_commit=commit,
        git_dirty=dirty,
        host=host,
        framework=_settings(data.get("framework", {}), "framework"),
        ended=None if ended is None else str(ended),
    )


def _run_id(value: object) -> str:
    if not isinstance(value, str) or not RUN_ID_PATTERN.fullmatch(value):
        raise ReportError("invalid_label", "run must be 1-64 characters of [A-Za-z0-9_.:-]")
    return value


def _text(value: object, what: str, limit: int) -> str:
    """A string of at most ``limit`` characters without control characters."""
    if not isinstance(value, str):
        raise ReportError("invalid_field", f"{what} must be a string")
    if len(value) > limit:
        raise ReportError("invalid_field", f"{what} is longer than {limit} characters")
    if _CONTROL.search(value):
        raise ReportError("invalid_field", f"{what} must not hold control characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        raise ReportError("invalid_field", f"{what} must be valid Unicode") from None
    return value


def _object(value: object, what: str, limit: int) -> dict[str, object]:
    if not isinstance(value, dict):
        raise ReportError("invalid_field", f"{what} must be an object")
    if len(value) > limit:
        raise ReportError("invalid_field", f"{what} has more than {limit} keys")
    return value


def _settings(value: object, what: str) -> dict[str, ConfigValue]:
    """``config`` / ``framework``: label-charset keys to JSON scalars, secrets redacted
    (values under secret-looking keys whole; a key that holds a secret of its own goes
    through the rule and back onto the charset, as the client's keys do)."""
    settings: dict[str, ConfigValue] = {}
    for key, item in _object(value, what, MAX_DESCRIPTION_KEYS).items():
        label = _label(key, f"{what} key", MAX_DESCRIPTION_KEY_LENGTH)
        name = sanitize_label(redact_text(label), MAX_DESCRIPTION_KEY_LENGTH)
        checked: ConfigValue
        if item is None or isinstance(item, bool):
            checked = item
        elif isinstance(item, int):
            if abs(item) > MAX_COUNT:
                raise ReportError("invalid_field", f"{what}.{name} is beyond ±2^53")
            checked = item
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ReportError("invalid_field", f"{what}.{name} must be finite")
            checked = item
        elif isinstance(item, str):
            checked = _text(item, f"{what}.{name}", MAX_DESCRIPTION_VALUE_LENGTH)
        else:
            raise ReportError(
                "invalid_field", f"{what}.{name} must be a string, number, boolean or null"
            )
        settings.setdefault(name, REDACTED if is_secret_name(label) else
                            redact_value(name, checked))
    return settings


def _environment(value: object) -> dict[str, str]:
    environment: dict[str, str] = {}
    for name, item in _object(value, "environment", MAX_DESCRIPTION_KEYS).items():
        if not ENVIRONMENT_NAME_PATTERN.fullmatch(name):
            raise ReportError(
                "invalid_label",
                "environment names must be 1-128 of [A-Za-z0-9_], not a digit first",
            )
        text = _text(item, f"environment.{name}", MAX_DESCRIPTION_VALUE_LENGTH)
        environment[name] = str(redact_value(name, text))
    return environment


def _data_paths(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ReportError("invalid_field", "data_paths must be a list")
    if len(value) > MAX_DATA_PATHS:
        raise ReportError("invalid_field", f"more than {MAX_DATA_PATHS} data_paths")
    return tuple(redact_text(_path(path, "data_paths entry")) for path in value)


def _versions(value: object) -> dict[str, str]:
    versions: dict[str, str] = {}
    for name, item in _object(value, "versions", MAX_VERSIONS).items():
        if not VERSION_NAME_PATTERN.fullmatch(name):
            raise ReportError("invalid_label", "versions names must be 1-64 of [A-Za-z0-9_.-]")
        versions[name] = redact_text(_text(item, f"versions.{name}", MAX_VERSION_LENGTH))
    return versions


def _git(value: object) -> tuple[str | None, bool | None]:
    if value is None:
        return None, None
    if not isinstance(value, dict):
        raise ReportError("invalid_field", "git must be an object or null")
    commit = value.get("commit")
    if not isinstance(commit, str) or not GIT_COMMIT_PATTERN.fullmatch(commit):
        raise ReportError("invalid_field", "git.commit must be 40 or 64 lowercase hex digits")
    dirty = value.get("dirty")
    if dirty is not None and not isinstance(dirty, bool):
        raise ReportError("invalid_field", "git.dirty must be a boolean or null")
    return commit, dirty


# -- stall reports ----------------------------------------------------------------


def _build_stall(data: dict[str, object], max_label_length: int) -> StallReport:
    """Validate a ``"type": "stall"`` line; each frame's file, function and source line
    go through the secret rule (``redact_text``; a source line that names a secret is
    dropped whole: ``redact_code``)."""
    rank, _, reporter_id = _identity(data)
    where = data.get("where")
    if where not in STALL_WHERE:
        raise ReportError("invalid_field", f"where must be one of {', '.join(STALL_WHERE)}")
    run = data.get("run")
    phase = data.get("phase")
    collective = data.get("collective")
    op = seq = started = group = None
    if collective is not None:
        if not isinstance(collective, dict):
            raise ReportError("invalid_field", "collective must be an object")
        op = collective.get("op")
        if not isinstance(op, str) or not COLLECTIVE_PATTERN.fullmatch(op):
            raise ReportError("invalid_field", "collective.op must be 1-64 of [A-Za-z0-9_]")
        seq = _optional_int(collective, "seq", 0, MAX_COUNT)
        started = None if collective.get("since") is None else _seconds(collective, "since")
        name = collective.get("group")
        group = None if name is None else _label(name, "collective.group",
                                                 MAX_GROUP_NAME_LENGTH)
    frames = data.get("frames", [])
    if not isinstance(frames, list) or len(frames) > MAX_STALL_FRAMES:
        raise ReportError("invalid_field", f"frames must be a list of at most "
                                           f"{MAX_STALL_FRAMES}")
    return StallReport(
        job=_label(data.get("job"), "job", max_label_length),
        rank=rank,
        reporter_id=reporter_id,
        run=None if run is None else _run_id(run),
        steps=_integer(data, "steps", 0, MAX_COUNT),
        since=_seconds(data, "since"),
        where=str(where),
        phase=None if phase is None else _label(phase, "phase", max_label_length),
        collective=op,
        collective_seq=seq,
        collective_since=started,
        frames=tuple(_frame(frame) for frame in frames),
        collective_group=group,
    )


def _frame(value: object) -> StallFrame:
    if not isinstance(value, dict):
        raise ReportError("invalid_field", "a frame must be an object")
    # the same rule as run descriptions: a presigned-URL loader names its code by the
    # URL (``co_filename``), and ``exec``'d code may name its functions anything
    return StallFrame(
        file=redact_text(_text(value.get("file"), "frame file", MAX_FRAME_FILE_LENGTH)),
        line=_integer(value, "line", 0, MAX_RANK),
        function=redact_text(_text(value.get("function"), "frame function",
                                   MAX_FRAME_FUNCTION_LENGTH)),
        code=redact_code(_text(value.get("code", ""), "frame code", MAX_FRAME_CODE_LENGTH)),
    )


# -- profiles -------------------------------------------------------------------


def _build_profile(data: dict[str, object], max_label_length: int) -> ProfileReport:
    """Validate a ``"type": "profile"`` line; operator names and the error go through
    the secret rule (a ``record_function`` label may name anything)."""
    rank, _, reporter_id = _identity(data)
    request = data.get("id")
    if not isinstance(request, str) or not PROFILE_ID_PATTERN.fullmatch(request):
        raise ReportError("invalid_field", "id must be 8-64 lowercase hex digits")
    run = data.get("run")
    error = data.get("error")
    return ProfileReport(
        job=_label(data.get("job"), "job", max_label_length),
        rank=rank,
        reporter_id=reporter_id,
        run=None if run is None else _run_id(run),
        id=request,
        steps=_integer(data, "steps", 0, MAX_PROFILE_STEPS),
        seconds=_seconds(data, "seconds"),
        top_cpu=_operators(data.get("top_cpu", []), "top_cpu"),
        top_device=_operators(data.get("top_device", []), "top_device"),
        self_cpu_seconds=None if data.get("self_cpu_seconds") is None
        else _seconds(data, "self_cpu_seconds"),
        self_device_seconds=None if data.get("self_device_seconds") is None
        else _seconds(data, "self_device_seconds"),
        error=None if error is None
        else redact_text(_text(error, "error", MAX_PROFILE_ERROR_LENGTH)),
    )


def _operators(value: object, what: str) -> tuple[ProfiledOperator, ...]:
    if not isinstance(value, list) or len(value) > MAX_PROFILE_OPERATORS:
        raise ReportError("invalid_field",
                          f"{what} must be a list of at most {MAX_PROFILE_OPERATORS}")
    operators = []
    for item in value:
        if not isinstance(item, dict):
            raise ReportError("invalid_field", f"an operator of {what} must be an object")
        share = _seconds(item, "share")
        if share > 1:
            raise ReportError("invalid_field", f"share in {what} must be within 0..1")
        name = _text(item.get("name"), "operator name", MAX_OPERATOR_NAME_LENGTH)
        if not name:
            raise ReportError("invalid_field", f"an operator of {what} needs a name")
        operators.append(ProfiledOperator(
            name=redact_text(name), self_seconds=_seconds(item, "self_seconds"),
            share=share, calls=_integer(item, "calls", 0, MAX_COUNT)))
    return tuple(operators)
