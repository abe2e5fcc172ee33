# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The NVML backend: one raw snapshot of the GPUs through the pynvml bindings (nvidia-ml-py).

Pure glue over pynvml: no AnsibleModule. Errors are raised as the typed errors of _errors.
A field NVML cannot give (NOT_SUPPORTED) is None, never guessed.
"""

from __future__ import annotations

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors

try:
    import pynvml
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - depends on the target host
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = str(exc)

MIB = 1024 * 1024
UNKNOWN_RETRIES = 3
_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
# NVML return codes (nvml.h), so that this file does not depend on pynvml's constant names.
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_LIB_RM_VERSION_MISMATCH = 18
_UNKNOWN = 999
_INIT_KINDS = {
    _LIBRARY_NOT_FOUND: "library_not_found",
    _DRIVER_NOT_LOADED: "driver_not_loaded",
    _LIB_RM_VERSION_MISMATCH: "version_mismatch",
    _NO_PERMISSION: "no_permission",
}


class _Lost(Exception):
    """Internal: the GPU fell off the bus during a query."""


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def init() -> None:
    """nvmlInit, mapping failures to typed errors. Safe to call more than once."""
    if not HAS_PYNVML:
        raise _errors.LibraryNotFound(
            f"the Python NVML bindings are not installed ({PYNVML_IMPORT_ERROR}): install nvidia-ml-py"
            " on the target, or use backend=nvidia-smi", backend="nvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        kind = _INIT_KINDS.get(exc.value)
        if kind:
            raise _errors.message_for_init_failure(kind, "nvml", str(exc)) from None
        raise _errors.BackendError(f"NVML initialisation failed: {exc}", backend="nvml", code=exc.value) from None


def _call(fn, *args):
    """One NVML call: None when NOT_SUPPORTED, retried on intermittent UNKNOWN, _Lost when lost."""
    for attempt in range(UNKNOWN_RETRIES):
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if exc.value == _NOT_SUPPORTED:
                return None
            if exc.value == _GPU_IS_LOST:
                raise _Lost() from None
            if exc.value == _UNKNOWN and attempt + 1 < UNKNOWN_RETRIES:
                continue
            raise
    return None  # pragma: no cover


def _processes(handle) -> list:
    """Compute, graphics and MPS processes, merged per pid. _v3 falls back to _v2."""
    queries = [
        ("compute", "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"),
        ("graphics", "nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
        ("mps", "nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v2"),
    ]
    merged = {}
    for kind, name, fallback in queries:
        fn = getattr(pynvml, name, None)
        if fn is None:
            continue
        try:
            infos = _call(fn, handle)
        except (pynvml.NVMLLibraryMismatchError, pynvml.NVMLError_FunctionNotFound):
            fn2 = getattr(pynvml, fallback, None)
            try:
                infos = _call(fn2, handle) if fn2 else None
            except pynvml.NVMLError_FunctionNotFound:
                infos = None
        for info in infos or []:
            used = getattr(info, "usedGpuMemory", None)
            entry = merged.setdefault(info.pid, {"pid": info.pid, "types": [], "used_mib": None})
            entry["types"].append(kind)
            if used is not None:
                entry["used_mib"] = max(entry["used_mib"] or 0, used // MIB)
    return sorted(merged.values(), key=lambda p: p["pid"])


def _gpu(index: int) -> dict:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    gpu = {"index": index, "health": {"status": "ok", "detail": None}}
    identity = [
        ("uuid", pynvml.nvmlDeviceGetUUID),
        ("name", pynvml.nvmlDeviceGetName),
        ("serial", pynvml.nvmlDeviceGetSerial),
        ("minor_number", pynvml.nvmlDeviceGetMinorNumber),
    ]
    try:
        for key, fn in identity:
            gpu[key] = _text(_call(fn, handle))
        pci = _call(pynvml.nvmlDeviceGetPciInfo, handle)
        gpu["pci_bus_id"] = _text(pci.busId) if pci is not None else None
    except _Lost:
        gpu.setdefault("pci_bus_id", None)
    try:
        mem = _call(pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
        if mem is None:
            gpu["memory"] = {"total": None, "used": None, "free": None, "reserved": None}
        else:
            gpu["memory"] = {"total": mem.total // MIB, "used": mem.used // MIB, "free": mem.free // MIB,
                             "reserved": mem.reserved // MIB}
        util = _call(pynvml.nvmlDeviceGetUtilizationRates, handle)
        gpu["utilization"] = {"gpu": util.gpu if util else None, "memory": util.memory if util else None}
        gpu["temperature"] = _call(pynvml.nvmlDeviceGetTemperature, handle, 0)
        power = _call(pynvml.nvmlDeviceGetPowerUsage, handle)
        gpu["power"] = round(power / 1000.0, 2) if power is not None else None
        persistence = _call(pynvml.nvmlDeviceGetPersistenceMode, handle)
        gpu["persistence_mode"] = None if persistence is None else bool(persistence)
        compute = _call(pynvml.nvmlDeviceGetComputeMode, handle)
        gpu["compute_mode"] = None if compute is None else _COMPUTE_MODES.get(compute, str(compute))
        mig = _call(pynvml.nvmlDeviceGetMigMode, handle)
        gpu["mig_mode"] = None if mig is None else bool(mig[0])
        gpu["processes"] = _processes(handle)
    except _Lost:
        gpu["health"] = {"status": "lost", "detail": "GPU is lost (fallen off the bus)"}
    except pynvml.NVMLError as exc:
        gpu["health"] = {"status": "error", "detail": str(exc)}
    for key in ("uuid", "name", "serial", "minor_number", "pci_bus_id", "temperature", "power",
                "persistence_mode", "compute_mode", "mig_mode"):
        gpu.setdefault(key, None)
    gpu.setdefault("memory", {"total": None, "used": None, "free": None, "reserved": None})
    gpu.setdefault("utilization", {"gpu": None, "memory": None})
    gpu.setdefault("processes", [])
    return gpu


def query() -> dict:
    """A raw snapshot: driver versions and every GPU, with NVML's processes (host-side pids)."""
    init()
    try:
        count = pynvml.nvmlDeviceGetCount()
        cuda = _call(pynvml.nvmlSystemGetCudaDriverVersion)
        driver = {
            "backend": "nvml",
            "driver_version": _text(_call(pynvml.nvmlSystemGetDriverVersion)),
            "nvml_version": _text(_call(pynvml.nvmlSystemGetNVMLVersion)),
            "cuda_driver_version": None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}",
        }
        return {"driver": driver, "gpus": [_gpu(i) for i in range(count)]}
    except pynvml.NVMLError as exc:
        raise _errors.BackendError(f"NVML query failed: {exc}", backend="nvml", code=exc.value) from None
