# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The filters count what a result in summary (_bound: the modules' detail option) left out: here, with the
controller's plugins (the module_utils tests run on every target Python, without ansible's controller code)."""

from __future__ import annotations

from ansible_collections.gpuops.gpu.plugins.plugin_utils._results import gpu_idle_result
from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import gpu_blockers, state_text
from ansible_collections.gpuops.gpu.plugins.module_utils import _bound
from ansible_collections.gpuops.gpu.tests.unit.plugins.module_utils.test__bound import busy_gpu, release_result


def test_the_filters_count_what_a_summary_left_out():
    gpu = _bound.gpu(busy_gpu(0, list(range(100, 130)), []))
    details = {str(p): {"pid": p, "name": f"w{p}"} for p in range(100, 130)}
    assert state_text(compact_gpu_expanded(gpu, details)).endswith(f"+{30 - 3} more")
    assert gpu_blockers([gpu], holder_processes=details)[0].endswith(f"+{30 - _bound.CAP} more")
    release = _bound.bound(release_result(64, 2, 40))
    wait = {"would_wait": True, "gpus": release["gpus"], "idle_gpus": []}
    summary = gpu_idle_result(wait, release=release, check_mode=True, release_required=True)["summary"]
    assert summary["ready"] is False
    assert len(summary["released"]) + summary["more"]["released"] == 64 * 2 + 40


def compact_gpu_expanded(gpu, details):
    from ansible_collections.gpuops.gpu.plugins.module_utils._snapshot import expand_gpus  # noqa: PLC0415
    return expand_gpus([gpu], details)[0]
