"""gpu_release safety that the integration targets cannot drive: two releases at once, and an
ancestor of the module that holds a GPU device file itself."""

import json
import os
import sys
import time

from modrun import alive, run_module, start_module


def test_two_releases_at_once_both_succeed(gpusim, collection, tmp_path):
    workers = [gpusim.hold(gpus=[i], mib=1024) for i in range(8)]
    bystander = gpusim.hold(gpus=[0], mib=16, device_only=True, name="nvidia-persistenced")
    # With a lock_timeout the second run waits for the first's locks (_lock) and then finds what it left; with the
    # default (0) it would fail at once naming the first (test_release_lock.py).
    args = {"device_files": [gpusim.dir + "/dev/nvidia*"], "grace_period": 5, "lock_timeout": 60}
    procs = [start_module(gpusim, collection, "gpu_release", args, tag=str(n)) for n in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert all(not r.get("failed") and r["survivors"] == [] for r in results), results
    released = {x["pid"] for r in results for x in r["released"]}
    assert set(workers) <= released
    assert not any(alive(w) for w in workers)
    assert alive(bystander)


WRAPPER = """
import subprocess, sys
held = open(sys.argv[1], "rb")          # this ancestor of the module holds a GPU device file
sys.exit(subprocess.call(sys.argv[2:]))
"""


def test_an_ancestor_holding_a_device_file_is_protected(gpusim, collection, tmp_path):
    worker = gpusim.hold(gpus=[3], mib=2048)
    wrapper = start_module(gpusim, collection, "gpu_release", {"device_files": [gpusim.dir + "/dev/nvidia*"], "grace_period": 5},
                           prefix=[sys.executable, "-c", WRAPPER, os.path.join(gpusim.dir, "dev", "nvidia3")])
    out, _err = wrapper.communicate(timeout=60)
    res = json.loads(out)
    assert wrapper.returncode == 0 and not res.get("failed"), res
    assert [x["pid"] for x in res["released"]] == [worker]
    reasons = {x["pid"]: x["reason"] for x in res["protected"]}
    assert reasons.get(wrapper.pid, "").startswith("an ancestor of the module"), reasons
    time.sleep(0.1)
    assert not alive(worker)


def test_check_mode_signals_nothing_and_reports_the_same_targets(gpusim, collection):
    pids = [gpusim.hold(gpus=[i], mib=512) for i in (0, 1)]
    check = run_module(gpusim, collection, "gpu_release", {"device_files": [gpusim.dir + "/dev/nvidia*"]}, check_mode=True)
    assert check["changed"] and sorted(x["pid"] for x in check["released"]) == sorted(pids)
    assert all(alive(p) for p in pids)
    real = run_module(gpusim, collection, "gpu_release", {"device_files": [gpusim.dir + "/dev/nvidia*"]})
    assert sorted(x["pid"] for x in real["released"]) == sorted(pids)
