"""The simulated node behind ``trainmon serve --demo``.

The demo runs the real collectors over simulated sources, plugged in at the
same boundaries as real hardware: ``gpus`` is an NVML library for the NVML
facade (8 GPUs: a data-starved job on GPUs 0–3 whose utilization saw-tooths,
a healthy job on GPUs 4–7), ``node`` writes ``/proc`` and ``/sys`` files for the
node collectors, ``jobs`` runs simulated training jobs that push steps
through the real client, and ``history`` keeps an earlier, faster run of each
job in the demo's own run ledger. Demo data is labelled
``trainmon_build_info{mode="demo"}``.
"""
