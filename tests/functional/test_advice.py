"""Advice that fits each holder, and what a newcomer meets (issue 33, items 4 and 6), on real LXC containers.

1. An MPS server on the node carries the clients of two containers: the fence of one leaves it, and the wait after it
   names the other container's client and the control daemon's way (``echo quit | nvidia-cuda-mps-control``, once its
   clients are done), never a bare ``kill`` of the server (before: "stop it where it runs (`kill <pid>`)").
2. With a driver that reports host pids, read from inside a container, the pid names an unrelated process there:
   gpu_facts and the wait's diagnosis named that process (its name, its command line); now they name the pid only,
   as not verified (the release's check, _holding.unverified_pids, wherever a pid is named).
3. vLLM's workers renamed at run time (setproctitle: ``VLLM::Worker_TP0``) outlive a killed API server: ``match: vllm``
   gave ok with a generic warning; now the warning names each holder it missed, what match saw and that only the case
   differs, and the README's match example releases them.
4. ``containers: [999]`` on a node without CT 999: gpu_release refuses it as the fence does (before: ok, a warning).
5. The README's two-task example (release, then wait with its quiet_since and left_holders), run as a play: a holder
   the release left fails it after blocker_grace, not at the timeout.
6. The fence in check mode with a named service: the release after it does not stop the same unit again (before, the
   summary said "stopped sglang in CT N; stopped sglang.service in CT N").

vmids 7491-7497 only.
"""

import os
import re
import sys
import time

import yaml
from modrun import alive, controller_env, gone, run_module, run_playbook, warnings
from test_scope_gate import decoy_with_pid

CT_A, CT_B = 7491, 7492   # the MPS server's clients
CT_OLD = 7493             # a driver that reports host pids
CT_README = 7494          # the README's play
CT_OTHER = 7495           # its other tenant
CT_UNIT = 7496            # the fence in check mode
TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def devices(host):
    return [host.dir + "/dev/nvidia*"]


# --- 1. an MPS server shared by two containers --------------------------------------------------------------
def test_an_mps_server_of_two_containers_is_left_with_the_control_daemons_way(gpusim_factory, collection):
    host = gpusim_factory(release_lag_ms=0)
    host.ct_create(CT_A, "gpu-a", "0", devices_style="lxc")
    host.ct_create(CT_B, "gpu-b", "1", devices_style="lxc")
    for vmid in (CT_A, CT_B):
        host.ct_start(vmid)
    control, server = host.mps_daemon(gpus=[0, 1], mib=28)   # on the node, serving both containers
    a = host.hold(gpus=[0], mib=790, type="CM", ct=CT_A, name="python3 client_a.py")
    b = host.hold(gpus=[1], mib=790, type="CM", ct=CT_B, name="python3 client_b.py")
    fence = run_module(host, collection, "proxmox_gpu_containers",
                       {"device_files": devices(host), "containers": [CT_A], "state": "released", "grace_period": 5,
                        "pct": host.path("bin", "pct")})
    assert not fence.get("failed"), fence.get("msg")
    release = fence["release"]
    assert gone(a) and alive(server) and alive(control) and alive(b)
    assert server in [h["pid"] for h in release["left_holders"]], release["left_holders"]

    wait = run_module(host, collection, "gpu_wait_idle", {"device_files": devices(host), "gpus": ["0"], "timeout": 60,
                                                          "left_holders": release["left_holders"]})
    assert wait.get("failed") and wait["error"] == "blocked", wait
    msg = wait["msg"]
    print("wait:", msg)
    assert f"GPU 0 is used by pid {server} (nvidia-cuda-mps)" in msg, msg  # (comm: 15 bytes)
    # the clients it carries, with their containers, and the control daemon's way once they are done
    assert f"it carries client pid {b} on GPU 1 (in CT {CT_B})" in msg, msg
    assert "when all its clients are done, stop MPS the control daemon's way (`echo quit | nvidia-cuda-mps-control`" \
        " on the node" in msg, msg
    assert f"kill {server}" not in msg and "`kill" not in msg, msg
    assert alive(server) and alive(b)  # the wait signals nothing


# --- 2. an old driver's host pid names another process in the container ---------------------------------------
def test_inside_a_container_a_host_pid_that_names_another_process_is_not_named(gpusim, collection):
    host = gpusim
    host.ct_create(CT_OLD)
    host.ct_start(CT_OLD)
    job = host.hold(gpus=[0], mib=4096, ct=CT_OLD)
    host.fault(pid_mode="host")
    decoy = decoy_with_pid(host, CT_OLD, job)
    inside = ["pct", "exec", str(CT_OLD), "--"]
    try:
        facts = run_module(host, collection, "gpu_facts", {"device_files": devices(host)}, prefix=inside)
        assert not facts.get("failed"), facts
        (proc,) = facts["ansible_facts"]["gpu_devices"][0]["processes"]
        print("facts:", proc, warnings(facts))
        assert proc["pid"] == job and proc["visible"] is False and proc["name"] is None and proc["cmdline"] is None
        assert "cannot be confirmed to be that process" in proc["unverified"], proc
        assert not any("sleep" in w for w in warnings(facts)), warnings(facts)

        wait = run_module(host, collection, "gpu_wait_idle", {"device_files": devices(host), "gpus": ["0"],
                                                              "timeout": 1, "settle": 0, "sleep": 0.2}, prefix=inside)
        assert wait.get("failed") and wait["error"] == "wait_timeout", wait
        print("wait:", wait["msg"])
        assert f"GPU 0 is used by pid {job} (not verified here: a driver may report host pids)" in wait["msg"], wait["msg"]
        assert "sleep" not in wait["msg"]
        assert alive(decoy) and alive(job)
    finally:
        os.kill(decoy, 9)


# --- 3. vLLM's renamed workers, their API server gone -----------------------------------------------------------
def readme_match():
    """The match of the README's example (the `match: "..."` it recommends)."""
    with open(os.path.join(TOP, "README.md"), encoding="utf-8") as f:
        (found,) = re.findall(r'`match: "([^"]+)"`', f.read())
    return found


def orphaned_vllm_workers(host, monkeypatch):
    """An API server (python3 -m vllm...) whose two workers rename themselves VLLM::Worker_TP<n> once started, as
    vLLM's set_process_title does; then the API server is killed (SIGKILL) and the workers keep the GPUs."""
    monkeypatch.setenv("GPUSIM_WORKER_TITLE", "VLLM::Worker_TP{i}")
    server = host.hold(gpus=[0, 1], mib=4096, tree=True, name="python3 -m vllm.entrypoints.openai.api_server")
    with open(f"/proc/{server}/task/{server}/children", encoding="utf-8") as f:
        workers = sorted(int(x) for x in f.read().split())
    for i, w in enumerate(workers):
        with open(f"/proc/{w}/cmdline", "rb") as f:
            assert f.read().rstrip(b"\0") == f"VLLM::Worker_TP{i}".encode()
    os.kill(server, 9)
    assert gone(server)
    return workers


def test_a_match_that_misses_vllms_renamed_workers_says_which_and_why(gpusim, collection, monkeypatch):
    workers = orphaned_vllm_workers(gpusim, monkeypatch)
    res = run_module(gpusim, collection, "gpu_release", {"device_files": devices(gpusim), "gpus": ["0", "1"],
                                                         "match": "vllm", "grace_period": 5})
    assert not res.get("failed") and res["released"] == [], res
    (said,) = [w for w in warnings(res) if "the scope selects none" in w]
    print("warning:", said)
    for i, w in enumerate(workers):
        assert f"pid {w} (VLLM::Worker_TP) on GPU {i}: neither its command line, executable nor unit matches 'vllm'" \
               f" (it saw 'VLLM::Worker_TP{i}'" in said, said
    assert "matches it only ignoring case - match is case-sensitive; (?i)vllm matches both" in said, said
    assert all(alive(w) for w in workers)

    # The README's example catches them.
    res = run_module(gpusim, collection, "gpu_release", {"device_files": devices(gpusim), "gpus": ["0", "1"],
                                                         "match": readme_match(), "grace_period": 5})
    assert not res.get("failed"), res.get("msg")
    assert sorted(r["pid"] for r in res["released"]) == workers and all(gone(w) for w in workers)


# --- 4. a container the node does not have ------------------------------------------------------------------
def test_gpu_release_refuses_a_container_the_node_does_not_have_as_the_fence_does(gpusim, collection):
    job = gpusim.hold(gpus=[0], mib=2048)
    said = {}
    for module, args in (("gpu_release", {}), ("proxmox_gpu_containers", {"state": "released"})):
        res = run_module(gpusim, collection, module, dict({"device_files": devices(gpusim), "containers": [999],
                                                           "pct": gpusim.path("bin", "pct")}, **args))
        print(module, res.get("msg"), res.get("warnings"))
        assert res.get("failed") and res["error"] == "no_such_container", res
        said[module] = res["msg"]
    assert said["gpu_release"] == said["proxmox_gpu_containers"]
    assert said["gpu_release"].startswith("containers: no container 999 on this node (its containers: ")
    assert said["gpu_release"].endswith("Nothing was stopped.")
    assert alive(job)


# --- 5. the README's two-task example -------------------------------------------------------------------------
def readme_play():
    """The README's play 'The modules in one play', as it is written."""
    with open(os.path.join(TOP, "README.md"), encoding="utf-8") as f:
        text = f.read()
    block = text.split("## The modules in one play", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    return yaml.safe_load(block)


def test_the_readmes_two_task_example_fails_fast_on_a_holder_the_release_left(gpusim, collection, tmp_path):
    host = gpusim
    host.ct_create(CT_README, "gpu-ct", "0-3", devices_style="lxc")
    host.ct_create(CT_OTHER, "gpu-b", "3", devices_style="lxc")
    for vmid in (CT_README, CT_OTHER):
        host.ct_start(vmid)
    server = host.hold(gpus=[0, 1, 2], mib=4096, ct=CT_README, tree=True, name="python3 -m sglang.launch_server")
    tenant = host.hold(gpus=[3], mib=2048, ct=CT_OTHER, name="python3 train.py")
    play = readme_play()
    (release_task,) = [t for t in play[0]["tasks"] if "gpuops.gpu.gpu_release" in t]
    assert release_task["gpuops.gpu.gpu_release"]["containers"] == [129]
    release_task["gpuops.gpu.gpu_release"]["containers"] = [CT_README]  # this machine's vmid for the README's 129
    play[0]["module_defaults"] = {"group/gpuops.gpu.gpu": {"device_files": devices(host)}}
    path = tmp_path / "readme.yml"
    path.write_text(yaml.safe_dump(play))
    inv = {"all": {"hosts": {"pve": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}
    started = time.monotonic()
    rc, out, _took = run_playbook(controller_env(collection, tmp_path, host.env()), tmp_path, str(path), inv, timeout=200)
    took = time.monotonic() - started
    fatal = [line for line in out.splitlines() if line.startswith("fatal: ")]
    assert rc != 0 and len(fatal) == 1, out[-4000:]
    print(f"took {took:.1f} s:", re.findall(r'"msg": "[^"]*"', fatal[0]))
    assert '"error": "blocked"' in fatal[0] and f"GPU 3 is used by pid {tenant} (python3) in CT {CT_OTHER}" in fatal[0]
    assert took < 60, f"the wait ran to its timeout (120 s): {took:.1f} s"
    assert gone(server) and alive(tenant)


# --- 6. the fence in check mode names a unit once -----------------------------------------------------------------
def test_the_fence_in_check_mode_stops_a_named_service_once(gpusim, collection):
    host = gpusim
    host.ct_create(CT_UNIT, hostname="gpu-ct", systemd=True)
    host.ct_start(CT_UNIT)
    server = host.hold(gpus="0-1", mib=4096, ct=CT_UNIT, tree=True, respawn=True, service="sglang")
    res = run_module(host, collection, "proxmox_gpu_containers",
                     {"device_files": devices(host), "containers": [CT_UNIT], "state": "released", "services": ["sglang"],
                      "pct": host.path("bin", "pct")}, check_mode=True)
    assert not res.get("failed"), res.get("msg")
    print("services_stopped:", res["services_stopped"], "release.stopped_units:", res["release"]["stopped_units"])
    assert [(s["vmid"], s["unit"]) for s in res["services_stopped"]] == [(CT_UNIT, "sglang")]
    assert res["release"]["stopped_units"] == [], res["release"]["stopped_units"]
    assert alive(server)
