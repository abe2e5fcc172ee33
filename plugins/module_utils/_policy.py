# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""Who gets signalled: the pure selection policy of gpu_release.

Given the candidate processes (NVML processes and device-file holders of the selected GPUs,
already read from /proc) and the options, sort each into targets, protected or skipped, with
the reason. Descendants are added for tree mode. No I/O, no AnsibleModule.
"""

from __future__ import annotations

from ansible_collections.gpuops.gpu.plugins.module_utils import _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._holding import workload_ancestors
from ansible_collections.gpuops.gpu.plugins.module_utils._snapshot import daemon_impostor, is_protected

PVE_VMID_MIN = _validate.PVE_VMID_MIN
PVE_VMID_MAX = _validate.PVE_VMID_MAX


def validate_vmids(values) -> list:
    return _validate.vmids(values)


def compile_regex(option: str, pattern):
    """A _validate.Regex (``pattern`` and a timed ``search``) or None; ValueError naming the option."""
    return _validate.regex(option, pattern)


def _text(proc: dict, text_of=None) -> str:
    """What match and exclude see: the raw command line where the caller kept it, else the reported one."""
    return (text_of(proc) if text_of else proc.get("cmdline")) or proc.get("name") or ""


def outside_filters(proc: dict, containers=None, users=None, match=None, pids=None, exclude=None, text_of=None) -> str:
    """Why a process falls outside the user's filters ('' when it is inside all of them).

    ``text_of(proc)``: the raw command line (first 4,096 characters) that the regexes see; without
    it they see ``proc["cmdline"]``.
    """
    ct = (proc.get("container") or {}).get("id")
    if containers:
        if ct is None:
            return "not in a container (containers: " + ", ".join(map(str, containers)) + ")"
        if ct not in containers:
            return f"in CT {ct}, not in containers " + ", ".join(map(str, containers))
    if users and proc.get("user") not in users and str(proc.get("uid")) not in users:
        return f"user {proc.get('user')} is not in users"
    cmdline = _text(proc, text_of)
    if match is not None and not match.search(cmdline):
        return f"command line does not match {match.pattern!r}"
    if pids and proc["pid"] not in pids:
        return "pid not in pids"
    if exclude is not None and exclude.search(cmdline):
        return f"command line matches exclude {exclude.pattern!r}"
    return ""


def classify(candidates: list, protected_pids: dict, protect=(), filters=None, tree=True, children=None, read=None,
             text_of=None, exe_of=None):
    """Sort candidates into (targets, protected, skipped).

    ``candidates``: process dicts (pid, name, cmdline, user, uid, ppid, start_time, container, gpus).
    ``protected_pids``: {pid: reason} that must never be signalled (the module itself and its
    ancestors). For tree mode, ``children`` maps a pid to its child pids and ``read(pid)`` gives a
    process dict (or None when it is gone).
    Descendants of a target join the targets unless protected or matched by ``exclude`` (the
    other filters choose holders, not their children); they inherit the target's GPUs and carry
    ``via`` (the pid of the holder they descend from).
    ``text_of(proc)`` gives the raw command line that ``match``, ``exclude`` and ``protect`` see
    (the reported one is redacted and cut); without it they see ``proc["cmdline"]``.
    """
    filters = filters or {}
    exclude = filters.get("exclude")
    targets, protected, skipped = {}, {}, {}

    def protection(proc):
        check = dict(proc, cmdline=text_of(proc)) if text_of else dict(proc)
        context = proc.get("evidence") == "context"
        return protected_pids.get(proc["pid"]) or is_protected(check, protect, context=context, exe_of=exe_of)

    for proc in candidates:
        pid = proc["pid"]
        reason = protection(proc)
        if reason:
            protected[pid] = dict(proc, reason=reason)
            continue
        impostor = ""
        if proc.get("evidence") == "context":
            impostor = daemon_impostor(proc, exe_of)
        if impostor:
            proc = dict(proc, why=impostor)
        why = outside_filters(proc, text_of=text_of, **filters)
        if why:
            skipped[pid] = dict(proc, reason=why)
            continue
        targets[pid] = dict(proc)

    if tree and read:
        # The workload's root and the processes between it and the holders (an API process that
        # holds no GPU itself) join the targets (_holding.workload_ancestors).
        for holder in list(targets.values()):
            start = read(holder["pid"])
            if start is None or start.get("start_time") != holder.get("start_time"):
                continue  # gone (or another process now): nothing to walk from
            for anc, why in workload_ancestors(start, read, protection):
                if anc["pid"] in targets or anc["pid"] in protected:
                    continue
                if exclude is not None and exclude.search(_text(anc, text_of)):
                    skipped[anc["pid"]] = dict(anc, gpus=holder.get("gpus", []),
                                               reason=f"{why}, but its command line matches exclude {exclude.pattern!r}")
                    break
                skipped.pop(anc["pid"], None)
                targets[anc["pid"]] = dict(anc, gpus=holder.get("gpus", []), via=holder["pid"], why=why)

    if tree and children and read:
        queue = list(targets.values())
        while queue:
            parent = queue.pop()
            for cpid in children.get(parent["pid"], ()):
                if cpid in targets or cpid in protected:
                    continue
                child = read(cpid)
                if child is None:
                    continue
                reason = protection(child)
                if reason:
                    protected[cpid] = dict(child, reason=reason, gpus=parent.get("gpus", []))
                    continue
                if exclude is not None and exclude.search(_text(child, text_of)):
                    skipped[cpid] = dict(child, gpus=parent.get("gpus", []),
                                         reason=f"descendant of pid {parent['pid']}, but its command line"
                                                f" matches exclude {exclude.pattern!r}")
                    continue
                skipped.pop(cpid, None)
                entry = dict(child, gpus=parent.get("gpus", []), via=parent["pid"])
                targets[cpid] = entry
                queue.append(entry)
    return (sorted(targets.values(), key=lambda p: p["pid"]),
            sorted(protected.values(), key=lambda p: p["pid"]),
            sorted(skipped.values(), key=lambda p: p["pid"]))
