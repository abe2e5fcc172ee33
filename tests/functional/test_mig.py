"""MIG (issue 27, item 1): a MIG host read per MIG device by every module, on the simulator (tests/gpusim/README.md
"MIG"): the facts list the MIG devices with their UUIDs, memory, processes and device nodes."""

from modrun import run_module


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
