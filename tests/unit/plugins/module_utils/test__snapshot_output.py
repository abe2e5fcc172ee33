# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The results' form (_snapshot.compact_result / expand_gpus): each holder once, the snapshot's form back."""

from __future__ import annotations

import copy
import json

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils._snapshot import (
    build,
    compact_facts,
    compact_result,
    expand_gpus,
    files_by_dir,
    gpu_record,
    files_from_dirs,
)

DEV = "/dev"


def host(gpus, workers=True, cuda=0, nvml=0, ct_jobs=0):
    """A snapshot (_snapshot.build) of ``gpus`` GPUs: a server (API pid 1000 with nvidiactl, one worker per GPU
    holding every node with a context on its own GPU), ``cuda`` CUDA clients holding every node with no context,
    ``nvml`` NVML clients (nvidiactl, nvidia-uvm) and ``ct_jobs`` jobs in CT 129, each with a context on one GPU."""
    every = [f"{DEV}/nvidia{i}" for i in range(gpus)] + [f"{DEV}/nvidiactl", f"{DEV}/nvidia-uvm"]
    raw = {"driver": {"backend": "nvml"}, "gpus": [
        {"index": i, "minor_number": i, "uuid": f"GPU-{i:08d}", "memory": {"used": 0, "total": 143771},
         "health": {"status": "ok"}, "processes": []} for i in range(gpus)]}
    procs, holders = {}, {}

    def add(pid, name, files, container=None, ppid=1):
        procs[pid] = {"pid": pid, "name": name, "cmdline": f"{name} --serve {pid}", "user": "root", "uid": 0, "ppid": ppid,
                      "start_time": pid * 10, "container": container, "unit": None}
        holders[pid] = list(files)

    if workers:
        add(1000, "api", [f"{DEV}/nvidiactl"])
        for i in range(gpus):
            add(1001 + i, "worker", every, ppid=1000)
            raw["gpus"][i]["processes"].append({"pid": 1001 + i, "types": ["compute"], "used_mib": 40960})
            raw["gpus"][i]["memory"]["used"] += 40960
    for k in range(cuda):
        add(3000 + k, "cuda-client", every)
    for k in range(nvml):
        add(4000 + k, "dcgm-agent", [f"{DEV}/nvidiactl", f"{DEV}/nvidia-uvm"])
    for k in range(ct_jobs):
        i = k % gpus
        add(5000 + k, "ct-job", [f"{DEV}/nvidia{i}", f"{DEV}/nvidiactl"], container={"kind": "lxc", "id": 129})
        raw["gpus"][i]["processes"].append({"pid": 5000 + k, "types": ["compute"], "used_mib": 512})
        raw["gpus"][i]["memory"]["used"] += 512
    return build(raw, read_process=procs.get, holders=holders)["gpus"]


def pids_of(gpu):
    return sorted(p for pids in gpu["holders"].values() for p in pids)


CASES = [
    # (name, the host, the pids that hold some GPU)
    ("nothing holds the GPUs", dict(gpus=4, workers=False), 0),
    ("a server: API + one worker per GPU", dict(gpus=8), 1 + 8),
    ("server, CUDA and NVML clients", dict(gpus=8, cuda=3, nvml=4), 1 + 8 + 3 + 4),
    ("container jobs", dict(gpus=4, ct_jobs=6, nvml=1), 1 + 4 + 6 + 1),
    ("one GPU", dict(gpus=1, cuda=1, nvml=1), 1 + 1 + 1 + 1),
]


@pytest.mark.parametrize("name, kwargs, count", CASES, ids=[c[0] for c in CASES])
def test_round_trip_and_each_pid_once(name, kwargs, count):
    gpus = host(**kwargs)
    kept = copy.deepcopy(gpus)
    result = compact_result({"changed": False, "gpus_before": gpus, "gpus": gpus})
    assert gpus == kept, "the snapshot the module still uses must not change"
    details = result["holder_processes"]
    assert len(details) == count and sorted(details) == sorted(details, key=int)
    # each pid once in the details, and every pid a GPU names has them
    named = {p for key in ("gpus_before", "gpus") for g in result[key] for p in pids_of(g)}
    assert named == {int(k) for k in details}
    # a holder's details are said once; the driver's processes (its contexts) keep theirs on their GPU, in the
    # snapshot (gpus) only: the GPUs before are records
    text = json.dumps(result)
    contexts = {p["pid"] for g in gpus for p in g["processes"]}
    for pid in details:
        shown = text.count(f'"cmdline": "{details[pid]["name"]} --serve {pid}"')
        assert shown == 1 + sum(1 for g in gpus for p in g["processes"] if p["pid"] == int(pid)), pid
        assert (int(pid) in contexts) == (shown > 1)
    assert text.count('"files"') == len(details)
    # a GPU's holders are pids by evidence; the details say on which GPUs
    for g in result["gpus"]:
        assert set(g["holders"]) == {"context", "device", "control", "lingering"} and "lingering" not in g
        for evidence, pids in g["holders"].items():
            for pid in pids:
                assert (g["index"] in details[str(pid)]["gpus"]) == (evidence != "control"), (evidence, pid)
    # the snapshot's form back, exactly, through JSON as a result travels
    back = json.loads(json.dumps(result))
    assert expand_gpus(back["gpus"], back["holder_processes"]) == kept
    # the GPUs before: what a table and a diff read of each - its memory, verdict and blockers, counts of the rest
    for record, g in zip(back["gpus_before"], kept):
        assert {k: record[k] for k in ("index", "uuid", "idle", "blockers")} == {
            k: g[k] for k in ("index", "uuid", "idle", "blockers")}
        assert record["busy_reasons"] == ([] if g["blockers"] else g["busy_reasons"])
        assert record["memory"] == {"used": g["memory"]["used"], "total": g["memory"]["total"]}
        assert record["process_count"] == len(g["processes"]) and record["holder_count"] == len(g["holders"])
        assert {p["pid"] for p in record["processes"]} | set(pids_of(record)) == set(g["blockers"])
        assert all("cmdline" not in p for p in record["processes"])
    assert compact_result(back) == back  # twice changes nothing


@pytest.mark.parametrize("name, kwargs, count", CASES, ids=[c[0] for c in CASES])
def test_the_gpus_before_are_records_a_table_reads(name, kwargs, count):
    """A result's GPUs before name only their blockers (table and diff), so the snapshot is in the result once: with
    other processes on a host of several GPUs (CUDA and NVML clients), the records take a fraction of its size."""
    del name, count
    gpus = host(**kwargs)
    result = compact_result({"gpus_before": gpus, "gpus": gpus})
    records, snapshot = len(json.dumps(result["gpus_before"])), len(json.dumps(result["gpus"]))
    assert records < snapshot / (2 if kwargs.get("cuda") and kwargs["gpus"] > 1 else 1), (records, snapshot)
    assert gpu_record(result["gpus_before"][0]) == result["gpus_before"][0]
    # the table's before: its blockers with their details, through the result's holder_processes
    for g in expand_gpus(result["gpus_before"], result["holder_processes"]):
        assert {h["pid"] for h in g["holders"]} <= set(g["blockers"])
        assert all(h["name"] for h in g["holders"])


def test_twice_changes_nothing_and_facts_use_their_own_keys():
    gpus = host(4, cuda=1, nvml=1)
    once = compact_result({"gpus": gpus})
    assert compact_result(once) == once
    facts = compact_facts({"gpu_count": 4, "gpu_devices": gpus, "gpu_driver": {}})
    assert set(facts["gpu_holder_processes"]) == set(once["holder_processes"])
    assert facts["gpu_devices"] == once["gpus"] and "holder_processes" not in facts


@pytest.mark.parametrize("result", [
    {"failed": True, "msg": "no GPU"},                    # a failure before any snapshot: nothing added
    {"changed": False, "gpus": None, "gpus_before": None},  # a last look that failed
], ids=["no snapshot", "null lists"])
def test_results_without_gpus_are_left_alone(result):
    assert compact_result(result) == result


def test_a_pid_in_both_looks_is_once_with_the_gpus_of_both():
    before = host(2, cuda=1)
    after = [dict(g, holders=[h for h in g["holders"] if h["pid"] == 1001 and g["index"] == 1]) for g in before]
    result = compact_result({"gpus_before": before, "gpus": after})
    # its context on GPU 0 before (a blocker there), GPU 1's node after
    assert result["holder_processes"]["1001"]["gpus"] == [0, 1]
    assert result["gpus"][0]["holders"] == {"context": [], "device": [], "control": [], "lingering": []}
    # a worker's node of another GPU keeps no GPU busy: a lingering device holder
    assert result["gpus"][1]["holders"]["lingering"] == [1001] and result["gpus"][1]["holders"]["device"] == []
    # a CUDA client beside a server blocks nothing: the GPUs before (records of their blockers) do not name it
    assert "3000" not in result["holder_processes"]


def test_expand_without_details_and_old_form():
    gpus = host(2, nvml=1)
    compact = compact_result({"gpus": gpus})["gpus"]
    bare = expand_gpus(compact)  # a filter given no holder_processes: pid and evidence
    assert [(h["pid"], h["evidence"], h["name"]) for h in bare[0]["holders"]] == [
        (1000, "control", None), (1001, "context", None), (1002, "device", None), (4000, "control", None)]
    assert expand_gpus(gpus) == gpus  # the snapshot's own form passes through


@pytest.mark.parametrize("files, by_dir", [
    (["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"], {"/dev": ["nvidia-uvm", "nvidia0", "nvidiactl"]}),
    (["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidiactl"], {"/dev/nvidia-caps": ["nvidia-cap1"], "/dev": ["nvidiactl"]}),
    ([], {}),
    (None, None),
])
def test_files_by_dir(files, by_dir):
    assert files_by_dir(files) == by_dir
    assert files_from_dirs(by_dir) == files


def size(gpus, workers, others):
    gpus_list = host(gpus, cuda=others // 2, nvml=others - others // 2)
    result = compact_result({"gpus_before": gpus_list, "gpus": gpus_list})
    return len(json.dumps(result)), len(json.dumps({"gpus_before": gpus_list, "gpus": gpus_list}))


def test_sizes_grow_linearly_not_as_gpus_times_processes():
    """Double the GPUs (and so the workers) and the other processes: the compact result about doubles, where the
    snapshot's form grows about 4 times (GPUs x processes) and more (each holder's files grow with the GPUs too)."""
    small, small_full = size(8, 8, 20)
    large, large_full = size(16, 16, 40)
    larger, larger_full = size(32, 32, 80)
    assert large / small < 3.0 and larger / large < 3.0, (small, large, larger)
    assert large_full / small_full > 4 and larger_full / large_full > 4, (small_full, large_full, larger_full)
    assert larger < larger_full / 10
