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
  - Finds the processes that hold the selected GPUs, narrows them with the filters, and stops them -
    O(signal) first, then after O(grace_period) SIGKILL when O(escalate) is set.
  - What holds a GPU is decided by the collection's holding model (C(docs/holding-model.md)) - every process
    the driver reports with a context on a selected GPU; with O(include_device_holders), every process that
    holds a selected GPU's C(/dev/nvidiaN), unless the driver shows it with contexts only on GPUs that are
    not selected (CUDA opens the node of every GPU it can see); never a process that holds only the control
    nodes (C(nvidiactl), C(nvidia-uvm), ...) that every NVML or CUDA client holds, unless O(pids) names it.
    Each released process says its C(evidence) (V(context), V(device) or V(control)).
  - When the driver's process list of a selected GPU cannot be read, the module fails and signals nothing
    (unless O(pids) names what to stop), rather than report nothing to release.
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
      - Only processes inside these Proxmox VE containers (vmids, 100 to 999999999). Others are reported in
        RV(skipped_processes).
      - Run the module on the Proxmox node to see the containers' processes.
    type: list
    elements: int
  users:
    description: Only processes of these users (names or uids).
    type: list
    elements: str
  match:
    description:
      - Only processes whose command line matches this regular expression.
      - It sees the real command line (the results show it redacted, see O(redact)), its first 4096 characters.
        The rules of O(protect) apply - no repeated group that itself repeats or alternates, a time budget.
    type: str
  pids:
    description: Only these pids (as seen from where the module runs), each from 1 to 4194304.
    type: list
    elements: int
  exclude:
    description:
      - Never processes whose command line matches this regular expression (descendants included).
      - It sees the real command line, as O(match) does, with the same rules.
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
    description:
      - Seconds to wait after O(signal) for the processes to exit.
      - From 0 to 86400 (a day); C(nan) and C(inf) are refused before anything is signalled.
    type: float
    default: 10
  escalate:
    description: Send SIGKILL to the processes still alive after O(grace_period).
    type: bool
    default: true
  kill_timeout:
    description:
      - Seconds to wait after SIGKILL for the processes to be gone. A zombie counts as gone.
      - From 0 to 86400 (a day).
    type: float
    default: 10
  fail_on_survivors:
    description:
      - Fail when a process survives (one stuck in the kernel, state D, outlives SIGKILL).
    type: bool
    default: true
  stop_units:
    description:
      - When a target runs in a systemd service unit (read from its cgroup - C(/lxc/129/ns/system.slice/sglang.service)
        inside a container, C(/system.slice/vllm.service) on the host), stop the unit first - C(pct exec <vmid> --
        systemctl stop <unit>) for a container when run on the Proxmox node, C(systemctl stop <unit>) on the host -
        so that its supervisor cannot restart it; then whatever is left is signalled.
      - Never the unit of a protected process, nor the unit the module itself runs in.
      - V(false) only signals; a supervised server then comes back, and the result's RV(respawned) names the unit
        and the supervisor.
    type: bool
    default: true
  expected_count:
    description:
      - The number of GPUs the host must show. Any other number fails before anything is signalled, naming both
        (a GPU fell off the bus, or the play runs on the wrong host). From 0 to 1024.
    type: int
  all:
    description:
      - With no filter (O(containers), O(users), O(match), O(pids)), the release proceeds only when every target
        lives in one place (one container, or the host); otherwise it fails without signalling and lists the places.
      - V(true) releases every holder of the selected GPUs wherever it lives.
    type: bool
    default: false
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

- name: Release the GPUs of CT 129, then wait until every GPU is free
  become: true
  block:
    - name: Release the GPUs
      gpuops.gpu.gpu_release:
        containers: [129]
    - name: Wait for the memory to be freed
      gpuops.gpu.gpu_wait_idle:
        expected_count: 8

- name: Every holder of GPU 7, wherever it lives (on the host and in any container)
  gpuops.gpu.gpu_release:
    gpus: ["7"]
    all: true
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
    cmdline:
      description:
        - Command line, with secrets hidden (see O(redact)) and cut at 1000 characters; null with O(cmdline=false).
      type: str
      returned: always
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
  description:
    - Holders of the selected GPUs after the release that were not there before (a supervisor restarting the server),
      each with its C(unit), C(supervisor) (its parent) and C(advice), for example
      C(pid 812 started 1.1 s after the release in sglang.service in CT 129 by pid 90 (systemd) - its supervisor
      restarted it ...).
  returned: always
  type: list
  elements: dict
stopped_units:
  description:
    - The systemd units stopped before the signals (in check mode - that would be), with C(unit), C(container),
      C(pids) (the targets in it), C(command), C(rc) and C(seconds).
  returned: always
  type: list
  elements: dict
  sample: [{"unit": "sglang.service", "container": 129, "pids": [8812, 8813], "rc": 0, "seconds": 1.2,
            "command": ["/usr/sbin/pct", "exec", "129", "--", "systemctl", "stop", "sglang.service"]}]
places:
  description: Where the targets live, when an unscoped release was refused (see O(all)).
  returned: when the release was refused for that reason
  type: dict
  sample: {"CT 129": [8812], "CT 130": [9120]}
gpus_before:
  description:
    - The selected GPUs as the release found them, before any signal, in the shape of M(gpuops.gpu.gpu_facts)
      C(gpu_devices) (the filter P(gpuops.gpu.gpu_table#filter) renders it).
  returned: when the GPUs could be read
  type: list
  elements: dict
gpus:
  description:
    - The selected GPUs after the release (its last look, after the respawn watch); in check mode the same as
      RV(gpus_before). Null when that look failed. Memory that the driver frees after an exit may still show here.
  returned: when the release ran
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

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _holding, _policy, _procs, _release, _snapshot, _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._common import (
    SBIN_DIRS,
    SNAPSHOT_ARGS,
    SnapshotTaker,
    fail,
    new_module,
    validate_snapshot_params,
)
from ansible_collections.gpuops.gpu.plugins.module_utils._waiting import run_in_group
from ansible_collections.gpuops.gpu.plugins.module_utils._signals import (
    SIGKILL,
    Target,
    signal_name,
    signal_number,
    wait_gone,
)

_CLK_TCK = os.sysconf("SC_CLK_TCK")
# How long a unit that was not stopped is watched after the release for a supervisor's restart.
RESPAWN_WATCH_S = 2.0
RESPAWN_POLL_S = 0.2
REPORT_KEYS = ("pid", "name", "cmdline", "user", "container", "unit", "gpus", "via", "evidence", "why")


def holder_lines(gpus, without=()):
    """The diff text: one line per GPU and holder (minus the pids in ``without``)."""
    lines = []
    for gpu in gpus:
        seen = set(without)
        for proc in list(gpu["processes"]) + list(gpu["holders"]):
            if proc["pid"] in seen:
                continue
            seen.add(proc["pid"])
            lines.append(f"GPU {gpu['index']}: {_holding.describe(proc)}")
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
        stop_units=dict(type="bool", default=True),
        all=dict(type="bool", default=False),
        expected_count=dict(type="int"),
    )
    module = new_module(argument_spec, supports_check_mode=True)
    p = module.params
    start = time.monotonic()

    # Everything is validated before anything is read or signalled (_validate has the bounds).
    try:
        validate_snapshot_params(p, module)
        first_signal = signal_number(p["signal"])
        filters = _validate.release(p)
        taker = SnapshotTaker(module)
    except _errors.GpuError as exc:
        fail(module, exc)
        return
    except ValueError as exc:
        module.fail_json(msg=str(exc))
        return

    try:
        snap = taker.take(gather_holders=p["include_device_holders"])
        _snapshot.check_count(snap["gpus"], p["expected_count"], ". Nothing was signalled.")
        before = _snapshot.select_gpus(snap["gpus"], p["gpus"])
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
            unreadable_gpus=[g["index"] for g in unreadable], gpus_before=before)
        return

    me = os.getpid()
    protected_pids = {me: "the module's own process"}
    for pid in _procs.ancestors(me):
        protected_pids[pid] = "an ancestor of the module (the SSH session, Ansible)"
    selected = {g["index"] for g in before}
    found, invisible = _holding.release_candidates(snap["gpus"], selected, p["include_device_holders"], p["pids"])
    holding = {c["pid"] for c in found} | {s["pid"] for s in invisible}
    for pid in sorted(set(p["pids"] or []) - holding):
        invisible.append({"pid": pid, "gpus": [], "reason": "named in pids, but it holds none of the selected GPUs"
                                                            " (no context, no device node, no NVIDIA node at all)"})
    try:
        # The regexes see the raw command line (taker.match_text); every reported one is redacted.
        targets, protected, skipped = _policy.classify(
            found, protected_pids, protect=p["protect"], filters=filters, tree=p["tree"],
            children=_procs.children_map() if p["tree"] else None, read=taker.read_process, text_of=taker.match_text,
            exe_of=_procs.read_exe)
    except _errors.GpuError as exc:  # a regex over its time budget: nothing was signalled
        fail(module, exc)
        return
    skipped.extend(invisible)

    result = dict(changed=bool(targets), released=[], survivors=[], respawned=[], stopped_units=[], gpus_before=before,
                  protected=[report(x, reason=x["reason"]) for x in protected],
                  skipped_processes=[report(x, reason=x["reason"]) for x in skipped])

    filtered = bool(p["containers"] or p["users"] or p["match"] or p["pids"])
    problem = _release.scope_problem(targets, filtered, p["all"])
    if problem:
        refused = {k: v for k, v in result.items() if k != "changed"}
        module.fail_json(msg=problem, changed=False, places=_release.places(targets), **refused)

    plan = []
    if p["stop_units"]:
        own = [taker.read_process(pid) for pid in [me] + list(_procs.ancestors(me))]
        keep = {((x.get("container") or {}).get("id"), x.get("unit")) for x in own if x and x.get("unit")}
        plan = _release.unit_plan(targets, protected, keep)
        on_node = any(t.get("container") for t in targets)
        systemctl = module.get_bin_path("systemctl", opt_dirs=SBIN_DIRS) or "systemctl"
        pct = module.get_bin_path("pct", opt_dirs=SBIN_DIRS) if on_node else None
        for entry in plan:
            entry["command"] = _release.unit_command(entry, systemctl, pct)
    result["changed"] = bool(targets or plan)

    if module.check_mode:
        result["gpus"] = before
        result["stopped_units"] = [dict(e, rc=None, seconds=None) for e in plan]
        result["released"] = [report(t, signals=[], seconds=None) for t in targets]
        if module._diff:
            units = "".join(f"unit {_release.unit_text(e)}: active\n" for e in plan)
            result["diff"] = {"before": units + holder_lines(before),
                              "after": "".join(f"unit {_release.unit_text(e)}: stopped\n" for e in plan)
                              + holder_lines(before, {t["pid"] for t in targets})}
        result["elapsed"] = round(time.monotonic() - start, 3)
        module.exit_json(**result)

    t0 = time.monotonic()
    t0_ticks = time.clock_gettime(time.CLOCK_BOOTTIME) * _CLK_TCK  # the clock of /proc/<pid>/stat's start time

    def pin(dicts):
        pinned = []
        for t in dicts:
            target = Target(t["pid"], t["start_time"], t)
            if target.open():
                pinned.append(target)
            elif target.recycled:
                result["skipped_processes"].append(report(t, reason="the pid now belongs to another process (recycled);"
                                                                    " not signalled"))
            else:
                # It exited between the snapshot and now (its parent took it along): released, unsignalled.
                result["released"].append(report(t, signals=[], seconds=0.0))
        return pinned

    def stop(pinned, sig=first_signal):
        """Signal every pinned target at once (children and parents together), escalate, record."""
        sent = False
        for target in pinned:
            sent |= target.send(sig)
        alive = wait_gone(pinned, p["grace_period"])
        if alive and p["escalate"] and sig != SIGKILL:
            for target in alive:
                sent |= target.send(SIGKILL)
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
        return sent

    # A child forked during the release shares its parent's session; a supervisor's restart gets a new one.
    target_sessions = {(taker.read_process(t["pid"]) or {}).get("session") for t in targets} - {None}
    pinned = pin(targets)
    sent_any = False
    # Units first: stopped through systemd, their supervisor cannot restart them; what is left of
    # the targets is signalled below.
    stopped = set()
    for entry in plan:
        started = time.monotonic()
        if not entry["command"]:
            module.warn(f"cannot stop {_release.unit_text(entry)}: no pct here; its processes are signalled,"
                        " and its supervisor may restart them")
            continue
        try:
            rc, out, err = run_in_group(entry["command"], p["grace_period"] + p["kill_timeout"] + 10,
                                        " ".join(entry["command"][:3]))
        except _errors.QueryTimeout as exc:
            rc, out, err = None, "", exc.msg
        result["stopped_units"].append(dict(entry, rc=rc, seconds=round(time.monotonic() - started, 3)))
        if rc != 0:
            module.warn(f"stopping {_release.unit_text(entry)} failed (rc {rc}): {(err or out).strip()[:300]};"
                        " its processes are signalled instead")
        else:
            sent_any = True
            stopped.add((entry["container"], entry["unit"]))
    sent_any |= stop(pinned)

    # After the signals: a child forked in a signal handler (or an orphan of the workload) is
    # released too; a new holder started by a supervisor is reported, with what to do. Units that
    # were not stopped are watched for a moment, since a supervisor restarts about a second later.
    supervised = {((t.get("container") or {}).get("id"), t.get("unit")) for t in targets
                  if (t.get("unit") or "").endswith(".service")} - stopped
    watch_until = time.monotonic() + (RESPAWN_WATCH_S if supervised else 0.0)
    known = {x["pid"] for g in before for x in list(g["processes"]) + list(g["holders"])}
    target_pids = {t["pid"] for t in targets}
    after = None
    for _round in range(int(RESPAWN_WATCH_S / RESPAWN_POLL_S) + 3):
        try:
            after_all = taker.take(gather_holders=p["include_device_holders"])["gpus"]
            after = _snapshot.select_gpus(after_all, p["gpus"])
        except _errors.GpuError:
            after = None
            break
        new, _invisible = _holding.release_candidates(after_all, selected, p["include_device_holders"], p["pids"])
        new = [x for x in new if x["pid"] not in known and x["pid"] not in protected_pids
               and not _snapshot.is_protected(dict(x, cmdline=taker.match_text(x)), p["protect"])]
        forked, respawned = [], []
        for x in new:
            parent = taker.read_process(x["ppid"]) if x.get("ppid") else None
            orphan = parent is None or parent["pid"] == 1 or parent.get("ns_pid") == 1
            same_session = (taker.read_process(x["pid"]) or {}).get("session") in target_sessions
            (forked if x["ppid"] in target_pids or orphan or same_session else respawned).append((x, parent))
        known |= {x["pid"] for x, _parent in forked + respawned}
        for x, parent in respawned:
            supervisor = f"pid {parent['pid']} ({parent['name']})" if parent else None
            after_s = None if x.get("start_time") is None else max(0.0, (x["start_time"] - t0_ticks) / _CLK_TCK)
            advice = _release.respawn_advice(x, after_s, supervisor, p["stop_units"])
            result["respawned"].append(report(x, supervisor=supervisor, advice=advice))
        if forked:
            extra = [dict(x, via=x["ppid"], why="appeared during the release (forked by a target, or orphaned by it)")
                     for x, _parent in forked]
            target_pids |= {x["pid"] for x in extra}
            # SIGKILL at once: they had their graceful signal through their parent, and a child that
            # forked in a SIGTERM handler would fork again on its own SIGTERM.
            sent_any |= stop(pin(extra), SIGKILL if p["escalate"] else first_signal)
            continue
        if result["respawned"] or time.monotonic() >= watch_until:
            break
        time.sleep(RESPAWN_POLL_S)
    result["changed"] = sent_any
    result["gpus"] = after
    if result["respawned"]:
        module.warn("new holders appeared after the release: " + "; ".join(r["advice"] for r in result["respawned"]))
    if after is not None and module._diff:
        result["diff"] = {"before": holder_lines(before), "after": holder_lines(after)}
    result["elapsed"] = round(time.monotonic() - start, 3)

    if result["survivors"] and p["fail_on_survivors"]:
        names = ", ".join(f"{_holding.describe(s)} (state {s.get('state')})" for s in result["survivors"])
        what = "SIGKILL" if p["escalate"] else signal_name(first_signal)
        module.fail_json(msg=f"{len(result['survivors'])} process(es) survived {what}: {names}. A process in state D is"
                             " stuck in the kernel (often a hung GPU): check dmesg; a reboot may be needed.", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
