# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations
import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._holding import verdict
from ansible_collections.gpuops.gpu.plugins.module_utils._snapshot import build, is_protected, visibility_warnings

PROTECT_CASES = [
    ("pid 1", {"pid": 1, "name": "systemd", "cmdline": "/sbin/init"}, (), "PID 1"),
    ("kernel thread", {"pid": 50, "name": "kworker/0:1", "cmdline": "", "kernel_thread": True}, (), "kernel thread"),
    ("persistenced by comm", {"pid": 900, "name": "nvidia-persiste", "cmdline": "/usr/bin/nvidia-persistenced --user x"}, (), "nvidia-persistenced"),
    ("fabric manager", {"pid": 901, "name": "nv-fabricmanager", "cmdline": "nv-fabricmanager -c x"}, (), "nv-fabricmanager"),
    ("dcgm exporter", {"pid": 902, "name": "dcgm-exporter", "cmdline": "dcgm-exporter"}, (), "dcgm-exporter"),
    ("inference server", {"pid": 903, "name": "python3", "cmdline": "python3 -m sglang.launch_server"}, (), ""),
    ("user protect by name", {"pid": 904, "name": "jupyter", "cmdline": "jupyter lab"}, ("jupyter",), "protect option"),
    ("user protect by regex on cmdline", {"pid": 905, "name": "python3", "cmdline": "python3 train.py --keep"}, (r"train\.py",), "protect option"),
    ("user protect does not match", {"pid": 906, "name": "python3", "cmdline": "python3 serve.py"}, (r"train\.py",), ""),
]


@pytest.mark.parametrize("name, proc, extra, phrase", PROTECT_CASES, ids=[c[0] for c in PROTECT_CASES])
def test_is_protected(name, proc, extra, phrase):
    reason = is_protected(proc, _validate.regexes("protect", extra))
    assert (phrase in reason) if phrase else reason == ""


def _gpu(**kw):
    gpu = {"index": 3, "health": {"status": "ok", "detail": None}, "memory": {"used": 0}, "utilization": {"gpu": 0},
           "processes": [], "holders": []}
    gpu.update(kw)
    return gpu


CT_PROC = {"pid": 8812, "name": "python3", "used_mib": 41984, "visible": True, "container": {"kind": "lxc", "id": 129}}
IDLE_CASES = [
    ("idle", _gpu(), {}, True, []),
    ("a few MiB of driver bookkeeping is idle", _gpu(memory={"used": 5}), {}, True, []),
    ("exactly the threshold is idle", _gpu(memory={"used": 64}), {}, True, []),
    ("above the threshold", _gpu(memory={"used": 65}), {}, False, ["65 MiB used by processes not visible"]),
    ("visible process in a container", _gpu(processes=[CT_PROC], memory={"used": 41984}), {}, False,
     ["used by pid 8812 (python3) in CT 129, 41 GiB"]),
    ("invisible process", _gpu(processes=[{"pid": 4242, "visible": False}]), {}, False, ["does not exist from here"]),
    ("device holder, memory unaccounted", _gpu(memory={"used": 2048}, holders=[
        {"pid": 77, "name": "python3", "files": ["/dev/nvidia3"], "protected": None, "evidence": "device"}]),
     {}, False, ["device file held by pid 77 (python3) (/dev/nvidia3), and the driver's list may be incomplete",
                 "2048 MiB used by processes not visible"]),
    ("device holder, complete list at baseline: lingering", _gpu(holders=[
        {"pid": 77, "name": "python3", "files": ["/dev/nvidia3"], "protected": None, "evidence": "device"}]),
     {}, True, []),
    ("holders ignored when asked", _gpu(memory={"used": 30}, processes_error="processes could not be read: x", holders=[
        {"pid": 77, "name": "python3", "files": ["/dev/nvidia3"], "protected": None, "evidence": "device"}]),
     {"include_device_holders": False}, False, ["processes could not be read: x"]),
    ("holder of nvidiactl only: no context on this GPU", _gpu(memory={"used": 2048}, holders=[
        {"pid": 78, "name": "python3", "files": ["/dev/nvidiactl"], "protected": None, "evidence": "control"}]),
     {}, False, ["2048 MiB used by processes not visible"]),
    ("protected device holder, list unreadable", _gpu(processes_error="processes could not be read: x", holders=[
        {"pid": 5, "name": "nvidia-persistenced", "files": ["/dev/nvidia3"], "protected": "NVIDIA daemon",
         "evidence": "device"}]), {}, False, ["processes could not be read: x"]),
    ("lost", _gpu(health={"status": "lost", "detail": "GPU is lost"}), {}, False, ["health lost: GPU is lost"]),
    ("utilization not checked by default", _gpu(utilization={"gpu": 100}), {}, True, []),
    ("utilization above the limit", _gpu(utilization={"gpu": 30}), {"max_utilization_pct": 10}, False, ["utilization 30%"]),
    ("memory unknown is not a reason", _gpu(memory={"used": None}), {}, True, []),
]


@pytest.mark.parametrize("name, gpu, kwargs, idle, phrases", IDLE_CASES, ids=[c[0] for c in IDLE_CASES])
def test_idle_verdict(name, gpu, kwargs, idle, phrases):
    kwargs.setdefault("max_memory_used_mib", 64)
    got_idle, reasons, _blockers, _lingering = verdict(gpu, **kwargs)
    assert got_idle is idle
    assert len(reasons) == len(phrases), reasons
    for phrase, reason in zip(phrases, reasons):
        assert phrase in reason


def test_build_attributes_processes_and_holders():
    raw = {"driver": {"backend": "nvml"}, "gpus": [
        {"index": 0, "minor_number": 0, "memory": {"used": 81920}, "health": {"status": "ok"},
         "processes": [{"pid": 100, "types": ["compute"], "used_mib": 81920}, {"pid": 555, "types": ["compute", "graphics"], "used_mib": None}]},
        {"index": 1, "minor_number": 1, "memory": {"used": 0}, "health": {"status": "ok"}, "processes": []},
    ]}
    procs = {
        100: {"pid": 100, "name": "python3", "cmdline": "python3 -m sglang", "user": "root", "uid": 0, "ppid": 99,
              "start_time": 1, "container": {"kind": "lxc", "id": 129, "pid_in_container": 45}},
        200: {"pid": 200, "name": "nvidia-persistenced", "cmdline": "nvidia-persistenced", "user": "root", "uid": 0,
              "ppid": 1, "start_time": 2, "container": None},
        300: {"pid": 300, "name": "python3", "cmdline": "python3 loader.py", "user": "ml", "uid": 1000, "ppid": 100,
              "start_time": 3, "container": None},
    }
    holders = {200: ["/dev/nvidiactl"], 300: ["/dev/nvidia1", "/dev/nvidiactl"]}
    snap = build(raw, read_process=procs.get, holders=holders)
    g0, g1 = snap["gpus"]
    assert g0["processes"][0]["container"] == {"kind": "lxc", "id": 129, "pid_in_container": 45}
    assert g0["processes"][0]["visible"] is True and g0["processes"][0]["type"] == "compute"
    assert g0["processes"][1]["visible"] is False and g0["processes"][1]["type"] == "compute+graphics"
    # nvidiactl alone is a control node, held on every GPU; pid 300 holds nvidia1: a device holder of GPU 1 only
    assert [(h["pid"], h["files"], bool(h["protected"]), h["evidence"]) for h in g0["holders"]] == [
        (200, ["/dev/nvidiactl"], True, "control")]
    assert [(h["pid"], h["files"], h["evidence"]) for h in g1["holders"]] == [
        (200, ["/dev/nvidiactl"], "control"), (300, ["/dev/nvidia1", "/dev/nvidiactl"], "device")]
    assert g0["idle"] is False and g0["blockers"] == [100, 555]
    # GPU 1: the driver's list is complete and the memory at baseline: pid 300 lingers, it does not block
    assert g1["idle"] is True and g1["lingering"] == [300] and g1["blockers"] == []


@pytest.mark.parametrize("host_namespace, named", [(True, True), (False, False), (None, False)])
def test_a_driver_pid_that_names_another_process_here_is_not_named(host_namespace, named):
    # A driver that reports host pids, read from a container: pid 100 is the GPU job's host pid, and here an unrelated
    # `sleep` that holds no NVIDIA node. Only in the host's PID namespace is the driver's pid this namespace's.
    raw = {"driver": {}, "gpus": [{"index": 0, "minor_number": 0, "memory": {"used": 4096}, "health": {"status": "ok"},
                                   "processes": [{"pid": 100, "types": ["compute"], "used_mib": 4096},
                                                 {"pid": 101, "types": ["compute"], "used_mib": 0}]}]}
    procs = {100: {"pid": 100, "name": "sleep", "cmdline": "sleep 120", "user": "root", "uid": 0, "ppid": 1,
                   "start_time": 1, "container": None},
             101: {"pid": 101, "name": "python3", "cmdline": "python3 job.py", "user": "root", "uid": 0, "ppid": 1,
                   "start_time": 2, "container": None}}
    snap = build(raw, read_process=procs.get, holders={101: ["/dev/nvidia0", "/dev/nvidiactl"]},
                 host_namespace=host_namespace)
    (gpu,) = snap["gpus"]
    first, second = gpu["processes"]
    assert (first["name"] == "sleep") is named and first["visible"] is named
    assert second["name"] == "python3" and second["visible"] is True  # it holds /dev/nvidia0: it is the driver's
    if not named:
        assert "cannot be confirmed" in first["unverified"] and first["cmdline"] is None
        assert "used by pid 100: the driver reports pid 100 on GPU 0, but from this PID namespace" in gpu["busy_reasons"][0]
        (said,) = [w for w in visibility_warnings(snap["gpus"]) if "pid 100" in w]
        assert "sleep" not in said and "run on the host" in said


def test_build_without_minor_numbers_counts_nvidiaN_for_every_gpu():
    # nvidia-smi without its XML report cannot tie /dev/nvidia1 to a GPU: never call a GPU idle then
    raw = {"driver": {}, "gpus": [{"index": i, "minor_number": None, "memory": {"used": 0}, "health": {"status": "ok"},
                                   "processes": []} for i in range(2)]}
    procs = {300: {"pid": 300, "name": "python3", "cmdline": "python3", "user": "ml", "uid": 1000, "ppid": 1,
                   "start_time": 3, "container": None}}
    raw["gpus"][1]["processes_error"] = "processes could not be read: Unknown Error, 3 tries"
    snap = build(raw, read_process=procs.get, holders={300: ["/dev/nvidia1"]})
    assert [[(h["pid"], h["evidence"]) for h in g["holders"]] for g in snap["gpus"]] == [[(300, "device")], [(300, "device")]]
    assert snap["gpus"][0]["idle"] and snap["gpus"][0]["lingering"] == [300]
    assert not snap["gpus"][1]["idle"] and snap["gpus"][1]["blockers"] == [300]


# --- a process list that could not be read --------------------------------------------------

UNREADABLE_CASES = [
    ("query failed, memory at baseline", {"processes_error": "processes could not be read: Unknown Error, 3 tries"},
     ["processes could not be read: Unknown Error, 3 tries"]),
    ("query failed, memory in use", {"processes_error": "processes could not be read: Unknown Error, 3 tries",
                                     "memory": {"used": 1024}},
     ["processes could not be read: Unknown Error, 3 tries", "1024 MiB used"]),
    ("read fine, nothing there", {"processes_error": None}, []),
]


@pytest.mark.parametrize("name, fields, reasons", UNREADABLE_CASES, ids=[c[0] for c in UNREADABLE_CASES])
def test_unreadable_process_list_is_never_idle(name, fields, reasons):
    gpu = {"index": 3, "health": {"status": "ok", "detail": None}, "memory": {"used": 0}, "utilization": {"gpu": 0},
           "processes": [], "holders": []}
    gpu.update(fields)
    idle, why, _blockers, _lingering = verdict(gpu, 64)
    assert idle is (not reasons)
    assert why == reasons


def test_read_warnings_group_gpus_with_one_cause():
    from ansible_collections.gpuops.gpu.plugins.module_utils._snapshot import read_warnings

    err = "processes could not be read: Unknown Error, 3 tries (nvmlDeviceGetComputeRunningProcesses_v3)"
    gpus = [
        {"index": 1, "pci_bus_id": "00000000:2A:00.0", "processes_error": err,
         "errors": [f"GPU 1 (00000000:2A:00.0): {err}"]},
        {"index": 3, "pci_bus_id": "00000000:5D:00.0", "processes_error": err,
         "errors": [f"GPU 3 (00000000:5D:00.0): {err}",
                    "GPU 3 (00000000:5D:00.0): nvmlDeviceGetTemperature: Unknown Error, 3 tries"]},
        {"index": 4, "pci_bus_id": "00000000:9A:00.0", "processes_error": None, "errors": []},
    ]
    warnings = read_warnings(gpus)
    assert len(warnings) == 2
    assert warnings[0].startswith("GPU 1 (00000000:2A:00.0), GPU 3 (00000000:5D:00.0): " + err)
    assert warnings[1] == "GPU 3 (00000000:5D:00.0): nvmlDeviceGetTemperature: Unknown Error, 3 tries"
