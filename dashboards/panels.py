"""Panel factories: every panel queries ``$datasource`` and has a unit and a description.

Each factory returns a ``grafana-foundation-sdk`` panel builder with the
bundle's conventions applied: the datasource variable on the panel and on
every query, queries lettered ``A``, ``B``… in order, legends as tables with
mean/max/last, thresholds drawn as dashed lines, and tables from instant
queries. ``Board.add`` (``dashboards.builder``) places and numbers them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from grafana_foundation_sdk.builders import bargauge, prometheus, stat, statetimeline, table
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import timeseries as timeseries_builders
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DataTransformerConfig,
    DynamicConfigValue,
    FieldColorModeId,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMapping,
    ValueMappingResult,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from dashboards.builder import DATASOURCE, LinkBuilder


@dataclass(frozen=True)
class Query:
    """One PromQL target: ``legend`` is Grafana's legend template (``{{gpu}}``)."""

    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Step:
    """A threshold step: ``value`` None is the base (everything below the next step)."""

    value: float | None
    color: str


GOOD_LOW = (Step(None, "green"),)
#: Green at 0, red from 1: counts of things that should not happen (XIDs, failures).
RED_FROM_ONE = (Step(None, "green"), Step(1, "red"))
#: GPU core temperature, °C: data-center GPUs slow down from ~85–90 °C.
TEMPERATURE_STEPS = (Step(None, "green"), Step(80, "yellow"), Step(87, "red"))

#: Legends: one series per GPU of the selected node, or per GPU of every node.
GPU = "GPU {{gpu}}"
NODE_GPU = "{{node}} GPU {{gpu}}"


def thresholds(*steps: Step) -> dashboard_builders.ThresholdsConfig:
    """Absolute thresholds, e.g. ``thresholds(Step(None, "green"), Step(0.2, "red"))``."""
    return (
        dashboard_builders.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=step.value, color=step.color) for step in steps])
    )


def value_mappings(texts: dict[str, tuple[str, str]]) -> list[ValueMapping]:
    """Value → (text, color) mappings, e.g. ``{"1": ("up", "green")}``."""
    options = {value: ValueMappingResult(text=text, color=color, index=index)
               for index, (value, (text, color)) in enumerate(texts.items())}
    return [ValueMap(options=options)]


#: ``up``-style 1/0 series as text.
UP_DOWN = value_mappings({"1": ("up", "green"), "0": ("down", "red")})

AnyPanel = TypeVar(
    "AnyPanel", timeseries_builders.Panel, stat.Panel, statetimeline.Panel, table.Panel,
    bargauge.Panel,
)


def _panel(
    panel: AnyPanel,
    title: str,
    unit: str,
    description: str,
    queries: Sequence[Query],
    *,
    table_format: bool = False,
    mappings: list[ValueMapping] | None = None,
    links: Sequence[LinkBuilder] = (),
) -> AnyPanel:
    """What every panel has: title, description, unit, ``$datasource`` and the queries;
    value ``mappings`` and data ``links`` where given."""
    panel = (
        panel.title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .targets(_targets(queries, table_format=table_format))
    )
    if mappings is not None:
        panel = panel.mappings(mappings)
    if links:
        panel = panel.data_links(list(links))
    return panel


def _targets(queries: Sequence[Query], *, table_format: bool = False) -> list[Builder[Dataquery]]:
    targets: list[Builder[Dataquery]] = []
    for index, query in enumerate(queries):
        target = (
            prometheus.Dataquery()
            .expr(query.expr)
            .ref_id(chr(ord("A") + index))
            .datasource(DATASOURCE)
        )
        if query.legend:
            target = target.legend_format(query.legend)
        target = target.instant() if query.instant or table_format else target.range()
        if table_format:
            target = target.format(PromQueryFormat.TABLE)
        targets.append(target)
    return targets


def timeseries(
    title: str,
    unit: str,
    description: str,
    queries: Sequence[Query],
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    steps: Sequence[Step] = (),
    dashed: Iterable[str] = (),
    stacked: bool = False,
) -> timeseries_builders.Panel:
    """A time series panel; ``steps`` are drawn as dashed threshold lines.

    ``dashed`` names series (by legend) drawn as dashed lines, e.g. a link rate
    or a power limit shown against the measured value. ``stacked`` stacks the
    series as filled areas (parts of a whole: GPUs by goodput bucket).
    """
    panel = (
        _panel(timeseries_builders.Panel(), title, unit, description, queries)
        .line_width(1)
        .fill_opacity(10)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.RIGHT)
            .show_legend(True)
            .calcs(["mean", "max", "lastNotNull"])
        )
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                 .sort(common.SortOrder.DESCENDING))
    )
    if stacked:
        panel = panel.fill_opacity(60).stacking(
            common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if minimum is not None:
        panel = panel.min(minimum)
    if maximum is not None:
        panel = panel.max(maximum)
    if steps:
        panel = panel.thresholds(thresholds(*steps)).thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED)
        )
    for name in dashed:
        panel = panel.override_by_regexp(
            name,
            [DynamicConfigValue(id_val="custom.lineStyle",
                                value={"fill": "dash", "dash": [10, 10]}),
             DynamicConfigValue(id_val="custom.fillOpacity", value=0)],
        )
    return panel


def stat_panel(
    title: str,
    unit: str,
    description: str,
    queries: Sequence[Query],
    *,
    steps: Sequence[Step] = GOOD_LOW,
    mappings: list[ValueMapping] | None = None,
    show_name: bool = False,
    name_only: bool = False,
    decimals: int | None = None,
) -> stat.Panel:
    """A single-value panel colored by ``steps`` (or by ``mappings``).

    ``show_name`` adds each series' legend beside its value (one box per
    series); ``name_only`` shows just the legend, for identity series (``_info``).
    """
    if name_only:
        text_mode = common.BigValueTextMode.NAME
    elif show_name:
        text_mode = common.BigValueTextMode.VALUE_AND_NAME
    else:
        text_mode = common.BigValueTextMode.VALUE
    panel = (
        _panel(stat.Panel(), title, unit, description, queries, mappings=mappings)
        .thresholds(thresholds(*steps))
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.NONE)
        .text_mode(text_mode)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if decimals is not None:
        panel = panel.decimals(decimals)
    return panel


def state_timeline(
    title: str,
    unit: str,
    description: str,
    queries: Sequence[Query],
    *,
    minimum: float = 0.0,
    maximum: float = 1.0,
    mappings: list[ValueMapping] | None = None,
    steps: Sequence[Step] = (),
) -> statetimeline.Panel:
    """One row per series, colored by value: a GPU that saw-tooths shows stripes.

    Without ``steps`` the color runs continuously from red (``minimum``) to
    green (``maximum``); with ``mappings`` each mapped value has its own color.
    """
    panel = (
        _panel(statetimeline.Panel(), title, unit, description, queries, mappings=mappings)
        .min(minimum)
        .max(maximum)
        .show_value(common.VisibilityMode.NEVER)
        .merge_values(False)
        .row_height(0.9)
        .line_width(0)
        .fill_opacity(90)
        .legend(common_builders.VizLegendOptions().show_legend(False))
    )
    if steps:
        panel = panel.thresholds(thresholds(*steps)).color_scheme(
            dashboard_builders.FieldColor().mode(FieldColorModeId.THRESHOLDS)
        )
    else:
        panel = panel.color_scheme(
            dashboard_builders.FieldColor().mode(FieldColorModeId.CONTINUOUS_RD_YL_GR)
        )
    return panel


def table_panel(
    title: str,
    unit: str,
    description: str,
    queries: Sequence[Query],
    *,
    hidden: Iterable[str] = (),
    links: Sequence[LinkBuilder] = (),
    mappings: list[ValueMapping] | None = None,
    steps: Sequence[Step] = GOOD_LOW,
    renames: Mapping[str, str] | None = None,
    column_units: Mapping[str, str] | None = None,
    sort_by: str | None = None,
    decimals: int | None = None,
) -> table.Panel:
    """Instant queries as rows (one column per label, ``Value`` last).

    ``hidden`` drops label columns besides ``Time`` and ``__name__``; ``links``
    are data links on every cell (e.g. from a node to its Node detail).
    With several queries the value columns are ``Value #A``, ``Value #B``…;
    ``renames`` gives columns readable names and ``column_units`` (by the new
    name) a column its own unit. ``sort_by`` names the column (after renames)
    the rows are sorted by, largest first; ``decimals`` fixes the numbers' decimals.
    """
    excluded = {name: True for name in ("Time", "__name__", *hidden)}
    organize: dict[str, object] = {"excludeByName": excluded}
    if renames:
        organize["renameByName"] = dict(renames)
    panel = (
        _panel(table.Panel(), title, unit, description, queries, table_format=True,
               mappings=mappings, links=links)
        .with_transformation(DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(DataTransformerConfig(id_val="organize", options=organize))
        .thresholds(thresholds(*steps))
        .override_by_field_type(
            "number",
            [DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"})],
        )
    )
    for column, unit_id in (column_units or {}).items():
        # A column with its own unit (a timestamp, say) is not colored by the thresholds.
        panel = panel.override_by_name(column, [
            DynamicConfigValue(id_val="unit", value=unit_id),
            DynamicConfigValue(id_val="custom.cellOptions", value={"type": "auto"}),
        ])
    if sort_by is not None:
        panel = panel.sort_by([common_builders.TableSortByFieldState().display_name(sort_by)
                               .desc(True)])
    if decimals is not None:
        panel = panel.decimals(decimals)
    return panel


def series_links(panel: AnyPanel, links: Mapping[str, Sequence[LinkBuilder]]) -> AnyPanel:
    """``panel`` with data links of its own on each series named in ``links`` (by its
    legend, e.g. a goodput bucket's ``{{bucket}}``), beside any the panel has for all."""
    for name, series in links.items():
        panel = panel.override_by_name(name, [DynamicConfigValue(
            id_val="links", value=[item.build().to_json() for item in series])])
    return panel


def bar_gauge(
    title: str,
    unit: str,
    description: str,
    queries: Sequence[Query],
    *,
    steps: Sequence[Step] = GOOD_LOW,
    maximum: float | None = None,
    links: Sequence[LinkBuilder] = (),
) -> bargauge.Panel:
    """Horizontal bars for ranked lists (top jobs, most idle GPUs)."""
    panel = (
        _panel(bargauge.Panel(), title, unit, description, queries, links=links)
        .min(0)
        .thresholds(thresholds(*steps))
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if maximum is not None:
        panel = panel.max(maximum)
    return panel
