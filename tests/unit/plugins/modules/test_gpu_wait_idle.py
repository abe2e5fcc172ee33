# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils._errors import BackendError
from ansible_collections.gpuops.gpu.plugins.modules import gpu_wait_idle

UUID = "GPU-8f0e0000-0000-0000-0000-000000000000"
ROW = f"0, {UUID}, NVIDIA H200, 1650000000000, 00000000:18:00.0, 143771, 0, 143771, 0, 0, 0, 31, 76.00, Enabled, Default, Disabled, 580.159.03"
# What nvidia-smi prints when one GPU fails: the rows of the others, exit 255 (about 1,400 characters for 8 GPUs).
FAILED = (255, "\n".join([ROW] * 8), "Unable to determine the device handle for GPU5: 0000:BA:00.0: Unknown Error")
GOOD = (0, ROW + "\n", "")
APPS = (0, "", "")


class FakeModule:
    def get_bin_path(self, name, required=False, opt_dirs=None):
        return "/usr/bin/nvidia-smi"


class FakeTaker:
    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = []

    def run_smi(self, argv):
        self.calls.append(argv)
        kind = "apps" if argv[1].startswith("--query-compute-apps") else "gpus"
        return self.answers.pop(0) if kind == "gpus" else APPS


PARAMS = {"confirm_with_nvidia_smi": True, "nvidia_smi_path": "nvidia-smi", "sleep": 0.5, "max_memory_used_mib": 64}
GPUS = [{"index": 0, "uuid": UUID}]


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    monkeypatch.setattr(gpu_wait_idle.time, "sleep", lambda s: None)


@pytest.mark.parametrize("answers, attempts", [([GOOD], 1), ([FAILED, GOOD], 2)], ids=["first try", "retried once"])
def test_confirm_agrees(answers, attempts):
    taker = FakeTaker(answers)
    seen, disagreement = gpu_wait_idle.confirm(FakeModule(), taker, GPUS, PARAMS)
    assert seen == {"0": {"used_mib": 0, "pids": []}} and disagreement == ""
    assert len([c for c in taker.calls if c[1].startswith("--query-gpu")]) == attempts


def test_confirm_fails_after_two_tries_with_a_short_message():
    with pytest.raises(BackendError) as info:
        gpu_wait_idle.confirm(FakeModule(), FakeTaker([FAILED, FAILED]), GPUS, PARAMS)
    msg = info.value.msg
    assert msg.startswith("confirm_with_nvidia_smi: nvidia-smi failed twice on GPU(s) 0")
    assert len(msg) < 500 and msg.count(UUID) <= 1, msg


def test_confirm_off_runs_nothing():
    taker = FakeTaker([])
    assert gpu_wait_idle.confirm(FakeModule(), taker, GPUS, dict(PARAMS, confirm_with_nvidia_smi=False)) == (None, "")
    assert taker.calls == []


@pytest.mark.parametrize("text, limit, expected", [("a  b\nc", 240, "a b c"), ("x" * 300, 10, "xxxxxxx...")])
def test_short(text, limit, expected):
    assert gpu_wait_idle._short(text, limit) == expected
