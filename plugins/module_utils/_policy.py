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

import re

from ansible_collections.gpuops.gpu.plugins.module_utils._snapshot import is_protected

PVE_VMID_MIN = 100
PVE_VMID_MAX = 999999999


def validate_vmids(values) -> list:
    out = []
    for v in values or []:
        text = str(v).strip()
        if not text.isdigit() or not PVE_VMID_MIN <= int(text) <= PVE_VMID_MAX:
            raise ValueError(f"containers: {v!r} is not a Proxmox VE container id (an integer {PVE_VMID_MIN}..{PVE_VMID_MAX})")
        out.append(int(text))
    return out


def compile_regex(option: str, pattern):
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{option}: {pattern!r} is not a valid regular expression: {exc}") from None


def outside_filters(proc: dict, containers=None, users=None, match=None, pids=None, exclude=None) -> str:
    """Why a process falls outside the user's filters ('' when it is inside all of them)."""
    ct = (proc.get("container") or {}).get("id")
    if containers:
        if ct is None:
            return "not in a container (containers: " + ", ".join(map(str, containers)) + ")"
        if ct not in containers:
            return f"in CT {ct}, not in containers " + ", ".join(map(str, containers))
    if users and proc.get("user") not in users and str(proc.get("uid")) not in users:
        return f"user {proc.get('user')} is not in users"
    cmdline = proc.get("cmdline") or proc.get("name") or ""
    if match is not None and not match.search(cmdline):
        return f"command line does not match {match.pattern!r}"
    if pids and proc["pid"] not in pids:
        return "pid not in pids"
    if exclude is not None and exclude.search(cmdline):
        return f"command line matches exclude {exclude.pattern!r}"
    return ""


def classify(candidates: list, protected_pids: dict, protect=(), filters=None, tree=True, children=None, read=None):
    """Sort candidates into (targets, protected, skipped).

    ``candidates``: process dicts (pid, name, cmdline, user, uid, ppid, start_time, container, gpus).
    ``protected_pids``: {pid: reason} that must never be signalled (the module itself and its
    ancestors). For tree mode, ``children`` maps a pid to its child pids and ``read(pid)`` gives a
    process dict (or None when it is gone).
    Descendants of a target join the targets unless protected or matched by ``exclude`` (the
    other filters choose holders, not their children); they inherit the target's GPUs and carry
    ``via`` (the pid of the holder they descend from).
    """
    filters = filters or {}
    exclude = filters.get("exclude")
    targets, protected, skipped = {}, {}, {}

    def protection(proc):
        return protected_pids.get(proc["pid"]) or is_protected(proc, protect)

    for proc in candidates:
        pid = proc["pid"]
        reason = protection(proc)
        if reason:
            protected[pid] = dict(proc, reason=reason)
            continue
        why = outside_filters(proc, **filters)
        if why:
            skipped[pid] = dict(proc, reason=why)
            continue
        targets[pid] = dict(proc)

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
                if exclude is not None and exclude.search(child.get("cmdline") or child.get("name") or ""):
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
