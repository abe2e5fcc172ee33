"""Driver-branch profiles (gpusimkit/profiles.py): what each branch's library, nvidia-smi and a
third-party client (gpustat) do, on a host with real processes.

One host per profile (``test_profile``, parametrized): three processes on GPU 0, one on GPU 1,
none on GPU 2 (a GB10 has one GPU: the three on GPU 0 only).  A probe subprocess with the host's
environment looks the symbols up with ``dlsym`` (ctypes), reads the versions through pynvml, reads
the processes through every process query the library has with the raw layout that query writes
(ctypes structs, not pynvml), and through pynvml's own wrappers; then nvidia-smi and gpustat run.

The expectations below are written from the public sources the README's "Driver profiles" table
cites, not derived from profiles.py, so that a wrong profile fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

GPUSIM = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if GPUSIM not in sys.path:
    sys.path.insert(0, GPUSIM)

from gpusimkit import build, profiles  # noqa: E402
from gpusimkit import scenario as scn  # noqa: E402
from gpusimkit.scenario import ScenarioError  # noqa: E402

MIB = 1 << 20
NO_INSTANCE = 0xFFFFFFFF
GPUSTAT = os.path.join(os.path.dirname(sys.executable), "gpustat")
CLI = os.path.join(GPUSIM, "gpusim")

V2 = [f"nvmlDeviceGet{k}RunningProcesses_v2" for k in ("Compute", "Graphics", "MPSCompute")]
V3 = [f"nvmlDeviceGet{k}RunningProcesses_v3" for k in ("Compute", "Graphics", "MPSCompute")]
V1 = [f"nvmlDeviceGet{k}RunningProcesses" for k in ("Compute", "Graphics", "MPSCompute")]
MEM2 = "nvmlDeviceGetMemoryInfo_v2"
MIG = ["nvmlDeviceGetMigMode", "nvmlDeviceIsMigDeviceHandle", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
       "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId"]
CC = "nvmlDeviceGetConfComputeMemSizeInfo"
DETAIL = "nvmlDeviceGetRunningProcessDetailList"
TEMPV = "nvmlDeviceGetTemperatureV"
# Health: RemappedRows from R450, GpuFabricInfo from R525, CurrentClocksEventReasons from R535, GpuFabricInfoV
# from R550 (nvidia-ml-py 11.450.51, 11.525.150, 12.535.77, 12.550.52); the rest on every branch.
REMAP = "nvmlDeviceGetRemappedRows"
FABRIC = "nvmlDeviceGetGpuFabricInfo"
FABRICV = "nvmlDeviceGetGpuFabricInfoV"
EVENTS = "nvmlDeviceGetCurrentClocksEventReasons"
ALWAYS = ["nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetEccMode",
          "nvmlDeviceGetCurrentClocksThrottleReasons"]

# profile: (driver_version, nvml_version, cuda_version, "CUDA Version" text, model, memory MiB, GPUs,
#           symbols missing, symbols present, _v3 entry bytes (None: no _v3))
EXPECTED = {
    "r440": ("440.118.02", "10.440.118.02", 10020, "10.2", "Tesla V100-SXM2-32GB", 32510, 8,
             V2 + V3 + [MEM2] + MIG + [CC, DETAIL, TEMPV, REMAP, FABRIC, FABRICV, EVENTS], V1 + ALWAYS, None),
    "r470": ("470.256.02", "11.470.256.02", 11040, "11.4", "NVIDIA A100-SXM4-80GB", 81920, 8,
             V3 + [MEM2, CC, DETAIL, TEMPV, FABRIC, FABRICV, EVENTS], V1 + V2 + MIG + [REMAP] + ALWAYS, None),
    "r525": ("525.147.05", "12.525.147.05", 12000, "12.0", "NVIDIA H100 80GB HBM3", 81559, 8,
             [CC, DETAIL, TEMPV, FABRICV, EVENTS], V1 + V2 + V3 + [MEM2] + MIG + [REMAP, FABRIC] + ALWAYS, 24),
    "r535-early": ("535.54.03", "12.535.54.03", 12020, "12.2", "NVIDIA H100 80GB HBM3", 81559, 8,
                   [DETAIL, TEMPV, FABRICV], V1 + V2 + V3 + [MEM2, CC] + MIG + [REMAP, FABRIC, EVENTS] + ALWAYS, 32),
    "r535": ("535.216.01", "12.535.216.01", 12020, "12.2", "NVIDIA H100 80GB HBM3", 81559, 8,
             [TEMPV, FABRICV], V1 + V2 + V3 + [MEM2, CC, DETAIL] + MIG + [REMAP, FABRIC, EVENTS] + ALWAYS, 24),
    "r550": ("550.163.01", "12.550.163.01", 12040, "12.4", "NVIDIA H200", 143771, 8,
             [TEMPV], V1 + V2 + V3 + [MEM2, CC, DETAIL] + MIG + [REMAP, FABRIC, FABRICV, EVENTS] + ALWAYS, 24),
    "r580": ("580.159.03", "13.580.159.03", 13000, "13.0", "NVIDIA H200", 143771, 8,
             [], V1 + V2 + V3 + [MEM2, CC, DETAIL, TEMPV] + MIG + [REMAP, FABRIC, FABRICV, EVENTS] + ALWAYS, 24),
    "gb10": ("580.126.09", "13.580.126.09", 13000, "13.0", "NVIDIA GB10", None, 1,
             [], V1 + V2 + V3 + [MEM2, CC, DETAIL, TEMPV] + MIG + [REMAP, FABRIC, FABRICV, EVENTS] + ALWAYS, 24),
}


def test_every_profile_is_tested():
    assert set(EXPECTED) == set(profiles.NAMES)
    assert profiles.DEFAULT_PROFILE == "r580"


# --------------------------------------------------------------------------------------
# The probe: ctypes (dlsym, raw layouts) and pynvml, in a process with the host's environment.
# --------------------------------------------------------------------------------------

PROBE = r'''
import ctypes, json, sys
import pynvml as N

names, ngpus = json.loads(sys.argv[1]), int(sys.argv[2])
lib = ctypes.CDLL("libnvidia-ml.so.1")
out = {"symbols": {n: hasattr(lib, n) for n in names}}

class V1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]
class V2(ctypes.Structure):
    _fields_ = V1._fields_ + [("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]
class V3(ctypes.Structure):
    _fields_ = V2._fields_ + [("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]
class DetailList(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("mode", ctypes.c_uint), ("numProcArrayEntries", ctypes.c_uint),
                ("procArray", ctypes.POINTER(V3))]
assert (ctypes.sizeof(V1), ctypes.sizeof(V2), ctypes.sizeof(V3), ctypes.sizeof(DetailList)) == (16, 24, 32, 24)

def entry(e):
    return [e.pid, e.usedGpuMemory] + [getattr(e, f) for f in ("gpuInstanceId", "computeInstanceId",
                                                                "usedGpuCcProtectedMemory") if hasattr(e, f)]

def raw(sym, struct, h):
    """The two-call protocol by hand, with exactly N entries of `struct` the second time."""
    fn = getattr(lib, sym)
    count = ctypes.c_uint(0)
    ret = fn(h, ctypes.byref(count), None)
    if ret == 0:
        return {"first": [ret, count.value], "entries": []}
    first = [ret, count.value]
    arr = (struct * count.value)()
    ret = fn(h, ctypes.byref(count), arr)
    return {"first": first, "ret": ret, "entries": [entry(arr[k]) for k in range(count.value)]}

def raw_detail(h, mode=0):
    fn = lib.nvmlDeviceGetRunningProcessDetailList
    pl = DetailList(version=0x1000018, mode=mode)
    ret = fn(h, ctypes.byref(pl))
    if ret == 0:
        return {"first": [ret, pl.numProcArrayEntries], "entries": []}
    first = [ret, pl.numProcArrayEntries]
    arr = (V3 * pl.numProcArrayEntries)()
    pl.procArray = ctypes.cast(arr, ctypes.POINTER(V3))
    ret = fn(h, ctypes.byref(pl))
    return {"first": first, "ret": ret, "entries": [entry(arr[k]) for k in range(pl.numProcArrayEntries)]}

def py(f):
    try:
        return {"ok": f()}
    except Exception as e:
        return {"error": type(e).__name__}

def procs(lst):
    return [[p.pid, p.usedGpuMemory] for p in lst]

N.nvmlInit()
out["driver_version"] = N.nvmlSystemGetDriverVersion()
out["nvml_version"] = N.nvmlSystemGetNVMLVersion()
out["cuda_version"] = N.nvmlSystemGetCudaDriverVersion()
out["count"] = N.nvmlDeviceGetCount()
out["gpus"] = []
v3size = int(sys.argv[3])
for i in range(ngpus):
    h = N.nvmlDeviceGetHandleByIndex(i)
    hc = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(hc)) == 0
    g = {"name": N.nvmlDeviceGetName(h), "bus_id": N.nvmlDeviceGetPciInfo(h).busId}
    g["memory_v1"] = py(lambda: [N.nvmlDeviceGetMemoryInfo(h).total, N.nvmlDeviceGetMemoryInfo(h).used])
    g["memory_v2"] = py(lambda: [N.nvmlDeviceGetMemoryInfo(h, N.nvmlMemory_v2).used,
                                 N.nvmlDeviceGetMemoryInfo(h, N.nvmlMemory_v2).reserved])
    g["raw"] = {}
    if hasattr(lib, "nvmlDeviceGetComputeRunningProcesses"):
        g["raw"]["v1"] = raw("nvmlDeviceGetComputeRunningProcesses", V1, hc)
    if hasattr(lib, "nvmlDeviceGetComputeRunningProcesses_v2"):
        g["raw"]["v2"] = raw("nvmlDeviceGetComputeRunningProcesses_v2", V2, hc)
    if hasattr(lib, "nvmlDeviceGetComputeRunningProcesses_v3"):
        g["raw"]["v3"] = raw("nvmlDeviceGetComputeRunningProcesses_v3", V3 if v3size == 32 else V2, hc)
    if hasattr(lib, "nvmlDeviceGetRunningProcessDetailList"):
        g["raw"]["detail"] = raw_detail(hc)
        g["raw"]["detail_graphics"] = raw_detail(hc, 1)
    g["pynvml"] = {
        "unversioned": py(lambda: procs(N.nvmlDeviceGetComputeRunningProcesses(h))),
        "v2": py(lambda: procs(N.nvmlDeviceGetComputeRunningProcesses_v2(h))),
        "detail": py(lambda: [[p.pid, p.usedGpuMemory, p.usedGpuCcProtectedMemory]
                              for p in N.nvmlDeviceGetRunningProcessDetailList(h, N.nvmlProcessDetailList_v1, 0)]),
        "conf_compute": py(lambda: [N.nvmlDeviceGetConfComputeMemSizeInfo(h).protectedMemSizeKib,
                                    N.nvmlDeviceGetConfComputeMemSizeInfo(h).unprotectedMemSizeKib]),
        "mig": py(lambda: N.nvmlDeviceGetMigMode(h)),
        "fan": py(lambda: N.nvmlDeviceGetFanSpeed(h)),
    }
    out["gpus"].append(g)
print(json.dumps(out))
'''


def probe(host, ngpus):
    sc = host.scenario()
    names = build.exported_symbols()
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(names), str(ngpus), str(sc.process_v3_entry_bytes)],
                       env=host.env(), capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def smi(host, *args):
    p = subprocess.run(["nvidia-smi", *args], env=host.env(), capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def entries(pairs):
    """[(pid, mib)] -> what a correct 16/24/32-byte read gives: [pid, bytes(, gi, ci(, cc))]."""
    return [[pid, mib * MIB] for pid, mib in pairs]


# --------------------------------------------------------------------------------------
# One host per profile
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("driver", list(EXPECTED))
def test_profile(gpusim_factory, driver):
    (drv, nvml, cuda, cuda_text, model, memory, count, missing, present, v3_bytes) = EXPECTED[driver]
    host = gpusim_factory(driver=driver)
    sc = host.scenario()
    assert sc.driver_profile == driver and sc.gpu_count == count
    assert host.status()["scenario"]["driver_profile"] == driver
    assert all(g.name == model for g in sc.gpus)
    if memory is not None:
        assert all(g.memory_total_mib == memory for g in sc.gpus)

    # three processes on GPU 0, one on GPU 1, none on GPU 2 (GB10: one GPU, the three on it)
    on0 = [(host.hold([0], mib=mib), mib) for mib in (1000, 2000, 3000)]
    on1 = [(host.hold([1], mib=777), 777)] if count > 1 else []
    ngpus = min(count, 3)
    want = [on0, on1, []][:ngpus]
    with scn.edit(host.dir) as s:  # reserved memory: counted in v1's used, not in v2's
        s.gpus[0].memory_reserved_mib = 512

    out = probe(host, ngpus)

    # symbols, through dlsym
    for name in missing:
        assert out["symbols"][name] is False, (driver, name)
    for name in present:
        assert out["symbols"][name] is True, (driver, name)
    assert {n for n, there in out["symbols"].items() if not there} == set(missing)

    # versions, through pynvml
    assert (out["driver_version"], out["nvml_version"], out["cuda_version"], out["count"]) == (drv, nvml, cuda, count)

    for i, g in enumerate(out["gpus"]):
        expect = entries(want[i])
        # every process query the library has, read with the layout it writes
        reads = g["raw"]
        assert set(reads) == ({"v1"} | ({"v2"} if V2[0] in present else set()) | ({"v3"} if v3_bytes else set())
                              | ({"detail", "detail_graphics"} if DETAIL in present else set()))
        for kind, r in reads.items():
            n = 0 if kind == "detail_graphics" else len(expect)
            assert r["first"] == [0 if n == 0 else 7, n], (driver, i, kind)  # SUCCESS / INSUFFICIENT_SIZE
            got = r["entries"]
            if kind == "detail_graphics":
                assert got == []
                continue
            assert [e[:2] for e in got] == expect, (driver, i, kind)
            extra = {"v1": [], "v2": [NO_INSTANCE, NO_INSTANCE],
                     "v3": [NO_INSTANCE, NO_INSTANCE] + ([0] if v3_bytes == 32 else []),
                     "detail": [NO_INSTANCE, NO_INSTANCE, 0]}[kind]
            assert all(e[2:] == extra for e in got), (driver, i, kind, got)

        # pynvml's own wrappers: nvidia-ml-py 13 always reads 24-byte entries
        pv = g["pynvml"]
        if V2[0] in present:
            assert pv["v2"] == {"ok": expect}
        else:
            assert pv["v2"] == {"error": "NVMLError_FunctionNotFound"}
        if v3_bytes is None:
            assert pv["unversioned"] == {"error": "NVMLLibraryMismatchError"}
        elif v3_bytes == 24:
            assert pv["unversioned"] == {"ok": expect}
        elif len(expect) == 3:  # 32-byte entries read as 24-byte ones (nvitop PR 79, gpustat issue 161)
            (a, ma), (b, _mb), (_c, _mc) = want[i]
            assert pv["unversioned"] != {"ok": expect}
            # entry 1 starts at byte 24: pid = low half of entry 0's usedGpuCcProtectedMemory (0),
            # usedGpuMemory = entry 1's pid and padding; entry 2 at byte 48: pid = entry 1's
            # gpuInstanceId, usedGpuMemory = entry 1's usedGpuCcProtectedMemory
            assert pv["unversioned"] == {"ok": [[a, ma * MIB], [0, b], [NO_INSTANCE, 0]]}
        else:  # one process (or none): the first entry is at the same place in both layouts
            assert pv["unversioned"] == {"ok": expect}
        if DETAIL in present:
            assert pv["detail"] == {"ok": [e + [0] for e in expect]}
        else:
            assert pv["detail"] == {"error": "NVMLError_FunctionNotFound"}
        assert pv["conf_compute"] == ({"ok": [0, 0]} if CC in present else {"error": "NVMLError_FunctionNotFound"})
        assert pv["fan"] == {"error": "NVMLError_NotSupported"}
        if driver == "r440":
            assert pv["mig"] == {"error": "NVMLError_FunctionNotFound"}
        elif driver == "gb10":
            assert pv["mig"] == {"error": "NVMLError_NotSupported"}
        else:
            assert pv["mig"] == {"ok": [0, 0]}

        # memory: v1 used includes reserved, v2 reports it apart; a GB10 answers neither
        used = sum(m for _p, m in want[i])
        reserved = 512 if i == 0 else 0
        if driver == "gb10":
            assert g["memory_v1"] == g["memory_v2"] == {"error": "NVMLError_NotSupported"}
        else:
            assert g["memory_v1"] == {"ok": [memory * MIB, (used + reserved) * MIB]}
            assert g["memory_v2"] == ({"ok": [used * MIB, reserved * MIB]} if MEM2 in present
                                      else {"error": "NVMLError_FunctionNotFound"})
    if driver == "gb10":
        assert out["gpus"][0]["bus_id"] == "0000000F:01:00.0"

    # nvidia-smi of that branch, with its own library; before R510 it has no memory.reserved field at all
    # and refuses the whole query for it, as the real one (tests/field: the pre-R510 listing)
    prof = profiles.get(driver)
    refused = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.reserved", "--format=csv,noheader,nounits"],
                             env=host.env(), capture_output=True, text=True, timeout=60, check=False)
    listing = smi(host, "--help-query-gpu")
    if "memory.reserved" in prof.smi_absent_fields:
        assert (refused.returncode, refused.stdout) == (2, 'Field "memory.reserved" is not a valid field to query.\n\n')
        assert '"memory.reserved"' not in listing and '"memory.used"' in listing
        rows = [r + ", [N/A]" for r in smi(host, "--query-gpu=memory.used", "--format=csv,noheader,nounits").splitlines()]
    else:
        assert refused.returncode == 0 and '"memory.reserved"' in listing
        rows = refused.stdout.splitlines()
    for field in prof.smi_absent_fields:
        assert f'"{field}"' not in listing
    if driver == "gb10":
        assert rows == ["[N/A], [N/A]"]
    else:
        v2 = MEM2 in present
        used0 = sum(m for _p, m in on0) + (0 if v2 else 512)
        assert rows[0] == f"{used0}, {512 if v2 else '[N/A]'}"
        assert rows[1] == f"777, {0 if v2 else '[N/A]'}"
        assert all(r == f"0, {0 if v2 else '[N/A]'}" for r in rows[2:])
    apps = smi(host, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").splitlines()
    assert apps == [f"{pid}, {mib}" for pid, mib in on0 + on1]
    table = smi(host).splitlines()
    header = [line for line in table if "NVIDIA-SMI" in line]
    assert len(header) == 1
    assert f"NVIDIA-SMI {drv} " in header[0] and f"Driver Version: {drv} " in header[0]
    assert f"CUDA Version: {cuda_text} " in header[0]
    for pid, mib in on0 + on1:
        assert any(f"{pid:>16}      C" in line and f"{mib}MiB |" in line for line in table), pid
    if driver == "gb10":
        assert "| N/A   31C    P0             76W /  N/A  | Not Supported          |      0%      Default |" in table
        assert any("|   0  NVIDIA GB10" in line and "0000000F:01:00.0" in line for line in table)

    # gpustat (nvidia-ml-py 13 underneath)
    gs = subprocess.run([GPUSTAT, "--json"], env=host.env(), capture_output=True, text=True, timeout=60, check=False)
    if driver == "r440":
        # no _v3 and no _v2: gpustat 1.1.1 falls back from _v3 to _v2 only, and pynvml turns the
        # missing function into NVMLLibraryMismatchError, which gpustat does not catch
        assert gs.returncode == 1
        assert "pyNVML version does not match the NVML lib version" in gs.stdout + gs.stderr
    else:
        assert gs.returncode == 0, gs.stderr
        report = json.loads(gs.stdout)
        assert report["driver_version"] == drv
        seen = [[p["pid"] for p in g["processes"]] for g in report["gpus"][:ngpus]]
        if v3_bytes == 32:
            # the wrong pids (0, 4294967295) are not processes psutil knows: only the first is left
            assert seen == [[p for p, _m in want[i][:1]] for i in range(ngpus)]
        else:
            assert seen == [[p for p, _m in want[i]] for i in range(ngpus)]
        # gpustat's own fallback: MemoryInfo_v2 when the library has it, else v1 (reserved included)
        for i, g in enumerate(report["gpus"][:ngpus]):
            used = sum(m for _p, m in want[i]) + (512 if i == 0 and MEM2 not in present else 0)
            assert g["memory.used"] == (None if driver == "gb10" else used), (driver, i)

    # fault --clear goes back to the profile, not to a library with every symbol
    host.fault(hide=["nvmlDeviceGetPowerUsage"], not_supported={0: ["temperature"]})
    sc = host.scenario()
    assert sc.hidden_symbols == sorted(set(missing) | {"nvmlDeviceGetPowerUsage"})
    host.fault(clear=True)
    sc = host.scenario()
    assert sc.hidden_symbols == sorted(missing)
    assert sc.gpus[0].not_supported == (["memory", "mig_mode", "power_limit"] if driver == "gb10" else [])


# --------------------------------------------------------------------------------------
# The new calls and fields, in detail (one r580 host)
# --------------------------------------------------------------------------------------

DETAIL_PROBE = r'''
import ctypes, json
lib = ctypes.CDLL("libnvidia-ml.so.1")
class E(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint), ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]
class L(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("mode", ctypes.c_uint), ("numProcArrayEntries", ctypes.c_uint),
                ("procArray", ctypes.POINTER(E))]
class CC(ctypes.Structure):
    _fields_ = [("protectedMemSizeKib", ctypes.c_ulonglong), ("unprotectedMemSizeKib", ctypes.c_ulonglong)]
class M1(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
class M2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
out = {"uninit": lib.nvmlDeviceGetRunningProcessDetailList(None, None)}
assert lib.nvmlInitWithFlags(0) == 0
h = [ctypes.c_void_p() for _ in range(3)]
for i in range(3):
    assert lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h[i])) == 0

def call(i, version=0x1000018, mode=0, n=0, cap=0):
    pl = L(version=version, mode=mode, numProcArrayEntries=n)
    arr = (E * max(cap, 1))()
    if cap:
        pl.procArray = ctypes.cast(arr, ctypes.POINTER(E))
    ret = lib.nvmlDeviceGetRunningProcessDetailList(h[i], ctypes.byref(pl))
    got = [[arr[k].pid, arr[k].usedGpuMemory >> 20, arr[k].gpuInstanceId, arr[k].usedGpuCcProtectedMemory]
           for k in range(min(cap, pl.numProcArrayEntries))]
    return [ret, pl.numProcArrayEntries, got]

out["null"] = lib.nvmlDeviceGetRunningProcessDetailList(h[0], None)
out["bad_handle"] = lib.nvmlDeviceGetRunningProcessDetailList(ctypes.c_void_p(8), ctypes.byref(L(version=0x1000018)))
out["size"] = call(0)
out["small"] = call(0, n=1, cap=1)
out["full"] = call(0, n=8, cap=8)
out["graphics"] = call(0, mode=1, n=8, cap=8)
out["mps"] = call(0, mode=2, n=8, cap=8)
out["none"] = call(2)
out["version_0"] = call(0, version=0)
out["version_2"] = call(0, version=0x2000018)
out["mode_3"] = call(0, mode=3)
out["not_supported"] = call(1)
cc = CC(7, 7)
ret = lib.nvmlDeviceGetConfComputeMemSizeInfo(h[0], ctypes.byref(cc))
out["cc"] = [ret, cc.protectedMemSizeKib, cc.unprotectedMemSizeKib]
out["cc_null"] = lib.nvmlDeviceGetConfComputeMemSizeInfo(h[0], None)
out["cc_ns"] = lib.nvmlDeviceGetConfComputeMemSizeInfo(h[1], ctypes.byref(cc))
mem = {}
for i in range(3):
    m1, m2 = M1(), M2(version=0x02000028)
    mem[i] = [lib.nvmlDeviceGetMemoryInfo(h[i], ctypes.byref(m1)), m1.used >> 20,
              lib.nvmlDeviceGetMemoryInfo_v2(h[i], ctypes.byref(m2)), m2.used >> 20, m2.reserved >> 20]
out["mem"] = mem
print(json.dumps(out))
'''


def test_detail_list_conf_compute_and_memory_fields(gpusim_factory):
    host = gpusim_factory(gpus=3)
    a = host.hold([0], mib=100)
    b = host.hold([0], mib=200, type="CG")
    c = host.hold([0], mib=300, type="M")
    with scn.edit(host.dir) as s:
        s.gpus[1].not_supported = ["processes", "conf_compute", "memory_v1"]
        s.gpus[2].not_supported = ["memory_v2"]
        s.gpus[2].memory_reserved_mib = 64
    p = subprocess.run([sys.executable, "-c", DETAIL_PROBE], env=host.env(), capture_output=True, text=True,
                       timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["uninit"] == 1
    assert out["null"] == 2 and out["bad_handle"] == 2
    assert out["size"][:2] == [7, 2]  # compute: a and b
    assert out["small"][:2] == [7, 2]  # capacity 1 < 2: the count, nothing written
    assert out["full"] == [0, 2, [[a, 100, NO_INSTANCE, 0], [b, 200, NO_INSTANCE, 0]]]
    assert out["graphics"] == [0, 1, [[b, 200, NO_INSTANCE, 0]]]
    assert out["mps"] == [0, 1, [[c, 300, NO_INSTANCE, 0]]]
    assert out["none"][:2] == [0, 0]
    assert out["version_0"][0] == out["version_2"][0] == 25  # ARGUMENT_VERSION_MISMATCH
    assert out["mode_3"][0] == 2
    assert out["not_supported"][0] == 3
    assert out["cc"] == [0, 0, 0] and out["cc_null"] == 2 and out["cc_ns"] == 3
    # memory_v1 / memory_v2: one of the two calls NOT_SUPPORTED
    assert out["mem"]["0"] == [0, 600, 0, 600, 0]
    assert out["mem"]["1"][0] == 3 and out["mem"]["1"][2:] == [0, 0, 0]
    assert out["mem"]["2"][:2] == [0, 64] and out["mem"]["2"][2] == 3
    # nvidia-smi: v2, else v1 (whose used includes the reserved memory)
    rows = smi(host, "--query-gpu=memory.used,memory.reserved", "--format=csv,noheader,nounits").splitlines()
    assert rows == ["600, 0", "0, 0", "64, [N/A]"]
    with pytest.raises(ScenarioError, match="not_supported"):
        host.fault(not_supported={0: ["memory_v3"]})


# --------------------------------------------------------------------------------------
# Overrides, validation, the CLI
# --------------------------------------------------------------------------------------

def test_explicit_arguments_override_the_profile(gpusim_factory):
    host = gpusim_factory(driver="gb10", gpus=2, model="NVIDIA GB10 (test)", memory_mib=1000,
                          hidden_symbols=["nvmlDeviceGetPowerUsage"])
    sc = host.scenario()
    assert sc.gpu_count == 2 and [g.name for g in sc.gpus] == ["NVIDIA GB10 (test)"] * 2
    assert [g.memory_total_mib for g in sc.gpus] == [1000, 1000]
    assert sc.gpus[0].pci_bus_id == "0000000F:01:00.0"
    assert all(g.not_supported == ["memory", "mig_mode", "power_limit"] for g in sc.gpus)
    assert sc.hidden_symbols == ["nvmlDeviceGetPowerUsage"]
    assert (sc.driver_version, sc.cuda_version, sc.driver_profile) == ("580.126.09", 13000, "gb10")
    st = host.status()["scenario"]
    assert st["driver_profile"] == "gb10" and st["hidden_symbols"] == ["nvmlDeviceGetPowerUsage"]
    assert st["profile_hidden_symbols"] == []
    text = open(host.path("scenario"), encoding="utf-8").read()
    assert "\ndriver_profile gb10\n" in text and "\nprocess_v3_entry_bytes 24\n" in text


def test_default_is_r580_as_before(gpusim):
    sc = gpusim.scenario()
    assert (sc.driver_profile, sc.driver_version, sc.cuda_version, sc.gpu_count) == ("r580", "580.159.03", 13000, 8)
    assert sc.hidden_symbols == [] and sc.process_v3_entry_bytes == 24
    assert all(g.name == "NVIDIA H200" and g.memory_total_mib == 143771 and g.not_supported == [] for g in sc.gpus)


def test_unknown_profile_is_refused_before_anything_is_made():
    base = tempfile.mkdtemp(prefix="gpusim-prof-")
    d = os.path.join(base, "sim")
    try:
        from gpusimkit.host import SimHost  # noqa: PLC0415
        with pytest.raises(ScenarioError, match="driver"):
            SimHost.up(d, driver="r999")
        assert not os.path.exists(d)
        env = dict(os.environ, GPUSIM_PYTHON=sys.executable)
        r = subprocess.run([CLI, "up", "--dir", d, "--driver", "r999"], capture_output=True, text=True, timeout=60,
                           env=env, check=False)
        assert r.returncode == 2 and "driver" in r.stderr and "r535" in r.stderr
        assert not os.path.exists(d)
    finally:
        os.rmdir(base)


def test_cli_up_driver_and_status():
    base = tempfile.mkdtemp(prefix="gpusim-prof-")
    d = os.path.join(base, "sim")
    env = dict(os.environ, GPUSIM_PYTHON=sys.executable)

    def cli(*args):
        return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120, env=env, check=False)

    try:
        r = cli("up", "--dir", d, "--driver", "r535-early", "--gpus", "2")
        assert r.returncode == 0, r.stderr
        sc = scn.load(d)
        assert (sc.driver_profile, sc.gpu_count, sc.process_v3_entry_bytes) == ("r535-early", 2, 32)
        r = cli("status", "--dir", d)
        assert r.returncode == 0
        assert "driver 535.54.03 (profile r535-early, _v3 entries 32 bytes)" in r.stdout
        assert "hidden=" not in r.stdout  # the profile's symbols are not faults
        st = json.loads(cli("status", "--dir", d, "--json").stdout)
        assert st["scenario"]["driver_profile"] == "r535-early"
        assert st["scenario"]["hidden_symbols"] == sorted([DETAIL, TEMPV, FABRICV])
    finally:
        assert cli("down", "--dir", d).returncode == 0
        os.rmdir(base)
