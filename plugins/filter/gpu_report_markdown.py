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
    name, used MiB, total MiB, idle, health and holders (else why the GPU is busy, whole; else C(-)).
author:
  - gpuops developers (@gpuops)
options:
  _input:
    description: Rows of P(gpuops.gpu.gpu_report_rows#filter).
    type: list
    elements: dict
    required: true
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
"""

from ansible_collections.gpuops.gpu.plugins.filter.gpu_table import gpu_report_markdown


class FilterModule:
    """gpuops.gpu.gpu_report_markdown (its logic lives in gpu_table.py, with the other table filters)."""

    def filters(self):
        return {"gpu_report_markdown": gpu_report_markdown}
