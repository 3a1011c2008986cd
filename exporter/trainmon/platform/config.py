"""The ``collectors.platform`` configuration section: who this node is, and spot reclaim.

Parsed by ``trainmon.config``; the README's configuration reference lists the
keys. ``labels`` are extra labels of ``trainmon_node_info`` (``leaf``,
``rack``...): the placement rules count distinct values of them per job, so
their names are validated here, with the key path, rather than discovered
broken in a dashboard.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from trainmon.settings import Auto, ConfigError, Section

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


@dataclass(frozen=True)
class PlatformConfig:
    """Instance identity and spot reclaim (README: ``collectors.platform``)."""

    #: ``auto`` and ``true`` are the same: every node has a platform, at worst
    #: ``self-hosted``; ``false`` drops the collector.
    enabled: bool | Auto = "auto"
    #: ``auto``: Tencent if DMI says so or the metadata service answers a
    #: valid instance id, else self-hosted.
    provider: Provider | Auto = "auto"
    metadata_url: str = DEFAULT_METADATA_URL
    #: Seconds between two reads of ``spot/termination-time``.
    spot_interval_seconds: float = 5.0
    #: Seconds between two reads of the instance identity.
    identity_interval_seconds: float = 600.0
    #: Connect and read timeout of one metadata request, seconds.
    timeout_seconds: float = 1.0
    #: Extra labels of ``trainmon_node_info`` (name → value), sorted by name.
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Overrides what the metadata service says about spot billing.
    spot: bool | None = None

    @property
    def extra_labels(self) -> tuple[str, ...]:
        """Configured label names that are not identity labels, sorted."""
        return tuple(sorted(name for name in self.labels if name not in CONFIGURABLE_IDENTITY))


def parse_platform(section: Section) -> PlatformConfig:
    """The ``collectors.platform`` section."""
    default = PlatformConfig()
    provider = section.choice("provider", "auto", PROVIDERS)
    result = PlatformConfig(
        enabled=section.enabled("enabled", "auto"),
        provider=provider,  # type: ignore[arg-type]  # checked by choice()
        metadata_url=_url(section, "metadata_url", default.metadata_url),
        spot_interval_seconds=section.number(
            "spot_interval_seconds", default.spot_interval_seconds, 1, 60
        ),
        identity_interval_seconds=section.number(
            "identity_interval_seconds", default.identity_interval_seconds, 10, 86400
        ),
        timeout_seconds=section.number("timeout_seconds", default.timeout_seconds, 0.1, 10),
        labels=_labels(section, provider),
        spot=_optional_bool(section, "spot"),
    )
    section.finish()
    if result.timeout_seconds * 2 > result.spot_interval_seconds:
        raise ConfigError(
            section.key_path("timeout_seconds"),
            "must be at most half of spot_interval_seconds (a poll is two requests)",
        )
    return result


def _url(section: Section, key: str, default: str) -> str:
    value = section.string(key, default)
    if not re.fullmatch(r"https?://[^\s/?#]+(?:/[^\s?#]*)?", value):
        raise ConfigError(
            section.key_path(key), f"expected an http:// or https:// URL, got {value!r}"
        )
    return value.rstrip("/")


def _optional_bool(section: Section, key: str) -> bool | None:
    value = section.raw(key)
    if value is None or isinstance(value, bool):
        return value
    raise ConfigError(section.key_path(key), f"expected true, false or null, got {value!r}")


def _labels(section: Section, provider: str) -> dict[str, str]:
    labels = section.string_map("labels")
    path = section.key_path("labels")
    if len(labels) > MAX_LABELS:
        raise ConfigError(path, f"at most {MAX_LABELS} labels, got {len(labels)}")
    for name, value in labels.items():
        where = f"{path}.{name}"
        if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise ConfigError(
                where, "not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, no leading __)"
            )
        if name in RESERVED_LABELS:
            raise ConfigError(
                where, "set by Prometheus on every series of the target; pick another name"
            )
        if name in IDENTITY_LABELS and name not in CONFIGURABLE_IDENTITY:
            raise ConfigError(
                where, f"{name} is a fixed label of trainmon_node_info, set by trainmon"
            )
        if name in CONFIGURABLE_IDENTITY and provider == "tencent":
            raise ConfigError(
                where,
                f"{name} comes from the Tencent metadata service; set it on self-hosted nodes only",
            )
        if not value:
            raise ConfigError(where, "empty value (leave the label out instead)")
        if len(value) > MAX_LABEL_VALUE_LENGTH:
            raise ConfigError(where, f"longer than {MAX_LABEL_VALUE_LENGTH} characters")
    return dict(sorted(labels.items()))
