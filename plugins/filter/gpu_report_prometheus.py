# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_report_prometheus
short_description: The fleet report as a node_exporter textfile (Prometheus text format)
version_added: 0.2.0
description:
  - The rows of P(gpuops.gpu.gpu_report_rows#filter) as a node_exporter textfile in the Prometheus text exposition
    format - one gauge per GPU for each of C(gpuops_gpu_ready) (1 idle, 0 busy), C(gpuops_gpu_fits) (1 the next
    server fits, 0 not), C(gpuops_gpu_healthy) (1 healthy, 0 lost, in error or a blocking health check fails),
    C(gpuops_gpu_memory_used_bytes), C(gpuops_gpu_memory_free_bytes) and C(gpuops_gpu_memory_total_bytes), labelled
    C(host) (the inventory host), C(gpu) (the index), C(uuid) and C(name). A value that is not known (no fit asked
    for, a GPU that reports no memory) has no sample. No timestamps - node_exporter's textfile collector refuses them.
  - Write it to a C(.prom) file in the collector's directory with M(ansible.builtin.copy), which renames a complete
    file into place.
author:
  - gpuops developers (@gpuops)
extends_documentation_fragment:
  - gpuops.gpu.gpu.report_rows
"""

EXAMPLES = r"""
---
- name: Write the node_exporter textfile
  ansible.builtin.copy:
    dest: /var/lib/prometheus/node-exporter/gpu_report.prom
    content: "{{ report_rows | gpuops.gpu.gpu_report_prometheus }}"
    mode: "0644"
"""

RETURN = r"""
_value:
  description: The textfile, ending in a newline.
  type: str
  sample: |-
    # HELP gpuops_gpu_ready 1 when the GPU is ready for the next server (idle, by the gpu_wait_idle rule), else 0.
    # TYPE gpuops_gpu_ready gauge
    gpuops_gpu_ready{host="pve",gpu="0",uuid="GPU-5f3b8c1e-0000-4000-8000-000000000000",name="NVIDIA H200"} 1
"""

from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import gpu_report_prometheus


class FilterModule:
    """gpuops.gpu.gpu_report_prometheus (its logic lives in gpu_table.py, with the other table filters)."""

    def filters(self):
        return {"gpu_report_prometheus": gpu_report_prometheus}
