# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The wait-until-idle of gpu_wait_idle: its state machine (step), its diagnosis, and its run (Wait).

The state machine and the diagnosis are pure; Wait runs the wait with its I/O injected (the snapshots,
liveness, the clock, sleep, nvidia-smi): _host.wait_io.WaitIO on a real host, a fake in unit tests.

Polls are cheap: the driver's view plus a liveness check of the device-file holders already
known. The full device-file scan (/proc/*/fd of every process) runs only at the moments that
decide: the first poll, when the settle window would close, and never more often than
``full_scan_every`` seconds otherwise. The settle clock starts when the last holder disappears,
not when the memory is freed, and any holder that appears restarts it.
"""

from __future__ import annotations

import collections

from ansible_collections.gpuops.gpu.plugins.module_utils import _bound, _errors, _health, _holding, _smi, _snapshot, _validate


holders_of = _holding.holders_of


class Looks:
    """The wait's look at its GPUs (``look(full)`` -> the selected GPUs): the GPU count checked at the first look
    (expected_count), then the selection (O(gpus)). nvidia-smi is asked about the selected GPUs only (``io.restrict``):
    from the first look on when they are named by index alone (an unselected GPU that is lost or failing makes
    nvidia-smi exit non-zero, and must not fail this wait), else from the first selection on."""

    def __init__(self, p: dict, io, selection):
        self.p = p
        self.io = io
        self.selection = selection  # the gpus option, parsed once (_validate.snapshot: a _selection.Selection)
        self.count_checked = bool(p.get("progress_state"))  # a later slice: the first one checked it
        indexes = selection.indexes()
        if indexes is not None and (p.get("expected_count") is None or self.count_checked):
            io.restrict([str(i) for i in indexes])

    def __call__(self, full: bool) -> list:
        io, p = self.io, self.p
        gpus = io.snapshot(full)
        if not self.count_checked:
            _snapshot.check_count(gpus, p.get("expected_count"))
            self.count_checked = True
        try:
            selected = self.selection.pick(gpus)
        except _errors.SelectionError:
            if not io.restricted():
                raise
            io.restrict(None)  # once more, unrestricted: the message lists the GPUs the host has
            selected = self.selection.pick(io.snapshot(False, processes=False))
        if self.selection:
            # From now on nvidia-smi (the backend, and the final confirmation) sees the selected GPUs only.
            io.restrict([str(g["index"]) for g in selected])
        return selected


def new_state() -> dict:
    return {"polls": 0, "full_scans": 0, "last_holder_at": None, "samples": {}, "known_holders": {},
            "last_full_scan_at": None, "device_seen": {}, "credited": False, "last_poll_at": None}


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
# How long a process the release left (left_holders) may keep a selected GPU busy before the wait fails on it.
BLOCKER_GRACE = 5.0


def left_blockers(gpus: list, left: dict) -> list:
    """[(GPU index, holder, why the release left it)] for each busy GPU kept busy by a process of ``left``
    ({(pid, start_time): reason}: the release's left_holders), in GPU order."""
    out = []
    for g in gpus:
        if g["idle"]:
            continue
        for h in holders_of(g):
            why = left.get((h["pid"], h.get("start_time")))
            if why is not None:
                out.append((g["index"], h, why))
    return out


def blocked_text(found: list, elapsed: float, timeout: float, grace: float, level: str = _bound.SUMMARY) -> str:
    """Why the wait fails fast: each GPU kept busy by a process the release left, why it left it, and what to do (in
    summary the first few: _bound.listed)."""
    parts = []
    for index, h, why in found:
        parts.append(f"GPU {index} is used by {_holding.describe(h)}, which the release before this wait left ({why}):"
                     f" nothing in this hook will stop it. See it: `ps -o pid,user,etime,args -p {h['pid']}`. When it may"
                     f" be stopped: {_holding.stop_advice(h)}; or leave GPU {index} out of the GPUs to wait for")
    return (f"blocked after {elapsed:.1f} s of {timeout:g} s (still there after blocker_grace, {grace:g} s): "
            + _bound.listed(parts, level, "; "))


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


def _bystanders(gpu: dict, holders: list) -> list:
    """The holders of a GPU that hold only its device node, with no context, on a GPU whose process list was read.

    CUDA opens the device node of every GPU it sees, so such a process holds no memory here
    (docs/holding-model.md: lingering). The holding rule keeps it among the blockers only while memory in use is
    not accounted for by the driver's list - memory that the diagnosis names, and that the samples count as held
    with no process.
    """
    if gpu.get("processes_error"):
        return []
    contexts = {p["pid"] for p in gpu.get("processes") or []}
    return [h for h in holders if h["pid"] not in contexts]


def memory_holders(gpu: dict) -> list:
    """holders_of(gpu) less the device-node bystanders (_bystanders): the processes that may hold its memory."""
    hs = holders_of(gpu)
    lingering = {h["pid"] for h in _bystanders(gpu, hs)}
    return [h for h in hs if h["pid"] not in lingering]


def _them(entries) -> str:
    return "it" if len(entries) == 1 else "them"


def _held(entries: list, verb: str) -> str:
    """'2048 MiB used' (one GPU), '40960 MiB used on each' (the same on every GPU), else
    '2048 MiB on GPU 1, 300 MiB on GPU 2 used': the MiB figure of each GPU, always."""
    used = [t["used"] for _i, t in entries]
    if len(entries) == 1:
        return f"{used[0]} MiB {verb}"
    if len(set(used)) == 1:
        return f"{used[0]} MiB {verb} on each"
    return ", ".join(f"{t['used']} MiB on GPU {i}" for i, t in entries) + f" {verb}"


def _unchanged_text(entries: list, leak_after: float, hidden: bool) -> str:
    """Memory held with no process that has not moved yet for leak_after: a release lag, or a leak to come."""
    indexes = [i for i, _t in entries]
    still = min(t["still"] for _i, t in entries)
    unchanged = f"unchanged for {still:.0f} s with no process (a leak once it stays so for leak_after, {leak_after:g} s)"
    if hidden:
        # From a container: memory no visible process holds may be another namespace's.
        return (f"{_gpu_list(indexes)}: {_held(entries, 'used')} by processes not visible from this PID namespace"
                f" (another container or the host), or a leaked context; {unchanged}")
    reset = f"nvidia-smi -r -i {indexes[0]} resets it" if len(indexes) == 1 else "nvidia-smi -r -i <index> resets a GPU"
    return (f"{_gpu_list(indexes)}: {_held(entries, 'used')} and no process holds {_them(entries)}: the driver is still"
            f" freeing the memory of exited processes, or a context leaked ({reset} once nothing holds it); {unchanged}:"
            " raise timeout (gpu_idle_timeout) to give the driver time to free it")


def diagnosis(gpus: list, max_memory_used_mib: int, memory=None, leak_after: float = LEAK_AFTER,
              level: str = _bound.SUMMARY) -> str:
    """'GPU 2: 1200 MiB used and no process holds it: ...; GPU 5 is used by pid 8812 (python3) in CT 129'.

    One sentence per cause, with the GPUs it applies to (the same cause on several GPUs is named once):
    ``memory`` (trends(), from the wait's samples) tells memory still being freed (raise the timeout), memory
    unchanged for less than ``leak_after`` (a release lag or a leak to come) and a leak (reset the GPU), each
    with its MiB figures; the failing health checks are named once per check and detail, with the GPUs they fail
    on and what to do. A process that holds only a GPU's device node, with no context, is named as lingering,
    never as the GPU's user (docs/holding-model.md). ``level`` (the detail option): in summary a GPU's users are
    named up to a few, and counted beyond (_bound.listed).
    """
    causes = _Causes(max_memory_used_mib, memory, level)
    for g in gpus:
        if not g["idle"]:
            causes.gpu(g)
    return "; ".join(causes.sentences() + causes.memory_sentences(leak_after) + causes.lingering_sentences())


class _Causes:
    """The causes diagnosis names, gathered one busy GPU at a time (``gpu``): each cause with its GPUs, in the order
    of the GPUs; then said as sentences (the GPUs' own causes, their health checks, their memory, what lingers)."""

    def __init__(self, max_memory_used_mib: int, memory, level: str = _bound.SUMMARY):
        self.max_memory_used_mib, self.memory, self.level = max_memory_used_mib, memory or {}, level
        self.each = []  # [verb, text, [indexes]]
        self.draining, self.leaked, self.unchanged, self.hidden = [], [], [], []
        self.health, self.lingering = {}, {}

    def add(self, verb, text, index):
        for entry in self.each:
            if entry[0] == verb and entry[1] == text:
                entry[2].append(index)
                return
        self.each.append([verb, text, [index]])

    def gpu(self, g: dict) -> None:
        i = g["index"]
        hs = holders_of(g)
        by = _bystanders(g, hs)
        hs = [h for h in hs if h not in by]
        if by:
            self.lingering.setdefault(tuple(_holding.describe(h) for h in by), []).append(i)
        used = (g.get("memory") or {}).get("used")
        status = g.get("health") or {}
        trend = self.memory.get(str(i)) if not hs else None
        reasons = list(g.get("busy_reasons") or [])
        unseen = any("not visible from this PID namespace" in r for r in reasons)
        if trend and trend["kind"] == "leaked" and unseen:
            # From a container, memory no visible process holds may be another namespace's: not called a leak.
            trend = dict(trend, kind="unchanged")
        checks = [c for c in status.get("checks") or [] if c.get("blocking")]
        for c in checks:
            self.health.setdefault((c["check"], c["detail"]), []).append(i)
        reasons = [r for r in reasons if not r.startswith("health check ")
                   and not (by and r.startswith("device file held by "))]
        if status.get("status", "ok") != "ok":
            self.add("is", f"{status.get('status')} ({status.get('detail')})", i)
        elif g.get("processes_error") and not hs:
            self.add(":", g["processes_error"], i)
        elif hs:
            self.add("is", "used by " + _bound.listed((
                _holding.describe(h) + (f", {_holding.mps_server_text(h['mps_server'])}" if h.get("mps_server") else "")
                for h in hs), self.level), i)
        elif trend and used is not None:
            kinds = {"draining": self.draining, "leaked": self.leaked}
            kinds.get(trend["kind"], self.hidden if unseen else self.unchanged).append((i, trend))
            others = [r for r in reasons if not r.startswith(f"{used} MiB used")]
            if others:
                self.add(":", "; ".join(others), i)
        elif used is not None and used > self.max_memory_used_mib:
            self.add(":", "; ".join(reasons or [f"{used} MiB used"]), i)
        elif reasons:
            self.add(":", "; ".join(reasons), i)
        elif not checks:
            self.add(":", "busy", i)

    def sentences(self) -> list:
        parts = []
        for verb, text, indexes in self.each:
            if verb == ":":
                parts.append(f"{_gpu_list(indexes)}: {text}")
            else:
                parts.append(f"{_gpu_list(indexes)} {'is' if len(indexes) == 1 else 'are'} {text}")
        for (check, detail), indexes in self.health.items():
            action = _health.CHECKS[check][1].format(index=",".join(str(i) for i in indexes))
            parts.append(f"{_gpu_list(indexes)}: health check {check} failed: {detail}: {action}")
        return parts

    def memory_sentences(self, leak_after: float) -> list:
        parts = []
        draining, leaked = self.draining, self.leaked
        if draining:
            rate = min(t["rate"] for _i, t in draining)
            left = max(t["left"] for _i, t in draining)
            parts.append(f"{_gpu_list(i for i, _t in draining)}: memory still being freed ({_held(draining, 'in use')},"
                         f" {_rate_text(rate)}, about {left:.0f} s left at this rate) with no process holding {_them(draining)}:"
                         " raise timeout (gpu_idle_timeout)")
        for entries, in_view in ((self.unchanged, False), (self.hidden, True)):
            if entries:
                parts.append(_unchanged_text(entries, leak_after, in_view))
        if leaked:
            held = ", ".join(f"{t['used']} MiB on GPU {i}" for i, t in leaked)
            still = min(t["still"] for _i, t in leaked)
            parts.append(f"{_gpu_list(i for i, _t in leaked)}: memory leaked ({held}, not freed for {still:.0f} s with no"
                         " process holding it, leak_after " + f"{leak_after:g} s): a leaked context; reset the GPU once"
                         " nothing holds it (" + ", ".join(f"nvidia-smi -r -i {i}" for i, _t in leaked) + ")")
        return parts

    def lingering_sentences(self) -> list:
        parts = []
        resettable = {i for i, _t in self.leaked + self.unchanged}
        for who, indexes in self.lingering.items():
            node = "the device node" if len(indexes) == 1 else "their device nodes"
            parts.append(f"{_gpu_list(indexes)}: {_bound.listed(who, self.level)} {'holds' if len(who) == 1 else 'hold'} only {node}, with"
                         f" no context (lingering: not what keeps {_them(indexes)} busy"
                         + ("; a reset waits until nothing holds the node)" if resettable & set(indexes) else ")"))
        return parts


def progress_line(gpus: list, elapsed: float, timeout: float, settling: float = None, left=None) -> str:
    """One line per progress slice; ``left`` (as left_blockers takes it): a holder the release left is said to be
    one the hook will not stop."""
    idle = [g for g in gpus if g["idle"]]
    left = left or {}
    waiting = []
    for g in gpus:
        if g["idle"]:
            continue
        used = (g.get("memory") or {}).get("used")
        what = [_holding.mib_text(used)] if used is not None else []
        hs = memory_holders(g)
        if hs:
            h = hs[0]
            what.append(f"pid {h['pid']} {h.get('name') or '?'}" + (f", CT {h['container']['id']}" if h.get("container") else "")
                        + (", left by the release: the hook will not stop it" if (h["pid"], h.get("start_time")) in left else "")
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


def _still_blocking(entry: list, gpus: list) -> bool:
    """Between full scans: a device-node holder with no context (alive: step checks) blocks only while one of
    the GPUs it blocked is still busy by what this poll reads (memory, the driver's list). Once the memory
    is back, it holds nothing the next server needs: it lingers, and the wait does not follow it."""
    on = set(entry[2]) if len(entry) > 2 else None
    return any(not g["idle"] for g in gpus if on is None or g["index"] in on)


def _appeared(state: dict, gpus: list) -> bool:
    """Whether this poll sees a holder that the settle clock counts from: a context (the driver lists it), or a
    device-node holder with no context not seen before (by this wait, or by the release that handed it its quiet
    time). One that has been there all along while the memory is freed is not new: were it the memory's owner,
    the memory would not be freed while it lives; its leaving counts (step's ``left``)."""
    seen = state.setdefault("device_seen", {})
    found = False
    for g in gpus:
        listed = {p["pid"] for p in g.get("processes") or []}
        for h in holders_of(g):
            if h["pid"] in listed:
                found = True
            elif seen.get(str(h["pid"]), False) != h.get("start_time"):
                seen[str(h["pid"])] = h.get("start_time")
                found = True
    return found


def _track(state: dict, now: float, gpus: list, full: bool, alive, settle: float, first: bool) -> None:
    """The holders a poll knows (a full look's scan, else the last scan's that are still alive and blocking) and the
    settle clock's origin (``last_holder_at``): when a holder left or appeared, or the first look's."""
    before = state["known_holders"]
    if full:
        _full_scan(state, now, gpus)
        left = any(k not in state["known_holders"] and not alive(v[0], v[1]) for k, v in before.items())
    else:
        living = {k: v for k, v in before.items() if alive(v[0], v[1])}
        left = len(living) < len(before)
        state["known_holders"] = {k: v for k, v in living.items() if _still_blocking(v, gpus)}
    if left:  # last seen at the poll before this one, as a context holder's last poll counts
        state["last_holder_at"] = now if state.get("last_poll_at") is None else state["last_poll_at"]
    appeared = _appeared(state, gpus)
    if first and not state.get("credited"):
        # An idle node answers in one look: when this first full look finds nothing at all on the selected GPUs
        # (no context, no device-node holder, each GPU idle by its memory and utilization) and no release handed
        # over its quiet time, nothing is being released: the settle window guards an asynchronous release (a
        # driver still freeing memory, a supervisor about to restart what was stopped), and none is in progress.
        nothing = not appeared and not state["known_holders"] and all(g["idle"] for g in gpus)
        state["idle_at_first_look"] = nothing
        state["last_holder_at"] = now - settle if nothing else now
    elif appeared:
        state["last_holder_at"] = now


def step(state: dict, now: float, snapshot, alive, settle: float, full_scan_every: float):
    """One poll at time ``now`` (seconds since the wait began). Returns (done, gpus).

    ``snapshot(full) -> gpus``: the selected GPUs with their idle verdicts; with ``full`` false
    the device-file scan is skipped (holders empty), so the device-file holders found by the last
    full scan are followed with ``alive(pid, start_time) -> bool`` instead.
    The first poll counts as the moment a holder left: the wait does not return before ``settle``
    seconds of watching, so a supervisor that restarts the server just after a release is caught -
    unless the release that ran just before handed over its quiet time (``credit``: the state's
    ``last_holder_at`` is then when that release last saw a holder, and ``credited`` is set), or the
    first look (a full one) finds nothing at all on an idle node and no release is in progress: then it is
    ready at once (``idle_at_first_look``).
    The clock restarts at a poll that sees a context, a device-node holder not seen before, or a
    device-node holder that was blocking and is gone.
    Raises GpuLost at once for a GPU that fell off the bus.
    """
    state["polls"] += 1
    first = state["last_full_scan_at"] is None
    full = first or now - state["last_full_scan_at"] >= full_scan_every
    gpus = snapshot(full)
    _check_lost(gpus)
    _track(state, now, gpus, full, alive, settle, first)
    state["last_poll_at"] = now
    for g in gpus:
        record_sample(state, now, g, len(memory_holders(g)))
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


def settle_origin(state: dict) -> str:
    """Where the settle window counted from: ``release`` (its quiet time), ``idle`` (the first look found an idle
    node with nothing on it: no window), else ``wait`` (this wait's own polls)."""
    if state.get("credited") and state["last_holder_at"] < 0:
        return "release"
    return "idle" if state.get("idle_at_first_look") else "wait"


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
    "nvidia-cuda-mps-control": "echo quit | nvidia-cuda-mps-control (stops MPS)",
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


# --- the wait, run: gpu_wait_idle's orchestration, its I/O injected ------------------------------------

# The full device-file scan runs at most this often between the moments that decide (step()).
FULL_SCAN_EVERY = 15.0


def short(text, limit=240) -> str:
    """One line of at most ``limit`` characters (nvidia-smi's output can be long)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def agreement(gpus: list, raw: dict, max_memory_used_mib: int, level: str = _bound.SUMMARY):
    """What nvidia-smi's snapshot ``raw`` (_smi.query) says of the GPUs that NVML found idle.

    Returns (seen, disagreement): per GPU index its used MiB and pids; '' when it agrees, else one clause per GPU."""
    by_uuid = {g["uuid"]: g for g in raw["gpus"]}
    seen, disagree = {}, []
    for g in gpus:
        other = by_uuid.get(g["uuid"])
        if other is None:
            disagree.append(f"nvidia-smi does not show GPU {g['index']} ({g['uuid']})")
            continue
        # A GPU judged as far as some of its MIG devices go (_mig.narrow): nvidia-smi's list is the whole GPU's, so the
        # processes on its other MIG devices are left out, and its memory (the whole GPU's) is not compared.
        others = set(g.get("mig_unselected_pids") or ())
        used = None if g.get("mig_selected") else other["memory"]["used"]
        pids = [x["pid"] for x in other["processes"] if x["pid"] not in others]
        seen[str(g["index"])] = {"used_mib": used, "pids": pids}
        if pids:
            disagree.append(f"nvidia-smi shows GPU {g['index']} used by pid(s) {_bound.listed(map(str, pids), level)}")
        elif used is not None and used > max_memory_used_mib:
            disagree.append(f"nvidia-smi shows GPU {g['index']} with {used} MiB used")
    return seen, "; ".join(disagree)


def display_flags(rc, out: str):
    """display_active / display_mode (True/False, or None where it cannot tell) from nvidia-smi's CSV answer."""
    cells = [c.strip() for c in out.strip().split(",")] if rc == 0 else []
    if len(cells) != 2:
        return None, None
    return tuple({"Enabled": True, "Disabled": False}.get(c) for c in cells)


def confirm(p: dict, io, gpus: list, elapsed=None):
    """The user's own tool has the last word: one nvidia-smi query must agree. Returns (seen, disagreement).

    Only the selected GPUs are asked about (the taker's smi_ids): an unselected GPU that is lost or
    failing cannot fail the wait. A failed query is tried once more before the task fails, but not a second try
    that would begin at or past the wait's timeout (``elapsed()``: the wait's seconds so far; None: no clock).
    """
    wanted = p["confirm_with_nvidia_smi"]
    if wanted is False:
        return None, ""
    path = io.confirm_path()
    if not path:
        if wanted:
            raise _errors.GpuError(f"confirm_with_nvidia_smi: {p['nvidia_smi_path']} not found on the target")
        return None, ""
    raw = None
    for attempt in (1, 2):
        try:
            raw = io.smi_query(path)
            break
        except (_errors.GpuError, ValueError) as exc:
            late = elapsed is not None and elapsed() + min(p["sleep"], 1.0) >= p["timeout"]
            if attempt == 2 or late:
                tries = "twice" if attempt == 2 else f"before the wait's timeout ({p['timeout']:g} s)"
                raise _errors.BackendError(
                    f"confirm_with_nvidia_smi: nvidia-smi failed {tries} on GPU(s) {', '.join(str(g['index']) for g in gpus)}"
                    f" ({short(getattr(exc, 'msg', exc))}) after NVML found them idle. Retry, or set"
                    " confirm_with_nvidia_smi=false to trust NVML alone.", backend="nvidia-smi") from None
            io.sleep(min(p["sleep"], 1.0))
    return agreement(gpus, raw, p["max_memory_used_mib"], p.get("detail"))


def node_holders(io, gpus: list, protect) -> dict:
    """{index: every process that holds the GPU's device node (/dev/nvidia<minor>)}, from one full device-file scan
    (``io.device_holders()``): the protected daemons (``protect``, the option's patterns) count too, marked so."""
    scan = io.device_holders()
    out = {}
    for gpu in gpus:
        found = out.setdefault(gpu["index"], [])
        for pid, files in sorted(scan.items()):
            if not any(_holding.node_of(f)[1] == gpu.get("minor_number") for f in files):
                continue
            info = io.read(pid) or {"pid": pid, "name": None}
            names = _snapshot._names(info) & set(_snapshot.PROTECTED_NAMES)
            found.append({"pid": pid, "name": sorted(names)[0] if names else info.get("name"),
                          "protected": bool(_snapshot.is_protected(info, extra=protect, exe_of=io.exe))})
    return out


class Resets:
    """reset_leaked: a GPU whose memory leaked with nothing holding it is reset (nvidia-smi -r), and said so; what was
    decided is the state's ``resets`` (carried from slice to slice), reported by ``into``."""

    def __init__(self, p: dict, io, state: dict, check_mode: bool, diff: bool):
        self.p, self.io, self.state, self.check_mode, self.diff = p, io, state, check_mode, diff

    def leaked(self, gpus: list, now: float) -> bool:
        """Reset (or, in check mode, say it would) each selected GPU whose memory leaked; True when one was reset."""
        p, io, state = self.p, self.io, self.state
        resets = state.setdefault("resets", {})
        todo = leaked_to_reset(gpus, trends(state, now, p["leak_after"], p["max_memory_used_mib"]), resets)
        if not todo:
            return False
        smi = io.smi_path()
        holders = node_holders(io, [g for g, _t in todo], _validate.regexes("protect", p.get("protect")))
        done = False
        for gpu, trend in todo:
            g = dict(gpu)
            if smi:
                g["display_active"], g["display_mode"] = self._display(smi, g["index"])
            decision = reset_decision(g, holders.get(g["index"]) or [], smi)
            entry = {"index": g["index"], "used_mib": trend["used"], "reason": decision["reason"], "rc": None, "output": None}
            if decision["action"] == "refuse":
                entry["action"] = "refused"
            elif self.check_mode:
                entry["action"] = "would"
            else:
                done = self._reset(smi, g["index"], entry) or done
            resets[str(g["index"])] = entry
        if done:
            # The reset freed the memory: the wait watches a settle window again from now, with a full scan.
            state["last_holder_at"] = now
            state["idle_scan_at"] = None
        return done

    def _reset(self, smi: str, index: int, entry: dict) -> bool:
        """nvidia-smi -r -i <index>, under query_timeout, no shell; fills ``entry``. True when it succeeded."""
        try:
            rc, out, err, _said = _smi.without_warnings(self.io.run([smi, "-r", "-i", str(index)], "nvidia-smi -r"))
        except _errors.GpuError as exc:
            rc, out, err = None, "", str(getattr(exc, "msg", exc))
        text = " ".join((out + " " + err).split())[:1000]
        entry.update(rc=rc, output=text, action="done" if rc == 0 else "refused")
        if rc != 0:
            entry["reason"] = f"nvidia-smi -r -i {index} failed (exit {rc}): {short(text)}"
        return rc == 0

    def _display(self, smi: str, index: int):
        """display_active / display_mode of one GPU by nvidia-smi, or None each where it cannot tell."""
        try:
            rc, out, _err, _said = _smi.without_warnings(self.io.run(
                [smi, "--query-gpu=display_active,display_mode", "--format=csv,noheader", "-i", str(index)],
                "nvidia-smi --query-gpu"))
        except _errors.GpuError:
            return None, None
        return display_flags(rc, out)

    def into(self, result: dict) -> None:
        resets = self.state.get("resets") or {}
        result["resets"] = [resets[k] for k in sorted(resets, key=int)]
        if any(r["action"] in ("done", "would") for r in result["resets"]):
            result["changed"] = True
            if self.diff:
                result["diff"] = reset_diff(resets)


# How the looks ended - the value the verdict takes: ``why`` idle (idle and settled; ``answer()``: nvidia-smi's answer,
# asked beside the settle window, or None), blocked (``found``: the holders the release left), timeout or pending (the
# progress slice is over); ``gpus``: the last look (None: the verdict looks once more); ``elapsed``.
End = collections.namedtuple("End", "why gpus elapsed answer found", defaults=(None, ()))


class Polls:
    """The wait's first step: its looks - the poll loop (step()), reset_leaked between them, nvidia-smi asked beside
    the settle window - until they end (``run()`` returns an End); what they saw goes into ``seen`` (polls, samples,
    the GPUs, where the settle window counted from)."""

    def __init__(self, wait, seen: dict):
        self.w, self.seen = wait, seen

    def run(self) -> End:
        w, seen = self.w, self.seen
        p, io, state = w.p, w.io, w.state
        slice_end = io.now() + p["progress_slice"] if p["progress_slice"] else None
        confirmed = {}
        while True:
            try:
                done, gpus = step(state, w.elapsed(), w.looks, io.alive, p["settle"], FULL_SCAN_EVERY)
            except _errors.QueryTimeout as exc:
                if seen.get("gpus") is None or not exc.details.get("timeout", 0) < (p.get("query_timeout") or 0):
                    raise
                # A call cut short at the wait's deadline (its own limit, query_timeout, not reached): not a hung
                # driver, the time is up - the answer is the timeout's, from the last look.
                return End("timeout", seen["gpus"], w.elapsed())
            if state["credited"] and state["polls"] == 1 and not {g["index"] for g in gpus} <= set(
                    p["quiet_since"].get("gpus") or ()):
                # The release did not watch every GPU this wait selects: its quiet time says nothing of the others.
                state.update(credited=False, last_holder_at=w.elapsed())
                done = False
            if p["reset_leaked"]:
                if not done:
                    w.resets.leaked(gpus, w.elapsed())
                w.resets.into(seen)
            scan_at = state.get("idle_scan_at")
            if done and state.get("idle_at_first_look") and state["polls"] == 1:
                # Idle in one look: nvidia-smi is asked now. Where it still sees something, the node is not idle
                # after all: the settle window opens from this look and nvidia-smi is asked again as it closes.
                early = confirm(p, io, gpus, w.elapsed)
                if early[1]:
                    state.update(idle_at_first_look=False, last_holder_at=state["last_poll_at"])
                    done = False
                confirmed = {"at": scan_at, "answer": lambda answer=early: answer}
            if scan_at is not None and not done and confirmed.get("at") != scan_at:
                # The GPUs look idle and the settle window opens: nvidia-smi is asked now, beside the polls of
                # the window, so that the wait returns as the window closes; a holder within the window starts
                # the window (and this) again.
                confirmed = {"at": scan_at, "answer": io.background(confirm, p, io, gpus, w.elapsed).result}
            if not w.carried and "gpus_before" not in seen:
                seen["gpus_before"] = gpus  # what the wait started from (later slices: the action plugin keeps it)
            seen.update(polls=state["polls"], samples=state["samples"], gpus=gpus,
                        idle_gpus=[g["index"] for g in gpus if g["idle"]], settle_from=settle_origin(state))
            elapsed = w.elapsed()
            if done:
                return End("idle", gpus, elapsed, answer=confirmed.get("answer") if confirmed.get("at") == scan_at else None)
            end = self._ends_here(gpus, elapsed, slice_end)
            if end is not None:
                return end
            io.sleep(next_sleep(state, elapsed, gpus, p["sleep"], p["settle"], p["timeout"]))

    def _ends_here(self, gpus: list, elapsed: float, slice_end):
        """How a poll that is not done ends the looks, else None: blocked (a holder the release left, past
        blocker_grace), timed out, or the end of a progress slice."""
        p, state, left = self.w.p, self.w.state, self.w.left
        found = left_blockers(gpus, left) if left else []
        if found:
            since = state.setdefault("left_since", elapsed)
            if elapsed - since >= p["blocker_grace"] and elapsed < p["timeout"]:
                return End("blocked", gpus, elapsed, found=found)
        else:
            state.pop("left_since", None)
        if elapsed >= p["timeout"]:
            return End("timeout", None, elapsed)
        if slice_end is not None and self.w.io.now() >= slice_end:
            return End("pending", gpus, elapsed)
        return None


class Verdict:
    """The wait's second step: the answer (ok, result) to how the looks ended (``of(end)``) - ready once nvidia-smi
    confirms, blocked by a holder the hook never stops, timed out with the diagnosis, or the slice's pending."""

    def __init__(self, wait, seen: dict):
        self.w, self.seen = wait, seen

    def of(self, end: End):
        return {"idle": self._idle, "blocked": self._blocked, "timeout": self._timeout, "pending": self._pending}[end.why](end)

    def _idle(self, end: End):
        """The GPUs are idle and settled: nvidia-smi has the last word (its early answer, when it agreed)."""
        w, seen, gpus = self.w, self.seen, end.gpus
        early = end.answer() if end.answer is not None else None
        found, disagreement = early if early is not None and not early[1] else confirm(w.p, w.io, gpus, w.elapsed)
        seen.update(confirmation=found, elapsed=round(w.elapsed(), 3))
        if disagreement:
            failure = _errors.ConfirmationDisagrees(f"NVML says the GPUs are idle but nvidia-smi disagrees: {disagreement}")
            return False, dict(failure.result(), blockers=blockers(gpus), **seen)
        return True, dict(seen, msg=f"{len(gpus)} GPU(s) idle after {seen['elapsed']:.2f} s", ready=True)

    def _blocked(self, end: End):
        p, seen = self.w.p, self.seen
        seen.update(elapsed=round(end.elapsed, 3), confirmation=None, blockers=blockers(seen["gpus"]),
                    left_blockers=[{"gpu": i, "pid": h["pid"], "reason": why} for i, h, why in end.found])
        text = ((p["msg"] + ": ") if p["msg"] else "") + blocked_text(end.found, end.elapsed, p["timeout"],
                                                                      p["blocker_grace"], p.get("detail"))
        return False, dict(_errors.Blocked(text).result(), **seen)

    def _timeout(self, end: End):
        """The timeout's answer, from one more look (the diagnosis names device-file holders too; one query's time at
        most), or from the last look's GPUs when it was cut short at the deadline."""
        w, seen, elapsed, gpus = self.w, self.seen, end.elapsed, end.gpus
        p, state = w.p, w.state
        if gpus is None:
            w.deadline(p.get("query_timeout") or 0.0)
            gpus = w.looks(True)
        for g in gpus:
            record_sample(state, elapsed, g, len(memory_holders(g)))
        memory = trends(state, elapsed, p["leak_after"], p["max_memory_used_mib"])
        seen.update(gpus=gpus, idle_gpus=[g["index"] for g in gpus if g["idle"]], samples=state["samples"],
                    elapsed=round(elapsed, 3), confirmation=None, blockers=blockers(gpus), memory=memory)
        refusals = reset_summary(state.get("resets"))
        text = ((p["msg"] + ": ") if p["msg"] else "") + f"timed out after {p['timeout']:g} s: " + (
            diagnosis(gpus, p["max_memory_used_mib"], memory, p["leak_after"], p.get("detail"))
            or f"a holder appeared within the last {p['settle']:g} s (settle)") + (f"; {refusals}" if refusals else "")
        return False, dict(_errors.WaitTimeout(text).result(), **seen)

    def _pending(self, end: End):
        """The end of a progress slice: pending, with the state to carry on."""
        w, state, elapsed = self.w, self.w.state, end.elapsed
        settling = None if state["last_holder_at"] is None else elapsed - state["last_holder_at"]
        return True, dict({k: v for k, v in self.seen.items() if k != "changed"}, pending=True,
                          progress_state={"wait": state}, elapsed=round(elapsed, 3),
                          progress=progress_line(end.gpus, elapsed, w.p["timeout"], settling, w.left),
                          changed=self.seen.get("changed", False))


class Wait:
    """One run of gpu_wait_idle - the whole wait, or one progress slice of it - in steps that hand values on: check
    mode's one look (``look_once``), else the looks (Polls: the poll loop, reset_leaked, nvidia-smi beside the settle
    window) that end in an End, which the verdict (Verdict) answers. This object holds what the steps are given (the
    options, the host, the looks at the GPUs, the state machine's state, the clock); they write nothing to it.

    ``io`` is a ``_host.protocols.WaitHost`` (``_host.wait_io.WaitIO``; unit tests pass a fake host: no driver there).
    ``run()`` returns (ok, result): the keyword arguments of exit_json when ok, else of fail_json, whose ``error``
    names the kind of every failure (_errors)."""

    def __init__(self, params: dict, io, selection, check_mode: bool = False, diff: bool = False):
        self.p = params
        self.io = io
        self.looks = Looks(params, io, selection)
        self.check_mode = check_mode
        carried = params.get("progress_state")
        self.carried = bool(carried)
        self.state = carried["wait"] if carried else new_state()
        self.offset = float(carried.get("offset", 0.0)) if carried else 0.0
        self.t0 = None
        self.resets = Resets(params, io, self.state, check_mode, diff)
        # The processes the release before this wait left ({(pid, start_time): reason}): the hook never stops them.
        self.left = {(h["pid"], h.get("start_time")): h.get("reason") or "left by the release"
                     for h in params.get("left_holders") or ()}

    def elapsed(self) -> float:
        """Seconds since the wait began (the slices before this one included)."""
        return self.offset + self.io.now() - self.t0

    def deadline(self, extra: float) -> None:
        """Every call of the host (NVML, nvidia-smi) ends by the wait's timeout (``extra`` s past it: the diagnosis's
        look once the time is up): each call's limit is min(query_timeout, the time left)."""
        self.io.set_deadline(self.t0 - self.offset + self.p["timeout"] + extra)

    def run(self):
        p, io = self.p, self.io
        if not self.carried and p["delay"] and not self.check_mode:
            io.sleep(p["delay"])  # before the first look; not counted in timeout, as in wait_for
        self.t0 = io.now()
        seen = {"changed": False}
        try:
            if self.check_mode:
                return True, self.look_once(seen)
            self.deadline(0.0)
            if not self.carried:
                self._credit()
            return Verdict(self, seen).of(Polls(self, seen).run())
        except _errors.GpuError as exc:
            if isinstance(exc, _errors.QueryTimeout) and not self.check_mode and self.elapsed() >= p["timeout"]:
                exc.msg = f"timed out after {p['timeout']:g} s: {exc.msg}"  # a call cut at the wait's deadline
            out = exc.result()
            out.update({k: v for k, v in seen.items() if k != "changed"})
            return False, out

    def _credit(self) -> None:
        """Count the settle window from the moment the release that ran just before last saw a holder
        (``quiet_since``, gpu_release's result), not from the first poll - not when there is none, it comes
        from another boot (another clock) or from the future, or it did not watch every GPU this wait selects
        (known after the first poll: Polls checks it)."""
        quiet = self.p.get("quiet_since") or None
        if not quiet or quiet.get("boot_id") != self.io.boot_id():
            return
        since = float(quiet["clock"])
        if since > self.t0:
            return
        self.state.update(credited=True, last_holder_at=since - self.t0,
                          device_seen={str(pid): start for pid, start in quiet.get("device_holders") or ()})

    def look_once(self, seen: dict) -> dict:
        """Check mode's answer: one look (with reset_leaked, as many as it takes to tell a leak, and what it would
        reset), what it would wait for."""
        p, io, state = self.p, self.io, self.state
        gpus = self.looks(True)
        _check_lost(gpus)
        before, polls, samples = gpus, 1, {}
        if p["reset_leaked"]:
            limit = min(p["leak_after"] + max(p["sleep"], 0.1), p["timeout"])
            while True:
                t = self.elapsed()
                for g in gpus:
                    record_sample(state, t, g, len(memory_holders(g)))
                if t >= limit or not self._undecided(gpus, t):
                    break
                io.sleep(min(p["sleep"], max(0.0, limit - t)))
                gpus = self.looks(False)
                _check_lost(gpus)
                polls += 1
            self.resets.leaked(gpus, self.elapsed())
            samples = state["samples"]
            self.resets.into(seen)
        looked = dict(seen, would_wait=not all(g["idle"] for g in gpus), elapsed=round(self.elapsed(), 3),
                      polls=polls, idle_gpus=[g["index"] for g in gpus if g["idle"]], gpus=gpus, samples=samples,
                      confirmation=None,
                      msg=diagnosis(gpus, p["max_memory_used_mib"], level=p.get("detail")) or "all selected GPUs are idle")
        if before is not gpus:  # one look: it is gpus, said once
            looked["gpus_before"] = before
        return looked

    def _undecided(self, gpus: list, t: float) -> bool:
        """Whether a GPU that reset_leaked may reset holds memory with no process, not yet told a leak."""
        memory = trends(self.state, t, self.p["leak_after"], self.p["max_memory_used_mib"])
        return any((memory.get(str(g["index"])) or {}).get("kind") in ("draining", "unchanged") and not holders_of(g)
                   for g in gpus)
