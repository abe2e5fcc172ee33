"""The health fields on every driver profile (issue 21): what each branch's library and nvidia-smi give.

One host per profile (``test_health_on_profile``): GPU 0 carries every health fault at once (a
pending row remap, pending retired pages, two uncorrectable ECC errors, a hardware thermal
slowdown, a fabric still In Progress; a GB10 keeps its Not Supported fabric), GPU 1 is healthy. A
probe subprocess with the host's environment reads them through pynvml (NVIDIA's bindings, as a
client of that branch would) and nvidia-smi prints them field by field.

The expectations are written from the public sources of the README's "Health" table, not derived
from profiles.py: rows are remapped from Ampere on and pages retired before it (NVIDIA's A100
memory error management docs), RemappedRows is in the bindings from 11.450.51 (R450),
GpuFabricInfo from 11.525.150, CurrentClocksEventReasons from 12.535.77, GpuFabricInfoV from
12.550.52; a GB10 shows no ECC (its nvidia-smi tables: Volatile Uncorr. ECC N/A).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = r'''
import ctypes, json, sys
import pynvml as N

def call(fn):
    try:
        v = fn()
        return v if isinstance(v, (int, list, tuple)) else str(v)
    except N.NVMLError as e:
        return type(e).__name__
    except N.NVMLLibraryMismatchError:
        return "NVMLLibraryMismatchError"

class Fabric(ctypes.Structure):  # nvml.h: the state is one byte
    _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int), ("cliqueId", ctypes.c_uint),
                ("state", ctypes.c_ubyte)]

class FabricV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int),
                ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte), ("healthMask", ctypes.c_uint)]

lib = ctypes.CDLL("libnvidia-ml.so.1")

def fabric(h, v):
    name = "nvmlDeviceGetGpuFabricInfoV" if v else "nvmlDeviceGetGpuFabricInfo"
    if not hasattr(lib, name):
        return "missing"
    info = FabricV2(version=0x02000024) if v else Fabric()
    ret = getattr(lib, name)(h, ctypes.byref(info))
    return [info.state, info.status] if ret == 0 else ret

N.nvmlInit()
out = []
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    out.append({
        "remapped_rows": call(lambda: list(N.nvmlDeviceGetRemappedRows(h))),
        "retired_pending": call(lambda: N.nvmlDeviceGetRetiredPagesPendingStatus(h)),
        "ecc_uncorrected_volatile": call(lambda: N.nvmlDeviceGetTotalEccErrors(h, 1, 0)),
        "event_reasons": call(lambda: N.nvmlDeviceGetCurrentClocksEventReasons(h)),
        "throttle_reasons": call(lambda: N.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
        "fabric": fabric(h, False),
        "fabric_v": fabric(h, True),
    })
print(json.dumps(out))
'''

NS = "NVMLError_NotSupported"
FNF = "NVMLError_FunctionNotFound"
PENDING_ROWS = [0, 1, 1, 0]  # corrected, uncorrected, pending, failure
IN_PROGRESS = [2, 0]
# profile: (GPU 0's remapped rows, retired pending, ECC, event reasons, fabric, fabric V)
EXPECTED = {
    "r440": (FNF, 1, 2, FNF, "missing", "missing"),                       # V100, before R450/R525/R535
    "r470": (PENDING_ROWS, NS, 2, FNF, "missing", "missing"),             # A100: rows, not pages
    "r525": (PENDING_ROWS, NS, 2, FNF, IN_PROGRESS, "missing"),
    "r535-early": (PENDING_ROWS, NS, 2, 0x48, IN_PROGRESS, "missing"),
    "r535": (PENDING_ROWS, NS, 2, 0x48, IN_PROGRESS, "missing"),
    "r550": (PENDING_ROWS, NS, 2, 0x48, IN_PROGRESS, IN_PROGRESS),
    "r580": (PENDING_ROWS, NS, 2, 0x48, IN_PROGRESS, IN_PROGRESS),
    "gb10": (NS, NS, NS, 0x48, [0, 0], [0, 0]),                          # no ECC, no remapper, no fabric
}
# nvidia-smi of each branch: the value printed for GPU 0, or None when the tool refuses the field (exit 2)
SMI_FIELDS = ["remapped_rows.pending", "retired_pages.pending", "ecc.errors.uncorrected.volatile.total",
              "fabric.state", "clocks_event_reasons.active", "clocks_throttle_reasons.active"]
SMI_EXPECTED = {
    "r440": [None, "Yes", "2", None, None, "0x0000000000000048"],
    "r470": ["Yes", "[N/A]", "2", None, None, "0x0000000000000048"],
    "r525": ["Yes", "[N/A]", "2", "In Progress", None, "0x0000000000000048"],
    "r535-early": ["Yes", "[N/A]", "2", "In Progress", "0x0000000000000048", "0x0000000000000048"],
    "r535": ["Yes", "[N/A]", "2", "In Progress", "0x0000000000000048", "0x0000000000000048"],
    "r550": ["Yes", "[N/A]", "2", "In Progress", "0x0000000000000048", "0x0000000000000048"],
    "r580": ["Yes", "[N/A]", "2", "In Progress", "0x0000000000000048", "0x0000000000000048"],
    "gb10": ["[N/A]", "[N/A]", "[N/A]", "Not Supported", "0x0000000000000048", "0x0000000000000048"],
}


def test_every_profile_is_covered():
    from gpusimkit import profiles
    assert set(EXPECTED) == set(profiles.NAMES) == set(SMI_EXPECTED)


@pytest.mark.parametrize("driver", list(EXPECTED))
def test_health_on_profile(gpusim_factory, driver):
    gb10 = driver == "gb10"
    host = gpusim_factory(driver=driver, gpus=None if gb10 else 2)
    faults = {"remap_pending": 1, "remap_uncorrected": 1, "retired_pending": 1, "ecc_volatile_uncorrected": 2,
              "clock_reasons": 0x48}
    if not gb10:
        faults["fabric_state"] = "in_progress"
    host.fault(health={0: faults})
    p = subprocess.run([sys.executable, "-c", PROBE], env=host.env(), capture_output=True, text=True, timeout=60,
                       check=False)
    assert p.returncode == 0, p.stderr
    gpus = json.loads(p.stdout)
    rows, retired, ecc, events, fabric, fabric_v = EXPECTED[driver]
    g0 = gpus[0]
    assert g0["remapped_rows"] == rows
    assert g0["retired_pending"] == retired
    assert g0["ecc_uncorrected_volatile"] == ecc
    assert g0["event_reasons"] == events
    assert g0["throttle_reasons"] == 0x48  # the name before R535 stays on every branch
    assert g0["fabric"] == fabric and g0["fabric_v"] == fabric_v
    if not gb10:  # GPU 1 is healthy: a clean remapper (or none), no ECC error, its fabric Completed
        g1 = gpus[1]
        assert g1["remapped_rows"] in ([0, 0, 0, 0], FNF) and g1["ecc_uncorrected_volatile"] == 0
        assert g1["throttle_reasons"] == 0x1
        assert g1["fabric"] in ([3, 0], "missing")
    for field, want in zip(SMI_FIELDS, SMI_EXPECTED[driver]):
        r = subprocess.run(["nvidia-smi", "--id=0", f"--query-gpu={field}", "--format=csv,noheader"], env=host.env(),
                           capture_output=True, text=True, timeout=60, check=False)
        if want is None:
            assert r.returncode == 2 and f'Field "{field}" is not a valid field to query.' in r.stdout, (field, r.stdout)
        else:
            assert r.returncode == 0 and r.stdout.strip() == want, (driver, field, r.stdout, r.stderr)


def test_fault_health_is_validated_and_cleared(gpusim):
    from gpusimkit.scenario import ScenarioError
    with pytest.raises(ScenarioError, match="health field 'warp'"):
        gpusim.fault(health={0: {"warp": 1}})
    with pytest.raises(ScenarioError, match="remap_pending"):
        gpusim.fault(health="0:remap_pending=7")
    with pytest.raises(ScenarioError, match="xid"):
        gpusim.fault(xid={0: 0})
    gpusim.fault(health="1:fabric_state=not_started,ecc_volatile_uncorrected=4", xid="1:79", drain_ms=500)
    sc = gpusim.scenario()
    assert (sc.gpus[1].fabric_state, sc.gpus[1].ecc_volatile_uncorrected, sc.drain_ms) == (1, 4, 500)
    gpusim.fault(clear=True)
    sc = gpusim.scenario()
    assert (sc.gpus[1].fabric_state, sc.gpus[1].ecc_volatile_uncorrected, sc.drain_ms) == (3, 0, 500)
    with open(gpusim.path("kmsg"), encoding="utf-8") as f:
        assert "NVRM: Xid (PCI:0000:2a:00): 79," in f.read()  # the log is history: clear keeps it


def test_drain_releases_memory_linearly(gpusim):
    import time
    gpusim.fault(drain_ms=2000)
    pid = gpusim.hold(gpus=[0], mib=10000)
    assert gpusim.kill(pid)
    seen = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        seen.append(gpusim.status()["gpus"][0]["memory_used_mib"])
        if seen[-1] == 0:
            break
        time.sleep(0.1)
    assert seen[-1] == 0 and len({m for m in seen if 0 < m < 10000}) >= 3, seen  # in steps, not at once
    assert all(a >= b for a, b in zip(seen, seen[1:])), seen


def test_inforom_corrupt_warns_and_exits_14(gpusim):
    """health inforom_corrupt: nvmlDeviceValidateInforom answers NVML_ERROR_CORRUPTED_INFOROM (14) on that GPU only;
    nvidia-smi prints `WARNING: infoROM is corrupted at gpu 0000:BB:00.0` before its (complete) output and exits 14
    (nvidia-smi(1) RETURN VALUE), for the GPUs it is asked about; -q -x says nothing and exits 0 (microsoft/pai#3756)."""
    gpusim.fault(health={1: {"inforom_corrupt": 1}})
    probe = ("import pynvml; pynvml.nvmlInit(); out = []\n"
             "for i in range(pynvml.nvmlDeviceGetCount()):\n"
             "    try:\n        pynvml.nvmlDeviceValidateInforom(pynvml.nvmlDeviceGetHandleByIndex(i)); out.append(0)\n"
             "    except pynvml.NVMLError as e:\n        out.append(e.value)\n"
             "print(out)")
    p = subprocess.run([sys.executable, "-c", probe], env=gpusim.env(), capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0 and p.stdout.strip() == str([0, 14] + [0] * 6), (p.stdout, p.stderr)
    bus = gpusim.status()["gpus"][1]["pci_bus_id"]  # 00000000:BB:00.0 -> 0000:BB:00.0
    legacy = bus[4:]

    def smi(*args):
        return subprocess.run(["nvidia-smi", *args], env=gpusim.env(), capture_output=True, text=True, timeout=60, check=False)

    r = smi("--query-gpu=index,uuid", "--format=csv,noheader,nounits")
    lines = r.stdout.splitlines()
    assert r.returncode == 14 and lines[0] == f"WARNING: infoROM is corrupted at gpu {legacy}", r.stdout
    assert [line.split(", ")[0] for line in lines[1:]] == [str(i) for i in range(8)], r.stdout
    r = smi("--query-compute-apps=pid", "--format=csv,noheader")
    assert r.returncode == 14 and r.stdout.startswith("WARNING: infoROM is corrupted"), r.stdout
    r = smi("--id=0", "--query-gpu=index", "--format=csv,noheader")
    assert (r.returncode, r.stdout) == (0, "0\n")  # only the GPUs asked about
    r = smi("-q", "-x")
    assert r.returncode == 0 and "WARNING" not in r.stdout, r.stdout[:200]
    gpusim.fault(clear=True)
    assert smi("--query-gpu=index", "--format=csv,noheader").returncode == 0
