"""gpu_release on hostile hosts: the cases operators met (issue 20, item 5), one test each, on the
simulator with real processes, a real nested PID namespace and a real frozen LXC container.

1. ``match: vllm`` releases vLLM's renamed ``VLLM::EngineCore`` workers (match sees the workload root);
   a scope that selects nothing while the selected GPUs are held says so, naming them.
2. A SIGSTOPped holder gets SIGCONT after SIGTERM and exits at once, not after grace_period.
3. A survivor is described by its state, and the advice names the wait to raise.
4. A holder that is PID 1 of a nested PID namespace (a Docker entrypoint without an init) ignores SIGTERM:
   the survivor, or the SIGKILL after grace_period, is named as such.
5. A frozen container (a suspend-mode backup, ``lxc-freeze``) is refused before anything is stopped or signalled,
   with the reason and what to do (issue 29, item 2): its supervisor would restart the work after the thaw.
"""

import os
import signal
import subprocess
import threading
import time

import pytest
from modrun import alive, gone, run_module, wait_for, warnings

from gpusimkit import read_stat

VMID = 7351  # reserved machine-wide by ct_create (gpusimkit.vmids): no collision with another run


def release(host, collection, **args):
    args.setdefault("device_files", [host.dir + "/dev/nvidia*"])
    args.setdefault("grace_period", 5)
    return run_module(host, collection, "gpu_release", args)


def state(pid):
    st = read_stat(pid)
    return st[0] if st else None


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="utf-8") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


# --- 1. match and vLLM's renamed engine ---------------------------------------------------------------
@pytest.mark.parametrize("tree", [True, False], ids=["tree", "no-tree"])
@pytest.mark.parametrize("match", ["vllm", "sglang|vllm"])
def test_match_vllm_releases_the_renamed_engine_core_workers(gpusim, collection, monkeypatch, match, tree):
    # vLLM renames its engine processes (setproctitle): their command line is "VLLM::EngineCore" and their
    # executable python3; only the API server above them says vllm. match sees the workload root's too.
    trainer = gpusim.hold(gpus=[5], mib=2048, name="python3 train.py")
    monkeypatch.setenv("GPUSIM_WORKER_NAME", "VLLM::EngineCore")
    server = gpusim.hold(gpus=[0, 1], mib=4096, tree=True, name="python3 -m vllm.entrypoints.openai.api_server")
    workers = children(server)
    assert len(workers) == 2
    for w in workers:
        with open(f"/proc/{w}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[0] == b"VLLM::EngineCore"
    res = release(gpusim, collection, match=match, tree=tree)
    assert not res.get("failed"), res.get("msg")
    released = {r["pid"] for r in res["released"]}
    assert set(workers) <= released, (res["released"], res["skipped_processes"])
    assert (server in released) is tree
    assert alive(trainer) and trainer not in released
    (skipped,) = [s for s in res["skipped_processes"] if s["pid"] == trainer]
    assert "matches" in skipped["reason"]
    assert all(gone(w) for w in workers)


def test_a_scope_that_selects_nothing_says_which_holders_it_left(gpusim, collection, monkeypatch):
    monkeypatch.setenv("GPUSIM_WORKER_NAME", "VLLM::EngineCore")
    server = gpusim.hold(gpus=[2], mib=4096, tree=True, name="python3 -m vllm.entrypoints.openai.api_server")
    (worker,) = children(server)
    res = release(gpusim, collection, match="sglang", gpus=["2"])
    assert not res.get("failed") and res["released"] == [] and not res["changed"], res
    (warning,) = [w for w in warnings(res) if "the scope selects none" in w]
    # each holder it missed, on its GPU, with why: what match saw (issue 33, item 4)
    assert f"pid {worker} (VLLM::EngineCor) on GPU 2: neither its command line, executable nor unit matches 'sglang'" \
        " (it saw 'VLLM::EngineCore'" in warning, warning
    assert alive(server) and alive(worker)


# --- 2. a stopped holder ------------------------------------------------------------------------------
def test_a_sigstopped_holder_gets_sigcont_and_exits_without_waiting_for_the_grace_period(gpusim, collection):
    pid = gpusim.hold(gpus=[3], mib=2048)
    gpusim.kill(pid, signal.SIGSTOP, wait=False)
    assert wait_for(lambda: state(pid) == "T")
    started = time.monotonic()
    res = release(gpusim, collection, gpus=["3"], grace_period=20)
    took = time.monotonic() - started
    assert not res.get("failed"), res.get("msg")
    (entry,) = res["released"]
    # Without SIGCONT the stopped process keeps its SIGTERM pending for the whole grace_period, then SIGKILL.
    assert entry["pid"] == pid and entry["signals"] == ["SIGTERM", "SIGCONT"], entry
    assert entry["seconds"] < 5 and took < 15, (entry, took)
    assert gone(pid)


# --- 3. survivors by their state ----------------------------------------------------------------------
def test_a_survivor_is_described_by_its_state_and_the_wait_to_raise(gpusim, collection):
    pid = gpusim.hold(gpus=[6], mib=2048, ignore_term=True)
    try:
        res = release(gpusim, collection, gpus=["6"], grace_period=1, escalate=False)
        assert res.get("failed") and res.get("error") == "release_incomplete", res
        (survivor,) = res["survivors"]
        assert survivor["pid"] == pid and survivor["state"] == "S", survivor
        msg = res["msg"]
        assert "survived SIGTERM" in msg and f"pid {pid}" in msg and "(state S) is still exiting" in msg, msg
        # the wait that ran out was grace_period (no SIGKILL was sent): that is what to raise
        assert "1 s (grace_period) after SIGTERM" in msg and "raise grace_period" in msg, msg
        assert "kill_timeout" not in msg and "stuck in the kernel" not in msg, msg
        assert alive(pid)
    finally:
        gpusim.kill(pid)


# --- 4. PID 1 of a nested PID namespace ---------------------------------------------------------------
@pytest.fixture
def nested_init(gpusim, tmp_path):
    """A holder of GPU 4 that is PID 1 of its own PID namespace, with no SIGTERM handler (the default
    disposition): a container entrypoint started without an init."""
    ready = tmp_path / "ready"
    wargs = [f"--dir={gpusim.dir}", "--gpus=4", "--mib=2048", f"--ready-file={ready}"]
    argv, env = gpusim.workload_command(wargs)
    unshare = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--", *argv],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid = None
    try:
        assert wait_for(lambda: ready.exists() and ready.read_text().strip().isdigit(), 30)
        pid = int(ready.read_text())
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            nspid = [ln.split()[1:] for ln in f if ln.startswith("NSpid:")][0]
        assert nspid == [str(pid), "1"], nspid
        yield pid
    finally:
        unshare.kill()  # --kill-child: its child (PID 1 of the namespace) gets SIGKILL with it
        unshare.wait()
        if pid is not None:
            assert gone(pid)


def test_pid_1_of_a_nested_pid_namespace_is_named_when_it_ignores_sigterm(gpusim, collection, nested_init):
    pid = nested_init
    res = release(gpusim, collection, gpus=["4"], tree=False, grace_period=1, escalate=False)
    assert res.get("failed"), res
    (survivor,) = res["survivors"]
    assert survivor["pid"] == pid and survivor["signals"] == ["SIGTERM"], survivor
    assert "PID 1 of a nested PID namespace: it ignores SIGTERM unless it handles it" in res["msg"], res["msg"]
    assert alive(pid)

    started = time.monotonic()
    res = release(gpusim, collection, gpus=["4"], tree=False, grace_period=1)
    assert not res.get("failed"), res.get("msg")
    (entry,) = res["released"]
    assert entry["pid"] == pid and entry["signals"] == ["SIGTERM", "SIGKILL"], entry
    (warning,) = [w for w in warnings(res) if f"pid {pid}" in w]
    assert "killed with SIGKILL" in warning and "PID 1 of a nested PID namespace" in warning, warning
    assert time.monotonic() - started < 30
    assert gone(pid)


# --- 5. a frozen container ----------------------------------------------------------------------------
def freeze_file(vmid):
    """cgroup2's cgroup.freeze of the container's cgroup (lxc/<vmid>/ns). On a PVE 8 node (cgroup2 only) that
    is what ``lxc-freeze`` (a suspend-mode backup) writes; this machine may mount cgroup2 beside v1 controllers
    (hybrid), where lxc-freeze uses the v1 freezer and LXC then reports FROZEN, which the simulated pct takes
    for "not running": the same freeze through cgroup2 keeps ``pct status`` running, as PVE's does."""
    for base in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        path = f"{base}/lxc/{vmid}/ns/cgroup.freeze"
        if os.path.exists(path):
            return path
    pytest.skip("no cgroup2 freezer for the container's cgroup")


def set_frozen(path, on):
    with open(path, "w", encoding="utf-8") as f:
        f.write("1" if on else "0")
    events = os.path.join(os.path.dirname(path), "cgroup.events")
    assert wait_for(lambda: f"frozen {int(on)}" in open(events, encoding="utf-8").read().splitlines())


def start_time(pid):
    st = read_stat(pid)
    return st[1] if st else None


def test_a_frozen_container_is_refused_and_nothing_is_signalled(gpusim, collection):
    """Issue 29, item 2: CT frozen (a suspend-mode backup, lxc-freeze) with a Restart=always server in it. Before,
    the unit stop hung 12 s, the server was SIGKILLed (cgroup2 lets a frozen process die) and the release (and the
    fence, so predeploy's ready) succeeded with no unit stopped; systemd restarted the server after the thaw. Now
    gpu_release and the fence (proxmox_gpu_containers state released, predeploy's module) refuse at once, with the
    reason and what to do, and signal nothing."""
    gpusim.ct_create(VMID, hostname="frozen-ct", gpus="all", systemd=True)
    gpusim.ct_start(VMID)
    pid = gpusim.hold(gpus=[0], mib=4096, ct=VMID, service="sglang", respawn=True, restart_delay=0.2, exit_delay=0.5)
    born = start_time(pid)
    freeze = freeze_file(VMID)
    set_frozen(freeze, True)
    try:
        status = subprocess.run(["pct", "status", str(VMID)], env=gpusim.env(), capture_output=True, text=True,
                                timeout=30, check=False)
        assert status.stdout.strip() == "status: running", status
        started = time.monotonic()
        res = release(gpusim, collection, containers=[VMID], grace_period=1, kill_timeout=1)
        fenced = run_module(gpusim, collection, "proxmox_gpu_containers",
                            {"containers": [VMID], "state": "released", "pct": gpusim.path("bin", "pct"),
                             "device_files": [gpusim.dir + "/dev/nvidia*"], "grace_period": 1, "kill_timeout": 1})
        took = time.monotonic() - started
        assert alive(pid) and start_time(pid) == born  # never signalled (a SIGKILL ends a cgroup2-frozen process)
    finally:
        set_frozen(freeze, False)
    reason = (f"CT {VMID} is frozen (a suspend-mode backup, or lxc-freeze; its GPU holders: pid {pid}): wait for the"
              f" backup to finish, or thaw it with `lxc-unfreeze -n {VMID}`, then run again.")
    for result in (res, fenced):
        assert result.get("failed") and result["error"] == "container_frozen", result
        assert result["msg"].startswith(reason) and result["msg"].endswith("Nothing was signalled."), result["msg"]
    assert res["released"] == [] and res["stopped_units"] == [] and res["frozen"] == [{"container": VMID, "pids": [pid]}]
    assert fenced["release"]["released"] == [] and fenced["release"]["stopped_units"] == [], fenced["release"]
    assert not res["changed"] and not fenced["changed"]
    assert took < 11, took  # no unit stop was tried (it hung 12 s per run in a frozen container)
    # thawed: the server still runs as the same process - nothing for systemd to restart, nothing was lost
    time.sleep(0.5)
    assert alive(pid) and start_time(pid) == born
    assert gpusim.systemctl("is-active", "sglang", ct=VMID).stdout.strip() == "active"
    assert gpusim.systemctl("stop", "sglang", ct=VMID).returncode == 0


def test_a_container_stopped_while_the_release_runs_is_named_as_such(gpusim, collection):
    """Issue 29, item 2: the container is stopped (pct stop) while its holder takes its time over SIGTERM: the result
    says so (containers_changed, a warning), rather than count the holder as released by the signal alone."""
    gpusim.ct_create(VMID, hostname="stopped-ct", gpus="all")
    gpusim.ct_start(VMID)
    pid = gpusim.hold(gpus=[0], mib=4096, ct=VMID, exit_delay=4)
    stopper = threading.Timer(1.0, lambda: subprocess.run(["pct", "stop", str(VMID)], env=gpusim.env(),
                                                          capture_output=True, timeout=60, check=False))
    stopper.start()
    try:
        res = release(gpusim, collection, containers=[VMID], grace_period=8)
    finally:
        stopper.join()
    assert not res.get("failed"), res.get("msg")
    assert [r["pid"] for r in res["released"]] == [pid] and gone(pid)
    (change,) = res["containers_changed"]
    assert change["container"] == VMID and change["what"] == "stopped" and change["now"] is None, change
    assert f"CT {VMID} was stopped while the release ran (its init, pid {change['init']['pid']}, is gone)" \
        in " ".join(warnings(res)), warnings(res)
