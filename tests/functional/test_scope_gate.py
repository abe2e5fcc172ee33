"""The scope gate against a host that keeps moving (issue 18): every reproduction here signalled a
process outside the scope, or signalled the wrong process, before the gate (_scope.Scope) decided
every signal. Each test starts its own simulated host and checks that what is outside the scope is
alive and reported."""

import json
import os
import subprocess
import sys
import threading
import time

from modrun import alive, run_module, wait_for


def devices(host):
    return [host.dir + "/dev/nvidia*"]


def release(host, collection, **args):
    args.setdefault("device_files", devices(host))
    args.setdefault("grace_period", 5)
    return run_module(host, collection, "gpu_release", args)


def pids_of(entries):
    return {e["pid"] for e in entries}


def test_a_job_started_in_another_container_mid_release_is_reported_never_signalled(gpusim_factory, collection):
    # Before the gate: fencing CT 129 SIGKILLed a job that CT 130 started on GPU 7 meanwhile, as
    # "orphaned by a target", and so did it a host process parented to PID 1.
    host = gpusim_factory(release_lag_ms=0)
    for vmid in (129, 130):
        host.ct_create(vmid)
        host.ct_start(vmid)
    server = host.hold(gpus=[0, 1], mib=4096, ct=129, exit_delay=1.0)
    started = {}

    def newcomers():
        time.sleep(0.4)  # the release is under way: the server takes 1 s to exit after SIGTERM
        started["ct130"] = host.hold(gpus=[7], mib=2048, ct=130)
        started["host"] = host.hold(gpus=[6], mib=2048)

    t = threading.Thread(target=newcomers)
    t.start()
    res = release(host, collection, containers=[129])
    t.join()
    assert not res.get("failed"), res.get("msg")
    assert pids_of(res["released"]) == {server}
    for pid in started.values():
        assert alive(pid), (pid, res["released"])
        assert pid not in pids_of(res["released"])
    reported = {r["pid"]: r for r in res["respawned"]}
    for pid in started.values():
        if pid in reported:  # started before the module's last look: reported, outside the scope
            assert reported[pid]["in_scope"] is False and "not signalled" in reported[pid]["advice"]


def test_a_restart_by_a_shell_loop_is_reported_and_fails_the_release(gpusim, collection, tmp_path):
    # A supervisor that is not a systemd unit: before the gate nothing watched it (no look after the
    # signals unless a unit was left running), so the release said done and the holder came back.
    ready = tmp_path / "ready"
    wargs = [f"--dir={gpusim.dir}", "--gpus=3", "--mib=2048", f"--ready-file={ready}"]
    loop = ("while true; do rm -f " + str(ready) + "; \"$@\"; sleep 0.1; done")
    argv, env = gpusim.workload_command(wargs)
    sh = subprocess.Popen(["sh", "-c", loop, "loop", *argv], env=env, start_new_session=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(ready.exists)
        first = int(ready.read_text())
        res = release(gpusim, collection, gpus=["3"], tree=False)
        assert pids_of(res["released"]) == {first}
        assert res.get("failed"), res
        (again,) = [r for r in res["respawned"] if r["in_scope"]]
        assert again["pid"] != first and alive(again["pid"])
        assert again["supervisor"].startswith(f"sh (pid {sh.pid}"), again
        assert "not signalled" in again["advice"] and "hold the selected GPUs again" in res["msg"]
        assert alive(sh.pid)
    finally:
        sh.kill()
        sh.wait()
        if ready.exists():
            pid = int(ready.read_text())
            gpusim.kill(pid)


LAUNCHER = r"""
import json, subprocess, sys
kids = [subprocess.Popen(argv) for argv in json.loads(sys.argv[1])]
print(" ".join(str(k.pid) for k in kids), flush=True)
for k in kids:
    k.wait()
"""


def test_a_sibling_of_a_released_job_under_one_launcher_is_left_alone(gpusim, collection, tmp_path):
    # Before the gate: gpus [0], pids [A] made the launcher the workload's root and tree took all of
    # its children: job B (GPU 7 only, not named) got SIGTERM and was listed as released and skipped.
    jobs = []
    for gpu in (0, 7):
        ready = tmp_path / f"ready{gpu}"
        wargs = [f"--dir={gpusim.dir}", f"--gpus={gpu}", "--mib=2048", f"--ready-file={ready}"]
        jobs.append((ready, gpusim.workload_command(wargs)[0]))
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, json.dumps([argv for _r, argv in jobs])],
                                env=gpusim.workload_command([])[1], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
    try:
        assert wait_for(lambda: all(r.exists() for r, _a in jobs))
        a, b = (int(r.read_text()) for r, _a in jobs)
        res = release(gpusim, collection, gpus=["0"], pids=[a])
        assert not res.get("failed"), res.get("msg")
        assert pids_of(res["released"]) == {a}
        assert alive(b) and alive(launcher.pid)
        assert not pids_of(res["released"]) & pids_of(res["skipped_processes"])
    finally:
        launcher.kill()
        launcher.wait()
        for ready, _a in jobs:
            pid = int(ready.read_text())
            if alive(pid):
                gpusim.kill(pid)


DECOY = r"""
import os, subprocess, sys
target = int(sys.argv[1])
# LXC mounts /proc/sys read-only in the container (lxc.mount.auto = proc:mixed, as on PVE); root of this
# privileged container may make it writable again
subprocess.run(["mount", "-o", "remount,rw", "/proc/sys"], check=False)
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(target - 1))
p = subprocess.Popen(["sleep", "120"], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(p.pid, flush=True)
"""


def decoy_with_pid(host, vmid, pid):
    """A `sleep` in the container whose pid there is ``pid`` (a GPU job's host pid); returns its host pid."""
    out = subprocess.run(["pct", "exec", str(vmid), "--", sys.executable, "-c", DECOY, str(pid)], env=host.env(),
                         capture_output=True, text=True, timeout=30, check=True)
    assert int(out.stdout.split()[0]) == pid
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status", encoding="utf-8") as f:
                    nspid = [ln for ln in f if ln.startswith("NSpid:")][0].split()[1:]
            except (OSError, IndexError):
                continue
            if len(nspid) == 2 and int(nspid[1]) == pid:
                return int(entry)
    raise AssertionError(f"no process of CT {vmid} has pid {pid} there")


def test_inside_a_container_a_host_pid_from_the_driver_is_never_signalled_unverified(gpusim, collection):
    # Before the gate: with a driver that reports host pids (old branches), gpu_release inside the
    # container SIGTERMed the unrelated process whose container pid equalled the GPU job's host pid.
    vmid = 9310
    gpusim.ct_create(vmid)
    gpusim.ct_start(vmid)
    job = gpusim.hold(gpus=[0], mib=4096, ct=vmid)
    gpusim.fault(pid_mode="host")
    decoy_host_pid = decoy_with_pid(gpusim, vmid, job)  # the container now has a process with the job's host pid
    assert alive(decoy_host_pid)
    try:
        res = run_module(gpusim, collection, "gpu_release",
                         {"device_files": devices(gpusim), "gpus": ["0"], "grace_period": 5},
                         prefix=["pct", "exec", str(vmid), "--"])
        assert alive(decoy_host_pid), res
        assert job not in pids_of(res.get("released") or [])
        (skipped,) = [s for s in res["skipped_processes"] if s["pid"] == job]
        assert "cannot be confirmed" in skipped["reason"]
        assert alive(job)
    finally:
        os.kill(decoy_host_pid, 9)


def test_a_cuda_process_without_a_context_is_left_alone_and_does_not_stall_the_wait(gpusim_factory, collection):
    # Before: a notebook that imported torch in the fenced container (every /dev/nvidiaN open, no
    # context, no memory) was SIGTERMed with the server, and in a neighbour container it was followed
    # by liveness between full scans, so the wait returned up to 15 s after the memory was back.
    host = gpusim_factory(release_lag_ms=1500)
    for vmid in (129, 130):
        host.ct_create(vmid)
        host.ct_start(vmid)
    server = host.hold(gpus=[0, 1, 2, 3], mib=8192, ct=129, tree=True)
    notebooks = [host.hold(gpus="all", mib=0, ct=vmid, device_only=True) for vmid in (129, 130)]
    res = release(host, collection, containers=[129])
    assert not res.get("failed"), res.get("msg")
    assert server in pids_of(res["released"])
    assert all(alive(pid) for pid in notebooks)
    assert not pids_of(res["released"]) & set(notebooks)
    assert "lingering, not signalled" in {s["pid"]: s["reason"] for s in res["skipped_processes"]}[notebooks[0]]
    wait = run_module(host, collection, "gpu_wait_idle", {"device_files": devices(host), "gpus": ["0", "1", "2", "3"],
                                                          "timeout": 60, "settle": 0.5})
    assert not wait.get("failed"), wait.get("msg")
    # The memory is back 1.5 s after the exit; the wait follows the memory, not the notebooks. A stall
    # (a full scan every 15 s) would take 15 s or more; the bound leaves room for a loaded machine.
    assert wait["elapsed"] < 1.5 + 0.5 + 6.0, wait["elapsed"]
