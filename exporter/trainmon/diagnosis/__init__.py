"""The 算 通 存 调 diagnosis: compute, communication, storage or scheduling.

``samples`` holds snapshots of metric samples and windows over them,
``measure`` turns a window into node measurements (``platform`` the platform
signals among them), ``rules`` into one verdict per job, ``risks`` into the
risk findings beside it (spot reclaim, checkpoints, NUMA, NCCL transport),
``text`` into plain language (English, Chinese). The daemon's
``collectors.diagnosis`` and ``trainmon doctor`` both run this pipeline.
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
