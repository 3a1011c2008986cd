"""What Grafana does to a dashboard's queries before sending them to Prometheus.

* Built-in variables: ``$__rate_interval`` is max(``$__interval`` + scrape
  interval, 4 × scrape interval), ``$__interval`` the query step, ``$__range``
  the dashboard's time range (Grafana's documented definitions).
* Query variables ``label_values(selector, label)`` are answered from
  ``/api/v1/label/<label>/values?match[]=selector`` (what Grafana's Prometheus
  datasource calls); a multi-value variable set to "All" becomes its
  ``allValue``.
* ``$name``, ``${name}``, ``${name:format}`` and ``[[name]]`` are replaced by
  the value.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from testkit.prometheus import QueryAPI

_REFERENCE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$", re.S)


@dataclass(frozen=True)
class Window:
    """The time range the dashboard shows, in Unix seconds; ``step`` = ``$__interval``."""

    start: float
    end: float
    step: float
    scrape_interval: float

    def builtins(self) -> dict[str, str]:
        rate = max(self.step + self.scrape_interval, 4 * self.scrape_interval)
        span = int(self.end - self.start)
        return {"__rate_interval": f"{rate:g}s", "__interval": f"{self.step:g}s",
                "__range": f"{span}s", "__range_s": str(span)}


def interpolate(text: str, values: Mapping[str, str]) -> str:
    """``text`` with every variable reference replaced; an undefined one raises KeyError."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name not in values:
            raise KeyError(f"undefined variable ${name} in {text!r}")
        return values[name]

    return _REFERENCE.sub(replace, text)


@dataclass
class Selection:
    """One choice of every variable, and the variable queries it took to get there."""

    values: dict[str, str]
    variable_queries: list[tuple[str, str, list[str]]] = field(default_factory=list)


def _options(variable: Mapping[str, Any], values: Mapping[str, str], prometheus: QueryAPI,
             window: Window) -> tuple[str, list[str]]:
    match = _LABEL_VALUES.match(variable["query"].strip())
    assert match, f"${variable['name']}: unsupported variable query {variable['query']!r}"
    selector = interpolate(match["selector"], values) if match["selector"] else None
    options = prometheus.label_values(match["label"], selector, window.start, window.end)
    return f"label_values({selector or ''}, {match['label']})", options


def selections(variables: Sequence[Mapping[str, Any]], prometheus: QueryAPI,
               window: Window) -> Iterator[Selection]:
    """Every value of the first query variable, each with the rest resolved after it.

    A variable that offers "All" takes it (its ``allValue``), as Grafana does on a
    first visit; later variables without "All" take their first option. A variable without options yields a selection missing it (the
    caller fails on that).
    """
    query_variables = [v for v in variables if v["type"] == "query"]
    base = window.builtins()
    if not query_variables:
        yield Selection(base)
        return
    first, rest = query_variables[0], query_variables[1:]
    first_query, first_options = _options(first, base, prometheus, window)
    if not first_options:
        yield Selection(base, [(first["name"], first_query, [])])
    if first.get("includeAll"):
        first_options = first_options[:1] and [first["allValue"]]
    for option in first_options:
        selection = Selection({**base, first["name"]: option},
                              [(first["name"], first_query, first_options)])
        for variable in rest:
            query, options = _options(variable, selection.values, prometheus, window)
            selection.variable_queries.append((variable["name"], query, options))
            if variable.get("includeAll"):
                selection.values[variable["name"]] = variable["allValue"]
            elif options:
                selection.values[variable["name"]] = options[0]
        yield selection
