"""MIG (issue 27, item 1): a MIG host read per MIG device by every module, on the simulator (tests/gpusim/README.md
"MIG"): the facts list the MIG devices with their UUIDs, memory, processes and device nodes."""

import json
import sys

import pytest
from modrun import alive, run_module


def devices(host):
    return [host.dir + "/dev/nvidia*"]


def facts(host, collection, **args):
    args.setdefault("device_files", devices(host))
    res = run_module(host, collection, "gpu_facts", args)
    assert not res.get("failed"), res.get("msg")
    return res["ansible_facts"]["gpu_devices"], res["ansible_facts"]


def mig_host(factory, gpus=2):
    host = factory(gpus=gpus)
    devs = host.set_mig(0, ["3g.71gb", "2g.35gb", "1g.18gb"])
    return host, devs


def test_facts_list_mig_devices_with_uuid_memory_processes_and_nodes(gpusim_factory, collection):
    host, devs = mig_host(gpusim_factory)
    a = host.hold(devs[0]["uuid"], mib=4096, name="python3 train_a.py")
    c = host.hold((0, devs[2]["gi"], devs[2]["ci"]), mib=1024, name="python3 train_c.py")
    gpus, _facts = facts(host, collection)
    g0, g1 = gpus
    assert g0["mig_mode"] is True and g0["mig_mode_pending"] is True and g1["mig_mode"] is False
    assert g1["mig_devices"] == []
    got = {d["uuid"]: d for d in g0["mig_devices"]}
    assert list(got) == [d["uuid"] for d in devs]
    for d in devs:
        m = got[d["uuid"]]
        assert (m["gpu_instance_id"], m["compute_instance_id"], m["profile"], m["gpu"]) == (d["gi"], d["ci"], d["profile"], 0)
        assert m["memory"]["total"] == d["memory_mib"]
        assert m["device_nodes"] == [f"/dev/nvidia-caps/nvidia-cap{d['gi_cap']}", f"/dev/nvidia-caps/nvidia-cap{d['ci_cap']}"]
    assert got[devs[0]["uuid"]]["processes"] == [a] and got[devs[0]["uuid"]]["memory"]["used"] == 4096
    assert got[devs[2]["uuid"]]["processes"] == [c]
    assert got[devs[1]["uuid"]]["processes"] == [] and got[devs[1]["uuid"]]["idle"] is True
    assert got[devs[0]["uuid"]]["idle"] is False
    # the GPU's processes say which MIG device each is on; its holders, which MIG devices' nodes they hold
    procs = {p["pid"]: p for p in g0["processes"]}
    assert procs[a]["mig_device"] == devs[0]["uuid"] and procs[c]["mig_device"] == devs[2]["uuid"]
    assert got[devs[0]["uuid"]]["holders"] == [a] and got[devs[2]["uuid"]]["holders"] == [c]


def test_a_mig_mode_change_pending_a_reset_is_a_health_finding(gpusim_factory, collection):
    host = gpusim_factory(gpus=2)
    host.set_mig(1, current=0, pending=1)
    gpus, _facts = facts(host, collection)
    assert gpus[0]["health"]["checks"] == []
    (check,) = [c for c in gpus[1]["health"]["checks"] if c["check"] == "mig_mode_pending"]
    assert "reset" in check["detail"] and "reboot" in check["detail"], check
    assert "nvidia-smi -r -i 1" in check["action"] and check["blocking"] is False
    gpus, _facts = facts(host, collection, health_checks=["mig_mode_pending"])
    assert gpus[1]["health"]["checks"][0]["blocking"] is True and gpus[1]["idle"] is False
    assert gpus[0]["idle"] is True


def release(host, collection, **args):
    args.setdefault("device_files", devices(host))
    args.setdefault("grace_period", 5)
    return run_module(host, collection, "gpu_release", args)


def wait(host, collection, **args):
    args.setdefault("device_files", devices(host))
    args.update(timeout=args.get("timeout", 2), settle=0, sleep=0.2)
    return run_module(host, collection, "gpu_wait_idle", args)


def test_the_release_of_a_mig_device_stops_its_work_only(gpusim_factory, collection):
    host, devs = mig_host(gpusim_factory)
    a = host.hold(devs[0]["uuid"], mib=4096, name="python3 a.py")
    b = host.hold(devs[1]["uuid"], mib=2048, name="python3 b.py")
    other = host.hold(1, mib=1024, name="python3 other.py")
    res = release(host, collection, gpus=[devs[0]["uuid"]])
    assert not res.get("failed"), res.get("msg")
    assert [r["pid"] for r in res["released"]] == [a], res["released"]
    assert not alive(a) and alive(b) and alive(other)
    assert res["gpus_before"][0]["mig_selected"] == [devs[0]["uuid"]]
    # the wait on that MIG device is ready although its neighbour is busy; on the neighbour it is not
    ok = wait(host, collection, gpus=[devs[0]["uuid"]])
    assert not ok.get("failed"), ok.get("msg")
    busy = wait(host, collection, gpus=[devs[1]["uuid"]])
    assert busy.get("failed") and f"pid {b}" in busy["msg"], busy.get("msg")


def test_a_gpu_index_means_all_its_mig_devices(gpusim_factory, collection):
    host, devs = mig_host(gpusim_factory)
    a = host.hold(devs[0]["uuid"], mib=4096, name="python3 a.py")
    b = host.hold(devs[2]["uuid"], mib=1024, name="python3 b.py")
    other = host.hold(1, mib=1024, name="python3 other.py")
    busy = wait(host, collection, gpus=["0"], timeout=1)
    assert busy.get("failed") and f"pid {a}" in busy["msg"] and f"pid {b}" in busy["msg"], busy.get("msg")
    res = release(host, collection, gpus=["0"])
    assert not res.get("failed"), res.get("msg")
    assert sorted(r["pid"] for r in res["released"]) == sorted([a, b]), res["released"]
    assert alive(other) and not alive(a) and not alive(b)
    ok = wait(host, collection, gpus=["0"])
    assert not ok.get("failed"), ok.get("msg")


def test_an_unknown_mig_uuid_names_the_mig_devices(gpusim_factory, collection):
    host, devs = mig_host(gpusim_factory)
    res = release(host, collection, gpus=["MIG-00000000-0000-0000-0000-000000000000"])
    assert res.get("failed") and devs[0]["uuid"] in res["msg"], res.get("msg")


def test_a_container_passing_capability_nodes_maps_to_its_mig_devices(gpusim_factory, collection):
    host, devs = mig_host(gpusim_factory)
    vmid = 4277
    host.ct_create(vmid, "mig-ct", None, devices_style="none")
    b = devs[1]
    with open(host.ct_config_path(vmid), "a", encoding="utf-8") as f:
        f.write("lxc.cgroup2.devices.allow: c 195:* rwm\n"
                "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
                "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file\n"
                f"dev0: /dev/nvidia-caps/nvidia-cap{b['gi_cap']}\n"
                f"lxc.mount.entry: /dev/nvidia-caps/nvidia-cap{b['ci_cap']} dev/nvidia-caps/nvidia-cap{b['ci_cap']}"
                " none bind,optional,create=file\n"
                "dev1: /dev/nvidia-caps/nvidia-cap999\n")
    res = run_module(host, collection, "proxmox_gpu_containers", {"pct": host.path("bin", "pct"), "containers": [vmid]})
    assert not res.get("failed"), res.get("msg")
    (row,) = res["containers"]
    assert row["gpus"] == [0] and row["mig_devices"] == [b["uuid"]], row
    assert "nvidia-cap999" in json.dumps(res.get("warnings")), res.get("warnings")


def test_the_nvidia_smi_backend_reads_mig_devices_too(gpusim_factory, collection):
    host, devs = mig_host(gpusim_factory)
    a = host.hold(devs[0]["uuid"], mib=4096, name="python3 a.py")
    host.set_mig(1, current=0, pending=1)
    gpus, _facts = facts(host, collection, backend="nvidia-smi", nvidia_smi_path=host.path("bin", "nvidia-smi"))
    g0 = gpus[0]
    # --query-gpu asks mig.mode.pending of every GPU: GPU 1, not in MIG mode, turns MIG on at its next reset (it was
    # null: only -q -x was read, for the GPUs in MIG mode), and the health check says so as with NVML
    assert gpus[1]["mig_mode_pending"] is True and g0["mig_mode_pending"] is True
    assert [c["check"] for c in gpus[1]["health"]["checks"]] == ["mig_mode_pending"], gpus[1]["health"]
    got = [(d["uuid"], d["gpu_instance_id"], d["compute_instance_id"], d["profile"], d["memory"]["total"], d["processes"])
           for d in g0["mig_devices"]]
    assert got == [(d["uuid"], d["gi"], d["ci"], d["profile"], d["memory_mib"], [a] if d is devs[0] else []) for d in devs]
    assert g0["mig_devices"][0]["memory"]["used"] == 4096
    assert g0["mig_devices"][1]["device_nodes"] == [f"/dev/nvidia-caps/nvidia-cap{devs[1]['gi_cap']}",
                                                    f"/dev/nvidia-caps/nvidia-cap{devs[1]['ci_cap']}"]


def test_fit_reads_the_selected_mig_device(gpusim_factory, collection):
    host, devs = mig_host(gpusim_factory)
    small = devs[2]  # 1g.18gb
    gpus, _facts = facts(host, collection, gpus=[small["uuid"]], min_free_mib=small["memory_mib"] + 1)
    (g0,) = gpus
    assert g0["mig_selected"] == [small["uuid"]] and [d["uuid"] for d in g0["mig_devices"]] == [small["uuid"]]
    assert g0["fit"]["free_mib"] == small["memory_mib"] and g0["fits"] is False
    gpus, _facts = facts(host, collection, gpus=[devs[0]["uuid"]], min_free_mib=small["memory_mib"] + 1)
    assert gpus[0]["fits"] is True


def test_the_fence_of_a_mig_container_stops_its_work_and_leaves_the_other_mig_device(gpusim_factory, collection):
    host, devs = mig_host(gpusim_factory)
    vmid = 4278
    b = devs[1]
    host.ct_create(vmid, gpus="0")
    with open(host.ct_config_path(vmid), "a", encoding="utf-8") as f:
        for cap in (b["gi_cap"], b["ci_cap"]):
            f.write(f"lxc.mount.entry: /dev/nvidia-caps/nvidia-cap{cap} dev/nvidia-caps/nvidia-cap{cap}"
                    " none bind,optional,create=file\n")
    host.ct_start(vmid)
    inside = host.hold(b["uuid"], mib=2048, ct=vmid, name="python3 serve.py")
    beside = host.hold(devs[0]["uuid"], mib=4096, name="python3 train.py")
    gpus, _facts = facts(host, collection)
    got = {d["uuid"]: d for d in gpus[0]["mig_devices"]}
    assert got[b["uuid"]]["processes"] == [inside] and got[b["uuid"]]["holders"] == [inside]
    res = run_module(host, collection, "proxmox_gpu_containers", {"pct": host.path("bin", "pct"), "containers": [vmid],
                                                                  "state": "released", "grace_period": 5,
                                                                  "device_files": devices(host)})
    assert not res.get("failed"), res.get("msg")
    (row,) = res["containers"]
    assert row["mig_devices"] == [b["uuid"]] and row["wait_mig_devices"] == {"0": [b["uuid"]]}, row
    assert [r["pid"] for r in res["release"]["released"]] == [inside]
    assert not alive(inside) and alive(beside)


def test_a_gpu_named_whole_in_any_form_beside_one_of_its_mig_devices_is_taken_whole(gpusim_factory, collection):
    """Issue 35, item 2: with gpus ["01", "MIG-<a device on GPU 1>"] the facts took GPU 1 whole while the MIG narrowing
    compared "01" with "1" and kept one MIG device: the release left the other device's job and the wait did not wait
    for it (a false ready). Every form of naming GPU 1 whole means all its MIG devices, beside a MIG UUID too."""
    host, _devs = mig_host(gpusim_factory)
    devs = host.set_mig(1, ["3g.71gb", "2g.35gb"])
    a = host.hold(devs[0]["uuid"], mib=4096, name="python3 a.py")
    b = host.hold(devs[1]["uuid"], mib=2048, name="python3 b.py")
    gpu1 = host.status()["gpus"][1]
    bus = gpu1["pci_bus_id"]                                  # 00000000:3B:00.0 as the driver writes it
    targets = {}
    for whole in ["1", "01", "0001", "GPU-" + gpu1["uuid"][4:].upper(), bus, bus[4:].lower(), bus[9:].lower()]:
        res = run_module(host, collection, "gpu_release", dict(gpus=[whole, devs[0]["uuid"]], device_files=devices(host)),
                         check_mode=True)
        targets[whole] = res.get("msg") or sorted(r["pid"] for r in res["released"])
    assert targets == dict.fromkeys(targets, sorted([a, b])), targets
    busy = wait(host, collection, gpus=["01", devs[0]["uuid"]], timeout=1)
    assert busy.get("failed") and f"pid {b}" in busy["msg"], busy.get("msg")


@pytest.mark.parametrize("line", ["lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir",
                                  "dev0: /dev/nvidia-caps"])
def test_a_container_given_the_whole_nvidia_caps_is_fenced_by_the_mig_devices_its_processes_hold(
        gpusim_factory, collection, line):
    """Issue 33, item 3: a container given the whole /dev/nvidia-caps (a bind of the directory, as in
    tests/field/pct/telmate-issue-1138-lines.conf, or a devN of it) may use any MIG device of its GPU: its MIG devices
    are those its processes are on; while none is, it cannot be told - a warning, and the wait covers the MIG devices
    no other process holds. A neighbour's MIG job on the same GPU is never waited for. (mig_devices was [] with no
    warning: the wait covered the whole GPU and failed on the neighbour's job, telling to stop it.)"""
    host, devs = mig_host(gpusim_factory)
    vmid = 4279
    a, b = devs[0], devs[1]
    host.ct_create(vmid, gpus="0")
    with open(host.ct_config_path(vmid), "a", encoding="utf-8") as f:
        f.write(line + "\n")
    host.ct_start(vmid)
    beside = host.hold(a["uuid"], mib=4096, name="python3 train.py")   # another's work, on MIG device a
    args = {"pct": host.path("bin", "pct"), "containers": [vmid], "device_files": devices(host)}
    res = run_module(host, collection, "proxmox_gpu_containers", args)
    assert not res.get("failed"), res.get("msg")
    (row,) = res["containers"]
    assert row["mig_devices"] == [devs[1]["uuid"], devs[2]["uuid"]], row
    assert f"CT {vmid}'s config passes the whole /dev/nvidia-caps: which MIG devices of GPU 0 are its cannot be told" \
           in json.dumps(res.get("warnings")), res.get("warnings")

    inside = host.hold(b["uuid"], mib=2048, ct=vmid, name="python3 serve.py")
    res = run_module(host, collection, "proxmox_gpu_containers", dict(args, state="released", grace_period=5))
    assert not res.get("failed"), res.get("msg")
    (row,) = res["containers"]
    assert row["mig_devices"] == [b["uuid"]] and row["wait_mig_devices"] == {"0": [b["uuid"]]}, row
    assert [r["pid"] for r in res["release"]["released"]] == [inside]
    assert not alive(inside) and alive(beside)
    if collection not in sys.path:
        sys.path.insert(0, collection)
    from ansible_collections.gpuops.gpu.plugins.plugin_utils._results import proxmox_fence_result  # noqa: PLC0415
    fenced = proxmox_fence_result(res, method="processes")
    assert fenced["container_gpus"] == [b["uuid"]], fenced
    ready = wait(host, collection, gpus=fenced["container_gpus"], left_holders=fenced["left_holders"])
    assert not ready.get("failed"), ready.get("msg")
    assert alive(beside)


@pytest.mark.parametrize("backend", ["nvml", "nvidia-smi"])
def test_a_pending_mig_mode_change_on_a_fenced_gpu_is_a_warning_of_the_fence(gpusim_factory, collection, backend):
    """Issue 33, item 3: the next reset turns GPU 1 into MIG mode; the fence of the container that has it says so
    (through either backend), not of GPU 0's container. (It said nothing.)"""
    host = gpusim_factory(gpus=2)
    host.set_mig(1, current=0, pending=1)
    host.ct_create(4281, gpus="1")
    host.ct_create(4282, gpus="0")
    host.ct_start(4281)
    host.ct_start(4282)
    args = {"pct": host.path("bin", "pct"), "backend": backend, "nvidia_smi_path": host.path("bin", "nvidia-smi")}
    res = run_module(host, collection, "proxmox_gpu_containers", dict(args, containers=[4281]))
    assert not res.get("failed"), res.get("msg")
    said = json.dumps(res.get("warnings"))
    assert said.count("MIG mode change is pending") == 1, said
    assert "GPU 1: a MIG mode change is pending (MIG is off, on after a reset)" in said and "nvidia-smi -r -i 1" in said
    res = run_module(host, collection, "proxmox_gpu_containers", dict(args, containers=[4282]))
    assert "MIG mode" not in json.dumps(res.get("warnings")), res.get("warnings")
