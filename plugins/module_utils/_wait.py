# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The wait-until-idle state machine of gpu_wait_idle. Pure: the snapshots and the clock are injected.

Polls are cheap: the driver's view plus a liveness check of the device-file holders already
known. The full device-file scan (/proc/*/fd of every process) runs only at the moments that
decide: the first poll, when the settle window would close, and never more often than
``full_scan_every`` seconds otherwise. The settle clock starts when the last holder disappears,
not when the memory is freed, and any holder that appears restarts it.
"""

from __future__ import annotations

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _health, _holding


def holders_of(gpu: dict) -> list:
    """What keeps a GPU busy, by the holding model (_holding.verdict, in the snapshot's ``blockers``)."""
    wanted = set(gpu.get("blockers") or ())
    out, seen = [], set()
    for p in list(gpu.get("processes") or []) + list(gpu.get("holders") or []):
        if p["pid"] in wanted and p["pid"] not in seen:
            seen.add(p["pid"])
            out.append(p)
    return out


def new_state() -> dict:
    return {"polls": 0, "full_scans": 0, "last_holder_at": None, "samples": {}, "known_holders": {},
            "last_full_scan_at": None, "first": True}


def record_sample(state: dict, t: float, gpu: dict, holders: int) -> None:
    """A time series per GPU: a point when used memory or the holder count changes."""
    series = state["samples"].setdefault(str(gpu["index"]), [])
    used = (gpu.get("memory") or {}).get("used")
    if not series or series[-1][1] != used or series[-1][2] != holders:
        series.append([round(t, 3), used, holders])


def blockers(gpus: list) -> dict:
    out = {}
    for g in gpus:
        if g["idle"]:
            continue
        out[str(g["index"])] = [
            {"pid": p["pid"], "name": p.get("name"), "container": p.get("container"),
             "visible": p.get("visible", True), "files": p.get("files")}
            for p in holders_of(g)
        ]
    return out


# Memory that has not moved for this long with no process holding the GPU is a leak (gpu_wait_idle's leak_after).
LEAK_AFTER = 30.0
# The drain rate is measured over the samples of the last few seconds.
DRAIN_WINDOW = 5.0


def memory_trend(series: list, now: float, leak_after: float = LEAK_AFTER, max_memory_used_mib: int = 64):
    """What the samples of one GPU (record_sample's [t, used MiB, holders]) say of memory held with no
    holder at ``now``: None (a holder, or memory at baseline); {"kind": "draining", "used", "rate" (MiB/s),
    "left" (s at this rate)} while it falls; {"kind": "leaked", "used", "still"} once it has not moved for
    ``leak_after`` seconds; else {"kind": "unchanged", "used", "still"} (not yet a leak)."""
    if not series:
        return None
    t_last, used, holders = series[-1]
    if used is None or holders or used <= max_memory_used_mib:
        return None
    still = max(0.0, now - t_last)
    if still >= leak_after:
        return {"kind": "leaked", "used": used, "still": still}
    run = []
    for point in reversed(series):
        if point[2] or point[1] is None:
            break
        run.append(point)
    run.reverse()
    window = [p for p in run if p[0] >= t_last - DRAIN_WINDOW]
    if len(window) < 2:
        window = run[-2:]
    if len(window) >= 2 and window[0][1] > used and t_last > window[0][0]:
        rate = (window[0][1] - used) / (t_last - window[0][0])
        return {"kind": "draining", "used": used, "rate": rate, "left": (used - max_memory_used_mib) / rate}
    return {"kind": "unchanged", "used": used, "still": still}


def trends(state: dict, now: float, leak_after: float = LEAK_AFTER, max_memory_used_mib: int = 64) -> dict:
    """memory_trend of every GPU with samples, by index (a string, as in state["samples"])."""
    return {k: memory_trend(v, now, leak_after, max_memory_used_mib) for k, v in (state.get("samples") or {}).items()}


def _gpu_list(indexes) -> str:
    indexes = list(indexes)
    return ("GPU " if len(indexes) == 1 else "GPUs ") + ", ".join(str(i) for i in indexes)


def _rate_text(mib_per_s: float) -> str:
    return f"{mib_per_s / 1024:.1f} GiB/s" if mib_per_s >= 102.4 else f"{mib_per_s:.0f} MiB/s"


def diagnosis(gpus: list, max_memory_used_mib: int, memory=None, leak_after: float = LEAK_AFTER) -> str:
    """'GPU 2 holds 1200 MiB with no visible process (...); GPU 5 is used by pid 8812 (python3) in CT 129'.

    ``memory`` (trends(), from the wait's samples) tells memory still being freed from a leak: those
    GPUs are named once per cause. The failing health checks are named once per check and detail,
    with the GPUs they fail on and what to do.
    """
    parts = []
    draining, leaked = [], []
    health = {}
    for g in gpus:
        if g["idle"]:
            continue
        hs = holders_of(g)
        used = (g.get("memory") or {}).get("used")
        status = g.get("health") or {}
        trend = (memory or {}).get(str(g["index"])) if not hs else None
        reasons = list(g.get("busy_reasons") or [])
        if trend and trend["kind"] == "leaked" and any("not visible from this PID namespace" in r for r in reasons):
            # From a container, memory no visible process holds may be another namespace's: not called a leak.
            trend = dict(trend, kind="unchanged")
        checks = [c for c in status.get("checks") or [] if c.get("blocking")]
        for c in checks:
            health.setdefault((c["check"], c["detail"]), []).append(g["index"])
        reasons = [r for r in reasons if not r.startswith("health check ")]
        if status.get("status", "ok") != "ok":
            parts.append(f"GPU {g['index']} is {status.get('status')} ({status.get('detail')})")
        elif g.get("processes_error") and not hs:
            parts.append(f"GPU {g['index']}: {g['processes_error']}")
        elif hs:
            parts.append(f"GPU {g['index']} is used by " + ", ".join(
                _holding.describe(h) if h.get("visible", True) else f"pid {h['pid']} (not visible from here)" for h in hs))
        elif trend and trend["kind"] in ("draining", "leaked") and used is not None:
            (draining if trend["kind"] == "draining" else leaked).append((g["index"], trend))
            others = [r for r in reasons if not r.startswith(f"{used} MiB used")]
            if others:
                parts.append(f"GPU {g['index']}: " + "; ".join(others))
        elif used is not None and used > max_memory_used_mib:
            text = "; ".join(reasons or [f"{used} MiB used"])
            if trend and trend["kind"] == "unchanged":
                text += (f"; unchanged for {trend['still']:.0f} s with no process (a leak once it stays so for"
                         f" leak_after, {leak_after:g} s)")
            parts.append(f"GPU {g['index']}: {text}")
        elif reasons:
            parts.append(f"GPU {g['index']}: " + "; ".join(reasons))
        elif not checks:
            parts.append(f"GPU {g['index']}: busy")
    for (check, detail), indexes in health.items():
        action = _health.CHECKS[check][1].format(index=",".join(str(i) for i in indexes))
        parts.append(f"{_gpu_list(indexes)}: health check {check} failed: {detail}: {action}")
    if draining:
        rate = min(t["rate"] for _i, t in draining)
        left = max(t["left"] for _i, t in draining)
        parts.append(f"{_gpu_list(i for i, _t in draining)}: memory still being freed ({_rate_text(rate)}, about"
                     f" {left:.0f} s left at this rate) with no process holding "
                     + ("it" if len(draining) == 1 else "them") + ": raise gpu_idle_timeout (the wait's timeout)")
    if leaked:
        held = ", ".join(f"{_holding.mib_text(t['used'])} on GPU {i}" for i, t in leaked)
        still = min(t["still"] for _i, t in leaked)
        parts.append(f"{_gpu_list(i for i, _t in leaked)}: memory leaked ({held}, not freed for {still:.0f} s with no"
                     " process holding it, leak_after " + f"{leak_after:g} s): a leaked context; reset the GPU once"
                     " nothing holds it (" + ", ".join(f"nvidia-smi -r -i {i}" for i, _t in leaked) + ")")
    return "; ".join(parts)


def progress_line(gpus: list, elapsed: float, timeout: float, settling: float = None) -> str:
    idle = [g for g in gpus if g["idle"]]
    waiting = []
    for g in gpus:
        if g["idle"]:
            continue
        used = (g.get("memory") or {}).get("used")
        what = [_holding.mib_text(used)] if used is not None else []
        hs = holders_of(g)
        if hs:
            h = hs[0]
            what.append(f"pid {h['pid']} {h.get('name') or '?'}" + (f", CT {h['container']['id']}" if h.get("container") else "")
                        + (f" +{len(hs) - 1} more" if len(hs) > 1 else ""))
        waiting.append(f"GPU {g['index']} ({', '.join(what)})")
    line = f"gpu_wait_idle: {len(idle)}/{len(gpus)} GPUs idle"
    if waiting:
        line += "; waiting on " + ", ".join(waiting)
    elif settling is not None:
        line += f"; settling ({settling:.1f} s without a holder)"
    return line + f" - {elapsed:.0f} s of {timeout:g} s"


def _check_lost(gpus: list) -> None:
    for g in gpus:
        if (g.get("health") or {}).get("status") == "lost":
            raise _errors.GpuLost(f"GPU {g['index']} ({g.get('pci_bus_id')}) has fallen off the bus while waiting:"
                                  " reboot the host to recover it; check dmesg for Xid 79",
                                  gpu=g["index"], pci_bus_id=g.get("pci_bus_id"))


def _full_scan(state: dict, now: float, gpus: list) -> None:
    state["full_scans"] += 1
    state["last_full_scan_at"] = now
    state["known_holders"] = {}
    for g in gpus:
        nvml_pids = {p["pid"] for p in g.get("processes") or []}
        for h in holders_of(g):
            if h["pid"] not in nvml_pids:  # a device-file holder: followed by pid between full scans
                entry = state["known_holders"].setdefault(str(h["pid"]), [h["pid"], h.get("start_time"), []])
                entry[2].append(g["index"])


def _still_blocking(entry: list, gpus: list, alive) -> bool:
    """Between full scans: a device-node holder with no context blocks only while it lives and one of the
    GPUs it blocked is still busy by what this poll reads (memory, the driver's list). Once the memory
    is back, it holds nothing the next server needs: it lingers, and the wait does not follow it."""
    if not alive(entry[0], entry[1]):
        return False
    on = set(entry[2]) if len(entry) > 2 else None
    return any(not g["idle"] for g in gpus if on is None or g["index"] in on)


def step(state: dict, now: float, snapshot, alive, settle: float, full_scan_every: float):
    """One poll at time ``now`` (seconds since the wait began). Returns (done, gpus).

    ``snapshot(full) -> gpus``: the selected GPUs with their idle verdicts; with ``full`` false
    the device-file scan is skipped (holders empty), so the device-file holders found by the last
    full scan are followed with ``alive(pid, start_time) -> bool`` instead.
    The first poll counts as the moment a holder left: the wait never returns before ``settle``
    seconds of watching, so a supervisor that restarts the server just after a release is caught.
    Raises GpuLost at once for a GPU that fell off the bus.
    """
    state["polls"] += 1
    first = state["last_full_scan_at"] is None
    full = first or now - state["last_full_scan_at"] >= full_scan_every
    gpus = snapshot(full)
    _check_lost(gpus)
    if full:
        _full_scan(state, now, gpus)
    else:
        state["known_holders"] = {k: v for k, v in state["known_holders"].items() if _still_blocking(v, gpus, alive)}
    if first or state["known_holders"] or any(holders_of(g) for g in gpus):
        state["last_holder_at"] = now
    for g in gpus:
        record_sample(state, now, g, len(holders_of(g)))
    idle = all(g["idle"] for g in gpus) and not state["known_holders"]
    settled = now - state["last_holder_at"] >= settle
    scanned = state.get("idle_scan_at") is not None and state["idle_scan_at"] >= state["last_holder_at"]
    if idle and not full and not scanned:
        # It looks idle: a full device-file scan has its word now, when the settle window opens, not
        # when it closes; the polls of the window then see any context that appears (the driver's list),
        # and a device node alone keeps no idle GPU busy. So the wait returns as the window closes.
        gpus = snapshot(True)
        _check_lost(gpus)
        _full_scan(state, now, gpus)
        if state["known_holders"] or any(holders_of(g) for g in gpus):
            state["last_holder_at"] = now
            return False, gpus
        idle = all(g["idle"] for g in gpus)
        full = True
    if not idle:
        state["idle_scan_at"] = None  # busy again: the next idle look is scanned in full again
    elif full:
        state["idle_scan_at"] = now
    return idle and settled, gpus


# After the last holder of a GPU has gone, the driver frees its memory within a second or two
# (the release lag). For that long the wait looks more often, so that it returns soon after the
# memory is freed rather than up to one poll interval later; then it goes back to its interval,
# so that a leaked context (memory that is never freed) costs no more CPU than any busy GPU.
FAST_SLEEP = 0.05
FAST_WINDOW = 5.0


def next_sleep(state: dict, now: float, gpus: list, sleep: float, settle: float, timeout: float) -> float:
    """Seconds until the next poll: ``sleep``, shorter while memory is being freed (no holder left,
    a GPU not idle yet, within FAST_WINDOW of the last holder), never past the moment the settle
    window closes nor past the timeout."""
    wait = sleep
    no_holder = not state["known_holders"] and not any(holders_of(g) for g in gpus)
    since = None if state["last_holder_at"] is None else now - state["last_holder_at"]
    if no_holder and since is not None:
        if not all(g["idle"] for g in gpus) and since < FAST_WINDOW:
            wait = min(wait, FAST_SLEEP)
        if since < settle:
            wait = min(wait, settle - since)
    return max(0.0, min(wait, timeout - now))


# --- reset_leaked: a GPU whose memory leaked is reset on request -------------------------------------

# How to stop the daemons that hold the device nodes by design (the module never stops them itself).
DAEMON_STOP = {
    "nvidia-persistenced": "systemctl stop nvidia-persistenced",
    "nv-fabricmanager": "systemctl stop nvidia-fabricmanager",
    "nv-hostengine": "systemctl stop nvidia-dcgm (DCGM's nv-hostengine)",
    "dcgm-exporter": "stop the dcgm-exporter service or pod",
}


def _holder_text(h: dict) -> str:
    name = h.get("name") or "?"
    text = f"pid {h['pid']} ({name}"
    if h.get("protected") and name in DAEMON_STOP:
        text += ", an NVIDIA daemon: " + DAEMON_STOP[name]
    elif h.get("protected"):
        text += ", protected"
    return text + ")"


def reset_decision(gpu: dict, holders=(), smi_path="nvidia-smi") -> dict:
    """Whether a GPU whose memory leaked may be reset with ``nvidia-smi -r -i <index>``. Pure.

    ``gpu``: the snapshot's GPU (index, pci_bus_id, minor_number, persistence_mode, fabric, and
    display_active / display_mode where they could be read); ``holders``: every process that holds the
    GPU's device node by a full device-file scan, protected daemons included ({pid, name, protected}).
    Returns {"index", "action": "reset" or "refuse", "reason"}: every reason the driver would refuse it
    for, each with what to do."""
    i = gpu.get("index")
    reasons = []
    if gpu.get("display_active") or gpu.get("display_mode"):
        reasons.append(f"GPU {i} is in use by a display (display_active/display_mode Enabled): the driver does not reset"
                       " the primary GPU; move the display to another GPU or stop the display server, or reboot")
    fabric = gpu.get("fabric") or {}
    if fabric.get("state") not in (None, _health.FABRIC_NONE):
        reasons.append(f"GPU {i} is on an NVSwitch system (fabric state {fabric['state']}): a reset must include the"
                       " NVSwitches and every GPU of the fabric, not one GPU; stop every GPU user and the fabric manager"
                       " and reset them all together, or reboot the node")
    if gpu.get("persistence_mode"):
        reasons.append(f"persistence mode is on for GPU {i}: the driver refuses a reset while it is on (In use by another"
                       f" client); turn it off with nvidia-smi -pm 0 -i {i} (and stop nvidia-persistenced), then run"
                       " again")
    if holders:
        reasons.append(", ".join(_holder_text(h) for h in holders) + (" hold" if len(holders) > 1 else " holds")
                       + f" the device node of GPU {i}: the driver refuses a reset while any process holds it; stop "
                       + ("them" if len(holders) > 1 else "it") + " (this module never does), then run again")
    if gpu.get("minor_number") is None and not reasons:
        reasons.append(f"the device node of GPU {i} is unknown (no minor number): whether a process holds it cannot be"
                       " told; reset it by hand once nothing holds it")
    if not smi_path and not reasons:
        reasons.append("nvidia-smi was not found on the target (nvidia_smi_path): it runs the reset")
    if reasons:
        return {"index": i, "action": "refuse", "reason": "; ".join(reasons)}
    return {"index": i, "action": "reset", "reason": "memory leaked and nothing holds the GPU's device node"}


def leaked_to_reset(gpus: list, memory: dict, resets: dict) -> list:
    """The GPUs whose memory leaked (memory[index]["kind"] == "leaked"), with no holder, not yet decided
    upon (``resets``, by index), and not in a container's view (whose memory may be another namespace's)."""
    out = []
    for g in gpus:
        key = str(g["index"])
        trend = (memory or {}).get(key)
        if not trend or trend["kind"] != "leaked" or key in resets or holders_of(g):
            continue
        if any("not visible from this PID namespace" in r for r in g.get("busy_reasons") or []):
            continue
        out.append((g, trend))
    return out


def reset_diff(resets: dict) -> dict:
    """The diff of the resets done (or, in check mode, that would be): 'GPU 2: 2048 MiB leaked' -> 'GPU 2: reset'."""
    before, after = [], []
    for key in sorted(resets, key=int):
        r = resets[key]
        if r["action"] in ("done", "would"):
            before.append(f"GPU {r['index']}: {r['used_mib']} MiB leaked\n")
            after.append(f"GPU {r['index']}: reset\n")
    return {"before": "".join(before), "after": "".join(after)}


def reset_summary(resets: dict) -> str:
    """The refusals, for the timeout's message: 'reset_leaked: GPU 2 not reset (...)'."""
    refused = [r for _k, r in sorted((resets or {}).items(), key=lambda kv: int(kv[0])) if r["action"] == "refused"]
    return "; ".join(f"reset_leaked: GPU {r['index']} not reset: {r['reason']}" for r in refused)
