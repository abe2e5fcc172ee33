# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The controller's filters read the results' compact form (_snapshot.compact_result) as they read the
snapshot's. Here, not beside the module_utils tests: ansible-test runs those without the controller's code."""

from __future__ import annotations

import json

from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import gpu_blockers, gpu_report_rows, gpu_table
from ansible_collections.gpuops.gpu.plugins.module_utils._snapshot import compact_result

from ansible_collections.gpuops.gpu.tests.unit.plugins.module_utils.test__snapshot_output import host


def test_the_filters_read_the_compact_form():
    """gpu_table, gpu_blockers and gpu_report_rows name a device-file holder that keeps a GPU busy from
    holder_processes, as they named it from the snapshot's form."""
    gpus = host(2, cuda=1)
    # GPU 1's process list could not be read: its device holders keep it busy (blockers)
    gpus[1] = dict(gpus[1], idle=False, blockers=[1000 + 2, 3000])
    result = json.loads(json.dumps(compact_result({"gpus": gpus})))
    details = result["holder_processes"]
    assert gpu_blockers(result["gpus"], holder_processes=details) == gpu_blockers(gpus)
    assert "pid 3000 cuda-client (device file)" in gpu_blockers(gpus)[-1]
    assert gpu_table(result["gpus"], before=result["gpus"], holder_processes=details) == gpu_table(gpus, before=gpus)
    assert gpu_report_rows(result["gpus"], "h", holder_processes=details) == gpu_report_rows(gpus, "h")
    # without the details: the pid, and that it is a device file
    assert "pid 3000 ? (device file)" in gpu_blockers(result["gpus"])[-1]
