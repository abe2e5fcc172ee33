#!/usr/bin/python
# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_gpu_containers
short_description: Find the Proxmox VE containers that get NVIDIA GPUs, stop their GPU services or shut them down
version_added: 0.1.0
description:
  - Runs on a Proxmox VE node. Reads C(pct list) once, then C(pct config) of each selected container (or, with
    no O(containers), of every container, keeping those whose config passes NVIDIA devices through), and says
    which GPUs each one gets.
  - A running container is read with C(pct config <vmid> --current), what it runs with. Its pending changes
    (C(pct set) or the GUI on a running container, for what cannot be hot-plugged, such as removing or changing a
    C(devN)) take effect at its next start; when they touch its NVIDIA passthrough, a warning and
    RV(pending_passthrough) say so.
  - A container's GPUs come from its config - C(devN) device passthrough (PVE 8.1+), C(lxc.mount.entry) lines
    of C(/dev/nvidiaN) and C(lxc.cgroup2.devices.allow) lines of major 195. C(c 195:* rwm) with no C(/dev/nvidiaN)
    line gives the container every GPU of the node (RV(containers[].gpus) is null). The minor numbers are tied
    to GPU indexes through the driver (O(backend)).
  - In each selected container that is running, stops the named systemd O(services) that are active
    (C(pct exec <vmid> -- systemctl stop <unit>)), so that their supervisor cannot restart the GPU work;
    with O(state=shutdown) it then shuts the container down (C(pct shutdown)).
  - Every command is an argument list (no shell), and every container id and unit name is validated before
    anything runs. A container id the node does not have fails the task, and nothing is stopped.
  - A selected container that is not running is reported in RV(skipped_containers), never started.
author:
  - gpuops developers (@gpuops)
extends_documentation_fragment:
  - gpuops.gpu._attributes
attributes:
  check_mode:
    support: full
    details:
      - Reads the containers and the state of each service, and reports in RV(services_stopped) and RV(shut_down)
        what would be stopped and shut down (with a null C(rc)); stops nothing.
  diff_mode:
    support: full
    details:
      - Shows the status of each container and the state of each named service before and after.
options:
  containers:
    description:
      - The Proxmox VE container ids (vmids, 100 to 999999999) to act on, as integers, strings of digits or a
        comma-separated string (V(129,130)).
      - An empty list selects every container of the node whose config passes NVIDIA devices through.
      - A container the node does not have fails the task before anything is stopped.
    type: list
    elements: raw
    default: []
  services:
    description:
      - systemd units to stop in each selected running container, when they are active (or activating,
        deactivating, reloading, refreshing) - C(pct exec <vmid> -- systemctl stop <unit>).
      - Unit names as systemd takes them (V(sglang) or V(sglang.service), V(vllm@0.service)); a name that starts with
        C(-), or holds a character that is not an ASCII letter, a digit or one of C(:_.@\-), fails before anything runs.
      - A stop that fails fails the task, with what C(systemctl) said.
    type: list
    elements: str
    default: []
  state:
    description:
      - V(present) reports the containers and stops the O(services).
      - V(shutdown) also shuts each selected running container down (C(pct shutdown <vmid> --timeout N)),
        after its services are stopped.
    type: str
    choices: [present, shutdown]
    default: present
  shutdown_timeout:
    description:
      - Seconds C(pct shutdown) waits for a container to stop (its C(--timeout)), from 0 to 86400.
      - A container still up after that fails the task, unless O(force).
    type: int
    default: 60
  force:
    description:
      - With O(state=shutdown), stop a container that did not shut down within O(shutdown_timeout)
        (C(pct shutdown --forceStop 1)) - its processes are killed.
    type: bool
    default: false
  pct:
    description:
      - The C(pct) program, a path or a name looked up in C(/usr/sbin), C(/usr/bin) and C(PATH).
    type: str
    default: pct
  backend:
    description:
      - How the GPUs' minor numbers are read, to tie C(/dev/nvidiaN) to GPU indexes.
      - V(nvml) uses the NVML library through the Python bindings C(pynvml) (the C(nvidia-ml-py) package),
        V(nvidia-smi) runs C(nvidia-smi -q -x), V(auto) takes V(nvml) when it loads, else V(nvidia-smi).
      - When the driver cannot be read (no GPU, no library), each container's RV(containers[].gpus) is null and a
        warning says why; the task does not fail.
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  nvidia_smi_path:
    description: The C(nvidia-smi) program, as in M(gpuops.gpu.gpu_facts) (O(gpuops.gpu.gpu_facts#module:nvidia_smi_path)).
    type: str
    default: nvidia-smi
  query_timeout:
    description:
      - Time limit in seconds for the query of the driver; above 0 and at most 300.
    type: float
    default: 10
requirements:
  - A Proxmox VE node (C(pct)); root (C(become) - C(pct) needs it).
notes:
  - C(pct list) says C(running) or C(stopped); a container that is starting or stopping is reported as it says.
  - Only the config of the running container counts (a C([snapshot]) section is not read).
  - A cgroup line of another major than 195 (nvidia-uvm's is dynamic) cannot be told from any other device's and is
    not counted as passthrough.
seealso:
  - module: gpuops.gpu.gpu_release
  - module: gpuops.gpu.gpu_wait_idle
"""

EXAMPLES = r"""
---
- name: Which containers get GPUs, and which GPUs?
  gpuops.gpu.proxmox_gpu_containers:
  become: true
  register: gpu_cts

- name: Stop the inference server of CT 129 and 130 so that systemd cannot restart it
  gpuops.gpu.proxmox_gpu_containers:
    containers: [129, 130]
    services: [sglang.service]
  become: true

- name: Shut CT 129 down, killing it after 2 minutes
  gpuops.gpu.proxmox_gpu_containers:
    containers: "129"
    state: shutdown
    shutdown_timeout: 120
    force: true
  become: true

- name: Fence the GPU containers, then wait until the GPUs they had are free (on the node)
  become: true
  block:
    - name: Stop the services of every GPU container
      gpuops.gpu.proxmox_gpu_containers:
        services: [sglang, vllm]
      register: fenced
    - name: Wait for their GPUs (null - every GPU of the node)
      gpuops.gpu.gpu_wait_idle:
        gpus: "{{ fenced.gpus | map('string') | list if fenced.gpus is not none else [] }}"
        timeout: 120
      when: fenced.gpus != []
"""

RETURN = r"""
containers:
  description: The selected containers (or, with no O(containers), those whose config passes NVIDIA devices through).
  returned: always
  type: list
  elements: dict
  contains:
    vmid: {description: The container id., type: int, returned: always}
    name: {description: "Its name (C(pct list)'s Name, else the config's hostname).", type: str, returned: always}
    status: {description: What C(pct list) says - V(running) or V(stopped)., type: str, returned: always}
    lock: {description: "Its lock (V(backup), V(migrate), ...), or an empty string.", type: str, returned: always}
    running: {description: Whether it is running., type: bool, returned: always}
    passthrough: {description: Whether its config passes NVIDIA devices (GPUs or control nodes) through., type: bool, returned: always}
    minors:
      description:
        - The minor numbers of the C(/dev/nvidiaN) it gets, sorted; null when C(c 195:* rwm) gives it every GPU and
          no line names one.
      type: list
      elements: int
      returned: always
    gpus:
      description:
        - The indexes of the GPUs it gets; null means every GPU of the node (see C(minors)) or that the driver
          could not be read (a warning says so).
      type: list
      elements: int
      returned: always
    gpu_uuids: {description: The UUIDs of C(gpus); null when C(gpus) is null., type: list, elements: str, returned: always}
  sample:
    - {"vmid": 129, "name": "gpu-ct", "status": "running", "lock": "", "running": true, "passthrough": true,
       "minors": [0, 1], "gpus": [0, 1], "gpu_uuids": ["GPU-3fb142e7-7102-c7ac-bd5a-fc829e11ed84",
       "GPU-8f0e2a51-1c3d-4b7a-9e21-5f0c8d7a6b42"]}
running:
  description: The ids of the selected containers that are running.
  returned: always
  type: list
  elements: int
  sample: [129]
check_mode:
  description:
    - Whether the module ran in check mode (then RV(services_stopped) and RV(shut_down) say what would be done) - also
      when check mode was set on a block or an include, which C(ansible_check_mode) does not reflect.
  returned: after the containers were read
  type: bool
pending_passthrough:
  description:
    - The running containers whose pending changes touch their NVIDIA passthrough (C(pct config <vmid>) differs from
      C(pct config <vmid> --current)), each with C(vmid), C(removed) and C(added) (the passthrough lines, as C(pct
      config) prints them) and C(minors) (the GPU minors the container gets at its next start; null means every
      GPU). What they run with now is in RV(containers).
  returned: always
  type: list
  elements: dict
  sample: [{"vmid": 129, "removed": ["dev0: /dev/nvidia0"], "added": ["dev0: /dev/nvidia1"], "minors": [1]}]
skipped_containers:
  description:
    - The selected containers that were not acted on, each with C(vmid) and C(reason) (V(stopped)).
    - Named so, not C(skipped), because Ansible reserves C(skipped) in task results.
  returned: always
  type: list
  elements: dict
  sample: [{"vmid": 130, "reason": "stopped"}]
gpus:
  description:
    - The union of the running containers' GPU indexes, sorted; null when one of them gets every GPU (or its GPUs
      could not be told).
  returned: always
  type: list
  elements: int
  sample: [0, 1]
services_stopped:
  description:
    - The services that were (in check mode - would be) stopped, each with C(vmid), C(unit), C(state_before) (what
      C(systemctl is-active) said), C(rc) and C(seconds) (null in check mode).
  returned: always
  type: list
  elements: dict
  sample: [{"vmid": 129, "unit": "sglang.service", "state_before": "active", "rc": 0, "seconds": 1.2}]
shut_down:
  description: The ids of the containers that were (in check mode - would be) shut down.
  returned: always
  type: list
  elements: int
  sample: [129]
"""

import time

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _pct, _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._common import SNAPSHOT_ARGS, SnapshotTaker, fail, new_module

PCT_DIRS = ["/usr/sbin", "/usr/bin"]
C_LOCALE = {"LC_ALL": "C"}
BACKEND_OPTIONS = ("backend", "nvidia_smi_path", "query_timeout")


def snapshot_params(params: dict) -> dict:
    """The SnapshotTaker parameters: the collection's defaults, with this module's backend options."""
    out = {name: spec.get("default") for name, spec in SNAPSHOT_ARGS.items()}
    out.update({name: params[name] for name in BACKEND_OPTIONS})
    out.update(include_device_holders=False, cmdline=False)
    return out


def read_gpus(module, params: dict):
    """({minor: index}, {index: uuid}, complete), or (None, None, False) with a warning when the driver cannot be read.

    ``complete``: every GPU gave its minor number (else a minor that matches none cannot be ruled out)."""
    try:
        taker = SnapshotTaker(module, params)
        gpus = taker.raw(need_minors=True)["gpus"]
    except _errors.GpuError as exc:
        module.warn(f"cannot read the GPUs ({exc.msg}): each container's gpus is null (its GPUs cannot be told)")
        return None, None, False
    minors = {g["minor_number"]: g["index"] for g in gpus if g.get("minor_number") is not None}
    return minors, {g["index"]: g.get("uuid") for g in gpus}, len(minors) == len(gpus)


def describe(vmids) -> str:
    return ", ".join(str(v) for v in vmids) if vmids else "none"


def main() -> None:
    argument_spec = dict(
        containers=dict(type="list", elements="raw", default=[]),
        services=dict(type="list", elements="str", default=[]),
        state=dict(type="str", choices=["present", "shutdown"], default="present"),
        shutdown_timeout=dict(type="int", default=60),
        force=dict(type="bool", default=False),
        pct=dict(type="str", default="pct"),
    )
    argument_spec.update({name: SNAPSHOT_ARGS[name] for name in BACKEND_OPTIONS})
    module = new_module(argument_spec, supports_check_mode=True)
    p = module.params

    # Everything is validated before anything runs (_pct and _validate have the rules and bounds).
    try:
        selected = _pct.validate_vmids(p["containers"])
        units = _pct.validate_units(p["services"])
        timeout = _validate.integer("shutdown_timeout", p["shutdown_timeout"], 0, int(_validate.DAY))
        snap_params = snapshot_params(p)
        _validate.snapshot(snap_params)
    except _errors.GpuError as exc:
        fail(module, exc)
        return

    pct = module.get_bin_path(p["pct"], opt_dirs=PCT_DIRS)
    if not pct:
        module.fail_json(msg=f"pct: {p['pct']!r} not found (in {', '.join(PCT_DIRS)} and PATH): run this module on a"
                             " Proxmox VE node (delegate_to the node), or set pct to the program's path.")

    def run(argv):
        return module.run_command([pct] + argv, environ_update=C_LOCALE)

    rc, out, err = run(["list"])
    if rc != 0:
        module.fail_json(msg=f"pct list failed (rc {rc}): {(err or out).strip()}. Run the task on the Proxmox VE node"
                             " with become: true. Nothing was stopped.", rc=rc)
    try:
        listed = _pct.parse_list(out)
    except ValueError as exc:
        module.fail_json(msg=f"{exc}. Nothing was stopped.")
    missing = [v for v in selected if v not in listed]
    if missing:
        module.fail_json(msg=f"containers: no container {describe(missing)} on this node (pct list shows"
                             f" {describe(sorted(listed))}). Nothing was stopped.", missing=missing)

    def read_config(vmid, current):
        rc, out, err = run(["config", str(vmid)] + (["--current", "1"] if current else []))
        if rc != 0:
            module.fail_json(msg=f"pct config {vmid}{' --current 1' if current else ''} failed (rc {rc}):"
                                 f" {(err or out).strip()}. Nothing was stopped.", rc=rc)
        return _pct.parse_config(out)

    configs, pending = {}, []
    for vmid in selected or sorted(listed):
        # A running container runs with its current config; `pct config` alone applies the pending changes.
        running_now = listed[vmid]["status"] == "running"
        config = read_config(vmid, current=running_now)
        if running_now:
            change = _pct.passthrough_changes(config, read_config(vmid, current=False))
            if change:
                pending.append(dict(vmid=vmid, **change))
                module.warn(f"CT {vmid} has pending changes to its NVIDIA passthrough (removed: {describe(change['removed'])};"
                            f" added: {describe(change['added'])}): it keeps its current devices until it restarts."
                            " The GPUs reported are those it has now.")
        if selected or config["passthrough"]:
            configs[vmid] = config

    gpu_minors = uuids = None
    complete = False
    if any(c["minors"] for c in configs.values()):
        gpu_minors, uuids, complete = read_gpus(module, snap_params)

    containers = []
    for vmid, config in configs.items():
        row = listed[vmid]
        gpus = None
        if config["minors"] == []:
            gpus = []
        elif config["minors"] is not None and gpu_minors is not None:
            gpus, unknown = _pct.gpus_of(config["minors"], gpu_minors)
            if unknown:
                nodes = ", ".join(f"/dev/nvidia{m}" for m in unknown)
                if complete:
                    module.warn(f"CT {vmid} passes {nodes} through, but no GPU of this node has that minor number"
                                f" (the GPUs' minors: {describe(sorted(gpu_minors))}): a stale config line?")
                else:
                    module.warn(f"CT {vmid} passes {nodes} through, and not every GPU gave its minor number: its gpus"
                                " is null (its GPUs cannot be told)")
                    gpus = None
        containers.append(dict(
            vmid=vmid, name=row["name"] or config["hostname"] or "", status=row["status"], lock=row["lock"],
            running=row["status"] == "running", passthrough=config["passthrough"], minors=config["minors"], gpus=gpus,
            gpu_uuids=None if gpus is None else [uuids[i] for i in gpus]))

    running = [c for c in containers if c["running"]]
    union = set()
    for c in running:
        union = None if union is None or c["gpus"] is None else union | set(c["gpus"])
    result = dict(
        changed=False, containers=containers, running=[c["vmid"] for c in running],
        skipped_containers=[{"vmid": c["vmid"], "reason": c["status"]} for c in containers if not c["running"]],
        gpus=None if union is None else sorted(union), services_stopped=[], shut_down=[], check_mode=module.check_mode,
        pending_passthrough=pending)

    # Read the state of every service first: a container whose systemd cannot answer fails the task
    # before anything is stopped.
    states = {}
    for c in running:
        for unit in units:
            rc, out, err = run(["exec", str(c["vmid"]), "--", "systemctl", "is-active", unit])
            state, active = _pct.parse_is_active(out)
            if state is None:
                module.fail_json(msg=f"CT {c['vmid']}: systemctl is-active {unit} said nothing (rc {rc}): {err.strip()}."
                                     " Is systemd running in the container? Nothing was stopped.", **result)
            states[(c["vmid"], unit)] = (state, active)
    before = {str(c["vmid"]): dict(status=c["status"], services={u: states[(c["vmid"], u)][0] for u in units}
                                   if c["running"] else {}) for c in containers}

    def finish(**extra):
        result["changed"] = bool(result["services_stopped"] or result["shut_down"])
        if module._diff:
            after = {vmid: dict(status=ct["status"], services=dict(ct["services"])) for vmid, ct in before.items()}
            for entry in result["services_stopped"]:
                if entry["rc"] in (0, None):
                    after[str(entry["vmid"])]["services"][entry["unit"]] = "inactive"
            for vmid in result["shut_down"]:
                after[str(vmid)] = dict(status="stopped", services={u: "inactive" for u in units})
            result["diff"] = dict(before=before, after=after)
        result.update(extra)
        return result

    for c in running:
        vmid = c["vmid"]
        for unit in units:
            state, active = states[(vmid, unit)]
            if not active:
                continue
            entry = dict(vmid=vmid, unit=unit, state_before=state, rc=None, seconds=None)
            result["services_stopped"].append(entry)
            if module.check_mode:
                continue
            started = time.monotonic()
            rc, out, err = run(["exec", str(vmid), "--", "systemctl", "stop", unit])
            entry.update(rc=rc, seconds=round(time.monotonic() - started, 3))
            if rc != 0:
                module.fail_json(**finish(msg=f"CT {vmid}: systemctl stop {unit} failed (rc {rc}): {(err or out).strip()}."
                                              f" The unit may still hold the GPUs: look at pct exec {vmid} -- systemctl"
                                              f" status {unit}, fix it and run the task again."))
        if p["state"] != "shutdown":
            continue
        result["shut_down"].append(vmid)
        if module.check_mode:
            continue
        argv = ["shutdown", str(vmid), "--timeout", str(timeout)] + (["--forceStop", "1"] if p["force"] else [])
        rc, out, err = run(argv)
        if rc != 0:
            result["shut_down"].remove(vmid)
            advice = ("check the container's console (pct enter)" if p["force"] else
                      "set force: true to stop it after shutdown_timeout, or raise shutdown_timeout")
            module.fail_json(**finish(msg=f"CT {vmid} did not shut down (pct shutdown --timeout {timeout}, rc {rc}):"
                                          f" {(err or out).strip()}. {advice[0].upper() + advice[1:]}.", rc=rc))
    module.exit_json(**finish())


if __name__ == "__main__":
    main()
