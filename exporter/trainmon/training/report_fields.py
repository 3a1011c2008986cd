"""Training step protocol v1: every field of a step report, defined once.

``REPORT_FIELDS`` is the report's schema (docs/protocol.md, "A report"): for
each JSON key its kind (which fixes the JSON type and the value rules), its
bounds, whether it is required, whether ``null`` stands for "absent", what
an absent field means, and how it relates to other fields (must not exceed
``step_seconds``, needs ``checkpoints``...). Both sides read this table:

- the Python client builds every report with ``build_report`` (the fields in
  this order, those it does not know left out where the schema says so);
- the daemon validates every report line against it
  (``trainmon.training.protocol``, which turns a valid line into a
  ``StepReport`` whose attributes are these names).

``comm_groups`` holds one object per process group (docs/protocol.md,
"Communication per process group"); the keys of those objects are a table of
their own, ``COMM_GROUP_FIELDS``, and a checked one is a ``CommGroup``.

Adding a field is one row here plus its consumers: the value the client
passes to ``build_report``, the ``StepReport`` attribute, and whatever reads
it (the store, the collectors, the ledger).
``tests/training/test_report_fields.py`` fails where the client, the
validator or ``StepReport`` disagree with this table.

Standard library only, and of ``trainmon`` only the step sketch's bound
(``trainmon.training.sketch``, itself standard library only): the training-side
client imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from trainmon.training.sketch import MAX_LEVEL as MAX_SKETCH_LEVEL

PROTOCOL_VERSION = 1
#: Counts and integer fields stay exactly representable as a float64.
MAX_COUNT = 2**53
MAX_RANK = 2**31 - 1
#: Most distinct phase names in one report.
MAX_PHASES = 32
#: Default longest ``job`` and phase name, in characters (daemon-configurable).
DEFAULT_MAX_LABEL_LENGTH = 128
#: Longest ``checkpoint_path`` (bytes of UTF-8): Linux's PATH_MAX. A report
#: line stays within ``MAX_LINE_BYTES`` with it (a report without phases is
#: well under 1 KiB; 32 long phase names add at most about 4.5 KiB).
MAX_PATH_BYTES = 4096
#: The largest NVML device index ``gpu`` may name.
MAX_GPU_INDEX = 9999
#: Most process groups in one report's ``comm_groups``, and kept per rank by the
#: daemon (a DeviceMesh has a handful of dimensions: dp, tp, pp, cp, ep, world).
MAX_COMM_GROUPS = 8
#: Longest process group name (``comm_groups`` key, a stall's ``collective.group``),
#: in characters of ``LABEL_PATTERN``; it becomes the ``group`` label.
MAX_GROUP_NAME_LENGTH = 32

#: Characters allowed in ``job`` and phase names: no quotes, spaces, newlines,
#: control characters or non-ASCII, so every consumer of the exposition (PromQL
#: selectors, Grafana variables, shells) can use the value verbatim.
LABEL_PATTERN = re.compile(r"[A-Za-z0-9_.:@/+-]+")
REPORTER_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
GPU_PATTERN = re.compile(r"[0-9]{1,4}")
#: Run ids (``run`` of a report or run description): also a label value of
#: ``trainmon_training_run_info``, so a narrower charset than ``job``'s.
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

#: What a field's value is on the wire, and so how it is checked:
#:
#: - ``version``: the integer ``PROTOCOL_VERSION`` (checked for every line type);
#: - ``integer``: a JSON integer (not ``true``/``false``, no fraction) within
#:   ``minimum``..``maximum``;
#: - ``number``: a finite JSON number, 0..``MAX_COUNT``;
#: - ``label``: 1..max_label_length characters of ``LABEL_PATTERN``;
#: - ``reporter_id``: ``REPORTER_ID_PATTERN``; ``run_id``: ``RUN_ID_PATTERN``;
#: - ``gpu``: an NVML index, a string of 1-4 digits or such an integer (sent on as a string);
#: - ``path``: an absolute path, at most ``MAX_PATH_BYTES`` bytes of UTF-8, no
#:   control characters (secrets in it are redacted by the daemon: ``trainmon.training.redaction``);
#: - ``buckets``: a list of ``STEP_BUCKET_COUNT`` counts (``contract.STEP_SECONDS_BOUNDS``);
#: - ``sketch``: an object of at most ``contract.STEP_SKETCH_MAX_BUCKETS`` decimal bucket
#:   indices to counts (``trainmon.training.sketch.from_wire``; ``limit`` past the bound);
#: - ``phases``: an object of at most ``MAX_PHASES`` label-named numbers;
#: - ``comm_groups``: an object of at most ``MAX_COMM_GROUPS`` process groups, each
#:   named by 1..``MAX_GROUP_NAME_LENGTH`` characters of ``LABEL_PATTERN``, each an
#:   object of the keys of ``COMM_GROUP_FIELDS`` (no others), checked by their kinds.
FieldKind = Literal[
    "version", "integer", "number", "label", "reporter_id", "run_id", "gpu", "path",
    "buckets", "phases", "comm_groups", "sketch",
]


@dataclass(frozen=True)
class ReportField:
    """One field of a step report."""

    #: The JSON key.
    name: str
    kind: FieldKind
    required: bool = False
    #: Bounds of an ``integer`` (inclusive).
    minimum: int = 0
    maximum: int = MAX_COUNT
    #: An optional field: ``null`` means absent. False: ``null`` is checked as a
    #: value, and so rejected (``phase_seconds``).
    nullable: bool = True
    #: The Python client leaves the field out while it does not know the value
    #: (not measured, no checkpoint yet) instead of sending ``null``: absent is
    #: "unknown", never zero.
    omitted_when_unknown: bool = False
    #: The field must not exceed these fields' values (absent ones included:
    #: a field bounded by one that is missing is rejected). For ``comm_groups``:
    #: each group's ``exposed_seconds``; in ``COMM_GROUP_FIELDS``: keys of the group.
    at_most: tuple[str, ...] = ()
    #: The field must stay below this one, when that one is present (``rank``).
    below: str | None = None
    #: The field's counts must add up to this count (``step_buckets``, ``step_sketch``
    #: where sent).
    adds_up_to: str | None = None
    #: The field may only be sent with this one, and with it at least ``needs_at_least``.
    needs: str | None = None
    needs_at_least: int = 0
    #: A field that ``needs`` another and is absent with it: this value (``None``: absent).
    default_with_needed: float | None = None
    #: What an absent optional field holds (``None``: unknown); the daemon checks it
    #: like a sent value, so it is never shared between reports.
    absent: object = None
    #: One line for readers (docs/protocol.md has the full rule).
    meaning: str = ""

    def __post_init__(self) -> None:
        if self.required and self.omitted_when_unknown:
            raise ValueError(f"{self.name}: a required field is never left out")


#: Every field of a report, in the order the client sends them (JSON key order)
#: and the daemon checks them; the relations (``at_most``, ``below``,
#: ``adds_up_to``, ``needs``) are checked after all fields, in this order too.
REPORT_FIELDS: tuple[ReportField, ...] = (
    ReportField("v", "version", required=True, meaning="protocol version: 1"),
    ReportField("job", "label", required=True, meaning="the training job's name (label job)"),
    ReportField("rank", "integer", required=True, maximum=MAX_RANK, below="world_size",
                meaning="global rank (label rank)"),
    ReportField("local_rank", "integer", maximum=MAX_RANK, meaning="rank within the node"),
    ReportField("world_size", "integer", minimum=1, maximum=MAX_RANK,
                meaning="number of ranks in the job"),
    ReportField("gpu", "gpu", meaning="NVML index of the rank's GPU"),
    ReportField("pid", "integer", minimum=1, maximum=MAX_RANK, meaning="the process id"),
    ReportField("reporter_id", "reporter_id", required=True,
                meaning="random per process run; a new one is a counter reset"),
    ReportField("run", "run_id", meaning="the run of the reporter's run description"),
    ReportField("steps", "integer", required=True, meaning="steps completed"),
    ReportField("samples", "integer", required=True, meaning="samples those steps processed"),
    ReportField("step_seconds", "number", required=True, meaning="sum of the step durations"),
    ReportField("data_wait_seconds", "number", required=True, at_most=("step_seconds",),
                meaning="part of step_seconds blocked on the next batch"),
    ReportField("phase_seconds", "phases", nullable=False, absent={},
                meaning="seconds in named phases (comm, checkpoint...)"),
    ReportField("step_buckets", "buckets", required=True, adds_up_to="steps",
                meaning="step-duration histogram, not cumulative"),
    ReportField("step_sketch", "sketch", adds_up_to="steps",
                meaning="step durations by log bucket of 1 %: {index: count}"),
    ReportField("step_sketch_level", "integer", maximum=MAX_SKETCH_LEVEL,
                needs="step_sketch", default_with_needed=0,
                meaning="step_sketch's buckets merged pairwise this many times (0: 1 %)"),
    ReportField("dropped_reports", "integer", absent=0, meaning="reports not delivered so far"),
    ReportField("comm_seconds", "number", omitted_when_unknown=True,
                meaning="wall seconds with a collective in flight (measured)"),
    ReportField("comm_bytes", "integer", omitted_when_unknown=True,
                meaning="bytes of the collectives' buffers"),
    ReportField("comm_exposed_seconds", "number", omitted_when_unknown=True,
                at_most=("comm_seconds", "step_seconds"),
                meaning="step time spent waiting for communication"),
    ReportField("checkpoints", "integer", omitted_when_unknown=True,
                meaning="checkpoint saves completed"),
    ReportField("checkpoint_seconds", "number", omitted_when_unknown=True,
                needs="checkpoints", default_with_needed=0.0,
                meaning="seconds spent in those saves"),
    ReportField("last_checkpoint_time", "number", omitted_when_unknown=True,
                needs="checkpoints", needs_at_least=1,
                meaning="Unix time the last save completed"),
    ReportField("checkpoint_path", "path", omitted_when_unknown=True,
                needs="checkpoints", needs_at_least=1,
                meaning="absolute path of the last checkpoint written"),
    ReportField("last_step_time", "number", omitted_when_unknown=True,
                meaning="Unix time the last step ended"),
    ReportField("collective_seq", "integer", omitted_when_unknown=True,
                meaning="collectives the rank launched so far (instrumented DDP buckets)"),
    ReportField("comm_groups", "comm_groups", omitted_when_unknown=True,
                at_most=("step_seconds",),
                meaning="communication per process group (dp, tp, pp...), cumulative"),
)

#: The keys of one ``comm_groups`` value, in the order the client sends them; the
#: ``CommGroup`` attributes of the same names. Checked like report fields of their
#: kind (``null`` or absent: unknown), then ``at_most`` within the group; a key not
#: in this table is rejected.
COMM_GROUP_FIELDS: tuple[ReportField, ...] = (
    ReportField("collectives", "integer", required=True,
                meaning="collectives launched on the group so far"),
    ReportField("bytes", "integer", required=True,
                meaning="bytes of their buffers so far"),
    ReportField("seconds", "number", required=True,
                meaning="wall seconds with a collective of the group in flight so far"),
    ReportField("exposed_seconds", "number", omitted_when_unknown=True, at_most=("seconds",),
                meaning="seconds the training thread waited for the group's collectives"),
    ReportField("seq", "integer", omitted_when_unknown=True,
                meaning="sequence number of the last collective launched on the group"),
    ReportField("root", "integer", omitted_when_unknown=True, maximum=MAX_RANK,
                meaning="the lowest global rank in the group"),
)
#: The keys of a ``comm_groups`` value, in order.
_GROUP_KEYS = tuple(spec.name for spec in COMM_GROUP_FIELDS)


@dataclass(frozen=True)
class CommGroup:
    """One process group's communication, as a report's ``comm_groups`` carries it.

    One attribute per key of ``COMM_GROUP_FIELDS``, of the same name. The totals
    are cumulative since the reporter started, like the report's; ``None`` is
    unknown (never zero). A group is named by its parallelism dimension (``dp``,
    ``tp``, ``pp``, ``cp``, ``ep``, ``world``) or its description; with ``root``
    the name tells apart the groups of one dimension (tp groups {0,1} and {2,3} are
    ``tp``/0 and ``tp``/2).
    """

    #: Collectives launched on the group (c10d calls, DDP buckets on it).
    collectives: int
    #: Bytes of their buffers (what this rank contributes: not wire bytes).
    bytes: int
    #: Wall seconds (GPU-timeline seconds on CUDA) with at least one collective of
    #: the group in flight: the length of the union of their intervals.
    seconds: float
    #: Seconds the training thread waited for the group's collectives after its
    #: own compute was done (≤ ``seconds``, ≤ the report's ``step_seconds``).
    exposed_seconds: float | None = None
    #: The sequence number of the last collective launched on the group (c10d's
    #: and the flight recorder's ``collective_seq_id`` on that group).
    seq: int | None = None
    #: The lowest global rank in the group.
    root: int | None = None


#: The fields by name.
FIELDS_BY_NAME: Mapping[str, ReportField] = {spec.name: spec for spec in REPORT_FIELDS}
#: The fields the client leaves out while their value is ``None``.
_OMITTED_WHEN_UNKNOWN = tuple(spec.name for spec in REPORT_FIELDS if spec.omitted_when_unknown)


def build_report(values: dict[str, object]) -> dict[str, object]:
    """The report the client sends, from ``values``: a value for every field of
    ``REPORT_FIELDS`` (``"v": PROTOCOL_VERSION`` included), in that order, ``None``
    for what the client does not know. The fields ``omitted_when_unknown`` whose
    value is ``None`` are taken out (in place: the client builds ``values`` for
    this one report, and a mapping built by the schema itself costs the sender
    about a microsecond more per report); the others are sent as they are.

    ``comm_groups`` is ``None`` (not measured) or a mapping of group names to
    ``CommGroup`` objects (or mappings of the ``COMM_GROUP_FIELDS`` keys); each
    becomes its JSON object, keys in ``COMM_GROUP_FIELDS`` order, those whose value
    is ``None`` (unknown) left out.

    ``values`` must hold as many entries as the schema has fields (``ValueError``
    otherwise); ``tests/training/test_report_fields.py`` checks that the
    client's names and order are the schema's."""
    if len(values) != len(REPORT_FIELDS):
        extra = sorted(set(values) - FIELDS_BY_NAME.keys())
        missing = sorted(FIELDS_BY_NAME.keys() - set(values))
        raise ValueError(f"a step report has the fields of REPORT_FIELDS; extra: {extra}, "
                         f"missing: {missing}")
    for name in _OMITTED_WHEN_UNKNOWN:
        if values[name] is None:
            del values[name]
    groups = values.get("comm_groups")
    if groups is not None:
        values["comm_groups"] = {
            name: _group_object(group)
            for name, group in cast(Mapping[str, CommGroup | Mapping[str, object]],
                                    groups).items()
        }
    return values


def _group_object(group: CommGroup | Mapping[str, object]) -> dict[str, object]:
    """The JSON object of one process group: its keys in ``COMM_GROUP_FIELDS`` order,
    the unknown (``None``) ones left out; ``ValueError`` for a key outside that table."""
    if isinstance(group, CommGroup):
        values = {key: getattr(group, key) for key in _GROUP_KEYS}
    else:
        extra = sorted(set(group) - set(_GROUP_KEYS))
        if extra:
            raise ValueError(f"a process group has the keys of COMM_GROUP_FIELDS; extra: {extra}")
        values = {key: group.get(key) for key in _GROUP_KEYS}
    return {key: value for key, value in values.items() if value is not None}
