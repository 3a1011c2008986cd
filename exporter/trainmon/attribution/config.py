"""The ``collectors.attribution`` configuration section: GPU processes → pods or Slurm jobs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from trainmon.settings import ConfigError, Section


@dataclass(frozen=True)
class AttributionConfig:
    """GPU process → pod/namespace/container or Slurm job (docs/diagnosis.md)."""

    enabled: bool = True
    #: Kubelet base URL for pod names (``https://$(NODE_IP):10250``); None: pod UIDs only.
    kubelet_url: str | None = None
    #: Bearer token file for the kubelet (a service account token, re-read on use).
    kubelet_token_file: Path | None = None
    kubelet_ca_file: Path | None = None
    kubelet_insecure_skip_verify: bool = False
    #: The pod list is fetched on an unknown pod, at most once per this many seconds.
    kubelet_refresh_seconds: float = 30.0
    kubelet_timeout_seconds: float = 5.0
    #: Check GPU processes' NCCL_* environment (trainmon_nccl_problem_info).
    nccl_checks: bool = True


def parse_attribution(section: Section) -> AttributionConfig:
    """The ``collectors.attribution`` section."""
    default = AttributionConfig()
    kubelet_url = section.optional_string("kubelet_url")
    if kubelet_url is not None and not re.fullmatch(r"https?://[^/\s]+/?", kubelet_url):
        raise ConfigError(
            section.key_path("kubelet_url"), f"expected http(s)://host:port, got {kubelet_url!r}"
        )
    result = AttributionConfig(
        enabled=section.boolean("enabled", default.enabled),
        kubelet_url=kubelet_url.rstrip("/") if kubelet_url else None,
        kubelet_token_file=section.optional_path("kubelet_token_file"),
        kubelet_ca_file=section.optional_path("kubelet_ca_file"),
        kubelet_insecure_skip_verify=section.boolean(
            "kubelet_insecure_skip_verify", default.kubelet_insecure_skip_verify
        ),
        kubelet_refresh_seconds=section.number(
            "kubelet_refresh_seconds", default.kubelet_refresh_seconds, 1, 3600
        ),
        kubelet_timeout_seconds=section.number(
            "kubelet_timeout_seconds", default.kubelet_timeout_seconds, 0.1, 60
        ),
        nccl_checks=section.boolean("nccl_checks", default.nccl_checks),
    )
    section.finish()
    return result
