# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The release of gpu_release and the fence, in steps that hand values on: the plan (``Plan``: the scope gate
applied, the targets, the units), what was stopped (``Stop``: units, signals, escalation), the watch for respawns and
newcomers (``Watch``), then the outcome (``release``); ``run_release`` runs them.

Everything here decides through one gate (_scope.Scope); the I/O (snapshots, /proc, signals, commands, the clock) is
a ``_host.protocols.ReleaseHost`` (``_host.release_io.ReleaseIO``; the unit tests' fake). No AnsibleModule.
"""

from __future__ import annotations

import os
import re
import signal
import time

from ansible_collections.gpuops.gpu.plugins.module_utils import _bound, _errors, _holding, _redact, _scope, _snapshot, _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._validate import signal_name

SIGKILL = int(signal.SIGKILL)
SIGCONT = int(signal.SIGCONT)
# Proxmox VE >= 6.2 puts a container's payload under /lxc/<vmid>/ns/...; plain LXC 4+ uses lxc.payload.<name>.
_PAYLOAD_CGROUP = re.compile(r"^(.*?/lxc/\d+/ns|.*?/lxc\.payload\.\d+)(?:/|$)")
# How long a unit that was not stopped is watched after the release for a supervisor's restart
# (systemd restarts after RestartSec=100ms by default; supervisord and shell loops at once).
RESPAWN_WATCH_S = 2.0
# Every release looks this long for new holders after its last target is gone: a supervisor
# outside systemd (busybox init, a shell loop, supervisord) restarts within it.
NEWCOMER_WATCH_S = 0.5
RESPAWN_POLL_S = 0.1
UNIT_CALL_S = 10.0  # a unit stop's allowance for pct itself (its start, the attach) where no pct_timeout is set
REPORT_KEYS = ("pid", "name", "cmdline", "user", "container", "unit", "gpus", "via", "evidence", "why")


def place_of(proc: dict) -> str:
    ct = (proc.get("container") or {}).get("id")
    return f"CT {ct}" if ct is not None else "the host"


def places(targets: list) -> dict:
    """{place: [pids]}: where the targets live ('CT 129', 'the host')."""
    out = {}
    for t in targets:
        out.setdefault(place_of(t), []).append(t["pid"])
    return {k: sorted(v) for k, v in sorted(out.items())}


def scope_problem(targets: list, filtered: bool, everything: bool) -> str:
    """Why an unscoped release must not proceed ('' when it may).

    With no filter (containers, users, match, pids) a release proceeds only when every target
    lives in one place (one container, or the host), or when ``everything`` (the option ``all``).
    """
    where = places(targets)
    if filtered or everything or len(where) <= 1:
        return ""
    listed = "; ".join(f"{place}: pid {', '.join(map(str, pids))}" for place, pids in where.items())
    return (f"no filter was given and the holders of the selected GPUs live in {len(where)} places ({listed})."
            " Nothing was signalled. Name the scope with containers (e.g. containers: [129]), users, match or"
            " pids, or set all: true to stop every one of them.")


_UNIT_SUFFIXES = (".service", ".socket", ".target", ".timer", ".scope", ".slice", ".mount", ".automount", ".path",
                  ".swap", ".device")


def unit_name(name: str) -> str:
    """A unit as systemd names it: ``sglang`` is ``sglang.service`` (systemctl adds .service to a name with no unit
    suffix)."""
    return name if name.endswith(_UNIT_SUFFIXES) else name + ".service"


def unit_plan(targets: list, protected: list, keep_units=()) -> list:
    """The systemd service units to stop before signalling: [{unit, container, pids}], in order.

    A unit is stopped when a target runs in it (a ``.service``); never a unit a protected process
    runs in (an NVIDIA daemon), nor one in ``keep_units`` ((container id or None, unit): the
    module's own and its ancestors').
    """
    guarded = {((p.get("container") or {}).get("id"), p.get("unit")) for p in protected if p.get("unit")}
    guarded |= set(keep_units)
    plan = {}
    for t in targets:
        unit = t.get("unit")
        if not unit or not unit.endswith(".service"):
            continue
        key = ((t.get("container") or {}).get("id"), unit)
        if key in guarded:
            continue
        plan.setdefault(key, []).append(t["pid"])
    return [{"unit": unit, "container": ct, "pids": sorted(pids)}
            for (ct, unit), pids in sorted(plan.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1]))]


def unit_command(entry: dict, systemctl: str, pct=None) -> list:
    """The argv that stops one unit: in a container through ``pct exec`` (none without ``pct``)."""
    if entry["container"] is not None:
        if not pct:
            return []
        return [pct, "exec", str(int(entry["container"])), "--", "systemctl", "stop", entry["unit"]]
    return [systemctl, "stop", entry["unit"]]


def unit_text(entry: dict) -> str:
    return entry["unit"] + (f" in CT {entry['container']}" if entry["container"] is not None else "")


def stop_unit(run_command, pct, vmid, unit, timeout, systemctl="systemctl", now=time.monotonic, watch=None) -> dict:
    """Stop one systemd unit, in CT ``vmid`` through ``pct exec <vmid> -- systemctl stop <unit>`` (on the host
    when ``vmid`` is None), for at most ``timeout`` s. The one way every module stops a unit. Raises nothing.

    ``run_command(argv, timeout, what) -> (rc, stdout, stderr)`` raises _errors.QueryTimeout when the time is
    up (_host.calls.run_in_group); ``watch(argv)``, when given, makes the watch the command runs under (the container
    frozen, the node's pct hung, the container's systemd hung: _host.calls.ExecWatch), whose sentence ends it at once.
    Returns {unit, container, command, rc, seconds, error}: ``error`` is '' when the unit stopped (rc 0), else one
    sentence: what did not answer in time (rc None), systemctl failed (its rc and output), or there is no pct here.
    """
    entry = {"unit": unit, "container": vmid}
    argv = unit_command(entry, systemctl or "systemctl", pct)
    out = dict(entry, command=argv, rc=None, seconds=0.0, error="")
    where = unit_text(entry)
    if not argv:
        out["error"] = f"cannot stop {where}: no pct here (the pct option; run the task on the Proxmox VE node)"
        return out
    started = now()
    try:
        rc, stdout, stderr = run_command(argv, timeout, " ".join(argv[:3]), **({"watch": watch(argv)} if watch else {}))
    except _errors.QueryTimeout as exc:
        out["seconds"] = round(now() - started, 3)
        if exc.details.get("watched"):
            out["error"] = f"stopping {where}: {exc.msg}."
            return out
        who = f"CT {vmid}" if vmid is not None else "systemd on the host"
        out["error"] = (f"stopping {where} did not finish within {timeout:g} s: {who} did not answer ("
                        + " ".join([os.path.basename(argv[0])] + argv[1:]) + " was killed), so the unit was not"
                        " stopped. " + ("Is the container frozen (a suspend-mode backup, lxc-freeze: lxc-unfreeze -n"
                                        f" {vmid}) or its systemd hung (pct enter, systemctl status)?" if vmid is not None
                                        else "Is systemd hung (systemctl status)?"))
        return out
    except (OSError, _errors.GpuError) as exc:
        out["seconds"] = round(now() - started, 3)
        out["error"] = f"stopping {where} failed: {getattr(exc, 'msg', None) or exc}"
        return out
    out.update(rc=rc, seconds=round(now() - started, 3))
    if rc != 0:
        out["error"] = f"stopping {where} failed (rc {rc}): {(stderr or stdout or '').strip()[:300]}"
    return out


def respawn_advice(proc: dict, after_s, supervisor=None, stop_units=True, in_scope=True, unit_stopped=True) -> str:
    """'pid 812 started 1.1 s after the release in sglang.service in CT 129: ...what to do'.

    ``in_scope``: whether it would be in the release's scope (a respawn of what was released, or a
    new job in the same place); one that is not is another tenant's newcomer, reported only.
    ``unit_stopped``: whether its unit was stopped by this release (with ``stop_units``, one may not be: no pct,
    or the stop failed - said in a warning).
    """
    where = ""
    if proc.get("unit"):
        where = f" in {proc['unit']}"
    ct = (proc.get("container") or {}).get("id")
    if ct is not None:
        where += f" in CT {ct}"
    when = f" started {after_s:.1f} s after the release" if after_s is not None else " appeared after the release"
    who = f" by {supervisor}" if supervisor else ""
    if not in_scope:
        todo = "outside the scope of this release (another job that started meanwhile): not signalled"
    elif proc.get("unit"):
        if not stop_units:
            todo = "its supervisor restarted it; stop the unit (stop_units: true)"
        elif unit_stopped:
            todo = "its supervisor restarted it although the unit was stopped; check what starts it"
        else:
            todo = ("its supervisor restarted it: the unit could not be stopped (see the warnings); stop it, then"
                    " release again")
        # a container's unit can be named to the fence; the node's own is stopped on the node
        todo += " or name it in proxmox_fence_services" if ct is not None else f" (on the node: systemctl stop {proc['unit']})"
    elif supervisor:
        todo = ("started by a process outside the release's targets (a supervisor outside a systemd unit, or a new"
                " job): not signalled; stop what starts it first, then release again")
    else:
        todo = "a new holder that descends from no target: not signalled; stop what starts it, then release again"
    return f"pid {proc['pid']}{when}{where}{who}: {todo}"


def report(proc: dict, **extra) -> dict:
    out = {k: proc.get(k) for k in REPORT_KEYS}
    out.update(extra)
    return out


def gpu_line(gpu: dict, without=(), limit=None, memory=True) -> str:
    """One GPU in a diff: its memory in use (``memory``), then its blockers less the pids in ``without`` (at most
    ``limit`` named, the rest counted; None: all), else ``idle``, ``released`` (it had blockers, all in ``without``)
    or why it is busy."""
    used = (gpu.get("memory") or {}).get("used")
    head = f"GPU {gpu['index']}: " + (f"{used} MiB used, " if memory and used is not None else "")
    blockers = _holding.holders_of(gpu)
    held = [p for p in blockers if p["pid"] not in without]
    if held:
        level = _bound.FULL if limit is None else _bound.SUMMARY
        return head + _bound.listed([_holding.describe(p) for p in held], level, limit=limit or _bound.CAP)
    if blockers:
        return head + "released"
    if gpu.get("idle") is not False:
        return head + "idle"
    reasons = [str(r) for r in gpu.get("busy_reasons") or ()]
    return head + "busy: " + _redact.cut("; ".join(reasons) or "?", _bound.TEXT)


def release_diff(units: list, before: list, after, targets=(), limit=None) -> dict:
    """A release's diff for Ansible's diff display: its units (``units``: the plan's, each with ``state_after``),
    then one line per GPU (gpu_line) before and after; ``after`` None in check mode - the GPUs as they would be:
    ``before`` less the ``targets``' pids. ``limit``: the units listed and the holders named per GPU (the rest
    counted), None for all (detail: full)."""
    shown = units if limit is None else units[:limit]
    left = len(units) - len(shown)
    more = f"+{left} more unit(s)\n" if left else ""
    lines_before = "".join(f"unit {unit_text(e)}: active\n" for e in shown) + more
    lines_after = "".join(f"unit {unit_text(e)}: {e['state_after']}\n" for e in shown) + more
    if after is None:
        gone = {t["pid"] for t in targets}
        after_gpus = "".join(gpu_line(g, gone, limit, memory=False) + "\n" for g in before)
    else:
        after_gpus = "".join(gpu_line(g, (), limit) + "\n" for g in after)
    return {"before_header": "units and GPUs before the release", "after_header": "after",
            "before": lines_before + "".join(gpu_line(g, (), limit) + "\n" for g in before),
            "after": lines_after + after_gpus}


def unreadable_lists(before: list, named: bool) -> tuple:
    """([GPU indexes whose process list could not be read], the sentence to say about them)."""
    bad = [g for g in before if g.get("processes_error")]
    if not bad:
        return [], ""
    if named:
        return [g["index"] for g in bad], ("the driver's process list could not be read for GPU(s) "
                                           + ", ".join(str(g["index"]) for g in bad)
                                           + ": only the processes named in pids are considered")
    # An empty list read from a failed query is not "nothing to release": the holder may be hidden.
    return [g["index"] for g in bad], (
        "the driver's process list could not be read for "
        + "; ".join(f"GPU {g['index']} ({g.get('pci_bus_id')}): {g['processes_error']}" for g in bad)
        + ". Nothing was signalled. Retry (a transient driver error), raise query_timeout, or name the"
          " processes to stop with pids.")


def unselected_errors(all_gpus: list, before: list) -> tuple:
    """([{index, pci_bus_id, error}] of the GPUs that are not selected and whose process list could not be read,
    the warning to give about them ('' when none)): an error on a GPU this release does not touch is reported,
    never fatal."""
    selected = {g["index"] for g in before}
    bad = [dict(index=g["index"], pci_bus_id=g.get("pci_bus_id"), error=g["processes_error"])
           for g in all_gpus if g["index"] not in selected and g.get("processes_error")]
    if not bad:
        return [], ""
    return bad, ("; ".join(f"GPU {e['index']} ({e['pci_bus_id']}): {e['error']}" for e in bad)
                 + ": not selected, so not released (what holds it is not known); the selected GPU(s) "
                 + ", ".join(str(g["index"]) for g in before) + " were released all the same")


# --- what the gate is given --------------------------------------------------------------------------
def untrusted_lists(gpus: list, max_memory_used_mib: int) -> dict:
    """{GPU index: why its process list cannot be trusted to be complete} (_holding.list_incomplete)."""
    out = {}
    for gpu in gpus:
        why = _holding.list_incomplete(gpu, max_memory_used_mib)
        if why:
            out[gpu["index"]] = why
    return out


def unverified(gpus: list, host_namespace) -> dict:
    """{pid: reason} for the driver pids a release must not signal: _holding.unverified_pids, with what to do."""
    return {pid: why + _holding.NOT_SIGNALLED_UNVERIFIED for pid, why in _holding.unverified_pids(gpus, host_namespace).items()}


def gpu_holder_ids(all_gpus: list, untrusted: dict) -> set:
    """Identities of the processes that hold a GPU: a context on any GPU, or a device node of a GPU
    whose list cannot be trusted (what makes an ancestor 'also run other GPU jobs')."""
    out = set()
    for gpu in all_gpus:
        for p in gpu.get("processes") or []:
            if p.get("visible") is not False:
                out.add((p["pid"], p.get("start_time")))
        if gpu["index"] in untrusted:
            for h in gpu.get("holders") or []:
                if h.get("evidence") == _scope.DEVICE and not h.get("protected"):
                    out.add((h["pid"], h.get("start_time")))
    return out


def descendants(pid: int, children: dict) -> set:
    out, queue = set(), [pid]
    while queue:
        for c in children.get(queue.pop(), ()):
            if c not in out:
                out.add(c)
                queue.append(c)
    return out


def choose(scope, candidates: list, contexts: dict, holder_ids: set, tree: bool, read=None, children=None) -> None:
    """Run every candidate, workload root and descendant through the gate (it records the verdicts).

    Holders first; then, in tree mode, the ancestors of each target up to its workload's root
    (_holding.workload_ancestors), each only when every GPU holder below it is a target; then the
    descendants of the targets.
    """
    roots = {}
    # An MPS server last: whether it may be signalled depends on whether its clients are targets.
    for cand in sorted(candidates, key=lambda c: bool(c.get("mps_server"))):
        proc = dict(cand, context_gpus=sorted(contexts.get(cand["pid"], ())))
        chain = []
        if read:  # (match sees the workload root's texts even when only the holders are signalled)
            start = read(cand["pid"])
            if start is not None and start.get("start_time") == cand.get("start_time"):
                chain = _holding.workload_ancestors(start, read, scope.protection)
        roots[_scope.identity(proc)] = chain
        scope.admit(proc, _scope.HOLDER, root=chain[-1][0] if chain else None)
    if not (tree and read):
        return
    children = children or {}
    below_of = {}  # ancestor pid -> the GPU holders below it (thousands of holders share one root: once each)
    for holder in list(scope.targets):
        for anc, why in roots.get(_scope.identity(holder), ()):
            if anc["pid"] not in below_of:
                below = descendants(anc["pid"], children)
                below_of[anc["pid"]] = {h for h in holder_ids if h[0] in below}
            holders_below = below_of[anc["pid"]]
            anc = dict(anc, context_gpus=sorted(contexts.get(anc["pid"], ())))
            if not scope.admit(anc, _scope.ROOT, via=holder, holders_below=holders_below, why=why):
                break
    queue = list(scope.targets)
    while queue:
        parent = queue.pop()
        for cpid in children.get(parent["pid"], ()):
            child = read(cpid)
            if child is None or scope.is_target(child):
                continue
            child = dict(child, context_gpus=sorted(contexts.get(cpid, ())))
            if scope.admit(child, _scope.DESCENDANT, via=parent):
                queue.append(scope.entry(child))


def unit_problem(entry: dict, holders: list, scope) -> str:
    """Why a unit must not be stopped ('' when it may): it runs a GPU job that is not a target."""
    others = [h for h in holders if (_scope.container_id(h), h.get("unit")) == (entry["container"], entry["unit"])
              and not scope.is_target(h)]
    if not others:
        return ""
    return (f"{unit_text(entry)} also runs GPU job(s) outside the scope (pid "
            + ", ".join(str(h["pid"]) for h in others) + "): the unit is left running and only the targets are"
            " signalled, so its supervisor may restart them")


def payload_cgroup(path: str):
    """The root of the container payload cgroup that ``path`` lies in (``/lxc/129/ns``, ``/lxc.payload.129``), or
    None."""
    match = _PAYLOAD_CGROUP.match(path or "")
    return match.group(1) if match else None


def container_init(proc: dict, read, procs_of=None):
    """(pid, start_time) of the init (PID 1) of the container ``proc`` runs in, or None when it cannot be told: up its
    ancestors (a unit's process is systemd's child), else among the processes of the container's payload cgroup
    (``procs_of(cgroup) -> [pids]``: a process started by pct exec descends from no process of the container)."""
    ct = _scope.container_id(proc)
    if ct is None:
        return None
    x, seen = proc, set()
    while x is not None and x["pid"] not in seen and _scope.container_id(x) == ct:
        if (x.get("container") or {}).get("pid_in_container") == 1:
            return x["pid"], x.get("start_time")
        seen.add(x["pid"])
        x = read(x["ppid"]) if x.get("ppid") else None
    root = payload_cgroup(proc.get("cgroup") or "")
    for pid in (procs_of(root) if procs_of and root else ()):
        x = read(pid)
        if x is not None and _scope.container_id(x) == ct and (x.get("container") or {}).get("pid_in_container") == 1:
            return x["pid"], x.get("start_time")
    return None


def container_changes(inits: dict, read, init_of) -> list:
    """[{container, init, now, what}] for each container whose init (``inits`` {vmid: ((pid, start_time), proc)})
    is no longer the same process: ``what`` restarted (another init runs: ``init_of(proc)``) or stopped."""
    out = []
    for ct, ((pid, start), proc) in sorted(inits.items()):
        now = read(pid)
        if now is not None and now.get("start_time") == start:
            continue
        new = init_of(proc)
        if new == (pid, start):
            continue
        out.append(dict(container=ct, init={"pid": pid, "start_time": start},
                        now={"pid": new[0], "start_time": new[1]} if new else None,
                        what="restarted" if new else "stopped"))
    return out


def changed_text(change: dict) -> str:
    ct, init = change["container"], change["init"]["pid"]
    if change["what"] == "restarted":
        return (f"CT {ct} was restarted while the release ran (its init, pid {init}, is gone; pid {change['now']['pid']}"
                " is its init now): what starts at its boot may hold the GPUs again. See why it restarted (an HA"
                " manager, a user, a crash), then run again")
    return (f"CT {ct} was stopped while the release ran (its init, pid {init}, is gone): its processes ended with it,"
            " not (only) by this release's signals")


# --- the steps: a plan, then what was stopped, then the outcome ---------------------------------------------------
class Plan:
    """The release's first step, before anything is signalled: the gate (``scope``), its targets, the units to stop
    (``units``), the containers' inits (``inits``) - the value the stop and the watch take. ``problem`` says why the
    release must not proceed ('' when it may; ``kind``, ReleaseFailed's); ``result`` what it reports (check mode's
    answer: ``check_mode_result``); ``warnings`` what it found to say."""

    def __init__(self, p: dict, filters: dict, io, all_gpus: list, before: list):
        self.p, self.filters, self.io, self.before = p, filters, io, before
        self.kind = "scope"
        self.units, self.inits, self.warnings = [], {}, []
        self.result = dict(changed=False, gpus_before=before)
        self.problem = self._decide(all_gpus, before)

    def _decide(self, all_gpus: list, before: list) -> str:
        me, chain = self.io.me()
        untrusted = self._gate(all_gpus, before, me, chain)
        self._choose_targets(all_gpus, {g["index"] for g in before}, untrusted)
        targets = self.scope.targets
        self.known = {(x["pid"], x.get("start_time")) for g in all_gpus for x in list(g["processes"]) + list(g["holders"])}
        self.known |= {_scope.identity(t) for t in targets}
        self.result.update(protected=[report(x, reason=x["reason"]) for x in self.scope.protected],
                           skipped_processes=[report(x, reason=x["reason"]) for x in self.scope.skipped])
        problem = self._refusal(targets)
        if problem:
            return problem
        self._note_inits(targets)
        if not targets:
            self._nothing_selected_warning(before)
        if self.p["stop_units"]:
            self._plan_units(all_gpus, targets, me, chain)
        self.result["changed"] = bool(targets or self.units)
        # Before anything is stopped (and in check mode too): a target this user may not signal (not root)
        # fails the release here, naming root and become (_errors.NotPermitted).
        self.io.check_may_signal(targets)
        return ""

    def _gate(self, all_gpus: list, before: list, me: int, chain) -> dict:
        """The scope gate of this release (self.scope); returns the GPUs whose process list cannot be trusted."""
        p, io = self.p, self.io
        protected_pids = {me: "the module's own process"}
        for pid in chain:
            protected_pids[pid] = "an ancestor of the module (the SSH session, Ansible)"
        untrusted = untrusted_lists(before, p.get("max_memory_used_mib", _snapshot.DEFAULT_MAX_MEMORY_USED_MIB))
        for index in p.get("draining_gpus") or ():
            # Its list was complete before this run stopped the services that held it (the fence): the memory
            # no listed process accounts for is theirs, still being freed, not a hidden holder's.
            untrusted.pop(index, None)
        self.scope = _scope.Scope({g["index"] for g in before}, self.filters, protected_pids,
                                  protect=_validate.regexes("protect", p["protect"]), text_of=io.text, exe_of=io.exe,
                                  untrusted=untrusted, unverified=unverified(before, io.host_namespace()),
                                  mps=_scope.mps_of(all_gpus))
        return untrusted

    def _choose_targets(self, all_gpus: list, selected: set, untrusted: dict) -> None:
        """The holders of the selected GPUs, their workloads and trees, through the gate; pids named that hold none
        of them are refused with the reason."""
        p, io = self.p, self.io
        found, invisible = _holding.release_candidates(all_gpus, selected, p["include_device_holders"], p["pids"])
        holding = {c["pid"] for c in found} | {s["pid"] for s in invisible}
        for pid in sorted(set(p["pids"] or []) - holding):
            invisible.append({"pid": pid, "gpus": [], "reason": "named in pids, but it holds none of the selected GPUs"
                                                                " (no context, no device node, no NVIDIA node at all)"})
        choose(self.scope, found, _holding.context_gpus(all_gpus), gpu_holder_ids(all_gpus, untrusted), p["tree"],
               io.read, io.children() if p["tree"] else None)
        for s in invisible:
            self.scope.refuse(dict(s, start_time=s.get("start_time")), s["reason"])

    def _refusal(self, targets: list) -> str:
        """Why the release must not go on with these targets ('' when it may): a scope that names no place and spans
        several, or a frozen holder (a suspend-mode backup, lxc-freeze: it runs no handler and its container answers
        no systemctl stop; its supervisor restarts the work after the thaw). Refused before anything is stopped, in
        check mode too."""
        problem = scope_problem(targets, self._filtered(), self.p["all"])
        if problem:
            self.result["places"] = places(targets)
            return problem
        frozen = frozen_targets(targets, self.io.frozen)
        if frozen:
            self.kind = "container_frozen"
            self.result["frozen"] = [{"container": ct, "pids": pids} for ct, pids in frozen.items()]
            return frozen_message(frozen)
        return ""

    def init_of(self, proc):
        return container_init(proc, self.io.read, self.io.cgroup_procs)

    def _note_inits(self, targets: list) -> None:
        """{vmid: ((pid, start_time) of its init, a target in it)}: to tell a container stopped or restarted meanwhile."""
        for t in targets:
            ct = _scope.container_id(t)
            if ct is not None and ct not in self.inits:
                init = self.init_of(t)
                if init is not None:
                    self.inits[ct] = (init, t)

    def _plan_units(self, all_gpus: list, targets: list, me: int, chain) -> None:
        """The units to stop: those that run only targets, but the module's own (and its ancestors')."""
        io = self.io
        keep = {(ct, unit_name(unit)) for ct, unit in self.p.get("units_stopped") or ()}  # the fence's (_fence)
        for pid in [me] + list(chain):
            x = io.read(pid)
            if x and x.get("unit"):
                keep.add((_scope.container_id(x), x["unit"]))
        holders = [dict(x, evidence=_scope.CONTEXT) for g in all_gpus for x in g.get("processes") or []
                   if x.get("visible") is not False]
        for entry in unit_plan(targets, self.scope.protected, keep):
            why = unit_problem(entry, holders, self.scope)
            if why:
                self.warnings.append(why)
                continue
            entry["command"] = unit_command(entry, io.bins("systemctl") or "systemctl", io.bins("pct"))
            self.units.append(entry)

    def _filtered(self) -> bool:
        """Whether a filter (containers, users, match, pids) narrows the release's scope."""
        f = self.filters
        return bool(f["containers"] or f["users"] or f["match"] or f["pids"])

    def _nothing_selected_warning(self, before: list) -> None:
        """Which holders the filters missed, and why each one (its gate verdict: what match saw, its place)."""
        held = {}
        for g in before:
            for x in g.get("processes") or []:
                if x.get("visible") is not False:
                    held.setdefault(x["pid"], (x, []))[1].append(g["index"])
        if held and self._filtered():
            why = {s["pid"]: s["reason"] for s in self.scope.skipped + self.scope.protected}
            shown = [f"{_holding.describe(x)} on GPU {', '.join(map(str, gpus))}"
                     + (f": {why[pid]}" if pid in why else "") for pid, (x, gpus) in sorted(held.items())]
            more = f"; and {len(shown) - 5} more (see skipped_processes)" if len(shown) > 5 else ""
            self.warnings.append("the scope selects none of the processes that hold the selected GPUs: "
                                 + "; ".join(shown[:5]) + more)

    def diff_limit(self):
        """The units and holders per GPU a diff names: _bound's cap in summary, all of them with detail: full."""
        return None if self.p.get("detail") == _bound.FULL else _bound.CAP

    def check_mode_result(self, diff: bool) -> dict:
        """Check mode's answer: what the release would do, from its one look (in ``gpus``)."""
        res = {k: v for k, v in self.result.items() if k != "gpus_before"}
        targets = self.scope.targets
        res.update(gpus=self.before, quiet_since=None, left_holders=left_holders(self.scope, self.before),
                   stopped_units=[dict(e, rc=None, seconds=None) for e in self.units], unstopped_units=[],
                   released=[report(t, signals=[], seconds=None) for t in targets], survivors=[], respawned=[])
        if diff:
            res["diff"] = release_diff([dict(e, state_after="stopped") for e in self.units], self.before, None,
                                       targets, self.diff_limit())
        return res


class Stop:
    """The release's second step, given the plan: its units stopped, its targets pinned and signalled, escalation;
    ``run()`` returns this step as what was stopped - ``released``, ``survivors``, ``skipped`` (not signalled after
    all), ``stopped_units``/``unstopped_units``, ``frozen``, ``quiet_from`` (io.now() when a holder was last seen),
    ``sent`` (whether anything was signalled or stopped), the ``problems`` and ``warnings`` found. The watch signals
    the children it finds through it (``signal``)."""

    def __init__(self, plan: Plan, io):
        self.plan, self.p, self.io, self.scope = plan, plan.p, io, plan.scope
        self.released, self.survivors, self.skipped, self.frozen = [], [], [], []
        self.stopped_units, self.unstopped_units, self.problems, self.warnings = [], [], [], []
        self.quiet_from = None
        self.t0 = io.now()
        self.t0_ticks = io.ticks_now()
        # The (session, process group) of each target: a child it forks keeps them, a supervisor's restart does not.
        self.groups = {}
        for t in self.scope.targets:
            now = io.read(t["pid"])
            if now is not None and now.get("start_time") == t.get("start_time"):
                self.groups[(now.get("session"), now.get("pgrp"))] = t

    def units_stopped(self) -> set:
        """{(container, unit)} that this release stopped."""
        return {(u["container"], u["unit"]) for u in self.stopped_units}

    def run(self, first_signal: int):
        pinned = self._pin(self.scope.targets)
        self._stop_units()
        frozen = frozen_targets([t.info for t in pinned], self.io.frozen)
        if frozen:
            # Frozen since the plan (a backup started): no signal - after the thaw its supervisor would restart it.
            for target in pinned:
                target.close()
            pinned = []
            self.frozen = [{"container": ct, "pids": pids} for ct, pids in frozen.items()]
            self.unstopped_units = [u for u in self.unstopped_units if u["container"] not in frozen]
            self.problems.append(frozen_message(frozen, "Nothing was signalled" + (
                " (the units in stopped_units were stopped before)" if self.stopped_units else "")))
        self.sent = self._signal(pinned, first_signal) or bool(self.stopped_units)
        return self

    def signal(self, procs: list, sig: int) -> None:
        """Pin and signal more processes (the watch's children of targets; ``sent`` says what the stop itself did)."""
        self._signal(self._pin(procs), sig)

    def _pin(self, procs: list) -> list:
        pinned = []
        for t in procs:
            target, ok = self.io.pin(t)
            now = self.io.read(t["pid"]) if ok else None
            why = self.scope.still_in(t, now) if ok else ""
            if ok and not why:
                pinned.append(target)
                continue
            target.close()
            if ok or target.recycled:
                self.skipped.append(report(
                    t, reason=(why or "the pid now belongs to another process (recycled)") + "; not signalled"))
            else:
                # It exited between the snapshot and now (its parent took it along): released, unsignalled.
                self.released.append(report(t, signals=[], seconds=0.0))
        return pinned

    def _signal(self, pinned: list, sig: int) -> bool:
        """Signal every pinned target at once (children and parents together), escalate, record."""
        p, io = self.p, self.io
        sent = False
        for target in pinned:
            sent |= target.send(sig)
            if sig not in (SIGKILL, SIGCONT) and io.state(target.pid) in ("T", "t"):
                # A stopped process acts on its signal only once continued (systemd sends SIGCONT too).
                target.send(SIGCONT)
        alive = io.wait_gone(pinned, p["grace_period"])
        why_slow = {}   # pid -> why it did not act on the first signal
        if sig != SIGKILL:
            for target in alive:
                why = self._why_alive(target, signal_name(sig))
                if why:
                    why_slow[target.pid] = why
        if alive and p["escalate"] and sig != SIGKILL:
            for target in alive:
                sent |= target.send(SIGKILL)
            alive = io.wait_gone(alive, p["kill_timeout"])
        alive = set(alive)  # (thousands of targets: each looked up once)
        for target in pinned:
            gone_at = target.gone_at
            if gone_at is not None and target not in alive:
                self.quiet_from = max(gone_at, self.quiet_from or gone_at)
            entry = report(target.info, signals=target.signals,
                           seconds=round(gone_at - self.t0, 3) if gone_at is not None else None)
            if target in alive:
                entry["state"] = io.state(target.pid)
                unread = getattr(target, "unread", "")  # EMFILE, EACCES, ...: never taken for gone (DESIGN 5a)
                why = (f"not told apart from another process: {unread}, so whether it still runs cannot be told" if unread
                       else self._why_alive(target, signal_name(sig), killed="SIGKILL" in target.signals))
                if why:
                    entry["why_alive"] = why
                self.survivors.append(entry)
            elif target.pid in why_slow and "SIGKILL" in target.signals:
                self.released.append(entry)
                self.warnings.append(
                    f"{_holding.describe(entry)} did not exit on {signal_name(sig)} within grace_period"
                    f" ({p['grace_period']:g} s) and was killed with SIGKILL: it is {why_slow[target.pid]}")
            else:
                self.released.append(entry)
            target.close()
        return sent

    def _why_alive(self, target, first: str, killed=False) -> str:
        """Why a target may not act on ``first`` ('' when nothing is known): a process in a frozen cgroup, or
        (before SIGKILL, which it cannot ignore) PID 1 of a nested PID namespace."""
        now = self.io.read(target.pid)
        if now is None or now.get("start_time") != target.info.get("start_time"):
            return ""  # the pid is gone or names another process
        if self.io.frozen(target.pid):
            return frozen_text(now)
        if not killed and nested_init(now):
            return nested_init_text(first)
        return ""

    def _stop_units(self) -> None:
        io = self.io
        # A unit's stop may take its holders' time (grace_period + kill_timeout), and pct one call's (pct_timeout).
        call_limit = self.p.get("pct_timeout") or UNIT_CALL_S
        budget = self.p["grace_period"] + self.p["kill_timeout"] + call_limit
        for entry in self.plan.units:
            done = stop_unit(io.run_command, io.bins("pct"), entry["container"], entry["unit"], budget,
                             systemctl=io.bins("systemctl") or "systemctl", now=io.now,
                             watch=io.exec_watch(entry["container"], call_limit))
            # Not stopped: not in stopped_units (what the summaries list as stopped); the release fails (outcome: its
            # supervisor can restart the work), its processes are signalled all the same.
            if done["error"]:
                self.unstopped_units.append(dict(unit=entry["unit"], container=entry["container"], error=done["error"]))
            else:
                self.stopped_units.append(dict(entry, rc=done["rc"], seconds=done["seconds"]))


class Watch:
    """The release's third step, given the plan and what was stopped: it watches for respawns and newcomers
    (``run()`` returns the selected GPUs as its last look saw them, None when it could not look). A child that
    appeared below a signalled target is released through the gate (``Stop.signal``); every other new holder of a
    selected GPU is reported (``respawned``), never signalled."""

    def __init__(self, plan: Plan, stopped: Stop, io):
        self.plan, self.stopped, self.p, self.io, self.scope = plan, stopped, plan.p, io, plan.scope
        self.known = set(plan.known)
        self.respawned = []

    def run(self, first_signal: int):
        """``look_once`` when nothing was signalled or stopped (an idle node, or every holder left by the gate): no
        newcomer can descend from a target and nothing of ours can respawn, so one look after is all it takes."""
        io, p, stopped = self.io, self.p, self.stopped
        supervised = {(_scope.container_id(t), t.get("unit")) for t in self.scope.targets
                      if (t.get("unit") or "").endswith(".service")} - stopped.units_stopped()
        watch_until = io.now() + (0.0 if not stopped.sent else RESPAWN_WATCH_S if supervised else NEWCOMER_WATCH_S)
        after = None
        selected = self.scope.selected
        device = device_holders(self.plan.before)
        while True:
            try:
                after_all = io.snapshot(p["include_device_holders"])
                after = [g for g in after_all if g["index"] in selected]
            except _errors.GpuError:
                return None
            now_device = device_holders(after)
            if now_device != device or any(g.get("processes") for g in after):
                stopped.quiet_from = io.now()  # a context, or a device-node holder came or went: quiet from here
            device = now_device
            self.scope.mps.update(_scope.mps_of(after_all))
            new, _invisible = _holding.release_candidates(after_all, selected, p["include_device_holders"], p["pids"])
            contexts = _holding.context_gpus(after_all)
            forked = [e for e in (self._newcomer(x, contexts) for x in new) if e is not None]
            if forked:
                # SIGKILL at once: they had their graceful signal through their parent, and a child that
                # forked in a SIGTERM handler would fork again on its own SIGTERM.
                stopped.signal(forked, SIGKILL if p["escalate"] else first_signal)
                continue
            if self.respawned or io.now() >= watch_until:
                return after
            io.sleep(RESPAWN_POLL_S)

    def _lineage(self, proc: dict):
        """(the signalled target it descends from or was orphaned by, or None; its supervisor text)."""
        io, t0_ticks, groups = self.io, self.stopped.t0_ticks, self.stopped.groups
        chain, seen, x = [], set(), proc
        while x is not None and x.get("ppid") and x["ppid"] not in seen:
            seen.add(x["ppid"])
            parent = io.read(x["ppid"])
            if parent is None:
                break
            if self.scope.is_target(parent):
                return parent if parent.get("start_time", 0) <= (proc.get("start_time") or 0) else None, None
            chain.append(parent)
            new = parent.get("start_time") is not None and parent["start_time"] >= t0_ticks
            if not new:
                break
            x = parent
        first_old = chain[-1] if chain else None
        is_init = first_old is not None and (first_old["pid"] == 1 or first_old.get("ns_pid") == 1)
        if (first_old is None or is_init) and (proc.get("session"), proc.get("pgrp")) in groups:
            return groups[(proc.get("session"), proc.get("pgrp"))], None
        return None, supervisor_text(first_old)

    def _newcomer(self, x: dict, contexts: dict):
        """A holder of a selected GPU the watch sees: a child of a signalled target is admitted through the gate (its
        scope entry, to be stopped, is returned); a new holder with a context or on a GPU whose list cannot be
        trusted is reported in ``respawned``, never signalled; a known one, a protected one or a bystander with a
        device node only is passed over."""
        io, p = self.io, self.p
        key = (x["pid"], x.get("start_time"))
        if key in self.known:
            return None
        info = io.read(x["pid"]) or x
        x = dict(x, session=info.get("session"), pgrp=info.get("pgrp"), exe=info.get("exe"),
                 context_gpus=sorted(contexts.get(x["pid"], ())))
        target, supervisor = self._lineage(x)
        if x.get("evidence") != _scope.CONTEXT and target is None and not (set(x["gpus"]) & set(self.scope.untrusted)):
            return None  # a device node only, no memory: a bystander (looked at again while it gains a context)
        self.known.add(key)
        if self.scope.protection(x):
            return None
        if target is not None:
            if self.scope.admit(x, _scope.NEWCOMER, via=target,
                                why=f"appeared during the release below (or orphaned by) signalled pid {target['pid']}"):
                return self.scope.entry(x)
            return None
        as_holder = dict(x, evidence=_scope.CONTEXT)
        in_scope = self._respawn_of_target(x) or not self.scope.judge(as_holder, _scope.HOLDER)
        after_s = None
        if x.get("start_time") is not None:
            after_s = max(0.0, (x["start_time"] - self.stopped.t0_ticks) / io.ticks_per_s())
        self.respawned.append(report(x, supervisor=supervisor, in_scope=in_scope, advice=respawn_advice(
            x, after_s, supervisor, p["stop_units"], in_scope,
            (_scope.container_id(x), x.get("unit")) in self.stopped.units_stopped())))
        return None

    def _respawn_of_target(self, proc: dict) -> bool:
        """Whether a new holder runs in the unit of a target (what was released came back)."""
        unit = proc.get("unit")
        return bool(unit) and any((_scope.container_id(t), t.get("unit")) == (_scope.container_id(proc), unit)
                                  for t in self.scope.targets)


def quiet_since(plan: Plan, stopped: Stop, respawned: list, after):
    """What gpu_wait_idle's ``quiet_since`` takes: since when (io.now(), CLOCK_MONOTONIC) this release saw no
    holder of the selected GPUs - the last target gone, the last context or change of the device-node holders
    its watch saw - on which GPUs, and the device-node holders (no context) there all along; None when the
    watch ended with a context, a new holder, or no look at all."""
    if after is None or respawned or any(g.get("processes") for g in after):
        return None
    return {"clock": round(max(stopped.t0, stopped.quiet_from or stopped.t0), 6), "boot_id": stopped.io.boot_id(),
            "gpus": sorted(plan.scope.selected), "device_holders": sorted(device_holders(after))}


def left_holders(scope, after) -> list:
    """What gpu_wait_idle's ``left_holders`` takes: the processes that still keep a selected GPU busy at the
    end and that this release left by its verdict (outside the scope, protected) - the hook will never stop
    them, so the wait after it fails fast on them ([{pid, start_time, reason}])."""
    left = {_scope.identity(x): x["reason"] for x in scope.skipped}
    left.update({_scope.identity(x): "protected: " + x["reason"] for x in scope.protected})
    out = {}
    for g in after or ():
        for h in [] if g.get("idle") else _holding.holders_of(g):
            why = left.get(_scope.identity(h))
            if why is not None and h["pid"] not in out:
                out[h["pid"]] = {"pid": h["pid"], "start_time": h.get("start_time"), "reason": why}
    return [out[k] for k in sorted(out)]


def release(plan: Plan, io, first_signal: int, diff: bool = False) -> tuple:
    """The release after its plan: the stop, the watch, then the outcome - (the result, why it did not finish ('' when
    it did), the warnings of the stop and the watch)."""
    stopped = Stop(plan, io).run(first_signal)
    watch = Watch(plan, stopped, io)
    after = watch.run(first_signal)
    res = dict(plan.result, released=stopped.released, survivors=stopped.survivors, respawned=watch.respawned,
               stopped_units=stopped.stopped_units, unstopped_units=stopped.unstopped_units)
    if stopped.frozen:
        res["frozen"] = stopped.frozen
    released = {r["pid"] for r in res["released"]}
    # One verdict per process: what was released is not also skipped.
    res["skipped_processes"] = [s for s in res["skipped_processes"] + stopped.skipped if s["pid"] not in released]
    res["containers_changed"] = container_changes(plan.inits, io.read, plan.init_of) if plan.inits else []
    res.update(changed=stopped.sent, gpus=after, quiet_since=quiet_since(plan, stopped, watch.respawned, after),
               left_holders=left_holders(plan.scope, after))
    if after is not None and diff:
        done = stopped.units_stopped()
        units = [dict(e, state_after="stopped" if (e["container"], e["unit"]) in done else "active (not stopped)")
                 for e in plan.units]
        res["diff"] = release_diff(units, plan.before, after, limit=plan.diff_limit())
    warnings = list(stopped.warnings)
    if watch.respawned:
        warnings.append("new holders appeared after the release: " + "; ".join(r["advice"] for r in watch.respawned))
    problems = list(stopped.problems)
    for change in res["containers_changed"]:
        (problems if change["what"] == "restarted" else warnings).append(changed_text(change))
    if res["unstopped_units"]:
        problems.append(unstopped_message(res["unstopped_units"]))
    if res["survivors"] and plan.p["fail_on_survivors"]:
        problems.append(survivor_message(res["survivors"], plan.p, first_signal))
    in_scope = [r for r in watch.respawned if r.get("in_scope")]
    if in_scope:
        problems.append(f"{len(in_scope)} process(es) in the scope hold the selected GPUs again after the release"
                        " (not signalled: a supervisor restarted them or they are new): "
                        + "; ".join(r["advice"] for r in in_scope))
    return res, " ".join(problems), warnings


def device_holders(gpus) -> set:
    """{(pid, start_time)} of the processes that hold a device node of ``gpus`` with no context there."""
    out = set()
    for g in gpus or ():
        listed = {p["pid"] for p in g.get("processes") or ()}
        out |= {(h["pid"], h.get("start_time")) for h in g.get("holders") or () if h["pid"] not in listed}
    return out


def supervisor_text(proc) -> str:
    """'systemd (pid 4012, PID 1 of CT 129)', 'sh (pid 811)', or None."""
    if proc is None:
        return None
    what = f"{proc.get('name')} (pid {proc['pid']}"
    ct = proc.get("container") or {}
    if proc["pid"] == 1:
        what += ", PID 1 of the host"
    elif ct.get("id") is not None and ct.get("pid_in_container") == 1:
        what += f", PID 1 of CT {ct['id']}"
    elif proc.get("ns_pid") == 1:
        what += ", PID 1 of a nested PID namespace"
    if proc.get("unit"):
        what += f", {proc['unit']}"
    return what + ")"


def nested_init(proc) -> bool:
    """Whether ``proc`` is PID 1 of a PID namespace nested below the host's, other than a Proxmox container's
    init (a Docker entrypoint run without an init): the kernel drops the signals it has no handler for."""
    if not proc or proc.get("pid") == 1 or proc.get("ns_pid") != 1:
        return False
    ct = proc.get("container") or {}
    return not (ct.get("id") is not None and ct.get("pid_in_container") == 1)


def nested_init_text(first: str = "SIGTERM") -> str:
    return (f"PID 1 of a nested PID namespace: it ignores {first} unless it handles it (the kernel drops every signal"
            " that PID 1 of a namespace has no handler for, except SIGKILL and SIGSTOP from an ancestor namespace);"
            " run its container with an init (docker run --init, tini) or make its entrypoint handle " + first)


def frozen_text(proc) -> str:
    ct = (proc.get("container") or {}).get("id")
    where = f"CT {ct} is frozen (a suspend-mode backup, lxc-freeze)" if ct is not None else "its cgroup is frozen"
    return (f"in a frozen cgroup: {where}, and a frozen process runs none of its signal handlers until it is thawed"
            + (f" (lxc-unfreeze -n {ct})" if ct is not None else ""))


def frozen_targets(targets, frozen) -> dict:
    """{container id (None: the host): [pids]} of the targets whose cgroup is frozen (``frozen(pid)``: _procs.cgroup_frozen)."""
    out = {}
    for t in targets:
        if frozen(t["pid"]):
            out.setdefault(_scope.container_id(t), []).append(t["pid"])
    return {ct: sorted(pids) for ct, pids in sorted(out.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))}


def frozen_message(frozen: dict, done: str = "Nothing was signalled") -> str:
    """Why a release with frozen targets does not proceed: the reason first, what to do, then what was done."""
    parts = []
    for ct, pids in frozen.items():
        held = f"pid {_bound.listed(map(str, pids))}"
        if ct is not None:
            parts.append(f"CT {ct} is frozen (a suspend-mode backup, or lxc-freeze; its GPU holders: {held}): wait for the"
                         f" backup to finish, or thaw it with `lxc-unfreeze -n {ct}`, then run again")
        else:
            parts.append(f"the cgroup of {held} on the host is frozen (systemctl freeze, cgroup.freeze): thaw it"
                         " (systemctl thaw <unit>, or 0 into its cgroup.freeze), then run again")
    return ("; ".join(parts) + ". A frozen container answers no systemctl stop and runs no signal handler, and its"
            " supervisor (systemd's Restart=) starts the work again after the thaw: the GPUs cannot be released"
            f" while it is frozen. {done}.")


def unstopped_message(unstopped: list) -> str:
    """Why a release whose units could not all be stopped is not a success."""
    return (f"{len(unstopped)} unit(s) could not be stopped (" + "; ".join(u["error"].rstrip(".") for u in unstopped)
            + "): their processes were signalled instead, but systemd (Restart=) or another supervisor can start the"
              " work again, so the GPUs are not proved free. Stop " + ", ".join(unit_text(u) for u in unstopped)
            + " yourself (" + "; ".join(" ".join(unit_command(u, "systemctl", "pct")) for u in unstopped)
            + ") or find why it did not stop, then run"
              " again.")


def survivor_message(survivors: list, p: dict, first_signal: int) -> str:
    """One sentence per state: D is stuck in the kernel; T is stopped; S and the rest are still exiting.

    The wait that ran out was kill_timeout after SIGKILL (escalate), else grace_period after the first signal:
    the advice names the one to raise. A survivor with a known reason (``why_alive``: PID 1 of a nested PID
    namespace, a frozen cgroup) is named with it.
    """
    first = signal_name(first_signal)
    what = "SIGKILL" if p["escalate"] else first
    waited = (f"{p['kill_timeout']:g} s (kill_timeout) after SIGKILL" if p["escalate"] else
              f"{p['grace_period']:g} s (grace_period) after {first}")
    raise_it = ("raise kill_timeout (and grace_period)" if p["escalate"] else
                "raise grace_period, or set escalate: true to send SIGKILL after it")
    by_state, known = {}, []
    for s in survivors:
        if (s.get("why_alive") or "").startswith("in a frozen cgroup"):
            known.append(s)  # its state (D under the v1 freezer, S under cgroup2's) says nothing more
        else:
            by_state.setdefault(s.get("state") or "?", []).append(s)
            if s.get("why_alive"):
                known.append(s)
    parts, level = [], p.get("detail")
    for state, procs in sorted(by_state.items()):
        names = _bound.listed((_holding.describe(s) for s in procs), level)
        if state == "D":
            parts.append(f"{names} (state D) is stuck in the kernel, often in the GPU driver, {waited}: check dmesg for"
                         " Xid errors; if it does not exit, a reboot may be needed")
        elif state in ("T", "t"):
            parts.append(f"{names} (state {state}) is stopped, {waited} (it was sent SIGCONT): a debugger or a job"
                         f" control stop keeps it stopped; resume it (or detach the debugger), or {raise_it}")
        else:
            parts.append(f"{names} (state {state}) is still exiting, {waited}: a large teardown (pinned host memory)"
                         f" can take 20-40 s; {raise_it}")
    parts.append(_bound.listed((f"{_holding.describe(s)} is {s['why_alive']}" + ("" if p["escalate"] else ", or set"
                                                                                 " escalate: true") for s in known),
                               level, "; "))
    return f"{len(survivors)} process(es) survived {what}: " + "; ".join(x for x in parts if x) + "."


class ReleaseFailed(_errors.GpuError):
    """A release that did not proceed or did not finish: ``kind`` is process_list_unreadable, scope,
    container_frozen (nothing was signalled) or release_incomplete; ``partial`` is the result so far (what
    fail_json returns beside msg)."""

    def __init__(self, kind: str, msg: str, partial: dict):
        super().__init__(msg)
        self.kind = kind
        self.partial = partial


COUNTED = ("released", "survivors", "respawned", "protected", "skipped_processes", "stopped_units", "unstopped_units",
           "left_holders")


def run_release(p: dict, filters: dict, io, first_signal: int, check_mode=False, diff=False, lock=None) -> dict:
    """One release, as gpu_release and the fence run it: a snapshot, the GPU count, the
    selection, the plan through the gate, then check mode's report or the release itself.

    Returns the result; raises ReleaseFailed (or another GpuError before anything was signalled)."""
    start = io.now()
    all_gpus = io.snapshot(p["include_device_holders"])
    _snapshot.check_count(all_gpus, p.get("expected_count"), ". Nothing was signalled.")
    before = filters["gpus"].pick(all_gpus)
    waited = None
    if lock is not None and not check_mode:
        # One release at a time per container and GPU (_lock), taken once the selection is known and before anything
        # is planned or signalled: a second run that waited sees what the first left (and says it waited).
        waited = lock(filters.get("containers"), [g["index"] for g in before])
        if waited:
            # It waited for another release: what it read before is stale - read the GPUs again.
            all_gpus = io.snapshot(p["include_device_holders"])
            before = filters["gpus"].pick(all_gpus)
    unreadable, message = unreadable_lists(before, bool(p["pids"]))
    if unreadable and not p["pids"]:
        raise ReleaseFailed("process_list_unreadable", message, dict(
            changed=False, released=[], survivors=[], respawned=[], protected=[], skipped_processes=[],
            unreadable_gpus=unreadable, gpus_before=before))
    if unreadable:
        io.warn(message)
    others, note = unselected_errors(all_gpus, before)
    if note:
        io.warn(note)
    plan = Plan(p, filters, io, all_gpus, before)
    for warning in plan.warnings:
        io.warn(warning)
    if plan.problem:
        raise ReleaseFailed(plan.kind, plan.problem, dict(plan.result, changed=False, released=[], survivors=[],
                                                          respawned=[], stopped_units=[], unstopped_units=[]))
    failure = ""
    if check_mode:
        result = plan.check_mode_result(diff)
    else:
        result, failure, warnings = release(plan, io, first_signal, diff)
        for warning in warnings:
            io.warn(warning)
    if waited:
        result["waited_for_lock"] = waited  # what it released is what another run left (_lock.waited_text)
    result["elapsed"] = round(io.now() - start, 3)
    # How many of each, whole: a result in summary caps the lists (_bound), a reader of the outcome counts here.
    result["counts"] = {k: len(result.get(k) or ()) for k in COUNTED}
    if others:
        result["gpu_errors"] = others
    if failure:
        raise ReleaseFailed("release_incomplete", failure, result)
    return result
