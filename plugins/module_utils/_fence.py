# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The fence of Proxmox VE containers, on the node, in one module run (proxmox_gpu_containers).

``Fence.run()``: find the containers from the node's files and the kernel, in this process (``/etc/pve/.vmlist``,
the LXC monitors' sockets in ``/proc/net/unix``, the configs ``/etc/pve/lxc/<vmid>.conf`` of the running ones, or of
those named, within one time limit): no ``pct``, whose every start loads the PVE libraries; tie their passthrough to
GPU indexes, read and stop the named
services (``pct exec <vmid> -- systemctl``, each under a time limit), and then shut the containers down
(state shutdown) or release the GPU holders in them through the release path (state released).

Its I/O is injected (``_host.node_io.NodeIO`` on a node, ``_host.protocols.NodeHost``): ``node()``, ``config(vmid)``,
``where()``, ``pct(argv, timeout, what)``, ``pct_calls()``, ``gpus()``, ``look()`` (a full snapshot: what the
containers' processes hold is _holding's to say), ``take_locks(vmids)`` (what it waited for, empty when it did not), ``gpu_locks``,
``release_io`` (the release's host), ``background``, ``run_all``, ``warn`` and ``now``; the unit tests give it a fake
node (test__fence.FakeNode). The fence runs the release itself (``_release.run_release``) with the options it builds
(``release_options``).
"""

from __future__ import annotations

import os

from ansible_collections.gpuops.gpu.plugins.module_utils import (
    _errors, _health, _holding, _mig, _pct, _release, _selection, _snapshot, _validate)

STATES = ("present", "released", "shutdown")
PCT_TIMEOUT = 30.0
# pct is a Perl program that loads the PVE libraries at each start (tests/gpusim/README.md, "What pct costs"):
# the systemctl calls in containers run a few at a time.
CONFIG_WORKERS = 8

# gpu_release's options that the fence does not take: it releases every GPU holder of the running containers,
# with their workloads (tree).
RELEASE_FIXED = dict(users=None, match=None, pids=None, exclude=None, tree=True, all=False, expected_count=None)


class FenceFailed(_errors.GpuError):
    """A step of the fence failed; ``kind`` says which (pct_not_found, pct_failed, pve_unavailable, no_such_container,
    container_timeout, service_state_unknown, service_stop_failed, shutdown_failed)."""

    def __init__(self, kind: str, msg: str, **details):
        super().__init__(msg, **details)
        self.kind = kind


def describe(vmids) -> str:
    return ", ".join(str(v) for v in vmids) if vmids else "none"


def refuse_missing(selected, vmids) -> None:
    """The one refusal of a ``containers`` option that names a container this node does not have (the fence's and
    gpu_release's): FenceFailed(no_such_container), before anything is stopped. ``vmids``: the node's containers."""
    missing = [v for v in selected or () if v not in vmids]
    if missing:
        raise FenceFailed("no_such_container", f"containers: no container {describe(missing)} on this node (its"
                                               f" containers: {describe(vmids)}). Nothing was stopped.", missing=missing)


def check_node_containers(node, selected) -> None:
    """gpu_release's ``containers`` against the node's containers (``node``: a _host.node_io.NodeIO), refused as the fence refuses
    them (refuse_missing); where no Proxmox VE node can be read (a plain host, a VM, a container) nothing is checked:
    the option then names cgroups that may hold no process yet."""
    if not selected:
        return
    try:
        vmids, _running = node.node()
    except FenceFailed as exc:
        if exc.kind == "pve_unavailable":
            return
        raise
    refuse_missing(selected, vmids)


def _said(rc, out, err) -> str:
    return (err or out or "").strip()[:300] or f"rc {rc}"


def draining_gpus(looked, stopped) -> list:
    """The GPUs whose process list was complete before the services were stopped (``looked``, a raw look), when
    one stopped: memory in use there with no listed process right after is theirs, still being freed - the
    release must not take it for a hidden holder's and signal a device holder with no context (a notebook
    kernel that imported torch) for it."""
    if not looked or not any(s.get("rc") == 0 for s in stopped):
        return []
    return sorted(g["index"] for g in looked
                  if not _holding.list_incomplete(g, _snapshot.DEFAULT_MAX_MEMORY_USED_MIB))


class Discovery:
    """The fence's first step: which containers it fences and their GPUs (``containers()``), from the node's files and
    the kernel; after the release, what a wait must cover of each (``cover``). Pending passthrough changes go to
    ``result['pending_passthrough']``."""

    def __init__(self, params: dict, io, result: dict):
        self.p = params
        self.io = io
        self.result = result
        self._node_state = (set(), None)   # the running vmids and the discovery's deadline (containers)
        self._configs = {}                 # the parsed configs read, and those of other running containers read later
        self._shared = {}                  # {vmid: the other running containers that pass GPUs}: see cover
        self._holding = {}                 # {vmid: GPU indexes} its processes kept busy at the discovery (cover)
        self.looked = None                 # a full snapshot's GPUs, when what the processes hold is asked (_look)
        self._node_gpus = None             # the node's GPUs as the discovery read them (None: not read)

    def _within(self, deadline, read):
        """``read()`` in the background, waited for until ``deadline``: a read of /etc/pve blocks while pmxcfs hangs, and
        the module must still answer (the read is abandoned: it never holds the module's exit)."""
        job = self.io.background(read, what="reading the node's containers")
        try:
            return job.result(max(0.0, deadline - self.io.now()))
        except _errors.QueryTimeout as exc:
            if exc.details.get("call") != job.what:
                raise
            raise FenceFailed(
                "container_timeout",
                f"reading the node's containers ({self.io.where()}) did not finish within pct_timeout"
                f" ({self.p['pct_timeout']:g} s): the cluster filesystem (pmxcfs) hangs or the node is overloaded"
                " (systemctl status pve-cluster). Nothing was stopped.") from None

    def _look(self) -> list:
        """A full snapshot's GPUs (``io.look()``), taken once: what the containers' processes hold (_holding)."""
        if self.looked is None:
            self.looked = self.io.look()
        return self.looked

    def _held(self) -> tuple:
        """({vmid: GPU indexes}, {vmid, None for the node: MIG UUIDs}) the containers' processes hold now, from one full
        snapshot (_holding.container_gpus, _mig.held); (None, None) with a warning when it cannot be taken (state
        released: the error)."""
        try:
            look = self._look()
        except _errors.GpuError as exc:
            if self.p["state"] == "released":
                raise
            self.io.warn(f"cannot read what the containers' processes hold ({exc.msg}): their GPUs are their configs'")
            return None, None
        return _holding.container_gpus(look), _mig.held(look)

    def gpus(self):
        """The node's GPUs (``io.gpus()``, read once); when the driver cannot be read: the error for a fence that
        releases, else None with a warning (each container's gpus is then null)."""
        try:
            return self.io.gpus()
        except _errors.GpuError as exc:
            if self.p["state"] == "released":
                raise
            self.io.warn(f"cannot read the GPUs ({exc.msg}): each container's gpus is null (its GPUs cannot be told)")
            return None

    def _read_node(self) -> tuple:
        """(the node's vmids, the running ones, {vmid: config file text} of the containers to read)."""
        vmids, running = self.io.node()
        selected = self.p["containers"]
        refuse_missing(selected, vmids)
        wanted = selected or [v for v in vmids if v in running or self.p["include_stopped"]]
        texts = {}
        for vmid in wanted:
            text = self.io.config(vmid)
            if text is None and vmid in selected:
                raise FenceFailed("no_such_container", f"containers: CT {vmid}'s config is gone (destroyed or migrated"
                                                       " meanwhile?). Nothing was stopped.", missing=[vmid])
            if text is not None:
                texts[vmid] = text
        return vmids, running, texts

    def containers(self) -> list:
        """The selected containers' rows (the result's ``containers``), from the node's files and the kernel, not
        ``pct`` (a Perl program that loads the PVE libraries at each start): which containers the node has
        (``/etc/pve/.vmlist``), which run (their LXC monitors' sockets), their configs (``/etc/pve/lxc/<vmid>.conf``).
        A running container is read as it runs (``pct config --current``: the current keys), and its pending changes
        compared with that; a stopped one with its pending changes applied (what ``pct config`` shows, what it gets at
        its start). Stopped containers are read only when named or with include_stopped."""
        deadline = self.io.now() + self.p["pct_timeout"]
        _vmids, running, texts = self._within(deadline, self._read_node)
        listed, configs = {}, {}
        self._node_state = (running, deadline)
        for vmid, text in texts.items():
            conf = _pct.parse_conf_file(text)
            up = vmid in running
            listed[vmid] = _pct.list_row(vmid, _pct.config_keys(conf, True), up)
            config = _pct.parse_config(_pct.config_view(conf, current=up))
            if up:
                self._pending(vmid, config, _pct.parse_config(_pct.config_view(conf, current=False)))
            if up:
                self._configs[vmid] = config
            if self.p["containers"] or config["passthrough"] or config["unknown"] or up:
                configs[vmid] = config  # a running one without passthrough lines: its processes may hold GPUs (_rows)
        return self._rows(listed, configs)

    def _pending(self, vmid, current, pending) -> None:
        change = _pct.passthrough_changes(current, pending)
        if change:
            self.result["pending_passthrough"].append(dict(vmid=vmid, **change))
            self.io.warn(f"CT {vmid} has pending changes to its NVIDIA passthrough (removed:"
                         f" {describe(change['removed'])}; added: {describe(change['added'])}): it keeps its current"
                         " devices until it restarts. The GPUs reported are those it has now.")

    def _node_view(self, configs, up) -> tuple:
        """What the rows need of the node: its GPUs (None: not read), {minor: index}, {index: uuid}, whether every GPU's
        minor is known, and what the running containers' processes hold (GPUs, MIG devices; None: not looked)."""
        gpu_minors = uuids = node_gpus = held = held_mig = None
        complete = False
        caps = any(_mig.node_minor(d) is not None for c in configs.values() for d in c.get("devices") or ())
        # A running container holds what its processes hold, whatever its config passes (none: edited while it runs):
        # the kernel is asked whenever one runs, not only when another container's config passes GPUs.
        if any(c["minors"] or c["visible"] or c["mig_all"] for c in configs.values()) or up or caps:
            node_gpus = self.gpus()
            if node_gpus is not None:
                gpu_minors = {g["minor_number"]: g["index"] for g in node_gpus if g.get("minor_number") is not None}
                uuids = {g["index"]: g.get("uuid") for g in node_gpus}
                complete = len(gpu_minors) == len(node_gpus)
                if up or any(c["mig_all"] for c in configs.values()):
                    # The kernel has the last word on what a running container holds (its processes' contexts, the
                    # device and capability nodes they hold open): one look, the snapshot's attribution.
                    held, held_mig = self._held()
        self._node_gpus = node_gpus
        return node_gpus, gpu_minors, uuids, complete, held, held_mig

    def _rows(self, listed, configs) -> list:
        up = {v for v in configs if listed[v]["status"] == "running"}
        node_gpus, gpu_minors, uuids, complete, held, held_mig = self._node_view(configs, up)
        rows = []
        for vmid, config in configs.items():
            row = listed[vmid]
            running = row["status"] == "running"
            if not (config["passthrough"] or config["unknown"] or self.p["containers"] or (held or {}).get(vmid)):
                continue  # running, passes nothing and holds nothing
            gpus = self._minor_gpus(vmid, config, gpu_minors, complete)
            gpus = self._toolkit_gpus(vmid, config, gpus, node_gpus)
            beyond = []
            if config["unknown"]:
                gpus = self._held_gpus(vmid, config, gpus, running, held)
                if gpus == [] and config["passthrough"] is None and not self.p["containers"]:
                    continue  # nothing of it holds a GPU: nothing to fence (the warning says so)
            elif running and held is not None and gpus is not None:
                gpus, beyond = self._kernel_gpus(vmid, gpus, held.get(vmid, set()))
            minors = config["minors"]
            if gpus and gpu_minors and (config["visible"] or config["unknown"] or beyond) and minors is not None:
                index_minor = {i: m for m, i in gpu_minors.items()}
                minors = sorted(set(minors) | {index_minor[i] for i in gpus if i in index_minor})
            if running and _passes_every_gpu(config, gpus, node_gpus):
                sharers = self._sharers(vmid)
                if sharers:
                    self._shared[vmid] = sharers
            mig = self._mig_devices(vmid, config, node_gpus, gpus, held_mig)
            rows.append(dict(
                vmid=vmid, name=row["name"] or config["hostname"] or "", status=row["status"], lock=row["lock"],
                running=running, passthrough=config["passthrough"], minors=minors,
                gpus=gpus, gpu_uuids=None if gpus is None else [uuids[i] for i in gpus], gpus_beyond_config=beyond,
                mig_devices=mig, wait_mig_devices=_mig.by_gpu(node_gpus, mig),
                passthrough_unknown=list(config["unknown"]), gpus_from="config", wait_gpus=gpus))
        if self._shared:
            self._holding = _holding.workload_gpus(self._look())
        return rows

    def mig_mode_pending(self, scope) -> None:
        """A warning for each GPU of the fence's scope (``scope``: indexes, None for every GPU) whose MIG mode changes
        at its next reset (_health's mig_mode_pending): the next server may meet a GPU split, or whole, unlike now."""
        for gpu in self._node_gpus or ():
            if scope is None or gpu["index"] in scope:
                for check in _health.failed_checks(gpu):
                    if check["check"] == "mig_mode_pending":
                        self.io.warn(f"GPU {gpu['index']}: {check['detail']}; {check['action']}")

    def _file(self, vmid) -> str:
        return os.path.join(self.io.where(), "lxc", f"{int(vmid)}.conf")

    def _kernel_gpus(self, vmid, gpus, mine) -> tuple:
        """(its GPUs, those beyond its config): a running container's GPUs are those its config passes and those its
        processes hold (a context, the GPU's /dev/nvidiaN open) - a config edited while it runs (a hand edit, an
        ``lxc.*`` line: PVE keeps no pending change of those) no longer says what it has; a warning names the
        difference and the file."""
        beyond = sorted(set(mine) - set(gpus))
        if beyond:
            self.io.warn(f"CT {vmid}'s processes hold GPU {describe(beyond)}, which its config {self._file(vmid)} does"
                         f" not pass (edited while it runs?): fenced as its GPUs, with those of its config"
                         f" (GPU {describe(gpus)}); the config takes effect at its next start")
        return sorted(set(gpus) | set(beyond)), beyond

    def _minor_gpus(self, vmid, config, gpu_minors, complete: bool):
        """The GPU indexes of the /dev/nvidiaN minors the config passes ([] none, None when they cannot be told); a
        minor no GPU has is warned about (a stale line), and with minors missing from the driver the GPUs are None."""
        if config["minors"] == []:
            return []
        if config["minors"] is None or gpu_minors is None:
            return None
        gpus, unknown = _pct.gpus_of(config["minors"], gpu_minors)
        if unknown:
            nodes = ", ".join(f"/dev/nvidia{m}" for m in unknown)
            if not complete:
                self.io.warn(f"CT {vmid} passes {nodes} through, and not every GPU gave its minor number: its"
                             " gpus is null (its GPUs cannot be told)")
                return None
            self.io.warn(f"CT {vmid} passes {nodes} through, but no GPU of this node has that minor number"
                         f" (the GPUs' minors: {describe(sorted(gpu_minors))}): a stale config line?")
        return gpus

    def _mig_devices(self, vmid, config, node_gpus, gpus, held) -> list:
        """The MIG devices whose capability nodes (/dev/nvidia-caps/nvidia-capN, devN or lxc.mount.entry lines) the
        config passes, or that the toolkit's NVIDIA_VISIBLE_DEVICES names by MIG UUID (_mig); a capability node no MIG
        device of the node has is warned about. A running container's are those and the ones its processes are on or
        hold the nodes of (``held``: _mig.held, None when not read): all of them for a config that passes the whole
        /dev/nvidia-caps (a bind of the directory, or of /dev), where the config says nothing of which (_dir_mig)."""
        nodes = [d for d in config.get("devices") or () if _mig.node_minor(d) is not None]
        ids = config.get("visible") if isinstance(config.get("visible"), list) else []
        visible = [v for v in ids if isinstance(v, str) and v.lower().startswith("mig-")]
        if not (nodes or visible or held or config["mig_all"]) or node_gpus is None:
            return []
        found = _mig.devices_of_nodes(node_gpus, nodes)
        for uuid in visible:  # the toolkit's NVIDIA_VISIBLE_DEVICES=MIG-...
            _gpu, dev = _mig.find(node_gpus, uuid)
            if dev is not None and dev["uuid"] not in found:
                found.append(dev["uuid"])
        known = {_mig.node_minor(n) for g in node_gpus for d in g.get("mig_devices") or [] for n in d.get("device_nodes") or ()}
        # config (1) and monitor (2) are the MIG management capabilities, no MIG device's (MIG user guide, mig-minors)
        stale = sorted({_mig.node_minor(n) for n in nodes} - known - {1, 2})
        if stale:
            self.io.warn(f"CT {vmid} passes {describe(f'/dev/nvidia-caps/nvidia-cap{m}' for m in stale)} through, but no MIG"
                         " device of this node has that capability: a stale config line (the MIG devices were made anew?)")
        if config["mig_all"]:
            return self._dir_mig(vmid, node_gpus, gpus, found, held)
        beyond = [u for u in _mig.in_order(node_gpus, (held or {}).get(vmid, ())) if u not in found]
        if beyond:
            self.io.warn(f"CT {vmid}'s processes are on MIG device {describe(beyond)} (a context, or its capability"
                         f" nodes open), which its config {self._file(vmid)} does not name (edited while it runs?):"
                         " fenced as its MIG devices")
        return found + beyond

    def _dir_mig(self, vmid, node_gpus, gpus, found, held) -> list:
        """The MIG devices of a container whose config passes the whole /dev/nvidia-caps (a bind of the directory or of
        /dev, a devN of the directory): on each of its GPUs in MIG mode, those its processes are on or hold the nodes
        of; where they hold none (none of its processes runs there yet, or it is not running), those no other
        process holds - never the GPU's others, which are another's work - with a warning that it cannot tell."""
        mine = (held or {}).get(vmid, set())
        others = {u for place, uuids in (held or {}).items() if place != vmid for u in uuids}
        out = list(found)
        for g in node_gpus:
            devs = [d["uuid"] for d in g.get("mig_devices") or []]
            if not devs or (gpus is not None and g["index"] not in gpus):
                continue
            on = [u for u in devs if u in mine]
            what = f"CT {vmid}'s config passes the whole /dev/nvidia-caps: which MIG devices of GPU {g['index']} are its"
            if on:
                out += [u for u in on if u not in out]
                continue
            free = [u for u in devs if u not in others and u not in out]
            if held is None:
                self.io.warn(f"{what} cannot be told (what the processes hold could not be read): the wait covers them"
                             " all, and will name their holders")
            else:
                self.io.warn(f"{what} cannot be told: its processes hold none now; the wait covers those no other"
                             f" process holds: {describe(free) if free else 'none'}")
            out += free or devs  # every one held by others' work: the wait names them
        return out

    def _sharers(self, vmid) -> list:
        """The other running containers of the node whose configs pass GPUs (or may: passthrough that cannot be read).
        With named containers only theirs were read: the other running ones' configs are read now, within the
        discovery's time limit."""
        running, deadline = self._node_state
        out = []
        for other in sorted(running):
            if other == vmid:
                continue
            if other not in self._configs:
                if not self.p["containers"]:
                    continue  # every running container's config was read
                text = self._within(deadline, lambda v=other: self.io.config(v))
                conf = None if text is None else _pct.parse_conf_file(text)
                self._configs[other] = None if conf is None else _pct.parse_config(_pct.config_view(conf, current=True))
            config = self._configs[other]
            if config is not None and (config["passthrough"] is None or (
                    config["passthrough"] and (config["minors"] is None or config["minors"] or config["visible"]))):
                out.append(other)
        return out

    def cover(self, containers, release) -> None:
        """What a wait after the fence covers of each container (``wait_gpus``, ``gpus_from``): its config's GPUs
        (``config``), except for a running container whose config passes every GPU of the node while other running
        containers pass GPUs too (helper scripts write a ``devN`` line for every /dev/nvidia* node into every GPU
        container, so such a config says nothing of which GPUs are its work's): then the GPUs its workload kept busy
        before the fence - at the discovery, before any service stopped, and in the release's look (``processes``);
        when they held none, the GPUs no other container's processes kept busy (``unheld``), or, when others keep every
        one busy, the config's (``config``: the wait then names them). The release itself is never narrowed: it stops
        the container's processes on whatever they hold."""
        if not self._shared:
            return
        busy = {k: set(v) for k, v in self._holding.items()}
        # the release's first look (in check mode its only one, gpus)
        first = release.get("gpus_before", release.get("gpus")) if release else None
        if isinstance(first, list):
            looked = _snapshot.expand_gpus(first, release.get("holder_processes"))
            for vmid, gpus in _holding.workload_gpus(looked).items():
                busy.setdefault(vmid, set()).update(gpus)
        every = sorted(g["index"] for g in self.gpus() or [])
        for c in containers:
            vmid = c["vmid"]
            if vmid not in self._shared:
                continue
            config_gpus = every if c["gpus"] is None else c["gpus"]
            said = (f"CT {vmid}'s config passes every GPU of the node, and CT {describe(self._shared[vmid])} pass GPUs"
                    " too")
            mine = sorted(busy.get(vmid, set()) & set(config_gpus))
            others = {i for v, gpus in busy.items() if v != vmid for i in gpus}
            unheld = sorted(set(config_gpus) - others)
            if mine:
                c.update(gpus_from="processes", wait_gpus=mine)
                self.io.warn(f"{said}: fenced by what its processes hold: GPU {describe(mine)} (the wait covers those)")
            elif unheld:
                c.update(gpus_from="unheld", wait_gpus=unheld)
                self.io.warn(f"{said}; its processes hold no GPU: the wait covers the GPUs no other container's"
                             f" processes hold: GPU {describe(unheld)}")
            else:
                self.io.warn(f"{said}; its processes hold no GPU and other containers' processes hold every one: the"
                             " wait covers them all (and will name their holders)")

    def _toolkit_gpus(self, vmid, config, gpus, node_gpus):
        """The GPUs of the container with those of the toolkit's hook (NVIDIA_VISIBLE_DEVICES) added; None when they
        cannot be told (a warning says why)."""
        visible = config["visible"]
        if not visible or visible == "all" or gpus is None:
            return gpus
        if node_gpus is None:
            return None  # the driver could not be read (NodeIO.gpus warned)
        indexes, unmatched = _pct.visible_gpus(visible, node_gpus)
        if unmatched:
            have = describe("%s (%s)" % (g["index"], g.get("uuid")) for g in node_gpus)
            self.io.warn(f"CT {vmid} gets the GPUs {describe(visible)} from the NVIDIA container toolkit's hook"
                         f" ({_pct.VISIBLE}), and no GPU of this node matches {describe(unmatched)} (the GPUs: {have}):"
                         " its gpus is null (its GPUs cannot be told)")
            return None
        return sorted(set(gpus) | set(indexes))

    def _held_gpus(self, vmid, config, gpus, running, held):
        """A container with config lines that may pass GPUs but cannot be read: its GPUs are what its processes hold
        (with those its other lines give); a warning names the lines."""
        what = (f"CT {vmid}: {describe(config['unknown'])} may pass NVIDIA devices through, and what it passes cannot be"
                " read from the config (a hook script, a file elsewhere)")
        if not running:
            self.io.warn(f"{what}; it is not running: its gpus is null (its GPUs cannot be told)")
            return None
        mine = None if held is None else held.get(vmid, set())
        if mine is None or gpus is None:
            self.io.warn(f"{what}; the GPUs its processes hold cannot be read: its gpus is null (its GPUs cannot be told)")
            return None
        if mine:
            self.io.warn(f"{what}; its processes hold GPU {describe(sorted(mine))} (a context or the GPU's /dev/nvidiaN"
                         " open): they are fenced as its GPUs")
        elif config["passthrough"] is None and not self.p["containers"]:
            self.io.warn(f"{what}; its processes hold no GPU now: it is not fenced")
        else:
            self.io.warn(f"{what}; its processes hold no GPU now")
        return sorted(set(gpus) | mine)


class Fence:
    """One fence, in its steps: the discovery (Discovery: the containers and their GPUs), the choice (what the fence
    covers: ``_choose``), the services (their states, then their stop), then the release or the shutdown, and what a
    wait after it covers. ``run()`` returns the module's result, or raises FenceFailed (or another GpuError) with
    ``self.result`` holding what was done so far."""

    def __init__(self, params: dict, io, check_mode=False, diff=False, first_signal=None, release=None):
        self.p = params            # containers, units (validated), state, shutdown_timeout, force, include_stopped,
        self.io = io               # pct_timeout, stop_timeout
        self.check_mode = check_mode
        self.diff = diff
        self.result = dict(changed=False, containers=[], running=[], skipped_containers=[], gpus=None, wait_gpus=None,
                           services_stopped=[], shut_down=[], check_mode=check_mode, pending_passthrough=[], pct_calls=0)
        self.before = {}
        self.release = None        # the release's own result (its outcome is the result's ``release``)
        self.discovery = Discovery(params, io, self.result)
        self.first_signal = first_signal
        self.run_release = release or _release.run_release   # the unit tests give a fake

    # --- services ------------------------------------------------------------------------------------------
    def _service_states(self, running: list) -> dict:
        """{(vmid, unit): (state, active)} - read at once; a container that does not answer, or whose systemd
        says nothing, fails the fence before anything is stopped."""
        units = self.p["units"]
        jobs = [(c["vmid"], unit) for c in running for unit in units]
        limit = self.p["pct_timeout"]

        def ask(job):
            vmid, unit = job
            argv = ["exec", str(vmid), "--", "systemctl", "is-active", unit]
            watch = self.io.exec_watch(vmid, limit)  # what hangs: the container (frozen), pct, its systemd
            try:
                rc, out, err = self.io.pct(argv, limit, f"pct exec {vmid} -- systemctl is-active {unit}",
                                           **({"watch": watch(["pct"] + argv)} if watch else {}))
            except _errors.QueryTimeout as exc:
                raise FenceFailed("container_timeout", (exc.msg if exc.details.get("watched") else (
                    f"CT {vmid} did not answer: systemctl is-active {unit} had not returned after {limit:g} s"
                    f" (pct_timeout); the container may be frozen (pct status {vmid}, lxc-info -n {vmid})"))
                    + ". Nothing was stopped.") from None
            state, active = _pct.parse_is_active(out)
            if state is None:
                raise FenceFailed("service_state_unknown",
                                  f"CT {vmid}: systemctl is-active {unit} said nothing (rc {rc}): {err.strip()}."
                                  " Is systemd running in the container? Nothing was stopped.")
            return state, active

        return dict(zip(jobs, self.io.run_all(ask, jobs, CONFIG_WORKERS)))

    def _stop_services(self, running: list, states: dict) -> None:
        for c in running:
            vmid = c["vmid"]
            for unit in self.p["units"]:
                state, active = states[(vmid, unit)]
                if not active:
                    continue
                if self.check_mode:
                    self.result["services_stopped"].append(dict(vmid=vmid, unit=unit, state_before=state, rc=None,
                                                                seconds=None))
                    continue
                stop = _release.stop_unit(lambda argv, timeout, what, **kw: self.io.pct(argv[1:], timeout, what, **kw),
                                          "pct", vmid, unit, self.p["stop_timeout"], now=self.io.now,
                                          watch=self.io.exec_watch(vmid, self.p["pct_timeout"]))
                if stop["rc"] is not None:
                    self.result["services_stopped"].append(dict(vmid=vmid, unit=unit, state_before=state, rc=stop["rc"],
                                                                seconds=stop["seconds"]))
                if stop["error"] and stop["rc"] is None:
                    raise FenceFailed("container_timeout", f"{stop['error']} Nothing else was stopped.")
                if stop["error"]:
                    raise FenceFailed("service_stop_failed",
                                      f"{stop['error']}. The unit may still hold the GPUs: look at pct exec {vmid} --"
                                      f" systemctl status {unit}, fix it and run the task again.")

    def _shutdown(self, running: list) -> None:
        timeout = self.p["shutdown_timeout"]
        for c in running:
            vmid = c["vmid"]
            self.result["shut_down"].append(vmid)
            if self.check_mode:
                continue
            argv = ["shutdown", str(vmid), "--timeout", str(timeout)] + (["--forceStop", "1"] if self.p["force"] else [])
            # pct shutdown waits up to --timeout itself; a little more for pct's own start.
            try:
                rc, out, err = self.io.pct(argv, timeout + self.p["pct_timeout"], f"pct shutdown {vmid}")
            except _errors.QueryTimeout:
                rc, out, err = None, "", f"pct shutdown did not return within {timeout + self.p['pct_timeout']:g} s"
            if rc != 0:
                self.result["shut_down"].remove(vmid)
                advice = ("check the container's console (pct enter)" if self.p["force"] else
                          "set force: true to stop it after shutdown_timeout, or raise shutdown_timeout")
                raise FenceFailed("shutdown_failed",
                                  f"CT {vmid} did not shut down (pct shutdown --timeout {timeout}, rc {rc}):"
                                  f" {_said(rc, out, err)}. {advice[0].upper() + advice[1:]}.", rc=rc)

    # --- the whole fence ----------------------------------------------------------------------------------
    def run(self) -> dict:
        res = self.result
        containers = self.discovery.containers()
        running = [c for c in containers if c["running"]]
        counted = self._choose(containers, running)
        self.discovery.mig_mode_pending(self.result["gpus"])
        if running and (self.p["state"] != "present" or self.p["units"]) and not self.check_mode:
            # One release at a time per container (and node): taken before the services' states are read, so a
            # second fence that waited sees what the first left, not what it stopped.
            waited = self.io.take_locks([c["vmid"] for c in running])
            if waited:
                self.result["waited_for_lock"] = waited  # what it finds is what another run left (_lock.waited_text)
                self.discovery.looked = None   # it waited for another run's: the discovery's look is stale
        states = self._service_states(running)
        units = self.p["units"]
        self.before = {str(c["vmid"]): dict(status=c["status"], services={u: states[(c["vmid"], u)][0] for u in units}
                                            if c["running"] else {}) for c in containers}
        releasing = self.p["state"] == "released" and bool(running)
        # What the GPUs looked like before the services stop (read once: the discovery's look when it had one).
        looked = self.discovery.gpus() if releasing and any(a for _s, a in states.values()) else None
        self._stop_services(running, states)
        if self.p["state"] == "shutdown":
            self._shutdown(running)
        elif releasing:
            self._release(running, looked)
        self.discovery.cover(containers, self.release)
        # What a wait after this fence covers: the union of the counted containers' wait_gpus (null: every GPU).
        res["wait_gpus"] = _union(c["wait_gpus"] for c in counted)
        return self.finish()

    def _choose(self, containers: list, running: list) -> list:
        """The containers whose GPUs the fence covers (returned): the running ones, or, when none of the named ones
        runs, the named ones (their config's GPUs: what a wait after this fence must cover; null: every GPU)."""
        counted = running or (containers if self.p["containers"] else [])
        res = self.result
        res.update(containers=containers, running=[c["vmid"] for c in running],
                   skipped_containers=[{"vmid": c["vmid"], "reason": c["status"]} for c in containers if not c["running"]],
                   gpus=_union(c["gpus"] for c in counted))
        res["wait_gpus"] = res["gpus"]
        return counted

    def _release(self, running: list, looked) -> None:
        """The release of the running containers' processes (never without containers: an empty scope would mean every
        process of the node). It selects the GPUs the fence covers (the running containers' union, when every one is
        known): a GPU the containers do not have (a sick one next door) is reported by the release, never fatal to it."""
        res = self.result
        selection = self.p["filters"]["gpus"] or _selection.of_indexes(res["gpus"] or ())
        filters = dict(self.p["filters"], containers=[c["vmid"] for c in running], gpus=selection)
        # The units the fence stopped (in check mode: would stop) are not the release's to stop again.
        p = release_options(self.p["release"], draining_gpus(looked, res["services_stopped"]),
                            [(s["vmid"], s["unit"]) for s in res["services_stopped"]])
        io, look = self.io.release_io, self.discovery.looked
        if look is not None and not self.p["units"] and p["include_device_holders"]:
            # Nothing ran since the discovery's look (no service, no wait for a lock): it is the release's first
            # snapshot - /proc is read once.
            io, self.discovery.looked = _FirstLook(io, look), None
        try:
            self.release = self.run_release(p, filters, io, self.first_signal, self.check_mode, self.diff,
                                            lock=self.io.gpu_locks)
        except _release.ReleaseFailed as exc:
            self.release = exc.partial
            res["release"] = outcome(exc.partial)
            raise
        res["release"] = outcome(self.release)

    def finish(self) -> dict:
        res = self.result
        res["pct_calls"] = self.io.pct_calls()
        res["changed"] = bool(res["services_stopped"] or res["shut_down"] or (res.get("release") or {}).get("changed"))
        diff = []
        if self.diff and self.before:
            after = {vmid: dict(status=ct["status"], services=dict(ct["services"])) for vmid, ct in self.before.items()}
            for entry in res["services_stopped"]:
                if entry["rc"] in (0, None):
                    after[str(entry["vmid"])]["services"][entry["unit"]] = "inactive"
            for vmid in res["shut_down"]:
                after[str(vmid)] = dict(status="stopped", services={u: "inactive" for u in self.p["units"]})
            diff.append(dict(before_header="containers", after_header="containers", before=self.before, after=after))
        if self.diff and isinstance((self.release or {}).get("diff"), dict):
            diff.append(self.release["diff"])  # the release's units and GPUs, before and after
        if diff:
            res["diff"] = diff
        return res


def outcome(release) -> dict:
    """What the fence's result carries of its release (``release``): the release's result, its holders once
    (_snapshot.compact_result), with the GPUs before and after as records (_snapshot.gpu_record: the table's and the
    wait's before, not the snapshot) and without its diff (the fence's own diff shows it)."""
    if not isinstance(release, dict):
        return release
    out = {k: v for k, v in release.items() if k != "diff"}
    if isinstance(out.get("gpus"), list):
        out["gpus"] = [_snapshot.gpu_record(g) for g in out["gpus"]]
    return _snapshot.compact_result(out)


def _union(gpu_lists):
    """The sorted union of GPU index lists; None (every GPU) when one of them is None."""
    union = set()
    for gpus in gpu_lists:
        if gpus is None:
            return None
        union |= set(gpus)
    return sorted(union)


def _passes_every_gpu(config, gpus, node_gpus) -> bool:
    """Whether a config passes every GPU of the node: a devN or mount line for each /dev/nvidiaN, or a line that gives
    them all (c 195:* with no node named, a bind of /dev, the toolkit's NVIDIA_VISIBLE_DEVICES=all). False when the
    node's GPUs or the config's cannot be told."""
    if not node_gpus or config["unknown"] or not config["passthrough"]:
        return False
    if gpus is None:
        return config["minors"] is None
    return {g["index"] for g in node_gpus} <= set(gpus)


def validate(p: dict) -> dict:
    """The fence's parameters from the module's, every one checked once before anything runs: ``filters`` are the
    release's (_validate.release: the gpus option parsed, the containers validated), ``containers`` theirs."""
    filters = _validate.release(dict(p, **RELEASE_FIXED), _validate.snapshot(p))
    params = dict(containers=filters["containers"], units=_pct.validate_units(p["services"]), filters=filters,
                  state=p["state"], force=p["force"], include_stopped=p["include_stopped"],
                  shutdown_timeout=_validate.integer("shutdown_timeout", p["shutdown_timeout"], 0, int(_validate.DAY)),
                  pct_timeout=_validate.number("pct_timeout", p["pct_timeout"], above_low=True))
    params["release"] = dict(p)   # the snapshot and release options of the release the fence runs (release_options)
    # A unit stop may take the unit's own stop time (TimeoutStopSec): as long as a release gives its holders.
    params["stop_timeout"] = p["grace_period"] + p["kill_timeout"] + params["pct_timeout"]
    return params


def release_options(base: dict, draining=(), units_stopped=()) -> dict:
    """gpu_release's options for the fence's release over the containers' processes (its filters are the fence's:
    Fence._release): the module's snapshot and release options (``base``), every holder of the containers with their
    workloads (RELEASE_FIXED); ``draining``: the GPUs whose memory the stopped services are still freeing
    (draining_gpus); ``units_stopped``: [(vmid, unit)] the fence stopped, or in check mode would stop (the release does
    not stop them again)."""
    return dict(base, draining_gpus=list(draining), units_stopped=list(units_stopped), **RELEASE_FIXED)


class _FirstLook:
    """A release's I/O whose first snapshot is one already taken (the discovery's look); the rest is ``io``'s."""

    def __init__(self, io, gpus):
        self._io = io
        self._gpus = gpus

    def __getattr__(self, name):
        return getattr(self._io, name)

    def snapshot(self, holders=True):
        gpus, self._gpus = self._gpus, None
        return self._io.snapshot(holders) if gpus is None else gpus
