# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_report_table
short_description: The fleet report as aligned lines to print
version_added: 0.1.0
description:
  - A header and one line per row of P(gpuops.gpu.gpu_report_rows#filter) - host, GPU, name, used and total MiB,
    V(idle) or V(busy), whether the next server fits (V(yes), V(no), or C(-) when no fit was asked for), the health
    (V(ok), else the status and the failing checks, a blocking one followed by V(blocking) in parentheses) and the
    holders (else why the GPU is busy, cut short; else C(-)).
author:
  - gpuops developers (@gpuops)
extends_documentation_fragment:
  - gpuops.gpu.gpu.report_rows
"""

EXAMPLES = r"""
---
- name: Show the report
  ansible.builtin.debug:
    msg: "{{ report_rows | gpuops.gpu.gpu_report_table }}"
"""

RETURN = r"""
_value:
  description: The lines, the header first.
  type: list
  elements: str
"""

from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import gpu_report_table


class FilterModule:
    """gpuops.gpu.gpu_report_table (its logic lives in gpu_table.py, with the other table filters)."""

    def filters(self):
        return {"gpu_report_table": gpu_report_table}
