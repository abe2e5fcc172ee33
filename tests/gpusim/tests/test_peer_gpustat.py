"""Peer check: gpustat, an NVML client this project did not write, reads the simulator.

gpustat goes through the real pynvml bindings and its own process lookup (psutil), so if our
libnvidia-ml.so.1 got a struct layout, a unit or the process protocol wrong, gpustat disagrees
with the scenario here.
"""

import json
import os
import subprocess
import sys

GPUSTAT = os.path.join(os.path.dirname(sys.executable), "gpustat")


def run_gpustat(host):
    proc = subprocess.run([GPUSTAT, "--json"], env=host.env(), capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, f"gpustat failed: {proc.stderr}"
    return json.loads(proc.stdout)


def test_gpustat_agrees_with_the_scenario(gpusim):
    pid_a = gpusim.hold(gpus=[0, 1], mib=40960)
    pid_b = gpusim.hold(gpus=[5], mib=1200)
    with open(os.path.join(gpusim.dir, "scenario.json"), encoding="utf-8") as f:
        sc = json.load(f)

    report = run_gpustat(gpusim)

    assert report["driver_version"] == sc["driver_version"] == "580.159.03"
    gpus = report["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    expected_used = {0: 40960, 1: 40960, 5: 1200}
    for g, s in zip(gpus, sc["gpus"]):
        assert g["uuid"] == s["uuid"]
        assert g["name"] == s["name"] == "NVIDIA H200"
        assert g["memory.total"] == s["memory_total_mib"] == 143771
        assert g["memory.used"] == expected_used.get(g["index"], 0), g
        assert g["temperature.gpu"] == s["temperature"]
        assert g["power.draw"] == s["power_mw"] // 1000
        assert g["enforced.power.limit"] == s["power_limit_mw"] // 1000
        assert g["utilization.gpu"] == s["util_gpu"]
        pids = sorted(p["pid"] for p in g["processes"])
        expected_pids = sorted(p for p, held in ((pid_a, (0, 1)), (pid_b, (5,))) if g["index"] in held)
        assert pids == expected_pids, g
        for p in g["processes"]:
            assert p["gpu_memory_usage"] == expected_used[g["index"]]


def test_gpustat_sees_released_memory_and_no_processes(gpusim):
    pid = gpusim.hold(gpus=[3], mib=2048)
    assert run_gpustat(gpusim)["gpus"][3]["memory.used"] == 2048
    gpusim.kill(pid)
    # release_lag is 0 in the default fixture: the driver frees memory as soon as it sees the exit
    report = run_gpustat(gpusim)
    assert report["gpus"][3]["memory.used"] == 0
    assert report["gpus"][3]["processes"] == []
