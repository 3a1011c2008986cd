"""What distinguishes the two bundle variants (docs/architecture.md): names, UIDs, extra rows.

Both variants share the Training overview, Node detail, Fleet and GPU-hours
dashboards; a variant adds rows (``dcgm``: dcgm-exporter's ``DCGM_FI_*`` series;
``tencent-cloud``: Cloud Monitor series pulled by trainmon) and variables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from grafana_foundation_sdk.builders.dashboard import DashboardLink
from grafana_foundation_sdk.models.dashboard import DashboardLinkType

from dashboards.builder import Board, LinkBuilder, VariableBuilder, dashboard_url, link
from dashboards.promql import Activity, daemon_activity, daemon_memory_share

TRAINING = "training"
NODE = "node"
FLEET = "fleet"
GOODPUT = "goodput"
#: Each dashboard's title (``trainmon / <title> (<variant name>)``) and link text.
TITLES = {TRAINING: "Training overview", NODE: "Node detail", FLEET: "Fleet",
          GOODPUT: "GPU-hours"}


def _no_rows(board: Board, variant: Variant) -> None:
    """A variant that adds nothing to this dashboard."""


def _no_variables() -> Sequence[VariableBuilder]:
    return ()


RowsHook = Callable[[Board, "Variant"], None]


@dataclass(frozen=True)
class Variant:
    """One bundle variant: the folder its JSON goes to and what it adds."""

    #: Folder under ``dashboards/`` and tag suffix: ``dcgm`` or ``tencent-cloud``.
    slug: str
    #: Shown in dashboard titles.
    name: str
    #: Prefix of the stable dashboard UIDs (``<prefix>-training`` …); ≤ 30 characters.
    uid_prefix: str
    #: One sentence on where this variant's GPU device view comes from.
    summary: str
    training_rows: RowsHook = _no_rows
    node_rows: RowsHook = _no_rows
    fleet_rows: RowsHook = _no_rows
    node_variables: Callable[[], Sequence[VariableBuilder]] = field(default=_no_variables)
    #: PromQL of an activity ratio per (node, gpu) for a label-matcher list ("" for all):
    #: the daemon's NVML GPM series, or DCGM profiling where the variant has it.
    gpu_activity: Callable[[Activity, str], str] = daemon_activity
    #: PromQL of each GPU's memory used share (0–1) for a label-matcher list.
    gpu_memory_share: Callable[[str], str] = daemon_memory_share
    #: Where the activity panels' numbers come from, for their descriptions.
    activity_source: str = (
        "Source: the trainmon daemon's NVML GPM counters (Hopper and newer GPUs; empty on "
        "older ones)."
    )
    #: Where the memory used share comes from, for its description.
    memory_source: str = "Source: the trainmon daemon (NVML)."

    def uid(self, kind: str) -> str:
        """The stable UID of this variant's ``training``, ``node``, ``fleet`` or ``goodput``
        dashboard."""
        return f"{self.uid_prefix}-{kind}"

    def board(self, kind: str, description: str, *, since: str = "now-1h") -> Board:
        """A new ``kind`` dashboard of this variant; ``description`` is followed by the
        variant's summary; ``since`` starts the default time range."""
        return Board(
            uid=self.uid(kind),
            title=f"trainmon / {TITLES[kind]} ({self.name})",
            description=f"{description} {self.summary}",
            tags=self.tags,
            links=self.links(),
            since=since,
        )

    def series_link(self, kind: str, label: str, *more: str) -> LinkBuilder:
        """A data link from a series to the ``kind`` dashboard of its ``label`` (node, job),
        and of its ``more`` labels (a job's ``owner``)."""
        values = {name: f"${{__field.labels.{name}}}" for name in (label, *more)}
        return link(f"{TITLES[kind]} of {values[label]}",
                    dashboard_url(self.uid(kind), **values))

    def row_link(self, kind: str, field: str, *more: str) -> LinkBuilder:
        """A data link from a table row to the ``kind`` dashboard of its ``field`` column
        (and of its ``more`` columns)."""
        values = {name: f"${{__data.fields.{name}}}" for name in (field, *more)}
        return link(TITLES[kind], dashboard_url(self.uid(kind), **values))

    @property
    def tags(self) -> list[str]:
        return ["trainmon", f"trainmon-{self.slug}"]

    def links(self) -> list[LinkBuilder]:
        """The dashboard links: a dropdown of this variant's dashboards, keeping time and vars."""
        return [
            DashboardLink(f"trainmon ({self.name})")
            .type(DashboardLinkType.DASHBOARDS)
            .tags([f"trainmon-{self.slug}"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
            .tooltip("The other trainmon dashboards of this bundle")
        ]
