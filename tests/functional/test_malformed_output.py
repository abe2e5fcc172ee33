"""Every module against an nvidia-smi that prints short rows (issue 28, item 2): a failed task with the error kind
unreadable_output, the row that broke it and what to do - never a traceback. Before, gpu_facts and gpu_wait_idle
ended in a ValueError traceback from _smi.py, and gpu_release called it invalid_option.

The nvidia-smi here is the simulator's behind a wrapper that cuts the last field off each row of a --query-gpu
answer (what a driver whose listing and answer disagree, or an output cut short, looks like)."""

import os
import stat

import pytest
from modrun import alive, run_module

SHORT = """#!/bin/sh
case "$*" in
  *--help*) exec {smi} "$@" ;;
  *--query-gpu*) {smi} "$@" | sed 's/, [^,]*$//' ; exit 0 ;;
  *) exec {smi} "$@" ;;
esac
"""


@pytest.fixture
def short_smi(gpusim, tmp_path):
    path = tmp_path / "nvidia-smi"
    path.write_text(SHORT.format(smi=gpusim.path("bin", "nvidia-smi")))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def args(host, smi, **more):
    return dict({"device_files": [host.dir + "/dev/nvidia*"], "backend": "nvidia-smi", "nvidia_smi_path": smi}, **more)


@pytest.mark.parametrize("module, more", [
    ("gpu_facts", {}),
    ("gpu_wait_idle", {"timeout": 5}),
    ("gpu_release", {"pids": []}),
])
def test_a_short_row_is_unreadable_output_not_a_traceback(gpusim, collection, short_smi, module, more):
    server = gpusim.hold(gpus=[0], mib=1024)
    try:
        res = run_module(gpusim, collection, module, args(gpusim, short_smi, **more))  # no JSON: a traceback
        assert res.get("failed") and res["error"] == "unreadable_output", res
        assert res["msg"].startswith("nvidia-smi --query-gpu: expected "), res["msg"]
        assert "fields, got" in res["msg"] and "backend: nvml" in res["msg"], res["msg"]
        assert res["error_details"]["source"] == "nvidia-smi --query-gpu" and res["error_details"]["sample"]
        assert "exception" not in res and alive(server)
    finally:
        os.kill(server, 9)


def test_the_nvml_wait_with_a_short_confirmation_fails_with_its_kind(gpusim, collection, short_smi):
    # NVML reads the GPUs; nvidia-smi's confirmation query prints short rows: asked twice, then a backend failure.
    res = run_module(gpusim, collection, "gpu_wait_idle",
                     {"device_files": [gpusim.dir + "/dev/nvidia*"], "nvidia_smi_path": short_smi,
                      "confirm_with_nvidia_smi": True, "timeout": 10, "settle": 0.2})
    assert res.get("failed") and res["error"] == "backend", res
    assert "nvidia-smi failed twice" in res["msg"] and "expected " in res["msg"], res["msg"]
