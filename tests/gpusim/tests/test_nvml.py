"""Tests of the simulated libnvidia-ml.so.1, through the REAL pynvml (nvidia-ml-py).

Every test builds a scenario directory, installs the library in DIR/lib and talks to
pynvml in a SUBPROCESS started with ``LD_LIBRARY_PATH=DIR/lib`` (the only way to point
pynvml at a library: setting it inside a running Python does not work).  The tests play
the driver daemon themselves: they write ``DIR/procs`` directly (atomic rename), for
real processes (``sleep``) that they start and always kill (by pid) and reap.

Run:  /tmp/v312/bin/python -m pytest tests/gpusim/tests/test_nvml.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any, Dict, List, Optional, Sequence

import pytest

GPUSIM = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if GPUSIM not in sys.path:
    sys.path.insert(0, GPUSIM)

from gpusimkit import build, scenario  # noqa: E402

MIB = 1 << 20
NOT_AVAILABLE = 2**64 - 1
NO_INSTANCE = 0xFFFFFFFF

# The subprocesses import pynvml with this interpreter: without it these tests must fail, loudly.
if importlib.util.find_spec("pynvml") is None:  # pragma: no cover
    raise RuntimeError("pynvml (nvidia-ml-py) is not installed for this interpreter: run `make venv`")


# --------------------------------------------------------------------------------------
# A pynvml client in a subprocess: a tiny eval/exec server speaking JSON lines.
# --------------------------------------------------------------------------------------

SERVER = r'''
import ctypes, json, os, subprocess, sys, time
import pynvml as N

def conv(x):
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, bytes):
        return x.decode()
    if isinstance(x, (list, tuple)):
        return [conv(i) for i in x]
    if isinstance(x, dict):
        return {str(k): conv(v) for k, v in x.items()}
    if isinstance(x, ctypes.Structure):
        return {f[0]: conv(getattr(x, f[0])) for f in x._fields_}
    if isinstance(x, ctypes._SimpleCData):
        return x.value
    if isinstance(x, ctypes.Array):
        return [conv(i) for i in x]
    if hasattr(x, "__dict__"):
        return {k: conv(v) for k, v in vars(x).items()}
    return repr(x)

g = {"N": N, "ctypes": ctypes, "os": os, "subprocess": subprocess, "time": time, "json": json}
for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["mode"] == "eval":
            out = {"ok": conv(eval(req["code"], g))}
        else:
            g["result"] = None
            exec(req["code"], g)
            out = {"ok": conv(g["result"])}
    except BaseException as e:  # reported to the test, which decides
        out = {"error": type(e).__name__, "value": getattr(e, "value", None), "str": str(e)}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
'''


class RemoteError(Exception):
    """An exception raised inside the pynvml subprocess (name = its class name)."""

    def __init__(self, name: str, value: Any, text: str):
        super().__init__(f"{name}({value}): {text}")
        self.name = name
        self.value = value
        self.text = text


class Nvml:
    """pynvml (module ``N``) in a subprocess that loads DIR/lib/libnvidia-ml.so.1."""

    def __init__(self, simdir: str, prefix: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
                 cwd: Optional[str] = None, ld_library_path: Optional[str] = None):
        e = dict(os.environ)
        e.pop("GPUSIM_DIR", None)
        e["LD_LIBRARY_PATH"] = ld_library_path or os.path.join(simdir, "lib")
        e["PYTHONDONTWRITEBYTECODE"] = "1"
        if env:
            e.update(env)
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-u", "-c", SERVER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, cwd=cwd, text=True,
        )

    def _request(self, mode: str, code: str, timeout: float = 60.0) -> Any:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"mode": mode, "code": textwrap.dedent(code)}) + "\n")
        self.proc.stdin.flush()
        ready, _w, _x = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise AssertionError(f"pynvml subprocess did not answer within {timeout}s")
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"pynvml subprocess died: {err}")
        reply = json.loads(line)
        if "error" in reply:
            raise RemoteError(reply["error"], reply["value"], reply["str"])
        return reply["ok"]

    def eval(self, code: str, timeout: float = 60.0) -> Any:
        return self._request("eval", code, timeout)

    def exec(self, code: str, timeout: float = 60.0) -> Any:
        """Run statements; returns the value they assign to ``result``."""
        return self._request("exec", code, timeout)

    def error(self, code: str) -> RemoteError:
        """Evaluate ``code``, which must raise; returns the error."""
        with pytest.raises(RemoteError) as info:
            self.eval(code)
        return info.value

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self.proc.kill()
                self.proc.wait(timeout=10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f:
                f.close()


# --------------------------------------------------------------------------------------
# /proc helpers and the simulated host
# --------------------------------------------------------------------------------------

def stat_fields(pid: int) -> List[str]:
    """Fields 3.. of /proc/<pid>/stat (split after the LAST ')')."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    return data[data.rindex(")") + 2:].split()


def starttime(pid: int) -> int:
    return int(stat_fields(pid)[19])  # field 22


def status_field(pid: int, name: str) -> List[str]:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split()[1:]
    raise KeyError(name)


def proc_line(pid: int, gpu: int, types: str = "C", mib: int = 1024, start: Optional[int] = None) -> str:
    """A `procs` line for host pid ``pid``, as the driver daemon writes it."""
    ns = scenario.pidns_inode(str(pid))
    nspid = int(status_field(pid, "NSpid")[-1])
    return f"proc {pid} {starttime(pid) if start is None else start} {gpu} {types} {mib} {ns} {nspid}"


def exit_line(pid: int, start: int, exit_ns: int) -> str:
    return f"exit {pid} {start} {exit_ns}"


class Sim:
    """A scenario directory with the library installed; ``sc`` is the model."""

    def __init__(self, path: str, count: int = 8):
        self.dir = path
        self.sc = scenario.new_scenario(count, seed=path)
        self.save()
        build.install_library(path)
        self.clients: List[Nvml] = []

    def save(self) -> None:
        scenario.save(self.dir, self.sc)

    def write_procs(self, lines: Sequence[str]) -> None:
        path = os.path.join(self.dir, "procs")
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        os.replace(tmp, path)

    def client(self, **kw) -> Nvml:
        c = Nvml(self.dir, **kw)
        self.clients.append(c)
        return c

    def init_client(self, **kw) -> Nvml:
        c = self.client(**kw)
        c.exec("N.nvmlInit()\nH = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]")
        return c


@pytest.fixture(scope="session")
def built() -> str:
    return build.ensure_built()


@pytest.fixture
def sim(tmp_path, built):
    s = Sim(str(tmp_path))
    try:
        yield s
    finally:
        for c in s.clients:
            c.close()


@pytest.fixture
def spawn():
    """Start ``sleep`` processes; all are killed (by pid) and reaped at the end."""
    started: List[subprocess.Popen] = []

    def _spawn(*argv: str) -> subprocess.Popen:
        p = subprocess.Popen(list(argv) or ["sleep", "1000"])
        started.append(p)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # wait for the exec, so comm/cmdline are final
            try:
                if open(f"/proc/{p.pid}/cmdline", "rb").read().split(b"\0")[0] == (list(argv) or ["sleep"])[0].encode():
                    break
            except OSError:
                break
            time.sleep(0.002)
        return p

    try:
        yield _spawn
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()  # our own child, by its pid
            p.wait(timeout=10)


def kill_and_reap(p: subprocess.Popen) -> int:
    """SIGKILL our child and reap it; returns CLOCK_MONOTONIC ns right after its exit."""
    p.kill()
    p.wait(timeout=10)
    return time.monotonic_ns()


# --------------------------------------------------------------------------------------
# Static state: pynvml reads exactly what the scenario says
# --------------------------------------------------------------------------------------

READ_ALL = """
def tryit(f, *a):
    try:
        return f(*a)
    except N.NVMLError as e:
        return "ERR:" + type(e).__name__
N.nvmlInit()
result = {
    "driver": N.nvmlSystemGetDriverVersion(), "nvml": N.nvmlSystemGetNVMLVersion(),
    "cuda": N.nvmlSystemGetCudaDriverVersion(), "cuda_v2": N.nvmlSystemGetCudaDriverVersion_v2(),
    "count": N.nvmlDeviceGetCount(), "gpus": [],
}
for i in range(result["count"]):
    h = N.nvmlDeviceGetHandleByIndex(i)
    pci = N.nvmlDeviceGetPciInfo(h)
    result["gpus"].append({
        "name": N.nvmlDeviceGetName(h), "uuid": N.nvmlDeviceGetUUID(h), "serial": N.nvmlDeviceGetSerial(h),
        "index": N.nvmlDeviceGetIndex(h), "minor": N.nvmlDeviceGetMinorNumber(h),
        "pci": pci, "pci_v3": N.nvmlDeviceGetPciInfo_v3(h),
        "mem": N.nvmlDeviceGetMemoryInfo(h), "mem2": N.nvmlDeviceGetMemoryInfo(h, N.nvmlMemory_v2),
        "util": N.nvmlDeviceGetUtilizationRates(h),
        "temp": N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
        "tempv": N.nvmlDeviceGetTemperatureV(h, N.NVML_TEMPERATURE_GPU),
        "power": N.nvmlDeviceGetPowerUsage(h), "limit": N.nvmlDeviceGetEnforcedPowerLimit(h),
        "pm_limit": N.nvmlDeviceGetPowerManagementLimit(h),
        "fan": tryit(N.nvmlDeviceGetFanSpeed, h),
        "enc": N.nvmlDeviceGetEncoderUtilization(h), "dec": N.nvmlDeviceGetDecoderUtilization(h),
        "persistence": N.nvmlDeviceGetPersistenceMode(h), "compute_mode": N.nvmlDeviceGetComputeMode(h),
        "mig": N.nvmlDeviceGetMigMode(h), "is_mig": N.nvmlDeviceIsMigDeviceHandle(h).value,
        "cc": N.nvmlDeviceGetCudaComputeCapability(h), "brand": N.nvmlDeviceGetBrand(h),
        "by_uuid": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(h))),
        "by_bus": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(pci.busId)),
        "by_legacy_bus": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(pci.busIdLegacy)),
        "procs": [N.nvmlDeviceGetComputeRunningProcesses(h), N.nvmlDeviceGetGraphicsRunningProcesses(h),
                  N.nvmlDeviceGetMPSComputeRunningProcesses(h)],
    })
N.nvmlShutdown()
"""


def test_defaults_8x_h200(sim):
    out = sim.client().exec(READ_ALL)
    assert out["driver"] == "580.159.03"
    assert out["nvml"] == "13.580.159.03"
    assert out["cuda"] == out["cuda_v2"] == 13000
    assert out["count"] == 8
    buses = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
    for i, (g, model) in enumerate(zip(out["gpus"], sim.sc.gpus)):
        assert g["name"] == "NVIDIA H200"
        assert g["uuid"] == model.uuid and g["serial"] == model.serial
        assert len(g["serial"]) == 13
        assert g["index"] == i == g["by_uuid"] == g["by_bus"] == g["by_legacy_bus"]
        assert g["minor"] == i
        pci = g["pci"]
        assert pci == g["pci_v3"]
        assert pci["busId"] == f"00000000:{buses[i]:02X}:00.0" == model.pci_bus_id
        assert pci["busIdLegacy"] == f"0000:{buses[i]:02X}:00.0"
        assert (pci["domain"], pci["bus"], pci["device"]) == (0, buses[i], 0)
        assert pci["pciDeviceId"] == 0x233510DE and pci["pciSubSystemId"] == 0x18BE10DE
        total = 143771 * MIB
        assert g["mem"] == {"total": total, "free": total, "used": 0}
        assert g["mem2"] == {"version": 0x02000028, "total": total, "reserved": 0, "free": total, "used": 0}
        assert g["util"] == {"gpu": 0, "memory": 0}
        assert g["temp"] == g["tempv"] == 31
        assert (g["power"], g["limit"], g["pm_limit"]) == (76000, 700000, 700000)
        assert g["fan"] == "ERR:NVMLError_NotSupported"  # H200: no fan
        assert g["enc"][0] == 0 and g["dec"][0] == 0
        assert g["persistence"] == 1 and g["compute_mode"] == 0
        assert g["mig"] == [0, 0] and g["is_mig"] == 0
        assert g["cc"] == [9, 0]
        assert g["brand"] == 14  # NVML_BRAND_NVIDIA
        assert g["procs"] == [[], [], []]


def test_configured_values(sim):
    sc = sim.sc
    sc.driver_version, sc.cuda_version = "550.127.05", 12040
    g = sc.gpus[3]
    g.name, g.memory_total_mib, g.util_gpu, g.util_mem = "NVIDIA A100-SXM4-80GB", 81920, 57, 23
    g.temperature, g.power_mw, g.power_limit_mw, g.fan = 64, 312345, 400000, 42
    g.persistence, g.compute_mode, g.mig_current, g.mig_pending = 0, 3, 0, 1  # (MIG on: utilization NOT_SUPPORTED, test_sim_mig.py)
    g.pci_bus_id, g.minor = "00000002:C1:00.0", 17
    sim.save()
    out = sim.client().exec(READ_ALL)
    assert out["driver"] == "550.127.05" and out["nvml"] == "13.550.127.05" and out["cuda"] == 12040
    r = out["gpus"][3]
    assert r["name"] == "NVIDIA A100-SXM4-80GB"
    assert r["mem"]["total"] == 81920 * MIB
    assert r["util"] == {"gpu": 57, "memory": 23}
    assert (r["temp"], r["power"], r["limit"], r["fan"]) == (64, 312345, 400000, 42)
    assert (r["persistence"], r["compute_mode"], r["mig"]) == (0, 3, [0, 1])
    assert r["pci"]["busId"] == "00000002:C1:00.0" and r["pci"]["domain"] == 2 and r["pci"]["bus"] == 0xC1
    assert r["pci"]["busIdLegacy"] == "0002:C1:00.0"
    assert r["minor"] == 17 and r["by_bus"] == 3
    assert r["cc"] == [8, 0]
    assert out["gpus"][2]["name"] == "NVIDIA H200"  # the others are untouched


def test_changes_seen_by_next_call_in_same_process(sim):
    c = sim.init_client()
    assert c.eval("N.nvmlDeviceGetTemperature(H[0], 0)") == 31
    sim.sc.gpus[0].temperature = 77
    sim.save()
    assert c.eval("N.nvmlDeviceGetTemperature(H[0], 0)") == 77
    sim.sc.gpus.pop()
    sim.save()
    assert c.eval("N.nvmlDeviceGetCount()") == 7
    assert c.error("N.nvmlDeviceGetName(H[7])").name == "NVMLError_InvalidArgument"


def test_lookup_errors(sim):
    c = sim.init_client()
    assert c.error("N.nvmlDeviceGetHandleByIndex(8)").name == "NVMLError_InvalidArgument"
    assert c.error("N.nvmlDeviceGetHandleByUUID('GPU-00000000-0000-0000-0000-000000000000')").name == \
        "NVMLError_NotFound"
    assert c.error("N.nvmlDeviceGetHandleByPciBusId('00000000:01:00.0')").name == "NVMLError_NotFound"
    assert c.error("N.nvmlDeviceGetTemperature(H[0], 1)").name == "NVMLError_InvalidArgument"


def test_null_pointers_and_buffers_via_ctypes(sim):
    c = sim.init_client()
    out = c.exec("""
        L = N.nvmlLib
        h = H[0]
        small = ctypes.create_string_buffer(4)
        cnt = ctypes.c_uint(0)
        result = {
            "mem_null": L.nvmlDeviceGetMemoryInfo(h, None),
            "name_null": L.nvmlDeviceGetName(h, None, ctypes.c_uint(96)),
            "name_small": L.nvmlDeviceGetName(h, small, ctypes.c_uint(4)),
            "count_null": L.nvmlDeviceGetCount_v2(None),
            "handle_null": L.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(0), None),
            "procs_count_null": L.nvmlDeviceGetComputeRunningProcesses_v3(h, None, None),
            "bad_handle": L.nvmlDeviceGetMemoryInfo(ctypes.c_void_p(8), ctypes.byref(N.c_nvmlMemory_t())),
            "uuid_null": L.nvmlDeviceGetHandleByUUID(None, ctypes.byref(N.c_nvmlDevice_t())),
            "mem_v2_bad_version": L.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(N.c_nvmlMemory_v2_t())),
        }
    """)
    assert out == {"mem_null": 2, "name_null": 2, "name_small": 7, "count_null": 2, "handle_null": 2,
                   "procs_count_null": 2, "bad_handle": 2, "uuid_null": 2, "mem_v2_bad_version": 25}


def test_legacy_pci_info_v1_layout(sim):
    """The unversioned nvmlDeviceGetPciInfo fills the original 52-byte struct and nothing past it."""
    c = sim.init_client()
    out = c.exec("""
        class V1(ctypes.Structure):
            _fields_ = [("busId", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                        ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                        ("reserved", ctypes.c_uint * 4), ("guard", ctypes.c_ubyte * 16)]
        v = V1()
        ctypes.memset(ctypes.addressof(v.guard), 0xAB, 16)
        rc = N.nvmlLib.nvmlDeviceGetPciInfo(H[1], ctypes.byref(v))
        result = [rc, v.busId, v.bus, v.pciDeviceId, list(v.guard)]
    """)
    assert out == [0, "0000:2A:00.0", 0x2A, 0x233510DE, [0xAB] * 16]


def test_error_strings(sim):
    c = sim.client()  # nvmlErrorString works without nvmlInit
    out = c.exec("""
        N._LoadNvmlLibrary()
        result = {i: N.nvmlErrorString(i) for i in (0, 1, 2, 3, 4, 6, 7, 9, 13, 15, 18, 999)}
    """)
    assert out == {"0": "Success", "1": "Uninitialized", "2": "Invalid Argument", "3": "Not Supported",
                   "4": "Insufficient Permissions", "6": "Not Found", "7": "Insufficient Size",
                   "9": "Driver Not Loaded", "13": "Function Not Found", "15": "GPU is lost",
                   "18": "Driver/library version mismatch", "999": "Unknown Error"}


def test_init_refcount_and_uninitialized(sim):
    c = sim.client()
    out = c.exec("""
        N._LoadNvmlLibrary()
        L = N.nvmlLib
        n = ctypes.c_uint()
        r = {"before": L.nvmlDeviceGetCount_v2(ctypes.byref(n)), "shutdown_before": L.nvmlShutdown()}
        r["init1"] = L.nvmlInit_v2()
        r["init2"] = L.nvmlInitWithFlags(0)
        r["init3"] = L.nvmlInit()
        r["sd1"] = L.nvmlShutdown(); r["sd2"] = L.nvmlShutdown()
        r["still"] = L.nvmlDeviceGetCount_v2(ctypes.byref(n)); r["n"] = n.value
        r["sd3"] = L.nvmlShutdown()
        r["after"] = L.nvmlDeviceGetCount_v2(ctypes.byref(n))
        r["drv_after"] = L.nvmlSystemGetDriverVersion(ctypes.create_string_buffer(80), 80)
        r["sd4"] = L.nvmlShutdown()
        result = r
    """)
    assert out == {"before": 1, "shutdown_before": 1, "init1": 0, "init2": 0, "init3": 0, "sd1": 0, "sd2": 0,
                   "still": 0, "n": 8, "sd3": 0, "after": 1, "drv_after": 1, "sd4": 1}
    # and through pynvml
    assert sim.client().error("N.nvmlDeviceGetCount()").name == "NVMLError_Uninitialized"


# --------------------------------------------------------------------------------------
# Memory arithmetic
# --------------------------------------------------------------------------------------

def test_memory_arithmetic(sim, spawn):
    g = sim.sc.gpus[1]
    g.memory_total_mib, g.memory_reserved_mib, g.base_used_mib, g.leaked_mib = 10000, 300, 500, 1200
    sim.save()
    p = spawn()
    sim.write_procs([proc_line(p.pid, 1, "C", 2000), proc_line(p.pid, 2, "C", 100)])
    c = sim.init_client()
    v1 = c.eval("N.nvmlDeviceGetMemoryInfo(H[1])")
    v2 = c.eval("N.nvmlDeviceGetMemoryInfo(H[1], N.nvmlMemory_v2)")
    used_v2 = 500 + 1200 + 2000
    free = 10000 - 300 - used_v2
    assert v2 == {"version": 0x02000028, "total": 10000 * MIB, "reserved": 300 * MIB, "free": free * MIB,
                  "used": used_v2 * MIB}
    assert v1 == {"total": 10000 * MIB, "free": free * MIB, "used": (used_v2 + 300) * MIB}
    assert v1["total"] == v1["free"] + v1["used"]
    assert c.eval("N.nvmlDeviceGetMemoryInfo(H[2], N.nvmlMemory_v2).used") == 100 * MIB

    # free never goes below 0
    g.base_used_mib, g.leaked_mib = 9000, 900
    sim.save()
    v2 = c.eval("N.nvmlDeviceGetMemoryInfo(H[1], N.nvmlMemory_v2)")
    assert v2["free"] == 0 and v2["used"] == (9000 + 900 + 2000) * MIB


# --------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------

def test_processes_of_real_processes(sim, spawn):
    a, b = spawn(), spawn()
    sim.write_procs([proc_line(a.pid, 0, "C", 1000), proc_line(b.pid, 0, "C", 3000), proc_line(b.pid, 5, "C", 64)])
    c = sim.init_client()
    procs = c.eval("N.nvmlDeviceGetComputeRunningProcesses(H[0])")
    assert procs == [
        {"pid": a.pid, "usedGpuMemory": 1000 * MIB, "gpuInstanceId": NO_INSTANCE, "computeInstanceId": NO_INSTANCE},
        {"pid": b.pid, "usedGpuMemory": 3000 * MIB, "gpuInstanceId": NO_INSTANCE, "computeInstanceId": NO_INSTANCE},
    ]
    assert c.eval("N.nvmlDeviceGetComputeRunningProcesses_v2(H[0])") == procs
    assert [p["pid"] for p in c.eval("N.nvmlDeviceGetComputeRunningProcesses(H[5])")] == [b.pid]
    assert c.eval("N.nvmlDeviceGetComputeRunningProcesses(H[1])") == []
    assert c.eval("N.nvmlDeviceGetMemoryInfo(H[0]).used") == 4000 * MIB
    assert c.eval(f"N.nvmlSystemGetProcessName({a.pid})") == "sleep"
    assert c.error("N.nvmlSystemGetProcessName(2**22 + 12345)").name == "NVMLError_NotFound"


def test_wrong_starttime_is_not_reported(sim, spawn):
    p = spawn()
    sim.write_procs([proc_line(p.pid, 0, "C", 1000, start=starttime(p.pid) + 1)])
    c = sim.init_client()
    assert c.eval("N.nvmlDeviceGetComputeRunningProcesses(H[0])") == []
    assert c.eval("N.nvmlDeviceGetMemoryInfo(H[0]).used") == 0  # a dead context, lag 0: freed


def test_release_lag(sim, spawn):
    lag_ms = 3000
    sim.sc.release_lag_ms = lag_ms
    sim.save()
    c = sim.init_client()
    mem = "N.nvmlDeviceGetMemoryInfo(H[0], N.nvmlMemory_v2).used"
    listing = "[p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(H[0])]"

    # with an exit line: used until exit + lag, then free
    p = spawn()
    line, start = proc_line(p.pid, 0, "C", 1000), starttime(p.pid)
    sim.write_procs([line])
    assert c.eval(listing) == [p.pid] and c.eval(mem) == 1000 * MIB
    t_exit = kill_and_reap(p)
    sim.write_procs([line, exit_line(p.pid, start, t_exit)])
    assert c.eval(listing) == []
    used = c.eval(mem)
    if time.monotonic_ns() < t_exit + lag_ms * 1_000_000:
        assert used == 1000 * MIB
    time.sleep(max(0.0, (t_exit + lag_ms * 1_000_000 - time.monotonic_ns()) / 1e9) + 0.05)
    assert c.eval(mem) == 0

    # without an exit line (the daemon has not seen the exit yet): never released
    q = spawn()
    line, start = proc_line(q.pid, 0, "C", 700), starttime(q.pid)
    sim.write_procs([line])
    assert c.eval(mem) == 700 * MIB
    kill_and_reap(q)
    assert c.eval(listing) == []
    assert c.eval(mem) == 700 * MIB
    time.sleep(lag_ms / 1000 + 0.1)
    assert c.eval(mem) == 700 * MIB
    # the daemon writes the exit (long ago): free at once
    sim.write_procs([line, exit_line(q.pid, start, time.monotonic_ns() - lag_ms * 1_000_000 - 1)])
    assert c.eval(mem) == 0


def test_zombie_is_dead(sim, spawn):
    p = spawn()
    sim.write_procs([proc_line(p.pid, 0, "C", 500)])
    c = sim.init_client()
    assert c.eval("len(N.nvmlDeviceGetComputeRunningProcesses(H[0]))") == 1
    os.kill(p.pid, signal.SIGKILL)  # our child, by pid; not reaped yet: a zombie
    deadline = time.monotonic() + 5
    while stat_fields(p.pid)[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.005)
    assert stat_fields(p.pid)[0] == "Z"
    assert c.eval("N.nvmlDeviceGetComputeRunningProcesses(H[0])") == []
    assert c.eval("N.nvmlDeviceGetMemoryInfo(H[0]).used") == 0
    p.wait(timeout=10)


def test_types_go_to_the_right_queries(sim, spawn):
    pc, pg, pm, pcg, pcm = (spawn() for _i in range(5))
    sim.write_procs([proc_line(pc.pid, 0, "C", 1), proc_line(pg.pid, 0, "G", 2), proc_line(pm.pid, 0, "M", 3),
                     proc_line(pcg.pid, 0, "CG", 4), proc_line(pcm.pid, 0, "CM", 5)])
    c = sim.init_client()
    pids = {}
    for kind in ("Compute", "Graphics", "MPSCompute"):
        for suffix in ("", "_v2", "_v3"):
            pids[kind + suffix] = c.eval(f"[p.pid for p in N.nvmlDeviceGet{kind}RunningProcesses{suffix}(H[0])]")
    for suffix in ("", "_v2", "_v3"):
        assert pids["Compute" + suffix] == [pc.pid, pcg.pid, pcm.pid]
        assert pids["Graphics" + suffix] == [pg.pid, pcg.pid]
        assert pids["MPSCompute" + suffix] == [pm.pid, pcm.pid]
    assert c.eval("N.nvmlDeviceGetMemoryInfo(H[0]).used") == 15 * MIB


def test_used_memory_not_available(sim, spawn):
    p, q = spawn(), spawn()
    sim.write_procs([proc_line(p.pid, 0, "C", -1), proc_line(q.pid, 0, "C", 10)])
    c = sim.init_client()
    procs = c.eval("N.nvmlDeviceGetComputeRunningProcesses(H[0])")
    assert [(x["pid"], x["usedGpuMemory"]) for x in procs] == [(p.pid, None), (q.pid, 10 * MIB)]
    raw = c.exec("""
        cnt = ctypes.c_uint(4)
        arr = (N.c_nvmlProcessInfo_v3_t * 4)()
        rc = N.nvmlLib.nvmlDeviceGetComputeRunningProcesses_v3(H[0], ctypes.byref(cnt), arr)
        result = [rc, cnt.value, arr[0].usedGpuMemory]
    """)
    assert raw == [0, 2, NOT_AVAILABLE]
    assert c.eval("N.nvmlDeviceGetMemoryInfo(H[0]).used") == 10 * MIB


TWO_CALLS = """
    L = N.nvmlLib
    fn = getattr(L, "nvmlDeviceGetComputeRunningProcesses" + SUFFIX)
    Entry = ENTRY
    cnt = ctypes.c_uint(0)
    first = fn(H[0], ctypes.byref(cnt), None)
    needed = cnt.value
    with open(PROCS + ".tmp", "w") as f:   # the daemon registers more processes
        f.write(NEW)
    os.replace(PROCS + ".tmp", PROCS)
    cap = needed * 2 + 5 if CAP is None else CAP
    arr = (Entry * max(cap, 1))()
    cnt.value = cap
    second = fn(H[0], ctypes.byref(cnt), arr)
    result = {"first": first, "needed": needed, "second": second, "count": cnt.value,
              "pids": [arr[i].pid for i in range(cnt.value)] if second == 0 else [],
              "mem": [arr[i].usedGpuMemory for i in range(cnt.value)] if second == 0 else []}
"""


# the legacy nvmlProcessInfo_v1_t, declared inside the subprocess
PROCESS_INFO_V1 = ("type('V1', (ctypes.Structure,), "
                   "{'_fields_': [('pid', ctypes.c_uint), ('usedGpuMemory', ctypes.c_ulonglong)]})")


@pytest.mark.parametrize("suffix", ["_v3", "_v2", ""])
def test_two_call_protocol(sim, spawn, suffix):
    procs = [spawn() for _i in range(10)]
    lines = [proc_line(p.pid, 0, "C", 100 + i) for i, p in enumerate(procs)]
    path = os.path.join(sim.dir, "procs")
    entry = PROCESS_INFO_V1 if suffix == "" else "N.c_nvmlProcessInfo_v3_t"

    def run(initial: List[str], new: List[str], cap: Optional[int]) -> Dict[str, Any]:
        sim.write_procs(initial)
        code = (TWO_CALLS.replace("SUFFIX", repr(suffix)).replace("ENTRY", entry).replace("PROCS", repr(path))
                .replace("NEW", repr("".join(x + "\n" for x in new))).replace("CAP", repr(cap)))
        return c.exec(code)

    c = sim.init_client()
    # no process: SUCCESS at once, count 0
    r = run([], [], None)
    assert (r["first"], r["needed"]) == (0, 0)
    # 1 process; 3 more appear between the calls; capacity 1*2+5 = 7 is enough
    r = run(lines[:1], lines[:4], None)
    assert (r["first"], r["needed"]) == (7, 1)
    assert (r["second"], r["count"]) == (0, 4)
    assert r["pids"] == [p.pid for p in procs[:4]]
    assert r["mem"] == [(100 + i) * MIB for i in range(4)]
    # 1 process; 9 more appear: capacity 7 is too small -> INSUFFICIENT_SIZE with the new count
    r = run(lines[:1], lines, None)
    assert (r["first"], r["needed"], r["second"], r["count"]) == (7, 1, 7, 10)
    # exact capacity works; one less does not
    r = run(lines[:3], lines[:3], 3)
    assert (r["first"], r["needed"], r["second"], r["count"]) == (7, 3, 0, 3)
    r = run(lines[:3], lines[:3], 2)
    assert (r["second"], r["count"]) == (7, 3)
    # pynvml itself (v3 and v2 wrappers) through the protocol
    sim.write_procs(lines)
    if suffix != "":
        assert len(c.eval(f"N.nvmlDeviceGetComputeRunningProcesses{suffix}(H[0])")) == 10


# --------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("code,exc", [(9, "NVMLError_DriverNotLoaded"), (18, "NVMLError_LibRmVersionMismatch"),
                                      (4, "NVMLError_NoPermission")])
def test_init_error(sim, code, exc):
    sim.sc.init_error = code
    sim.save()
    c = sim.client()
    err = c.error("N.nvmlInit()")
    assert err.name == exc and err.value == code
    assert c.error("N.nvmlDeviceGetCount()").name == "NVMLError_Uninitialized"
    # fixed on disk: the next nvmlInit in the same process succeeds
    sim.sc.init_error = 0
    sim.save()
    c.eval("N.nvmlInit()")
    assert c.eval("N.nvmlDeviceGetCount()") == 8


def test_no_scenario_is_driver_not_loaded(tmp_path, built):
    build.install_library(str(tmp_path))
    c = Nvml(str(tmp_path))
    try:
        err = c.error("N.nvmlInit()")
        assert err.name == "NVMLError_DriverNotLoaded" and err.value == 9
    finally:
        c.close()


def test_library_not_found_without_ld_library_path(sim):
    c = sim.client(ld_library_path="/nonexistent")
    assert c.error("N.nvmlInit()").name == "NVMLError_LibraryNotFound"


def test_dir_from_env_and_relative_library_path(sim, tmp_path_factory):
    other = str(tmp_path_factory.mktemp("other"))
    sc = scenario.new_scenario(2, model="NVIDIA H100 80GB HBM3", seed=other)
    scenario.save(other, sc)
    c = sim.client(env={"GPUSIM_DIR": other})
    c.eval("N.nvmlInit()")
    assert c.eval("N.nvmlDeviceGetCount()") == 2
    assert c.eval("N.nvmlDeviceGetName(N.nvmlDeviceGetHandleByIndex(0))") == "NVIDIA H100 80GB HBM3"
    # LD_LIBRARY_PATH relative to the cwd: DIR is still found
    c2 = sim.client(cwd=sim.dir, ld_library_path="lib")
    c2.eval("N.nvmlInit()")
    c2.eval("os.chdir('/')")
    assert c2.eval("N.nvmlDeviceGetCount()") == 8


def test_lost_gpu(sim, spawn):
    now = time.monotonic_ns()
    sim.sc.gpus[2].lost_at_ns = now - 1
    sim.sc.gpus[3].lost_at_ns = now + 2_000_000_000
    sim.save()
    p = spawn()
    sim.write_procs([proc_line(p.pid, 2, "C", 10)])
    c = sim.init_client()
    # identity still answered on the lost GPU
    assert c.eval("N.nvmlDeviceGetName(H[2])") == "NVIDIA H200"
    assert c.eval("N.nvmlDeviceGetUUID(H[2])") == sim.sc.gpus[2].uuid
    assert c.eval("N.nvmlDeviceGetSerial(H[2])") == sim.sc.gpus[2].serial
    assert c.eval("N.nvmlDeviceGetIndex(H[2])") == 2
    assert c.eval("N.nvmlDeviceGetMinorNumber(H[2])") == 2
    assert c.eval("N.nvmlDeviceGetPciInfo(H[2]).busId") == sim.sc.gpus[2].pci_bus_id
    assert c.eval("N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(H[2])))") == 2
    for q in ("N.nvmlDeviceGetMemoryInfo(H[2])", "N.nvmlDeviceGetMemoryInfo(H[2], N.nvmlMemory_v2)",
              "N.nvmlDeviceGetTemperature(H[2], 0)", "N.nvmlDeviceGetPowerUsage(H[2])",
              "N.nvmlDeviceGetUtilizationRates(H[2])", "N.nvmlDeviceGetComputeRunningProcesses(H[2])",
              "N.nvmlDeviceGetPersistenceMode(H[2])", "N.nvmlDeviceGetMigMode(H[2])"):
        err = c.error(q)
        assert (err.name, err.value) == ("NVMLError_GpuIsLost", 15), q
    # GPU 3 works until its time point, then is lost
    assert c.eval("N.nvmlDeviceGetTemperature(H[3], 0)") == 31
    time.sleep(max(0.0, (now + 2_000_000_000 - time.monotonic_ns()) / 1e9) + 0.05)
    assert c.error("N.nvmlDeviceGetTemperature(H[3], 0)").name == "NVMLError_GpuIsLost"
    assert c.eval("N.nvmlDeviceGetTemperature(H[4], 0)") == 31
    assert c.eval("N.nvmlDeviceGetCount()") == 8


def test_not_supported_fields(sim):
    sim.sc.gpus[0].not_supported = sorted(scenario.NOT_SUPPORTED_FIELDS)
    sim.sc.gpus[1].not_supported = ["memory"]
    sim.sc.gpus[2].fan = 30  # so that every query answers on GPU 2
    sim.save()
    c = sim.init_client()
    queries = {
        "serial": ["N.nvmlDeviceGetSerial(H[0])"],
        "memory": ["N.nvmlDeviceGetMemoryInfo(H[0])", "N.nvmlDeviceGetMemoryInfo(H[0], N.nvmlMemory_v2)"],
        "utilization": ["N.nvmlDeviceGetUtilizationRates(H[0])"],
        "temperature": ["N.nvmlDeviceGetTemperature(H[0], 0)", "N.nvmlDeviceGetTemperatureV(H[0], 0)"],
        "power": ["N.nvmlDeviceGetPowerUsage(H[0])"],
        "power_limit": ["N.nvmlDeviceGetEnforcedPowerLimit(H[0])", "N.nvmlDeviceGetPowerManagementLimit(H[0])"],
        "fan": ["N.nvmlDeviceGetFanSpeed(H[0])"],
        "persistence": ["N.nvmlDeviceGetPersistenceMode(H[0])"],
        "compute_mode": ["N.nvmlDeviceGetComputeMode(H[0])"],
        "mig_mode": ["N.nvmlDeviceGetMigMode(H[0])"],
        "processes": ([f"N.nvmlDeviceGet{k}RunningProcesses{s}(H[0])" for k in ("Compute", "Graphics", "MPSCompute")
                       for s in ("", "_v2")]
                      + [f"N.nvmlDeviceGetRunningProcessDetailList(H[0], N.nvmlProcessDetailList_v1, {m})"
                         for m in range(3)]),
        "minor_number": ["N.nvmlDeviceGetMinorNumber(H[0])"],
        "encoder": ["N.nvmlDeviceGetEncoderUtilization(H[0])"],
        "decoder": ["N.nvmlDeviceGetDecoderUtilization(H[0])"],
        "memory_v1": ["N.nvmlDeviceGetMemoryInfo(H[0])"],
        "memory_v2": ["N.nvmlDeviceGetMemoryInfo(H[0], N.nvmlMemory_v2)"],
        "conf_compute": ["N.nvmlDeviceGetConfComputeMemSizeInfo(H[0])"],
        "remapped_rows": ["N.nvmlDeviceGetRemappedRows(H[0])"],
        "retired_pages": ["N.nvmlDeviceGetRetiredPagesPendingStatus(H[0])"],
        "ecc": ["N.nvmlDeviceGetEccMode(H[0])", "N.nvmlDeviceGetTotalEccErrors(H[0], 1, 0)"],
        "fabric": ["N.nvmlDeviceGetGpuFabricInfo(H[0], N.byref(N.c_nvmlGpuFabricInfo_t()))",
                   "N.nvmlDeviceGetGpuFabricInfoV(H[0], N.byref(N.c_nvmlGpuFabricInfo_v2_t()))"],
        "clock_reasons": ["N.nvmlDeviceGetCurrentClocksEventReasons(H[0])",
                          "N.nvmlDeviceGetCurrentClocksThrottleReasons(H[0])"],
    }
    assert set(queries) == set(scenario.NOT_SUPPORTED_FIELDS)
    for field, qs in queries.items():
        for q in qs:
            err = c.error(q)
            assert (err.name, err.value) == ("NVMLError_NotSupported", 3), (field, q)
            if field != "retired_pages":  # an H200 retires no pages (it remaps rows): NOT_SUPPORTED everywhere
                c.eval(q.replace("H[0]", "H[2]"))  # other GPUs answer
    assert c.eval("N.nvmlDeviceGetName(H[0])") == "NVIDIA H200"
    assert c.error("N.nvmlDeviceGetMemoryInfo(H[1])").name == "NVMLError_NotSupported"
    assert c.eval("N.nvmlDeviceGetTemperature(H[1], 0)") == 31


def test_unknown_every(sim):
    sim.sc.unknown_every = 3
    sim.save()
    c = sim.init_client()  # GetCount/GetHandleByIndex are not device calls: they do not count
    out = c.exec("""
        out = []
        for _ in range(9):
            try:
                out.append(N.nvmlDeviceGetTemperature(H[0], 0))
            except N.NVMLError_Unknown as e:
                out.append(e.value)
        result = out
    """)
    assert out == [31, 31, 999, 31, 31, 999, 31, 31, 999]
    # a fresh process has its own counter
    c2 = sim.init_client()
    assert c2.eval("[N.nvmlDeviceGetTemperature(H[0], 0) for _ in range(2)]") == [31, 31]
    assert c2.error("N.nvmlDeviceGetName(H[5])").name == "NVMLError_Unknown"


def test_call_delay(sim):
    c = sim.init_client()
    fast = c.exec("""
        t = time.monotonic(); [N.nvmlDeviceGetCount() for _ in range(10)]; result = time.monotonic() - t
    """)
    sim.sc.call_delay_ms = 40
    sim.save()
    slow = c.exec("""
        t = time.monotonic(); [N.nvmlDeviceGetCount() for _ in range(10)]; a = time.monotonic() - t
        t = time.monotonic(); [N.nvmlErrorString(3) for _ in range(10)]; b = time.monotonic() - t
        t = time.monotonic(); N.nvmlInit(); N.nvmlShutdown(); i = time.monotonic() - t
        result = [a, b, i]
    """)
    assert fast < 0.2
    assert slow[0] >= 10 * 0.040
    assert slow[1] < 0.2  # nvmlErrorString is never delayed
    assert slow[2] >= 2 * 0.040


# --------------------------------------------------------------------------------------
# Hidden symbols
# --------------------------------------------------------------------------------------

def test_hidden_symbols(sim, spawn):
    p = spawn()
    sim.write_procs([proc_line(p.pid, 0, "CG", 256)])
    build.install_library(sim.dir, hidden_symbols=["nvmlDeviceGetComputeRunningProcesses_v3"])
    c = sim.init_client()
    assert c.eval("hasattr(N.nvmlLib, 'nvmlDeviceGetComputeRunningProcesses_v3')") is False
    assert c.error("N.nvmlDeviceGetComputeRunningProcesses(H[0])").name == "NVMLLibraryMismatchError"
    assert c.error("N.nvmlDeviceGetComputeRunningProcesses_v3(H[0])").name == "NVMLError_FunctionNotFound"
    assert [x["pid"] for x in c.eval("N.nvmlDeviceGetComputeRunningProcesses_v2(H[0])")] == [p.pid]
    assert [x["pid"] for x in c.eval("N.nvmlDeviceGetGraphicsRunningProcesses(H[0])")] == [p.pid]
    # gpustat falls back to _v2 by itself
    out = subprocess.run([sys.executable, "-m", "gpustat", "--json"], capture_output=True, text=True, check=False, timeout=60,
                         env={**os.environ, "LD_LIBRARY_PATH": os.path.join(sim.dir, "lib")})
    assert out.returncode == 0, out.stderr
    gpus = json.loads(out.stdout)["gpus"]
    assert [x["pid"] for x in gpus[0]["processes"]] == [p.pid]
    # a plain copy again: everything back
    build.install_library(sim.dir)
    c2 = sim.init_client()
    assert [x["pid"] for x in c2.eval("N.nvmlDeviceGetComputeRunningProcesses(H[0])")] == [p.pid]


def test_hidden_symbols_are_validated(sim):
    for bad in ("nvmlDeviceGetNoSuchThing", "malloc", "find_dir"):
        with pytest.raises(ValueError, match=bad):
            build.install_library(sim.dir, hidden_symbols=[bad])
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in build.exported_symbols()
    assert all(s.startswith("nvml") for s in build.exported_symbols())


def test_build_is_idempotent(built):
    before = os.stat(build.LIBRARY_PATH).st_mtime_ns
    assert build.ensure_built() == build.LIBRARY_PATH
    assert os.stat(build.LIBRARY_PATH).st_mtime_ns == before
    out = subprocess.run(["readelf", "-d", build.LIBRARY_PATH], capture_output=True, text=True, check=False)
    if out.returncode == 0:
        assert "Library soname: [libnvidia-ml.so.1]" in out.stdout


# --------------------------------------------------------------------------------------
# gpustat over the simulator
# --------------------------------------------------------------------------------------

def test_gpustat(sim, spawn):
    p = spawn()
    sim.sc.gpus[4].temperature = 55
    sim.sc.gpus[4].not_supported = ["power"]
    sim.save()
    sim.write_procs([proc_line(p.pid, 4, "C", 4096)])
    out = subprocess.run([sys.executable, "-m", "gpustat", "--json"], capture_output=True, text=True, check=False, timeout=60,
                         env={**os.environ, "LD_LIBRARY_PATH": os.path.join(sim.dir, "lib")})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["driver_version"] == "580.159.03"
    gpus = data["gpus"]
    assert len(gpus) == 8
    g = gpus[4]
    assert g["name"] == "NVIDIA H200" and g["uuid"] == sim.sc.gpus[4].uuid
    assert g["temperature.gpu"] == 55 and g["fan.speed"] is None and g["power.draw"] is None
    assert g["enforced.power.limit"] == 700
    assert g["memory.used"] == 4096 and g["memory.total"] == 143771
    assert [(x["pid"], x["gpu_memory_usage"], x["command"]) for x in g["processes"]] == [(p.pid, 4096, "sleep")]
    assert gpus[0]["processes"] == [] and gpus[0]["power.draw"] == 76


# --------------------------------------------------------------------------------------
# PID namespaces: translate vs host mode for a caller in another PID namespace
# --------------------------------------------------------------------------------------

def _find_host_pid(pidns: int, nspid: int) -> int:
    """The host pid of the process that is ``nspid`` in PID namespace ``pidns``."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if scenario.pidns_inode(name) == pidns and int(status_field(int(name), "NSpid")[-1]) == nspid:
                return int(name)
        except (OSError, KeyError, ValueError):
            continue
    raise AssertionError(f"no process {nspid} in pid namespace {pidns}")


def _children(pid: int) -> List[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return [int(n) for n in os.listdir("/proc") if n.isdigit() and _ppid(int(n)) == pid]


def _ppid(pid: int) -> int:
    try:
        return int(status_field(pid, "PPid")[0])
    except (OSError, KeyError):
        return -1


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
@pytest.mark.parametrize("mode", ["translate", "host"])
def test_pid_namespace_modes(sim, spawn, mode):
    sim.sc.pid_mode = mode
    sim.save()
    host_proc = spawn()
    c = sim.client(prefix=["unshare", "--pid", "--fork", "--mount-proc"])
    ns_init = None
    try:
        # inside the new namespace: the pynvml server is pid 1; it starts a holder there
        inner = c.exec("""
            holder = subprocess.Popen(["sleep", "1000"])
            result = {"self": os.getpid(), "holder": holder.pid,
                      "pidns": os.stat("/proc/self/ns/pid").st_ino}
        """)
        assert inner["self"] == 1
        pidns = inner["pidns"]
        assert pidns != sim.sc.host_pidns
        ns_init = _find_host_pid(pidns, 1)
        holder = _find_host_pid(pidns, inner["holder"])
        assert holder in _children(ns_init)
        line = proc_line(holder, 0, "C", 2000)
        assert line.split()[6:] == [str(pidns), str(inner["holder"])]  # registered by host pid/pidns/nspid
        host_line = proc_line(host_proc.pid, 0, "C", 500)
        sim.write_procs([line, host_line])

        c.exec("N.nvmlInit()\nH = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]")
        seen = c.eval("[(p.pid, p.usedGpuMemory) for p in N.nvmlDeviceGetComputeRunningProcesses(H[0])]")
        used = c.eval("N.nvmlDeviceGetMemoryInfo(H[0], N.nvmlMemory_v2).used")
        assert used == 2500 * MIB  # memory always counts, visible or not
        if mode == "translate":
            # its own namespace's pid for the holder; the host process is dropped
            assert seen == [[inner["holder"], 2000 * MIB]]
        else:
            # old drivers: host pids to everyone
            assert seen == [[holder, 2000 * MIB], [host_proc.pid, 500 * MIB]]

        # a caller in the host namespace sees host pids in both modes
        h = sim.init_client()
        assert h.eval("[p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(H[0])]") == [holder, host_proc.pid]

        # the in-namespace caller checks its own holder through its /proc: kill it there
        c.exec("holder.kill(); holder.wait()")
        assert c.eval("[p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(H[0])]") == \
            ([] if mode == "translate" else [host_proc.pid])
        assert c.eval("N.nvmlDeviceGetMemoryInfo(H[0], N.nvmlMemory_v2).used") == 500 * MIB
        # the host process, invisible in the namespace, counts as alive until its exit line
        start = starttime(host_proc.pid)
        t_exit = kill_and_reap(host_proc)
        assert c.eval("N.nvmlDeviceGetMemoryInfo(H[0], N.nvmlMemory_v2).used") == 500 * MIB
        sim.write_procs([line, host_line, exit_line(host_proc.pid, start, t_exit)])
        assert c.eval("N.nvmlDeviceGetMemoryInfo(H[0], N.nvmlMemory_v2).used") == 0
    finally:
        c.close()  # pid 1 of the namespace exits: the kernel kills the rest of it
        if ns_init is not None:
            try:
                os.kill(ns_init, signal.SIGKILL)  # started by this test (under unshare), by pid
            except ProcessLookupError:
                pass


# --------------------------------------------------------------------------------------
# Speed (printed, not asserted)
# --------------------------------------------------------------------------------------

def test_call_speed(sim, spawn):
    p = spawn()
    sim.write_procs([proc_line(p.pid, 1, "C", 1000)])
    c = sim.init_client()
    out = c.exec("""
        def median_ns(f, n=2000):
            ts = []
            for _ in range(n):
                t = time.perf_counter_ns(); f(); ts.append(time.perf_counter_ns() - t)
            ts.sort()
            return ts[len(ts) // 2]
        mem = N.c_nvmlMemory_t()
        raw = N.nvmlLib.nvmlDeviceGetMemoryInfo
        ref = ctypes.byref(mem)
        result = {
            "pynvml_idle_gpu": median_ns(lambda: N.nvmlDeviceGetMemoryInfo(H[0])),
            "pynvml_gpu_with_process": median_ns(lambda: N.nvmlDeviceGetMemoryInfo(H[1])),
            "ctypes_raw": median_ns(lambda: raw(H[0], ref)),
            "python_noop": median_ns(lambda: None),
        }
    """)
    print("\nmedian nvmlDeviceGetMemoryInfo over 2000 calls: "
          f"pynvml {out['pynvml_idle_gpu'] / 1000:.2f} us (GPU with a live process: "
          f"{out['pynvml_gpu_with_process'] / 1000:.2f} us); raw ctypes {out['ctypes_raw'] / 1000:.2f} us; "
          f"timing overhead {out['python_noop'] / 1000:.2f} us")
