"""Tests of the host side of the simulator: the driver daemon, workloads, the supervisor and
systemctl stand-in, SimHost, the gpusim CLI and the pytest fixture.

Only host-side workloads here (containers have their own tests).  Every process is started
through SimHost (so recorded in DIR/run/owned and killed by the fixture's teardown) or is a
child of the test that the test kills and reaps itself.

Run:  /tmp/v312/bin/python -m pytest tests/gpusim/tests -k host
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional

import pytest

GPUSIM = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if GPUSIM not in sys.path:
    sys.path.insert(0, GPUSIM)

from gpusimkit import proctools  # noqa: E402
from gpusimkit import scenario as scn  # noqa: E402
from gpusimkit.host import SimError, SimHost  # noqa: E402
from gpusimkit.scenario import ScenarioError  # noqa: E402

CLI = os.path.join(GPUSIM, "gpusim")


def wait_for(cond: Callable[[], object], timeout: float = 5.0, step: float = 0.002) -> object:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)


def proc_lines(host: SimHost, pid: Optional[int] = None) -> List[Dict]:
    procs, _exits = host.procs()
    return [p for p in procs if pid is None or p["pid"] == pid]


def exit_ns(host: SimHost, pid: int) -> Optional[int]:
    _procs, exits = host.procs()
    for (p, _s), ns in exits.items():
        if p == pid:
            return ns
    return None


def fd_targets(pid: int) -> List[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def dev_files(host: SimHost, pid: int) -> List[str]:
    devdir = host.path("dev") + "/"
    return sorted(t[len(devdir):] for t in fd_targets(pid) if t.startswith(devdir))


def children(pid: int) -> List[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="utf-8") as f:
        return [int(x) for x in f.read().split()]


def gone(pid: int) -> bool:
    """No /proc entry at all: exited AND reaped (real code that polls kill(pid, 0) sees it gone)."""
    return not os.path.exists(f"/proc/{pid}")


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPUSIM_PYTHON=sys.executable)
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120, env=env, check=False)


# --- the driver daemon --------------------------------------------------------------------------

def test_host_daemon_records_registration_exit_and_release(gpusim_factory):
    host = gpusim_factory(gpus=2, release_lag_ms=600)
    pid = host.hold([0, 1], mib=4096)
    lines = proc_lines(host, pid)
    start = proctools.starttime(pid)
    assert [(p["gpu"], p["types"], p["used_mib"]) for p in lines] == [(0, "C", 4096), (1, "C", 4096)]
    for p in lines:
        assert p["starttime"] == start
        assert p["pidns"] == scn.pidns_inode("self")  # a host process: the host's PID namespace
        assert p["nspid"] == pid
    assert exit_ns(host, pid) is None

    t_kill = time.monotonic_ns()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: exit_ns(host, pid), timeout=0.1, step=0.001)
    seen = time.monotonic_ns()
    ex = exit_ns(host, pid)
    assert t_kill <= ex <= t_kill + 100_000_000, (ex - t_kill) / 1e6
    assert seen - t_kill < 100_000_000
    # The daemon is a child subreaper: the killed workload does not linger as a zombie.
    wait_for(lambda: gone(pid), timeout=1.0)

    # Kept until release_lag_ms after the exit, then dropped.
    time.sleep(max(0.0, (ex + 450_000_000 - time.monotonic_ns()) / 1e9))
    assert len(proc_lines(host, pid)) == 2, "dropped before the release lag passed"
    wait_for(lambda: not proc_lines(host, pid), timeout=1.0)
    dropped = time.monotonic_ns()
    assert dropped - ex >= 600_000_000
    assert dropped - ex < 900_000_000
    assert exit_ns(host, pid) is None


def test_host_release_lag_change_applies_to_pending_exits(gpusim_factory):
    host = gpusim_factory(gpus=1, release_lag_ms=60_000)
    pid = host.hold(0, mib=100)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: exit_ns(host, pid))
    time.sleep(0.2)
    assert proc_lines(host, pid)
    host.fault(release_lag_ms=100)
    wait_for(lambda: not proc_lines(host, pid), timeout=1.0)


def test_host_alloc_pid_registers_another_process(gpusim_factory):
    host = gpusim_factory(gpus=2, release_lag_ms=200)
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert host.register(child.pid, {0: 100, 1: 200}, types="GC") == child.pid
        lines = proc_lines(host, child.pid)
        assert [(p["gpu"], p["types"], p["used_mib"]) for p in lines] == [(0, "CG", 100), (1, "CG", 200)]
        assert lines[0]["starttime"] == proctools.starttime(child.pid)
        # Registering again updates the usage.
        host.register(child.pid, {1: 300})
        assert [(p["gpu"], p["types"], p["used_mib"]) for p in proc_lines(host, child.pid)] == [
            (0, "CG", 100), (1, "C", 300)]
        t_kill = time.monotonic_ns()
        child.kill()
        wait_for(lambda: exit_ns(host, child.pid), timeout=0.1, step=0.001)
        assert exit_ns(host, child.pid) - t_kill < 100_000_000
    finally:
        child.kill()
        child.wait()
    wait_for(lambda: not proc_lines(host, child.pid), timeout=2.0)


def test_host_alloc_pid_errors(gpusim_factory):
    host = gpusim_factory(gpus=2)
    child = subprocess.Popen(["sleep", "60"])
    try:
        with pytest.raises(proctools.DriverError, match="gpu=2"):
            host.register(child.pid, {2: 100})
        with pytest.raises(proctools.DriverError, match="types"):
            host.register(child.pid, {0: 100}, types="X")
        with pytest.raises(proctools.DriverError, match="mib"):
            host.register(child.pid, {0: -5})
        with pytest.raises(proctools.DriverError, match="unknown request"):
            proctools.driver_request(host.dir, "bogus 1 2")
        assert not proc_lines(host)
    finally:
        child.kill()
        child.wait()
    # A process that is already gone.
    with pytest.raises(proctools.DriverError, match="no such process"):
        host.register(child.pid, {0: 100})
    assert proctools.driver_request(host.dir, "ping") == ""


def test_host_alloc_and_free_by_the_caller(gpusim_factory):
    host = gpusim_factory(gpus=3)
    me = os.getpid()
    try:
        assert proctools.driver_request(host.dir, "alloc M 0:10,2:30") == str(me)
        assert proctools.driver_request(host.dir, "whoami") == str(me)
        assert [(p["gpu"], p["types"]) for p in proc_lines(host, me)] == [(0, "M"), (2, "M")]
        assert proctools.driver_request(host.dir, "free 0") == ""
        assert [p["gpu"] for p in proc_lines(host, me)] == [2]
        assert host.status()["gpus"][2]["memory_used_mib"] == 30
    finally:
        proctools.driver_request(host.dir, "free")
    assert proc_lines(host, me) == []
    assert exit_ns(host, me) is None  # freed, not exited
    assert host.status()["gpus"][2]["memory_used_mib"] == 0


# --- workloads ----------------------------------------------------------------------------------

def test_host_workload_holds_device_files_and_memory(gpusim_factory):
    host = gpusim_factory(gpus=4)
    pid = host.hold("1,3", mib=512, type="CG")
    # CUDA's behaviour (the default): the node of every GPU of the host, its contexts on 1 and 3 only.
    assert dev_files(host, pid) == ["nvidia-uvm", "nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl"]
    assert [(p["gpu"], p["types"], p["used_mib"]) for p in proc_lines(host, pid)] == [(1, "CG", 512), (3, "CG", 512)]
    # only_own_devices: the simulator's old behaviour, the nodes of its own GPUs only.
    own = host.hold("1,3", mib=1, only_own_devices=True)
    assert dev_files(host, own) == ["nvidia-uvm", "nvidia1", "nvidia3", "nvidiactl"]
    st = host.status()
    assert [g["memory_used_mib"] for g in st["gpus"]] == [0, 513, 0, 513]
    assert st["gpus"][1]["pids"] == sorted([pid, own])
    assert (pid, proctools.starttime(pid)) in proctools.read_owned(host.dir)


def test_host_device_only_daemon_like_persistenced(gpusim):
    pid = gpusim.hold(None, name="nvidia-persistenced", device_only=True)
    assert dev_files(gpusim, pid) == ["nvidiactl"]
    assert proc_lines(gpusim, pid) == []
    with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
        assert f.read().strip() == "nvidia-persiste"  # the kernel keeps 15 bytes
    assert proctools.cmdline(pid) == ["nvidia-persistenced"]
    # Device files of GPUs, still no memory.
    pid2 = gpusim.hold([0, 1], device_only=True)
    assert dev_files(gpusim, pid2) == ["nvidia0", "nvidia1", "nvidiactl"]
    assert proc_lines(gpusim, pid2) == []


def test_host_name_sets_comm_and_cmdline(gpusim):
    # only_own_devices: the nodes of its own GPU only (the default would open all eight)
    pid = gpusim.hold([2], mib=100, name="python3 -m vllm.entrypoints.openai.api_server", only_own_devices=True)
    with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
        assert f.read().strip() == "python3"
    cmd = proctools.cmdline(pid)
    assert cmd[0] == "python3"
    assert cmd[-2:] == ["-m", "vllm.entrypoints.openai.api_server"]
    ps = subprocess.run(["ps", "-o", "comm=", "-p", str(pid)], capture_output=True, text=True, check=False)
    assert ps.stdout.strip() == "python3"
    assert [p["gpu"] for p in proc_lines(gpusim, pid)] == [2]
    assert dev_files(gpusim, pid) == ["nvidia-uvm", "nvidia2", "nvidiactl"]


def test_host_title_renames_a_running_process_as_setproctitle_does(gpusim, monkeypatch):
    # vLLM's workers (README "Workloads", --title): the argv area rewritten in place, NUL-padded; comm set
    monkeypatch.setenv("GPUSIM_WORKER_TITLE", "VLLM::Worker_TP{i}")
    parent = gpusim.hold([0, 1], mib=100, tree=True, name="python3 -m vllm.entrypoints.openai.api_server")
    workers = sorted(children(parent), key=lambda w: proc_lines(gpusim, w)[0]["gpu"])
    for i, w in enumerate(workers):
        with open(f"/proc/{w}/cmdline", "rb") as f:
            raw = f.read()
        assert raw.startswith(f"VLLM::Worker_TP{i}\0".encode()) and set(raw[len(f"VLLM::Worker_TP{i}"):]) == {0}
        with open(f"/proc/{w}/comm", encoding="utf-8") as f:
            assert f.read().strip() == "VLLM::Worker_TP"  # 15 bytes
    assert proctools.cmdline(parent)[-2:] == ["-m", "vllm.entrypoints.openai.api_server"]  # the API server keeps its


VMID_LOCKED = 9197


def test_host_unprivileged_container_workloads_start_when_the_checkout_is_out_of_reach(gpusim, tmp_path, monkeypatch):
    """A checkout cloned under a folder only root may enter (root's home, a `mktemp -d` folder: mode 0700). Before,
    an unprivileged container's root (node uid 100000) could not reach the simulator there: every workload of it
    failed with "the workload did not start (CT N): no readiness message within 30 s" and an empty log (issue 33,
    item 6). Its workloads now import a copy of gpusimkit from the scenario directory."""
    from gpusimkit import container  # noqa: PLC0415

    locked = tmp_path / "root-only"
    locked.mkdir(mode=0o700)
    kit = locked / "checkout" / "tests" / "gpusim"
    shutil.copytree(os.path.join(proctools.KIT_ROOT, "gpusimkit"), kit / "gpusimkit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    gpusim.ct_create(VMID_LOCKED, unprivileged=True)
    for module in (container, proctools):
        monkeypatch.setattr(module, "KIT_ROOT", str(kit))  # the simulator as that checkout has it
    monkeypatch.delenv("PYTHONPATH", raising=False)
    gpusim.ct_start(VMID_LOCKED)
    assert not container.reachable(str(kit / "gpusimkit" / "workload.py"))
    job = gpusim.hold([3], mib=1024, ct=VMID_LOCKED)
    assert proctools.alive(job)
    assert proctools.cmdline(job)[1:3] == ["-m", "gpusimkit.workload"]
    # where a path it needs is out of reach, the simulator says which one, and why
    cause = container.unreachable_cause(gpusim.dir, VMID_LOCKED, [str(kit)])
    assert f"CT {VMID_LOCKED} is unprivileged and its root (node uid 100000) cannot reach {kit}" in cause, cause


def test_host_tree_killing_the_parent_leaves_the_workers(gpusim):
    parent = gpusim.hold([0, 1, 2], mib=1000, tree=True, name="python3")
    workers = children(parent)
    assert len(workers) == 3
    assert dev_files(gpusim, parent) == ["nvidiactl"]
    assert proc_lines(gpusim, parent) == []  # the API process holds no memory
    for i, w in enumerate(sorted(workers, key=lambda w: proc_lines(gpusim, w)[0]["gpu"])):
        assert [(p["gpu"], p["used_mib"]) for p in proc_lines(gpusim, w)] == [(i, 1000)]
        # each worker, a CUDA process, holds the node of every GPU (its context only on GPU i)
        assert dev_files(gpusim, w) == ["nvidia-uvm"] + [f"nvidia{g}" for g in range(8)] + ["nvidiactl"]
        assert (w, proctools.starttime(w)) in proctools.read_owned(gpusim.dir)
    gpusim.kill(parent)
    assert gone(parent)
    time.sleep(0.2)
    for w in workers:
        assert proctools.alive(w)
        assert exit_ns(gpusim, w) is None
    assert [g["memory_used_mib"] for g in gpusim.status()["gpus"][:3]] == [1000, 1000, 1000]


def test_host_tree_sigterm_to_the_parent_ends_all(gpusim):
    parent = gpusim.hold([4, 5], mib=1000, tree=True)
    workers = children(parent)
    assert len(workers) == 2
    os.kill(parent, signal.SIGTERM)
    for pid in [parent, *workers]:
        wait_for(lambda pid=pid: gone(pid), timeout=3.0)
    for w in workers:
        wait_for(lambda w=w: not proc_lines(gpusim, w), timeout=2.0)
    assert all(g["memory_used_mib"] == 0 for g in gpusim.status()["gpus"])


def test_host_ignore_term(gpusim):
    pid = gpusim.hold([0], mib=10, ignore_term=True)
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.3)
    assert proctools.alive(pid)
    assert exit_ns(gpusim, pid) is None
    assert gpusim.kill(pid, signal.SIGKILL)
    assert gone(pid)


def test_host_exit_delay(gpusim):
    pid = gpusim.hold([0], mib=10, exit_delay=0.6)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.3)
    assert proctools.alive(pid)
    wait_for(lambda: gone(pid), timeout=3.0)
    took = time.monotonic() - t0
    assert 0.55 <= took < 1.5, took
    assert not proc_lines(gpusim, pid)  # release lag 0


def test_host_hold_errors(gpusim_factory):
    host = gpusim_factory(gpus=2)
    with pytest.raises(ScenarioError, match="gpus"):
        host.hold([5], mib=10)
    with pytest.raises(ScenarioError, match="type"):
        host.hold([0], mib=10, type="X")
    with pytest.raises(ScenarioError, match="mib"):
        host.hold([0], mib="lots")
    with pytest.raises(ScenarioError, match="service"):
        host.hold([0], mib=10, respawn=True)
    assert proc_lines(host) == []
    assert [p for p, s in proctools.read_owned(host.dir) if proctools.alive(p, s)] == [host.daemon_pid()]
    with pytest.raises(SimError, match="not started by this simulated host"):
        host.kill(os.getpid())


# --- the supervisor and systemctl ---------------------------------------------------------------

def mainpid(host: SimHost, name: str, scope: str = "host") -> Optional[int]:
    try:
        with open(host.path("services", scope, f"{name}.mainpid"), encoding="utf-8") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def test_host_respawn_and_systemctl_stop(gpusim):
    pid = gpusim.hold([0, 1], mib=2048, respawn=True, service="vllm", name="python3", restart_delay=0.1)
    assert mainpid(gpusim, "vllm") == pid
    r = gpusim.systemctl("is-active", "vllm")
    assert (r.returncode, r.stdout) == (0, "active\n")
    r = gpusim.systemctl("status", "vllm.service")
    assert r.returncode == 0 and "Active: active (running)" in r.stdout and f"Main PID: {pid} (python3)" in r.stdout

    # Killing the worker: the supervisor starts a new one, which registers its memory.
    os.kill(pid, signal.SIGKILL)
    new = wait_for(lambda: (mainpid(gpusim, "vllm") or pid) != pid and mainpid(gpusim, "vllm"), timeout=5.0)
    assert new != pid
    assert [p["gpu"] for p in proc_lines(gpusim, new)] == [0, 1]
    wait_for(lambda: gone(pid), timeout=1.0)

    # systemctl stop blocks until it is stopped, and it stays stopped.
    sup = int(open(gpusim.path("services", "host", "vllm.pid"), encoding="utf-8").read())
    r = gpusim.systemctl("stop", "vllm")
    assert (r.returncode, r.stderr) == (0, "")
    assert gone(new) and gone(sup)
    time.sleep(0.5)
    assert [p for p in proc_lines(gpusim) if p["pid"] not in (pid, new)] == []
    r = gpusim.systemctl("is-active", "vllm")
    assert (r.returncode, r.stdout) == (3, "inactive\n")
    r = gpusim.systemctl("status", "vllm")
    assert r.returncode == 3 and "inactive (dead)" in r.stdout

    # start brings it back.
    r = gpusim.systemctl("start", "vllm")
    assert r.returncode == 0, r.stderr
    third = mainpid(gpusim, "vllm")
    assert third not in (None, pid, new)
    assert [p["gpu"] for p in proc_lines(gpusim, third)] == [0, 1]
    assert gpusim.systemctl("is-active", "vllm").returncode == 0


def test_host_supervisor_stop_timeout_kills_an_ignoring_workload(gpusim):
    pid = gpusim.hold([0], mib=10, service="stubborn", respawn=True, ignore_term=True, stop_timeout=0.5)
    t0 = time.monotonic()
    r = gpusim.systemctl("stop", "stubborn")
    took = time.monotonic() - t0
    assert r.returncode == 0
    assert gone(pid)
    assert 0.45 <= took < 3.0, took


def test_host_service_without_respawn_is_not_restarted(gpusim):
    pid = gpusim.hold([0], mib=10, service="oneshot")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: gpusim.systemctl("is-active", "oneshot").returncode == 3, timeout=3.0)
    assert mainpid(gpusim, "oneshot") is None


def test_host_systemctl_unknown_unit(gpusim):
    r = gpusim.systemctl("stop", "nosuch.service")
    assert (r.returncode, r.stderr) == (5, "Failed to stop nosuch.service: Unit nosuch.service not loaded.\n")
    r = gpusim.systemctl("start", "nosuch")
    assert r.returncode == 5 and "Unit nosuch.service not found." in r.stderr
    r = gpusim.systemctl("is-active", "nosuch")
    assert (r.returncode, r.stdout) == (3, "inactive\n")
    r = gpusim.systemctl("status", "nosuch")
    assert (r.returncode, r.stderr) == (4, "Unit nosuch.service could not be found.\n")
    # Scopes are separate: a host service is unknown to a container's systemctl.
    gpusim.hold([0], mib=10, service="vllm", respawn=True)
    gpusim.ct_create(9129, systemd=True)
    gpusim.ct_start(9129)
    r = gpusim.systemctl("stop", "vllm", ct=9129)
    assert (r.returncode, r.stderr) == (5, "Failed to stop vllm.service: Unit vllm.service not loaded.\n")
    assert gpusim.systemctl("is-active", "vllm").returncode == 0


# --- faults -------------------------------------------------------------------------------------

def test_host_fault_changes_the_scenario(gpusim):
    t0 = time.monotonic_ns()
    gpusim.fault(init_error="version_mismatch", lose_gpu=3, not_supported={1: ["fan", "power"]},
                 unknown_every=7, call_delay_ms=5, leak={2: 1500}, pid_mode="host", release_lag_ms=250)
    sc = gpusim.scenario()
    assert sc.init_error == 18 and sc.unknown_every == 7 and sc.call_delay_ms == 5
    assert sc.pid_mode == "host" and sc.release_lag_ms == 250
    assert t0 <= sc.gpus[3].lost_at_ns <= time.monotonic_ns()
    assert sc.gpus[1].not_supported == ["fan", "power"]
    assert sc.gpus[2].leaked_mib == 1500
    assert gpusim.status()["gpus"][2]["memory_used_mib"] == 1500
    with open(gpusim.path("scenario"), encoding="utf-8") as f:
        text = f.read()
    assert "init_error 18\n" in text and "gpu.2.leaked_mib 1500\n" in text

    gpusim.fault(lose_gpu=[4, 5], after=30)
    sc = gpusim.scenario()
    assert sc.gpus[4].lost_at_ns > time.monotonic_ns() + 29 * 10**9

    gpusim.fault(clear=True)
    sc = gpusim.scenario()
    assert sc.init_error == 0 and sc.unknown_every == 0 and sc.call_delay_ms == 0
    assert all(g.lost_at_ns == -1 and g.not_supported == [] and g.leaked_mib == 0 for g in sc.gpus)
    assert sc.pid_mode == "host" and sc.release_lag_ms == 250  # settings, not faults


def test_host_fault_hide_reinstalls_the_library(gpusim):
    lib = gpusim.path("lib", "libnvidia-ml.so.1")
    ino = os.stat(lib).st_ino
    gpusim.fault(hide="nvmlDeviceGetComputeRunningProcesses_v3")
    assert gpusim.scenario().hidden_symbols == ["nvmlDeviceGetComputeRunningProcesses_v3"]
    assert os.stat(lib).st_ino != ino
    nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    assert "nvmlDeviceGetComputeRunningProcesses_v3" not in nm
    assert "nvmlDeviceGetComputeRunningProcesses_v2" in nm
    gpusim.fault(hide=[])
    nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in nm


@pytest.mark.parametrize("kwargs, field", [
    ({"init_error": "bogus"}, "init_error"),
    ({"lose_gpu": 8}, "lose_gpu"),
    ({"after": 3}, "after"),
    ({"not_supported": {0: ["warp_drive"]}}, "not_supported"),
    ({"not_supported": "0-fan"}, "not_supported"),
    ({"leak": {9: 10}}, "leak"),
    ({"leak": "0:lots"}, "leak"),
    ({"leak": {0: 10**9}}, "leaked_mib"),
    ({"unknown_every": -1}, "unknown_every"),
    ({"pid_mode": "magic"}, "pid_mode"),
    ({"release_lag_ms": "soon"}, "release_lag_ms"),
    ({"hide": "cudaMalloc"}, "hidden_symbols"),
    ({"hide": "nvmlNoSuchFunction"}, "hidden_symbols"),
])
def test_host_fault_rejects_invalid_values(gpusim, kwargs, field):
    before = open(gpusim.path("scenario"), encoding="utf-8").read()
    with pytest.raises(ScenarioError, match=field):
        gpusim.fault(**kwargs)
    assert open(gpusim.path("scenario"), encoding="utf-8").read() == before
    with pytest.raises(ScenarioError, match="unique"):
        gpusim.set_gpu(0, minor=1)  # GPU 1 has it
    gpusim.set_gpus({0: {"minor": 1}, 1: {"minor": 0}})  # swapped in one write
    assert [g.minor for g in gpusim.scenario().gpus[:2]] == [1, 0]


def test_host_set_gpu_writes_one_gpu_and_rejects_what_the_scenario_has_not(gpusim):
    gpusim.set_gpu(2, minor=9, util_gpu=40)
    sc = gpusim.scenario()
    assert (sc.gpus[2].minor, sc.gpus[2].util_gpu) == (9, 40) and sc.gpus[1].util_gpu == 0
    with open(gpusim.path("scenario"), encoding="utf-8") as f:
        assert "gpu.2.util_gpu 40\n" in f.read()
    before = open(gpusim.path("scenario"), encoding="utf-8").read()
    for index, fields, field in ((8, {"minor": 1}, "gpu"), (0, {"warp": 1}, "gpu.0.warp"), (0, {"index": 3}, "gpu.0.index")):
        with pytest.raises(ScenarioError, match=field):
            gpusim.set_gpu(index, **fields)
    assert open(gpusim.path("scenario"), encoding="utf-8").read() == before


def test_host_spawn_and_workload_command_start_the_machines_processes(gpusim, tmp_path):
    pid = gpusim.spawn([shutil.which("sleep"), "60"])  # the daemon execs argv as it is (no PATH search)
    assert pid in [p for p, _s in gpusim.owned()] and gpusim.owns(pid) and gpusim.kill(pid)
    assert not gpusim.owns(os.getpid())  # pytest itself: neither started by gpusim nor in its cgroups
    held = gpusim.hold(gpus=[0], mib=64)
    assert gpusim.owns(held) and held in [p for p, _s in gpusim.owned()]
    ready = tmp_path / "ready"
    argv, env = gpusim.workload_command([f"--dir={gpusim.dir}", "--gpus=1", "--mib=128", f"--ready-file={ready}"])
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(ready.exists, timeout=30)
        assert wait_for(lambda: [p for p in proc_lines(gpusim, proc.pid) if p["used_mib"] == 128], timeout=10)
    finally:
        proc.kill()
        proc.wait()
    assert gpusim.pct_calls() == []


# --- the CLI ------------------------------------------------------------------------------------

def test_host_cli_up_hold_status_env_down():
    base = tempfile.mkdtemp(prefix="gpusim-cli-")
    d = os.path.join(base, "sim")
    try:
        r = cli("up", "--dir", d, "--gpus", "4", "--model", "NVIDIA H100 80GB HBM3", "--memory-mib", "81559",
                "--release-lag", "0.25", "--pid-mode", "host")
        assert r.returncode == 0, r.stderr
        sc = scn.load(d)
        assert sc.gpu_count == 4 and sc.gpus[0].name == "NVIDIA H100 80GB HBM3"
        assert sc.gpus[0].memory_total_mib == 81559 and sc.release_lag_ms == 250 and sc.pid_mode == "host"
        r = cli("up", "--dir", d)
        assert r.returncode == 1 and "already up" in r.stderr

        r = cli("env", "--dir", d)
        assert r.returncode == 0
        env = {}
        for line in r.stdout.splitlines():
            assert line.startswith("export ")
            k, _sep, v = line[7:].partition("=")
            env[k] = v
        assert env["LD_LIBRARY_PATH"] == d + "/lib" and env["GPUSIM_DIR"] == d
        assert env["PATH"].startswith(d + "/bin:")

        r = cli("hold", "--dir", d, "--gpus", "0,1", "--mib", "1234", "--name", "python3")
        assert r.returncode == 0, r.stderr
        pid = int(r.stdout)
        r = cli("hold", "--dir", d, "--gpus", "2", "--mib", "10", "--tree")
        assert r.returncode == 0, r.stderr
        tree = int(r.stdout)
        workers = children(tree)
        r = cli("hold", "--dir", d, "--gpus", "3", "--mib", "10", "--respawn", "--service", "svc")
        assert r.returncode == 0, r.stderr
        svc = int(r.stdout)
        r = cli("status", "--dir", d, "--json")
        st = json.loads(r.stdout)
        assert [g["memory_used_mib"] for g in st["gpus"]] == [1234, 1234, 10, 10]
        assert st["gpus"][0]["pids"] == [pid]
        r = cli("status", "--dir", d)
        assert r.returncode == 0 and "1234" in r.stdout and str(pid) in r.stdout

        r = cli("fault", "--dir", d, "--lose-gpu", "1", "--leak", "2:5", "--not-supported", "3:fan,power")
        assert r.returncode == 0, r.stderr
        sc = scn.load(d)
        assert sc.gpus[1].lost_at_ns >= 0 and sc.gpus[2].leaked_mib == 5 and sc.gpus[3].not_supported == ["fan", "power"]
        r = cli("fault", "--dir", d, "--clear")
        assert r.returncode == 0 and scn.load(d).gpus[1].lost_at_ns == -1

        owned = proctools.read_owned(d)
        assert {pid, tree, svc, *workers} <= {p for p, _st in owned}
        r = cli("down", "--dir", d)
        assert r.returncode == 0, r.stderr
        assert not os.path.exists(d)
        assert [p for p, s in owned if proctools.alive(p, s)] == []
    finally:
        if os.path.exists(d):
            SimHost(d).down()
        os.rmdir(base)


@pytest.mark.parametrize("args, field", [
    (["up", "--gpus", "65"], "gpus"),
    (["up", "--gpus", "many"], "--gpus"),
    (["up", "--memory-mib", "0"], "memory_mib"),
    (["up", "--release-lag", "-1"], "release_lag"),
    (["up", "--pid-mode", "magic"], "pid_mode"),
    (["up", "--model", ""], "model"),
    (["up", "--hide", "cudaMalloc"], "hidden_symbols"),
    (["up", "--hide", "nvmlNoSuchFunction"], "hidden_symbols"),
])
def test_host_cli_up_rejects_invalid_values(args, field):
    base = tempfile.mkdtemp(prefix="gpusim-cli-")
    d = os.path.join(base, "sim")
    try:
        r = cli(args[0], "--dir", d, *args[1:])
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert field in r.stderr
        assert not os.path.exists(d)  # nothing created
    finally:
        if os.path.exists(d):
            SimHost(d).down()
        os.rmdir(base)


@pytest.mark.parametrize("args, field", [
    (["hold", "--gpus", "8"], "gpus"),
    (["hold", "--gpus", "0", "--type", "X"], "type"),
    (["hold", "--gpus", "0", "--mib", "lots"], "--mib"),
    (["hold", "--gpus", "0", "--respawn"], "service"),
    (["hold", "--gpus", "0", "--exit-delay", "-1"], "exit_delay"),
    (["fault", "--init-error", "bogus"], "init_error"),
    (["fault", "--lose-gpu", "9"], "lose_gpu"),
    (["fault", "--after", "2"], "after"),
    (["fault", "--not-supported", "0:warp"], "not_supported"),
    (["fault", "--leak", "0"], "leak"),
    (["fault", "--unknown-every", "x"], "unknown_every"),
    (["fault", "--call-delay-ms", "-3"], "call_delay_ms"),
    (["fault", "--pid-mode", "magic"], "pid_mode"),
    (["fault", "--hide", "cudaMalloc"], "hidden_symbols"),
    (["ct", "create", "--vmid", "abc"], "vmid"),
    (["ct", "create", "--vmid", "129", "--hostname", "no_underscores"], "hostname"),
    (["ct", "create", "--vmid", "129", "--gpus", "0,9"], "gpus"),
])
def test_host_cli_rejects_invalid_values(gpusim, args, field):
    before = open(gpusim.path("scenario"), encoding="utf-8").read()
    r = cli(*args, "--dir", gpusim.dir)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert field in r.stderr
    assert open(gpusim.path("scenario"), encoding="utf-8").read() == before
    assert proc_lines(gpusim) == []


def test_host_cli_on_a_dir_without_a_host():
    r = cli("status", "--dir", "/nonexistent/gpusim")
    assert r.returncode == 2 and "dir" in r.stderr


# --- down and the fixture -----------------------------------------------------------------------

def test_host_down_leaves_nothing(gpusim_factory):
    host = gpusim_factory(gpus=4, release_lag_ms=5000)
    pids = [
        host.hold([0], mib=10),
        host.hold([1], mib=10, ignore_term=True),
        host.hold([2], mib=10, exit_delay=30),
        host.hold([3], mib=10, respawn=True, service="svc", ignore_term=True),
        host.hold([0, 1], mib=10, tree=True),
        host.hold(None, device_only=True, name="nvidia-persistenced"),
    ]
    pids += children(pids[4])
    owned = proctools.read_owned(host.dir)
    dpid = host.daemon_pid()
    assert set(pids) | {dpid} <= {p for p, _st in owned}
    t0 = time.monotonic()
    report = host.down()
    assert report["errors"] == [] and report["left"] == []
    assert time.monotonic() - t0 < 5
    assert not os.path.exists(host.dir)
    for p, s in owned:
        assert not proctools.alive(p, s), p
    assert gone(dpid)  # the fixture's host: the daemon is our child and reaped
    host.down()  # idempotent


def test_host_up_refuses_a_too_long_dir():
    with pytest.raises(ScenarioError, match="dir"):
        SimHost.up("/tmp/" + "x" * 120)


def test_host_fixture_default_shape(gpusim):
    st = gpusim.status()
    assert len(st["gpus"]) == 8 and st["gpus"][0]["name"] == "NVIDIA H200"
    assert st["gpus"][0]["memory_total_mib"] == 143771 and st["daemon"]["running"]
    assert st["processes"] == [] and st["containers"] == []
    env = gpusim.env()
    assert env["GPUSIM_DIR"] == gpusim.dir and env["LD_LIBRARY_PATH"] == gpusim.path("lib")
    assert env["PATH"].split(":")[0] == gpusim.path("bin")
    for tool in ("bin/nvidia-smi", "bin/pct", "bin/systemctl", "ctbin/nvidia-smi"):
        with open(gpusim.path(tool), encoding="utf-8") as f:
            assert f.readline() == f"#!{sys.executable}\n"
        assert os.access(gpusim.path(tool), os.X_OK)


# --- end to end: the real pynvml ----------------------------------------------------------------

PYNVML_SERVER = r"""
import json, sys
import pynvml as N
N.nvmlInit()
n = N.nvmlDeviceGetCount()
for line in sys.stdin:
    out = []
    for i in range(n):
        h = N.nvmlDeviceGetHandleByIndex(i)
        mem = N.nvmlDeviceGetMemoryInfo(h)
        procs = N.nvmlDeviceGetComputeRunningProcesses(h)
        out.append({"used_mib": mem.used // 1048576, "total_mib": mem.total // 1048576,
                    "procs": sorted([p.pid, p.usedGpuMemory // 1048576] for p in procs)})
    print(json.dumps(out), flush=True)
"""


class Pynvml:
    """The REAL pynvml in a subprocess pointed at the simulated host through host.env()."""

    def __init__(self, host: SimHost):
        self.proc = subprocess.Popen([sys.executable, "-c", PYNVML_SERVER], env=host.env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def query(self) -> List[Dict]:
        self.proc.stdin.write("q\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"pynvml server died: {self.proc.stderr.read()}")
        return json.loads(line)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()


@pytest.fixture
def pynvml_of():
    pytest.importorskip("pynvml")
    clients: List[Pynvml] = []

    def make(host: SimHost) -> Pynvml:
        c = Pynvml(host)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


def test_host_pynvml_sees_held_workloads(gpusim, pynvml_of):
    nv = pynvml_of(gpusim)
    q = nv.query()
    assert len(q) == 8 and all(g["used_mib"] == 0 and g["procs"] == [] for g in q)
    a = gpusim.hold([0, 1], mib=40960)
    b = gpusim.hold([5], mib=1200, name="python3")
    tree = gpusim.hold([6, 7], mib=777, tree=True)
    workers = {proc_lines(gpusim, w)[0]["gpu"]: w for w in children(tree)}
    q = nv.query()
    assert [g["used_mib"] for g in q] == [40960, 40960, 0, 0, 0, 1200, 777, 777]
    assert q[0]["procs"] == [[a, 40960]] and q[1]["procs"] == [[a, 40960]]
    assert q[5]["procs"] == [[b, 1200]]
    assert q[6]["procs"] == [[workers[6], 777]] and q[7]["procs"] == [[workers[7], 777]]
    assert all(g["total_mib"] == 143771 for g in q)
    gpusim.kill(a)
    q = nv.query()
    assert [g["used_mib"] for g in q] == [0, 0, 0, 0, 0, 1200, 777, 777]
    assert q[0]["procs"] == []


def test_host_pynvml_memory_released_release_lag_after_the_kill(gpusim_factory, pynvml_of):
    lag = 800
    host = gpusim_factory(gpus=2, release_lag_ms=lag)
    pid = host.hold([1], mib=5000)
    nv = pynvml_of(host)
    assert nv.query()[1] == {"used_mib": 5000, "total_mib": 143771, "procs": [[pid, 5000]]}
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: exit_ns(host, pid), timeout=0.1, step=0.001)
    # Dead at once (not reported), but its memory stays used until the lag has passed.
    q = nv.query()[1]
    assert q["procs"] == [] and q["used_mib"] == 5000
    # (time before the query, time after it, used MiB) relative to the kill
    samples = []
    while time.monotonic() - t_kill < lag / 1000 + 0.4:
        before = time.monotonic() - t_kill
        used = nv.query()[1]["used_mib"]
        samples.append((before, time.monotonic() - t_kill, used))
        time.sleep(0.01)
    lag_s = lag / 1000
    # Never released before the lag has passed since the kill ...
    assert all(used == 5000 for _b, after, used in samples if after < lag_s - 0.01), samples
    # ... and released soon after it.
    assert all(used == 0 for before, _a, used in samples if before > lag_s + 0.15), samples
    assert any(used == 5000 for _b, after, used in samples if after < lag_s - 0.1), samples
    assert any(used == 0 for before, _a, used in samples if before > lag_s + 0.15), samples


def test_host_quick_successive_changes_reach_a_running_client(gpusim_factory, pynvml_of):
    """The library re-reads scenario/procs when (mtime, inode, size) changed.  Rewrites within
    one timestamp tick, of equal size, on a reused inode number must still be seen."""
    host = gpusim_factory(gpus=1)
    nv = pynvml_of(host)
    for i in range(30):
        mib = 1000 + (i % 2) * 1000  # same length: same file size
        host.fault(leak={0: mib})
        assert nv.query()[0]["used_mib"] == mib, i
    child = subprocess.Popen(["sleep", "60"])
    try:
        for i in range(30):
            mib = 10 + (i % 2) * 10
            host.register(child.pid, {0: mib})
            assert nv.query()[0]["used_mib"] == 2000 + mib, i
    finally:
        child.kill()
        child.wait()


def test_host_daemon_alone_exits_cleanly_on_sigterm():
    d = tempfile.mkdtemp(prefix="gpusim-d-")
    try:
        scn.save(d, scn.new_scenario(2, seed=d))
        proc = subprocess.Popen([sys.executable, "-m", "gpusimkit.driver", "--dir", d], cwd=GPUSIM,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: os.path.exists(os.path.join(d, "run", "driver.pid")), timeout=10)
            assert proctools.driver_request(d, "ping") == ""
            with open(os.path.join(d, "run", "driver.pid"), encoding="utf-8") as f:
                assert int(f.read()) == proc.pid
            assert open(os.path.join(d, "procs"), encoding="utf-8").read() == ""
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=5) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert not os.path.exists(os.path.join(d, "run", "driver.sock"))
        assert not os.path.exists(os.path.join(d, "run", "driver.pid"))
        with open(os.path.join(d, "run", "driver.log"), encoding="utf-8") as f:
            assert "driver stopped" in f.read()
    finally:
        shutil.rmtree(d)


def test_host_workload_ready_file_and_error_reporting(gpusim_factory, tmp_path):
    host = gpusim_factory(gpus=2)
    ready = tmp_path / "ready"
    env = dict(host.env(), PYTHONPATH=GPUSIM)
    proc = subprocess.Popen([sys.executable, "-m", "gpusimkit.workload", "--dir", host.dir, "--gpus", "all",
                             "--mib", "64", "--ready-file", str(ready)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for(ready.exists, timeout=10)
        assert ready.read_text() == f"{proc.pid}\n"
        assert [p["gpu"] for p in proc_lines(host, proc.pid)] == [0, 1]
    finally:
        proc.kill()
        proc.wait()
    bad = subprocess.run([sys.executable, "-m", "gpusimkit.workload", "--dir", host.dir, "--gpus", "7",
                          "--ready-file", str(ready)], env=env, capture_output=True, text=True, timeout=30,
                         check=False)
    assert bad.returncode == 1
    assert ready.read_text().startswith("error invalid gpus='7'")
