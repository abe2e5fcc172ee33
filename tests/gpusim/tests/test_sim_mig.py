"""MIG in the simulator (README "MIG"): the scenario's MIG devices, the NVML MIG calls through the real pynvml,
workloads on a MIG device, the capability nodes and nvidia-smi's MIG outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

GPUSIM = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if GPUSIM not in sys.path:
    sys.path.insert(0, GPUSIM)

from gpusimkit import scenario  # noqa: E402
from gpusimkit.host import ScenarioError  # noqa: E402

CLIENT = r'''
import json, sys
import pynvml as N
N.nvmlInit()
out = []
for i in range(N.nvmlDeviceGetCount()):
    g = N.nvmlDeviceGetHandleByIndex(i)
    cur, pend = N.nvmlDeviceGetMigMode(g)
    migs = []
    for k in range(N.nvmlDeviceGetMaxMigDeviceCount(g)):
        try:
            m = N.nvmlDeviceGetMigDeviceHandleByIndex(g, k)
        except N.NVMLError_NotFound:
            continue
        mem = N.nvmlDeviceGetMemoryInfo(m)
        migs.append({"uuid": N.nvmlDeviceGetUUID(m), "gi": N.nvmlDeviceGetGpuInstanceId(m),
                     "ci": N.nvmlDeviceGetComputeInstanceId(m), "is_mig": getattr(N.nvmlDeviceIsMigDeviceHandle(m), "value", None),
                     "total": mem.total >> 20, "used": mem.used >> 20,
                     "parent": N.nvmlDeviceGetUUID(N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)),
                     "procs": [[p.pid, p.usedGpuMemory >> 20, p.gpuInstanceId, p.computeInstanceId]
                               for p in N.nvmlDeviceGetComputeRunningProcesses(m)]})
    out.append({"uuid": N.nvmlDeviceGetUUID(g), "mig": [cur, pend], "migs": migs,
                "used": N.nvmlDeviceGetMemoryInfo(g).used >> 20,
                "procs": [[p.pid, p.gpuInstanceId, p.computeInstanceId] for p in N.nvmlDeviceGetComputeRunningProcesses(g)]})
print(json.dumps(out))
'''


def nvml(host):
    r = subprocess.run([sys.executable, "-c", CLIENT], env=dict(os.environ, **host.env()), capture_output=True, text=True,
                       timeout=60, check=True)
    return json.loads(r.stdout)


def smi(host, *args):
    return subprocess.run(["nvidia-smi", *args], env=dict(os.environ, **host.env()), capture_output=True, text=True,
                          timeout=60, check=False)


def test_mig_devices_and_their_processes(gpusim_factory):
    host = gpusim_factory(gpus=2)
    devs = host.set_mig(0, ["3g.71gb", "1g.18gb"])
    assert [(d["gi"], d["ci"]) for d in devs] == [(1, 0), (2, 0)]
    pid = host.hold(devs[1]["uuid"], mib=4096)
    other = host.hold((0, 1, 0), mib=1000)
    whole = host.hold(1, mib=512)
    gpus = nvml(host)
    g0, g1 = gpus
    assert g0["mig"] == [1, 1] and g1["mig"] == [0, 0] and g1["migs"] == []
    assert [m["uuid"] for m in g0["migs"]] == [d["uuid"] for d in devs]
    a, b = g0["migs"]
    assert (a["gi"], a["ci"], a["is_mig"], a["total"], a["used"]) == (1, 0, 1, devs[0]["memory_mib"], 1000)
    assert a["procs"] == [[other, 1000, 1, 0]] and b["procs"] == [[pid, 4096, 2, 0]]
    assert a["parent"] == g0["uuid"] == b["parent"]
    # the GPU's handle in MIG mode: every MIG device's processes, their instance ids set; memory in aggregate
    assert sorted(g0["procs"]) == sorted([[pid, 2, 0], [other, 1, 0]]) and g0["used"] == 5096
    assert g1["procs"] == [[whole, 0xFFFFFFFF, 0xFFFFFFFF]]
    # the capability nodes its process holds, and their /proc/driver/nvidia/capabilities files
    fds = {os.readlink(f"/proc/{pid}/fd/{f}") for f in os.listdir(f"/proc/{pid}/fd")}
    assert host.path("dev", "nvidia-caps", f"nvidia-cap{devs[1]['gi_cap']}") in fds
    assert host.path("dev", "nvidia-caps", f"nvidia-cap{devs[1]['ci_cap']}") in fds
    with open(host.path("proc", "driver", "nvidia", "capabilities", "gpu0", "mig", "gi2", "ci0", "access"), encoding="utf-8") as f:
        assert f.read().splitlines()[0] == f"DeviceFileMinor: {devs[1]['ci_cap']}"
    assert (devs[0]["gi_cap"], devs[0]["ci_cap"]) == (12, 13)  # mig-minors: gpu0/gi1/access 12, gpu0/gi1/ci0/access 13


def test_smi_lists_mig_devices(gpusim_factory):
    host = gpusim_factory(gpus=1)
    devs = host.set_mig(0, ["3g.71gb", "1g.18gb"])
    lines = smi(host, "-L").stdout.splitlines()
    assert lines[1] == f"  MIG 3g.71gb     Device  0: (UUID: {devs[0]['uuid']})"
    lgi = smi(host, "mig", "-lgi").stdout.splitlines()
    assert lgi[5] == "|   0  MIG 3g.71gb          9        1          0:4     |"
    lci = smi(host, "mig", "-lci").stdout.splitlines()
    assert lci[7] == "|   0      2       MIG 1g.18gb          0         0          0:1     |"
    xml = smi(host, "-q", "-x").stdout
    assert xml.count("<mig_device>") == 2 and "<gpu_instance_id>2</gpu_instance_id>" in xml


def test_mig_off_and_pending(gpusim_factory):
    host = gpusim_factory(gpus=1)
    r = smi(host, "mig", "-lgi")
    assert (r.returncode, r.stdout) == (6, "No MIG-enabled devices found.\n")
    host.set_mig(0, current=0, pending=1)
    assert nvml(host)[0]["mig"] == [0, 1]
    with pytest.raises(ScenarioError, match="MIG mode"):
        host.set_mig(0, ["1g.18gb"], current=1)  # fine
        host.hold(0, mib=10)  # a context on a MIG GPU is on one of its MIG devices


def test_scenario_validates_mig():
    g = scenario.make_gpus(1)[0]
    g.mig_devices = scenario.mig_layout(g, ["1g.18gb"])
    with pytest.raises(ScenarioError, match="mig_current"):
        g.validate()
    g.mig_current = 1
    g.validate()
    with pytest.raises(ScenarioError, match="profile"):
        scenario.mig_layout(g, ["big"])


def test_a_reset_applies_a_pending_mig_mode(gpusim_factory):
    host = gpusim_factory(gpus=1)
    with scenario.edit(host.dir) as sc:
        sc.gpus[0].persistence = sc.gpus[0].fabric_state = 0  # nvidia-smi -r refuses persistence mode and NVSwitch GPUs
    host.set_mig(0, current=0, pending=1)
    r = smi(host, "-r", "-i", "0")
    assert r.returncode == 0, r.stdout
    assert nvml(host)[0]["mig"] == [1, 1] and host.mig_devices(0) == []
