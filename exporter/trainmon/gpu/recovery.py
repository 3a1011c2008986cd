"""The recommended recovery action of a GPU: the driver's, else trainmon's XID table.

``trainmon_gpu_recovery_action{gpu,action,source}`` has one series per GPU:

- ``source="driver"``: NVML's field ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``
  (``nvmlGpuRecoveryAction_t``, drivers of the R570 era and later), named by
  ``DRIVER_ACTIONS``. The driver knows the GPU's state (a pending row remap, a
  contained or uncontained error, a fabric fault) and is taken first whenever
  it asks for something.
- ``source="xid_table"``: where the driver does not give the field, or gives
  ``NONE`` while an XID seen in the last ``XID_LOOKBACK_SECONDS`` calls for an
  action (a job restart is the application's, not the GPU's, so the driver
  never asks for it), the most disruptive action ``XID_ACTIONS`` names for
  those XIDs.
- ``source="none"``: neither says anything (``action="none"``); with the
  driver's field present and ``NONE`` and no XID of the table, ``source`` is
  ``driver``.

``XID_ACTIONS`` follows the "Resolution Bucket (Immediate Action)" column of
NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html:
``RESTART_APP`` → ``restart_job``, ``RESET_GPU`` → ``reset_gpu``, ``RESTART_BM``
→ ``reboot``) and its page-retirement / row-remapping guides; the choices
trainmon makes itself are marked in docs/metrics.md ("Recovery action"), where
the table is printed. XIDs it does not list ask for no action.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: Actions, least to most disruptive (the XID table picks the last one that applies).
ACTIONS = (
    "none",
    "restart_job",
    "drain_p2p",
    "reset_gpu",
    "drain_and_reset",
    "recover_imex_domain",
    "reboot",
)
#: ``nvmlGpuRecoveryAction_t`` → ``action`` label (pynvml's ``NVML_GPU_RECOVERY_ACTION_*``).
DRIVER_ACTIONS: Mapping[int, str] = {
    0: "none",  # NONE
    1: "reset_gpu",  # GPU_RESET
    2: "reboot",  # NODE_REBOOT
    3: "drain_p2p",  # DRAIN_P2P: stop peer-to-peer (NVLink) traffic through this GPU
    4: "drain_and_reset",  # DRAIN_AND_RESET: drain P2P, then reset the GPU
    5: "recover_imex_domain",  # RECOVER_IMEX_DOMAIN: the NVLink domain's IMEX daemons
    6: "reset_gpu",  # BUS_RESET: reset the GPU's PCIe bus (a GPU reset from the slot)
    7: "reboot",  # SYSTEM_REBOOT
}
#: What a driver code newer than ``DRIVER_ACTIONS`` is exported as.
UNKNOWN_DRIVER_ACTION = "unknown"
#: XIDs older than this (seconds since trainmon received them) no longer count.
XID_LOOKBACK_SECONDS = 3600.0

#: XID → action. Sources and trainmon's own choices: docs/metrics.md, "Recovery action".
XID_ACTIONS: Mapping[int, str] = {
    8: "restart_job",  # GPU stopped processing (idle timeout)
    13: "restart_job",  # graphics engine exception (usually the application)
    31: "restart_job",  # GPU memory page fault (MMU)
    43: "restart_job",  # GPU stopped processing (the channel was reset)
    45: "restart_job",  # preemptive cleanup after an earlier error
    48: "reset_gpu",  # double-bit ECC error
    61: "reset_gpu",  # internal micro-controller breakpoint
    62: "reset_gpu",  # internal micro-controller halt
    63: "reset_gpu",  # row remap / page retirement recorded: a reset applies it
    64: "drain_and_reset",  # row remap / page retirement failed to record: service the GPU
    69: "restart_job",  # graphics engine class error
    74: "reset_gpu",  # NVLink error
    79: "reboot",  # GPU has fallen off the bus
    92: "restart_job",  # high single-bit ECC error rate
    94: "restart_job",  # contained ECC error: only the affected application stops
    95: "reset_gpu",  # uncontained ECC error
    109: "restart_job",  # context switch timeout
    119: "reset_gpu",  # GSP RPC timeout
    120: "reset_gpu",  # GSP error
    140: "reset_gpu",  # unrecovered ECC error
}


def xid_action(xids: Iterable[int]) -> str:
    """The most disruptive action ``XID_ACTIONS`` gives for these XID codes ("none")."""
    actions = [XID_ACTIONS[xid] for xid in xids if xid in XID_ACTIONS]
    return max(actions, key=ACTIONS.index, default="none")


def recommended_action(driver_code: int | None, recent_xids: Iterable[int]) -> tuple[str, str]:
    """``(action, source)`` for one GPU: the driver's code (None where it does not
    give one) and the XID codes it reported in the look-back (module docstring)."""
    driver = None
    if driver_code is not None:
        driver = DRIVER_ACTIONS.get(driver_code, UNKNOWN_DRIVER_ACTION)
        if driver != "none":
            return driver, "driver"
    table = xid_action(recent_xids)
    if table != "none":
        return table, "xid_table"
    return "none", "none" if driver is None else "driver"
