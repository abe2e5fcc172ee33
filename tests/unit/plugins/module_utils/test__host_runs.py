# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What predeploy_host's one module run hands on to the wait (_host/runs.handoff): the GPUs of the fenced containers
when the wait names none, and the release's quiet_since and left_holders (else the fence's release's)."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils._host import runs

FENCE = {"running": [129], "containers": [{"vmid": 129, "gpus": [0, 1]}, {"vmid": 130, "gpus": [2]}],
         "release": {"quiet_since": {"clock": 1.0}, "left_holders": [{"pid": 7}]}}
RELEASE = {"quiet_since": {"clock": 2.0}, "left_holders": []}


@pytest.mark.parametrize("fence, release, wait, handed", [
    (None, None, {}, {"left_holders": []}),
    (FENCE, None, {}, {"gpus": ["0", "1"], "quiet_since": {"clock": 1.0}, "left_holders": [{"pid": 7}]}),
    (FENCE, None, {"gpus": ["3"]}, {"quiet_since": {"clock": 1.0}, "left_holders": [{"pid": 7}]}),  # its own GPUs
    (FENCE, RELEASE, {}, {"gpus": ["0", "1"], "quiet_since": {"clock": 2.0}, "left_holders": []}),
    (None, RELEASE, {}, {"quiet_since": {"clock": 2.0}, "left_holders": []}),
    ({"running": [], "containers": [], "gpus": [4]}, None, {}, {"gpus": ["4"], "left_holders": []}),  # none running
    ({"running": [129], "containers": [{"vmid": 129, "gpus": None}]}, None, {}, {"left_holders": []}),  # every GPU
])
def test_the_wait_is_handed_what_the_steps_before_it_found(fence, release, wait, handed):
    assert runs.handoff(fence, release, wait) == handed


def test_the_modules_and_the_steps_share_one_spec_each():
    from ansible_collections.gpuops.gpu.plugins.modules import gpu_release, gpu_wait_idle, proxmox_gpu_containers

    assert [s[2] for s in runs.STEPS] == [proxmox_gpu_containers.ARGUMENT_SPEC, gpu_release.ARGUMENT_SPEC,
                                          gpu_wait_idle.ARGUMENT_SPEC]
