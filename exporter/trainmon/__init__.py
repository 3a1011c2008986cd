"""trainmon: a Prometheus exporter that names the bottleneck of GPU training jobs."""

from __future__ import annotations

__version__ = "0.1.0"
