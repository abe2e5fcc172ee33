"""Peer check: gpustat (an NVML client this project did not write) and gpu_facts agree."""

import json
import os
import subprocess
import sys

from modrun import run_module


def test_gpustat_and_gpu_facts_agree(gpusim, collection):
    gpusim.hold(gpus=[0, 1, 2, 3], mib=40960, tree=True)
    gpusim.hold(gpus=[6], mib=1200)
    gpusim.fault(leak={7: 300})
    facts = run_module(gpusim, collection, "gpu_facts", {"device_files": [gpusim.dir + "/dev/nvidia*"]})
    gpustat = os.path.join(os.path.dirname(sys.executable), "gpustat")
    peer = json.loads(subprocess.run([gpustat, "--json"], env=gpusim.env(), capture_output=True, text=True,
                                     timeout=60, check=True).stdout)
    ours = facts["ansible_facts"]["gpu_devices"]
    assert len(ours) == len(peer["gpus"]) == 8
    for mine, theirs in zip(ours, peer["gpus"]):
        assert mine["index"] == theirs["index"]
        assert mine["uuid"] == theirs["uuid"]
        assert mine["memory"]["used"] == theirs["memory.used"], (mine["index"], mine["memory"], theirs["memory.used"])
        assert mine["memory"]["total"] == theirs["memory.total"]
        assert sorted(p["pid"] for p in mine["processes"]) == sorted(p["pid"] for p in theirs["processes"])
    assert ours[7]["memory"]["used"] == 300 and ours[7]["processes"] == []
