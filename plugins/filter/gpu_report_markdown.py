# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_report_markdown
short_description: The fleet report as a Markdown document
version_added: 0.1.0
description:
  - A C(# GPU report) title and a table with one line per row of P(gpuops.gpu.gpu_report_rows#filter) - host, GPU,
    name, used MiB, free MiB, total MiB, idle, fits (V(yes), V(no), or C(-) when no fit was asked for), health
    (V(ok), else the status and the failing checks, a blocking one followed by V(blocking) in parentheses) and
    holders (else why the GPU is busy, whole; else C(-)).
  - The same rows as a node_exporter textfile are P(gpuops.gpu.gpu_report_prometheus#filter).
author:
  - gpuops developers (@gpuops)
extends_documentation_fragment:
  - gpuops.gpu.gpu.report_rows
"""

EXAMPLES = r"""
---
- name: Write the report
  ansible.builtin.copy:
    dest: /srv/reports/gpu_report.md
    content: "{{ report_rows | gpuops.gpu.gpu_report_markdown }}"
    mode: "0644"
"""

RETURN = r"""
_value:
  description: The Markdown text, ending in a newline.
  type: str
  sample: |-
    # GPU report

    | host | GPU | name | used MiB | free MiB | total MiB | idle | fits | health | holders |
    | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
    | pve | 0 | NVIDIA H200 | 0 | 143771 | 143771 | yes | - | ok | - |
"""

from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import gpu_report_markdown


class FilterModule:
    """gpuops.gpu.gpu_report_markdown (its logic lives in gpu_table.py, with the other table filters)."""

    def filters(self):
        return {"gpu_report_markdown": gpu_report_markdown}
