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
import posixpath

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors
from ansible_collections.gpuops.gpu.plugins.module_utils import _health, _holding, _mig

# Never signalled, and never counted as keeping a GPU busy: the NVIDIA daemons hold nvidiactl
# (or a device) on an idle GPU by design. The MPS control daemon holds no context (its servers do, and
# _holding decides when one may be signalled): it is never the root of a workload.
PROTECTED_NAMES = ("nvidia-persistenced", "nv-fabricmanager", "nv-hostengine", "dcgm-exporter", "nvidia-smi",
                   _holding.MPS_CONTROL)
# Where the NVIDIA packages (and DCGM) install those daemons.
DAEMON_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin")
# Memory an idle GPU reports in use with no process: 0 to a few MiB on current drivers (some
# boards report ~1-5 MiB of driver bookkeeping). Any CUDA context takes far more (hundreds of
# MiB on Hopper), so 64 MiB tells the two apart with margin on both sides.
DEFAULT_MAX_MEMORY_USED_MIB = 64
TYPE_ORDER = ("compute", "graphics", "mps")


def check_count(gpus: list, expected, then: str = "") -> None:
    """The one GPU-count check (gpu_release before any signal, gpu_wait_idle at its first look);
    ``then`` is added to the message (what was not done)."""
    if expected is not None and len(gpus) != expected:
        raise _errors.GpuError(
            f"expected {expected} GPUs, the driver shows {len(gpus)}: a GPU fell off the bus"
            f" (check dmesg for Xid 79), or the play runs on the wrong host{then}",
            expected_count=expected, gpu_count=len(gpus))


def _names(proc: dict) -> set:
    names = {proc.get("name") or ""}
    argv0 = (proc.get("cmdline") or "").split(" ", 1)[0]
    if argv0:
        names.add(os.path.basename(argv0))
    return names


def is_daemon_exe(exe, name: str) -> bool:
    """Whether ``exe`` is where the NVIDIA packages install daemon ``name`` (/usr/bin/nvidia-smi, ...)."""
    return bool(exe) and any(exe == f"{d}/{name}" for d in DAEMON_DIRS)


def daemon_impostor(proc: dict, exe_of=None) -> str:
    """Why a context holder named like an NVIDIA daemon is not protected ('' when it is not named so).

    ``exe_of(pid)`` reads the executable, only for a process that is named so.
    """
    for name in sorted(_names(proc) & set(PROTECTED_NAMES)):
        exe = proc.get("exe") or (exe_of(proc["pid"]) if exe_of else None)
        if not is_daemon_exe(exe, name):
            return (f"named {name} like an NVIDIA daemon, but it has a context and its executable is"
                    f" {exe or 'unknown'}, not the daemon's: treated as any other process")
    return ""


def is_protected(proc: dict, extra=(), context=False, exe_of=None) -> str:
    """The reason a process must never be signalled nor counted as a GPU user, or ''.

    A process named like an NVIDIA daemon is protected by its name, except when it holds a
    context (``context``): then only when its executable (``exe``, else ``exe_of(pid)``) is the daemon's.
    ``extra``: the protect option's patterns, compiled (_validate.regexes: ``pattern`` and ``search``, under
    their time budget) - the one form every caller passes (the snapshot, the scope gate, the wait).
    """
    if proc is None:
        return ""
    if proc.get("pid") == 1:
        return "PID 1"
    if proc.get("kernel_thread"):
        return "kernel thread"
    names = _names(proc)
    for name in names:
        if name in PROTECTED_NAMES and (not context or is_daemon_exe(
                proc.get("exe") or (exe_of(proc["pid"]) if exe_of else None), name)):
            return f"NVIDIA daemon ({name})"
    for pattern in extra:
        for name in names | {proc.get("cmdline") or ""}:
            if name == pattern.pattern or pattern.search(name):
                return f"protected by the protect option ({pattern.pattern})"
    return ""


def _type_name(types) -> str:
    ordered = [t for t in TYPE_ORDER if t in types]
    return "+".join(ordered) or "compute"


def take(reader, gather_processes=True, gather_holders=True, gather_xid=False) -> dict:
    """One snapshot of every GPU (the selection is applied by the caller) from what ``reader`` reads
    (_host.snapshots.SnapshotTaker: the driver, /proc, the device-file scan, the kernel log), built here: the kernel
    log is read when ``gather_xid``, or at a full snapshot (``gather_holders``) when the xid check is on (in between:
    the last read's events); the scan looks at the MIG capability nodes too (_mig.scan_patterns), and, with nvidia-smi
    asked about some GPUs only, keeps those GPUs' nodes (selected_files_only)."""
    p = reader.params
    raw = reader.raw(need_minors=gather_holders)
    checks = p.get("health_checks") or ()
    if gather_xid or ("xid" in checks and gather_holders):
        log = reader.read_kernel_log()
        reader.xids = None if log["text"] is None else _health.parse_xid_events(log["text"])
        reader.kernel_log = _health.kernel_log_summary(log, reader.xids)
    holders = None
    if gather_holders:
        holders = reader.scan_holders(_mig.scan_patterns(p["device_files"], raw["gpus"]))
        if reader.smi_ids and reader.backend == "nvidia-smi":
            holders = selected_files_only(holders, raw["gpus"])
    return reader.with_shown_text(build(
        raw, read_process=reader.read_for_build if gather_processes else None, holders=holders, protect=reader.protect,
        max_memory_used_mib=p.get("max_memory_used_mib", DEFAULT_MAX_MEMORY_USED_MIB),
        max_utilization_pct=p.get("max_utilization_pct"), include_device_holders=p["include_device_holders"],
        in_container=reader.in_container(), exe_of=reader.exe, min_free_mib=p.get("min_free_mib"),
        min_free_pct=p.get("min_free_pct"), health_checks=checks,
        xid_events=reader.xids if gather_xid or "xid" in checks else None,
        mig_selected=reader.selection.resolve(raw["gpus"])[1], host_namespace=reader.host_namespace()))


def selected_files_only(holders: dict, raw_gpus: list) -> dict:
    """With nvidia-smi restricted to some GPUs (smi_ids), the device nodes of the other GPUs are not
    theirs: drop them, so that a holder of an unselected GPU's node is not counted on every GPU.
    Kept as is when a GPU's minor number is unknown (then no node can be placed)."""
    minors = {g.get("minor_number") for g in raw_gpus}
    if None in minors:
        return holders
    out, placeable = {}, minors | {None}  # None: a control node, which every GPU's holder may hold
    for pid, files in holders.items():
        kept = [f for f in files if _holding.node_of(f)[1] in placeable]
        if kept:
            out[pid] = kept
    return out


def build(raw: dict, read_process=None, holders=None, protect=(), max_memory_used_mib=DEFAULT_MAX_MEMORY_USED_MIB,
          max_utilization_pct=None, include_device_holders=True, in_container=None, exe_of=None,
          min_free_mib=None, min_free_pct=None, health_checks=(), xid_events=None, mig_selected=None,
          host_namespace=True) -> dict:
    """Assemble the facts from a raw backend snapshot.

    ``read_process(pid) -> dict|None`` enriches NVML's pids (None: the pid does not exist here);
    ``holders``: {pid: [paths]} from the device-file scan (None: not gathered).
    ``min_free_mib``/``min_free_pct``: each GPU gets ``fit`` and ``fits`` (_health.fit);
    ``health_checks``: the checks that keep a GPU from being idle (every failing check is in
    ``health.checks`` all the same); ``xid_events``: the kernel log's (_health.parse_xid_events), or
    None when it was not read (each GPU's ``xid_events`` is then None); ``mig_selected`` ({index: MIG UUIDs},
    _selection.Selection.resolve): those GPUs are judged as far as those MIG devices go (_mig.narrow).
    ``host_namespace`` False (a container) or None (cannot tell): a driver pid whose process here does not hold the
    GPU's node is not that process (_holding.unverified_pids, once the holders are known): named by its pid only,
    ``visible`` false, ``unverified``.
    """
    cache = {}

    def info(pid):
        if read_process is None:
            return None
        if pid not in cache:
            cache[pid] = read_process(pid)
        return cache[pid]

    gpus = [_gpu_entry(g, info, read_process is not None) for g in raw["gpus"]]
    _place_holders(gpus, holders, info, protect, exe_of)
    if holders is not None:
        _mark_unverified(gpus, _holding.unverified_pids(gpus, host_namespace))
    # MIG devices (before health and fit: a GPU named only by MIG UUIDs is judged, fit included, as far as they go)
    for gpu in gpus:
        _mig_facts(gpu, max_memory_used_mib)
        if (mig_selected or {}).get(gpu["index"]):
            _mig.narrow(gpu, mig_selected[gpu["index"]])
    backend = (raw.get("driver") or {}).get("backend")
    for gpu in gpus:
        _health_facts(gpu, xid_events, health_checks, min_free_mib, min_free_pct, backend)
    _mark_mps_servers(gpus)
    contexts = _holding.context_gpus(gpus)
    for gpu in gpus:
        gpu["idle"], gpu["busy_reasons"], blockers, lingering = _holding.verdict(
            gpu, max_memory_used_mib, max_utilization_pct, include_device_holders and holders is not None,
            in_container, contexts, min_free_mib, min_free_pct, health_checks, backend)
        gpu["blockers"] = sorted({b["pid"] for b in blockers})
        gpu["lingering"] = sorted({h["pid"] for h in lingering})
    return {"driver": raw["driver"], "gpus": gpus}


_PROCESS_KEYS = ("name", "cmdline", "user", "uid", "ppid", "start_time", "container", "unit")


def _gpu_entry(g: dict, info, looked_up: bool) -> dict:
    """One GPU of the raw snapshot with its processes' details (``info(pid)``: None when the pid does not exist
    here) and no holders yet."""
    gpu = dict(g)
    procs = []
    for p in g.get("processes") or []:
        proc = {"pid": p["pid"], "type": _type_name(p.get("types") or ()), "used_mib": p.get("used_mib")}
        details = info(p["pid"])
        if details is None:
            # visible: False = the pid does not exist from here; None = not looked up.
            proc.update(dict.fromkeys(_PROCESS_KEYS), visible=False if looked_up else None)
        else:
            proc.update({k: details.get(k) for k in _PROCESS_KEYS}, visible=True)
        procs.append(proc)
    gpu["processes"] = procs
    gpu["holders"] = []
    return gpu


def _mark_unverified(gpus: list, unverified: dict) -> None:
    """A driver pid that names another process here: its entries keep the pid and the driver's figures only."""
    for gpu in gpus:
        for proc in gpu["processes"]:
            if proc["pid"] in unverified:
                proc.update(dict.fromkeys(_PROCESS_KEYS), visible=False, unverified=unverified[proc["pid"]])


def _place_holders(gpus: list, holders, info, protect, exe_of) -> None:
    """Each holder gets its evidence on each GPU (_holding): context, device or control. A holder is listed on the
    GPUs whose node it holds (or on which it has a context) and, when it holds only control nodes, on every GPU.
    Without minor numbers an nvidiaN cannot be placed: it then counts as a device holder of every GPU."""
    minors = {g["minor_number"]: g["index"] for g in gpus if g.get("minor_number") is not None}
    known_minors = minors or None
    context_pids = {g["index"]: {p["pid"] for p in g["processes"]} for g in gpus}
    for pid, files in sorted((holders or {}).items()):
        details = info(pid)
        if details is None:
            continue
        placed = _holding.placement(files, known_minors)
        has_context = any(pid in pids for pids in context_pids.values())
        reason = is_protected(details, protect, context=has_context, exe_of=exe_of)
        for gpu in gpus:
            evidence = _holding.evidence_on(gpu["index"], pid, context_pids[gpu["index"]], placed)
            if evidence == _holding.CONTEXT and not (placed["unplaced"] or gpu["index"] in placed["gpus"]):
                continue  # a context here, but it holds none of this GPU's nodes: the driver's entry says it all
            if evidence == _holding.CONTROL and (placed["gpus"] or placed["unplaced"]):
                continue  # it holds another GPU's node: nothing ties it to this one
            holder = {k: details.get(k) for k in ("pid",) + _PROCESS_KEYS}
            holder.update(files=sorted(files), protected=reason or None, evidence=evidence)
            gpu["holders"].append(holder)


def _health_facts(gpu: dict, xid_events, health_checks, min_free_mib, min_free_pct, backend) -> None:
    """A GPU's health fields, its Xid events, its failing checks and its fit for the next server."""
    for key in _health.HEALTH_FIELDS:
        gpu.setdefault(key, None)
    gpu["xid_events"] = None if xid_events is None else _health.xid_events_of(gpu, xid_events)
    reasons = _health.hw_slowdown(gpu)
    gpu["hw_slowdown"] = None if reasons is None else bool(reasons)
    gpu["utilization_latched"] = _health.utilization_latched(gpu)
    gpu["health"] = dict(gpu.get("health") or {"status": "ok", "detail": None})
    gpu["health"]["checks"] = _health.failed_checks(gpu, health_checks)
    gpu["fit"] = _health.fit(gpu, min_free_mib, min_free_pct, backend)
    gpu["fits"] = None if gpu["fit"] is None else gpu["fit"]["fits"]


def _mark_mps_servers(gpus: list) -> None:
    """An MPS server's entries carry what it serves and whom (_holding.mps_servers; the raw command lines are here):
    the release's gate and the wait's reasons read it from there."""
    servers = _holding.mps_servers(gpus)
    for gpu in gpus:
        for proc in gpu["processes"]:
            server = servers.get(proc["pid"])
            if server is not None:
                proc["mps_server"] = {"gpus": list(server["gpus"]), "container": server["container"],
                                      "clients": [dict(c, gpus=list(c["gpus"])) for c in server["clients"]]}


def _mig_facts(gpu: dict, max_memory_used_mib) -> None:
    """A GPU's MIG devices in the facts' form (_mig.facts); each process and holder names the MIG devices it is on
    (``mig_device``: the UUID of the device whose process list has it; ``mig_devices``: those whose capability nodes
    a holder holds). Nothing is added to a GPU without MIG devices but an empty list."""
    devs = gpu.get("mig_devices")
    if not devs:
        gpu["mig_devices"] = devs if devs is None else []
        return
    raw_procs = {}
    for dev in devs:
        for p in dev.get("processes") or []:
            raw_procs.setdefault(p["pid"], dev["uuid"])
    for proc in gpu["processes"]:
        proc["mig_device"] = raw_procs.get(proc["pid"])
    for holder in gpu["holders"]:
        holder["mig_devices"] = _mig.devices_of_nodes([gpu], holder.get("files"))
    gpu["mig_devices"] = [_mig.facts(dev, gpu, gpu["holders"], max_memory_used_mib) for dev in devs]


def visibility_warnings(gpus: list, in_container=None) -> list:
    """What the module could not see from where it runs: one sentence per cause, GPUs that share it together."""
    hidden_by_gpu = []
    unaccounted = []
    unverified = [p["unverified"] for g in gpus for p in g["processes"] if p.get("unverified")]
    for g in gpus:
        hidden = [p for p in g["processes"] if p.get("visible") is False and not p.get("unverified")]
        used = (g.get("memory") or {}).get("used")
        if hidden:
            hidden_by_gpu.append(f"GPU {g['index']} (pid {', '.join(str(p['pid']) for p in hidden)})")
        elif not g["processes"] and not g.get("processes_error") and used is not None and used > DEFAULT_MAX_MEMORY_USED_MIB:
            unaccounted.append((g["index"], used))
    out = [why + ": not named here; run on the host (the Proxmox node) to attribute it" for why in unverified]
    if hidden_by_gpu:
        out.append(", ".join(hidden_by_gpu) + ": the driver reports pids that do not exist from this PID namespace"
                   " (another container or the host); run on the host (the Proxmox node) to attribute them")
    if unaccounted:
        where = ", ".join(f"GPU {i} ({used} MiB)" for i, used in unaccounted)
        if in_container is False:
            out.append(f"{where}: memory in use that no process holds: the driver is still freeing the memory of"
                       " exited processes, or a context leaked (nvidia-smi -r -i N resets GPU N once nothing holds it)")
        else:
            out.append(f"{where}: memory in use by processes not visible from this PID namespace (another container"
                       " or the host), or a leaked context")
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


# --- the results' form: each holder once ----------------------------------------------------------
#
# Inside a module run a GPU's ``holders`` is a list of dicts, each with the holder's details; CUDA opens
# every /dev/nvidiaN and every NVML client holds nvidiactl, so the same process is on every GPU and a
# result would grow as GPUs x processes x files (8.5 MB for 64 GPUs, past ansible-runner's 700,000
# characters per event). A result says each holder once: a GPU's ``holders`` becomes
# ``{"context": [pids], "device": [pids], "control": [pids], "lingering": [pids]}`` (the pids by their evidence on
# that GPU; a device holder that keeps nothing busy is under ``lingering``, and the GPU's own ``lingering`` list,
# the same pids, is left out)
# and the details of each pid are in one mapping beside the GPUs (``holder_processes`` in a result,
# ``gpu_holder_processes`` in gpu_facts' ansible_facts), keyed by the pid as a string, with ``gpus``: the
# GPUs (of the lists compacted together) it holds - a context or the GPU's node there, not only the control
# nodes every NVML client holds - and its ``files`` by directory
# ({"/dev": ["nvidia0", "nvidiactl"]}: a CUDA process holds every GPU's node, and the directory is the same
# for all of them). ``processes`` (the driver's contexts) are left as they are. compact_result() is applied once, where a module emits its result; expand_gpus()
# gives the controller's filters the snapshot's form back.
#
# A result carries its snapshot once: ``gpus`` (the last look) whole, and of the look before (``gpus_before``) only
# what a before/after table and a diff read of each GPU (gpu_record): its ids, memory, verdict, how many processes
# and holders it had, and its blockers (the driver's entries of those that are processes, the others by pid).

EVIDENCE_KEYS = (_holding.CONTEXT, _holding.DEVICE, _holding.CONTROL)
LINGERING = "lingering"
HOLDER_DETAIL_KEYS = ("pid", "name", "cmdline", "user", "uid", "ppid", "start_time", "container", "unit", "protected", "files")
RESULT_GPU_KEYS = ("gpus_before", "gpus")
BEFORE = "gpus_before"
RECORD_KEYS = ("index", "uuid", "name", "idle", "busy_reasons", "blockers", "mig_selected")
RECORD_PROCESS_KEYS = ("pid", "used_mib", "name", "container", "unit", "visible")
HOLDER_PROCESSES = "holder_processes"
FACTS_GPU_KEYS = ("gpu_devices",)
FACTS_HOLDER_PROCESSES = "gpu_holder_processes"


def _pid_key(pid) -> str:
    return str(pid)


def files_by_dir(files):
    """['/dev/nvidia0', '/dev/nvidiactl'] -> {'/dev': ['nvidia0', 'nvidiactl']} (None stays None)."""
    if not isinstance(files, list):
        return files
    out = {}
    for path in files:
        folder, name = posixpath.split(str(path))
        out.setdefault(folder, []).append(name)
    return out


def files_from_dirs(files):
    """The sorted paths again from files_by_dir's mapping (a list is returned as it is)."""
    if not isinstance(files, dict):
        return files
    return sorted(posixpath.join(folder, name) for folder, names in files.items() for name in names or [])


def compact_gpus(gpus, details: dict) -> list:
    """Copies of ``gpus`` whose ``holders`` are pids by evidence; each holder's details are added to ``details``
    ({str(pid): {...}}) once, the first time its pid is seen. A GPU whose holders are not a list (already
    compact, or not a snapshot's GPU) is kept as it is; ``gpus`` itself is not changed."""
    out = []
    for gpu in gpus:
        holders = gpu.get("holders") if isinstance(gpu, dict) else None
        if not isinstance(holders, list):
            out.append(gpu)
            continue
        refs = {key: [] for key in EVIDENCE_KEYS + (LINGERING,)}
        linger = set(gpu.get(LINGERING) or [])
        for holder in holders:
            pid = holder.get("pid")
            evidence = holder.get("evidence") or _holding.DEVICE
            # A device holder that keeps nothing busy is listed once, as lingering (not as device and again in
            # the GPU's lingering list).
            refs.setdefault(LINGERING if evidence == _holding.DEVICE and pid in linger else evidence, []).append(pid)
            entry = details.get(_pid_key(pid))
            if entry is None:
                entry = {k: holder.get(k) for k in HOLDER_DETAIL_KEYS}
                entry["files"] = files_by_dir(entry["files"])
                entry["gpus"] = []
                details[_pid_key(pid)] = entry
            if holder.get("evidence") != _holding.CONTROL and gpu.get("index") not in entry["gpus"]:
                entry["gpus"].append(gpu.get("index"))
        compact = dict(gpu, holders=refs)
        if LINGERING in gpu and set(refs[LINGERING]) == linger:
            del compact[LINGERING]  # it is holders.lingering
        out.append(compact)
    return out


def gpu_record(gpu):
    """What a before/after table and a diff read of one GPU (a result's ``gpus_before``): index, uuid, name, memory
    used and total, health status, idle, blockers, busy_reasons (of a GPU with no blocker: the blockers say it),
    ``process_count`` and ``holder_count``, and of its blockers only: their pids by evidence in ``holders``, and the
    driver's entries (pid, used_mib, name, container, unit, visible) of those with a context or that the holders do
    not name in ``processes``. A record (or what is not a GPU) is returned as it is."""
    if not isinstance(gpu, dict) or "process_count" in gpu:
        return gpu
    blockers = set(gpu.get("blockers") or ())
    out = {k: gpu[k] for k in RECORD_KEYS if k in gpu}
    if blockers and "busy_reasons" in out:
        out["busy_reasons"] = []  # the blockers say it (a table shows the reasons of a GPU no process holds)
    memory = gpu.get("memory") if isinstance(gpu.get("memory"), dict) else {}
    out["memory"] = {"used": memory.get("used"), "total": memory.get("total")}
    if isinstance(gpu.get("health"), dict):
        out["health"] = {"status": gpu["health"].get("status")}
    processes = gpu.get("processes") if isinstance(gpu.get("processes"), list) else []
    holders = gpu.get("holders")
    out["process_count"] = len(processes)
    if isinstance(holders, dict):   # compact: pids by evidence
        out["holder_count"] = len({p for pids in holders.values() for p in pids or ()})
        out["holders"] = {k: [p for p in pids or () if p in blockers] for k, pids in holders.items()}
        named = {p for pids in out["holders"].values() for p in pids}
    else:                           # the snapshot's: dicts (compact_gpus keeps the blockers' details)
        out["holder_count"] = len(holders or [])
        out["holders"] = [h for h in holders or [] if h.get("pid") in blockers]
        named = {h.get("pid") for h in out["holders"]}
    # A blocker the holders name has its details there (holder_processes), but only the driver's entry says the memory
    # its context holds (a table names it, as it names it in the after); the driver's entry of one they do not name
    # (not visible from here, its files not readable) is all a table has of it.
    out["processes"] = [{k: p.get(k) for k in RECORD_PROCESS_KEYS} for p in processes
                        if p.get("pid") in blockers and (p.get("pid") not in named or p.get("used_mib") is not None)]
    return out


def compact_result(result: dict, keys=RESULT_GPU_KEYS, details_key=HOLDER_PROCESSES) -> dict:
    """``result`` (a module's result, or gpu_facts' ansible_facts with FACTS_GPU_KEYS and FACTS_HOLDER_PROCESSES)
    with each GPU list in ``keys`` compacted and the holders' details once, in ``result[details_key]``; a result's
    ``gpus_before`` in records (gpu_record: its snapshot is ``gpus``).

    A copy: the snapshot's lists stay as the module uses them. Nothing is added when none of ``keys`` holds a
    list (a failure before any snapshot); applying it twice changes nothing."""
    out = dict(result)
    if isinstance(out.get(BEFORE), list) and BEFORE in keys:
        out[BEFORE] = [gpu_record(g) for g in out[BEFORE]]
    details = {k: dict(v, gpus=list(v.get("gpus") or [])) for k, v in (out.get(details_key) or {}).items()}
    found = False
    for key in keys:
        if isinstance(out.get(key), list):
            out[key] = compact_gpus(out[key], details)
            found = True
    if found:
        for entry in details.values():
            entry["gpus"] = sorted(entry["gpus"], key=lambda i: (i is None, i if isinstance(i, int) else str(i)))
        out[details_key] = {k: details[k] for k in sorted(details, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else k))}
    return out


def compact_facts(facts: dict) -> dict:
    """gpu_facts' ansible_facts in the results' form: gpu_devices compacted, gpu_holder_processes beside it."""
    return compact_result(facts, FACTS_GPU_KEYS, FACTS_HOLDER_PROCESSES)


def expand_gpus(gpus, details=None) -> list:
    """The snapshot's form of a result's GPU list: each GPU's ``holders`` a list of dicts (pid, evidence and the
    holder's details from ``details``, a result's holder_processes), sorted by pid as a snapshot lists them.

    GPUs already in that form (or not dicts) are returned as they are; a pid missing from ``details`` (or
    ``details`` None) gets its pid and evidence, every other field null."""
    details = details if isinstance(details, dict) else {}
    out = []
    for gpu in gpus or []:
        refs = gpu.get("holders") if isinstance(gpu, dict) else None
        if not isinstance(refs, dict):
            out.append(gpu)
            continue
        holders = []
        for evidence, pids in refs.items():
            for pid in pids or []:
                found = details.get(_pid_key(pid)) or details.get(pid) or {}
                holder = {k: found.get(k) for k in HOLDER_DETAIL_KEYS}
                holder.update(pid=pid, evidence=_holding.DEVICE if evidence == LINGERING else evidence,
                              files=files_from_dirs(holder["files"]))
                holders.append(holder)
        holders.sort(key=lambda h: (not isinstance(h["pid"], int), h["pid"] if isinstance(h["pid"], int) else str(h["pid"])))
        expanded = dict(gpu, holders=holders)
        if LINGERING not in gpu:
            expanded[LINGERING] = sorted(refs.get(LINGERING) or [])
        out.append(expanded)
    return out
