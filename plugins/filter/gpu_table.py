# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_table
short_description: The GPUs of one snapshot (or a before and an after) as short lines to print
version_added: 0.1.0
description:
  - Renders GPU facts (C(ansible_facts.gpu_devices), or the C(gpus) of a M(gpuops.gpu.gpu_wait_idle) result) as a
    list of lines that one M(ansible.builtin.debug) task prints - a header, then one line per GPU with its index,
    name, used and total memory and what holds it (see the sample below).
  - What holds a GPU is what the holding model put in its C(blockers) - the driver's processes first, then the
    device-file holders that count. Each is named by its pid and name, then, in parentheses and when known, its
    container, its systemd unit, C(device file) for a device-file holder, and the memory it uses; a pid that does
    not exist from where the facts were gathered is said to be not visible from here. After three holders the line
    says C(+N more).
  - A GPU with no holder says V(idle), or why it is busy - its C(busy_reasons), each cut to about 70 characters
    (the facts and the C(gpu_blockers) filter keep them whole).
  - With O(before), each line shows the memory as before C(->) after, and the holders before C(->) after, the GPUs
    matched by UUID (by index when a UUID is missing).
  - Missing fields show as C(?).
  - The same file holds the filters C(gpu_blockers) (the busy GPUs, one line each, for a failure message),
    C(gpu_report_rows), C(gpu_report_table), C(gpu_report_markdown) and C(gpu_report_prometheus) (the fleet report of the playbook
    C(gpuops.gpu.gpu_report)).
author:
  - gpuops developers (@gpuops)
options:
  _input:
    description: The GPUs now (after), a list of GPU dicts as the modules return them.
    type: list
    elements: dict
    required: true
  before:
    description: The GPUs of an earlier snapshot, to show what changed.
    type: list
    elements: dict
  host:
    description: The host the GPUs belong to, for the header.
    type: str
    default: ''
  seen_from:
    description: The host the facts were gathered on (the Proxmox VE node of a container); shown when it is not O(host).
    type: str
    default: ''
  title:
    description: What the table is, for the header, such as V(before) or V(after).
    type: str
    default: ''
  driver:
    description: The driver - C(ansible_facts.gpu_driver) (its C(driver_version) and C(backend)), or a version string.
    type: raw
  gpu_count:
    description: How many GPUs the driver shows (C(ansible_facts.gpu_count)); the header says how many of them are shown when it differs.
    type: int
  holder_processes:
    description:
      - The details of the device-file holders, by pid, that the modules return beside their GPUs (C(holder_processes)
        of a M(gpuops.gpu.gpu_release) or M(gpuops.gpu.gpu_wait_idle) result, C(ansible_facts.gpu_holder_processes) of
        M(gpuops.gpu.gpu_facts)); a GPU's C(holders) name only pids. Without it a device-file holder that keeps a GPU
        busy is named by its pid alone (the driver's processes always have their details).
      - Give one mapping for O(_input) and O(before) together (the two lists of one result share it).
    type: dict
"""

EXAMPLES = r"""
---
- name: Show the GPUs
  ansible.builtin.debug:
    msg: >-
      {{ ansible_facts.gpu_devices | gpuops.gpu.gpu_table(host=inventory_hostname, title='now',
         driver=ansible_facts.gpu_driver, gpu_count=ansible_facts.gpu_count,
         holder_processes=ansible_facts.gpu_holder_processes) }}

- name: Show what a release changed
  ansible.builtin.debug:
    msg: >-
      {{ released.gpus | gpuops.gpu.gpu_table(before=released.gpus_before | default(none),
         holder_processes=released.holder_processes, host=inventory_hostname, title='after') }}

- name: Fail with the busy GPUs, one line each
  ansible.builtin.fail:
    msg: "{{ waited.gpus | gpuops.gpu.gpu_blockers(holder_processes=waited.holder_processes | default({})) | join('; ') }}"
  when: waited.gpus | rejectattr('idle') | list | length > 0
"""

RETURN = r"""
_value:
  description: The lines, a header first, then one line per GPU.
  type: list
  elements: str
  sample:
    - "after - gpu-ct: 8 GPU(s), driver 550.163.01 (nvml), seen from pve"
    - "GPU 0  NVIDIA H200  130048 -> 0 / 143771 MiB  pid 8812 python3 (CT 129, sglang.service, 130048 MiB) -> idle"
    - "GPU 1  NVIDIA H200    1200 -> 0 / 143771 MiB  pid 8813 (not visible from here) -> idle"
    - "GPU 2  NVIDIA H200       0 -> 0 / 143771 MiB  idle -> idle"
"""

from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import gpu_table


class FilterModule:
    """gpuops.gpu table filters."""

    def filters(self):
        return {"gpu_table": gpu_table}
