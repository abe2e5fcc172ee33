# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: proxmox_fence_result
short_description: The outcome of a fence, as the proxmox_fence role records it
version_added: 0.1.0
description:
  - Turns the registered result of M(gpuops.gpu.proxmox_gpu_containers) (with O(gpuops.gpu.proxmox_gpu_containers#module:state=released),
    its C(release) is the release; or a separate result of M(gpuops.gpu.gpu_release) in O(release)), run with
    C(failed_when=false) or skipped, into one dict - the containers fenced and skipped, the GPUs passed through to
    them, the services and units stopped, the processes released, the containers shut down, whether anything
    changed, the error of a failure, a one-line summary and what the role publishes with C(set_stats).
  - Each result counts as a success only when it has what a success of its module has, as
    P(gpuops.gpu.gpu_idle_result#filter) describes it; a module that failed or crashed (killed by a signal, no JSON, an
    unhandled exception kept only as C(failed_when_suppressed_exception)), a node that could not be reached, or a
    release that had to run (containers found running, method V(processes)) and did not, is the C(error).
  - The role C(gpuops.gpu.proxmox_fence) sets its fact C(proxmox_fence_result) with it; its logic lives here, unit-tested.
author:
  - gpuops developers (@gpuops)
options:
  _input:
    description: The registered result of M(gpuops.gpu.proxmox_gpu_containers).
    type: dict
    required: true
  release:
    description:
      - The registered result of M(gpuops.gpu.gpu_release), when it ran as a task of its own; unset - the C(release)
        of the M(gpuops.gpu.proxmox_gpu_containers) result (state V(released)).
    type: dict
  method:
    description: The fence method - V(processes) or V(shutdown).
    type: str
    default: processes
  check_mode:
    description: Whether the play runs in check mode (the modules' own word wins when they give it).
    type: bool
    default: false
  host:
    description: The host the modules ran on (the Proxmox VE node), named in the error of a crash or an unreachable node.
    type: str
    default: ''
"""

EXAMPLES = r"""
---
- name: Record what the fence did
  ansible.builtin.set_fact:
    proxmox_fence_result: "{{ containers | gpuops.gpu.proxmox_fence_result(release=release, method='processes') }}"
"""

RETURN = r"""
_value:
  description:
    - C(method), C(containers) (the running vmids fenced), C(skipped) (C({vmid, reason})), C(gpus) (per vmid, the
      GPU indexes passed through, null for every GPU), C(gpus_from) (per vmid, what the wait covers of it - V(config),
      or for a config that passes every GPU of a node whose other containers pass GPUs too, V(processes) - the GPUs
      its workload held - or V(unheld) - it held none, the GPUs no other container's processes held; the module's
      C(containers[].gpus_from)), C(container_gpus) (what a wait after the fence covers - the union of the containers'
      C(wait_gpus) - or, when none of the named containers runs, the GPUs of their configs; null for every GPU; a GPU
      that the containers have only through MIG devices, C(wait_mig_devices), is given by their MIG UUIDs instead),
      C(services_stopped) (C({vmid, unit})), C(released), C(respawned) and C(stopped_units) (from
      M(gpuops.gpu.gpu_release)), C(shut_down) (vmids), C(gpus_before) (the GPUs before the release),
      C(holder_processes) (their device-file holders' details, each once), C(gpu_errors) (the GPUs the release did
      not select whose process list could not be read, C({index, pci_bus_id, error}); reported, not a failure), C(quiet_since) (the release's, for
      O(gpuops.gpu.gpu_wait_idle#module:quiet_since) of the wait that follows on the node; null when none),
      C(left_holders) (the release's, for O(gpuops.gpu.gpu_wait_idle#module:left_holders)), C(changed),
      C(check_mode), C(error) (null, or what failed and, for a crash, what to do), C(failure) (null, or
      C({module, kind}), the kinds of P(gpuops.gpu.gpu_idle_result#filter)), C(summary) (one line) and C(stats) (for
      C(set_stats), with C(error) and C(failure), and C(more) when the module's result in summary left some out),
      C(more) (C({released, respawned}) - how many processes a result in summary, O(gpuops.gpu.gpu_release#module:detail),
      left out of C(released) and C(respawned); empty when none).
  type: dict
"""

from ansible_collections.gpuops.gpu.plugins.filter.gpu_idle_result import module_outcome
from ansible_collections.gpuops.gpu.plugins.module_utils import _bound, _mig


def _ran(result) -> bool:
    return isinstance(result, dict) and bool(result) and not result.get("skipped")


# The role variable behind a module option that a message starts with ("containers: ...").
ROLE_VARIABLES = {"containers": "proxmox_fence_containers", "services": "proxmox_fence_services",
                  "shutdown_timeout": "proxmox_fence_shutdown_timeout", "pct": "proxmox_fence_pct",
                  "signal": "proxmox_fence_signal", "grace_period": "proxmox_fence_grace_period",
                  "kill_timeout": "proxmox_fence_kill_timeout", "device_files": "proxmox_fence_device_files"}


def _failure(result, module, host):
    """The module_outcome of a result when it is not a success, its reason as the role says it: a module's own
    msg names the role variable when it is about a module option, else the module; the other reasons (a crash,
    an unreachable node, no result) name the module themselves."""
    outcome = module_outcome(result, module, host=host)
    if outcome["ok"]:
        return None
    msg = result.get("msg") if isinstance(result, dict) else None
    if msg is not None and outcome["reason"] == str(msg):
        option, sep, rest = outcome["reason"].partition(": ")
        reason = f"{ROLE_VARIABLES[option]}: {rest}" if sep and option in ROLE_VARIABLES else f"{module}: {msg}"
        outcome = dict(outcome, reason=reason)
    return outcome


def _wait_cover(containers: dict, rows: list, running: list):
    """What a wait after the fence covers (container_gpus; None: every GPU): the union of each running container's
    wait_gpus (the GPUs its workload held, when its config passes every GPU of a node whose other containers pass GPUs
    too; gpus_from says which), else the GPUs of its config; a container that has a GPU only through MIG devices (their
    capability nodes) gives those MIG devices (by MIG UUID), not the GPU's others. When none of the named containers
    runs: the GPUs of their configs."""
    wait = {c["vmid"]: c.get("wait_gpus", c.get("gpus")) for c in rows}
    union = None if any(g is None for g in wait.values()) else sorted({i for g in wait.values() for i in g})
    migs = {c["vmid"]: c.get("wait_mig_devices") or {} for c in rows}
    if union is not None and any(migs.values()):
        union = _mig.wait_selectors([(g, migs[v].get(str(g))) for v, gs in wait.items() for g in gs])
    if not running and containers.get("gpus"):
        union = list(containers["gpus"])
    return union


def _summary_parts(containers, release, method, running, services, units, released, more, shut_down, error) -> list:
    """The clauses of the fence's one-line summary: what was fenced, stopped, released or shut down, skipped,
    respawned, and whether it failed."""
    respawned = list(release.get("respawned") or [])
    parts = []
    waited = containers.get("waited_for_lock") or release.get("waited_for_lock")
    if isinstance(waited, dict) and waited.get("text"):  # another run fenced first: what it left is all this one saw
        parts.append(str(waited["text"]))
    if running:
        parts.append("fenced CT " + ", CT ".join(str(v) for v in running) + f" ({method})")
    elif not error:
        parts.append("no running container to fence")
    for s in services:
        parts.append(f"stopped {s['unit']} in CT {s['vmid']}")
    for u in units:
        parts.append(f"stopped {u.get('unit')} in CT {u.get('container')}" if u.get("container") is not None
                     else f"stopped {u.get('unit')}")
    if error and not (running or released or shut_down):
        pass  # it failed before anything ran: the error says it all
    elif method == "processes":
        pids = [r.get("pid") for r in released]
        parts.append(f"released {len(pids) + more.get('released', 0)} process(es)" + (
            f" (pid {', '.join(map(str, pids))}" + (f", +{more['released']} more" if more.get("released") else "") + ")"
            if pids else ""))
    else:
        parts.append(f"shut down {len(shut_down)} container(s)")
    for s in containers.get("skipped_containers") or []:
        parts.append(f"skipped CT {s.get('vmid')} ({s.get('reason')})")
    if respawned:
        parts.append("RESPAWNED pid " + ", ".join(str(r.get("pid")) for r in respawned)
                     + " - a supervisor restarts the work: its unit was not stopped (see respawned[].advice)")
    gpu_errors = list(release.get("gpu_errors") or [])
    for e in gpu_errors:
        parts.append(f"GPU {e.get('index')} not fenced (not the containers'; its process list could not be read)")
    if error:
        parts.append("failed (the error follows)")  # said once, by the role's last task
    return parts


def proxmox_fence_result(containers, release=None, method="processes", check_mode=False, host=""):
    failure = _failure(containers, "proxmox_gpu_containers", host)
    containers = containers if isinstance(containers, dict) else {}
    if release is None:
        release = containers.get("release")
    release = release if isinstance(release, dict) else {}
    running = list(containers.get("running") or [])
    rows = [c for c in containers.get("containers") or [] if c.get("vmid") in running]
    per_ct = {c["vmid"]: c.get("gpus") for c in rows}
    union = _wait_cover(containers, rows, running)
    services = [{"vmid": s.get("vmid"), "unit": s.get("unit")} for s in containers.get("services_stopped") or []]
    released = list(release.get("released") or [])
    respawned = list(release.get("respawned") or [])
    # What a result in summary left out of its lists (_bound: the module's detail option), counted, never lost.
    more = {k: _bound.left_out(release, k) or _bound.left_out(containers, f"release.{k}") for k in ("released", "respawned")}
    more = {k: v for k, v in more.items() if v}
    units = list(release.get("stopped_units") or [])
    shut_down = list(containers.get("shut_down") or [])
    in_check = bool(containers.get("check_mode", check_mode))
    # The release must have run when the containers were found and some run (method processes); when it ran
    # anyway (after a service that would not stop), its result is judged too.
    if failure is None and ((method == "processes" and running) or _ran(release)):
        failure = _failure(release, "gpu_release", host)
    error = failure["reason"] if failure else None
    changed = bool(containers.get("changed")) or bool(release.get("changed"))

    parts = _summary_parts(containers, release, method, running, services, units, released, more, shut_down, error)
    summary = ("Check mode, nothing was stopped - would have: " if in_check else "") + "; ".join(parts) \
        + f"; changed={changed}"
    stats = {"containers": running, "services_stopped": services, "released": [r.get("pid") for r in released],
             "stopped_units": [{"unit": u.get("unit"), "container": u.get("container")} for u in units],
             "shut_down": shut_down, "changed": changed, "check_mode": in_check, "error": error,
             "failure": {"module": failure["module"], "kind": failure["kind"]} if failure else None}
    if more:
        stats["more"] = more
    return dict(method=method, containers=running, skipped=list(containers.get("skipped_containers") or []), gpus=per_ct,
                gpus_from={c["vmid"]: c.get("gpus_from", "config") for c in rows}, container_gpus=union,
                services_stopped=services, released=released, respawned=respawned,
                stopped_units=units, shut_down=shut_down, gpus_before=release.get("gpus_before"),
                holder_processes=release.get("holder_processes") or {}, quiet_since=release.get("quiet_since"),
                left_holders=list(release.get("left_holders") or []), gpu_errors=list(release.get("gpu_errors") or []), changed=changed,
                check_mode=in_check, error=error, failure=stats["failure"], summary=summary, stats=stats, more=more)


class FilterModule:
    def filters(self):
        return {"proxmox_fence_result": proxmox_fence_result}
