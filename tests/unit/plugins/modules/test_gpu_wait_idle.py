# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import inspect

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _selection, _wait
from ansible_collections.gpuops.gpu.plugins.module_utils._errors import BackendError
from ansible_collections.gpuops.gpu.plugins.module_utils._host.wait_io import WaitIO
from ansible_collections.gpuops.gpu.plugins.modules import gpu_wait_idle

UUID = "GPU-8f0e0000-0000-0000-0000-000000000000"
ROW = f"0, {UUID}, NVIDIA H200, 1650000000000, 00000000:18:00.0, 143771, 0, 143771, 0, 0, 0, 31, 76.00, Enabled, Default, Disabled, Disabled, 580.159.03"
# What nvidia-smi prints when one GPU fails: the rows of the others, exit 255 (about 1,400 characters for 8 GPUs).
FAILED = (255, "\n".join([ROW] * 8), "Unable to determine the device handle for GPU5: 0000:BA:00.0: Unknown Error")
GOOD = (0, ROW + "\n", "")
APPS = (0, "", "")


class FakeTaker:
    """The SnapshotTaker's nvidia-smi runner, answering from a script (no nvidia-smi in unit tests)."""

    smi = None
    smi_ids = None
    selection = _selection.Selection()

    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = []

    def run_smi(self, argv):
        self.calls.append(argv)
        kind = "apps" if argv[1].startswith("--query-compute-apps") else "gpus"
        return self.answers.pop(0) if kind == "gpus" else APPS


PARAMS = {"confirm_with_nvidia_smi": True, "nvidia_smi_path": "nvidia-smi", "sleep": 0.5, "max_memory_used_mib": 64,
          "gpus": None, "expected_count": None, "progress_state": None}
GPUS = [{"index": 0, "uuid": UUID}]


def confirm(taker, params=None):
    """_wait.confirm over WaitIO's nvidia-smi query (the real CSV parser, _smi), the host's sleep made a no-op."""
    params = params or PARAMS
    io = WaitIO(taker, params, lambda name: "/usr/bin/nvidia-smi", None)
    io.sleep = lambda seconds: None
    return _wait.confirm(params, io, GPUS)


@pytest.mark.parametrize("answers, attempts", [([GOOD], 1), ([FAILED, GOOD], 2)], ids=["first try", "retried once"])
def test_confirm_agrees(answers, attempts):
    taker = FakeTaker(answers)
    seen, disagreement = confirm(taker)
    assert seen == {"0": {"used_mib": 0, "pids": []}} and disagreement == ""
    assert len([c for c in taker.calls if c[1].startswith("--query-gpu")]) == attempts


def test_confirm_fails_after_two_tries_with_a_short_message():
    with pytest.raises(BackendError) as info:
        confirm(FakeTaker([FAILED, FAILED]))
    msg = info.value.msg
    assert msg.startswith("confirm_with_nvidia_smi: nvidia-smi failed twice on GPU(s) 0")
    assert len(msg) < 500 and msg.count(UUID) <= 1, msg


def test_confirm_off_runs_nothing():
    taker = FakeTaker([])
    assert confirm(taker, dict(PARAMS, confirm_with_nvidia_smi=False)) == (None, "")
    assert taker.calls == []


@pytest.mark.parametrize("text, limit, expected", [("a  b\nc", 240, "a b c"), ("x" * 300, 10, "xxxxxxx...")])
def test_short(text, limit, expected):
    assert _wait.short(text, limit) == expected


def test_the_module_keeps_its_spec_and_a_short_main():
    """The wait's orchestration lives in _wait.Wait (unit-tested there): main() builds the module and the host."""
    assert {"timeout", "settle", "leak_after", "reset_leaked", "progress_slice", "progress_state"} <= set(gpu_wait_idle.ARGUMENT_SPEC)
    source = inspect.getsource(gpu_wait_idle.main)
    code = [line for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(code) <= 60, len(code)
