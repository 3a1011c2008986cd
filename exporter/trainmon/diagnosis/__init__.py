"""The 算 通 存 调 diagnosis: compute, communication, storage or scheduling.

``samples`` holds snapshots of metric samples and windows over them,
``measure`` turns a window into node measurements (``platform_signals`` the
platform signals among them), ``rules`` into one verdict per job, ``risks``
into the risk findings beside it (spot reclaim, checkpoints, NUMA, NCCL
transport); ``finding`` is what both raise, ``nccl`` the NCCL environment
checks, ``thresholds`` the thresholds (the ``collectors.diagnosis`` section).
The daemon's ``diagnosis`` collector and ``trainmon doctor`` both run this
pipeline.

This package is the engine: it returns dataclasses and has no words. The
report built from them, its JSON and text and the English and Chinese
messages live above it, in ``trainmon.report``; nothing here imports that (or
``trainmon.runs``).
"""

from trainmon.diagnosis.finding import Finding
from trainmon.diagnosis.measure import NodeMeasurements, measure
from trainmon.diagnosis.rules import ACTIONABLE_KINDS, KINDS, Evidence, Verdict, diagnose
from trainmon.diagnosis.samples import ScrapedSamples, Window

__all__ = [
    "ACTIONABLE_KINDS",
    "KINDS",
    "Evidence",
    "Finding",
    "NodeMeasurements",
    "ScrapedSamples",
    "Verdict",
    "Window",
    "diagnose",
    "measure",
]
