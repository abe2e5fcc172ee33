#!/usr/bin/python
# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# The action plugin gpuops.gpu.predeploy_host (plugins/action/predeploy_host.py) runs on the controller and runs this
# module on the delegate: the fence, the release and the wait's first slice in one module run (module_utils/_host/runs).

from __future__ import annotations

DOCUMENTATION = r"""
module: predeploy_host
short_description: One GPU host's pre-deploy job in one task - fence, release, wait, record, show
version_added: 0.2.0
description:
  - The task that the playbook C(gpuops.gpu.predeploy) and the roles C(gpuops.gpu.proxmox_fence) and
    C(gpuops.gpu.gpu_idle) run once per host. Over the connection of the task's C(delegate_to) (the Proxmox VE node
    of a GPU host that is a container, else the host) it runs, in order, the fence (O(fence) -
    M(gpuops.gpu.proxmox_gpu_containers), state V(released), or V(shutdown) with C(proxmox_fence_method=shutdown)),
    the release (when C(gpu_idle_release) is set - M(gpuops.gpu.gpu_release)) and the wait (O(wait) -
    M(gpuops.gpu.gpu_wait_idle), in slices of 10 s with a progress line between them), each only when the one before
    proved its part.
  - Its settings are the roles' variables (C(proxmox_fence_*), C(gpu_idle_*); see the roles' documentation), read
    from the host's variables - a C(proxmox_fence_*) variable the host does not set is taken from the node's - and
    checked against the roles' argument specs (their types, choices and defaults), the wait's bounds too, before
    anything runs. A bad value fails the task naming the variable.
  - Records the facts C(proxmox_fence_result) and C(gpu_idle_result) (see the return values) and prints the GPUs
    before and after, one line per GPU; with C(-v) the processes released, left alive or respawned (at most 8
    lines and a count of the others; every one with C(-vv)). No printed line is over 2,000 characters. Its result
    (the artifacts) is printed from C(-vv) on, not at C(-v). With C(--diff) the modules' per-GPU before and after
    (and the units) go to Ansible's diff display.
  - It does not fail because the GPUs are not ready - a failure is recorded and published, and the next task fails
    the host once with C(gpu_idle_result.message) (at most 1,800 characters as Ansible prints it; the whole
    diagnosis in C(gpu_idle_result.detail_file) on the controller and at C(-vv)). It fails only on its own bad
    settings.
  - Ready only when proved - a module result counts as a success only when it has the keys a success of that
    module has and no sign of a failure (for M(gpuops.gpu.gpu_wait_idle) C(ready=true) and the GPUs it checked,
    each idle; in check mode C(would_wait)). Anything else is not ready with C(failure.kind) - the module's own
    C(error) when it gives one (V(scope), V(timeout), ...), else V(failed), V(crashed) (killed by a signal, no
    JSON, an unhandled exception), V(unreachable) (the delegate could not be reached), V(skipped) (a tag of this
    run - C(--tags gpuops_fence), C(--skip-tags gpuops_wait) - left the wait out), V(missing), V(incomplete) or
    V(inconsistent) (ready next to a GPU its own result shows busy); V(fence) when the fence before the wait failed.
  - Publishes the artifacts with C(set_stats) semantics (RV(ansible_stats)) - a fence alone adds its host's
    C(proxmox_fence_summary); with O(wait=true) the host whose answer completes its batch publishes the play's
    (only that one, so that no earlier, partial view is taken up after it). Every host rewrites O(result_file).
author:
  - gpuops developers (@gpuops)
options:
  fence:
    description:
      - Fence first, on the task's C(delegate_to) (a Proxmox VE node) - the containers O(containers), else
        C(proxmox_fence_containers).
    type: bool
    default: false
  containers:
    description: The vmids to fence (the playbook gives the host's C(proxmox_vmid)); unset - C(proxmox_fence_containers).
    type: list
    elements: str
  wait:
    description:
      - Release (C(gpu_idle_release)) and wait, and record C(gpu_idle_result); V(false) - the fence only (the role
        C(gpuops.gpu.proxmox_fence)).
    type: bool
    default: true
  result_file:
    description:
      - With O(wait=true), a path on the controller where the run's answer is written, as JSON
        (C({ready, elapsed, hosts - {host - {ready, reason, failure, blockers, elapsed, check_mode}}})); every host of
        the play is in it, one without a result as not ready with reason C(no result ...). Each host rewrites it
        (under a lock) when its answer is known, so it is whole after the last one, on failure too.
      - Unset - the variable C(predeploy_result_file) (C(-e predeploy_result_file=/path)), else none is written.
    type: path
  steps:
    description:
      - Internal - the action plugin sets it to run the steps (C(fence), C(release), C(wait), each with the options of
        its module, M(gpuops.gpu.proxmox_gpu_containers), M(gpuops.gpu.gpu_release), M(gpuops.gpu.gpu_wait_idle)) in
        one module run on the delegate; a task that sets it fails.
    type: dict
extends_documentation_fragment:
  - gpuops.gpu._attributes
attributes:
  check_mode:
    support: full
    details:
      - Each module runs in check mode - nothing is signalled or stopped; busy GPUs are C(would_wait).
  diff_mode:
    support: full
    details:
      - The modules' diffs (per GPU before and after, the units) are shown through Ansible's diff display.
  action:
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
    support: full
    details:
      - The action plugin runs this module on the delegate (the fence, the release and the wait's first 10 s in one
        module run; a longer wait goes on in slices of M(gpuops.gpu.gpu_wait_idle)); the recording is on the
        controller.
notes:
  - Where the task's count matters (a fleet, AWX), this is what makes the pre-deploy hook one task per GPU host -
    docs/performance.md has the figures.
seealso:
  - module: gpuops.gpu.gpu_wait_idle
  - module: gpuops.gpu.proxmox_gpu_containers
"""

EXAMPLES = r"""
---
- name: Fence this host's container on its node, release, wait until its GPUs are idle
  gpuops.gpu.predeploy_host:
    fence: "{{ proxmox_node is defined }}"
    containers: "{{ [proxmox_vmid] if proxmox_node is defined else omit }}"
    result_file: /tmp/predeploy.json
  delegate_to: "{{ proxmox_node | default(inventory_hostname) }}"


- name: Fail each host that is not ready, with its diagnosis
  ansible.builtin.fail:
    msg: "{{ gpu_idle_result.message }}"
  when: gpu_idle_result.error is not none
"""

RETURN = r"""
ansible_facts:
  description: The facts the task sets on the host.
  returned: always
  type: dict
  contains:
    gpu_idle_result:
      description:
        - With O(wait=true) - C(ready), C(elapsed), C(gpus) (how many), C(idle_gpus), C(released) and C(respawned)
          (pids), C(stopped_units) (C(unit (CT n))), C(shut_down) (vmids), C(check_mode), C(would_wait), C(msg),
          C(error) (null, or the diagnosis), C(failure) (null, or C({module, kind})), C(blockers) (one line per
          busy GPU), C(table) (lines), C(processes) (one line per process released, left alive or respawned),
          C(summary) (what C(gpu_idle_summary) publishes per host), C(more) (when a summary left processes out),
          C(message) (null, or the failure's message - at most 1,800 characters as printed) and C(detail_file)
          (null, or the controller file with the whole diagnosis when C(message) was cut).
      returned: with O(wait=true)
      type: dict
    proxmox_fence_result:
      description:
        - With O(fence=true) - C(method), C(containers) (the running vmids fenced), C(skipped), C(gpus) (per vmid),
          C(gpus_from), C(container_gpus) (what the wait after it covers), C(services_stopped), C(released),
          C(respawned), C(stopped_units), C(shut_down), C(gpus_before), C(holder_processes), C(gpu_errors),
          C(quiet_since), C(left_holders), C(changed), C(check_mode), C(error), C(failure), C(summary) (one line),
          C(stats) (what C(proxmox_fence_summary) publishes per host), C(more), C(message) and C(detail_file).
      returned: with O(fence=true)
      type: dict
ansible_stats:
  description:
    - With O(wait=true), from the host that completes its batch - C(gpu_idle_ready) (true only when every host of the play has a ready result),
      C(gpu_idle_elapsed) (the longest), C(gpu_idle_summary) (C({host - summary})), C(proxmox_fence_summary)
      (C({host - stats}), the nodes fenced on their own too) and, when the variable C(awx_job_id) is set (AWX),
      C(gpu_idle_job_<awx_job_id>) (C({ready, hosts, not_ready - {host - reason}}) - one key per job, so that a sliced
      job's merged artifacts keep every slice's answer).
    - With O(wait=false) - C(proxmox_fence_summary) (C({host - stats})), merged with what earlier hosts published.
  returned: from a fence alone, and from the host that completes its batch
  type: dict
"""

from ansible_collections.gpuops.gpu.plugins.module_utils._common import new_module
from ansible_collections.gpuops.gpu.plugins.module_utils._host import runs

ARGUMENT_SPEC = dict(
    fence=dict(type="bool", default=False),
    containers=dict(type="list", elements="str"),
    wait=dict(type="bool", default=True),
    result_file=dict(type="path"),
    steps=dict(type="dict"),
)


def main() -> None:
    # The options fence, containers, wait and result_file are the action plugin's; it runs this with steps only.
    module = new_module(dict(ARGUMENT_SPEC), supports_check_mode=True)
    out = runs.steps(module, module.params["steps"] or {})
    module.exit_json(changed=any(isinstance(r, dict) and r.get("changed") for r in out.values()), **out)


if __name__ == "__main__":
    main()
