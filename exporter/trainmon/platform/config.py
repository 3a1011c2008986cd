"""The ``collectors.platform`` configuration section: who this node is, and spot reclaim.

Here because the platform poller reads it too; read by
``trainmon.section.read_section`` (the bounds are the fields' metadata); the
README's configuration reference lists the keys. ``labels`` are extra labels
of ``trainmon_node_info`` (``leaf``, ``rack``...): the placement rules count
distinct values of them per job, so their names are validated here, with the
key path, rather than discovered broken in a dashboard.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from trainmon.section import Auto, Invalid, setting

Provider = Literal["tencent", "self-hosted"]
PROVIDERS: tuple[str, ...] = ("auto", "tencent", "self-hosted")

DEFAULT_METADATA_URL = "http://metadata.tencentyun.com"

#: The fixed labels of ``trainmon_node_info``, in exposition order.
IDENTITY_LABELS: tuple[str, ...] = ("provider", "instance_id", "instance_type", "region", "zone")
#: Fixed labels that a self-hosted node's configuration may supply (a cloud
#: node takes them from the metadata service).
CONFIGURABLE_IDENTITY: frozenset[str] = frozenset({"instance_type", "region", "zone"})
#: Labels Prometheus sets on every series of the target (``node`` through the
#: relabelling of deploy/prometheus/*.yml): a node label of that name would be
#: renamed ``exported_<name>`` and break every join on it.
RESERVED_LABELS: frozenset[str] = frozenset({"job", "instance", "node"})
MAX_LABELS = 16
MAX_LABEL_VALUE_LENGTH = 128
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _url(value: str) -> str:
    if not re.fullmatch(r"https?://[^\s/?#]+(?:/[^\s?#]*)?", value):
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
    return value.rstrip("/")


def _sorted(labels: Mapping[str, str]) -> dict[str, str]:
    return dict(sorted(labels.items()))


@dataclass(frozen=True)
class PlatformConfig:
    """Instance identity and spot reclaim (README: ``collectors.platform``)."""

    #: ``auto`` and ``true`` are the same: every node has a platform, at worst
    #: ``self-hosted``; ``false`` drops the collector.
    enabled: bool | Auto = "auto"
    #: ``auto``: Tencent if DMI says so or the metadata service answers a
    #: valid instance id, else self-hosted.
    provider: Provider | Auto = field(default="auto", metadata=setting(choices=PROVIDERS))
    metadata_url: str = field(default=DEFAULT_METADATA_URL, metadata=setting(parse=_url))
    #: Seconds between two reads of ``spot/termination-time``.
    spot_interval_seconds: float = field(default=5.0, metadata=setting(minimum=1, maximum=60))
    #: Seconds between two reads of the instance identity.
    identity_interval_seconds: float = field(
        default=600.0, metadata=setting(minimum=10, maximum=86400))
    #: Connect and read timeout of one metadata request, seconds.
    timeout_seconds: float = field(default=1.0, metadata=setting(minimum=0.1, maximum=10))
    #: Extra labels of ``trainmon_node_info`` (name → value), sorted by name.
    labels: Mapping[str, str] = field(default_factory=dict, metadata=setting(parse=_sorted))
    #: Overrides what the metadata service says about spot billing.
    spot: bool | None = None

    @property
    def extra_labels(self) -> tuple[str, ...]:
        """Configured label names that are not identity labels, sorted."""
        return tuple(sorted(name for name in self.labels if name not in CONFIGURABLE_IDENTITY))

    def check(self) -> None:
        """Rules between the keys (``trainmon.section.read_section``)."""
        _check_labels(self.labels, self.provider)
        if self.timeout_seconds * 2 > self.spot_interval_seconds:
            raise Invalid(
                "timeout_seconds",
                "must be at most half of spot_interval_seconds (a poll is two requests)",
            )


def _check_labels(labels: Mapping[str, str], provider: str) -> None:
    if len(labels) > MAX_LABELS:
        raise Invalid("labels", f"at most {MAX_LABELS} labels, got {len(labels)}")
    for name, value in labels.items():
        where = f"labels.{name}"
        if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise Invalid(
                where, "not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, no leading __)"
            )
        if name in RESERVED_LABELS:
            raise Invalid(
                where, "set by Prometheus on every series of the target; pick another name"
            )
        if name in IDENTITY_LABELS and name not in CONFIGURABLE_IDENTITY:
            raise Invalid(where, f"{name} is a fixed label of trainmon_node_info, set by trainmon")
        if name in CONFIGURABLE_IDENTITY and provider == "tencent":
            raise Invalid(
                where,
                f"{name} comes from the Tencent metadata service; set it on self-hosted nodes only",
            )
        if not value:
            raise Invalid(where, "empty value (leave the label out instead)")
        if len(value) > MAX_LABEL_VALUE_LENGTH:
            raise Invalid(where, f"longer than {MAX_LABEL_VALUE_LENGTH} characters")
