"""One release at a time per container and node (issue 29, item 7), with real module processes on real LXC.

Before the lock, two pre-deploy runs at once on one container both returned rc 0 and reported the same stopped
unit and released pids. Now the second waits for the first (lock_timeout, 120 s by default) and then finds what
the first left: nothing to release; or, past its lock_timeout (0 here), fails naming the first - its pid, its
module, how long it has run - before anything is signalled.
"""

import contextlib
import json
import os
import time

from modrun import alive, run_module, start_module

VMID = 7136


def lock_record(host, name):
    path = host.path("run", "gpuops.gpu", name)
    try:
        with open(path, encoding="utf-8") as f:
            return json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def first_release(gpusim, collection):
    """A container with a server that ignores SIGTERM, and a release of it that has taken its lock and lasts 3 s:
    (the server's pid, the device_files option, the release's Popen); both ended after, if they still run."""
    gpusim.ct_create(VMID, hostname="gpu-ct", gpus="all")
    gpusim.ct_start(VMID)
    server = gpusim.hold(gpus=[0], mib=4096, ct=VMID, ignore_term=True)  # SIGTERM ignored: the first run lasts 3 s
    devices = [gpusim.dir + "/dev/nvidia*"]
    first = start_module(gpusim, collection, "gpu_release", {"device_files": devices, "containers": [VMID],
                                                             "grace_period": 3}, tag="-first")
    deadline = time.monotonic() + 20
    try:
        while lock_record(gpusim, f"ct-{VMID}.lock").get("pid") != first.pid and time.monotonic() < deadline:
            time.sleep(0.05)
        yield server, devices, first
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        if alive(server):
            os.kill(server, 9)


def test_a_second_release_of_the_container_fails_naming_the_first_or_waits_for_it(gpusim, collection):
    with first_release(gpusim, collection) as (server, devices, first):
        assert lock_record(gpusim, f"ct-{VMID}.lock")["pid"] == first.pid
        # The fence of a second pre-deploy run on the same container: fails at once, nothing signalled.
        second = run_module(gpusim, collection, "proxmox_gpu_containers",
                            {"device_files": devices, "containers": [VMID], "state": "released", "lock_timeout": 0})
        assert second.get("failed") and second["error"] == "locked", second
        assert second["msg"].startswith(f"another release of CT {VMID} is running (pid {first.pid}, gpu_release, for ")
        assert "Nothing was signalled" in second["msg"] and "release" not in second
        # A release of the whole node waits for the container's too.
        node = run_module(gpusim, collection, "gpu_release", {"device_files": devices, "lock_timeout": 0.3})
        assert node.get("failed") and node["error"] == "locked" and f"CT {VMID}" in node["msg"], node
        # A third that may wait: it runs when the first has finished, and finds nothing left to release.
        third = run_module(gpusim, collection, "gpu_release", {"device_files": devices, "containers": [VMID],
                                                               "lock_timeout": 60})
        out, err = first.communicate(timeout=60)
    result = json.loads(out)
    assert not result.get("failed"), (result.get("msg"), err)
    assert [r["pid"] for r in result["released"]] == [server] and not alive(server)
    assert not third.get("failed") and third["released"] == [] and third["changed"] is False, third
    # ... and says it waited, for whom, so that "released 0" is not read as "nothing was there" (issue 33, item 5)
    waited = third["waited_for_lock"]
    assert waited["for"] == f"CT {VMID}" and waited["pid"] == first.pid and waited["module"] == "gpu_release", waited
    assert waited["text"].startswith(f"waited {waited['seconds']:g} s for another run's release of CT {VMID} (pid"
                                     f" {first.pid}, gpu_release), which ran first"), waited
    assert waited["text"] in json.dumps(third.get("warnings")), third.get("warnings")  # said as a warning too


def test_a_fence_that_waited_for_another_run_says_so(gpusim, collection):
    """Of two runs on one container at once, the fence that waited for the other's lock reports what it found left -
    and says that it waited, how long and for whose run (issue 33, item 5): its "released 0" is not "nothing there"."""
    with first_release(gpusim, collection) as (_server, devices, first):
        fence = run_module(gpusim, collection, "proxmox_gpu_containers",
                           {"device_files": devices, "containers": [VMID], "state": "released", "lock_timeout": 60,
                            "pct": gpusim.path("bin", "pct")})
        first.communicate(timeout=60)
    assert not fence.get("failed") and fence["release"]["released"] == [], fence
    waited = fence["waited_for_lock"]
    assert waited["for"] == f"CT {VMID}" and waited["pid"] == first.pid and waited["module"] == "gpu_release", waited
    assert waited["seconds"] > 0 and waited["text"].startswith(
        f"waited {waited['seconds']:g} s for another run's release of CT {VMID} (pid {first.pid}, gpu_release)"), waited
