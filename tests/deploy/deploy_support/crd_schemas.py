"""JSON Schemas for the Prometheus Operator objects the manifests use.

kubernetes-validate knows only the built-in kinds. These schemas restate, from
the operator's published CRDs (``monitoring.coreos.com_servicemonitors.yaml``,
``…_podmonitors.yaml`` and ``…_prometheusrules.yaml``, v1), the required fields,
types, patterns and enums of every field trainmon's manifests set. They are
stricter than the API server in one way: a field outside this subset is an
error (``additionalProperties: false``) rather than silently pruned, so a typo
such as ``honorlabels`` fails the test instead of vanishing on apply.
"""

from __future__ import annotations

from typing import Any

#: The operator's duration pattern (``Duration`` in the CRDs).
DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
_DURATION = {"type": "string", "pattern": DURATION}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_LABEL_NAME = {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}
_RELABEL_ACTIONS = [
    spelling
    for action in (
        "Replace", "Keep", "Drop", "HashMod", "LabelMap", "LabelDrop",
        "LabelKeep", "Lowercase", "Uppercase", "KeepEqual", "DropEqual",
    )
    for spelling in (action, action.lower())
]
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "additionalProperties": False,
}
_RELABEL_CONFIG = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": _RELABEL_ACTIONS},
        "modulus": {"type": "integer"},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
        "separator": {"type": "string"},
        "sourceLabels": {"type": "array", "items": _LABEL_NAME},
        "targetLabel": {"type": "string"},
    },
    "additionalProperties": False,
}
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}

SERVICE_MONITOR: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["endpoints", "selector"],
            "properties": {
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                    "additionalProperties": False,
                },
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                            "path": {"type": "string"},
                            "scheme": {"type": "string", "enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "honorLabels": {"type": "boolean"},
                            "honorTimestamps": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": _RELABEL_CONFIG},
                            "metricRelabelings": {"type": "array", "items": _RELABEL_CONFIG},
                        },
                        "additionalProperties": False,
                    },
                },
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

_RULE = {
    "type": "object",
    "required": ["expr"],
    "properties": {
        "alert": {"type": "string", "minLength": 1},
        "record": {"type": "string", "pattern": r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
        "expr": {"anyOf": [{"type": "integer"}, {"type": "string", "minLength": 1}]},
        "for": _DURATION,
        "keep_firing_for": {**_DURATION, "minLength": 1},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "additionalProperties": False,
    # "Only one of `record` and `alert` must be set"; annotations only on alerts.
    "oneOf": [
        {"required": ["alert"], "not": {"required": ["record"]}},
        {"required": ["record"], "not": {"anyOf": [
            {"required": ["alert"]}, {"required": ["annotations"]},
            {"required": ["for"]}, {"required": ["keep_firing_for"]},
        ]}},
    ],
}

PROMETHEUS_RULE: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "limit": {"type": "integer"},
                            "query_offset": _DURATION,
                            "labels": _STRING_MAP,
                            "rules": {"type": "array", "items": _RULE},
                        },
                        "additionalProperties": False,
                    },
                },
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

#: ``monitoring.coreos.com_podmonitors.yaml`` (v1): the ServiceMonitor's shape, with
#: ``podMetricsEndpoints`` (the same endpoint fields) in place of ``endpoints``.
_SERVICE_SPEC = SERVICE_MONITOR["properties"]["spec"]
POD_MONITOR: dict[str, Any] = {
    **SERVICE_MONITOR,
    "properties": {
        **SERVICE_MONITOR["properties"],
        "kind": {"const": "PodMonitor"},
        "spec": {
            **_SERVICE_SPEC,
            "required": ["podMetricsEndpoints", "selector"],
            "properties": {
                **{key: value for key, value in _SERVICE_SPEC["properties"].items()
                   if key not in ("endpoints", "targetLabels")},
                "podMetricsEndpoints": _SERVICE_SPEC["properties"]["endpoints"],
            },
        },
    },
}

SCHEMAS = {"ServiceMonitor": SERVICE_MONITOR, "PodMonitor": POD_MONITOR,
           "PrometheusRule": PROMETHEUS_RULE}
