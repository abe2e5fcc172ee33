"""gpu_release's quiet_since handed to gpu_wait_idle, on the simulator with real processes (issue 20, item 2).

The release watches the GPUs after its last target is gone; the wait that follows counts its settle window from
the moment the release last saw a holder instead of watching a window of its own again - unless its first look
finds a holder the release did not see, which restarts the clock as any holder does.
"""

import os
import signal

from modrun import alive, gone, run_module


def args(host, **more):
    return dict({"device_files": [host.dir + "/dev/nvidia*"], "gpus": ["0", "1"]}, **more)


def test_the_wait_counts_settle_from_the_release_and_leaves_the_notebook_alone(gpusim, collection):
    gpusim.fault(release_lag_ms=1500)
    server = gpusim.hold(gpus=[0, 1], mib=4096, name="python3 -m sglang.launch_server")
    # A notebook kernel that imported torch: every GPU's device node, no context. While the server's memory is
    # freed, the driver's list looks incomplete and it blocks the GPUs - it was there all along, so it does not
    # restart the settle clock.
    notebook = gpusim.hold(gpus="none", mib=0, name="python3 -m ipykernel_launcher")
    res = run_module(gpusim, collection, "gpu_release", args(gpusim, pids=[server]))
    assert not res.get("failed"), res.get("msg")
    assert [r["pid"] for r in res["released"]] == [server] and gone(server)
    quiet = res["quiet_since"]
    assert quiet["gpus"] == [0, 1] and notebook in [pid for pid, _start in quiet["device_holders"]]
    with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as f:
        assert quiet["boot_id"] == f.read().strip()
    wait = run_module(gpusim, collection, "gpu_wait_idle", args(gpusim, quiet_since=quiet, timeout=30))
    assert wait.get("ready") and not wait.get("failed"), wait.get("msg")
    assert wait["settle_from"] == "release"
    assert alive(notebook)


def test_a_holder_that_came_after_the_release_is_waited_on(gpusim, collection):
    server = gpusim.hold(gpus=[0], mib=4096, name="python3 -m sglang.launch_server")
    res = run_module(gpusim, collection, "gpu_release", args(gpusim, pids=[server]))
    assert not res.get("failed") and res["quiet_since"], res.get("msg")
    job = gpusim.hold(gpus=[1], mib=2048, name="python3 train.py")  # after the release's watch
    try:
        wait = run_module(gpusim, collection, "gpu_wait_idle", args(gpusim, quiet_since=res["quiet_since"], timeout=2))
        assert wait.get("failed") and wait["error"] == "wait_timeout", wait
        assert f"pid {job}" in wait["msg"] and wait["settle_from"] == "wait"
    finally:
        os.kill(job, signal.SIGKILL)
        assert gone(job)


def test_an_idle_node_answers_in_one_look_and_a_busy_one_does_not(gpusim, collection):
    # Nothing to release (the second run of a deploy): no context, no memory, a monitor with the device nodes
    # open (no holder by the holding model). No release is in progress, so no settle window is watched.
    monitor = gpusim.hold(gpus="none", mib=0, name="python3 -m ipykernel_launcher")
    try:
        wait = run_module(gpusim, collection, "gpu_wait_idle", args(gpusim, settle=5, timeout=30))
        assert wait.get("ready") and not wait.get("failed"), wait.get("msg")
        assert wait["settle_from"] == "idle" and wait["polls"] == 1 and wait["elapsed"] < 5, wait
        # A job on GPU 1: not idle in one look - the wait watches it and times out naming it.
        job = gpusim.hold(gpus=[1], mib=2048, name="python3 train.py")
        busy = run_module(gpusim, collection, "gpu_wait_idle", args(gpusim, settle=1, timeout=2))
        assert busy.get("failed") and busy["error"] == "wait_timeout" and f"pid {job}" in busy["msg"], busy
        os.kill(job, signal.SIGKILL)
        assert gone(job)
        after = run_module(gpusim, collection, "gpu_wait_idle", args(gpusim, settle=1, timeout=30))
        assert after.get("ready") and alive(monitor), after.get("msg")
    finally:
        os.kill(monitor, signal.SIGKILL)
