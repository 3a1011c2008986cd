"""Who a training process is: rank, local rank, world size and the GPU it drives.

Standard library only. Ranks come from the launcher's environment: torchrun
and most launchers set ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE``; Slurm's
``SLURM_PROCID`` / ``SLURM_LOCALID`` / ``SLURM_NTASKS`` and Open MPI's
``OMPI_COMM_WORLD_*`` are the fallbacks.

The GPU is reported as the NVML device index (what ``nvidia-smi`` and the
daemon's ``gpu`` label use), when it can be told:

1. the CUDA device PyTorch uses on the calling thread, if the process has
   imported torch and initialised CUDA (never imported by us);
2. otherwise, from ``CUDA_VISIBLE_DEVICES``: a single entry is the device, a
   list is indexed by the local rank (torchrun's convention);

and the CUDA (logical) index is mapped through ``CUDA_VISIBLE_DEVICES`` to the
physical index. Entries given as UUIDs (``GPU-…``, ``MIG-…``) cannot be mapped
without NVML, and CUDA's default device order can differ from NVML's unless
``CUDA_DEVICE_ORDER=PCI_BUS_ID``: the GPU is then unknown (empty ``gpu``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
_LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
_WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


@dataclass(frozen=True)
class RankIdentity:
    rank: int
    local_rank: int
    world_size: int


def rank_identity(
    environ: Mapping[str, str],
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
) -> RankIdentity:
    """Explicit values win; then the environment; then 0 / 0 / 1 (a single process)."""
    resolved_rank = rank if rank is not None else _first_int(environ, _RANK_VARIABLES, 0)
    resolved_local = (
        local_rank if local_rank is not None else _first_int(environ, _LOCAL_RANK_VARIABLES, 0)
    )
    resolved_size = (
        world_size if world_size is not None else _first_int(environ, _WORLD_SIZE_VARIABLES, 1)
    )
    return RankIdentity(resolved_rank, resolved_local, max(resolved_size, resolved_rank + 1))


@dataclass(frozen=True)
class NamedIdentity:
    """Which of rank, local rank and world size the caller or the environment named
    (as opposed to ``rank_identity``'s single-process defaults)."""

    rank: bool
    local_rank: bool
    world_size: bool


def named_identity(
    environ: Mapping[str, str],
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
) -> NamedIdentity:
    """What ``rank_identity`` took from the arguments or the environment rather than
    its defaults: a value given, or a variable holding a non-negative integer."""
    return NamedIdentity(
        rank is not None or _names_int(environ, _RANK_VARIABLES),
        local_rank is not None or _names_int(environ, _LOCAL_RANK_VARIABLES),
        world_size is not None or _names_int(environ, _WORLD_SIZE_VARIABLES),
    )


def detect_gpu(environ: Mapping[str, str], local_rank: int) -> str | None:
    """The NVML index of the GPU this process uses, as a decimal string, or None."""
    visible = _visible_devices(environ)
    if visible is not None and not visible:
        return None  # CUDA_VISIBLE_DEVICES hides every GPU
    logical = _torch_device(local_rank)
    if logical is None and visible is not None:
        if len(visible) == 1:
            logical = 0
        elif local_rank < len(visible):
            logical = local_rank
    return None if logical is None else physical_index(logical, environ)


def device_gpu(device: object) -> str | None:
    """The NVML index of a ``torch.device``-like ``device`` (``type``, ``index``), or None.

    None unless ``device.type`` is ``"cuda"``; an index of None means device 0.
    """
    if device is None or getattr(device, "type", None) != "cuda":
        return None
    return physical_index(getattr(device, "index", None) or 0, os.environ)


def physical_index(logical: int, environ: Mapping[str, str]) -> str | None:
    """Map CUDA device ``logical`` through ``CUDA_VISIBLE_DEVICES`` to the NVML index."""
    visible = _visible_devices(environ)
    if visible is None:
        return str(logical)
    if not 0 <= logical < len(visible) or not visible[logical].isdigit():
        return None  # UUID entries need NVML to map
    return str(int(visible[logical]))


def _visible_devices(environ: Mapping[str, str]) -> list[str] | None:
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break  # CUDA stops at the first invalid entry
        entries.append(entry)
    return entries


def _torch_device(local_rank: int) -> int | None:
    """The current CUDA device of an already-initialised torch, else None.

    A rank with ``local_rank`` k > 0 that reports device 0 most likely moved
    its model to ``cuda:k`` without ``torch.cuda.set_device``; k is used then.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            return None
        device = int(cuda.current_device())
        if device == 0 and 0 < local_rank < int(cuda.device_count()):
            return local_rank
        return device
    except (AttributeError, RuntimeError, TypeError, ValueError) as error:
        log.debug("cannot read the current CUDA device: %s", error)
        return None


def _names_int(environ: Mapping[str, str], names: tuple[str, ...]) -> bool:
    """Whether one of ``names`` holds what ``_first_int`` would take (without its warning)."""
    for name in names:
        try:
            if int(environ.get(name, "")) >= 0:
                return True
        except ValueError:
            continue
    return False


def _first_int(environ: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = environ.get(name)
        if value is None:
            continue
        try:
            number = int(value)
        except ValueError:
            log.warning("ignoring %s=%r: not an integer", name, value)
            continue
        if number >= 0:
            return number
    return default
