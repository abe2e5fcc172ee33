# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_blockers
short_description: What keeps each busy GPU busy, one line per GPU, for a failure message
version_added: 0.1.0
description:
  - One string per GPU that is not idle, naming what the holding model put in its C(blockers) - the driver's
    processes first, then the device-file holders that count - with their memory (see the sample below).
  - A busy GPU with no holder says why, its C(busy_reasons) whole.
  - Idle GPUs are left out; a missing field shows as C(?). Holders are named as P(gpuops.gpu.gpu_table#filter) names them.
author:
  - gpuops developers (@gpuops)
options:
  _input:
    description: GPU dicts as the modules return them (C(ansible_facts.gpu_devices), the C(gpus) of M(gpuops.gpu.gpu_wait_idle)).
    type: list
    elements: dict
    required: true
  holder_processes:
    description:
      - The details of the device-file holders, by pid, that the modules return beside their GPUs (C(holder_processes)
        of a result, C(ansible_facts.gpu_holder_processes) of M(gpuops.gpu.gpu_facts)); a GPU's C(holders) name only
        pids. Without it a device-file holder that keeps a GPU busy is named by its pid alone.
    type: dict
"""

EXAMPLES = r"""
---
- name: Fail with the busy GPUs
  ansible.builtin.fail:
    msg: "{{ waited.gpus | gpuops.gpu.gpu_blockers(holder_processes=waited.holder_processes | default({})) | join('; ') }}"
  when: waited.gpus | rejectattr('idle') | list | length > 0
"""

RETURN = r"""
_value:
  description: One line per busy GPU, in the order of the input.
  type: list
  elements: str
  sample:
    - "GPU 3: pid 8812 python3 (CT 129, sglang.service) 130048 MiB"
    - "GPU 2: 1200 MiB used by processes not visible from this PID namespace (another container or the host), or a leaked context"
"""

from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import gpu_blockers


class FilterModule:
    """gpuops.gpu.gpu_blockers (its logic lives in gpu_table.py, with the other table filters)."""

    def filters(self):
        return {"gpu_blockers": gpu_blockers}
