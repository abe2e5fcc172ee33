# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_query
short_description: Ask a JMESPath question of the GPU facts
version_added: 0.1.0
description:
  - Evaluates a JMESPath expression over GPU facts (C(ansible_facts.gpu_devices), a registered
    M(gpuops.gpu.gpu_wait_idle) result, or any data), on the controller.
  - A bad expression fails with the position and the reason, not a stack trace.
author:
  - gpuops developers (@gpuops)
options:
  _input:
    description: The data to query, usually C(ansible_facts.gpu_devices).
    type: raw
    required: true
  expression:
    description: A JMESPath expression.
    type: str
    required: true
requirements:
  - jmespath (on the controller)
"""

EXAMPLES = r"""
---
- name: The GPUs that are not idle, with what holds them
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpu_devices | gpuops.gpu.gpu_query('[?!idle].{gpu: index, why: busy_reasons}') }}"

- name: Every process in CT 129, on any GPU
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpu_devices | gpuops.gpu.gpu_query('[].processes[?container.id==`129`][].pid') }}"

- name: Used memory per GPU
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpu_devices | gpuops.gpu.gpu_query('[].[index, memory.used]') }}"
"""

RETURN = r"""
_value:
  description: What the expression selects (a list, a dict, a scalar or null).
  type: raw
"""

from ansible.errors import AnsibleFilterError

try:
    import jmespath
    HAS_JMESPATH = True
except ImportError:  # pragma: no cover - depends on the controller
    HAS_JMESPATH = False


def gpu_query(data, expression):
    """JMESPath over GPU facts."""
    if not HAS_JMESPATH:
        raise AnsibleFilterError("gpuops.gpu.gpu_query needs the jmespath Python package on the controller: pip install jmespath")
    if not isinstance(expression, str) or not expression.strip():
        raise AnsibleFilterError("gpuops.gpu.gpu_query: the expression must be a non-empty string")
    try:
        compiled = jmespath.compile(expression)
    except jmespath.exceptions.ParseError as exc:
        raise AnsibleFilterError(f"gpuops.gpu.gpu_query: bad JMESPath expression {expression!r}: {exc}") from None
    try:
        return compiled.search(data)
    except jmespath.exceptions.JMESPathError as exc:
        raise AnsibleFilterError(f"gpuops.gpu.gpu_query: {expression!r} failed on this data: {exc}") from None


class FilterModule:
    """gpuops.gpu filters."""

    def filters(self):
        return {"gpu_query": gpu_query}
