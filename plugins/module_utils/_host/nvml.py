# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The NVML backend: one raw snapshot of the GPUs through the pynvml bindings (nvidia-ml-py).

No AnsibleModule here. It works on every driver branch from R440 to the newest:

- Process lists are read through ctypes with the entry layout the loaded library writes
  (``choose_process_query``): the ``_v3`` symbols write 32-byte ``nvmlProcessInfo_v3_t``
  entries on R535 (which has ``nvmlDeviceGetConfComputeMemSizeInfo`` but not yet
  ``nvmlDeviceGetRunningProcessDetailList``) and 24-byte entries on R510-R525 and R550+; the
  bindings always read 24 bytes. Before R510 there is only ``_v2`` (24 bytes), before R450 only
  the unversioned query (16 bytes).
- Memory is read with ``nvmlDeviceGetMemoryInfo_v2``, else v1 (whose ``used`` includes the
  reserved memory).
- Health (_health.CHECKS): remapped rows, retired pages pending, volatile uncorrectable ECC errors,
  the NVSwitch fabric state (``nvmlDeviceGetGpuFabricInfoV``, else the unversioned query, read with
  nvml.h's layout: its state is one byte, which the bindings' structure reads as four) and the
  clock event reasons (``...ClocksEventReasons``, else ``...ClocksThrottleReasons`` before R535).
- Every field is read on its own: a field the library or the GPU cannot give (FUNCTION_NOT_FOUND,
  NOT_SUPPORTED) is None and listed in the GPU's ``unsupported``; any other error is listed in
  the GPU's ``errors``, naming the GPU and the NVML function. A process list that cannot be read
  is ``processes_error`` (the GPU is then not idle), never an empty list.
"""

from __future__ import annotations

import ctypes
import time

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _health, _raw
from ansible_collections.gpuops.gpu.plugins.module_utils._host import mig_caps

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
RETRY_PAUSE_S = 0.02
# The kernel's PID_MAX_LIMIT on 64-bit: the largest pid_max can be (used when it cannot be read).
PID_MAX_LIMIT = 4194304
VALUE_NOT_AVAILABLE = 2 ** 64 - 1
_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
# NVML return codes (nvml.h), so that this file does not depend on pynvml's constant names.
_SUCCESS = 0
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_INSUFFICIENT_SIZE = 7
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_CORRUPTED_INFOROM = 14
_GPU_IS_LOST = 15
_LIB_RM_VERSION_MISMATCH = 18
_ARGUMENT_VERSION_MISMATCH = 25
_UNKNOWN = 999
_UNSUPPORTED_CODES = (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND)
_INIT_KINDS = {
    _LIBRARY_NOT_FOUND: "library_not_found",
    _DRIVER_NOT_LOADED: "driver_not_loaded",
    _LIB_RM_VERSION_MISMATCH: "version_mismatch",
    _NO_PERMISSION: "no_permission",
}
PROCESS_KINDS = (("compute", "Compute"), ("graphics", "Graphics"), ("mps", "MPSCompute"))


# The process entry layouts (nvml.h). ctypes gives them the C alignment: 16, 24 and 32 bytes.
class ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t: the unversioned ...RunningProcesses (R440 and older)."""
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcessInfoV2(ctypes.Structure):
    """nvmlProcessInfo_v2_t: _v2, and _v3 on R510-R525 and R550+."""
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class ProcessInfoV3(ctypes.Structure):
    """nvmlProcessInfo_v3_t: what the _v3 symbols write on R535."""
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint),
                ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


class PciInfoV1(ctypes.Structure):
    """The original nvmlPciInfo_t that the unversioned nvmlDeviceGetPciInfo fills."""
    _fields_ = [("busId", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("reserved", ctypes.c_uint * 4)]


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t as _v2 and _v3 fill it."""
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class GpuFabricInfoV1(ctypes.Structure):
    """nvmlGpuFabricInfo_t (nvml.h): state is an unsigned char; 28 bytes."""
    _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int), ("cliqueId", ctypes.c_uint),
                ("state", ctypes.c_ubyte)]


class GpuFabricInfoV2(ctypes.Structure):
    """nvmlGpuFabricInfo_v2_t (nvml.h): 36 bytes, version nvmlGpuFabricInfo_v2 = 0x02000024."""
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int),
                ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte), ("healthMask", ctypes.c_uint)]


FABRIC_INFO_V2 = ctypes.sizeof(GpuFabricInfoV2) | (2 << 24)
# nvmlMemoryErrorType_t / nvmlEccCounterType_t
_UNCORRECTED = 1
_VOLATILE = 0


class _Lost(Exception):
    """Internal: the GPU fell off the bus during a query."""


class _Failed(Exception):
    """Internal: one NVML call failed (not unsupported, not lost); ``text`` says how."""

    def __init__(self, function, text):
        super().__init__(text)
        self.function = function
        self.text = text


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def branch_of(driver_version) -> str:
    """'535.216.01' -> 'R535'; '' when it cannot be told."""
    head = str(driver_version or "").split(".", 1)[0]
    return f"R{head}" if head.isdigit() else ""


def choose_process_query(has_symbol, kind="Compute"):
    """(symbol, entry structure) for one process kind, by the symbols the library exports.

    ``has_symbol(name) -> bool``. ``_v3`` first: its entries are 32 bytes where
    nvmlDeviceGetConfComputeMemSizeInfo exists and nvmlDeviceGetRunningProcessDetailList does
    not (R535), else 24; then ``_v2`` (24 bytes); then the unversioned query (16 bytes).
    (None, None) when the library has none of them.
    """
    base = f"nvmlDeviceGet{kind}RunningProcesses"
    if has_symbol(base + "_v3"):
        r535 = has_symbol("nvmlDeviceGetConfComputeMemSizeInfo") and not has_symbol(
            "nvmlDeviceGetRunningProcessDetailList")
        return base + "_v3", (ProcessInfoV3 if r535 else ProcessInfoV2)
    if has_symbol(base + "_v2"):
        return base + "_v2", ProcessInfoV2
    if has_symbol(base):
        return base, ProcessInfoV1
    return None, None


def implausible_pid(pid: int, pid_max: int) -> bool:
    """A pid no process can have: 0, or at or above the kernel's pid_max."""
    return pid <= 0 or pid >= pid_max


def read_pid_max(path="/proc/sys/kernel/pid_max") -> int:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return PID_MAX_LIMIT


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
        raise _errors.BackendError(f"NVML initialisation failed (nvmlInitWithFlags): {exc}", backend="nvml",
                                   code=exc.value, function="nvmlInitWithFlags") from None


class _Library:
    """The loaded libnvidia-ml and what it exports (looked up once per symbol)."""

    def __init__(self):
        self.lib = getattr(pynvml, "nvmlLib", None) or ctypes.CDLL("libnvidia-ml.so.1")
        self._symbols = {}
        self._queries = None

    def has(self, name: str) -> bool:
        if name not in self._symbols:
            try:
                self._symbols[name] = getattr(self.lib, name)
            except AttributeError:
                self._symbols[name] = None
        return self._symbols[name] is not None

    def fn(self, name: str):
        return self._symbols[name] if self.has(name) else None

    def process_queries(self) -> list:
        """[(kind, symbol, function, entry structure)] of the process kinds this library can list (once)."""
        if self._queries is None:
            self._queries = []
            for kind, name in PROCESS_KINDS:
                symbol, struct = choose_process_query(self.has, name)
                if symbol is not None:
                    self._queries.append((kind, symbol, self.fn(symbol), struct))
        return self._queries


_LIBRARY = {}
_INFOROM = {}  # (library, index, bus id) -> whether the infoROM is corrupted (_GpuReader.inforom)


def _library() -> _Library:
    """The _Library of the loaded libnvidia-ml, made once per process."""
    lib = getattr(pynvml, "nvmlLib", None)
    key = id(lib)
    if key not in _LIBRARY:
        _LIBRARY[key] = _Library()
    return _LIBRARY[key]


class _GpuReader:
    """Reads one GPU field by field; collects what is unsupported and what failed."""

    def __init__(self, lib, index, handle, deadline, pid_max, branch):
        self.lib = lib
        self.index = index
        self.handle = handle
        self.deadline = deadline
        self.pid_max = pid_max
        self.branch = branch
        self.bus_id = None
        self.unsupported = []
        self.failures = []  # (field, function, text)

    def label(self) -> str:
        return f"GPU {self.index}" + (f" ({self.bus_id})" if self.bus_id else "")

    def _try(self, function, call):
        """call() with UNKNOWN retried (bounded by UNKNOWN_RETRIES and the deadline)."""
        tries = 0
        while True:
            tries += 1
            try:
                return call()
            except pynvml.NVMLError as exc:
                code = exc.value
                if code == _GPU_IS_LOST:
                    raise _Lost() from None
                if code in _UNSUPPORTED_CODES:
                    raise
                retry = code == _UNKNOWN and tries < UNKNOWN_RETRIES
                if retry and (self.deadline is None or time.monotonic() + RETRY_PAUSE_S < self.deadline):
                    time.sleep(RETRY_PAUSE_S)
                    continue
                raise _Failed(function, f"{exc}" + (f", {tries} tries" if tries > 1 else "")) from None

    def field(self, field, function, call):
        """One field's value; None (and noted) when unsupported or failed. _Lost propagates."""
        try:
            return self._try(function, call)
        except pynvml.NVMLError:  # FUNCTION_NOT_FOUND or NOT_SUPPORTED only (_try re-raises no other)
            if field not in self.unsupported:
                self.unsupported.append(field)
        except pynvml.NVMLLibraryMismatchError:
            if field not in self.unsupported:
                self.unsupported.append(field)
        except _Failed as exc:
            self.failures.append((field, exc.function, exc.text))
        return None

    def error_texts(self):
        return [f"{self.label()}: {function}: {text}" for _field, function, text in self.failures]

    # --- the fields ---------------------------------------------------------------------------

    def pci_bus_id(self):
        """_v3, else _v2 (same structure), else the unversioned v1 structure."""
        for name, struct in (("nvmlDeviceGetPciInfo_v3", PciInfo), ("nvmlDeviceGetPciInfo_v2", PciInfo),
                             ("nvmlDeviceGetPciInfo", PciInfoV1)):
            fn = self.lib.fn(name)
            if fn is None:
                continue
            info = struct()
            value = self.field("pci_bus_id", name, lambda fn=fn, info=info: _check(fn(self.handle, ctypes.byref(info))))
            if value is None:
                return None
            return f"{info.domain:08X}:{info.bus:02X}:{info.device:02X}.0"
        self.unsupported.append("pci_bus_id")
        return None

    def memory(self):
        """{total, used, free, reserved, used_includes_reserved}: _v2, else v1."""
        empty = {"total": None, "used": None, "free": None, "reserved": None, "used_includes_reserved": None}
        v2_failure = None
        if self.lib.has("nvmlDeviceGetMemoryInfo_v2"):
            try:
                mem = self._try("nvmlDeviceGetMemoryInfo_v2",
                                lambda: pynvml.nvmlDeviceGetMemoryInfo(self.handle, pynvml.nvmlMemory_v2))
                return {"total": mem.total // MIB, "used": mem.used // MIB, "free": mem.free // MIB,
                        "reserved": mem.reserved // MIB, "used_includes_reserved": False}
            except pynvml.NVMLError:
                pass  # not supported here: v1 may be
            except _Failed as exc:
                v2_failure = exc
        mem = self.field("memory", "nvmlDeviceGetMemoryInfo", lambda: pynvml.nvmlDeviceGetMemoryInfo(self.handle))
        if mem is None:
            if v2_failure is not None:
                self.failures.append(("memory", v2_failure.function, v2_failure.text))
            return empty
        # nvml.h: the v1 structure's used includes the memory the driver reserves (R510 and later).
        return {"total": mem.total // MIB, "used": mem.used // MIB, "free": mem.free // MIB, "reserved": None,
                "used_includes_reserved": True}

    def health(self) -> dict:
        """The raw health fields (_health.HEALTH_FIELDS); each None when this driver or GPU cannot give it.

        Read through the library's symbols (ctypes), not the bindings' wrappers, so that bindings older
        than the driver cannot make a field fail."""
        out = {}
        rows = [ctypes.c_uint(0) for _row in range(4)]
        got = self.raw_field("remapped_rows", "nvmlDeviceGetRemappedRows", *[ctypes.byref(r) for r in rows])
        out["remapped_rows"] = None if got is None else {
            "corrected": rows[0].value, "uncorrected": rows[1].value, "pending": bool(rows[2].value),
            "failure": bool(rows[3].value)}
        pending = ctypes.c_uint(0)
        got = self.raw_field("retired_pages", "nvmlDeviceGetRetiredPagesPendingStatus", ctypes.byref(pending))
        out["retired_pages_pending"] = None if got is None else bool(pending.value)
        count = ctypes.c_ulonglong(0)
        got = self.raw_field("ecc", "nvmlDeviceGetTotalEccErrors", ctypes.c_uint(_UNCORRECTED), ctypes.c_uint(_VOLATILE),
                             ctypes.byref(count))
        out["ecc_uncorrected_volatile"] = None if got is None else int(count.value)
        out["fabric"] = self.fabric()
        name = ("nvmlDeviceGetCurrentClocksEventReasons" if self.lib.has("nvmlDeviceGetCurrentClocksEventReasons")
                else "nvmlDeviceGetCurrentClocksThrottleReasons")
        mask = ctypes.c_ulonglong(0)
        got = self.raw_field("clock_event_reasons", name, ctypes.byref(mask))
        out["clock_event_reasons"] = None if got is None else _health.clock_reason_names(mask.value)
        out["inforom_corrupt"] = self.inforom()
        return out

    def inforom(self):
        """Whether the infoROM is corrupted (nvmlDeviceValidateInforom: NVML_ERROR_CORRUPTED_INFOROM), None when
        this GPU or driver cannot tell. It reads the flash: once per GPU and process (it does not heal in a run)."""
        key = (id(self.lib), self.index, self.bus_id)
        if key not in _INFOROM:
            fn = self.lib.fn("nvmlDeviceValidateInforom")
            if fn is None:
                self.unsupported.append("inforom")
                return None

            def call():
                ret = fn(self.handle)
                return "corrupt" if ret == _CORRUPTED_INFOROM else _check(ret)

            got = self.field("inforom", "nvmlDeviceValidateInforom", call)
            if got is None:
                return None  # unsupported or failed (noted): asked again at the next look
            _INFOROM[key] = got == "corrupt"
        return _INFOROM[key]

    def raw_field(self, field, name, *args):
        """True once the symbol ``name`` answered SUCCESS for (handle, *args); None (noted) otherwise."""
        fn = self.lib.fn(name)
        if fn is None:
            if field not in self.unsupported:
                self.unsupported.append(field)
            return None
        return self.field(field, name, lambda: _check(fn(self.handle, *args)))

    def fabric(self):
        """{state, status} of the NVSwitch fabric: _V (v2 structure), else the unversioned query."""
        for name, struct in (("nvmlDeviceGetGpuFabricInfoV", GpuFabricInfoV2),
                             ("nvmlDeviceGetGpuFabricInfo", GpuFabricInfoV1)):
            fn = self.lib.fn(name)
            if fn is None:
                continue
            info = struct()
            if struct is GpuFabricInfoV2:
                info.version = FABRIC_INFO_V2
            got = self.field("fabric", name, lambda fn=fn, info=info: _check(fn(self.handle, ctypes.byref(info))))
            if got is None:
                return None
            state = _health.FABRIC_STATES.get(int(info.state), f"unknown state {int(info.state)}")
            status = None
            if state == _health.FABRIC_COMPLETED:
                status = "Success" if info.status == _SUCCESS else _error_text(info.status)
            return {"state": state, "status": status}
        self.unsupported.append("fabric")
        return None

    def mig_devices(self, gpu_minor) -> list:
        """The MIG devices of a GPU in MIG mode (_raw.mig_device each): nvmlDeviceGetMigDeviceHandleByIndex over
        nvmlDeviceGetMaxMigDeviceCount (an index without a device answers NOT_FOUND), each read through its own
        handle (UUID, GPU and compute instance ids, memory, processes); None when the library has no MIG API."""
        wrappers = ("nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId",
                    "nvmlDeviceGetComputeInstanceId")
        if not self.lib.has("nvmlDeviceGetMigDeviceHandleByIndex") or not all(hasattr(pynvml, w) for w in wrappers):
            self.unsupported.append("mig_devices")  # the driver, or bindings older than R450's, have no MIG API
            return None
        count = self.field("mig_devices", "nvmlDeviceGetMaxMigDeviceCount",
                           lambda: pynvml.nvmlDeviceGetMaxMigDeviceCount(self.handle))
        if count is None:
            return None
        out = []
        for i in range(count):
            try:
                handle = self._try("nvmlDeviceGetMigDeviceHandleByIndex",
                                   lambda i=i: pynvml.nvmlDeviceGetMigDeviceHandleByIndex(self.handle, i))
            except pynvml.NVMLError:
                continue  # NOT_FOUND (no MIG device at this index) or not supported
            except _Failed as exc:
                self.failures.append(("mig_devices", exc.function, exc.text))
                continue
            sub = _GpuReader(self.lib, self.index, handle, self.deadline, self.pid_max, self.branch)
            sub.bus_id = self.bus_id
            dev = _raw.mig_device(_text(sub.field("uuid", "nvmlDeviceGetUUID", lambda h=handle: pynvml.nvmlDeviceGetUUID(h))))
            name = _text(sub.field("name", "nvmlDeviceGetName", lambda h=handle: pynvml.nvmlDeviceGetName(h)))
            dev["name"] = name
            dev["profile"] = name.rsplit(" MIG ", 1)[-1] if name and " MIG " in name else None
            dev["gpu_instance_id"] = sub.field("gpu_instance_id", "nvmlDeviceGetGpuInstanceId",
                                               lambda h=handle: pynvml.nvmlDeviceGetGpuInstanceId(h))
            dev["compute_instance_id"] = sub.field("compute_instance_id", "nvmlDeviceGetComputeInstanceId",
                                                   lambda h=handle: pynvml.nvmlDeviceGetComputeInstanceId(h))
            dev["memory"] = sub.memory()
            dev["processes"], problem = sub.processes()
            if problem:
                dev["processes_error"] = f"processes could not be read: {problem}"
            dev["device_nodes"] = mig_caps.device_nodes(gpu_minor, dev["gpu_instance_id"], dev["compute_instance_id"])
            self.failures.extend((f"mig_devices.{field}", function, f"{dev['uuid']}: {text}")
                                 for field, function, text in sub.failures)
            out.append(dev)
        return out

    def processes(self):
        """(merged process list, error text or None)."""
        merged = {}
        readable = False
        problems = []
        for kind, symbol, fn, struct in self.lib.process_queries():
            try:
                infos = self._try(symbol, lambda fn=fn, struct=struct: _running(fn, self.handle, struct))
            except pynvml.NVMLError:
                continue  # this kind is not supported here (e.g. graphics on a compute board)
            except _Failed as exc:
                problems.append(f"{exc.text} ({exc.function})")
                continue
            readable = True
            for info in infos:
                pid = int(info.pid)
                if implausible_pid(pid, self.pid_max):
                    problems.append(
                        f"the driver returned pid {pid} ({symbol}, {ctypes.sizeof(struct)}-byte entries), which no"
                        f" process can have (pid_max {self.pid_max}): the entry layout does not match driver"
                        f" {self.branch or 'of unknown branch'}; the list is not used")
                    break
                used = int(info.usedGpuMemory)
                entry = merged.setdefault(pid, _raw.process(pid))
                entry["types"].append(kind)
                if used != VALUE_NOT_AVAILABLE:
                    entry["used_mib"] = max(entry["used_mib"] or 0, used // MIB)
        if problems:
            return [], problems[0]
        if not readable:
            self.unsupported.append("processes")
            return [], "the driver does not report processes on this GPU (the query is not supported)"
        return sorted(merged.values(), key=lambda p: p["pid"]), None


def _error_text(code) -> str:
    try:
        return str(pynvml.NVMLError(code))
    except Exception:  # pylint: disable=broad-except  # an unknown code: the number says enough
        return f"NVML error {code}"


def _check(ret):
    if ret != _SUCCESS:
        raise pynvml.NVMLError(ret)
    return True


def _running(fn, handle, struct):
    """The two-call protocol (nvml.h): count first, then the entries; retried if the list grew."""
    count = ctypes.c_uint(0)
    ret = fn(handle, ctypes.byref(count), None)
    if ret == _SUCCESS:
        return []
    for _attempt in range(3):
        if ret != _INSUFFICIENT_SIZE:
            raise pynvml.NVMLError(ret)
        capacity = count.value * 2 + 5
        count = ctypes.c_uint(capacity)
        infos = (struct * capacity)()
        ret = fn(handle, ctypes.byref(count), infos)
        if ret == _SUCCESS:
            return [infos[i] for i in range(min(count.value, capacity))]
    raise pynvml.NVMLError(ret)


def _gpu(lib, index: int, deadline, pid_max, branch) -> dict:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    r = _GpuReader(lib, index, handle, deadline, pid_max, branch)
    gpu = _raw.empty_gpu(index)
    try:
        # Identity first (a lost GPU still answers it), the bus id before anything that may fail.
        gpu["pci_bus_id"] = r.bus_id = r.pci_bus_id()
        gpu["uuid"] = _text(r.field("uuid", "nvmlDeviceGetUUID", lambda: pynvml.nvmlDeviceGetUUID(handle)))
        gpu["name"] = _text(r.field("name", "nvmlDeviceGetName", lambda: pynvml.nvmlDeviceGetName(handle)))
        gpu["serial"] = _text(r.field("serial", "nvmlDeviceGetSerial", lambda: pynvml.nvmlDeviceGetSerial(handle)))
        gpu["minor_number"] = r.field("minor_number", "nvmlDeviceGetMinorNumber",
                                      lambda: pynvml.nvmlDeviceGetMinorNumber(handle))
    except _Lost:
        pass
    try:
        gpu["memory"] = r.memory()
        util = r.field("utilization", "nvmlDeviceGetUtilizationRates", lambda: pynvml.nvmlDeviceGetUtilizationRates(handle))
        if util is not None:
            gpu["utilization"] = {"gpu": util.gpu, "memory": util.memory}
        gpu["temperature"] = r.field("temperature", "nvmlDeviceGetTemperature",
                                     lambda: pynvml.nvmlDeviceGetTemperature(handle, 0))
        power = r.field("power", "nvmlDeviceGetPowerUsage", lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
        gpu["power"] = None if power is None else round(power / 1000.0, 2)
        persistence = r.field("persistence_mode", "nvmlDeviceGetPersistenceMode",
                              lambda: pynvml.nvmlDeviceGetPersistenceMode(handle))
        gpu["persistence_mode"] = None if persistence is None else bool(persistence)
        compute = r.field("compute_mode", "nvmlDeviceGetComputeMode", lambda: pynvml.nvmlDeviceGetComputeMode(handle))
        gpu["compute_mode"] = None if compute is None else _COMPUTE_MODES.get(compute, str(compute))
        mig = r.field("mig_mode", "nvmlDeviceGetMigMode", lambda: pynvml.nvmlDeviceGetMigMode(handle))
        gpu["mig_mode"] = None if mig is None else bool(mig[0])
        gpu["mig_mode_pending"] = None if mig is None else bool(mig[1])
        if gpu["mig_mode"]:
            gpu["mig_devices"] = r.mig_devices(gpu["minor_number"])
        gpu.update(r.health())
        gpu["processes"], problem = r.processes()
        if problem:
            gpu["processes_error"] = f"processes could not be read: {problem}"
    except _Lost:
        gpu["health"] = {"status": "lost", "detail": "GPU is lost (fallen off the bus)"}
    memory_failures = [f for f in r.failures if f[0] == "memory"]
    if gpu["health"]["status"] == "ok" and memory_failures:
        _field, function, text = memory_failures[0]
        gpu["health"] = {"status": "error", "detail": f"memory could not be read: {function}: {text}"}
    gpu["unsupported"] = list(r.unsupported)
    gpu["errors"] = r.error_texts()
    if gpu["processes_error"] and "processes" not in r.unsupported:
        gpu["errors"].append(f"{r.label()}: {gpu['processes_error']}")
    return gpu


def query(deadline=None) -> dict:
    """A raw snapshot: driver versions and every GPU, with NVML's processes (host-side pids).

    ``deadline`` (time.monotonic()) bounds the retries of transient errors.
    """
    init()
    lib = _library()
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        raise _errors.BackendError(f"NVML query failed (nvmlDeviceGetCount_v2): {exc}", backend="nvml",
                                   code=exc.value, function="nvmlDeviceGetCount_v2") from None
    driver = {"backend": "nvml"}
    for key, call in (("driver_version", pynvml.nvmlSystemGetDriverVersion),
                      ("nvml_version", pynvml.nvmlSystemGetNVMLVersion)):
        try:
            driver[key] = _text(call())
        except pynvml.NVMLError:
            driver[key] = None
    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        driver["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
    except pynvml.NVMLError:
        driver["cuda_driver_version"] = None
    branch = branch_of(driver["driver_version"])
    compute = [q for q in lib.process_queries() if q[0] == "compute"]
    driver["process_query"] = ({"function": compute[0][1], "entry_bytes": ctypes.sizeof(compute[0][3])}
                               if compute else None)
    pid_max = read_pid_max()
    gpus = []
    for i in range(count):
        try:
            gpus.append(_gpu(lib, i, deadline, pid_max, branch))
        except pynvml.NVMLError as exc:  # the handle itself (nvmlDeviceGetHandleByIndex_v2)
            raise _errors.BackendError(f"GPU {i}: nvmlDeviceGetHandleByIndex_v2 failed: {exc}", backend="nvml",
                                       code=exc.value, gpu=i, function="nvmlDeviceGetHandleByIndex_v2") from None
    return {"driver": driver, "gpus": gpus}
