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
    wait always watches for at least O(settle) seconds.
  - A selected GPU lost from the bus, or a GPU count other than O(expected_count), fails the task at once. A GPU
    that is not selected never fails the wait - lost or failing; with O(backend=nvidia-smi), C(nvidia-smi) is
    asked about the selected GPUs only (from the first look when O(gpus) are indices and O(expected_count) is
    unset, else from the second).
  - On the controller, an action plugin runs the wait in slices of about 10 s and prints a progress line per
    slice at default verbosity. Within a slice the target polls every O(sleep) seconds.
  - Polls are cheap (the driver's view and a liveness check of known holders); the full C(/proc/*/fd) scan
    runs at the first poll, before declaring the GPUs idle, and every 15 s otherwise.
  - Ready means the next server will start, not only that nothing holds the GPUs - each selected GPU must have
    the free memory O(min_free_mib) and O(min_free_pct) ask for, and pass the health checks of O(health_checks)
    (a pending row remap or page retirement, a failed row remap, a fabric that the fabric manager has not
    registered, uncorrectable ECC errors). The diagnosis names the check, the GPUs and what to do.
  - When the wait times out, memory held with no process is told apart from the samples the wait keeps - memory
    that falls is still being freed (the rate and the time left at that rate are given - raise the timeout); memory
    that has not moved for O(leak_after) seconds is a leaked context (reset the GPU). Each cause is named once, with
    the GPUs it applies to.
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
      - From 0 to 86400, and not above O(timeout).
    type: float
    default: 1.0
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
elapsed:
  description: Seconds the wait took.
  returned: always
  type: float
  sample: 1.52
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
  description: The final state of each selected GPU, as in M(gpuops.gpu.gpu_facts) C(gpu_devices).
  returned: always
  type: list
  elements: dict
gpus_before:
  description:
    - The selected GPUs at the first look, in the same shape as RV(gpus) - with RV(gpus), the before and after
      of the wait without another M(gpuops.gpu.gpu_facts) call (the filter P(gpuops.gpu.gpu_table#filter) renders both).
  returned: when the first look succeeded
  type: list
  elements: dict
samples:
  description:
    - Per GPU index, a time series of C([seconds, used MiB, holder count]), one point per change - enough to
      plot a release timeline.
  returned: always
  type: dict
  sample: {"0": [[0.0, 40960, 1], [0.21, 40960, 0], [1.51, 0, 0]]}
blockers:
  description: On failure, per GPU index, what holds it (pid, name, container, visible, files).
  returned: failure
  type: dict
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
      without a change), and C(used) MiB; null for a GPU with a holder or at baseline.
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

import os
import time

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _procs, _smi, _snapshot, _validate, _wait
from ansible_collections.gpuops.gpu.plugins.module_utils._waiting import run_in_group
from ansible_collections.gpuops.gpu.plugins.module_utils._common import (
    SBIN_DIRS,
    IDLE_ARGS,
    SNAPSHOT_ARGS,
    SnapshotTaker,
    fail,
    new_module,
    validate_snapshot_params,
)

FULL_SCAN_EVERY = 15.0


def validate(p):
    validate_snapshot_params(p)
    _validate.wait(p)


def _short(text, limit=240) -> str:
    """One line of at most ``limit`` characters (nvidia-smi's output can be long)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _Background:
    """One call in a thread of its own; ``result()`` waits for it and gives its value (or raises its error)."""

    def __init__(self, func, *args):
        import threading

        self._out = {}
        self._thread = threading.Thread(target=self._run, args=(func,) + args, daemon=True)
        self._thread.start()

    def _run(self, func, *args):
        try:
            self._out["value"] = func(*args)
        except Exception as exc:  # handed to the caller of result()  # pylint: disable=broad-except
            self._out["error"] = exc

    def result(self):
        self._thread.join()
        if "error" in self._out:
            raise self._out["error"]
        return self._out["value"]


def confirm(module, taker, gpus, p):
    """The user's own tool has the last word: one nvidia-smi query must agree.

    Only the selected GPUs are asked about (``taker.smi_ids``): an unselected GPU that is lost or
    failing cannot fail the wait. A failed query is tried once more before the task fails.
    """
    wanted = p["confirm_with_nvidia_smi"]
    if wanted is False:
        return None, ""
    path = module.get_bin_path(p["nvidia_smi_path"], required=False, opt_dirs=SBIN_DIRS)
    if not path:
        if wanted:
            raise _errors.GpuError(f"confirm_with_nvidia_smi: {p['nvidia_smi_path']} not found on the target")
        return None, ""
    raw = None
    for attempt in (1, 2):
        try:
            raw = _smi.query(taker.run_smi, path)
            break
        except (_errors.GpuError, ValueError) as exc:
            if attempt == 2:
                raise _errors.BackendError(
                    f"confirm_with_nvidia_smi: nvidia-smi failed twice on GPU(s) {', '.join(str(g['index']) for g in gpus)}"
                    f" ({_short(getattr(exc, 'msg', exc))}) after NVML found them idle. Retry, or set"
                    " confirm_with_nvidia_smi=false to trust NVML alone.", backend="nvidia-smi") from None
            time.sleep(min(p["sleep"], 1.0))
    by_uuid = {g["uuid"]: g for g in raw["gpus"]}
    seen, disagree = {}, []
    for g in gpus:
        other = by_uuid.get(g["uuid"])
        if other is None:
            disagree.append(f"nvidia-smi does not show GPU {g['index']} ({g['uuid']})")
            continue
        used = other["memory"]["used"]
        pids = [x["pid"] for x in other["processes"]]
        seen[str(g["index"])] = {"used_mib": used, "pids": pids}
        if pids:
            disagree.append(f"nvidia-smi shows GPU {g['index']} used by pid(s) {', '.join(map(str, pids))}")
        elif used is not None and used > p["max_memory_used_mib"]:
            disagree.append(f"nvidia-smi shows GPU {g['index']} with {used} MiB used")
    return seen, "; ".join(disagree)


def _smi_path(module, taker, p):
    return taker.smi or module.get_bin_path(p["nvidia_smi_path"], required=False, opt_dirs=SBIN_DIRS)


def _display(taker, smi, index):
    """display_active / display_mode of one GPU by nvidia-smi (True/False), or None each where it cannot tell."""
    try:
        rc, out, _err = run_in_group([smi, "--query-gpu=display_active,display_mode", "--format=csv,noheader",
                                      "-i", str(index)], taker.params["query_timeout"], "nvidia-smi --query-gpu",
                                     {"LC_ALL": "C"})
    except _errors.GpuError:
        return None, None
    cells = [c.strip() for c in out.strip().split(",")] if rc == 0 else []
    if len(cells) != 2:
        return None, None
    return tuple({"Enabled": True, "Disabled": False}.get(c) for c in cells)


def _node_holders(taker, p, gpu, scan):
    """Every process that holds the GPU's device node (/dev/nvidia<minor>), protected daemons included."""
    out = []
    for pid, files in sorted(scan.items()):
        if not any(_procs.device_file_index(f) == gpu.get("minor_number") for f in files):
            continue
        info = taker._read_for_build(pid) or {"pid": pid, "name": None}  # the raw command line, to match only
        names = _snapshot._names(info) & set(_snapshot.PROTECTED_NAMES)
        out.append({"pid": pid, "name": sorted(names)[0] if names else info.get("name"),
                    "protected": bool(_snapshot.is_protected(info, extra=taker.protect, exe_of=_procs.read_exe))})
    return out


def reset_leaked(module, taker, p, state, gpus, now):
    """Reset (or, in check mode, say it would) each selected GPU whose memory leaked; True when one was reset."""
    resets = state.setdefault("resets", {})
    memory = _wait.trends(state, now, p["leak_after"], p["max_memory_used_mib"])
    todo = _wait.leaked_to_reset(gpus, memory, resets)
    if not todo:
        return False
    smi = _smi_path(module, taker, p)
    # A full device-file scan, whatever include_device_holders says: the protected daemons count too.
    scan = _procs.scan_fd_holders(p["device_files"], exclude_pids=(os.getpid(),))
    done = False
    for gpu, trend in todo:
        g = dict(gpu)
        if smi:
            g["display_active"], g["display_mode"] = _display(taker, smi, g["index"])
        decision = _wait.reset_decision(g, _node_holders(taker, p, g, scan), smi)
        entry = {"index": g["index"], "used_mib": trend["used"], "reason": decision["reason"], "rc": None, "output": None}
        if decision["action"] == "refuse":
            entry["action"] = "refused"
        elif module.check_mode:
            entry["action"] = "would"
        else:
            argv = [smi, "-r", "-i", str(g["index"])]
            try:
                rc, out, err = run_in_group(argv, p["query_timeout"], "nvidia-smi -r", {"LC_ALL": "C"})
            except _errors.GpuError as exc:
                rc, out, err = None, "", str(getattr(exc, "msg", exc))
            text = " ".join((out + " " + err).split())[:1000]
            entry.update(rc=rc, output=text)
            if rc == 0:
                entry["action"] = "done"
                done = True
            else:
                entry["action"] = "refused"
                entry["reason"] = f"nvidia-smi -r -i {g['index']} failed (exit {rc}): {_short(text)}"
        resets[str(g["index"])] = entry
    if done:
        # The reset freed the memory: the wait watches a settle window again from now, with a full scan.
        state["last_holder_at"] = now
        state["idle_scan_at"] = None
    return done


def _reset_result(module, state, result):
    resets = state.get("resets") or {}
    result["resets"] = [resets[k] for k in sorted(resets, key=int)]
    if any(r["action"] in ("done", "would") for r in result["resets"]):
        result["changed"] = True
        if module._diff:
            result["diff"] = _wait.reset_diff(resets)


def main() -> None:
    argument_spec = dict(SNAPSHOT_ARGS, **IDLE_ARGS)
    argument_spec.update(
        expected_count=dict(type="int"),
        timeout=dict(type="float", default=300.0),
        delay=dict(type="float", default=0.0),
        sleep=dict(type="float", default=0.5),
        settle=dict(type="float", default=1.0),
        msg=dict(type="str"),
        confirm_with_nvidia_smi=dict(type="bool"),
        leak_after=dict(type="float", default=_wait.LEAK_AFTER),
        reset_leaked=dict(type="bool", default=False),
        progress_slice=dict(type="float"),
        progress_state=dict(type="dict"),
    )
    module = new_module(argument_spec, supports_check_mode=True)
    p = module.params
    try:
        validate(p)
    except _errors.GpuError as exc:
        fail(module, exc)
        return
    for warning in _validate.device_pattern_warnings(p):
        module.warn(warning)

    carried = p["progress_state"]
    state = carried["wait"] if carried else _wait.new_state()
    offset = float(carried.get("offset", 0.0)) if carried else 0.0
    if not carried and p["delay"] and not module.check_mode:
        time.sleep(p["delay"])  # before the first look; not counted in timeout, as in wait_for
    t0 = time.monotonic()

    def now():
        return offset + time.monotonic() - t0

    taker = SnapshotTaker(module)
    checked_count = {"done": bool(carried)}
    selectors = _validate.gpu_selectors(p["gpus"])
    indices_only = bool(selectors) and all(_validate.is_ascii_digits(x) for x in selectors)
    if indices_only and (p["expected_count"] is None or checked_count["done"]):
        # nvidia-smi is asked about the selected GPUs only, from the first look on: an unselected GPU
        # that is lost or failing makes nvidia-smi exit non-zero, and must not fail this wait.
        taker.smi_ids = sorted({str(int(x)) for x in selectors}, key=int)

    def snapshot(full):
        snap = taker.take(gather_processes=True, gather_holders=full and p["include_device_holders"])
        if not checked_count["done"]:
            _snapshot.check_count(snap["gpus"], p["expected_count"])
            checked_count["done"] = True
        try:
            selected = _snapshot.select_gpus(snap["gpus"], p["gpus"])
        except _errors.SelectionError:
            if not (taker.smi_ids and taker.backend == "nvidia-smi"):
                raise
            taker.smi_ids = None  # once more, unrestricted: the message lists the GPUs the host has
            selected = _snapshot.select_gpus(taker.take(gather_processes=False, gather_holders=False)["gpus"], p["gpus"])
        if selectors:
            # From now on nvidia-smi (the backend, and the final confirmation) sees the selected GPUs only.
            taker.smi_ids = [str(g["index"]) for g in selected]
        return selected

    def alive(pid, start_time):
        ident = _procs.read_identity(pid)
        return ident is not None and (start_time is None or ident[1] == start_time)

    result = dict(changed=False)
    try:
        if module.check_mode:
            gpus = snapshot(True)
            _wait._check_lost(gpus)
            before, polls, samples = gpus, 1, {}
            if p["reset_leaked"]:
                # Memory held with no process is watched until it is told apart: a leak after leak_after seconds.
                limit = min(p["leak_after"] + max(p["sleep"], 0.1), p["timeout"])
                while True:
                    t = now()
                    for g in gpus:
                        _wait.record_sample(state, t, g, len(_wait.holders_of(g)))
                    trends = _wait.trends(state, t, p["leak_after"], p["max_memory_used_mib"])
                    if t >= limit or all(v is None or v["kind"] == "leaked" for v in trends.values()):
                        break
                    time.sleep(min(p["sleep"], max(0.0, limit - t)))
                    gpus = snapshot(False)
                    _wait._check_lost(gpus)
                    polls += 1
                reset_leaked(module, taker, p, state, gpus, now())
                samples = state["samples"]
            check = dict(changed=False)
            if p["reset_leaked"]:
                _reset_result(module, state, check)
            module.exit_json(would_wait=not all(g["idle"] for g in gpus), elapsed=round(now(), 3), polls=polls,
                             idle_gpus=[g["index"] for g in gpus if g["idle"]], gpus=gpus, gpus_before=before,
                             samples=samples, confirmation=None,
                             msg=_wait.diagnosis(gpus, p["max_memory_used_mib"]) or "all selected GPUs are idle", **check)
        slice_end = time.monotonic() + p["progress_slice"] if p["progress_slice"] else None
        confirmed = {}
        while True:
            done, gpus = _wait.step(state, now(), snapshot, alive, p["settle"], FULL_SCAN_EVERY)
            if p["reset_leaked"] and not done:
                reset_leaked(module, taker, p, state, gpus, now())
            if p["reset_leaked"]:
                _reset_result(module, state, result)
            scan_at = state.get("idle_scan_at")
            if scan_at is not None and not done and confirmed.get("at") != scan_at:
                # The GPUs look idle and the settle window opens: nvidia-smi is asked now, beside the polls of
                # the window, so that the wait returns as the window closes; a holder within the window starts
                # the window (and this) again.
                confirmed = {"at": scan_at, "job": _Background(confirm, module, taker, gpus, p)}
            if not carried and "gpus_before" not in result:
                result["gpus_before"] = gpus  # what the wait started from (later slices: the action plugin keeps it)
            result.update(polls=state["polls"], samples=state["samples"], gpus=gpus,
                          idle_gpus=[g["index"] for g in gpus if g["idle"]])
            if done:
                early = confirmed["job"].result() if confirmed.get("at") == scan_at else None
                if early is not None and not early[1]:
                    seen, disagreement = early
                else:
                    seen, disagreement = confirm(module, taker, gpus, p)
                result["confirmation"] = seen
                result["elapsed"] = round(now(), 3)
                if disagreement:
                    module.fail_json(msg=f"NVML says the GPUs are idle but nvidia-smi disagrees: {disagreement}",
                                     blockers=_wait.blockers(gpus), **result)
                module.exit_json(msg=f"{len(gpus)} GPU(s) idle after {result['elapsed']:.2f} s", ready=True, **result)
            elapsed = now()
            if elapsed >= p["timeout"]:
                gpus = snapshot(True)  # the diagnosis names device-file holders too
                for g in gpus:
                    _wait.record_sample(state, elapsed, g, len(_wait.holders_of(g)))
                memory = _wait.trends(state, elapsed, p["leak_after"], p["max_memory_used_mib"])
                result.update(gpus=gpus, idle_gpus=[g["index"] for g in gpus if g["idle"]], samples=state["samples"])
                result.update(elapsed=round(elapsed, 3), confirmation=None, blockers=_wait.blockers(gpus),
                              memory=memory)
                prefix = (p["msg"] + ": ") if p["msg"] else ""
                refusals = _wait.reset_summary(state.get("resets"))
                module.fail_json(msg=f"{prefix}timed out after {p['timeout']:g} s: "
                                     + (_wait.diagnosis(gpus, p["max_memory_used_mib"], memory, p["leak_after"])
                                        or f"a holder appeared within the last {p['settle']:g} s (settle)")
                                     + (f"; {refusals}" if refusals else ""),
                                 **result)
            if slice_end is not None and time.monotonic() >= slice_end:
                settling = None if state["last_holder_at"] is None else elapsed - state["last_holder_at"]
                module.exit_json(pending=True, progress_state={"wait": state},
                                 progress=_wait.progress_line(gpus, elapsed, p["timeout"], settling),
                                 elapsed=round(elapsed, 3), **{k: v for k, v in result.items() if k != "changed"},
                                 changed=result.get("changed", False))
            time.sleep(_wait.next_sleep(state, elapsed, gpus, p["sleep"], p["settle"], p["timeout"]))
    except _errors.GpuError as exc:
        fail(module, exc, **{k: v for k, v in result.items() if k != "changed"})


if __name__ == "__main__":
    main()
