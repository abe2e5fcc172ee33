# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_idle_result
short_description: The outcome of a release and a wait, as the gpu_idle role records it
version_added: 0.1.0
description:
  - Turns the registered results of M(gpuops.gpu.gpu_release) (optional) and M(gpuops.gpu.gpu_wait_idle) - run with
    C(failed_when=false), or skipped - into one dict - whether the GPUs are ready, what was released, the diagnosis
    and the blockers of a failure, the before and after table (P(gpuops.gpu.gpu_table#filter)) and the summary the
    role publishes with C(set_stats).
  - The role C(gpuops.gpu.gpu_idle) sets its fact C(gpu_idle_result) with it; its logic lives here, unit-tested.
author:
  - gpuops developers (@gpuops)
options:
  _input:
    description: The registered result of M(gpuops.gpu.gpu_wait_idle) (or of a skipped task).
    type: dict
    required: true
  release:
    description: The registered result of M(gpuops.gpu.gpu_release), when it ran.
    type: dict
  fence:
    description:
      - The C(proxmox_fence_result) of the fence that ran before the wait (the C(gpuops.gpu.predeploy) playbook) -
        what it released and stopped is carried into the result, and its snapshot before the release is the
        table's before.
    type: dict
  host:
    description: The inventory host the result is for.
    type: str
  seen_from:
    description: The host the modules ran on, when another one (the Proxmox VE node of a container).
    type: str
  check_mode:
    description: Whether the play runs in check mode.
    type: bool
    default: false
"""

EXAMPLES = r"""
---
- name: Record what the release and the wait did
  ansible.builtin.set_fact:
    gpu_idle_result: "{{ wait | gpuops.gpu.gpu_idle_result(release=release, host=inventory_hostname) }}"
"""

RETURN = r"""
_value:
  description:
    - C(ready), C(elapsed), C(gpus) (how many), C(idle_gpus), C(released) and C(respawned) (pids),
      C(stopped_units) (C(unit (CT n))), C(shut_down) (vmids), C(check_mode), C(would_wait), C(msg),
      C(error) (null, or the diagnosis), C(blockers) (one line per busy GPU), C(table) (lines) and
      C(summary) (what C(set_stats) publishes per host).
  type: dict
"""

from ansible_collections.gpuops.gpu.plugins.filter.gpu_table import gpu_blockers, gpu_table


def _ran(result) -> bool:
    return isinstance(result, dict) and bool(result) and not result.get("skipped")


def _failed(result) -> bool:
    """A module result registered with failed_when=false: a failure is the one that carries a msg
    and no success marker. gpu_release's success has no msg; gpu_wait_idle's success has ready."""
    if not _ran(result):
        return False
    if result.get("unreachable"):
        return True
    if "ready" in result or "would_wait" in result:
        return False  # a success (ready is only ever true), or a check-mode look
    return "msg" in result


def _unit_text(entry) -> str:
    unit = entry.get("unit") or "?"
    ct = entry.get("container") if "container" in entry else entry.get("vmid")
    return f"{unit} (CT {ct})" if ct is not None else unit


def gpu_idle_result(wait, release=None, fence=None, host="", seen_from="", check_mode=False):
    wait = wait if isinstance(wait, dict) else {}
    release = release if isinstance(release, dict) else {}
    fence = fence if isinstance(fence, dict) else {}
    released = [r.get("pid") for r in (fence.get("released") or []) + (release.get("released") or [])]
    respawned = [r.get("pid") for r in (fence.get("respawned") or []) + (release.get("respawned") or [])]
    units = [_unit_text(u) for u in (fence.get("services_stopped") or []) + (fence.get("stopped_units") or [])
             + (release.get("stopped_units") or [])]
    if _ran(release) and release.get("gpus_before") is not None:
        before = release["gpus_before"]
    elif fence.get("gpus_before") is not None:
        before = fence["gpus_before"]
    else:
        before = wait.get("gpus_before")
    after = wait.get("gpus") if _ran(wait) else None
    if after is None:
        after = release.get("gpus") if release.get("gpus") is not None else release.get("gpus_before")
    would_wait = bool(wait.get("would_wait", False))
    in_check = bool(check_mode) or "would_wait" in wait
    error = None
    if _failed(release):
        error = release.get("msg") or "gpu_release failed"
    elif _failed(wait) or not _ran(wait):
        error = wait.get("msg") or "gpu_wait_idle did not run"
    if error is None and in_check:
        ready = not would_wait
    else:
        ready = error is None
    gpus = after if after is not None else (before or [])
    blockers = gpu_blockers(gpus) if error is not None else []
    msg = error if error is not None else (wait.get("msg") or "")
    table = gpu_table(after or [], before=before if before is not None and before is not after else None,
                      host=host, seen_from=seen_from if seen_from and seen_from != host else "",
                      title="GPUs" if before is None else "GPUs before -> after")
    out = dict(
        ready=ready,
        elapsed=float(wait.get("elapsed") or 0.0),
        gpus=len(gpus),
        idle_gpus=list(wait.get("idle_gpus") or []),
        released=released,
        respawned=respawned,
        stopped_units=units,
        shut_down=list(fence.get("shut_down") or []),
        check_mode=in_check,
        would_wait=would_wait,
        msg=msg,
        error=error,
        blockers=blockers,
        table=table,
    )
    out["summary"] = {k: out[k] for k in ("ready", "elapsed", "gpus", "idle_gpus", "released", "respawned",
                                          "stopped_units", "shut_down", "check_mode")}
    return out


class FilterModule:
    def filters(self):
        return {"gpu_idle_result": gpu_idle_result}
