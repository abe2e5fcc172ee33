"""proxmox_gpu_containers against the simulated node: real containers (namespaces, cgroups), the simulator's
pct and systemctl, and the simulated driver for the GPUs' minor numbers."""

import json
import sys
import time

import pytest
from modrun import alive, run_module_text, start_module

NAME = "proxmox_gpu_containers"


def run(host, collection, check_mode=False, diff=False, **args):
    args.setdefault("pct", host.path("bin", "pct"))
    return run_module_text(host, collection, NAME, args, check_mode=check_mode, diff=diff)[0]


def gone(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def mainpid(host, service, ct):
    """The host pid of the unit's main process in container ``ct`` (systemd's MainPID), else None."""
    return host.service_mainpid(service, ct=ct)


@pytest.fixture
def node(gpusim_factory):
    """An 8-GPU node whose minor numbers are not the indexes (GPU i has minor 7 - i), with
    4129 (lxc style, GPUs 0-3, running), 4130 (devN style, GPUs 4 and 5, running), 4131 (no passthrough,
    running) and 4132 (lxc style, GPU 6, stopped)."""
    host = gpusim_factory(release_lag_ms=0)
    host.set_gpus({i: {"minor": 7 - i} for i in range(8)})
    host.ct_create(4129, "gpu-a", "0-3", devices_style="lxc", systemd=True)
    host.ct_create(4130, "gpu-b", "4,5", devices_style="dev", systemd=True)
    host.ct_create(4131, "plain", None, devices_style="none")
    host.ct_create(4132, "gpu-c", "6", devices_style="lxc")
    for vmid in (4129, 4130, 4131):
        host.ct_start(vmid)
    return host


def by_vmid(res):
    return {c["vmid"]: c for c in res["containers"]}


def test_discovery_finds_the_passthrough_containers_and_their_gpus(node, collection):
    res = run(node, collection)
    assert not res.get("failed") and not res["changed"], res
    cts = by_vmid(res)
    # 4131 passes nothing through; 4132 is stopped, and a stopped container is read only when asked
    assert sorted(cts) == [4129, 4130]
    uuids = {g["index"]: g["uuid"] for g in node.status()["gpus"]}
    assert (cts[4129]["minors"], cts[4129]["gpus"]) == ([4, 5, 6, 7], [0, 1, 2, 3])
    assert (cts[4130]["minors"], cts[4130]["gpus"]) == ([2, 3], [4, 5])
    assert cts[4130]["gpu_uuids"] == [uuids[4], uuids[5]]
    assert (cts[4129]["name"], cts[4129]["status"], cts[4129]["running"], cts[4129]["passthrough"]) == \
        ("gpu-a", "running", True, True)
    assert res["running"] == [4129, 4130] and res["skipped_containers"] == []
    assert res["gpus"] == [0, 1, 2, 3, 4, 5]
    assert res["services_stopped"] == [] and res["shut_down"] == []
    assert not res.get("warnings"), res["warnings"]

    # Asked for the stopped ones too: reported, skipped, and their GPUs are not the running containers'
    res = run(node, collection, include_stopped=True)
    cts = by_vmid(res)
    assert sorted(cts) == [4129, 4130, 4132]
    assert (cts[4132]["status"], cts[4132]["running"], cts[4132]["minors"], cts[4132]["gpus"]) == ("stopped", False, [1], [6])
    assert res["running"] == [4129, 4130]
    assert res["skipped_containers"] == [{"vmid": 4132, "reason": "stopped"}]
    assert res["gpus"] == [0, 1, 2, 3, 4, 5]  # the running containers' only

    # A named stopped container alone: its config's GPUs are the ones a wait after the fence covers
    res = run(node, collection, containers=[4132], state="released")
    assert not res.get("failed") and not res["changed"], res
    assert res["running"] == [] and res["gpus"] == [6] and "release" not in res, res

    # The same through nvidia-smi (its XML report has the minor numbers)
    smi = run(node, collection, backend="nvidia-smi", include_stopped=True)
    assert {c["vmid"]: c["gpus"] for c in smi["containers"]} == {4129: [0, 1, 2, 3], 4130: [4, 5], 4132: [6]}

    # A named container without passthrough is reported as such
    res = run(node, collection, containers="4131,4130")
    assert [(c["vmid"], c["passthrough"], c["gpus"]) for c in res["containers"]] == [(4131, False, []), (4130, True, [4, 5])]


def test_every_minor_allowed_is_every_gpu_and_an_unreadable_driver_is_a_warning(gpusim_factory, collection):
    host = gpusim_factory()
    host.ct_create(4140, "all-gpus", None, devices_style="none")
    with open(host.ct_config_path(4140), "a", encoding="utf-8") as f:
        f.write("lxc.cgroup2.devices.allow: c 195:* rwm\n"
                "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file\n")
    host.ct_create(4141, "two", "2,3", devices_style="dev")
    host.ct_start(4140)
    host.ct_start(4141)
    res = run(host, collection)
    cts = by_vmid(res)
    assert (cts[4140]["passthrough"], cts[4140]["minors"], cts[4140]["gpus"], cts[4140]["gpu_uuids"]) == (True, None, None, None)
    assert cts[4141]["gpus"] == [2, 3] and res["gpus"] is None  # one of them gets every GPU

    host.fault(init_error=9)  # the driver is not loaded
    res = run(host, collection, backend="nvml")
    assert not res.get("failed"), res
    assert by_vmid(res)[4141]["gpus"] is None and by_vmid(res)[4141]["minors"] == [2, 3]
    assert "cannot read the GPUs (the NVIDIA kernel driver is not loaded" in json.dumps(res.get("warnings")), res.get("warnings")


def test_an_unknown_vmid_fails_and_nothing_is_stopped(node, collection):
    worker = node.hold(gpus=[0], mib=2048, ct=4129, service="sglang", respawn=True)
    res = run(node, collection, containers=[4129, 4133], services=["sglang"], state="shutdown")
    assert res.get("failed")
    assert res["msg"] == ("containers: no container 4133 on this node (its containers: 4129, 4130, 4131, 4132)."
                          " Nothing was stopped."), res["msg"]
    assert alive(worker) and node.ct_status(4129) == "running"


def logging_pct(host, tmp_path):
    """A pct that writes each argv it is started with to a log, then runs the simulator's (at its real cost): (its
    path, calls() -> the argvs, one line each)."""
    log = tmp_path / "pct.log"
    path = tmp_path / "pct"
    path.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {host.path("bin", "pct")} "$@"\n', encoding="utf-8")
    path.chmod(0o755)
    return str(path), lambda: log.read_text(encoding="utf-8").splitlines() if log.exists() else []


def test_a_fence_with_nothing_to_stop_starts_no_pct(node, collection, tmp_path):
    """The discovery reads the node's files (.vmlist, the configs with their pending sections) and the kernel (the LXC
    monitors' sockets): no pct at all, where it took 1 + 2 per running container before; pct_calls says how many ran."""
    pct, calls = logging_pct(node, tmp_path)
    for args in ({}, {"include_stopped": True}, {"containers": [4129, 4132], "state": "released"}):
        res = run(node, collection, pct=pct, **args)
        assert not res.get("failed"), res.get("msg")
        assert res["pct_calls"] == 0 and calls() == [], (args, calls())
    assert by_vmid(res)[4129]["gpus"] == [0, 1, 2, 3] and res["running"] == [4129]

    # What only pct can do is done by pct, and counted: systemctl in a container (pct exec), a shutdown
    res = run(node, collection, pct=pct, containers=[4130], services=["sglang"])
    assert not res.get("failed"), res.get("msg")
    assert calls() == ["exec 4130 -- systemctl is-active sglang"] and res["pct_calls"] == 1


def test_a_node_without_pmxcfs_is_a_clear_error_and_nothing_is_stopped(node, collection, tmp_path):
    """/etc/pve not mounted (pmxcfs down: an empty directory): the fence fails saying so, and never guesses that the
    node has no containers."""
    worker = node.hold(gpus=[0], mib=2048, ct=4129, service="sglang", respawn=True)
    empty = tmp_path / "etc-pve"
    empty.mkdir()
    res = run_module_text(node, collection, NAME, {"pct": node.path("bin", "pct"), "services": ["sglang"],
                                                   "state": "released"}, env={"GPUOPS_PVE_DIR": str(empty)})[0]
    assert res.get("failed") and res["error"] == "pve_unavailable", res
    assert res["msg"].startswith(f"cannot read {empty}/.vmlist (No such file or directory): {empty} is not mounted -"
                                 " the Proxmox VE cluster filesystem (pmxcfs) is down"), res["msg"]
    assert "Nothing was stopped" in res["msg"] and res["pct_calls"] == 0
    assert alive(worker) and node.ct_status(4129) == "running"


@pytest.mark.parametrize("args, option", [
    ({"containers": ["abc"]}, "containers: 'abc' is not a Proxmox VE container id"),
    ({"containers": ["4129,99"]}, "containers: '99' is not a Proxmox VE container id"),
    ({"services": ["sglang", "-now"]}, "services: '-now' is not a systemd unit name"),
    ({"services": ["a;reboot"]}, "services: 'a;reboot' is not a systemd unit name"),
    ({"shutdown_timeout": 86401}, "shutdown_timeout must be between 0 and 86400"),
    ({"query_timeout": 0}, "query_timeout must be > 0"),
])
def test_bad_input_fails_naming_the_option_before_anything_runs(node, collection, args, option):
    worker = node.hold(gpus=[0], mib=2048, ct=4129, service="sglang", respawn=True)
    res = run(node, collection, **dict({"state": "shutdown", "services": ["sglang"]}, **args))
    assert res.get("failed") and res["msg"].startswith(option), res["msg"]
    assert alive(worker) and node.ct_status(4129) == "running"


def test_services_are_stopped_in_the_selected_container_only(node, collection):
    a = node.hold(gpus=[0, 1], mib=4096, ct=4129, service="sglang", respawn=True, restart_delay=0.2)
    b = node.hold(gpus=[4], mib=4096, ct=4130, service="sglang", respawn=True, restart_delay=0.2)
    res = run(node, collection, containers=[4129, 4132], services=["sglang.service", "vllm"], diff=True)
    assert not res.get("failed"), res
    assert res["changed"] and res["skipped_containers"] == [{"vmid": 4132, "reason": "stopped"}]
    (entry,) = res["services_stopped"]
    assert (entry["vmid"], entry["unit"], entry["state_before"], entry["rc"]) == (4129, "sglang.service", "active", 0)
    assert entry["seconds"] >= 0
    assert res["diff"][0]["before"]["4129"] == {"status": "running", "services": {"sglang.service": "active", "vllm": "inactive"}}
    assert res["diff"][0]["after"]["4129"]["services"] == {"sglang.service": "inactive", "vllm": "inactive"}
    assert res["diff"][0]["before"]["4132"] == {"status": "stopped", "services": {}}
    assert gone(a)
    time.sleep(0.6)  # longer than the restart delay
    assert mainpid(node, "sglang", 4129) is None  # stopped through systemd: not restarted
    assert alive(b)  # the other container's workload
    assert node.ct_status(4129) == "running"

    again = run(node, collection, containers=[4129], services=["sglang.service"])
    assert not again["changed"] and again["services_stopped"] == []
    node.systemctl("stop", "sglang", ct=4130)


def test_check_mode_stops_nothing_and_says_what_would_be_stopped(node, collection):
    a = node.hold(gpus=[0], mib=2048, ct=4129, service="sglang", respawn=True)
    res = run(node, collection, check_mode=True, diff=True, services=["sglang"], state="shutdown")
    assert not res.get("failed"), res
    assert res["changed"]
    assert res["services_stopped"] == [{"vmid": 4129, "unit": "sglang", "state_before": "active", "rc": None, "seconds": None}]
    assert res["shut_down"] == [4129, 4130]
    assert res["diff"][0]["after"]["4129"] == {"status": "stopped", "services": {"sglang": "inactive"}}
    assert res["diff"][0]["before"]["4130"] == {"status": "running", "services": {"sglang": "inactive"}}
    assert alive(a) and mainpid(node, "sglang", 4129) == a
    assert [node.ct_status(v) for v in (4129, 4130)] == ["running", "running"]
    node.systemctl("stop", "sglang", ct=4129)


def test_shutdown_shuts_the_container_down(node, collection):
    a = node.hold(gpus=[4], mib=2048, ct=4130, service="sglang", respawn=True)
    other = node.hold(gpus=[0], mib=2048, ct=4129)
    res = run(node, collection, containers=[4130], services=["sglang"], state="shutdown", shutdown_timeout=20)
    assert not res.get("failed"), res
    assert res["changed"] and res["shut_down"] == [4130] and [e["unit"] for e in res["services_stopped"]] == ["sglang"]
    assert node.ct_status(4130) == "stopped" and gone(a)
    assert alive(other) and node.ct_status(4129) == "running"
    again = run(node, collection, containers=[4130], state="shutdown")
    assert not again["changed"] and again["shut_down"] == [] and again["skipped_containers"] == [{"vmid": 4130, "reason": "stopped"}]


def test_a_container_that_does_not_shut_down_fails_with_the_advice_and_force_stops_it(node, collection):
    stubborn = node.hold(gpus=[0], mib=2048, ct=4129, ignore_term=True)
    res = run(node, collection, containers=[4129], state="shutdown", shutdown_timeout=1)
    assert res.get("failed") and res["shut_down"] == []
    assert res["msg"].startswith("CT 4129 did not shut down (pct shutdown --timeout 1, rc 255): container did not stop."), res["msg"]
    assert "force: true" in res["msg"] and "shutdown_timeout" in res["msg"]
    assert alive(stubborn) and node.ct_status(4129) == "running"
    res = run(node, collection, containers=[4129], state="shutdown", shutdown_timeout=1, force=True)
    assert not res.get("failed") and res["shut_down"] == [4129], res
    assert node.ct_status(4129) == "stopped" and gone(stubborn)


def test_released_fences_the_container_in_one_run(node, collection):
    """state=released: the services, the GPU holders, their units - one module run; nothing of CT 4130."""
    worker = node.hold(gpus=[0, 1], mib=4096, ct=4129, service="sglang", respawn=True)
    bystander = node.hold(gpus=[4], mib=1024, ct=4130)
    check = run(node, collection, check_mode=True, containers=[4129], state="released")
    assert not check.get("failed") and check["check_mode"], check
    assert worker in [r["pid"] for r in check["release"]["released"]], check["release"]
    assert alive(worker) and alive(bystander)

    res = run(node, collection, containers=[4129], state="released", grace_period=5)
    assert not res.get("failed") and res["changed"], res
    assert worker in [r["pid"] for r in res["release"]["released"]], res["release"]
    assert [(u["container"], u["unit"]) for u in res["release"]["stopped_units"]] == [(4129, "sglang.service")]
    assert res["release"]["respawned"] == [] and res["release"]["survivors"] == []
    assert gone(worker) and alive(bystander)
    assert res["gpus"] == [0, 1, 2, 3]

    again = run(node, collection, containers=[4129], state="released")
    assert not again.get("failed") and not again["changed"], again
    assert again["release"]["released"] == [] and alive(bystander)


def test_a_frozen_container_fails_saying_it_did_not_answer(node, collection):
    """A frozen container never answers pct exec: the task fails within pct_timeout, names the container, and
    stops nothing (it used to hang to its limit and blame the driver)."""
    worker = node.hold(gpus=[4], mib=1024, ct=4130)
    node.ct_freeze(4130)
    try:
        started = time.monotonic()
        res = run(node, collection, containers=[4129, 4130], services=["sglang"], state="released", pct_timeout=3)
        took = time.monotonic() - started
    finally:
        node.ct_freeze(4130, False)
    assert res.get("failed") and res["error"] == "container_timeout", res
    assert res["msg"].startswith("CT 4130 is frozen (a suspend-mode backup, or lxc-freeze): `pct exec 4130 -- systemctl"
                                 " is-active sglang` cannot run in it"), res["msg"]
    assert "lxc-unfreeze -n 4130" in res["msg"] and "Nothing was stopped" in res["msg"], res["msg"]
    assert "driver" not in res["msg"], res["msg"]
    assert res["services_stopped"] == [] and "release" not in res
    assert alive(worker)
    assert took < 3 + 20, took  # pct_timeout + slack: said as soon as it is seen frozen


def test_a_container_frozen_during_the_unit_stop_fails_at_once_naming_it(node, collection):
    """The unit's stop takes long (its server exits 30 s after SIGTERM) and the container is frozen meanwhile (a backup
    starts): the fence fails as soon as it is seen frozen, naming the container and the command - not after the stop's
    whole limit (grace_period + kill_timeout + pct_timeout: 10 + 45 + 5 s here) blaming "frozen or its systemd"."""
    worker = node.hold(gpus=[4], mib=1024, ct=4130, service="sglang", exit_delay=30)
    args = {"pct": node.path("bin", "pct"), "containers": [4130], "services": ["sglang"], "state": "released",
            "pct_timeout": 5}
    proc = start_module(node, collection, NAME, args)
    started = time.monotonic()
    try:
        deadline = started + 30
        while not any("stop" in call for call in node.pct_calls()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # systemctl stop runs in the container: SIGTERM sent, the server exits in 30 s
        node.ct_freeze(4130)
        try:
            out, _err = proc.communicate(timeout=120)
            took = time.monotonic() - started
        finally:
            node.ct_freeze(4130, False)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    res = json.loads(out)
    assert res.get("failed") and res["error"] == "container_timeout", res
    assert res["msg"].startswith("stopping sglang in CT 4130: CT 4130 is frozen (a suspend-mode backup, or lxc-freeze):"
                                 " `pct exec 4130 -- systemctl stop sglang` cannot run in it"), res["msg"]
    assert "lxc-unfreeze -n 4130" in res["msg"] and "Nothing else was stopped" in res["msg"], res["msg"]
    assert took < 5 + 20, took  # pct_timeout + slack (it used to take the stop's whole 60 s)
    assert node.systemctl("stop", "sglang", ct=4130).returncode == 0
    assert gone(worker, 40)


def test_a_unit_stop_that_hangs_in_the_container_names_its_systemd(node, collection):
    """The command reached the container, which is not frozen, and systemctl stop does not return (the server exits 30 s
    after SIGTERM): at the stop's limit (grace_period + kill_timeout + pct_timeout) the failure names the container's
    systemd and the command, not the node's pct nor a freeze."""
    worker = node.hold(gpus=[4], mib=1024, ct=4130, service="sglang", exit_delay=30)
    started = time.monotonic()
    res = run(node, collection, containers=[4130], services=["sglang"], state="released", pct_timeout=3,
              grace_period=1, kill_timeout=1)
    took = time.monotonic() - started
    assert res.get("failed") and res["error"] == "container_timeout", res
    assert "CT 4130's systemd did not finish `pct exec 4130 -- systemctl stop sglang` within 5 s" in res["msg"], res["msg"]
    assert "is frozen" not in res["msg"] and "pct hung" not in res["msg"], res["msg"]
    assert took < 5 + 20, took
    assert gone(worker, 40)


HUNG_PCT = """#!/bin/sh
# The node's pct, hung (pmxcfs blocked) for {which}: it never reaches the container.
case " $* " in
  *" {which} "*) exec sleep 3600 ;;
esac
exec {real} "$@"
"""


@pytest.mark.parametrize("which", ["stop", "is-active"])
def test_a_hung_pct_fails_within_pct_timeout_naming_the_nodes_pct(node, collection, tmp_path, which):
    """pct itself hangs (before it attaches to the container): the fence fails after pct_timeout, naming the node's pct
    and the command, never the container's systemd (it used to wait the stop's whole limit and blame the container)."""
    worker = node.hold(gpus=[4], mib=1024, ct=4130, service="sglang")
    pct = tmp_path / "pct"
    pct.write_text(HUNG_PCT.format(which=which, real=node.path("bin", "pct")))
    pct.chmod(0o755)
    started = time.monotonic()
    res = run(node, collection, pct=str(pct), containers=[4130], services=["sglang"], state="released", pct_timeout=3)
    took = time.monotonic() - started
    assert res.get("failed") and res["error"] == "container_timeout", res
    assert f"the node's pct hung: `pct exec 4130 -- systemctl {which} sglang` had not reached CT 4130 after 3 s" \
        in res["msg"], res["msg"]
    assert "pve-cluster" in res["msg"] and "frozen" not in res["msg"], res["msg"]
    assert took < 3 + 20, took  # pct_timeout + slack (the stop's whole limit was 10 + 45 + 3 s)
    assert alive(worker)  # nothing was signalled: its unit was never stopped
    assert node.systemctl("stop", "sglang", ct=4130).returncode == 0


def test_a_notebook_beside_a_stopped_service_is_left_alone(node, collection):
    """services: [sglang] stops the server first; the driver frees its memory 1.5 s later, so when the release
    looks the GPUs' memory is in use with no process listed. A notebook kernel in the same container that
    imported torch (every /dev/nvidiaN of the container open, no context) keeps nothing busy: it must not be
    signalled for that memory (it was, in make bench's predeploy d0 with CUDA bystanders)."""
    node.fault(release_lag_ms=1500)
    worker = node.hold(gpus="0-3", mib=40960, ct=4129, tree=True, service="sglang", respawn=True)
    # CUDA initialised, no context: every GPU node the container can see, nvidiactl and nvidia-uvm, no memory
    notebook = node.hold(gpus="none", mib=0, ct=4129, name="python3 -m ipykernel_launcher -f kernel-1.json")
    res = run(node, collection, containers=[4129], services=["sglang"], state="released", grace_period=5,
              device_files=[node.dir + "/dev/nvidia*"])
    assert not res.get("failed"), res.get("msg")
    assert [(s["unit"], s["rc"]) for s in res["services_stopped"]] == [("sglang", 0)]
    assert notebook in [int(pid) for pid in res["release"]["holder_processes"]], "the notebook was not seen at all"
    assert gone(worker) and alive(notebook), res["release"]
    assert notebook not in [r["pid"] for r in res["release"]["released"]]


UNKNOWN_HOOK = "lxc.hook.mount: /usr/local/lib/lxc/gpu-hook"


@pytest.fixture
def toolkit_node(gpusim_factory):
    """An 8-GPU node (GPU i has minor 7 - i) whose containers get their GPUs in the other ways a node is set up:
    4150 through the NVIDIA container toolkit's LXC hook (NVIDIA_VISIBLE_DEVICES=2,3), 4151 through a bind of the
    node's whole /dev, 4152 through a mount hook of the operator's that cannot be read (the simulator never runs it; a
    workload there opens the node of its own GPU, as what such a hook binds), 4153 the classic lxc lines (GPU 0, another
    tenant). All running."""
    host = gpusim_factory(release_lag_ms=0)
    host.set_gpus({i: {"minor": 7 - i} for i in range(8)})
    host.ct_create(4150, "hook-ct", "2,3", devices_style="hook")
    host.ct_create(4151, "devdir-ct", "all", devices_style="devdir")
    host.ct_create(4152, "own-hook", None, devices_style="none")
    with open(host.ct_config_path(4152), "a", encoding="utf-8") as f:
        f.write(UNKNOWN_HOOK + "\n")
    host.ct_create(4153, "tenant", "0", devices_style="lxc")
    for vmid in (4150, 4151, 4152, 4153):
        host.ct_start(vmid)
    return host


def test_toolkit_hook_and_dev_bind_are_passthrough_and_an_unreadable_hook_is_decided_by_its_processes(
        toolkit_node, collection):
    """The toolkit's hook gives the GPUs of NVIDIA_VISIBLE_DEVICES (indexes, UUIDs), a bind of /dev every GPU; a hook
    that cannot be read is passthrough null with a warning naming it, and is a GPU container when its processes hold a
    GPU. (They were all passthrough false, with no warning: the node-level fence skipped them.)"""
    node = toolkit_node
    res = run(node, collection)
    assert not res.get("failed"), res
    cts = by_vmid(res)
    assert sorted(cts) == [4150, 4151, 4153], cts  # 4152: its processes hold nothing, it is not fenced
    assert (cts[4150]["passthrough"], cts[4150]["gpus"], cts[4150]["minors"]) == (True, [2, 3], [4, 5])
    uuids = {g["index"]: g["uuid"] for g in node.status()["gpus"]}
    assert cts[4150]["gpu_uuids"] == [uuids[2], uuids[3]]
    assert (cts[4151]["passthrough"], cts[4151]["gpus"], cts[4151]["minors"]) == (True, None, None)
    assert res["gpus"] is None  # 4151 has every GPU
    said = json.dumps(res.get("warnings"))
    assert UNKNOWN_HOOK in said and "it is not fenced" in said, said

    worker = node.hold(gpus=[6], mib=2048, ct=4152)
    res = run(node, collection)
    cts = by_vmid(res)
    assert sorted(cts) == [4150, 4151, 4152, 4153]
    assert (cts[4152]["passthrough"], cts[4152]["gpus"], cts[4152]["passthrough_unknown"]) == (None, [6], [UNKNOWN_HOOK])
    assert "its processes hold GPU 6" in json.dumps(res["warnings"]), res["warnings"]
    assert alive(worker)

    # UUIDs (a unique prefix, as the toolkit's docs write them) are the node's GPUs; one that no GPU has: null, a warning
    path = node.ct_config_path(4150)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for value, gpus in ((f"{uuids[1][:12]},{uuids[5]}", [1, 5]), ("all", None),
                        ("GPU-00000000-1111-2222-3333-444444444444", None), ("none", [])):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace("NVIDIA_VISIBLE_DEVICES=2,3", "NVIDIA_VISIBLE_DEVICES=" + value))
        res = run(node, collection, containers=[4150])
        (ct,) = res["containers"]
        assert (ct["passthrough"], ct["gpus"]) == (True, gpus), (value, ct)
        if value.startswith("GPU-0000"):
            assert "no GPU of this node matches GPU-00000000-1111-2222-3333-444444444444" in json.dumps(res["warnings"])


def test_the_fence_fences_toolkit_and_unreadable_passthrough_and_a_named_one_selects_only_its_gpus(
        toolkit_node, collection):
    """A named fence of the hook's container selects its GPUs only (it selected every GPU, with gpus []); the
    node-level fence releases the workload of the container whose hook cannot be read, because it holds a GPU (it
    skipped it, rc 0, with its server still running)."""
    node = toolkit_node
    hooked = node.hold(gpus=[2, 3], mib=4096, ct=4150, tree=True)
    own = node.hold(gpus=[6], mib=2048, ct=4152)
    tenant = node.hold(gpus=[0], mib=2048, ct=4153)
    res = run(node, collection, containers=[4150], state="released", grace_period=5)
    assert not res.get("failed") and res["changed"], res
    assert res["gpus"] == [2, 3]
    assert [g["index"] for g in res["release"]["gpus"]] == [2, 3], res["release"]
    assert hooked in [r["pid"] for r in res["release"]["released"]] and gone(hooked)
    assert alive(own) and alive(tenant)

    res = run(node, collection, state="released", grace_period=5)
    assert not res.get("failed"), res
    assert 4152 in res["running"], res["containers"]
    assert own in [r["pid"] for r in res["release"]["released"]], res["release"]
    assert gone(own)


@pytest.fixture
def shared_node(gpusim_factory):
    """An 8-GPU node (GPU i has minor 7 - i) whose two GPU containers were set up by a helper script that writes a
    devN line for every /dev/nvidia* node into every GPU container: 4170 (CT A) and 4171 (CT B) both pass all 8 GPUs.
    Both run."""
    host = gpusim_factory(release_lag_ms=0)
    host.set_gpus({i: {"minor": 7 - i} for i in range(8)})
    host.ct_create(4170, "ct-a", "all", devices_style="dev")
    host.ct_create(4171, "ct-b", "all", devices_style="dev")
    for vmid in (4170, 4171):
        host.ct_start(vmid)
    return host


def test_a_config_that_passes_every_gpu_is_fenced_by_what_its_processes_hold(shared_node, collection):
    """CT A's server holds GPUs 0-3, CT B's job 4-7 by right; both configs pass all 8 (and CUDA opens all 8 nodes in
    each). Fencing A releases A's server, and the wait after it - over proxmox_fence_result's container_gpus, as the
    predeploy playbook runs it - covers 0-3 and is ready while B's job runs on. (It covered A's config, all 8: the wait
    timed out on B's job.)"""
    if collection not in sys.path:
        sys.path.insert(0, collection)
    from ansible_collections.gpuops.gpu.plugins.plugin_utils._results import proxmox_fence_result  # noqa: PLC0415

    node = shared_node
    server = node.hold(gpus="0-3", mib=8192, ct=4170, tree=True)
    job = node.hold(gpus="4-7", mib=8192, ct=4171)
    res = run(node, collection, containers=[4170], state="released", grace_period=5)
    assert not res.get("failed"), res.get("msg")
    (ct,) = res["containers"]
    assert (ct["gpus"], ct["gpus_from"], ct["wait_gpus"]) == (list(range(8)), "processes", [0, 1, 2, 3]), ct
    assert res["gpus"] == list(range(8)) and res["wait_gpus"] == [0, 1, 2, 3]
    assert "CT 4170's config passes every GPU of the node, and CT 4171 pass GPUs too: fenced by what its processes" \
           " hold: GPU 0, 1, 2, 3" in json.dumps(res.get("warnings")), res.get("warnings")
    assert server in [r["pid"] for r in res["release"]["released"]] and gone(server)
    assert alive(job) and job not in [r["pid"] for r in res["release"]["released"]]

    fenced = proxmox_fence_result(res, method="processes")
    assert fenced["error"] is None and fenced["container_gpus"] == [0, 1, 2, 3], fenced
    assert fenced["gpus_from"] == {4170: "processes"}
    wait = run_module_text(node, collection, "gpu_wait_idle", {
        "gpus": [str(i) for i in fenced["container_gpus"]], "device_files": [node.dir + "/dev/nvidia*"],
        "timeout": 10, "settle": 0.5, "quiet_since": fenced["quiet_since"], "left_holders": fenced["left_holders"]})[0]
    assert not wait.get("failed"), wait.get("msg")
    assert wait["idle_gpus"] == [0, 1, 2, 3] and alive(job)

    # A again, now holding nothing: the wait covers the GPUs no other container's processes hold (B's 4-7 are B's)
    res = run(node, collection, containers=[4170], state="released")
    (ct,) = res["containers"]
    assert (ct["gpus_from"], ct["wait_gpus"]) == ("unheld", [0, 1, 2, 3]), ct
    assert alive(job)


def fence_result(collection, res):
    """proxmox_fence_result (plugin_utils._results) over a module result, as the predeploy playbook reads the fence."""
    if collection not in sys.path:
        sys.path.insert(0, collection)
    from ansible_collections.gpuops.gpu.plugins.plugin_utils._results import proxmox_fence_result  # noqa: PLC0415
    return proxmox_fence_result(res, method="processes")


def on_gpus(host, gpus):
    """The pids the driver lists on ``gpus`` now."""
    return sorted({pid for g in host.status()["gpus"] if g["index"] in gpus for pid in g["pids"]})


def test_a_config_edited_while_the_container_runs_is_fenced_by_what_its_processes_hold(node, collection):
    """Issue 33, item 1: CT 4129's server runs with a worker on each of GPUs 0-3; its config is edited while it runs to
    pass GPUs 0-1 only (GPUs 2-3 moved to another container by hand: an lxc.* line, which PVE never keeps pending). The
    kernel has the last word: the fence releases the whole server (its workers on 2-3 and its API process too) and the
    wait after it covers 0-3, with a warning that names GPUs 2-3 and the file. (It covered 0-1: the workers there were
    released, the API process and the workers on 2-3 ran on, and the wait over 0-1 said ready.)"""
    server = node.hold(gpus="0-3", mib=8192, ct=4129, tree=True)
    path = node.ct_config_path(4129)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # GPU i has minor 7 - i: GPUs 2 and 3 are /dev/nvidia5 and /dev/nvidia4
    edited = "".join(line for line in text.splitlines(True) if "/dev/nvidia5 " not in line and "/dev/nvidia4 " not in line)
    assert edited != text
    with open(path, "w", encoding="utf-8") as f:
        f.write(edited)
    assert on_gpus(node, [2, 3]), "the workers on GPUs 2-3 did not start"

    res = run(node, collection, containers=[4129], state="released", grace_period=5,
              device_files=[node.dir + "/dev/nvidia*"])
    assert not res.get("failed"), res.get("msg")
    ct = by_vmid(res)[4129]
    want = ([4, 5, 6, 7], [0, 1, 2, 3], [2, 3], [0, 1, 2, 3])
    assert (ct["minors"], ct["gpus"], ct.get("gpus_beyond_config"), ct["wait_gpus"]) == want, ct
    said = json.dumps(res.get("warnings"))
    assert "CT 4129's processes hold GPU 2, 3, which its config " in said and "/lxc/4129.conf does not pass" in said, said
    assert gone(server), res["release"]
    assert on_gpus(node, [0, 1, 2, 3]) == [], res["release"]

    fenced = fence_result(collection, res)
    assert fenced["error"] is None and fenced["container_gpus"] == [0, 1, 2, 3], fenced
    wait = run_module_text(node, collection, "gpu_wait_idle", {
        "gpus": [str(i) for i in fenced["container_gpus"]], "device_files": [node.dir + "/dev/nvidia*"],
        "timeout": 10, "settle": 0.5, "quiet_since": fenced["quiet_since"], "left_holders": fenced["left_holders"]})[0]
    assert not wait.get("failed"), wait.get("msg")
    assert wait["idle_gpus"] == [0, 1, 2, 3]
