"""gpu_facts, gpu_release and gpustat on every driver branch the simulator models (issue: R440 to the newest).

Each profile is a simulated host whose libnvidia-ml exports what that branch exports and writes the
process entries that branch writes (tests/gpusim/README.md, "Driver profiles"). The scenario on
each: three processes on GPU 0, one on GPU 1, none on GPU 2 (GB10 has one GPU: the three on GPU 0).
"r535-early" (535.54.03) is the R535 release whose _v3 query writes 32-byte entries; "r535"
(535.216.01, Debian 12 / Proxmox VE 8) writes 24 and has nvmlDeviceGetRunningProcessDetailList.
"""

import json
import os
import subprocess
import sys

import pytest

from modrun import run_module

DISCRETE = ("r440", "r470", "r525", "r535-early", "r535", "r550", "r580")
PROFILES = DISCRETE + ("gb10",)
# What each profile's library cannot give, as gpu_facts must list it in `unsupported`.
UNSUPPORTED = {
    # health: no RemappedRows before R450 nor fabric query before R525; pages are retired only before
    # Ampere (a V100), rows remapped from Ampere on; a GB10 has no ECC and (assumed) no row remapper.
    "r440": ["mig_mode", "remapped_rows", "fabric"],
    "r470": ["retired_pages", "fabric"],
    "r525": ["retired_pages"],
    "r535-early": ["retired_pages"],
    "r535": ["retired_pages"],
    "r550": ["retired_pages"],
    "r580": ["retired_pages"],
    "gb10": ["memory", "mig_mode", "remapped_rows", "retired_pages", "ecc"],
}
# The query and entry size the backend must choose (nvitop's rule, see _nvml.choose_process_query).
PROCESS_QUERY = {
    "r440": ("nvmlDeviceGetComputeRunningProcesses", 16),
    "r470": ("nvmlDeviceGetComputeRunningProcesses_v2", 24),
    "r525": ("nvmlDeviceGetComputeRunningProcesses_v3", 24),
    "r535-early": ("nvmlDeviceGetComputeRunningProcesses_v3", 32),
    "r535": ("nvmlDeviceGetComputeRunningProcesses_v3", 24),
    "r550": ("nvmlDeviceGetComputeRunningProcesses_v3", 24),
    "r580": ("nvmlDeviceGetComputeRunningProcesses_v3", 24),
    "gb10": ("nvmlDeviceGetComputeRunningProcesses_v3", 24),
}
MIB = {0: (1024, 2048, 3072), 1: (4096,)}


def _up(factory, profile):
    host = factory(driver=profile, gpus=1 if profile == "gb10" else 3)
    scenario = {}
    for gpu, sizes in MIB.items():
        if gpu >= len(host.status()["gpus"]):
            continue
        for mib in sizes:
            scenario[host.hold(gpus=[gpu], mib=mib)] = (gpu, mib)
    return host, scenario


def _facts(host, collection, **args):
    args.setdefault("device_files", [host.dir + "/dev/nvidia*"])
    return run_module(host, collection, "gpu_facts", args)


@pytest.mark.parametrize("profile", PROFILES)
def test_gpu_facts_reads_exactly_the_scenario(gpusim_factory, collection, profile):
    host, scenario = _up(gpusim_factory, profile)
    res = _facts(host, collection)
    assert not res.get("failed"), res.get("msg")
    facts = res["ansible_facts"]
    assert facts["gpu_driver"]["driver_version"] == host.status()["scenario"]["driver_version"]
    query = facts["gpu_driver"]["process_query"]
    assert (query["function"], query["entry_bytes"]) == PROCESS_QUERY[profile]
    reported = {}
    for gpu in facts["gpu_devices"]:
        assert gpu["health"]["status"] == "ok", gpu["health"]
        assert gpu["unsupported"] == UNSUPPORTED[profile], gpu["unsupported"]
        assert gpu["errors"] == [] and gpu["processes_error"] is None
        assert gpu["pci_bus_id"] is not None
        for p in gpu["processes"]:
            reported[p["pid"]] = (gpu["index"], p["used_mib"])
        expected_used = sum(mib for gpu_i, mib in scenario.values() if gpu_i == gpu["index"])
        if "memory" in UNSUPPORTED[profile]:
            assert gpu["memory"] == {"total": None, "used": None, "free": None, "reserved": None,
                                     "used_includes_reserved": None}
        else:
            assert gpu["memory"]["used"] == expected_used, gpu["memory"]
            # Before R510 there is no nvmlDeviceGetMemoryInfo_v2: v1, whose used includes the reserved memory.
            assert gpu["memory"]["used_includes_reserved"] is (profile in ("r440", "r470"))
        assert gpu["idle"] is (expected_used == 0), gpu["busy_reasons"]
    assert reported == scenario, f"{profile}: gpu_facts reported {reported}, the scenario holds {scenario}"
    if "mig_mode" in UNSUPPORTED[profile]:
        assert all(g["mig_mode"] is None for g in facts["gpu_devices"])


@pytest.mark.parametrize("profile", PROFILES)
def test_unknown_error_in_the_process_query_is_never_idle_and_blocks_the_release(gpusim_factory, collection, profile):
    host, scenario = _up(gpusim_factory, profile)
    holder = next(pid for pid, (gpu, _mib) in scenario.items() if gpu == 0)
    host.fault(unknown={0: ["processes"]})
    res = _facts(host, collection, gpus=["0"])
    gpu = res["ansible_facts"]["gpu_devices"][0]
    assert gpu["processes"] == [] and not gpu["idle"]
    assert gpu["processes_error"].startswith("processes could not be read: Unknown Error, 3 tries")
    assert gpu["processes_error"] in gpu["busy_reasons"]
    assert any(gpu["pci_bus_id"] in e and "RunningProcesses" in e for e in gpu["errors"]), gpu["errors"]
    assert any("processes could not be read" in w for w in _warnings(res)), res.get("warnings")
    # The release must not report "nothing to release" while a process holds the GPU.
    rel = run_module(host, collection, "gpu_release",
                     {"gpus": ["0"], "include_device_holders": False, "device_files": [host.dir + "/dev/nvidia*"]})
    assert rel.get("failed"), rel
    assert "could not be read" in rel["msg"] and "Nothing was signalled" in rel["msg"]
    assert rel["unreadable_gpus"] == [0]
    assert os.path.exists(f"/proc/{holder}")


def _warnings(res):
    out = []
    for w in res.get("warnings") or []:
        out.append(w if isinstance(w, str) else (w.get("event") or {}).get("msg", json.dumps(w)))
    return out


def _gpustat(host):
    gpustat = os.path.join(os.path.dirname(sys.executable), "gpustat")
    return subprocess.run([gpustat, "--json"], env=host.env(), capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("profile", PROFILES)
def test_gpustat_peer_check(gpusim_factory, collection, profile):
    """gpustat (a real NVML client) agrees with gpu_facts, except where its bindings misread the driver."""
    host, scenario = _up(gpusim_factory, profile)
    ours = _facts(host, collection)["ansible_facts"]["gpu_devices"]
    mine = {p["pid"] for g in ours for p in g["processes"]}
    assert mine == set(scenario)
    proc = _gpustat(host)
    if profile == "r440":
        # gpustat 1.1.1 falls back from _v3 to _v2 only; on a library with neither, the bindings raise
        # NVMLLibraryMismatchError, which gpustat does not catch: it fails where gpu_facts reads the host.
        assert proc.returncode != 0 and "pyNVML version does not match the NVML lib version" in proc.stderr, proc.stderr[-2000:]
        return
    assert proc.returncode == 0, proc.stderr
    peer = json.loads(proc.stdout)["gpus"]
    assert [g["uuid"] for g in ours] == [g["uuid"] for g in peer]
    theirs = {p["pid"] for g in peer for p in (g.get("processes") or [])}
    for mine_gpu, their_gpu in zip(ours, peer):
        if mine_gpu["memory"]["used"] is not None:
            assert mine_gpu["memory"]["used"] == their_gpu["memory.used"]
    if profile == "r535-early":
        # nvidia-ml-py reads 24-byte entries where early R535 drivers write 32: gpustat gets pid 0 and
        # 4294967295 for the second and third process, drops them (no such process) and misses two of
        # the three holders of GPU 0. The disagreement is what shows the profile is real.
        assert theirs < mine, f"gpustat read the early-R535 entries right: {sorted(theirs)}"
        assert len(mine - theirs) == 2, (sorted(mine), sorted(theirs))
    else:
        assert theirs == mine, f"{profile}: gpustat {sorted(theirs)}, gpu_facts {sorted(mine)}"


def test_the_profiles_table_tool_reads_every_scenario_exactly(tmp_path):
    """tools/driver_profiles.py (the table in docs/driver-branches.md) runs and finds gpu_facts exact."""
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, os.path.join(top, "tools", "driver_profiles.py"), "--profile", "r535-early",
                           "--profile", "gb10", "--json", str(out)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["profile"]: r for r in json.loads(out.read_text())}
    assert rows["r535-early"]["exact"] and rows["r535-early"]["query"]["entry_bytes"] == 32
    # what the bindings' own wrapper gives on early R535: the second and third entries are garbage
    assert [p for p, _mib in rows["r535-early"]["bindings_wrapper"]["0"]][1:] == [0, 4294967295]
    assert rows["gb10"]["unsupported"] == ["ecc", "memory", "mig_mode", "remapped_rows", "retired_pages"]
    assert rows["gb10"]["memory_used"] == [None]
