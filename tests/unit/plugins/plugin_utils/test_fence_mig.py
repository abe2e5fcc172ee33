# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a wait after the fence covers of containers with MIG devices (proxmox_fence_result's container_gpus): here,
with the controller's plugins (the module_utils tests run on every target Python, without ansible's controller code)."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.plugin_utils._results import proxmox_fence_result
from ansible_collections.gpuops.gpu.tests.unit.plugins.module_utils.test__mig import A, B


@pytest.mark.parametrize("rows, expected", [
    # one container with MIG device B of GPU 0, another with GPU 1 whole
    ([{"vmid": 1, "wait_gpus": [0], "wait_mig_devices": {"0": [B]}}, {"vmid": 2, "wait_gpus": [1]}], [1, B]),
    # GPU 0 whole in one container and through a MIG device in another: whole
    ([{"vmid": 1, "wait_gpus": [0], "wait_mig_devices": {"0": [B]}}, {"vmid": 2, "wait_gpus": [0]}], [0]),
    # two containers with two MIG devices of GPU 0
    ([{"vmid": 1, "wait_gpus": [0], "wait_mig_devices": {"0": [B]}},
      {"vmid": 2, "wait_gpus": [0], "wait_mig_devices": {"0": [A]}}], [B, A]),
    # no MIG: as before
    ([{"vmid": 1, "wait_gpus": [0, 2]}, {"vmid": 2, "wait_gpus": [1]}], [0, 1, 2]),
])
def test_the_wait_after_a_fence_covers_mig_devices(rows, expected):
    containers = {"running": [r["vmid"] for r in rows], "containers": [dict(r, gpus=r["wait_gpus"]) for r in rows]}
    assert proxmox_fence_result(containers, release={"released": []})["container_gpus"] == expected
