# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""MIG (Multi-Instance GPU): the MIG devices of a GPU, their capability nodes, and which of them a set of device
files names - the one place the modules read MIG from (which MIG devices the gpus option names: _selection).

A GPU in MIG mode is split into GPU instances, each into compute instances; a MIG device is one compute instance,
with its own UUID (``MIG-...``). A process on a MIG device holds its GPU's ``/dev/nvidiaN`` and two capability
nodes, ``/dev/nvidia-caps/nvidia-cap<N>`` of its GPU instance and of its compute instance; the driver names N in
``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<g>[/ci<c>]/access`` (``DeviceFileMinor: N``; NVIDIA's MIG
user guide, "Device Nodes and Capabilities"; read by _host.mig_caps).
"""

from __future__ import annotations

import os
import re

CAP_DEV_DIR = "/dev/nvidia-caps"
_CAP_NODE = re.compile(r"(?:^|/)nvidia-cap(\d+)$")


def node_minor(path):
    """N of a path ending in nvidia-cap<N>, else None."""
    m = _CAP_NODE.search(str(path))
    return int(m.group(1)) if m else None


def devices_of_nodes(gpus, paths) -> list:
    """The MIG UUIDs whose capability nodes (either of the two) are among ``paths`` (host paths, a container
    config's, or a process's open files: compared by N), in GPU and index order."""
    minors = {node_minor(p) for p in paths or ()} - {None}
    out = []
    if not minors:
        return out
    for gpu in gpus:
        for dev in gpu.get("mig_devices") or []:
            if {node_minor(n) for n in dev.get("device_nodes") or ()} & minors:
                out.append(dev["uuid"])
    return out


def in_order(gpus, uuids) -> list:
    """The MIG UUIDs among ``uuids`` (any case), as the GPUs list them (GPU and index order)."""
    wanted = {str(u).lower() for u in uuids or ()}
    return [d["uuid"] for g in gpus or () for d in g.get("mig_devices") or [] if (d.get("uuid") or "").lower() in wanted]


def held(gpus) -> dict:
    """{container id (None: the node): set of MIG UUIDs} over a snapshot (_snapshot.build): the MIG devices its
    processes are on (a context there, ``mig_device``) or hold the capability nodes of (``mig_devices`` of an
    unprotected holder)."""
    out = {}
    for gpu in gpus or ():
        on = [(p, [p["mig_device"]]) for p in gpu.get("processes") or [] if p.get("mig_device")]
        on += [(h, h.get("mig_devices") or []) for h in gpu.get("holders") or [] if not h.get("protected")]
        for proc, uuids in on:
            if uuids:
                out.setdefault((proc.get("container") or {}).get("id"), set()).update(uuids)
    return out


def by_gpu(gpus, uuids) -> dict:
    """{str(GPU index): [its MIG UUIDs among ``uuids``]} (only the GPUs that have some)."""
    out = {}
    for uuid in uuids or ():
        gpu, dev = find(gpus or [], uuid)
        if gpu is not None:
            out.setdefault(str(gpu["index"]), []).append(dev["uuid"])
    return out


def wait_selectors(gpus) -> list:
    """What a wait covers of ``gpus`` ([(GPU index, its MIG UUIDs a container has, or None: the whole GPU)], of every
    container counted): the whole GPUs' indexes, then the MIG UUIDs of the others (a GPU that one container has whole
    and another through MIG devices is waited for whole)."""
    whole, parts = set(), {}
    for gpu, uuids in gpus:
        if uuids:
            parts.setdefault(gpu, []).extend(u for u in uuids if u not in parts.get(gpu, []))
        else:
            whole.add(gpu)
    return sorted(whole) + [u for g in sorted(parts) if g not in whole for u in parts[g]]


def wait_cover(fence: dict):
    """What a wait after the fence (proxmox_gpu_containers' result ``fence``) covers (None: every GPU): the union of
    each running container's wait_gpus (the GPUs its workload held, when its config passes every GPU of a node whose
    other containers pass GPUs too; gpus_from says which), else the GPUs of its config; a container that has a GPU
    only through MIG devices (their capability nodes) gives those MIG devices (by MIG UUID), not the GPU's others.
    When none of the named containers runs: the GPUs of their configs."""
    running = list(fence.get("running") or [])
    rows = [c for c in fence.get("containers") or [] if c.get("vmid") in running]
    wait = {c["vmid"]: c.get("wait_gpus", c.get("gpus")) for c in rows}
    union = None if any(g is None for g in wait.values()) else sorted({i for g in wait.values() for i in g})
    migs = {c["vmid"]: c.get("wait_mig_devices") or {} for c in rows}
    if union is not None and any(migs.values()):
        union = wait_selectors([(g, migs[v].get(str(g))) for v, gs in wait.items() for g in gs])
    if not running and fence.get("gpus"):
        union = list(fence["gpus"])
    return union


def find(gpus, uuid):
    """(gpu, MIG device) of a MIG UUID (case-insensitive), or (None, None)."""
    for gpu in gpus:
        for dev in gpu.get("mig_devices") or []:
            if (dev.get("uuid") or "").lower() == str(uuid).lower():
                return gpu, dev
    return None, None


def scan_patterns(patterns, gpus) -> list:
    """``patterns`` (device_files) and, while a GPU has MIG devices, ``<dir>/nvidia-caps/nvidia-cap*`` beside each
    ``<dir>/nvidia*`` pattern: the capability nodes that tie a holder to its MIG device (a ``nvidia*`` glob does not
    look into the ``nvidia-caps`` directory)."""
    out = list(patterns or ())
    if not any(g.get("mig_devices") for g in gpus or ()):
        return out
    for pattern in patterns or ():
        folder, base = os.path.split(str(pattern))
        extra = os.path.join(folder, "nvidia-caps", "nvidia-cap*")
        if base in ("nvidia*", "nvidia-*") and extra not in out:
            out.append(extra)
    return out


def facts(dev: dict, gpu: dict, holders: list, max_memory_used_mib) -> dict:
    """A MIG device as the facts give it: the raw device's fields, its processes as pids, the holders of its
    capability nodes (pids) and ``idle``: no process, no unprotected holder of its nodes and no more memory used than
    max_memory_used_mib (None when its processes cannot be read)."""
    out = {k: dev.get(k) for k in ("uuid", "name", "profile", "gpu_instance_id", "compute_instance_id", "memory",
                                   "processes_error", "device_nodes")}
    out["gpu"] = gpu.get("index")
    out["processes"] = sorted(p["pid"] for p in dev.get("processes") or [])
    minors = {node_minor(n) for n in dev.get("device_nodes") or ()} - {None}
    mine = [h for h in holders if {node_minor(f) for f in h.get("files") or ()} & minors]
    out["holders"] = sorted({h["pid"] for h in mine})
    used = (dev.get("memory") or {}).get("used")
    if dev.get("processes_error"):
        out["idle"] = None
    else:
        out["idle"] = (not out["processes"] and not any(not h.get("protected") for h in mine)
                       and (used is None or max_memory_used_mib is None or used <= max_memory_used_mib))
    return out


def narrow(gpu: dict, uuids) -> None:
    """A GPU as far as its MIG devices ``uuids`` go (in place, before the idle verdict): its processes those on them,
    its holders those that hold their capability nodes (and the control-node holders every GPU lists), its memory
    theirs (summed), ``mig_selected`` their UUIDs, ``mig_unselected_pids`` the pids on its other MIG devices (which a
    GPU-wide view, nvidia-smi's process list, shows on it). Another MIG device's work is then no part of it: a release leaves
    it, a wait does not wait for it."""
    uuids = {u.lower() for u in uuids}
    processes = list(gpu.get("processes") or [])
    devs = [d for d in gpu.get("mig_devices") or [] if (d.get("uuid") or "").lower() in uuids]
    gpu["mig_selected"] = [d["uuid"] for d in devs]
    gpu["mig_devices"] = devs
    gpu["mig_unselected_pids"] = sorted({p["pid"] for p in gpu.get("processes") or []
                                         if p.get("mig_device") and p["mig_device"].lower() not in uuids})
    gpu["processes"] = [p for p in gpu.get("processes") or [] if (p.get("mig_device") or "").lower() in uuids]
    gpu["holders"] = [h for h in gpu.get("holders") or []
                      if {u.lower() for u in h.get("mig_devices") or ()} & uuids or h.get("evidence") == "control"]
    mem = dict(gpu.get("memory") or {})
    for key in ("total", "used", "free", "reserved"):
        values = [(d.get("memory") or {}).get(key) for d in devs]
        mem[key] = None if not values or any(v is None for v in values) else sum(values)
    gpu["memory"] = mem
    errors = [d["processes_error"] for d in devs if d.get("processes_error")]
    # A process the GPU lists on none of its MIG devices (their lists could not be read, or it came between the
    # reads) cannot be told to be the selected devices' or another's: kept, and the list is not trusted - the release
    # refuses rather than guess, the wait waits.
    unplaced = [p for p in processes if not p.get("mig_device")]
    if unplaced:
        gpu["processes"] += unplaced
        errors.append(f"processes could not be read per MIG device: the driver lists pid"
                      f" {', '.join(str(p['pid']) for p in unplaced)} on GPU {gpu.get('index')} and on none of its MIG"
                      " devices")
    if errors and not gpu.get("processes_error"):
        gpu["processes_error"] = errors[0]
