"""gpu_wait_idle: a GPU that is not selected, lost or failing, never fails a wait on the others;
the nvidia-smi confirmation asks about the selected GPUs only."""

import os

import pytest

from modrun import run_module_text


@pytest.mark.parametrize("backend", ["nvml", "nvidia-smi"])
def test_a_lost_unselected_gpu_never_fails_the_wait(gpusim, collection, backend):
    gpusim.fault(lose_gpu=7)
    args = {"device_files": [os.path.join(gpusim.dir, "dev", "nvidia*")], "gpus": ["0", "3"], "backend": backend,
            "nvidia_smi_path": os.path.join(gpusim.dir, "bin", "nvidia-smi"), "timeout": 10, "settle": 0.2,
            "confirm_with_nvidia_smi": True}
    res, out = run_module_text(gpusim, collection, "gpu_wait_idle", args)
    assert not res.get("failed"), res
    assert res["idle_gpus"] == [0, 3]
    assert sorted(res["confirmation"]) == ["0", "3"]
    assert "Traceback" not in out


def test_a_lost_selected_gpu_still_fails_at_once(gpusim, collection):
    gpusim.fault(lose_gpu=3)
    args = {"device_files": [os.path.join(gpusim.dir, "dev", "nvidia*")], "gpus": ["0", "3"], "timeout": 10}
    res, _out = run_module_text(gpusim, collection, "gpu_wait_idle", args)
    assert res.get("failed") and "GPU 3" in res["msg"] and "fallen off the bus" in res["msg"], res


def test_selected_by_uuid_and_a_gpu_lost_during_the_wait(gpusim, collection):
    # Selected by UUID: nvidia-smi is restricted from the second look on; GPU 7 is lost after the first.
    uuid = gpusim.status()["gpus"][2]["uuid"]
    holder = gpusim.hold(gpus=[2], mib=1024)
    gpusim.fault(lose_gpu=7, after=1.0)
    gpusim_kill_after = 2.0
    import threading

    timer = threading.Timer(gpusim_kill_after, gpusim.kill, args=(holder,))
    timer.start()
    try:
        args = {"device_files": [os.path.join(gpusim.dir, "dev", "nvidia*")], "gpus": [uuid], "backend": "nvidia-smi",
                "nvidia_smi_path": os.path.join(gpusim.dir, "bin", "nvidia-smi"), "timeout": 20, "settle": 0.5}
        res, out = run_module_text(gpusim, collection, "gpu_wait_idle", args)
    finally:
        timer.cancel()
        timer.join()
    assert not res.get("failed"), res
    assert res["idle_gpus"] == [2] and list(res["confirmation"]) == ["2"]
    assert "Traceback" not in out
