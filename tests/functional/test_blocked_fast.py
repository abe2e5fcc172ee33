"""A holder the hook will never stop fails the wait fast (issue 29, item 6), on real LXC containers.

CT 4295 (GPUs 0-1) is fenced; CT 4296 shares GPU 1 and runs another tenant's job there. The fence's release stops
4295's server and leaves the job (outside its scope: left_holders). Before, the wait after it waited out its timeout
(300 s by default) and then said only "GPU 1 is used by pid N": the progress lines never said that nothing in the
hook would stop it. Now it fails after blocker_grace (5 s), naming the job, why the release left it, and the
commands to see and stop it.

vmids 4295-4296 only.
"""

import time

import pytest
from modrun import alive, gone, run_module

FENCED = 4295
OTHER = 4296


@pytest.fixture
def node(gpusim_factory):
    host = gpusim_factory(release_lag_ms=0)
    host.ct_create(FENCED, "gpu-a", "0,1", devices_style="lxc")
    host.ct_create(OTHER, "gpu-b", "1", devices_style="lxc")
    for vmid in (FENCED, OTHER):
        host.ct_start(vmid)
    return host


def test_another_tenants_job_on_a_fenced_gpu_fails_the_wait_fast(node, collection):
    server = node.hold(gpus=[0, 1], mib=4096, ct=FENCED)
    job = node.hold(gpus=[1], mib=2048, ct=OTHER, name="python3 train.py")
    devices = [node.dir + "/dev/nvidia*"]
    fence = run_module(node, collection, "proxmox_gpu_containers",
                       {"device_files": devices, "containers": [FENCED], "state": "released", "grace_period": 5,
                        "pct": node.path("bin", "pct")})
    assert not fence.get("failed"), fence.get("msg")
    release = fence["release"]
    assert gone(server) and alive(job)
    (left,) = release["left_holders"]
    assert left["pid"] == job and f"CT {OTHER}" in left["reason"], release["left_holders"]

    started = time.monotonic()
    wait = run_module(node, collection, "gpu_wait_idle", {"device_files": devices, "gpus": ["0", "1"], "timeout": 300,
                                                          "left_holders": release["left_holders"]})
    took = time.monotonic() - started
    assert wait.get("failed") and wait["error"] == "blocked", wait
    assert 5.0 <= wait["elapsed"] < 15.0 and took < 60, (wait["elapsed"], took)
    msg = wait["msg"]
    assert f"GPU 1 is used by pid {job} (python3) in CT {OTHER}, which the release before this wait left (" in msg, msg
    assert "nothing in this hook will stop it" in msg and f"ps -o pid,user,etime,args -p {job}" in msg, msg
    assert f"pct exec {OTHER} -- kill " in msg, msg
    assert wait["left_blockers"] == [{"gpu": 1, "pid": job, "reason": left["reason"]}]
    assert alive(job)  # the wait signals nothing

    # The GPU the job is not on: ready at once; the job is no concern of a wait for GPU 0.
    only0 = run_module(node, collection, "gpu_wait_idle", {"device_files": devices, "gpus": ["0"], "timeout": 30,
                                                           "left_holders": release["left_holders"]})
    assert only0.get("ready"), only0.get("msg")
