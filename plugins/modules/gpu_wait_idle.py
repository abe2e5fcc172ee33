#!/usr/bin/python
# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_wait_idle
short_description: Wait until every selected GPU is free, and stays free for a settle window
version_added: 0.1.0
description:
  - Keeps the play waiting until every selected GPU is idle and has had no holder for O(settle) seconds,
    then returns at once - no guessed sleeps.
  - Idle is the definition M(gpuops.gpu.gpu_facts) reports - no compute, graphics or MPS process (visible or
    not), no device-file holder outside the protected daemons (O(include_device_holders)), memory used at most
    O(max_memory_used_mib), utilization at most O(max_utilization_pct) when set, health ok, and a process list
    the driver could read (a list that an NVML error or a mismatched entry layout made unreadable keeps the GPU
    busy until it can be read again).
  - The settle clock starts when the last holder disappears, not when the memory is freed, so a driver that
    frees memory 1.5 s after the exit costs no extra time; a holder that appears within the window (a
    supervisor restarting the server) restarts the clock. The first look counts as a holder leaving, so the
    wait always watches for at least O(settle) seconds - unless O(quiet_since) hands over the time the release
    just before watched.
  - A process that holds a GPU's device node with no context (a notebook kernel that imported torch) keeps the GPU
    busy only while the GPU's memory is in use, and restarts the settle clock when it appears or leaves - not at
    every look while it stays, since the memory could not be freed while it lives if it were the memory's owner.
  - A selected GPU lost from the bus, or a GPU count other than O(expected_count), fails the task at once. A GPU
    that is not selected never fails the wait - lost or failing; with O(backend=nvidia-smi), C(nvidia-smi) is
    asked about the selected GPUs only (from the first look when O(gpus) are indices and O(expected_count) is
    unset, else from the second).
  - On the controller, an action plugin runs the wait in slices of about 10 s and prints a progress line per
    slice at default verbosity (at most 2,000 characters; a line that would name the same busy GPUs and holders as
    the one before says so in a few words). Within a slice the target polls every O(sleep) seconds.
  - Polls are cheap (the driver's view and a liveness check of known holders); the full C(/proc/*/fd) scan
    runs at the first poll, before declaring the GPUs idle, and every 15 s otherwise.
  - Ready means the next server will start, not only that nothing holds the GPUs - each selected GPU must have
    the free memory O(min_free_mib) and O(min_free_pct) ask for, and pass the health checks of O(health_checks)
    (a pending row remap or page retirement, a failed row remap, a fabric that the fabric manager has not
    registered, uncorrectable ECC errors). The diagnosis names the check, the GPUs and what to do.
  - When the wait times out, memory held with no process is told apart from the samples the wait keeps - memory
    that falls is still being freed (the rate and the time left at that rate are given - raise the timeout); memory
    that has not moved for O(leak_after) seconds is a leaked context (reset the GPU); memory that has not moved for
    less long is named with both (a driver that frees memory late - raise the timeout - or a leak to come). Each cause
    is named once, with the GPUs it applies to and their MiB; a process that holds only a GPU's device node, with no
    context, is named as lingering, never as what keeps the GPU busy.
author:
  - gpuops developers (@gpuops)
extends_documentation_fragment:
  - gpuops.gpu.gpu
  - gpuops.gpu.gpu.idle
  - gpuops.gpu._attributes
attributes:
  check_mode:
    support: full
    details:
      - Looks once and reports in RV(would_wait) whether it would have to wait; never fails for busy GPUs.
      - With O(reset_leaked), a GPU that holds memory with no process is watched for up to O(leak_after) seconds
        (at most O(timeout)); RV(resets) then says which GPUs would be reset, and nothing is reset.
  diff_mode:
    support: full
    details:
      - With O(reset_leaked), the GPUs reset (or, in check mode, that would be) - before V(GPU 2 - 2048 MiB leaked),
        after V(GPU 2 - reset), one line per GPU. Otherwise this module never changes the host.
  action:
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
    support: full
    details:
      - The action plugin slices the wait and prints progress; with C(async) the module runs in one piece.
options:
  expected_count:
    description:
      - The number of GPUs the host must show. Any other number fails at once, naming both (a GPU fell off
        the bus, or the play runs on the wrong host). From 0 to 1024.
    type: int
  timeout:
    description:
      - Seconds to wait at most, as in M(ansible.builtin.wait_for).
      - From 0 to 86400 (a day); C(nan) and C(inf) are refused before anything is read.
    type: float
    default: 300
  delay:
    description: Seconds to wait before the first look, from 0 to 86400.
    type: float
    default: 0
  sleep:
    description:
      - Seconds between two looks (the poll interval), from 0.05 to 86400.
      - For 5 s after the last holder of the selected GPUs has gone, while the driver is still freeing its memory,
        the module looks every 0.05 s (when O(sleep) is longer), and it looks again the moment the O(settle) window
        closes, so that it returns soon after the GPUs are free. A GPU whose memory stays used with no holder (a
        leaked context) is then looked at every O(sleep) seconds again.
    type: float
    default: 0.5
  settle:
    description:
      - Seconds that every selected GPU must have had no holder before the module returns.
      - An idle node answers in one look - when the first look (a full device-file scan) finds no process holding
        any selected GPU (no context, no device-node holder) and every selected GPU idle, and no release handed
        over its O(quiet_since), the module is ready at once, with no window of its own (RV(settle_from) V(idle)).
        That is safe because the window guards an asynchronous release - memory the driver is still freeing, a
        supervisor about to restart what was stopped - and none is in progress; a release that ran just before
        passes its O(quiet_since), and then the window counts from it.
      - From 0 to 86400, and not above O(timeout).
    type: float
    default: 1.0
  quiet_since:
    description:
      - The RV(gpuops.gpu.gpu_release#module:quiet_since) of the M(gpuops.gpu.gpu_release) that ran just before
        on this host (register it and pass C(release.quiet_since)); M(gpuops.gpu.proxmox_gpu_containers) returns it
        in C(release). The settle window then counts from the moment that release last saw a holder of its GPUs (its
        last target gone, the last holder its watch saw), not from this wait's first look - the release watched
        meanwhile, and any holder that came since is seen at the first look (a full device-file scan), which then
        restarts the clock.
      - Used only when it comes from this boot (its C(boot_id)), is not in the future, and its C(gpus) include every
        GPU this wait selects; otherwise, and when it is null (a release in check mode, one that ended with a
        holder), the first look counts as a holder leaving. RV(settle_from) says where the window counted from.
    type: dict
    suboptions:
      clock:
        description: When the release last saw a holder, in seconds of C(CLOCK_MONOTONIC) (Python's C(time.monotonic())).
        type: float
        required: true
      boot_id:
        description: The boot the clock counts from (C(/proc/sys/kernel/random/boot_id)).
        type: str
        required: true
      gpus:
        description: The indexes of the GPUs the release watched.
        type: list
        elements: int
        required: true
      device_holders:
        description:
          - The C([pid, start time]) of each process that the release saw holding a device node of those GPUs with
            no context, all along its watch - not new to this wait.
        type: list
        elements: raw
        default: []
  left_holders:
    description:
      - The RV(gpuops.gpu.gpu_release#module:left_holders) of the M(gpuops.gpu.gpu_release) that ran just before on
        this host (M(gpuops.gpu.proxmox_gpu_containers) returns it in C(release)) - the processes that release left by
        its verdict (outside its scope, or protected - another container's job on a fenced GPU, C(nv-hostengine) during
        C(dcgmi diag), an MPS server that carries another client) and that still held a selected GPU.
      - Nothing the hook does will stop them, so a selected GPU that one of them still keeps busy after
        O(blocker_grace) fails the wait at once (C(error=blocked)), naming it, why the release left it and the command
        to see or stop it, instead of waiting out O(timeout); the progress lines say so meanwhile. A process is the
        same one only with the same C(pid) and C(start_time).
    type: list
    elements: dict
    default: []
    suboptions:
      pid:
        description: Its pid, as the release saw it.
        type: int
        required: true
      start_time:
        description: Its start time (clock ticks since boot, C(/proc/<pid>/stat)), so that a reused pid is not taken for it.
        type: int
      reason:
        description: Why the release left it.
        type: str
        default: ""
  blocker_grace:
    description:
      - Seconds a process of O(left_holders) may still keep a selected GPU busy before the wait fails on it - time for
        one that is ending anyway (an MPS server whose last client just went, a C(dcgmi diag) about to finish).
      - From 0 to 86400; at or above O(timeout) the wait runs to its timeout as it would without O(left_holders).
    type: float
    default: 5
  msg:
    description: A message to put before the diagnosis when the wait times out.
    type: str
  confirm_with_nvidia_smi:
    description:
      - Make one final C(nvidia-smi) query that must agree that the selected GPUs are free; a disagreement
        fails the task and is reported.
      - The query asks about the selected GPUs only (C(--id)), so that an unselected GPU that is lost or failing
        cannot fail the wait; a query that fails is tried once more before the task fails.
      - Unset means - when C(nvidia-smi) (O(nvidia_smi_path)) exists.
    type: bool
  leak_after:
    description:
      - Seconds that memory held with no process must stay unchanged before the timeout's diagnosis calls it a
        leaked context, rather than memory the driver is still freeing.
      - Teardowns with large pinned host buffers free their memory over 30 s or more after the last process has
        gone (a draining curve); a leaked context never frees it. More than 0, at most 86400.
      - It only changes the diagnosis - the wait still ends at O(timeout).
    type: float
    default: 30
  reset_leaked:
    description:
      - Reset a selected GPU whose memory has leaked (unchanged for O(leak_after) seconds with no process holding
        it) with C(nvidia-smi -r -i <index>) (under O(query_timeout), no shell), then keep waiting.
      - Only when no process on the host holds the GPU's device node, by a full device-file scan (O(device_files))
        that counts the protected daemons too (nvidia-persistenced, nv-fabricmanager, DCGM) - the reason names the
        pids and how to stop them; the module never stops them itself.
      - Refused, with the reason and what to do, where the driver cannot reset the GPU - persistence mode on (turn it
        off with C(nvidia-smi -pm 0)), an NVSwitch system (a GPU with a fabric, where a reset must include the
        NVSwitches and every GPU), a GPU in use by a display (display_active or display_mode). Each GPU is decided
        upon once per wait; a refusal is named in the timeout's message.
      - RV(resets) reports what was done. Needs root on the node, as C(nvidia-smi -r) does.
    type: bool
    default: false
  progress_slice:
    description:
      - Internal to the collection, not for tasks - the action plugin sets it (return after this many seconds with
        the wait state, so that the controller can print progress), and a task that sets it fails.
    type: float
  progress_state:
    description:
      - Internal to the collection, not for tasks - the action plugin sets it (the wait state carried from the
        previous slice), and a task that sets it fails.
    type: dict
seealso:
  - module: gpuops.gpu.gpu_facts
  - module: gpuops.gpu.gpu_release
"""

EXAMPLES = r"""
---
- name: Wait until all 8 GPUs are free (the pre-deploy check; as root, to see every holder)
  gpuops.gpu.gpu_wait_idle:
    expected_count: 8
    timeout: 120
  become: true

- name: Wait for GPUs 0-3, counting a GPU above 10% utilization as busy
  gpuops.gpu.gpu_wait_idle:
    gpus: ["0", "1", "2", "3"]
    max_utilization_pct: 10
    settle: 2

- name: Wait until the next server fits (vLLM with gpu_memory_utilization 0.9) and the GPUs are healthy
  gpuops.gpu.gpu_wait_idle:
    min_free_pct: 90
    timeout: 180
  become: true

- name: Wait, and reset a GPU whose memory leaked (a leaked context) once nothing holds it
  gpuops.gpu.gpu_wait_idle:
    reset_leaked: true
    leak_after: 30
    timeout: 180
  become: true

- name: Would we have to wait?
  gpuops.gpu.gpu_wait_idle:
  check_mode: true
  register: idle_check
"""

RETURN = r"""
extends_documentation_fragment:
  - gpuops.gpu.gpu
elapsed:
  description: Seconds the wait took.
  returned: always
  type: float
  sample: 1.52
settle_from:
  description:
    - Where the settle window counted from - V(release), the moment the release of O(quiet_since) last saw a holder,
      V(wait), a look of this wait (the first, or the last that saw a holder), or V(idle), no window - the first
      look found nothing on an idle node and no release was in progress (O(settle)).
  returned: when not in check mode
  type: str
  sample: release
polls:
  description: How many times the GPUs were looked at.
  returned: always
  type: int
idle_gpus:
  description: Indices of the selected GPUs that are idle at the end.
  returned: always
  type: list
  elements: int
gpus:
  description:
    - The final state of each selected GPU, as in M(gpuops.gpu.gpu_facts) C(gpu_devices) - its C(holders) are pids by
      evidence (C(context), C(device), C(control)), their details once each in RV(holder_processes).
    - With O(detail=summary) a GPU's lists are capped, and its C(more) counts what was left out (see
      M(gpuops.gpu.gpu_facts) C(gpu_devices[].more) and C(detail)).
  returned: always
  type: list
  elements: dict
holder_processes:
  description:
    - The details of every process named in the C(holders) of RV(gpus_before) (its blockers) and RV(gpus), once each, keyed by its
      pid (a string), as M(gpuops.gpu.gpu_release) returns them; give it to P(gpuops.gpu.gpu_table#filter) and
      P(gpuops.gpu.gpu_blockers#filter) as their C(holder_processes).
  returned: when the GPUs could be read
  type: dict
gpus_before:
  description:
    - The selected GPUs at the first look, one record per GPU of what a before and after table reads (the result
      carries the snapshot once, RV(gpus)), as RV(gpuops.gpu.gpu_release#module:gpus_before) - with RV(gpus), the
      before and after of the wait without another M(gpuops.gpu.gpu_facts) call (the filter
      P(gpuops.gpu.gpu_table#filter) renders both).
  returned: when the first look succeeded and a later one was taken (in check mode only with O(reset_leaked) - its one
    look is RV(gpus))
  type: list
  elements: dict
samples:
  description:
    - Per GPU index, a time series of C([seconds, used MiB, holder count]), one point per change - enough to
      plot a release timeline. The holder count counts the processes that may hold the GPU's memory - not a process
      that holds only its device node, with no context, on a GPU whose process list was read (it lingers).
  returned: always
  type: dict
  sample: {"0": [[0.0, 40960, 1], [0.21, 40960, 0], [1.51, 0, 0]]}
blockers:
  description: On failure, per GPU index, what holds it (pid, name, container, visible, files).
  returned: failure
  type: dict
error:
  description:
    - On failure, its kind - V(wait_timeout) (the GPUs were not idle within O(timeout); C(msg) is the diagnosis, one
      sentence per cause with the GPUs it applies to), V(confirmation_disagrees) (NVML found the GPUs idle, the final
      C(nvidia-smi) query did not), V(gpu_lost), V(selection), V(backend), V(invalid_option), ...
  returned: failure
  type: str
  sample: wait_timeout
ready:
  description: V(true) - every selected GPU is idle (a failed wait has no RV(ready); check mode has RV(would_wait)).
  returned: success
  type: bool
would_wait:
  description: In check mode, whether the GPUs are busy now (the module would have to wait).
  returned: check_mode
  type: bool
confirmation:
  description: What the final C(nvidia-smi) query said, per GPU index (used MiB and pids), or null when it did not run.
  returned: always
  type: dict
memory:
  description:
    - On a timeout, per GPU index, what the samples say of memory held with no process - C(kind) V(draining) (with
      C(rate) in MiB/s and C(left), seconds at that rate), V(leaked) or V(unchanged) (with C(still), seconds
      without a change), and C(used) MiB; null for a GPU with a process that may hold its memory (see RV(samples)) or
      at baseline.
  returned: failure
  type: dict
  sample: {"0": {"kind": "draining", "used": 61440, "rate": 4096.0, "left": 15.0}, "1": null}
resets:
  description:
    - With O(reset_leaked), one entry per GPU whose memory leaked - C(index), C(action) (V(done), V(would) in check
      mode, or V(refused)), C(reason), C(used_mib) (the leaked memory), and C(rc) and C(output) of
      C(nvidia-smi -r) (null when it did not run).
  returned: always
  type: list
  elements: dict
  sample: [{"index": 2, "action": "done", "reason": "memory leaked and nothing holds the GPU's device node",
            "used_mib": 2048, "rc": 0, "output": "GPU 00000000:3A:00.0 was successfully reset."}]
"""

from ansible_collections.gpuops.gpu.plugins.module_utils._common import new_module, run_module
from ansible_collections.gpuops.gpu.plugins.module_utils._host import runs

ARGUMENT_SPEC = runs.WAIT_SPEC


def main() -> None:
    # The module's whole run is _host.runs.wait (predeploy_host runs the same in its one module run).
    module = new_module(dict(ARGUMENT_SPEC), supports_check_mode=True)
    run_module(module, *runs.wait(module, module.params))


if __name__ == "__main__":
    main()
