"""The holding model against real processes (docs/holding-model.md, plugins/module_utils/_holding.py).

Each test starts its own simulated host; only processes the simulator (or the test) started are
ever signalled, and every test checks that what is outside the scope is still alive.
"""

import os
import socket
import subprocess
import sys
import time

from modrun import alive, gone, run_module


def run(host, collection, module, **args):
    """One module run against the host, its simulated device files scanned."""
    args.setdefault("device_files", devices(host))
    return run_module(host, collection, module, args)


def devices(host):
    return [host.dir + "/dev/nvidia*"]


def children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return out


def test_a_monitor_holding_only_control_nodes_survives_a_container_release(gpusim, collection):
    gpusim.ct_create(129)
    gpusim.ct_start(129)
    server = gpusim.hold(gpus="all", mib=4096, ct=129, tree=True)
    monitor = gpusim.hold(gpus=None, ct=129, control_only=True, name="monitor.py")
    facts = run(gpusim, collection, "gpu_facts")
    g0 = facts["ansible_facts"]["gpu_devices"][0]
    assert monitor in g0["holders"]["control"], g0["holders"]
    res = run(gpusim, collection, "gpu_release", containers=[129], grace_period=5)
    assert not res.get("failed"), res.get("msg")
    released = {r["pid"] for r in res["released"]}
    assert server in released and monitor not in released
    assert any(s["pid"] == monitor and "Name it in pids" in s["reason"] for s in res["skipped_processes"])
    assert alive(monitor)
    # It never blocks a wait either.
    wait = run(gpusim, collection, "gpu_wait_idle", timeout=20, settle=0.5)
    assert not wait.get("failed") and wait["idle_gpus"], wait.get("msg")
    assert alive(monitor)
    # Named in pids, it is released, and the result says why.
    res = run(gpusim, collection, "gpu_release", containers=[129], pids=[monitor], grace_period=5)
    (entry,) = [r for r in res["released"] if r["pid"] == monitor]
    assert entry["evidence"] == "control" and "named in pids" in entry["why"]
    assert gone(monitor)


def test_a_job_on_gpu_7_holding_every_node_survives_a_release_of_gpus_0_to_6(gpusim, collection):
    job = gpusim.hold(gpus=[7], mib=8192)             # CUDA opens every node it can see
    victims = [gpusim.hold(gpus=[i], mib=1024) for i in range(7)]
    facts = run(gpusim, collection, "gpu_facts")
    holders0 = {pid: evidence for evidence, pids in facts["ansible_facts"]["gpu_devices"][0]["holders"].items() for pid in pids}
    assert holders0.get(job) == "lingering", holders0  # a device holder with no context here: keeps nothing busy
    for victim in victims:
        os.kill(victim, 0)
    res = run(gpusim, collection, "gpu_release", gpus=[str(i) for i in range(7)], grace_period=5)
    assert not res.get("failed"), res.get("msg")
    assert {r["pid"] for r in res["released"]} >= set(victims)
    assert job not in {r["pid"] for r in res["released"]}
    (why,) = [s["reason"] for s in res["skipped_processes"] if s["pid"] == job]
    assert "only on GPU(s) 7" in why
    assert alive(job) and all(gone(v) for v in victims)
    wait = run(gpusim, collection, "gpu_wait_idle", gpus=[str(i) for i in range(7)], timeout=20, settle=0.5)
    assert not wait.get("failed") and wait["idle_gpus"], wait.get("msg")
    assert alive(job)


SERVER = r"""
import os, socket, subprocess, sys, time
port = socket.socket(); port.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
port.bind(("127.0.0.1", 0)); port.listen(1)
print(port.getsockname()[1], flush=True)
worker = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); time.sleep(120)",
                           sys.argv[1]])
time.sleep(120)
"""


def test_a_hand_started_server_whose_api_process_holds_no_device_file_is_stopped_whole(gpusim, collection, tmp_path):
    # The API process (listening on a port) never opens a device node; its worker holds /dev/nvidia3
    # and has 2 GiB there. Started from this test, in its own session: the session leader is the
    # workload's root.
    proc = subprocess.Popen([sys.executable, "-c", SERVER, gpusim.dir + "/dev/nvidia3"], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        port = int(proc.stdout.readline())
        deadline = time.monotonic() + 10
        while not children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (worker,) = children(proc.pid)
        time.sleep(0.3)  # the worker opens the node
        gpusim.register(worker, {3: 2048})
        bystander = gpusim.hold(gpus=[3], mib=16, control_only=True, name="exporter")
        res = run(gpusim, collection, "gpu_release", gpus=["3"], grace_period=5)
        assert not res.get("failed"), res.get("msg")
        released = {r["pid"]: r for r in res["released"]}
        assert worker in released and proc.pid in released, res
        assert "same cgroup" in released[proc.pid]["why"] and released[proc.pid]["via"] == worker
        proc.wait(timeout=10)
        assert gone(worker)
        with socket.socket() as s:  # the server's port is free again
            s.bind(("127.0.0.1", port))
        assert alive(bystander)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


ZOMBIE_LEADER = r"""
import ctypes, sys, threading, time
held = open(sys.argv[1])
threading.Thread(target=time.sleep, args=(120,)).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)   # the main thread (the leader) exits; the other thread runs on
"""


def test_a_holder_whose_leader_thread_exited_is_found_and_released(gpusim, collection):
    proc = subprocess.Popen([sys.executable, "-c", ZOMBIE_LEADER, gpusim.dir + "/dev/nvidia5"], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/stat", encoding="utf-8") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.05)
        assert os.listdir(f"/proc/{proc.pid}/fd") == []  # only the other thread's table shows the node
        gpusim.register(proc.pid, {5: 1024})   # its live thread has a context on GPU 5
        facts = run(gpusim, collection, "gpu_facts", gpus=["5"])
        g5 = facts["ansible_facts"]["gpu_devices"][0]
        assert [p["pid"] for p in g5["processes"]] == [proc.pid] and not g5["idle"], g5["busy_reasons"]
        assert proc.pid in g5["holders"]["context"], g5["holders"]
        res = run(gpusim, collection, "gpu_release", gpus=["5"], grace_period=5)
        assert proc.pid in {r["pid"] for r in res["released"]}, res
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def services_pids(host, name, ct):
    """The host pid of a service's main process in container ``ct`` (systemd's MainPID), else None."""
    return host.service_mainpid(name, ct=ct)


def test_a_supervised_service_is_stopped_through_its_unit_and_stays_down(gpusim_factory, collection):
    host = gpusim_factory(release_lag_ms=0)
    host.ct_create(129, systemd=True)
    host.ct_start(129)
    first = host.hold(gpus=[0, 1], mib=4096, ct=129, service="sglang", respawn=True, restart_delay=0.3)
    facts = run(host, collection, "gpu_facts")
    (proc,) = [p for p in facts["ansible_facts"]["gpu_devices"][0]["processes"] if p["pid"] == first]
    assert proc["unit"] == "sglang.service" and proc["container"]["id"] == 129
    res = run(host, collection, "gpu_release", containers=[129], grace_period=5)
    assert not res.get("failed"), res.get("msg")
    (unit,) = res["stopped_units"]
    assert (unit["unit"], unit["container"], unit["rc"]) == ("sglang.service", 129, 0)
    assert unit["command"][-6:] == ["exec", "129", "--", "systemctl", "stop", "sglang.service"]
    assert gone(first)
    time.sleep(1.0)  # longer than the restart delay: a supervisor that could restart it would have
    assert services_pids(host, "sglang", 129) is None
    wait = run(host, collection, "gpu_wait_idle", timeout=10, settle=0.5)
    assert not wait.get("failed"), wait.get("msg")


def test_without_stop_units_the_result_names_the_unit_and_the_supervisor(gpusim_factory, collection):
    host = gpusim_factory(release_lag_ms=0)
    host.ct_create(129, systemd=True)
    host.ct_start(129)
    first = host.hold(gpus=[0], mib=4096, ct=129, service="sglang", respawn=True, restart_delay=0.2)
    res = run(host, collection, "gpu_release", containers=[129], grace_period=5, stop_units=False)
    assert res["stopped_units"] == []
    deadline = time.monotonic() + 10
    while services_pids(host, "sglang", 129) in (None, first) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not res["respawned"]:  # the supervisor may restart it after the module's last look: look again
        res = run(host, collection, "gpu_release", containers=[129], grace_period=5, stop_units=False)
    assert res["respawned"], res
    advice = res["respawned"][0]["advice"]
    assert "sglang.service in CT 129" in advice and "supervisor restarted it" in advice, advice
    assert "stop_units" in advice
    host.systemctl("stop", "sglang", ct=129)


def test_an_unscoped_release_over_two_containers_fails_and_signals_nothing(gpusim_factory, collection):
    host = gpusim_factory()
    for vmid in (129, 130):
        host.ct_create(vmid)
        host.ct_start(vmid)
    a = host.hold(gpus=[0], mib=2048, ct=129)
    b = host.hold(gpus=[1], mib=2048, ct=130)
    res = run(host, collection, "gpu_release", grace_period=5)
    assert res.get("failed") and "2 places" in res["msg"] and "Nothing was signalled" in res["msg"], res.get("msg")
    assert res["places"] == {"CT 129": [a], "CT 130": [b]}
    assert alive(a) and alive(b)
    res = run(host, collection, "gpu_release", grace_period=5, containers=[130])
    assert not res.get("failed") and gone(b) and alive(a)


def test_device_files_that_name_other_files_fail_before_anything_is_scanned(gpusim, collection):
    holder = gpusim.hold(gpus=[0], mib=1024)
    for pattern in ("/dev/null*", "/dev/*", "/dev/pts/*"):
        res = run(gpusim, collection, "gpu_release", device_files=[pattern])
        assert res.get("failed") and "device_files" in res["msg"] and "allow_any_device_files" in res["msg"], res
        assert "released" not in res or res["released"] == []
    assert alive(holder)


def test_a_process_merely_named_nvidia_smi_holding_memory_is_not_protected(gpusim, collection):
    impostor = gpusim.hold(gpus=[2], mib=2048, name="nvidia-smi")
    res = run(gpusim, collection, "gpu_release", gpus=["2"], grace_period=5)
    assert not res.get("failed"), res.get("msg")
    (entry,) = [r for r in res["released"] if r["pid"] == impostor]
    assert "not the daemon's" in entry["why"]
    assert gone(impostor)


FORK_ON_TERM = r"""
import os, signal, sys, time
held = open(sys.argv[1])
def on_term(*_):
    if os.fork() == 0:      # the child inherits the device node and keeps it
        time.sleep(120)
        os._exit(0)
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(120)
"""


def test_a_child_forked_in_a_sigterm_handler_is_released_too(gpusim, collection):
    proc = subprocess.Popen([sys.executable, "-c", FORK_ON_TERM, gpusim.dir + "/dev/nvidia4"], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        gpusim.register(proc.pid, {4: 1024})
        res = run(gpusim, collection, "gpu_release", gpus=["4"], grace_period=5)
        assert not res.get("failed"), res.get("msg")
        forked = [r for r in res["released"] if "appeared during the release" in (r.get("why") or "")]
        assert forked, [(r["pid"], r.get("why"), r["signals"]) for r in res["released"]] + [proc.pid]
        for r in forked:
            assert gone(r["pid"])
        assert res["respawned"] == []
        facts = run(gpusim, collection, "gpu_facts", gpus=["4"])
        assert facts["ansible_facts"]["gpu_devices"][0]["holders"] == {"context": [], "device": [], "control": [], "lingering": []}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
