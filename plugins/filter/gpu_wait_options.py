# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_wait_options
short_description: Check the options of gpu_wait_idle on the controller, before anything else runs
version_added: 0.1.0
description:
  - Applies the bounds M(gpuops.gpu.gpu_wait_idle) applies to its own options (finite numbers, O(gpuops.gpu.gpu_wait_idle#module:settle) not above
    O(gpuops.gpu.gpu_wait_idle#module:timeout), counts and percentages in range) on the controller, so that a play can refuse a bad value before
    an earlier task (a release) has changed anything. Returns its input unchanged; fails naming the option, or
    the variable that O(names) maps it to.
  - The role C(gpuops.gpu.gpu_idle) checks its wait variables with it before its release.
author:
  - gpuops developers (@gpuops)
options:
  _input:
    description:
      - The options, as M(gpuops.gpu.gpu_wait_idle) takes them (C(timeout), C(settle), C(sleep), C(delay), C(expected_count),
        C(max_memory_used_mib), C(max_utilization_pct), C(min_free_mib), C(min_free_pct), C(leak_after)); null or
        absent means the module's default.
    type: dict
    required: true
  names:
    description: For the message - the variable that sets each option, for example C(timeout) to C(gpu_idle_timeout).
    type: dict
"""

EXAMPLES = r"""
---
- name: Refuse a bad timeout before the release
  ansible.builtin.assert:
    that: "{{ {'timeout': my_timeout} | gpuops.gpu.gpu_wait_options(names={'timeout': 'my_timeout'}) is mapping }}"
    quiet: true
"""

RETURN = r"""
_value:
  description: The input, unchanged.
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.gpu.plugins.module_utils import _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._errors import InvalidOption

# gpu_wait_idle's defaults, for the options the input leaves out (plugins/modules/gpu_wait_idle.py).
DEFAULTS = {"timeout": 300.0, "delay": 0.0, "sleep": 0.5, "settle": 1.0, "expected_count": None,
            "max_memory_used_mib": 64, "max_utilization_pct": None, "min_free_mib": None, "min_free_pct": None,
            "leak_after": 30.0}


def gpu_wait_options(options, names=None):
    if not isinstance(options, dict):
        raise AnsibleFilterError(f"gpu_wait_options: expected a dict of gpu_wait_idle options, got {type(options).__name__}")
    names = names or {}
    params = dict(DEFAULTS)
    params.update({k: v for k, v in options.items() if v is not None})
    try:
        _validate.wait(params)
        _validate.idle(params)
    except InvalidOption as exc:
        option, msg = exc.details.get("option"), exc.msg
        if option in names:
            msg = names[option] + msg[len(option):] if msg.startswith(option) else f"{names[option]}: {msg}"
        raise AnsibleFilterError(msg) from None
    return options


class FilterModule:
    def filters(self):
        return {"gpu_wait_options": gpu_wait_options}
