# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The fence of Proxmox VE containers, on the node, in one module run (proxmox_gpu_containers).

``Fence.run()``: find the containers (``pct list``, then the configs of the running ones, or of those
named, at once, within one time limit), tie their passthrough to GPU indexes, read and stop the named
services (``pct exec <vmid> -- systemctl``, each under a time limit), and then shut the containers down
(state shutdown) or release the GPU holders in them through the release path (state released).

Its I/O is injected (``FenceIO``): ``pct(argv, timeout, what)``, ``gpus(full)``, ``release(params, gpus)``,
``warn`` and ``now``; the unit tests give it a fake node.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _holding, _lock, _pct, _release, _snapshot, _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._waiting import run_in_group

STATES = ("present", "released", "shutdown")
PCT_TIMEOUT = 30.0
# pct is a Perl program that starts in about 0.3 s on a node: read the configs a few at a time.
CONFIG_WORKERS = 8


C_LOCALE = {"LC_ALL": "C"}
# gpu_release's options that the fence does not take: it releases every GPU holder of the running containers,
# with their workloads (tree).
RELEASE_FIXED = dict(users=None, match=None, pids=None, exclude=None, tree=True, all=False, expected_count=None)


class FenceFailed(_errors.GpuError):
    """A step of the fence failed; ``kind`` says which (pct_not_found, pct_failed, no_such_container,
    container_timeout, service_state_unknown, service_stop_failed, shutdown_failed)."""

    def __init__(self, kind: str, msg: str, **details):
        super().__init__(msg, **details)
        self.kind = kind


def describe(vmids) -> str:
    return ", ".join(str(v) for v in vmids) if vmids else "none"


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


class Fence:
    """One fence: ``run()`` returns the module's result, or raises FenceFailed (or another GpuError)
    with ``self.result`` holding what was done so far."""

    def __init__(self, params: dict, io, check_mode=False, diff=False):
        self.p = params            # containers, units (validated), state, shutdown_timeout, force, include_stopped,
        self.io = io               # pct_timeout, stop_timeout
        self.check_mode = check_mode
        self.diff = diff
        self.result = dict(changed=False, containers=[], running=[], skipped_containers=[], gpus=None,
                           services_stopped=[], shut_down=[], check_mode=check_mode, pending_passthrough=[])
        self.before = {}

    # --- discovery ---------------------------------------------------------------------------------------
    def _pct(self, argv, deadline, what):
        left = deadline - self.io.now()
        try:
            if left <= 0:
                raise _errors.QueryTimeout(what)
            return self.io.pct(argv, left, what)
        except _errors.QueryTimeout:
            raise FenceFailed(
                "container_timeout",
                f"{what} did not answer within pct_timeout ({self.p['pct_timeout']:g} s, the limit of the whole"
                " discovery): the node is overloaded or a container is frozen (pct status, lxc-info). Nothing was"
                " stopped.") from None

    def discover(self) -> list:
        """The selected containers' rows (the result's ``containers``)."""
        deadline = self.io.now() + self.p["pct_timeout"]
        selected = self.p["containers"]
        # A running container runs with its current config (--current); `pct config` alone applies the pending
        # changes. Stopped containers are read only when named (their config says which GPUs they would get).
        # Named containers' configs are read beside `pct list` (both kinds: whether each runs is not known yet),
        # the others' once the list says which run; at most CONFIG_WORKERS pct at a time, within pct_timeout.
        with ThreadPoolExecutor(max_workers=CONFIG_WORKERS) as pool:
            reads = {job: pool.submit(self._config, job, deadline) for vmid in selected for job in ((vmid, True), (vmid, False))}
            listed = self._list(deadline)
            wanted = selected or [v for v in sorted(listed)
                                  if listed[v]["status"] == "running" or self.p["include_stopped"]]
            jobs = []
            for vmid in wanted:
                running = listed[vmid]["status"] == "running"
                jobs.append((vmid, running))
                if running:
                    jobs.append((vmid, False))
            for job in jobs:
                if job not in reads:
                    reads[job] = pool.submit(self._config, job, deadline)
            read_configs = {job: reads[job].result() for job in jobs}  # a read not needed: its error is not raised
        configs = {}
        for vmid in wanted:
            running = listed[vmid]["status"] == "running"
            config = read_configs[(vmid, running)]
            if running:
                self._pending(vmid, config, read_configs[(vmid, False)])
            if selected or config["passthrough"] or config["unknown"]:
                configs[vmid] = config
        return self._rows(listed, configs)

    def _list(self, deadline) -> dict:
        """`pct list` parsed; FenceFailed when it fails or lacks a named container."""
        rc, out, err = self._pct(["list"], deadline, "pct list")
        if rc != 0:
            raise FenceFailed("pct_failed", f"pct list failed (rc {rc}): {_said(rc, out, err)}. Run the task on the"
                                            " Proxmox VE node with become: true. Nothing was stopped.", rc=rc)
        try:
            listed = _pct.parse_list(out)
        except ValueError as exc:
            raise FenceFailed("pct_failed", f"{exc}. Nothing was stopped.") from None
        missing = [v for v in self.p["containers"] if v not in listed]
        if missing:
            raise FenceFailed("no_such_container",
                              f"containers: no container {describe(missing)} on this node (pct list shows"
                              f" {describe(sorted(listed))}). Nothing was stopped.", missing=missing)
        return listed

    def _config(self, job, deadline) -> dict:
        """One container's config: ``job`` is (vmid, current)."""
        vmid, current = job
        what = f"pct config {vmid}" + (" --current 1" if current else "")
        rc, out, err = self._pct(["config", str(vmid)] + (["--current", "1"] if current else []), deadline, what)
        if rc != 0:
            raise FenceFailed("pct_failed", f"{what} failed (rc {rc}): {_said(rc, out, err)}. Nothing was stopped.",
                              rc=rc)
        return _pct.parse_config(out)

    def _pending(self, vmid, current, pending) -> None:
        change = _pct.passthrough_changes(current, pending)
        if change:
            self.result["pending_passthrough"].append(dict(vmid=vmid, **change))
            self.io.warn(f"CT {vmid} has pending changes to its NVIDIA passthrough (removed:"
                         f" {describe(change['removed'])}; added: {describe(change['added'])}): it keeps its current"
                         " devices until it restarts. The GPUs reported are those it has now.")

    def _rows(self, listed, configs) -> list:
        gpu_minors = uuids = node_gpus = held = None
        complete = False
        # A container whose config may pass GPUs in a way that cannot be read (_pct.parse_config's ``unknown``): what
        # its processes hold decides, when it runs.
        unread = [v for v, c in configs.items() if c["unknown"] and listed[v]["status"] == "running"]
        if any(c["minors"] or c["visible"] for c in configs.values()) or unread:
            node_gpus = self.io.gpus()
            if node_gpus is not None:
                gpu_minors = {g["minor_number"]: g["index"] for g in node_gpus if g.get("minor_number") is not None}
                uuids = {g["index"]: g.get("uuid") for g in node_gpus}
                complete = len(gpu_minors) == len(node_gpus)
                if unread:
                    held = self.io.held()
        rows = []
        for vmid, config in configs.items():
            gpus = None
            if config["minors"] == []:
                gpus = []
            elif config["minors"] is not None and gpu_minors is not None:
                gpus, unknown = _pct.gpus_of(config["minors"], gpu_minors)
                if unknown:
                    nodes = ", ".join(f"/dev/nvidia{m}" for m in unknown)
                    if complete:
                        self.io.warn(f"CT {vmid} passes {nodes} through, but no GPU of this node has that minor number"
                                     f" (the GPUs' minors: {describe(sorted(gpu_minors))}): a stale config line?")
                    else:
                        self.io.warn(f"CT {vmid} passes {nodes} through, and not every GPU gave its minor number: its"
                                     " gpus is null (its GPUs cannot be told)")
                        gpus = None
            row = listed[vmid]
            running = row["status"] == "running"
            gpus = self._toolkit_gpus(vmid, config, gpus, node_gpus)
            if config["unknown"]:
                gpus = self._held_gpus(vmid, config, gpus, running, held)
                if gpus == [] and config["passthrough"] is None and not self.p["containers"]:
                    continue  # nothing of it holds a GPU: nothing to fence (the warning says so)
            minors = config["minors"]
            if gpus and gpu_minors and (config["visible"] or config["unknown"]) and minors is not None:
                index_minor = {i: m for m, i in gpu_minors.items()}
                minors = sorted(set(minors) | {index_minor[i] for i in gpus if i in index_minor})
            rows.append(dict(
                vmid=vmid, name=row["name"] or config["hostname"] or "", status=row["status"], lock=row["lock"],
                running=running, passthrough=config["passthrough"], minors=minors,
                gpus=gpus, gpu_uuids=None if gpus is None else [uuids[i] for i in gpus],
                passthrough_unknown=list(config["unknown"])))
        return rows

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

    # --- services ------------------------------------------------------------------------------------------
    def _service_states(self, running: list) -> dict:
        """{(vmid, unit): (state, active)} - read at once; a container that does not answer, or whose systemd
        says nothing, fails the fence before anything is stopped."""
        units = self.p["units"]
        jobs = [(c["vmid"], unit) for c in running for unit in units]
        limit = self.p["pct_timeout"]

        def ask(job):
            vmid, unit = job
            try:
                rc, out, err = self.io.pct(["exec", str(vmid), "--", "systemctl", "is-active", unit], limit,
                                           f"pct exec {vmid} -- systemctl is-active {unit}")
            except _errors.QueryTimeout:
                raise FenceFailed(
                    "container_timeout",
                    f"CT {vmid} did not answer: systemctl is-active {unit} had not returned after {limit:g} s"
                    f" (pct_timeout); the container may be frozen (pct status {vmid}, lxc-info -n {vmid}). Nothing was"
                    " stopped.") from None
            state, active = _pct.parse_is_active(out)
            if state is None:
                raise FenceFailed("service_state_unknown",
                                  f"CT {vmid}: systemctl is-active {unit} said nothing (rc {rc}): {err.strip()}."
                                  " Is systemd running in the container? Nothing was stopped.")
            return state, active

        if not jobs:
            return {}
        with ThreadPoolExecutor(max_workers=min(CONFIG_WORKERS, len(jobs))) as pool:
            return dict(zip(jobs, pool.map(ask, jobs)))

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
                stop = _release.stop_unit(lambda argv, timeout, what: self.io.pct(argv[1:], timeout, what), "pct", vmid,
                                          unit, self.p["stop_timeout"], now=self.io.now)
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
        containers = self.discover()
        running = [c for c in containers if c["running"]]
        # The GPUs of the containers fenced: the running ones', or, when none of the named ones runs, their
        # config's (what a wait after this fence must cover; null: every GPU).
        counted = running or (containers if self.p["containers"] else [])
        union = set()
        for c in counted:
            union = None if union is None or c["gpus"] is None else union | set(c["gpus"])
        res.update(containers=containers, running=[c["vmid"] for c in running],
                   skipped_containers=[{"vmid": c["vmid"], "reason": c["status"]} for c in containers if not c["running"]],
                   gpus=None if union is None else sorted(union))
        if running and (self.p["state"] != "present" or self.p["units"]) and not self.check_mode:
            # One release at a time per container (and node): taken before the services' states are read, so a
            # second fence that waited sees what the first left, not what it stopped.
            self.io.take_locks([c["vmid"] for c in running])
        states = self._service_states(running)
        units = self.p["units"]
        self.before = {str(c["vmid"]): dict(status=c["status"], services={u: states[(c["vmid"], u)][0] for u in units}
                                            if c["running"] else {}) for c in containers}
        releasing = self.p["state"] == "released" and bool(running)
        # What the GPUs looked like before the services stop (read once: the discovery's look when it had one).
        looked = self.io.gpus() if releasing and any(a for _s, a in states.values()) else None
        self._stop_services(running, states)
        if self.p["state"] == "shutdown":
            self._shutdown(running)
        elif releasing:
            # Never without containers: an empty scope would mean every process of the node.
            # The release selects the GPUs it fences (the running containers' union, when every one is known): a GPU
            # the containers do not have (a sick one next door) is reported by the release, never fatal to it.
            release, failure = self.io.release([c["vmid"] for c in running], draining_gpus(looked, res["services_stopped"]),
                                               res["gpus"] or None)
            res["release"] = release
            if failure is not None:
                raise failure
        return self.finish()

    def finish(self) -> dict:
        res = self.result
        res["changed"] = bool(res["services_stopped"] or res["shut_down"] or (res.get("release") or {}).get("changed"))
        if self.diff and self.before:
            after = {vmid: dict(status=ct["status"], services=dict(ct["services"])) for vmid, ct in self.before.items()}
            for entry in res["services_stopped"]:
                if entry["rc"] in (0, None):
                    after[str(entry["vmid"])]["services"][entry["unit"]] = "inactive"
            for vmid in res["shut_down"]:
                after[str(vmid)] = dict(status="stopped", services={u: "inactive" for u in self.p["units"]})
            res["diff"] = dict(before=self.before, after=after)
        return res


def validate(p: dict) -> dict:
    """The fence's parameters from the module's, every one checked before anything runs."""
    params = dict(containers=_pct.validate_vmids(p["containers"]), units=_pct.validate_units(p["services"]),
                  state=p["state"], force=p["force"], include_stopped=p["include_stopped"],
                  shutdown_timeout=_validate.integer("shutdown_timeout", p["shutdown_timeout"], 0, int(_validate.DAY)),
                  pct_timeout=_validate.number("pct_timeout", p["pct_timeout"], above_low=True))
    _validate.snapshot(p)
    _validate.release(dict(p, containers=[], **RELEASE_FIXED))
    # A unit stop may take the unit's own stop time (TimeoutStopSec): as long as a release gives its holders.
    params["stop_timeout"] = p["grace_period"] + p["kill_timeout"] + params["pct_timeout"]
    return params


class NodeIO:
    """The Proxmox VE node: ``pct`` under a time limit, the GPUs' minor numbers, the release (gpu_release's path)."""

    def __init__(self, pct_path, taker, release_io, params, first_signal, check_mode=False, diff=False):
        self.pct_path = pct_path
        self.taker = taker
        self.release_io = release_io      # _release.HostIO over the same snapshot taker
        self.params = params              # the module's (snapshot and release options)
        self.first_signal = first_signal
        self.check_mode = check_mode
        self.diff = diff
        self.warn = release_io.warn
        self.now = release_io.now
        self._gpus = None

    def pct(self, argv, timeout, what):
        return run_in_group([self.pct_path] + list(argv), timeout, what, C_LOCALE)

    def take_locks(self, vmids) -> None:
        """The release locks of these containers (and the node's, shared), held until the module exits."""
        _lock.Locks("proxmox_gpu_containers", vmids, self.params["lock_timeout"], self.warn).acquire()

    def gpus(self):
        """The GPUs (index, uuid, minor_number, memory, processes), read once; None with a warning when the driver
        cannot be read."""
        if self._gpus is not None:
            return self._gpus
        try:
            self._gpus = self.taker.raw(need_minors=True)["gpus"]
            return self._gpus
        except _errors.GpuError as exc:
            if self.params["state"] == "released":
                raise
            self.warn(f"cannot read the GPUs ({exc.msg}): each container's gpus is null (its GPUs cannot be told)")
            return None

    def held(self) -> dict:
        """{vmid: set of GPU indexes} its processes hold now (_holding.container_gpus over a full snapshot: contexts,
        /dev/nvidiaN holders)."""
        return _holding.container_gpus(self.taker.take()["gpus"])

    def release(self, vmids: list, draining=(), gpus=None):
        """gpu_release's path over the containers' processes: (its result, None) or (the partial result, the error).
        ``draining``: the GPUs whose memory the services just stopped are still freeing (draining_gpus); ``gpus``: the
        containers' GPU indexes, selected when the module's O(gpus) is not set (None: every GPU)."""
        p = dict(self.params, containers=list(vmids), draining_gpus=list(draining), **RELEASE_FIXED)
        if gpus and not p.get("gpus"):
            p["gpus"] = [str(i) for i in gpus]
        try:
            result = _release.run_release(p, _validate.release(p), self.release_io, self.first_signal,
                                          self.check_mode, self.diff)
            # Each holder once (_snapshot.compact_result), as gpu_release returns it.
            return _snapshot.compact_result(result), None
        except _release.ReleaseFailed as exc:
            return _snapshot.compact_result(exc.partial), exc
