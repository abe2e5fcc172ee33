"""gpu_wait_idle's timeout messages as operators read them (issue 20): one sentence per cause, with its GPUs.

Two cases seen in the field, reproduced on the simulator (tests/gpusim, README "Health", ``release_lag_ms``):

(a) a leaked context (memory held with no process) on a GPU whose device node a process with no context holds
    (a bystander, as CUDA opens every GPU's node): the bystander keeps no GPU busy (docs/holding-model.md,
    lingering), so the timeout names the leaked MiB and never blames it;
(b) the driver frees the memory of 8 exited servers 30 s after their exit, past the timeout: one sentence for the
    8 GPUs, with the MiB still in use and "raise timeout (gpu_idle_timeout)", not one long sentence per GPU.
"""

import pytest
from modrun import alive, run_module

WAIT = {"settle": 0.3, "sleep": 0.1}


def wait(host, collection, **args):
    return run_module(host, collection, "gpu_wait_idle", dict(WAIT, device_files=[host.dir + "/dev/nvidia*"], **args))


@pytest.mark.parametrize("leak_after, kind", [(1.0, "leaked"), (30.0, "unchanged")], ids=["leaked", "not yet a leak"])
def test_a_leak_beside_a_device_node_bystander_names_the_leak_not_the_bystander(gpusim_factory, collection, leak_after,
                                                                                kind):
    host = gpusim_factory(gpus=3)
    host.fault(leak={2: 2048})
    bystander = host.hold(gpus=[2], device_only=True, name="gpu-probe")
    res = wait(host, collection, gpus=["2"], timeout=3, leak_after=leak_after)
    msg = res["msg"]
    assert res.get("failed") and res["error"] == "wait_timeout", res
    assert msg.startswith("timed out after 3 s: "), msg
    # the leaked memory is named, with its MiB figure, and what to do about it
    if kind == "leaked":
        assert "GPU 2: memory leaked (2048 MiB on GPU 2, not freed for" in msg, msg
    else:
        assert "GPU 2: 2048 MiB used and no process holds it" in msg and "unchanged for" in msg, msg
    assert "nvidia-smi -r -i 2" in msg, msg
    # the bystander is not what keeps the GPU busy: it is named as lingering, never as the user of the GPU
    assert f"GPU 2 is used by pid {bystander}" not in msg, msg
    assert f"pid {bystander} (gpu-probe) holds only the device node, with no context (lingering" in msg, msg
    assert res["memory"]["2"]["kind"] == kind and res["memory"]["2"]["used"] == 2048, res["memory"]
    assert alive(bystander)  # a wait never signals anything


def test_a_release_lag_past_the_timeout_on_8_gpus_is_one_sentence_that_says_raise_timeout(gpusim_factory, collection):
    host = gpusim_factory(gpus=8, release_lag_ms=30000)
    holders = [host.hold(gpus=[i], mib=40960) for i in range(8)]
    for pid in holders:
        host.kill(pid)
    res = wait(host, collection, timeout=3)
    msg = res["msg"]
    assert res.get("failed") and res["error"] == "wait_timeout", res
    assert msg.startswith("timed out after 3 s: GPUs 0, 1, 2, 3, 4, 5, 6, 7: 40960 MiB used on each and no process"
                          " holds them"), msg
    assert msg.count("raise timeout (gpu_idle_timeout)") == 1, msg
    # one sentence: the GPUs named once, no sentence of its own per GPU
    assert msg.count("no process holds") == 1 and not any(f"GPU {i}:" in msg for i in range(8)), msg
    assert len(msg) < 600, (len(msg), msg)
    assert all(res["memory"][str(i)]["kind"] == "unchanged" for i in range(8)), res["memory"]
