"""The profiler of an on-demand profile (``trainmon.client.profiling``); imports torch.

Imported only when a profile is asked, on the training thread.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


def start_profiler() -> Any:
    """A started ``torch.profiler.profile`` of the CPU, and of CUDA where there is one:
    no shapes, no stacks, no memory (the operators' times are what it is for).
    ``RuntimeError`` while a profiler of the job's own runs on this thread."""
    if torch._C._autograd._profiler_enabled():
        # another would silently end that one's session (torch warns only when it stops)
        raise RuntimeError("a torch.profiler of the job's own is running; not starting "
                           "another")
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    profiler = profile(activities=activities, record_shapes=False, profile_memory=False,
                       with_stack=False)
    profiler.start()
    return profiler
