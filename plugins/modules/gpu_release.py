#!/usr/bin/python
# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_release
short_description: Stop exactly the processes that hold the chosen GPUs, gracefully and safely
version_added: 0.1.0
description:
  - Finds the processes that hold the selected GPUs (those the driver reports, and with
    O(include_device_holders) those that hold a GPU device file open), narrows them with the filters,
    and stops them - O(signal) first, then after O(grace_period) SIGKILL when O(escalate) is set.
  - With O(tree) the descendants of each holder are stopped too, at the same time as the holder
    (children and parent are signalled together, each by pid, not by process group), so that the
    workers of an inference server go with its API process.
  - Never signalled, whatever the filters say - PID 1, kernel threads, the module's own process and all
    its ancestors (the SSH session, Ansible), the NVIDIA daemons (C(nvidia-persistenced),
    C(nv-fabricmanager), C(nv-hostengine), C(dcgm-exporter), C(nvidia-smi)) and whatever O(protect) adds.
  - Never signals a recycled PID - each process is pinned by (pid, start time) and a pidfd where the kernel
    and Python allow, and its identity is checked again before each signal.
  - Returns when the processes are gone. It does not wait for the GPU memory to be freed; chain
    M(gpuops.gpu.gpu_wait_idle) for that.
author:
  - gpuops developers (@gpuops)
extends_documentation_fragment:
  - gpuops.gpu.gpu
  - gpuops.gpu._attributes
attributes:
  check_mode:
    support: full
    details:
      - Lists exactly what would be signalled and signals nothing.
  diff_mode:
    support: full
    details:
      - Shows the holders of each selected GPU before and after.
options:
  containers:
    description:
      - Only processes inside these Proxmox VE containers (vmids). Others are reported in RV(skipped_processes).
      - Run the module on the Proxmox node to see the containers' processes.
    type: list
    elements: int
  users:
    description: Only processes of these users (names or uids).
    type: list
    elements: str
  match:
    description: Only processes whose command line matches this regular expression.
    type: str
  pids:
    description: Only these pids (as seen from where the module runs).
    type: list
    elements: int
  exclude:
    description: Never processes whose command line matches this regular expression (descendants included).
    type: str
  tree:
    description: Also stop the descendants of each selected holder that are not protected.
    type: bool
    default: true
  signal:
    description: The first signal, by name (V(SIGTERM), V(TERM), V(SIGINT)) or number.
    type: str
    default: SIGTERM
  grace_period:
    description: Seconds to wait after O(signal) for the processes to exit.
    type: float
    default: 10
  escalate:
    description: Send SIGKILL to the processes still alive after O(grace_period).
    type: bool
    default: true
  kill_timeout:
    description: Seconds to wait after SIGKILL for the processes to be gone. A zombie counts as gone.
    type: float
    default: 10
  fail_on_survivors:
    description:
      - Fail when a process survives (one stuck in the kernel, state D, outlives SIGKILL).
    type: bool
    default: true
seealso:
  - module: gpuops.gpu.gpu_facts
  - module: gpuops.gpu.gpu_wait_idle
"""

EXAMPLES = r"""
---
- name: Stop whatever holds the GPUs of CT 129 (on the Proxmox node), SIGTERM then SIGKILL after 10 s
  gpuops.gpu.gpu_release:
    containers: [129]

- name: Stop only the inference server on GPUs 0-3, with a longer grace period, keeping a notebook
  gpuops.gpu.gpu_release:
    gpus: ["0", "1", "2", "3"]
    match: "sglang|vllm"
    exclude: jupyter
    grace_period: 30

- name: What would be stopped?
  gpuops.gpu.gpu_release:
    containers: [129]
  check_mode: true
  register: would_release

- name: Release, then wait until every GPU is free
  block:
    - name: Release the GPUs
      gpuops.gpu.gpu_release:
    - name: Wait for the memory to be freed
      gpuops.gpu.gpu_wait_idle:
        expected_count: 8
"""

RETURN = r"""
released:
  description: The processes that were (in check mode - would be) signalled.
  returned: always
  type: list
  elements: dict
  contains:
    pid: {description: Host pid (as seen from where the module runs)., type: int, returned: always}
    name: {description: Process name., type: str, returned: always}
    cmdline: {description: Command line., type: str, returned: always}
    user: {description: User name., type: str, returned: always}
    container: {description: "C({kind, id, pid_in_container}) or null.", type: dict, returned: always}
    gpus: {description: Indices of the selected GPUs it held (or its ancestor held)., type: list, elements: int, returned: always}
    via: {description: For a descendant - the pid of the holder it descends from; else null., type: int, returned: always}
    signals:
      description:
        - Signals sent, in order.
        - Empty in check mode, and for a process that exited before its signal was sent (its parent stopped it).
      type: list
      elements: str
      returned: always
    seconds: {description: Seconds from the first signal until it was gone (null in check mode)., type: float, returned: always}
  sample:
    - {"pid": 8812, "name": "python3", "cmdline": "python3 -m sglang.launch_server", "user": "root",
       "container": {"kind": "lxc", "id": 129, "pid_in_container": 245}, "gpus": [0], "via": null,
       "signals": ["SIGTERM"], "seconds": 0.21}
survivors:
  description: Processes still alive after SIGKILL and O(kill_timeout) (or after O(grace_period) without O(escalate)).
  returned: always
  type: list
  elements: dict
protected:
  description: Holders that were not signalled because they are protected, with C(reason).
  returned: always
  type: list
  elements: dict
skipped_processes:
  description:
    - Holders outside the filters (or not reachable from here), with C(reason). Never signalled.
    - Named so, not C(skipped), because Ansible reserves C(skipped) in task results.
  returned: always
  type: list
  elements: dict
respawned:
  description: Holders of the selected GPUs after the release that were not there before (a supervisor restarting the server).
  returned: always
  type: list
  elements: dict
elapsed:
  description: Seconds the release took.
  returned: always
  type: float
unreadable_gpus:
  description:
    - The selected GPUs whose process list the driver could not give (an NVML error, or a list whose entries
      cannot be real processes). The module then fails and signals nothing, unless O(pids) names what to stop.
  returned: when the module failed for that reason
  type: list
  elements: int
  sample: [3]
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _policy, _procs, _snapshot
from ansible_collections.gpuops.gpu.plugins.module_utils._common import (
    SNAPSHOT_ARGS,
    SnapshotTaker,
    fail,
    validate_snapshot_params,
)
from ansible_collections.gpuops.gpu.plugins.module_utils._signals import (
    SIGKILL,
    Target,
    signal_name,
    signal_number,
    wait_gone,
)

REPORT_KEYS = ("pid", "name", "cmdline", "user", "container", "gpus", "via")


def candidates(gpus, include_device_holders, subset=False):
    """Every process that holds a selected GPU, merged by pid, with the GPUs it holds.

    With a subset of the GPUs selected, a process that holds only the device files every GPU
    shares (nvidiactl, nvidia-uvm) is not taken: nothing ties it to the selected GPUs.
    """
    merged = {}
    invisible = []
    shared = {}
    for gpu in gpus:
        if subset and include_device_holders:
            nvml_pids = {x["pid"] for x in gpu["processes"]}
            for h in gpu["holders"]:
                if h.get("shared_only") and h["pid"] not in nvml_pids:
                    shared[h["pid"]] = dict(h, gpus=[], reason="holds only device files shared by every GPU ("
                                            + ", ".join(h.get("files") or []) + "), none of the selected GPUs;"
                                            " select all GPUs, or name it with pids, to stop it")
            gpu = dict(gpu, holders=[h for h in gpu["holders"] if h["pid"] not in shared])
        holders = list(gpu["processes"]) + (list(gpu["holders"]) if include_device_holders else [])
        for proc in holders:
            if proc.get("visible") is False:
                invisible.append({"pid": proc["pid"], "gpus": [gpu["index"]],
                                  "reason": "the driver reports this pid but it does not exist from this PID namespace"
                                            " (run on the host / Proxmox node to reach it)"})
                continue
            entry = merged.setdefault(proc["pid"], dict(proc, gpus=[]))
            if gpu["index"] not in entry["gpus"]:
                entry["gpus"].append(gpu["index"])
    return list(merged.values()), invisible + [v for k, v in sorted(shared.items()) if k not in merged]


def holder_lines(gpus, without=()):
    """The diff text: one line per GPU and holder (minus the pids in ``without``)."""
    lines = []
    for gpu in gpus:
        seen = set(without)
        for proc in list(gpu["processes"]) + list(gpu["holders"]):
            if proc["pid"] in seen:
                continue
            seen.add(proc["pid"])
            lines.append(f"GPU {gpu['index']}: {_snapshot.describe(proc)}")
    return "\n".join(lines) + ("\n" if lines else "")


def report(proc, **extra):
    out = {k: proc.get(k) for k in REPORT_KEYS}
    out.update(extra)
    return out


def main() -> None:
    argument_spec = dict(SNAPSHOT_ARGS)
    argument_spec.update(
        containers=dict(type="list", elements="int"),
        users=dict(type="list", elements="str"),
        match=dict(type="str"),
        pids=dict(type="list", elements="int"),
        exclude=dict(type="str"),
        tree=dict(type="bool", default=True),
        signal=dict(type="str", default="SIGTERM"),
        grace_period=dict(type="float", default=10.0),
        escalate=dict(type="bool", default=True),
        kill_timeout=dict(type="float", default=10.0),
        fail_on_survivors=dict(type="bool", default=True),
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    start = time.monotonic()

    # Everything is validated before anything is read or signalled.
    try:
        validate_snapshot_params(p)
        first_signal = signal_number(p["signal"])
        containers = _policy.validate_vmids(p["containers"])
        for name in ("grace_period", "kill_timeout"):
            if p[name] < 0:
                raise ValueError(f"{name} must be >= 0, got {p[name]:g}")
        for pid in p["pids"] or []:
            if pid <= 0:
                raise ValueError(f"pids: {pid} is not a process id")
        filters = dict(
            containers=containers,
            users=p["users"],
            match=_policy.compile_regex("match", p["match"]),
            pids=set(p["pids"] or []),
            exclude=_policy.compile_regex("exclude", p["exclude"]),
        )
    except ValueError as exc:
        module.fail_json(msg=str(exc))
        return
    except _errors.GpuError as exc:
        fail(module, exc)
        return

    try:
        taker = SnapshotTaker(module)
        snap = taker.take(gather_holders=p["include_device_holders"])
        before = _snapshot.select_gpus(snap["gpus"], p["gpus"])
        subset = len(before) < len(snap["gpus"])
    except _errors.GpuError as exc:
        fail(module, exc)
        return

    unreadable = [g for g in before if g.get("processes_error")]
    if unreadable and p["pids"]:
        module.warn("the driver's process list could not be read for GPU(s) "
                    + ", ".join(str(g["index"]) for g in unreadable) + ": only the processes named in pids are considered")
    elif unreadable:
        # An empty list read from a failed query is not "nothing to release": the holder may be hidden.
        module.fail_json(
            msg="the driver's process list could not be read for "
                + "; ".join(f"GPU {g['index']} ({g.get('pci_bus_id')}): {g['processes_error']}" for g in unreadable)
                + ". Nothing was signalled. Retry (a transient driver error), raise query_timeout, or name the"
                  " processes to stop with pids.",
            changed=False, released=[], survivors=[], respawned=[], protected=[], skipped_processes=[],
            unreadable_gpus=[g["index"] for g in unreadable])
        return

    me = os.getpid()
    protected_pids = {me: "the module's own process"}
    for pid in _procs.ancestors(me):
        protected_pids[pid] = "an ancestor of the module (the SSH session, Ansible)"
    found, invisible = candidates(before, p["include_device_holders"], subset)
    targets, protected, skipped = _policy.classify(
        found, protected_pids, protect=p["protect"], filters=filters, tree=p["tree"],
        children=_procs.children_map() if p["tree"] else None, read=_procs.read_process)
    skipped.extend(invisible)

    result = dict(changed=bool(targets), released=[], survivors=[], respawned=[],
                  protected=[report(x, reason=x["reason"]) for x in protected],
                  skipped_processes=[report(x, reason=x["reason"]) for x in skipped])

    if module.check_mode:
        result["released"] = [report(t, signals=[], seconds=None) for t in targets]
        if module._diff:
            result["diff"] = {"before": holder_lines(before), "after": holder_lines(before, {t["pid"] for t in targets})}
        result["elapsed"] = round(time.monotonic() - start, 3)
        module.exit_json(**result)

    pinned = []
    for t in targets:
        target = Target(t["pid"], t["start_time"], t)
        if target.open():
            pinned.append(target)
        elif target.recycled:
            result["skipped_processes"].append(report(t, reason="the pid now belongs to another process (recycled); not signalled"))
        else:
            # It exited between the snapshot and now (its parent took it along): released, unsignalled.
            result["released"].append(report(t, signals=[], seconds=0.0))
    t0 = time.monotonic()
    sent_any = False
    for target in pinned:  # children and parents together: every target gets the signal now
        sent_any |= target.send(first_signal)
    alive = wait_gone(pinned, p["grace_period"])
    if alive and p["escalate"] and first_signal != SIGKILL:
        for target in alive:
            sent_any |= target.send(SIGKILL)
        alive = wait_gone(alive, p["kill_timeout"])
    for target in pinned:
        gone_at = target.gone_at
        entry = report(target.info, signals=target.signals,
                       seconds=round(gone_at - t0, 3) if gone_at is not None else None)
        if target in alive:
            entry["state"] = _procs.process_state(target.pid)
            result["survivors"].append(entry)
        else:
            # Gone: by our signal, or before it reached it (a parent's SIGTERM took its workers along).
            result["released"].append(entry)
        target.close()
    result["changed"] = sent_any

    try:
        after = _snapshot.select_gpus(taker.take(gather_holders=p["include_device_holders"])["gpus"], p["gpus"])
    except _errors.GpuError:
        after = None
    if after is not None:
        known = {x["pid"] for g in before for x in list(g["processes"]) + list(g["holders"])}
        new, _invisible = candidates(after, p["include_device_holders"], subset)
        result["respawned"] = [report(x) for x in new if x["pid"] not in known
                               and not _snapshot.is_protected(x, p["protect"]) and x["pid"] not in protected_pids]
        if result["respawned"]:
            module.warn("new holders appeared after the release (a supervisor restarting the server?): "
                        + ", ".join(_snapshot.describe(x) for x in result["respawned"])
                        + ". Stop the service first (gpuops.gpu.proxmox_fence does), then release.")
        if module._diff:
            result["diff"] = {"before": holder_lines(before), "after": holder_lines(after)}
    result["elapsed"] = round(time.monotonic() - start, 3)

    if result["survivors"] and p["fail_on_survivors"]:
        names = ", ".join(f"{_snapshot.describe(s)} (state {s.get('state')})" for s in result["survivors"])
        what = "SIGKILL" if p["escalate"] else signal_name(first_signal)
        module.fail_json(msg=f"{len(result['survivors'])} process(es) survived {what}: {names}. A process in state D is"
                             " stuck in the kernel (often a hung GPU): check dmesg; a reboot may be needed.", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
