"""The goodput ledger's buckets on the dashboards: each one's runbook and the panel behind it.

Every GPU-second a rank holds is booked to one bucket (``trainmon.ledger.goodput``,
docs/metrics.md ``trainmon_job_gpu_seconds_total``). A panel that draws the buckets
as series (legend ``{{bucket}}``) gives each series two data links
(``bucket_links``): the runbook that says what to do about that loss, and the
panel of another dashboard that shows its cause — data wait opens the Training
overview's data-wait panel, idle allocated GPUs the Fleet's most idle GPUs.
The runbooks are those the alerts link (``runbook_url``); the buckets without an
alert of their own link the ``TrainmonLowGoodput`` runbook, whose table names
every loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dashboards.builder import Board, LinkBuilder, link, panel_url
from dashboards.variant import FLEET, TITLES, TRAINING, Variant
from trainmon.contract import RUNBOOK_BASE_URL
from trainmon.ledger.goodput import BUCKETS

#: The bucket of the GPU-seconds that trained; the others are badput.
PRODUCTIVE = "productive"


@dataclass(frozen=True)
class Bucket:
    """One bucket of the goodput ledger, as the dashboards link it."""

    name: str
    #: The runbook page under docs/runbooks/, with an anchor where one section applies.
    runbook: str
    #: The dashboard kind and the title of its panel that shows the bucket's cause.
    panel: tuple[str, str]

    @property
    def runbook_url(self) -> str:
        return RUNBOOK_BASE_URL + self.runbook


#: In the order of ``trainmon.ledger.goodput.BUCKETS``.
EXPLAINED: tuple[Bucket, ...] = (
    Bucket(PRODUCTIVE, "TrainmonLowGoodput.md#meaning", (TRAINING, "Throughput")),
    Bucket("data_wait", "TrainmonDataLoaderBottleneck.md", (TRAINING, "Data-wait ratio per rank")),
    Bucket("comm_exposed", "TrainmonCommunicationBound.md",
           (TRAINING, "Communication: exposed vs overlapped")),
    Bucket("checkpoint", "TrainmonCheckpointOnLocalDisk.md",
           (TRAINING, "Last checkpoint duration")),
    Bucket("straggler_wait", "TrainmonStragglerRank.md", (TRAINING, "Straggler ratio per rank")),
    Bucket("stalled", "TrainmonTrainingStalled.md", (TRAINING, "Since last step")),
    Bucket("startup", "TrainmonLowGoodput.md#mitigation", (TRAINING, "GPUs by goodput bucket")),
    Bucket("idle_allocated", "TrainmonGPUHeldIdle.md", (FLEET, "Most idle GPUs")),
    Bucket("lost_progress", "TrainmonCheckpointOverdue.md", (TRAINING, "Checkpoint age")),
    Bucket("other", "TrainmonLowGoodput.md#mitigation", (TRAINING, "GPUs by goodput bucket")),
)
if tuple(bucket.name for bucket in EXPLAINED) != BUCKETS:
    raise RuntimeError(f"dashboards.buckets.EXPLAINED does not list the ledger's {BUCKETS}")


def runbook_link(bucket: Bucket) -> LinkBuilder:
    """A data link to the runbook of ``bucket`` (opens a new tab)."""
    page = bucket.runbook.split(".md", 1)[0]
    return link(f"Runbook: {page} ({bucket.name})", bucket.runbook_url, new_tab=True)


def bucket_links(
    variant: Variant, boards: Mapping[str, Board], *, badput_only: bool = False,
) -> dict[str, list[LinkBuilder]]:
    """Each bucket's data links: its runbook and, where ``boards`` (kind → that kind's
    board of ``variant``) holds the dashboard, the panel that shows its cause.

    ``badput_only`` leaves out ``productive`` (for panels that draw only the losses).
    """
    links = {}
    for bucket in EXPLAINED:
        if badput_only and bucket.name == PRODUCTIVE:
            continue
        kind, title = bucket.panel
        found = [runbook_link(bucket)]
        if kind in boards:
            found.append(link(f"{TITLES[kind]}: {title}",
                              panel_url(variant.uid(kind), boards[kind].panel_id(title))))
        links[bucket.name] = found
    return links
