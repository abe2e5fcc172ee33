"""What a workload holds (CUDA opens the node of every GPU it can see) and where gpusim's
processes live in cgroup2 (services in <base>/system.slice/NAME.service, the rest in a session
scope or lxc-attach's leaf), as tests/gpusim/README.md describes them.

Real processes, real cgroup2 directories, real signals.  vmids 9200-9249 are reserved for this
file (other suites run at the same time).
"""

import json
import os
import signal
import subprocess
import sys
import time
from typing import List, Optional

import pytest

GPUSIM = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if GPUSIM not in sys.path:
    sys.path.insert(0, GPUSIM)

from gpusimkit import cgroups, container  # noqa: E402
from gpusimkit.host import SimHost  # noqa: E402
from gpusimkit.scenario import ScenarioError  # noqa: E402

ALL8 = [f"nvidia{i}" for i in range(8)]
CONTROL = ["nvidia-uvm", "nvidiactl"]


# --- helpers ---------------------------------------------------------------------------------------

def dev_files(host: SimHost, pid: int) -> List[str]:
    devdir = host.path("dev") + "/"
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if t.startswith(devdir):
            out.append(t[len(devdir):])
    return sorted(out)


def nodes(*gpus: int) -> List[str]:
    return sorted([f"nvidia{g}" for g in gpus] + CONTROL)


def cg(pid) -> Optional[str]:
    return cgroups.of_pid(pid)


def children(pid: int) -> List[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="utf-8") as f:
        return [int(x) for x in f.read().split()]


def stat_fields(pid: int) -> List[str]:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        return f.read().rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    try:
        return stat_fields(pid)[0] not in ("Z", "X")
    except OSError:
        return False


def wait_for(cond, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def mainpid(host: SimHost, name: str, scope: str = "host") -> Optional[int]:
    try:
        with open(host.path("services", scope, f"{name}.mainpid"), encoding="utf-8") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def supervisor_host_pid(host: SimHost, name: str) -> int:
    """The host pid of a service's supervisor (the parent of its main process)."""
    return int(stat_fields(mainpid(host, name))[1])


def smi_apps(host: SimHost):
    """{gpu index: [pids]} from nvidia-smi --query-compute-apps (run on the host)."""
    uuids = {g["uuid"]: g["index"] for g in host.status()["gpus"]}
    p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory",
                        "--format=csv,noheader,nounits"], env=host.env(), capture_output=True, text=True,
                       timeout=60, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    out = {}
    for line in p.stdout.splitlines():
        pid, uuid, _mem = [x.strip() for x in line.split(",")]
        out.setdefault(uuids[uuid], []).append(int(pid))
    return out


NVML_APPS = """
import json, pynvml as N
N.nvmlInit()
out = {}
for i in range(N.nvmlDeviceGetCount()):
    procs = N.nvmlDeviceGetComputeRunningProcesses(N.nvmlDeviceGetHandleByIndex(i))
    out[i] = [p.pid for p in procs]
print(json.dumps(out))
"""


def nvml_apps(host: SimHost):
    """{gpu index: [pids]} from the real pynvml bindings over the simulated library."""
    env = dict(os.environ, LD_LIBRARY_PATH=host.path("lib"))
    env.pop("GPUSIM_DIR", None)
    p = subprocess.run([sys.executable, "-c", NVML_APPS], env=env, capture_output=True, text=True, timeout=60,
                       check=False)
    assert p.returncode == 0, p.stderr
    return {int(k): v for k, v in json.loads(p.stdout).items() if v}


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=GPUSIM)
    return subprocess.run([sys.executable, "-m", "gpusimkit.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def pct(host: SimHost, *args) -> subprocess.CompletedProcess:
    return subprocess.run([host.path("bin", "pct"), *map(str, args)], env=host.env(), capture_output=True,
                          text=True, timeout=120, check=False)


def lxc_dir(vmid: int) -> str:
    return os.path.join(cgroups.mount(), "lxc", str(vmid))


# --- device nodes ----------------------------------------------------------------------------------

def test_a_workload_on_gpu_7_holds_every_node_and_its_context_only_on_7(gpusim):
    pid = gpusim.hold([7], mib=8192)
    # CUDA opens the node of every GPU it can see (cupy/cupy#1930: `fuser -v /dev/nvidia*`
    # lists a process that uses device 0 on nvidia0..nvidia7).
    assert dev_files(gpusim, pid) == sorted(ALL8 + CONTROL)
    # ... while the driver lists its context, and its memory, only on GPU 7.
    assert smi_apps(gpusim) == {7: [pid]}
    assert nvml_apps(gpusim) == {7: [pid]}
    st = gpusim.status()
    assert [g["memory_used_mib"] for g in st["gpus"]] == [0] * 7 + [8192]
    assert [(p["gpu"], p["used_mib"]) for p in gpusim.procs()[0]] == [(7, 8192)]


MPS_APPS = """
import json, pynvml as N
N.nvmlInit()
out = {}
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    out[i] = {"compute": sorted(p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(h)),
              "mps": sorted(p.pid for p in N.nvmlDeviceGetMPSComputeRunningProcesses(h))}
print(json.dumps(out))
"""


def test_an_mps_daemon_starts_a_server_that_holds_every_gpu_it_serves(gpusim):
    # README "Workloads", MPS: the control daemon (no node, a session of its own) and its server child.
    control, server = gpusim.mps_daemon(gpus=[0, 1], mib=28)
    client = gpusim.hold(gpus=[1], mib=500, type="CM", name="python3 client.py")
    assert stat_fields(server)[1] == str(control)                      # the server is the daemon's child
    assert stat_fields(control)[3] == str(control)                     # -d: the leader of its own session
    assert dev_files(gpusim, control) == []
    with open(f"/proc/{server}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[0] == b"nvidia-cuda-mps-server"
    with open(f"/proc/{server}/comm", encoding="utf-8") as f:
        assert f.read().strip() == "nvidia-cuda-mps"                   # 15 bytes, as on a real host
    env = dict(os.environ, LD_LIBRARY_PATH=gpusim.path("lib"))
    env.pop("GPUSIM_DIR", None)
    p = subprocess.run([sys.executable, "-c", MPS_APPS], env=env, capture_output=True, text=True, timeout=60,
                       check=False)
    assert p.returncode == 0, p.stderr
    lists = {int(k): v for k, v in json.loads(p.stdout).items()}
    assert lists[0] == {"compute": [server], "mps": []}
    assert lists[1] == {"compute": sorted([server, client]), "mps": [client]}   # the client is M+C


def test_only_own_devices_keeps_the_old_behaviour(gpusim):
    own = gpusim.hold([7], mib=100, only_own_devices=True)
    assert dev_files(gpusim, own) == nodes(7)
    assert nvml_apps(gpusim) == {7: [own]}
    # In a tree each worker gets it too; without it every worker holds every node.
    parent = gpusim.hold([4, 5], mib=10, tree=True, only_own_devices=True)
    workers = sorted(children(parent), key=lambda w: [p["gpu"] for p in gpusim.procs()[0] if p["pid"] == w])
    assert [dev_files(gpusim, w) for w in workers] == [nodes(4), nodes(5)]
    assert dev_files(gpusim, parent) == ["nvidiactl"]  # the API parent, as before
    parent2 = gpusim.hold([0, 1], mib=10, tree=True)
    assert all(dev_files(gpusim, w) == sorted(ALL8 + CONTROL) for w in children(parent2))
    # The CLI's switch.
    r = cli("hold", "--dir", gpusim.dir, "--gpus", "6", "--mib", "10", "--only-own-devices")
    assert r.returncode == 0, r.stderr
    assert dev_files(gpusim, int(r.stdout)) == nodes(6)
    r = cli("hold", "--dir", gpusim.dir, "--gpus", "6", "--mib", "10")
    assert dev_files(gpusim, int(r.stdout)) == sorted(ALL8 + CONTROL)


def test_device_only_still_holds_exactly_its_nodes(gpusim):
    pid = gpusim.hold([6], mib=1024, device_only=True)
    assert dev_files(gpusim, pid) == ["nvidia6", "nvidiactl"]
    assert gpusim.procs()[0] == []


def test_a_container_workload_holds_only_the_nodes_of_its_config(gpusim):
    gpusim.ct_create(9201, gpus=[2, 3], systemd=True)
    gpusim.ct_start(9201)
    try:
        keys, raw = container.read_config(gpusim.dir, 9201)
        assert [v.split()[0] for k, v in raw if k == "lxc.mount.entry"][:2] == ["/dev/nvidia2", "/dev/nvidia3"]
        pid = gpusim.hold([2], mib=4096, ct=9201)
        assert dev_files(gpusim, pid) == nodes(2, 3)
        assert nvml_apps(gpusim) == {2: [pid]}
        # a tree and a service in it: every CUDA process sees GPUs 2 and 3
        parent = gpusim.hold([2, 3], mib=10, ct=9201, tree=True)
        assert [dev_files(gpusim, w) for w in children(parent)] == [nodes(2, 3)] * 2
        svc = gpusim.hold([3], mib=10, ct=9201, service="vllm", respawn=True)
        assert dev_files(gpusim, svc) == nodes(2, 3)
        # only_own_devices inside a container: its own GPU's node
        own = gpusim.hold([3], mib=10, ct=9201, only_own_devices=True)
        assert dev_files(gpusim, own) == nodes(3)
    finally:
        container.stop(gpusim.dir, 9201)


def test_a_container_with_devn_entries_and_one_without_gpus(gpusim):
    container.create(gpusim.dir, 9202, gpus=[5, 6, 7], devices_style="dev")
    keys, _raw = container.read_config(gpusim.dir, 9202)
    assert keys["dev0"] == "/dev/nvidia5"
    container.start(gpusim.dir, 9202)
    container.create(gpusim.dir, 9203, gpus=None)
    container.start(gpusim.dir, 9203)
    try:
        assert dev_files(gpusim, gpusim.hold([6], mib=10, ct=9202)) == nodes(5, 6, 7)
        # a config without NVIDIA lines: only the nodes of its own GPU (it can have no others)
        assert dev_files(gpusim, gpusim.hold([1], mib=10, ct=9203)) == nodes(1)
    finally:
        container.stop(gpusim.dir, 9202)
        container.stop(gpusim.dir, 9203)


def test_a_control_only_workload_holds_only_the_control_nodes(gpusim):
    mon = gpusim.hold(None, control_only=True, name="monitor.py")
    assert dev_files(gpusim, mon) == CONTROL
    exporter = gpusim.hold([3], mib=16, control_only=True, name="exporter")  # gpus and mib are ignored
    assert dev_files(gpusim, exporter) == CONTROL
    assert gpusim.procs()[0] == []  # nothing registered with the driver
    assert smi_apps(gpusim) == {} and nvml_apps(gpusim) == {}
    assert [g["memory_used_mib"] for g in gpusim.status()["gpus"]] == [0] * 8
    # hold(None) without it is a CUDA process with no context: every node, nothing registered.
    bare = gpusim.hold(None)
    assert dev_files(gpusim, bare) == sorted(ALL8 + CONTROL) and gpusim.procs()[0] == []
    r = cli("hold", "--dir", gpusim.dir, "--gpus", "none", "--control-only")
    assert r.returncode == 0, r.stderr
    assert dev_files(gpusim, int(r.stdout)) == CONTROL
    with pytest.raises(ScenarioError, match="control_only"):
        gpusim.hold([0], control_only=True, tree=True)
    with pytest.raises(ScenarioError, match="control_only"):
        gpusim.hold([0], control_only=True, device_only=True)
    gpusim.ct_create(9204, gpus=[0])
    gpusim.ct_start(9204)
    try:
        assert dev_files(gpusim, gpusim.hold(None, ct=9204, control_only=True)) == CONTROL
    finally:
        container.stop(gpusim.dir, 9204)


# --- cgroups on the host ---------------------------------------------------------------------------

def test_host_processes_live_in_the_scenarios_cgroup(gpusim):
    st = gpusim.status()["cgroup"]
    base = "/" + cgroups.host_name(gpusim.dir)
    assert st["base"] == base and st["path"] == os.path.join(cgroups.mount(), base[1:])
    plain = gpusim.hold([0], mib=10)
    session = f"{base}/user.slice/user-0.slice/session-1.scope"
    assert cg(plain) == session == st["session"]
    parent = gpusim.hold([1, 2], mib=10, tree=True)
    assert {cg(p) for p in [parent, *children(parent)]} == {session}  # workers inherit it
    # The driver daemon is not part of the simulated machine: it stays where it was started.
    assert cg(gpusim.daemon_pid()) == cg("self")
    svc = gpusim.hold([3], mib=10, service="vllm", respawn=True, restart_delay=0.1)
    unit = f"{base}/system.slice/vllm.service"
    assert cg(svc) == unit
    with open(f"/proc/{svc}/cgroup", encoding="utf-8") as f:
        assert f"0::{unit}\n" in f.read()
    sup = supervisor_host_pid(gpusim, "vllm")
    assert cg(sup) == f"{base}/init.scope"  # the service manager, as systemd's PID 1
    r = gpusim.systemctl("status", "vllm")
    assert f"     CGroup: {unit}" in r.stdout.splitlines()
    # `systemctl` on the host's PATH (DIR/bin) is the simulated host's, not the machine's.
    r = subprocess.run(["systemctl", "is-active", "vllm.service"], env=gpusim.env(), capture_output=True,
                       text=True, timeout=60, check=False)
    assert (r.returncode, r.stdout) == (0, "active\n")
    # A respawned workload is in the same unit cgroup.
    os.kill(svc, signal.SIGKILL)
    new = wait_for(lambda: (mainpid(gpusim, "vllm") or svc) != svc and mainpid(gpusim, "vllm"), what="respawn")
    assert cg(new) == unit
    assert cgroups.procs(st["path"] + "/system.slice/vllm.service") == [new]


def test_systemctl_stop_kills_every_process_of_the_unit(gpusim):
    pid = gpusim.hold([0], mib=10, service="trainer", respawn=True, fork_child=True, restart_delay=0.1)
    (child,) = children(pid)
    # The child left the workload's session and process group: only the cgroup reaches it.
    f, c = stat_fields(pid), stat_fields(child)
    assert c[2] != f[2] and c[3] != f[3]  # pgrp, session
    assert cg(child) == cg(pid) and cg(pid).endswith("/system.slice/trainer.service")
    assert dev_files(gpusim, child) == sorted(ALL8 + CONTROL)  # inherited, no context
    assert [p["pid"] for p in gpusim.procs()[0]] == [pid]
    # The main process dies: what is left of the unit is killed before the respawn.
    os.kill(pid, signal.SIGKILL)
    new = wait_for(lambda: (mainpid(gpusim, "trainer") or pid) != pid and mainpid(gpusim, "trainer"), what="respawn")
    wait_for(lambda: not alive(child), timeout=5, what="the old child to die")
    (child2,) = children(new)
    r = gpusim.systemctl("stop", "trainer")
    assert (r.returncode, r.stderr) == (0, "")
    assert not alive(new) and not alive(child2)
    unit = os.path.join(gpusim.status()["cgroup"]["path"], "system.slice", "trainer.service")
    assert not os.path.exists(unit)  # removed with the unit, as systemd does
    assert gpusim.systemctl("is-active", "trainer").returncode == 3


def test_systemctl_stop_empties_the_unit_even_without_its_supervisor(gpusim):
    pid = gpusim.hold([0], mib=10, service="orphaned", respawn=True, fork_child=True, ignore_term=True,
                      stop_timeout=0.5)
    (child,) = children(pid)
    sup = supervisor_host_pid(gpusim, "orphaned")
    gpusim.kill(sup)  # the supervisor dies; its workload and the child stay in the unit's cgroup
    assert alive(pid) and alive(child)
    t0 = time.monotonic()
    r = gpusim.systemctl("stop", "orphaned")
    assert r.returncode == 0, r.stderr
    assert 0.4 <= time.monotonic() - t0 < 5  # SIGTERM (ignored), the stop timeout, SIGKILL
    wait_for(lambda: not alive(pid) and not alive(child), timeout=5, what="the unit to be empty")


# --- cgroups in a container ------------------------------------------------------------------------

def test_container_services_and_commands_live_where_pve_puts_them(gpusim):
    gpusim.ct_create(9228, gpus="all")
    gpusim.ct_start(9228)
    gpusim.ct_create(9229, gpus="all", systemd=True)
    gpusim.ct_start(9229)
    try:
        # busybox's init: the container's cgroup itself; systemd as PID 1: init.scope (real LXC, PVE's layout)
        assert cg(container.init_pid(gpusim.dir, 9228)[0]) == "/lxc/9228/ns"
        init = container.init_pid(gpusim.dir, 9229)[0]
        assert cg(init) == "/lxc/9229/ns/init.scope"
        svc = gpusim.hold([1], mib=10, ct=9229, service="vllm", respawn=True, fork_child=True, restart_delay=0.1)
        assert cg(svc) == "/lxc/9229/ns/system.slice/vllm.service"
        with open(f"/proc/{svc}/cgroup", encoding="utf-8") as f:
            assert "0::/lxc/9229/ns/system.slice/vllm.service\n" in f.read()
        (child,) = children(svc)
        assert cg(child) == cg(svc)
        assert int(stat_fields(svc)[1]) == init  # its parent: systemd, the container's PID 1
        r = pct(gpusim, "exec", 9229, "--", "systemctl", "show", "-p", "MainPID", "--value", "vllm")
        with open(f"/proc/{svc}/status", encoding="utf-8") as f:
            nspid = [ln.split()[-1] for ln in f if ln.startswith("NSpid:")]
        assert r.stdout.strip() == nspid[0]
        # a plain hold and pct exec: lxc-attach's leaf of the container's cgroup; inside, the
        # container's cgroup namespace shows it as /.lxc
        plain = gpusim.hold([2], mib=10, ct=9229)
        assert cg(plain) == "/lxc/9229/ns/.lxc"
        r = pct(gpusim, "exec", 9229, "--", "cat", "/proc/self/cgroup")
        assert "0::/.lxc" in r.stdout.splitlines(), r.stdout
        # systemctl inside the container stops the whole unit, the forked child included
        r = pct(gpusim, "exec", 9229, "--", "systemctl", "status", "--no-pager", "vllm")
        assert "     CGroup: /system.slice/vllm.service" in r.stdout.splitlines(), r.stdout
        r = pct(gpusim, "exec", 9229, "--", "systemctl", "stop", "vllm")
        assert (r.returncode, r.stderr) == (0, "")
        wait_for(lambda: not alive(svc) and not alive(child), timeout=5, what="the unit to stop")
        assert alive(plain)
        assert not os.path.exists(os.path.join(lxc_dir(9229), "ns", "system.slice", "vllm.service"))
    finally:
        container.stop(gpusim.dir, 9228)
        container.stop(gpusim.dir, 9229)
    assert not os.path.exists(lxc_dir(9229))  # the nested cgroups went with it


def test_container_shutdown_removes_its_nested_cgroups(gpusim):
    gpusim.ct_create(9230, gpus=[0], systemd=True)
    gpusim.ct_start(9230)
    gpusim.hold([0], mib=10, ct=9230, service="a", respawn=True)
    gpusim.hold([0], mib=10, ct=9230, service="b", fork_child=True)
    gpusim.hold([0], mib=10, ct=9230)
    dirs = {os.path.relpath(d, lxc_dir(9230)) for d, _s, _f in os.walk(lxc_dir(9230))}
    assert {"ns", "ns/.lxc", "ns/init.scope", "ns/system.slice", "ns/system.slice/a.service",
            "ns/system.slice/b.service"} <= dirs
    r = pct(gpusim, "shutdown", 9230, "--timeout", "20")
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(lxc_dir(9230))
    assert not [d for d in container.lxc_cgroups(9230) if os.path.exists(d)]  # every hierarchy, the monitor's too


def test_down_leaves_no_cgroup_directory(gpusim_factory):
    host = gpusim_factory()
    base = host.status()["cgroup"]["path"]
    host.hold([0], mib=10)
    host.hold([1], mib=10, service="svc", respawn=True, fork_child=True, ignore_term=True)
    host.hold([2], mib=10, fork_child=True)
    host.ct_create(9231, gpus=[3], systemd=True)
    host.ct_start(9231)
    host.hold([3], mib=10, ct=9231, service="ctsvc", respawn=True, fork_child=True)
    host.hold([3], mib=10, ct=9231)
    assert os.path.isdir(os.path.join(base, "system.slice", "svc.service"))
    in_cgroups = cgroups.procs(base, recursive=True) + cgroups.procs(lxc_dir(9231), recursive=True)
    assert len(in_cgroups) >= 8
    report = host.down()
    assert report["errors"] == [] and report["left"] == []
    assert not os.path.exists(base) and not os.path.exists(lxc_dir(9231))
    assert not [d for d in container.lxc_cgroups(9231) if os.path.exists(d)]
    assert not any(alive(p) for p in in_cgroups)
    assert not [d for d in os.listdir(cgroups.mount()) if d == cgroups.host_name(host.dir)]
