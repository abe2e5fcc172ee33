"""The modules' results say each GPU holder once (issue 20): their size grows with the GPUs plus the processes,
not with GPUs x processes x files, so a large host's result still fits in an AWX event (ansible-runner drops
any event over 700,000 characters; benchmarks/bench_output.py measures 8 to 64 GPUs).

A 16-GPU host with a server of 16 workers (each opens every /dev/nvidiaN, as CUDA does, and has a context on
its own GPU) in CT 7600, and 20 other processes: NVML-only clients and CUDA clients holding every node with
no context on the host, and in CT 7600 a few of each.
"""

import json
import os

from modrun import run_module

VMID = 7600
GPUS = 16
OTHERS = 20
# What one GPU's entry may take besides its holders' pids (its fields: ids, memory, health, fit, its
# processes with their details), what one process's details may take besides its files and GPUs, and what
# one reference to a pid may take (its digits and a separator; a GPU names a holder in holders and in
# lingering or blockers).
PER_GPU = 4000
PER_PROCESS = 1500
PER_FILE_OR_GPU = 24
PER_REF = 2 * 10


def bound(gpus: int, processes: int, dev_dir: str) -> int:
    """The most a result of ``gpus`` GPUs and ``processes`` holders may take when each holder is said once:
    linear in each (plus one pid per GPU and holder), where the snapshot's form takes GPUs x processes x files."""
    files = gpus + 2  # every GPU's node, nvidiactl, nvidia-uvm
    per_process = PER_PROCESS + len(dev_dir) + files * PER_FILE_OR_GPU + gpus * PER_FILE_OR_GPU
    return gpus * PER_GPU + processes * per_process + gpus * processes * PER_REF


def start(host):
    host.ct_create(VMID, hostname="out-size")
    host.ct_start(VMID)
    api = host.hold(gpus="all", mib=20480, ct=VMID, tree=True, name="sglang-server")
    for index in range(OTHERS):
        where = {"ct": VMID} if index % 4 == 3 else {}
        if index % 2:
            host.hold("all", device_only=True, name="cuda-client", **where)
        else:
            host.hold(None, control_only=True, name="nvml-agent", **where)
    return api


def check(result, gpu_keys, details_key, dev_dir):
    text = json.dumps(result)
    details = result[details_key]
    named = {pid for key in gpu_keys for g in result[key] for pids in g["holders"].values() for pid in pids}
    # Each pid once in the holders' details, every named pid there; the details are nowhere else.
    assert {int(k) for k in details} == named, sorted(named ^ {int(k) for k in details})
    assert text.count('"files"') == len(details)
    assert all(set(d["files"]) <= {dev_dir} for d in details.values()), "files are keyed by their directory"
    # The server (API + a worker per GPU) and the others all hold the GPUs: 1 + GPUS + OTHERS.
    assert len(details) >= 1 + GPUS + OTHERS
    limit = bound(GPUS, len(details), dev_dir) * (len(gpu_keys))
    assert len(text) < limit, (len(text), limit)
    return len(text)


def test_each_holder_once_and_the_size_linear(gpusim_factory, collection):
    host = gpusim_factory(gpus=GPUS)
    api = start(host)
    dev_dir = host.path("dev")
    devices = {"device_files": [os.path.join(dev_dir, "nvidia*")]}

    facts = run_module(host, collection, "gpu_facts", devices)
    assert not facts.get("failed"), facts.get("msg")
    check(facts["ansible_facts"], ("gpu_devices",), "gpu_holder_processes", dev_dir)
    workers = [p["pid"] for g in facts["ansible_facts"]["gpu_devices"] for p in g["processes"]]
    assert len(workers) == GPUS
    details = facts["ansible_facts"]["gpu_holder_processes"]
    # A worker holds every GPU's node: named on each GPU, its context on its own, said once with all 16 GPUs.
    g0 = facts["ansible_facts"]["gpu_devices"][0]
    assert workers[0] in g0["holders"]["context"] and set(workers[1:]) <= set(g0["holders"]["lingering"])
    assert details[str(workers[1])]["gpus"] == list(range(GPUS))
    assert details[str(api)]["container"]["id"] == VMID

    release = run_module(host, collection, "gpu_release", dict(devices, containers=[VMID]), check_mode=True)
    assert not release.get("failed") and release["changed"], release.get("msg")
    check(release, ("gpus_before", "gpus"), "holder_processes", dev_dir)
    assert {r["pid"] for r in release["released"]} >= set(workers) | {api}
