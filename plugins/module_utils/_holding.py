# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""THE holding model: what holds a GPU, what keeps it busy, and what a release may stop.

Pure; no I/O, no AnsibleModule. Every module, role table and report decides through this file.

Evidence, per process and GPU:

- ``context``: the driver lists the process on this GPU (it has a CUDA context there).
- ``device``: it holds this GPU's ``/dev/nvidiaN`` and the driver lists no context for it here.
  CUDA opens the device node of every GPU it can see when it initialises, so a device node
  alone does not place a process on a GPU.
- ``control``: it holds only the nodes every NVML or CUDA client holds (``nvidiactl``,
  ``nvidia-uvm``, ``nvidia-uvm-tools``, ``nvidia-modeset``, ``nvidia-caps/*``): a monitoring
  agent, an exporter, a notebook that imported torch.

Busy: health not ok; a context (visible from here or not); memory or utilization above the
thresholds; a process list that could not be read; or a ``device`` holder while the driver's
list cannot be trusted to be complete (unreadable, or memory in use beyond what the listed
contexts account for). A ``device`` holder of a GPU whose list is complete and whose memory is at
baseline is ``lingering``: reported, not busy. ``control`` holders never make a GPU busy. Ready,
beyond idle (``verdict``'s ``health_checks``, ``min_free_mib``, ``min_free_pct``): no failing health
check of those asked for (_health.CHECKS), and enough free memory for the next server.

Release targets for the selected GPUs: the processes with a context on one of them; the
``device`` holders of one of them, unless the driver shows that process with contexts only on
GPUs that are not selected; never a ``control``-only holder unless it is named in ``pids``.

MPS (docs.nvidia.com/deploy/mps): the control daemon (``nvidia-cuda-mps-control -d``) starts an
``nvidia-cuda-mps-server`` that owns the CUDA context on each GPU it serves; its clients' contexts run
inside it, and the driver lists the server on each of those GPUs and each client (``M+C``: compute and
MPS lists) on the GPU it uses. Releasing a job stops its clients; the server is signalled only when every
client it carries is a target of the release (mps_server_problem), and the control daemon never
(_snapshot.PROTECTED_NAMES). The server exits by itself once its last client has exited.
"""

from __future__ import annotations

import re

from ansible_collections.gpuops.gpu.plugins.module_utils import _health

CONTEXT = "context"
DEVICE = "device"
CONTROL = "control"
_GPU_NODE = re.compile(r"(?:^|/)nvidia(\d+)$")


def node_of(path: str):
    """('gpu', minor) for /dev/nvidiaN, ('control', None) for every other NVIDIA node."""
    m = _GPU_NODE.search(path)
    if m:
        return ("gpu", int(m.group(1)))
    return (CONTROL, None)


def placement(files, minors) -> dict:
    """How one holder's open NVIDIA nodes tie it to GPUs.

    ``minors``: {minor number: GPU index} from the backend, or None when it could not give them.
    Returns {"gpus": [indexes whose node it holds], "unplaced": bool} - ``unplaced`` when it
    holds a ``nvidiaN`` that cannot be tied to a GPU (no minor numbers), which then counts for
    every GPU so that none is called idle while something may hold it.
    """
    gpus = set()
    unplaced = False
    for path in files:
        kind, minor = node_of(path)
        if kind != "gpu":
            continue
        if minors is None or minor not in minors:
            unplaced = True
        else:
            gpus.add(minors[minor])
    return {"gpus": sorted(gpus), "unplaced": unplaced}


def evidence_on(gpu_index: int, pid: int, context_pids, placed) -> str:
    """The evidence a holder has on one GPU (see the module docstring)."""
    if pid in context_pids:
        return CONTEXT
    if placed["unplaced"] or gpu_index in placed["gpus"]:
        return DEVICE
    return CONTROL


MPS_SERVER = "nvidia-cuda-mps-server"
MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_COMM = "nvidia-cuda-mps"  # both names, cut to the 15 bytes of comm (/proc/<pid>/comm)
MPS_QUIT = "echo quit | nvidia-cuda-mps-control"


def is_mps_client(proc: dict) -> bool:
    """Whether the driver lists the process in its MPS list (type C(compute+mps)): an MPS client."""
    return "mps" in (proc.get("type") or "").split("+")


def is_mps_server(proc: dict) -> bool:
    """Whether a process that the driver lists with a context is an MPS server: named nvidia-cuda-mps-server
    (argv[0], or comm when the command line is not known: the control daemon, whose comm is the same, has no
    context), and not itself an MPS client. ``cmdline``: the raw one (_snapshot.build)."""
    if is_mps_client(proc):
        return False
    argv0 = ((proc.get("cmdline") or "").split(" ", 1)[0]).rsplit("/", 1)[-1]
    name = proc.get("name") or ""
    return MPS_SERVER in (argv0, name) or (name == MPS_COMM and argv0 in ("", MPS_COMM))


def mps_servers(gpus: list) -> dict:
    """{server pid: {"gpus": [indexes it is listed on], "clients": [{pid, start_time, gpus, visible}]}} over a
    whole snapshot (every GPU, not only the selected ones).

    A client is an MPS client the driver lists on a GPU the server is listed on: one control daemon runs one
    server (per user) for the GPUs it serves, and the clients on them connect to it (nvidia-cuda-mps-control(1)).
    Two servers listed on one GPU both count its clients (neither is signalled for the other's).
    """
    servers = {}
    for g in gpus:
        for p in g.get("processes") or []:
            if p.get("visible") is not False and is_mps_server(p):
                entry = servers.setdefault(p["pid"], {"gpus": [], "clients": [], "container": p.get("container")})
                if g["index"] not in entry["gpus"]:
                    entry["gpus"].append(g["index"])
    for pid, entry in servers.items():
        clients = {}
        for g in gpus:
            if g["index"] not in entry["gpus"]:
                continue
            for p in g.get("processes") or []:
                if p["pid"] != pid and is_mps_client(p):
                    c = clients.setdefault(p["pid"], {"pid": p["pid"], "start_time": p.get("start_time"), "gpus": [],
                                                      "visible": p.get("visible"), "container": p.get("container")})
                    c["gpus"].append(g["index"])
        entry["gpus"].sort()
        entry["clients"] = [clients[k] for k in sorted(clients)]
    return servers


def _gpu_text(indexes) -> str:
    indexes = sorted(indexes)
    return ("GPU " if len(indexes) == 1 else "GPUs ") + ", ".join(map(str, indexes))


def _client_text(c: dict, why: str = "") -> str:
    """'pid 812 on GPU 1 (in CT 130, not selected)': an MPS client, the GPUs it uses, where it lives (a container, the
    node; nothing when it is not visible from here) and ``why``."""
    ct = (c.get("container") or {}).get("id")
    where = [f"in CT {ct}" if ct is not None else ("on the node" if c.get("visible") is not False else ""), why]
    said = ", ".join(w for w in where if w)
    return f"pid {c['pid']} on {_gpu_text(c['gpus'])}" + (f" ({said})" if said else "")


def mps_quit_text(server: dict) -> str:
    """The control daemon's way to end an MPS server (never a kill: its clients' contexts run inside it), where the
    server lives (its mps_servers() entry's ``container``)."""
    ct = (server.get("container") or {}).get("id")
    where = f"`pct exec {ct} -- sh -c '{MPS_QUIT}'`" if ct is not None else f"`{MPS_QUIT}` on the node"
    return (f"it exits by itself once its last client has exited (stop those clients where they run); when all its"
            f" clients are done, stop MPS the control daemon's way ({where}, as the user that started it). Never kill"
            " the server: that ends the work of every client it carries")


def mps_server_problem(server: dict, selected, is_target) -> str:
    """Why a release must not signal an MPS server ('' when it may): the contexts of its clients run inside
    it, so its end is theirs. ``server``: its mps_servers() entry; ``selected``: the release's GPU indexes;
    ``is_target((pid, start_time))``: whether a client is a target of this release.

    It may be signalled only when every client it carries is a target; with no client listed at all, only
    when it serves no GPU outside the release (a driver without the MPS list shows the server, not its
    clients: there may be clients on those GPUs)."""
    selected = set(selected)
    outside = []
    for c in server.get("clients") or []:
        if is_target((c["pid"], c.get("start_time"))):
            continue
        if c.get("visible") is False:
            why = "not visible from here"
        elif not set(c["gpus"]) & selected:
            why = "not selected"
        else:
            why = "outside the scope of this release"
        outside.append(_client_text(c, why))
    todo = "Left running: " + mps_quit_text(server)
    if outside:
        return ("an MPS server (" + MPS_SERVER + "): the CUDA contexts of its clients run inside it, so signalling it"
                " would end the work of client " + "; ".join(outside) + " too. " + todo)
    unserved = sorted(set(server.get("gpus") or ()) - selected)
    if not server.get("clients") and unserved:
        return (f"an MPS server ({MPS_SERVER}) that also serves {_gpu_text(unserved)}, not selected, and no MPS client"
                " is listed: it may carry clients there that the driver does not list (without the MPS list a driver"
                " shows the server instead of its clients). " + todo)
    return ""


def mps_server_text(server: dict) -> str:
    """What a wait says of an MPS server that keeps a GPU busy (its mps_servers() entry, with its clients)."""
    clients = server.get("clients") or []
    carried = ("it carries client " + "; ".join(_client_text(c) for c in clients) if clients
               else "no MPS client is listed")
    return (f"an MPS server ({MPS_SERVER}) on {_gpu_text(server.get('gpus') or ())}: {carried}. Its context stays on"
            " every GPU it serves until it exits; gpu_release leaves it running while it carries a client outside the"
            " release: " + mps_quit_text(server))


def stop_advice(proc: dict) -> str:
    """How to stop a holder where it runs (the one place every message takes it from): an MPS server never by a kill
    (mps_server_text: its clients, where they live, and the control daemon's way); a process in a container inside it
    (`pct exec`, by its pid there); a process on the node itself there, not through a container."""
    if proc.get("mps_server"):
        return mps_server_text(proc["mps_server"])
    ct = proc.get("container") or {}
    if ct.get("id") is not None:
        inner = ct.get("pid_in_container")
        return f"stop it in CT {ct['id']} (`pct exec {ct['id']} -- kill {inner or '<its pid in the container>'}`)"
    how = f"systemctl stop {proc['unit']}" if proc.get("unit") else f"kill {proc['pid']}"
    return f"it runs on the node itself, in no container: stop it on the node (`{how}`)"


def describe(proc: dict) -> str:
    """'pid 8812 (python3) in CT 129' - how messages name a process; a driver pid that is not a process from here (or
    not verified to be it: unverified_pids) by its pid only, and why."""
    if proc.get("visible") is False:
        return f"pid {proc['pid']} (" + ("not verified here: a driver may report host pids" if proc.get("unverified")
                                         else "not visible from here") + ")"
    where = ""
    ct = proc.get("container")
    if ct:
        where = f" in CT {ct['id']}"
    name = proc.get("name")
    return f"pid {proc['pid']}" + (f" ({name})" if name else "") + where


def mib_text(value) -> str:
    if value is None:
        return "unknown"
    return f"{value / 1024:.0f} GiB" if value >= 10240 else f"{value} MiB"


def accounted_mib(gpu: dict) -> int:
    return sum(p.get("used_mib") or 0 for p in gpu.get("processes") or [])


def list_incomplete(gpu: dict, max_memory_used_mib: int) -> str:
    """Why the driver's process list of a GPU cannot be trusted to be complete, or ''."""
    if gpu.get("processes_error"):
        return gpu["processes_error"]
    used = (gpu.get("memory") or {}).get("used")
    if used is not None and used - accounted_mib(gpu) > max_memory_used_mib:
        return f"{used - accounted_mib(gpu)} MiB in use that the listed processes do not account for"
    return ""


def _unprotected(holders, evidence):
    return [h for h in holders if h.get("evidence") == evidence and not h.get("protected")]


def unaccounted_memory(used: int, index, in_container=None) -> str:
    """What is true of memory in use with no process listed, by where the module runs.

    In the host's PID namespace every process is visible: nothing holds the memory. In a
    container (or when it cannot be told) the holder may be a process this namespace cannot see.
    """
    if in_container is False:
        return (f"{used} MiB used and no process holds it: the driver is still freeing the memory of exited"
                f" processes, or a context leaked (nvidia-smi -r -i {index} resets it once nothing holds it)")
    return (f"{used} MiB used by processes not visible from this PID namespace (another container or the host),"
            " or a leaked context")


def verdict(gpu: dict, max_memory_used_mib: int, max_utilization_pct=None, include_device_holders=True,
            in_container=None, contexts=None, min_free_mib=None, min_free_pct=None, health_checks=(), backend=None):
    """(idle, busy_reasons, blockers, lingering) of one GPU of a snapshot.

    Ready for the next server, beyond idle: a failing health check named in ``health_checks``
    (_health.CHECKS) and free memory below what ``min_free_mib`` / ``min_free_pct`` ask
    (_health.fit) are busy reasons too, each saying what to do.

    ``blockers``: the processes that keep it busy (contexts, and device holders when the list is
    incomplete); ``lingering``: device holders that do not. ``contexts`` ({pid: GPU indexes the
    driver lists it on}, context_gpus of the whole snapshot): a device holder that the driver lists
    on other GPUs only, while this GPU's own list was read, holds this node as CUDA does for every
    GPU it sees - memory here that the list does not account for is not its (a leak, or a process
    this namespace cannot see), so it lingers, and the diagnosis names the memory.
    """
    health = gpu.get("health") or {}
    reasons = [f"health {health.get('status')}: {health.get('detail')}"] if health.get("status", "ok") != "ok" else []
    if gpu.get("processes_error"):
        reasons.append(gpu["processes_error"])
    procs = gpu.get("processes") or []
    blockers = list(procs)
    reasons += [_process_reason(p) for p in procs]
    lingering = []
    if include_device_holders:
        held, lingering = _device_verdicts(gpu, max_memory_used_mib, contexts)
        blockers += [h for h, _why in held]
        reasons += [why for _h, why in held]
    reasons += _load_reasons(gpu, max_memory_used_mib, max_utilization_pct, in_container, procs)
    for failure in _health.failed_checks(gpu, health_checks):
        if failure["blocking"]:
            reasons.append(f"health check {failure['check']} failed: {failure['detail']}: {failure['action']}")
    short = _health.fit_text(gpu, _health.fit(gpu, min_free_mib, min_free_pct, backend))
    if short:
        reasons.append(short)
    return (not reasons, reasons, blockers, lingering)


def _process_reason(p: dict) -> str:
    if p.get("visible", True):
        return (f"used by {describe(p)}" + (f", {mib_text(p.get('used_mib'))}" if p.get("used_mib") is not None else "")
                + (f": {mps_server_text(p['mps_server'])}" if p.get("mps_server") else ""))
    if p.get("unverified"):
        return f"used by pid {p['pid']}: {p['unverified']}"
    return (f"used by pid {p['pid']}, which does not exist from here (a process in another PID"
            " namespace: the host or another container)")


def _device_verdicts(gpu: dict, max_memory_used_mib: int, contexts) -> tuple:
    """([(holder, reason)] of the device holders that keep the GPU busy - its list may be incomplete - and
    [lingering holders]): a holder the driver lists on other GPUs only, while this GPU's list was read, lingers."""
    incomplete = list_incomplete(gpu, max_memory_used_mib)
    held, lingering = [], []
    for h in _unprotected(gpu.get("holders") or [], DEVICE):
        elsewhere = (contexts or {}).get(h["pid"]) or set()
        if incomplete and not (elsewhere and gpu.get("index") not in elsewhere and not gpu.get("processes_error")):
            held.append((h, f"device file held by {describe(h)} ({', '.join(h.get('files') or [])}), and the"
                            f" driver's list may be incomplete ({incomplete})"))
        else:
            lingering.append(h)
    return held, lingering


def _load_reasons(gpu: dict, max_memory_used_mib: int, max_utilization_pct, in_container, procs) -> list:
    """Memory in use above the threshold that no listed process accounts for, and utilization above its bound."""
    out = []
    used = (gpu.get("memory") or {}).get("used")
    if used is not None and used > max_memory_used_mib:
        if gpu.get("processes_error"):
            out.append(f"{used} MiB used")
        elif not procs:
            out.append(unaccounted_memory(used, gpu.get("index"), in_container))
    util = (gpu.get("utilization") or {}).get("gpu")
    if max_utilization_pct is not None and util is not None and util > max_utilization_pct:
        out.append(f"utilization {util}% (more than {max_utilization_pct}%)")
    return out


def holders_of(gpu: dict) -> list:
    """What keeps a GPU busy, by the holding model (verdict, in the snapshot's ``blockers``)."""
    wanted = set(gpu.get("blockers") or ())
    out, seen = [], set()
    for p in list(gpu.get("processes") or []) + list(gpu.get("holders") or []):
        if p["pid"] in wanted and p["pid"] not in seen:
            seen.add(p["pid"])
            out.append(p)
    return out


def context_gpus(gpus: list) -> dict:
    """{pid: set of GPU indexes on which the driver lists it} over a whole snapshot."""
    out = {}
    for g in gpus:
        for p in g.get("processes") or []:
            out.setdefault(p["pid"], set()).add(g["index"])
    return out


def container_gpus(gpus: list) -> dict:
    """{container id: set of GPU indexes} that the containers' processes hold, over a snapshot (_snapshot.build): a
    context there, or that GPU's ``/dev/nvidiaN`` open (``device`` evidence - a node that cannot be placed counts on
    every GPU). Control nodes alone hold no GPU. What a container whose passthrough cannot be read holds (the fence)."""
    out = {}
    for g in gpus:
        held = list(g.get("processes") or []) + [h for h in g.get("holders") or () if h.get("evidence") in (CONTEXT, DEVICE)]
        for p in held:
            ct = (p.get("container") or {}).get("id")
            if ct is not None:
                out.setdefault(ct, set()).add(g["index"])
    return out


def workload_gpus(gpus: list) -> dict:
    """{container id: set of GPU indexes} that the containers' processes keep busy by the holding model, over a snapshot
    (_snapshot.build, or a result's GPUs through _snapshot.expand_gpus): the GPU's ``blockers`` - a context there, or
    its ``/dev/nvidiaN`` open while its process list cannot be trusted. Unlike container_gpus, the nodes CUDA opens of
    every GPU it can see do not count (they hold no memory): what a container whose config passes every GPU holds (the
    fence)."""
    out = {}
    for g in gpus:
        for p in holders_of(g):
            ct = (p.get("container") or {}).get("id")
            if ct is not None:
                out.setdefault(ct, set()).add(g["index"])
    return out


NOT_SIGNALLED_UNVERIFIED = ": not signalled. Run gpu_release on the host (the Proxmox node) to release it"


def unverified_pids(gpus: list, host_namespace) -> dict:
    """{pid: reason} for the driver pids that cannot be confirmed to be the process the driver means, wherever a pid
    is named (the facts, the wait's diagnosis, the release's gate).

    In the host's PID namespace the driver's pids are this namespace's pids. Elsewhere (a container) a driver may
    report host pids, and the same number may name an unrelated process here: a pid is then confirmed only by that
    process holding the GPU's device node (a context's process holds it: CUDA opens it)."""
    if host_namespace:
        return {}
    out = {}
    for gpu in gpus:
        on_node = {h["pid"] for h in gpu.get("holders") or [] if h.get("evidence") in (CONTEXT, DEVICE)}
        for p in gpu.get("processes") or []:
            if p.get("visible") is False or p["pid"] in on_node:
                continue
            out[p["pid"]] = (f"the driver reports pid {p['pid']} on GPU {gpu['index']}, but from this PID namespace it"
                             f" cannot be confirmed to be that process (it does not hold /dev/nvidia"
                             f"{gpu.get('minor_number', gpu['index'])}; a driver may report host pids here)")
    return out


def release_candidates(all_gpus: list, selected: set, include_device_holders=True, named_pids=()):
    """(candidates, skipped) for a release of the GPUs with indexes in ``selected``.

    ``candidates``: process dicts merged by pid with ``gpus`` (selected GPUs it holds) and
    ``evidence`` (the strongest it has on them); ``skipped``: the holders that are not taken,
    each with its ``reason``.
    """
    found = _Candidates(context_gpus(all_gpus), selected, named_pids)
    for gpu in all_gpus:
        if gpu["index"] not in selected:
            continue
        for p in gpu.get("processes") or []:
            if p.get("visible") is False:
                found.skip(p, (p["unverified"] + NOT_SIGNALLED_UNVERIFIED) if p.get("unverified") else (
                    "the driver reports this pid but it does not exist from this PID namespace (run on the host /"
                    " Proxmox node to reach it)"))
                continue
            found.take(p, gpu["index"], CONTEXT)
        for h in (gpu.get("holders") or []) if include_device_holders else ():
            found.holder(h, gpu["index"])
    return list(found.merged.values()), list(found.skipped.values())


class _Candidates:
    """What release_candidates gathers: the candidates merged by pid (``merged``) and the holders not taken
    (``skipped``, each with its reason)."""

    ORDER = {CONTEXT: 0, DEVICE: 1, CONTROL: 2}

    def __init__(self, contexts: dict, selected: set, named_pids):
        self.contexts, self.selected, self.named = contexts, selected, set(named_pids or ())
        self.merged, self.skipped = {}, {}

    def take(self, proc, gpu_index, evidence, why=None):
        entry = self.merged.setdefault(proc["pid"], dict(proc, gpus=[], evidence=evidence))
        if self.ORDER[evidence] < self.ORDER[entry["evidence"]]:
            entry["evidence"] = evidence
            entry["gpus"] = []  # the GPUs of its strongest evidence: where it has a context, if any
        if evidence == entry["evidence"] and gpu_index not in entry["gpus"]:
            entry["gpus"].append(gpu_index)
        if why:
            entry["why"] = why
        self.skipped.pop(proc["pid"], None)

    def skip(self, proc, reason):
        if proc["pid"] not in self.merged:
            self.skipped.setdefault(proc["pid"], dict(proc, gpus=[], reason=reason))

    def holder(self, h: dict, gpu_index: int) -> None:
        """A device-file holder of a selected GPU: its node (unless the driver shows its context only elsewhere), or
        only the control nodes (taken when named in pids)."""
        ev = h.get("evidence")
        if ev == CONTEXT:
            return  # listed from the driver
        if ev == DEVICE:
            elsewhere = self.contexts.get(h["pid"], set())
            if elsewhere and not elsewhere & self.selected:
                self.skip(h, "holds this GPU's device node as CUDA does for every GPU it can see, but the driver"
                             " shows its context only on GPU(s) " + ", ".join(map(str, sorted(elsewhere)))
                             + ", which are not selected")
                return
            self.take(h, gpu_index, DEVICE)
        elif h["pid"] in self.named:
            self.take(h, gpu_index, CONTROL, why="named in pids; it holds only the NVIDIA control nodes ("
                      + ", ".join(h.get("files") or []) + ") and has no context on a selected GPU")
        else:
            self.skip(h, "holds only the NVIDIA control nodes (" + ", ".join(h.get("files") or [])
                         + "), as every NVML or CUDA client does; it has no context on a selected GPU and keeps"
                           " none busy. Name it in pids to stop it")


# Processes that start and watch others: a workload's root is never above one of them.
SUPERVISORS = ("systemd", "supervisord", "runsv", "runsvdir", "tini", "containerd-shim", "containerd-shim-runc-v2",
               "conmon", "docker-init", "dumb-init", "s6-supervise", "lxc-start", "init")


def workload_ancestors(proc: dict, read, stop_reason):
    """The ancestors that belong to the workload of a holder: [(ancestor, why)], nearest first.

    Walks up from ``proc`` while the parent is in the same cgroup, is not PID 1 of its PID
    namespace, not a known supervisor, and ``stop_reason(parent)`` is '' (not protected, not an
    ancestor of the module). A session leader with a controlling terminal (a login shell, a tmux
    pane) is never joined; one without a terminal (a server that daemonized with setsid) is the
    workload's root: it joins, and the walk ends there.
    ``read(pid) -> dict|None`` gives ppid, name, cgroup, session, tty_nr and ns_pid.
    """
    out = []
    seen = {proc["pid"]}
    child = proc
    while True:
        ppid = child.get("ppid")
        if not ppid or ppid in seen:
            return out
        parent = read(ppid)
        if parent is None or parent.get("kernel_thread"):
            return out
        seen.add(ppid)
        if parent["pid"] == 1 or parent.get("ns_pid") == 1:
            return out
        if parent.get("cgroup") is None or parent.get("cgroup") != proc.get("cgroup"):
            return out
        if (parent.get("name") or "") in SUPERVISORS or stop_reason(parent):
            return out
        leader = parent.get("session") == parent["pid"]
        if leader and parent.get("tty_nr"):
            return out
        out.append((parent, f"parent of pid {child['pid']} in the same cgroup ({proc.get('cgroup')})"
                            + (", the root of its session" if leader else "")))
        if leader:
            return out
        child = parent


_GLOB = re.compile(r"[*?\[]")


def device_pattern_problem(pattern: str) -> str:
    """Why a device_files pattern does not name NVIDIA device nodes ('' when it does).

    A pattern must be an absolute path whose last component starts with ``nvidia`` (``/dev/nvidia*``,
    ``/dev/nvidia3``, a simulator's ``/tmp/x/dev/nvidia*``) or that lies in ``nvidia-caps/``, with
    no glob and no ``..`` in its directory part: anything else could match files that every
    process of the machine holds (``/dev/null*``, ``/dev/pts/*``, ``/dev/*``).
    """
    if not pattern.startswith("/"):
        return "must be an absolute path or glob (like /dev/nvidia*)"
    head, _sep, base = pattern.rpartition("/")
    parts = head.split("/")
    if ".." in parts or "." in parts:
        return "must not contain '.' or '..' components"
    if _GLOB.search(head):
        return "must not have a glob in its directory part"
    if not (base.startswith("nvidia") or parts[-1] == "nvidia-caps"):
        return "must name NVIDIA device nodes (a file name starting with nvidia, like /dev/nvidia*)"
    return ""
