"""The ``collectors.tencent`` configuration section: the Cloud Monitor puller.

Parsed by ``trainmon.config``; docs/tencent-cloud.md explains every key.
Secrets are accepted only as ``${VAR}`` references or files, never inline.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainmon.settings import ConfigError, Section


@dataclass(frozen=True)
class TencentConfig:
    """The Cloud Monitor puller (docs/tencent-cloud.md has every key explained)."""

    enabled: bool = False
    #: Monitor API endpoint; cvm./cbs. hosts are derived from a monitor.* host.
    endpoint: str = "https://monitor.tencentcloudapi.com"
    #: None: this CVM's region from the metadata service.
    region: str | None = None
    #: Several regions (discovery only); overrides ``region``.
    regions: tuple[str, ...] = ()
    secret_id: str | None = field(default=None, repr=False)
    #: Only ever a ``${VAR}`` reference in the file (checked when parsing).
    secret_key: str | None = field(default=None, repr=False)
    secret_key_file: Path | None = None
    session_token: str | None = field(default=None, repr=False)
    #: CAM role of the CVM; None: the role the metadata service lists.
    role: str | None = None
    metadata_url: str = "http://metadata.tencentyun.com"
    instances: tuple[str, ...] = ()
    disks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Tag filters for DescribeInstances when ``instances`` is empty.
    discovery_tags: Mapping[str, str] = field(default_factory=dict)
    discover_disks: bool = True
    discovery_interval_seconds: float = 600.0
    #: Tencent metric names to pull; empty: the whole catalogue.
    metrics: tuple[str, ...] = ()
    period_seconds: int = 60
    delay_seconds: int = 120
    window_periods: int = 5
    batch_size: int = 10
    rate_limit: float = 15.0
    concurrency: int = 4
    request_timeout_seconds: float = 10.0
    max_retries: int = 2

    @property
    def target_regions(self) -> tuple[str | None, ...]:
        """The regions to pull; ``(None,)`` means "ask the metadata service"."""
        return self.regions or (self.region,)


def parse_tencent(section: Section) -> TencentConfig:
    """The ``collectors.tencent`` section (docs/tencent-cloud.md)."""
    from trainmon.tencent.catalogue import select

    default = TencentConfig()
    result = TencentConfig(
        enabled=section.boolean("enabled", False),
        endpoint=_url(section, "endpoint", default.endpoint),
        region=section.optional_string("region"),
        regions=section.string_list("regions"),
        secret_id=section.optional_string("secret_id"),
        secret_key=_secret_reference(section, "secret_key"),
        secret_key_file=section.optional_path("secret_key_file"),
        session_token=_secret_reference(section, "session_token"),
        role=section.optional_string("role"),
        metadata_url=_url(section, "metadata_url", default.metadata_url),
        instances=section.string_list("instances"),
        disks=section.string_list_map("disks"),
        discovery_tags=section.string_map("discovery_tags"),
        discover_disks=section.boolean("discover_disks", default.discover_disks),
        discovery_interval_seconds=section.number(
            "discovery_interval_seconds", default.discovery_interval_seconds, 10, 86400
        ),
        metrics=section.string_list("metrics"),
        period_seconds=section.integer("period_seconds", default.period_seconds, 1, 86400),
        delay_seconds=section.integer("delay_seconds", default.delay_seconds, 0, 86400),
        window_periods=section.integer("window_periods", default.window_periods, 1, 60),
        batch_size=section.integer("batch_size", default.batch_size, 1, 50),
        rate_limit=section.number("rate_limit", default.rate_limit, 0.1, 20),
        concurrency=section.integer("concurrency", default.concurrency, 1, 32),
        request_timeout_seconds=section.number(
            "request_timeout_seconds", default.request_timeout_seconds, 0.1, 120
        ),
        max_retries=section.integer("max_retries", default.max_retries, 0, 10),
    )
    section.finish()
    try:
        select(result.metrics)
    except ValueError as error:
        raise ConfigError(section.key_path("metrics"), str(error)) from None
    if result.enabled:
        _check_tencent(section, result)
    return result


def _check_tencent(section: Section, config: TencentConfig) -> None:
    """Rules between keys of an enabled tencent section (a disabled one may be partial)."""
    checks = [
        ("secret_key_file", config.secret_key and config.secret_key_file,
         "set secret_key or secret_key_file, not both"),
        ("secret_id", config.secret_id and not (config.secret_key or config.secret_key_file),
         "secret_id needs secret_key or secret_key_file"),
        ("secret_key", (config.secret_key or config.secret_key_file) and not config.secret_id,
         "secret_key needs secret_id"),
        ("regions", config.region and config.regions, "set region or regions, not both"),
        ("instances", config.instances and len(config.regions) > 1,
         "static instances need a single region; use discovery_tags for several regions"),
        ("disks", config.disks and not config.instances,
         "disks needs instances (with discovery, disks are discovered too)"),
        ("discovery_tags", config.discovery_tags and config.instances,
         "discovery_tags has no effect when instances are listed"),
    ]
    for key, failed, message in checks:
        if failed:
            raise ConfigError(section.key_path(key), message)


def _secret_reference(section: Section, key: str) -> str | None:
    """A secret, accepted only as a ``${VAR}`` reference so it never sits in the file."""
    raw = section.raw(key)
    if raw is None:
        return None
    if not isinstance(raw, str) or not re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", raw):
        raise ConfigError(
            section.key_path(key),
            "must be a ${VAR} reference to an environment variable (or use a *_file key); "
            "secrets are not written into configuration files",
        )
    return section.optional_string(key)


def _url(section: Section, key: str, default: str) -> str:
    value = section.string(key, default)
    if not re.fullmatch(r"https?://[^/\s]+/?", value):
        raise ConfigError(section.key_path(key), f"expected http(s)://host[:port], got {value!r}")
    return value.rstrip("/")
