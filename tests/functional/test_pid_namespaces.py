"""gpu_facts inside a Proxmox container, over both PID modes of the driver (issue: inside a container
it says what it cannot see). The container is made of real namespaces; the module runs in it via pct exec."""

from modrun import run_module, warnings

VMID = 9300


def facts_in_ct(host, collection):
    res = run_module(host, collection, "gpu_facts", {"device_files": [host.dir + "/dev/nvidia*"]},
                     prefix=["pct", "exec", str(VMID), "--"])
    assert not res.get("failed"), res
    return res


def test_facts_inside_a_container_translate_and_host_modes(gpusim, collection):
    host = gpusim
    host.ct_create(VMID)
    host.ct_start(VMID)
    in_ct = host.hold(gpus=[0], mib=4096, ct=VMID)
    on_host = host.hold(gpus=[1], mib=8192)

    # New drivers (translate): the container's own process, with its pid in the container;
    # the host's process is not reported at all, but its memory is.
    res = facts_in_ct(host, collection)
    gpu0, gpu1 = res["ansible_facts"]["gpu_devices"][:2]
    (proc,) = gpu0["processes"]
    assert proc["visible"] is True
    assert proc["pid"] != in_ct and proc["pid"] < 100          # the container's pid, not the host's
    # Real LXC gives the container a cgroup namespace, so from inside /proc/<pid>/cgroup reads "0::/"
    # and no container is named; the simulator's containers have none (PID, mount, UTS only), so the
    # path still reads /lxc/<vmid>/ns. Either way there is no pid "inside" a container seen from inside.
    assert proc["container"] in (None, {"kind": "lxc", "id": VMID, "pid_in_container": None, "uid_in_container": 0})
    assert gpu1["processes"] == [] and gpu1["memory"]["used"] == 8192
    assert not gpu1["idle"]
    assert any(w.startswith("GPU 1 (8192 MiB): memory in use by processes not visible from this PID namespace")
               for w in warnings(res)), warnings(res)

    # Old drivers (host): host pids for everyone; from inside they do not exist.
    host.fault(pid_mode="host")
    res = facts_in_ct(host, collection)
    gpu0, gpu1 = res["ansible_facts"]["gpu_devices"][:2]
    assert [(p["pid"], p["visible"]) for p in gpu1["processes"]] == [(on_host, False)]
    assert [(p["pid"], p["visible"]) for p in gpu0["processes"]] == [(in_ct, False)]
    assert any("do not exist from this PID namespace" in w for w in warnings(res))

    # From the node both are visible and the container process is attributed to its CT.
    res = run_module(host, collection, "gpu_facts", {"device_files": [host.dir + "/dev/nvidia*"]})
    gpu0 = res["ansible_facts"]["gpu_devices"][0]
    assert gpu0["processes"][0]["pid"] == in_ct
    assert gpu0["processes"][0]["container"]["id"] == VMID
