# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The data model: one snapshot of a host's GPUs, the processes on them and who holds them.

Every module and role speaks this model. Pure logic (selection, idle predicate, messages) lives
here; the I/O is injected (a raw backend snapshot from _nvml/_smi, a process reader and a
device-file scanner from _procs), so all of it is testable table-driven.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors
from ansible_collections.gpuops.gpu.plugins.module_utils._procs import device_file_index

# Never signalled, and never counted as keeping a GPU busy: the NVIDIA daemons hold nvidiactl
# (or a device) on an idle GPU by design.
PROTECTED_NAMES = ("nvidia-persistenced", "nv-fabricmanager", "nv-hostengine", "dcgm-exporter", "nvidia-smi")
# Memory an idle GPU reports in use with no process: 0 to a few MiB on current drivers (some
# boards report ~1-5 MiB of driver bookkeeping). Any CUDA context takes far more (hundreds of
# MiB on Hopper), so 64 MiB tells the two apart with margin on both sides.
DEFAULT_MAX_MEMORY_USED_MIB = 64
TYPE_ORDER = ("compute", "graphics", "mps")
_UUID = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]+$")
_BUS = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def normalize_bus_id(text: str):
    """'0000:3b:00.0', '3B:00.0', '00000000:3B:00.0' -> '00000000:3B:00.0'; None if not a bus id."""
    m = _BUS.match(text.strip())
    if not m:
        return None
    domain = int(m.group(1) or "0", 16)
    return f"{domain:08X}:{m.group(2).upper()}:{m.group(3).upper()}.{m.group(4)}"


def select_gpus(gpus: list, selectors) -> list:
    """The GPUs named by ``selectors`` (indices, UUIDs, PCI bus ids), in index order.

    Empty or None selects all. An unknown selector raises SelectionError listing what exists.
    """
    if not selectors:
        return list(gpus)
    chosen = {}
    for sel in selectors:
        text = str(sel).strip()
        match = None
        if text.isdigit():
            match = [g for g in gpus if g["index"] == int(text)]
        elif _UUID.match(text):
            match = [g for g in gpus if (g.get("uuid") or "").lower() == text.lower()]
        else:
            bus = normalize_bus_id(text)
            if bus is None:
                raise _errors.SelectionError(
                    f"gpus: {text!r} is neither a GPU index, a UUID (GPU-...) nor a PCI bus id (00000000:3B:00.0)",
                    selector=text)
            match = [g for g in gpus if normalize_bus_id(g.get("pci_bus_id") or "") == bus]
        if not match:
            existing = ", ".join(f"{g['index']} ({g.get('uuid')}, {g.get('pci_bus_id')})" for g in gpus) or "none"
            raise _errors.SelectionError(
                f"gpus: no GPU matches {text!r} on this host; it has: {existing}", selector=text,
                available=[g["index"] for g in gpus])
        for g in match:
            chosen[g["index"]] = g
    return [chosen[i] for i in sorted(chosen)]


def is_protected(proc: dict, extra=()) -> str:
    """The reason a process must never be signalled nor counted as a GPU user, or ''."""
    if proc is None:
        return ""
    if proc.get("pid") == 1:
        return "PID 1"
    if proc.get("kernel_thread"):
        return "kernel thread"
    names = {proc.get("name") or ""}
    argv0 = (proc.get("cmdline") or "").split(" ", 1)[0]
    if argv0:
        names.add(os.path.basename(argv0))
    for name in names:
        if name in PROTECTED_NAMES:
            return f"NVIDIA daemon ({name})"
    for pattern in extra:
        for name in names | {proc.get("cmdline") or ""}:
            if name == pattern or re.search(pattern, name):
                return f"protected by the protect option ({pattern})"
    return ""


def describe(proc: dict) -> str:
    """'pid 8812 (python3) in CT 129' - how messages name a process."""
    where = ""
    ct = proc.get("container")
    if ct:
        where = f" in CT {ct['id']}"
    name = proc.get("name")
    return f"pid {proc['pid']}" + (f" ({name})" if name else "") + where


def _type_name(types) -> str:
    ordered = [t for t in TYPE_ORDER if t in types]
    return "+".join(ordered) or "compute"


def mib_text(value) -> str:
    if value is None:
        return "unknown"
    return f"{value / 1024:.0f} GiB" if value >= 10240 else f"{value} MiB"


def idle_verdict(gpu: dict, max_memory_used_mib=DEFAULT_MAX_MEMORY_USED_MIB, max_utilization_pct=None,
                 include_device_holders=True):
    """(idle, busy_reasons) for one GPU of a snapshot: the ONE idle definition.

    Idle means: health ok; no compute, graphics or MPS process, visible or not; no holder of the
    GPU's device file outside the protected list (when include_device_holders; a process that
    holds only nvidiactl/nvidia-uvm has no context on this GPU and does not count); memory used at most
    max_memory_used_mib; utilization at most max_utilization_pct when that is set.
    """
    reasons = []
    health = gpu.get("health") or {}
    if health.get("status", "ok") != "ok":
        reasons.append(f"health {health.get('status')}: {health.get('detail')}")
    procs = gpu.get("processes") or []
    if gpu.get("processes_error"):
        # Nothing may be called idle on a list that could not be read: it may hide the holder.
        reasons.append(gpu["processes_error"])
    for p in procs:
        if p.get("visible", True):
            reasons.append(f"used by {describe(p)}" + (f", {mib_text(p.get('used_mib'))}" if p.get("used_mib") is not None else ""))
        else:
            reasons.append(f"used by pid {p['pid']}, which does not exist from here (a process in another PID"
                           " namespace: the host or another container)")
    if include_device_holders:
        nvml_pids = {p["pid"] for p in procs}
        for h in gpu.get("holders") or []:
            if h.get("protected") or h.get("shared_only") or h["pid"] in nvml_pids:
                continue
            reasons.append(f"device file held by {describe(h)} ({', '.join(h.get('files') or [])})")
    used = (gpu.get("memory") or {}).get("used")
    if used is not None and used > max_memory_used_mib:
        if gpu.get("processes_error"):
            reasons.append(f"{used} MiB used")
        elif not procs:
            reasons.append(f"{used} MiB used by processes not visible from this PID namespace (another"
                           " container or the host), or a leaked context")
    util = (gpu.get("utilization") or {}).get("gpu")
    if max_utilization_pct is not None and util is not None and util > max_utilization_pct:
        reasons.append(f"utilization {util}% (more than {max_utilization_pct}%)")
    return (not reasons, reasons)


def build(raw: dict, read_process=None, holders=None, protect=(), max_memory_used_mib=DEFAULT_MAX_MEMORY_USED_MIB,
          max_utilization_pct=None, include_device_holders=True) -> dict:
    """Assemble the facts from a raw backend snapshot.

    ``read_process(pid) -> dict|None`` enriches NVML's pids (None: the pid does not exist here);
    ``holders``: {pid: [paths]} from the device-file scan (None: not gathered).
    """
    cache = {}

    def info(pid):
        if read_process is None:
            return None
        if pid not in cache:
            cache[pid] = read_process(pid)
        return cache[pid]

    gpus = []
    minors = {}
    for g in raw["gpus"]:
        gpu = dict(g)
        procs = []
        for p in g.get("processes") or []:
            proc = {"pid": p["pid"], "type": _type_name(p.get("types") or ()), "used_mib": p.get("used_mib")}
            details = info(p["pid"])
            if details is None:
                # visible: False = the pid does not exist from here; None = not looked up.
                proc.update({"name": None, "cmdline": None, "user": None, "uid": None, "ppid": None,
                             "start_time": None, "container": None,
                             "visible": False if read_process is not None else None})
            else:
                proc.update({k: details[k] for k in ("name", "cmdline", "user", "uid", "ppid", "start_time", "container")})
                proc["visible"] = True
            procs.append(proc)
        gpu["processes"] = procs
        gpu["holders"] = []
        gpus.append(gpu)
        if gpu.get("minor_number") is not None:
            minors[gpu["minor_number"]] = gpu

    for pid, files in sorted((holders or {}).items()):
        details = info(pid)
        if details is None:
            continue
        # nvidiaN ties a process to GPU N. nvidiactl and nvidia-uvm are opened by every CUDA or
        # NVML client whatever GPU it uses: a process that holds only those (shared_only) is listed
        # as a holder of every GPU, but it has no context on any GPU, so it keeps none busy. When
        # the backend could not give minor numbers, an nvidiaN cannot be placed: it then counts
        # for every GPU, so that a GPU is never called idle while something may hold it.
        specific = [device_file_index(path) for path in files]
        owned = sorted({i for i in specific if i is not None and i in minors})
        shared_only = not any(i is not None for i in specific)
        by_gpu = {}
        for gpu in ([minors[i] for i in owned] if owned else gpus):
            by_gpu[gpu["index"]] = list(files)
        reason = is_protected(details, protect)
        for index, paths in by_gpu.items():
            holder = {k: details[k] for k in ("pid", "name", "cmdline", "user", "uid", "ppid", "start_time", "container")}
            holder["files"] = sorted(paths)
            holder["protected"] = reason or None
            holder["shared_only"] = shared_only
            gpus[index]["holders"].append(holder)

    for gpu in gpus:
        gpu["idle"], gpu["busy_reasons"] = idle_verdict(gpu, max_memory_used_mib, max_utilization_pct,
                                                        include_device_holders and holders is not None)
    return {"driver": raw["driver"], "gpus": gpus}


def visibility_warnings(gpus: list) -> list:
    """What the module could not see from where it runs, one sentence per GPU."""
    out = []
    for g in gpus:
        hidden = [p for p in g["processes"] if p.get("visible") is False]
        used = (g.get("memory") or {}).get("used")
        if hidden:
            pids = ", ".join(str(p["pid"]) for p in hidden)
            out.append(f"GPU {g['index']}: the driver reports pid(s) {pids}, which do not exist from this PID"
                       " namespace (another container or the host); run on the host (the Proxmox node) to"
                       " attribute them")
        elif not g["processes"] and not g.get("processes_error") and used is not None and used > DEFAULT_MAX_MEMORY_USED_MIB:
            out.append(f"GPU {g['index']}: {used} MiB used by processes not visible from this PID namespace"
                       " (another container or the host)")
    return out


def read_warnings(gpus: list) -> list:
    """What the driver could not tell, one sentence per cause (GPUs that share it are listed together)."""
    by_cause = {}
    for g in gpus:
        where = f"GPU {g['index']}" + (f" ({g['pci_bus_id']})" if g.get("pci_bus_id") else "")
        if g.get("processes_error"):
            cause = (f"{g['processes_error']}; not called idle, and gpuops.gpu.gpu_release will not release"
                     " it until the list can be read")
            by_cause.setdefault(cause, []).append(where)
        prefix = where + ": "
        for text in g.get("errors") or []:
            text = text[len(prefix):] if text.startswith(prefix) else text
            if g.get("processes_error") and text == g["processes_error"]:
                continue
            by_cause.setdefault(text, []).append(where)
    return [f"{', '.join(wheres)}: {cause}" for cause, wheres in by_cause.items()]
