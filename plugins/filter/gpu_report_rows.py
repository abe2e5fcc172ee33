# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_report_rows
short_description: The rows of the fleet report for the GPUs of one host
version_added: 0.1.0
description:
  - One row per GPU, for the C(gpuops.gpu.gpu_report) playbook, P(gpuops.gpu.gpu_report_table#filter) and
    P(gpuops.gpu.gpu_report_markdown#filter).
  - The holders are what the holding model put in the GPU's C(blockers), named as P(gpuops.gpu.gpu_table#filter) names
    them; a holder in a container that O(containers) maps to an inventory host is named with it (C(CT 129 gpu-ct)).
author:
  - gpuops developers (@gpuops)
options:
  _input:
    description: GPU dicts as the modules return them (C(ansible_facts.gpu_devices)).
    type: list
    elements: dict
    required: true
  host:
    description: The inventory host the rows are for.
    type: str
    required: true
  seen_from:
    description: The host the facts were gathered on (the Proxmox VE node of a container); O(host) when not given.
    type: str
  containers:
    description: "The containers of the node the facts were gathered on, C({vmid: inventory hostname})."
    type: dict
  holder_processes:
    description:
      - C(ansible_facts.gpu_holder_processes) of the same M(gpuops.gpu.gpu_facts) run - the details of the device-file
        holders, by pid (a GPU's C(holders) name only pids). Without it a device-file holder that keeps a GPU busy is
        named by its pid alone.
    type: dict
"""

EXAMPLES = r"""
---
- name: One row per GPU, the holders in CT 129 named gpu-ct
  ansible.builtin.set_fact:
    report_rows: >-
      {{ ansible_facts.gpu_devices | gpuops.gpu.gpu_report_rows(inventory_hostname, containers={129: 'gpu-ct'},
         holder_processes=ansible_facts.gpu_holder_processes) }}
"""

RETURN = r"""
_value:
  description:
    - C(host), C(seen_from), C(index), C(name), C(uuid), C(used_mib), C(total_mib), C(free_mib), C(idle), C(health)
      (its status), C(holders) (pids), C(holders_text), C(container_hosts) (the inventory hosts of the containers the
      holders are in) and C(busy_reasons); an unknown value is null.
    - The fit - C(fits) and C(need_mib) (the GPU's C(fit), null when the facts were gathered without C(min_free_mib)
      and C(min_free_pct)).
    - The health - C(checks) (the names of the failing health checks), C(blocking_checks) (those that keep the GPU from
      being ready), C(healthy) (true when the status is V(ok) and no blocking check fails, false otherwise, null when
      the status is unknown) and C(unsupported) (the fields the driver or GPU cannot give).
  type: list
  elements: dict
"""

from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import gpu_report_rows


class FilterModule:
    """gpuops.gpu.gpu_report_rows (its logic lives in gpu_table.py, with the other table filters)."""

    def filters(self):
        return {"gpu_report_rows": gpu_report_rows}
