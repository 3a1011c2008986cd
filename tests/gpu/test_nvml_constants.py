"""The facade's NVML numbers against pynvml's, and pynvml left unimported without NVML.

``trainmon.gpu.nvml`` writes nvml.h's constants as numbers so that importing it
does not import pynvml (with ctypes, subprocess and shutil): a daemon on a node
without a driver never loads it. These tests hold the numbers to pynvml's names.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pynvml

from trainmon.gpu import nvml

#: The facade's constant → pynvml's name for it.
_NAMES = {
    "ERROR_UNINITIALIZED": "NVML_ERROR_UNINITIALIZED",
    "ERROR_NOT_SUPPORTED": "NVML_ERROR_NOT_SUPPORTED",
    "ERROR_NO_PERMISSION": "NVML_ERROR_NO_PERMISSION",
    "ERROR_NOT_FOUND": "NVML_ERROR_NOT_FOUND",
    "ERROR_DRIVER_NOT_LOADED": "NVML_ERROR_DRIVER_NOT_LOADED",
    "ERROR_TIMEOUT": "NVML_ERROR_TIMEOUT",
    "ERROR_LIBRARY_NOT_FOUND": "NVML_ERROR_LIBRARY_NOT_FOUND",
    "ERROR_FUNCTION_NOT_FOUND": "NVML_ERROR_FUNCTION_NOT_FOUND",
    "ERROR_GPU_IS_LOST": "NVML_ERROR_GPU_IS_LOST",
    "ERROR_LIB_RM_VERSION_MISMATCH": "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "ERROR_ARGUMENT_VERSION_MISMATCH": "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
    "ERROR_UNKNOWN": "NVML_ERROR_UNKNOWN",
    "GPU_UTILIZATION_SAMPLES": "NVML_GPU_UTILIZATION_SAMPLES",
    "EVENT_XID_CRITICAL_ERROR": "nvmlEventTypeXidCriticalError",
    "TEMPERATURE_GPU": "NVML_TEMPERATURE_GPU",
    "CLOCK_SM": "NVML_CLOCK_SM",
    "MEMORY_ERROR_CORRECTED": "NVML_MEMORY_ERROR_TYPE_CORRECTED",
    "MEMORY_ERROR_UNCORRECTED": "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
    "VOLATILE_ECC": "NVML_VOLATILE_ECC",
    "FIELD_PCIE_TX_BYTES": "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
    "FIELD_PCIE_RX_BYTES": "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
    "FIELD_NVLINK_DATA_TX_KIB": "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
    "FIELD_NVLINK_DATA_RX_KIB": "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
    "FIELD_NVLINK_LINK_COUNT": "NVML_FI_DEV_NVLINK_LINK_COUNT",
    "FIELD_GPU_RECOVERY_ACTION": "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
    "PAGE_RETIREMENT_SINGLE_BIT": "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
    "PAGE_RETIREMENT_DOUBLE_BIT": "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR",
    "FEATURE_ENABLED": "NVML_FEATURE_ENABLED",
    "FABRIC_STATE_NOT_SUPPORTED": "NVML_GPU_FABRIC_STATE_NOT_SUPPORTED",
    "FABRIC_STATE_COMPLETED": "NVML_GPU_FABRIC_STATE_COMPLETED",
    "GPM_SM_ACTIVE": "NVML_GPM_METRIC_SM_UTIL",
    "GPM_SM_OCCUPANCY": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "GPM_TENSOR_ACTIVE": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "GPM_DRAM_ACTIVE": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "GPM_METRICS_GET_VERSION": "NVML_GPM_METRICS_GET_VERSION",
    "VALUE_TYPE_DOUBLE": "NVML_VALUE_TYPE_DOUBLE",
}
_THROTTLE = {
    "power": "POWER", "thermal": "THERMAL", "sync_boost": "SYNC_BOOST",
    "board_limit": "BOARD_LIMIT", "low_utilization": "LOW_UTILIZATION",
    "reliability": "RELIABILITY", "app_clocks": "TOTAL_APP_CLOCKS",
    "base_clocks": "TOTAL_BASE_CLOCKS",
}
_PIPES = {
    "fp16": "FP16_UTIL", "fp32": "FP32_UTIL", "fp64": "FP64_UTIL",
    "tensor_hmma": "HMMA_TENSOR_UTIL", "tensor_imma": "IMMA_TENSOR_UTIL",
    "tensor_dfma": "DFMA_TENSOR_UTIL",
}
_VALUE_TYPES = {
    "UNSIGNED_INT": "uiVal", "UNSIGNED_LONG": "ulVal", "UNSIGNED_LONG_LONG": "ullVal",
    "SIGNED_LONG_LONG": "sllVal", "SIGNED_INT": "siVal", "UNSIGNED_SHORT": "usVal",
}


def test_the_facades_numbers_are_pynvmls() -> None:
    assert {name: getattr(nvml, name) for name in _NAMES} == {
        name: getattr(pynvml, theirs) for name, theirs in _NAMES.items()
    }
    assert dict(nvml.THROTTLE_REASONS) == {
        reason: getattr(pynvml, f"NVML_PERF_POLICY_{policy}")
        for reason, policy in _THROTTLE.items()
    }
    assert dict(nvml.GPM_PIPES) == {
        pipe: getattr(pynvml, f"NVML_GPM_METRIC_{metric}") for pipe, metric in _PIPES.items()
    }
    assert {
        getattr(pynvml, f"NVML_VALUE_TYPE_{kind}"): member for kind, member in _VALUE_TYPES.items()
    } == nvml._VALUE_MEMBERS
    assert {
        value: name.removeprefix("NVML_ERROR_")
        for name, value in vars(pynvml).items()
        if name.startswith("NVML_ERROR_") and isinstance(value, int)
    } == nvml._ERROR_NAMES
    assert nvml.GPMMetricsGet is pynvml.c_nvmlGpmMetricsGet_t
    assert nvml.GPMSample is pynvml.c_nvmlGpmSample_t
    assert nvml.GPUFabricInfoV is pynvml.c_nvmlGpuFabricInfoV_t
    assert nvml.GPUFabricInfo is pynvml.c_nvmlGpuFabricInfo_t


def test_without_libnvidia_ml_the_facade_reports_it_and_leaves_pynvml_unimported() -> None:
    code = (
        "import sys\n"
        "from trainmon.gpu.nvml import NVML\n"
        "from trainmon.gpu.types import NVMLUnavailable\n"
        "nvml = NVML()\n"
        "for _ in range(2):\n"
        "    try:\n"
        "        nvml.devices()\n"
        "    except NVMLUnavailable as reason:\n"
        "        print(reason)\n"
        "print('pynvml' in sys.modules, 'ctypes' in sys.modules)\n"
    )
    environment = {key: value for key, value in os.environ.items() if key != "LD_LIBRARY_PATH"}
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env=environment)
    lines = answer.stdout.splitlines()
    if "LIBRARY_NOT_FOUND" not in answer.stdout:
        return  # this host has an NVIDIA driver: pynvml was imported for it
    assert lines == [
        "GPU collector disabled: libnvidia-ml.so.1 not found: no NVIDIA driver on this host "
        "(in a container, run with the NVIDIA container toolkit so the driver is mounted) "
        "[NVML_ERROR_LIBRARY_NOT_FOUND]",
    ] * 2 + ["False False"]
