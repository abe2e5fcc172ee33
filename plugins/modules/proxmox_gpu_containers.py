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
  - Runs on a Proxmox VE node. Finds the containers from the node's own files and the kernel, in its own process -
    no C(pct), a Perl program that loads the PVE libraries at each start - as C(pct list) and C(pct config) find them
    (pve-container's C(PVE::LXC::config_list), C(list_active_containers) and C(parse_pct_config)) - the node's
    containers from C(/etc/pve/.vmlist) (pmxcfs), which of them run from their LXC monitors' command sockets
    (C(/proc/net/unix)), and each one's config from C(/etc/pve/lxc/<vmid>.conf). With no O(containers), only the
    containers whose config passes NVIDIA devices through are reported. RV(pct_calls) says how many C(pct) it started.
  - A running container is read as it runs (what C(pct config <vmid> --current 1) shows). Its pending changes (the
    C([pve:pending]) section that C(pct set) or the GUI writes on a running container, for what cannot be hot-plugged,
    such as removing or changing a C(devN)) take effect at its next start; when they touch its NVIDIA passthrough, a
    warning and RV(pending_passthrough) say so. A stopped container is read with its pending changes applied (what it
    gets when started). Snapshot sections are never read as the config.
  - A container's GPUs come from its config - C(devN) device passthrough (PVE 8.1+), C(lxc.mount.entry) lines
    of C(/dev/nvidiaN) and C(lxc.cgroup2.devices.allow) lines of major 195. C(c 195:* rwm) with no C(/dev/nvidiaN)
    line gives the container every GPU of the node (RV(containers[].gpus) is null). The minor numbers are tied
    to GPU indexes through the driver (O(backend)).
  - The kernel has the last word on what a running container holds - its config file may have been edited while it
    runs (a hand edit, an C(lxc.*) line, which Proxmox VE never keeps pending). Its GPUs are those its config passes
    and those its processes hold (a context the driver lists for a process under its cgroup C(/lxc/<vmid>/ns), the
    GPU's C(/dev/nvidiaN) open; one snapshot of the GPUs, O(device_files)); the fence and the wait after it cover
    them all, and those beyond the file are in RV(containers[].gpus_beyond_config), with a warning that names them and
    the file. A running container whose config passes nothing is fenced when its processes hold a GPU (then read
    whenever another running container passes GPUs). A pending MIG mode change on a GPU the fence covers is a
    warning.
  - "The NVIDIA container toolkit's LXC hook (C(lxc.hook.mount: /usr/share/lxc/hooks/nvidia)) passes the GPUs of
    C(lxc.environment: NVIDIA_VISIBLE_DEVICES=...) - indexes or UUIDs (a unique prefix too), tied to the node's
    GPUs through the driver (one that no GPU has - RV(containers[].gpus) null and a warning); C(all) every GPU;
    C(none) the driver's control nodes, no GPU; C(void) or empty nothing. A bind of the node's whole C(/dev)
    (C(lxc.mount.entry: /dev dev none bind,...)) gives every GPU."
  - "A config line that may pass NVIDIA devices through in a way that cannot be read (another hook that runs before
    the container's init - C(lxc.hook.mount), C(autodev), C(pre-start), ... -, the toolkit's hook with no
    C(NVIDIA_VISIBLE_DEVICES) in the config, an C(lxc.include) or C(lxc.mount.fstab)) gets a warning naming it;
    with no other passthrough line, RV(containers[].passthrough) is null (unknown). Such a running container's GPUs
    are then those its processes hold (a context, or the GPU's C(/dev/nvidiaN) open - one more snapshot of the
    GPUs, O(device_files)); with no O(containers), it is fenced when they hold a GPU, and left out (the warning says
    so) when they hold none."
  - Only running containers are read when no O(containers) are named (stopped ones too with O(include_stopped));
    the whole discovery runs within O(pct_timeout). A node where C(/etc/pve) is not mounted (pmxcfs down) fails the
    task (C(error=pve_unavailable)) - its containers cannot be told - and nothing is stopped.
  - C(pct) runs only for what nothing else does - C(pct exec <vmid> -- systemctl) for the named O(services), C(pct
    shutdown) - and each call is counted in RV(pct_calls).
  - In each selected container that is running, stops the named systemd O(services) that are active
    (C(pct exec <vmid> -- systemctl stop <unit>), each under a time limit), so that their supervisor cannot restart
    the GPU work.
  - With O(state=released), the fence is this one task - it then releases the processes of the running containers
    that hold GPUs, with their workloads and the systemd units they run in, through the same path as
    M(gpuops.gpu.gpu_release) with O(gpuops.gpu.gpu_release#module:containers) set to those containers (its result
    is RV(release)). With O(state=shutdown) it shuts them down instead (C(pct shutdown)).
  - Every command is an argument list (no shell), and every container id and unit name is validated before
    anything runs. A container id the node does not have fails the task, and nothing is stopped.
  - A selected container that is not running is reported in RV(skipped_containers), never started; the GPUs of
    its config are in RV(gpus) when none of the selected containers runs (what a wait after the fence covers).
  - Every failure has an C(error) kind - C(pct_not_found), C(pct_failed), C(pve_unavailable) (C(/etc/pve) is not
    mounted or its C(.vmlist) cannot be read), C(no_such_container), C(container_timeout) (a container, C(pct) or the
    cluster filesystem did not answer in time), C(service_state_unknown), C(service_stop_failed),
    C(shutdown_failed), the release's (C(scope), C(process_list_unreadable), C(container_frozen) - a fenced container
    is frozen, nothing was stopped or signalled -, C(release_incomplete)) or the driver's.
author:
  - gpuops developers (@gpuops)
extends_documentation_fragment:
  - gpuops.gpu._attributes
  - gpuops.gpu.gpu
  - gpuops.gpu.gpu.release
attributes:
  check_mode:
    support: full
    details:
      - Reads the containers and the state of each service, and reports in RV(services_stopped), RV(shut_down) and
        RV(release) what would be stopped, shut down and released (with a null C(rc)); stops and signals nothing.
  diff_mode:
    support: full
    details:
      - A list of diffs - the status of each container and the state of each named service before and after
        (V(containers)); with O(state=released), the release's - the units it stops and one line per GPU before and
        after, as M(gpuops.gpu.gpu_release) shows them.
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
      - V(released) also releases the GPU holders of each selected running container (the fence in one task), after
        its services are stopped - O(signal), O(grace_period), O(escalate), O(kill_timeout), O(stop_units) and the
        options of the GPU snapshot apply, as in M(gpuops.gpu.gpu_release).
      - V(shutdown) also shuts each selected running container down (C(pct shutdown <vmid> --timeout N)),
        after its services are stopped.
    type: str
    choices: [present, released, shutdown]
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
  include_stopped:
    description:
      - With no O(containers), read the configs of the stopped containers too (they are never started nor stopped).
        Named O(containers) are read whatever their status.
    type: bool
    default: false
  pct_timeout:
    description:
      - Seconds the whole discovery may take (reading C(/etc/pve) - a hung pmxcfs blocks its readers), and each
        C(systemctl is-active) in a container; above 0 and at most 86400. A container, C(pct) or C(/etc/pve) that does
        not answer in time fails the task (C(error=container_timeout)) before anything is stopped.
      - A C(systemctl stop) may take O(grace_period) + O(kill_timeout) + O(pct_timeout); one that does not return
        by then fails the task, saying the container did not answer.
    type: float
    default: 30
requirements:
  - A Proxmox VE node (C(/etc/pve) mounted, C(pct)); root (C(become) - C(pct) needs it).
notes:
  - A container is C(running) while its LXC monitor runs (its command socket is bound), as C(pct list) says it; a
    frozen one too. Stopped otherwise.
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

- name: Fence CT 129 in one task - stop its service and release its GPU holders
  gpuops.gpu.proxmox_gpu_containers:
    containers: [129]
    services: [sglang]
    state: released
  become: true
  register: fence

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
extends_documentation_fragment:
  - gpuops.gpu.gpu
containers:
  description: The selected containers (or, with no O(containers), those whose config passes NVIDIA devices through).
  returned: always
  type: list
  elements: dict
  contains:
    vmid: {description: The container id., type: int, returned: always}
    name: {description: "Its name as C(pct list) shows it (the config's hostname, else C(CT<vmid>)).", type: str, returned: always}
    status: {description: What C(pct list) would say - V(running) or V(stopped)., type: str, returned: always}
    lock: {description: "Its config's lock (V(backup), V(migrate), ...), or an empty string.", type: str, returned: always}
    running: {description: Whether it is running., type: bool, returned: always}
    passthrough:
      description:
        - Whether its config passes NVIDIA devices (GPUs or control nodes) through; null when that cannot be read
          from the config (see C(passthrough_unknown)).
      type: bool
      returned: always
    passthrough_unknown:
      description:
        - The config lines (as C(pct config) prints them) that may pass NVIDIA devices through but cannot be read
          here - a hook script, a file elsewhere. When there are any, the running container's C(gpus) are those its
          processes hold, with those of its other lines.
      type: list
      elements: str
      returned: always
      sample: ["lxc.hook.mount: /usr/local/lib/lxc/gpu-hook"]
    minors:
      description:
        - The minor numbers of the C(/dev/nvidiaN) it gets, sorted; null when it gets every GPU (C(c 195:* rwm) and
          no line names one, a bind of C(/dev), the toolkit's C(NVIDIA_VISIBLE_DEVICES=all)).
      type: list
      elements: int
      returned: always
    gpus:
      description:
        - The indexes of the GPUs it gets; null means every GPU of the node (see C(minors)) or that they cannot be
          told - the driver could not be read, a toolkit GPU id no GPU of the node has, a stopped container with
          C(passthrough_unknown) lines (a warning says so).
      type: list
      elements: int
      returned: always
    gpu_uuids: {description: The UUIDs of C(gpus); null when C(gpus) is null., type: list, elements: str, returned: always}
    gpus_beyond_config:
      description:
        - For a running container, the GPUs its processes hold (a context, or the GPU's C(/dev/nvidiaN) open) that its
          config file does not pass - it was edited while the container runs (a hand edit, an C(lxc.*) line, which
          Proxmox VE never keeps pending). They are in C(gpus) - the kernel has the last word - and a warning names them
          and the file. Empty when none.
      type: list
      elements: int
      returned: always
    mig_devices:
      description:
        - The MIG devices the config passes - those whose capability nodes (C(/dev/nvidia-caps/nvidia-capN) of their GPU
          instance or compute instance, in a C(devN) or C(lxc.mount.entry) line) it names, or that the NVIDIA container
          toolkit's C(NVIDIA_VISIBLE_DEVICES) names by MIG UUID - by MIG UUID (see
          M(gpuops.gpu.gpu_facts) C(mig_devices)); empty when it passes none. A capability node no MIG device of the node
          has (but C(nvidia-cap1) and C(nvidia-cap2), MIG's config and monitor) is a warning.
        - A running container's are also those its processes are on (a context, or their capability nodes open), with a
          warning when its config does not name them. A config that passes the whole C(/dev/nvidia-caps) (a bind of the
          directory or of C(/dev), a C(devN) of it) names none - its MIG devices of each of its GPUs are those its
          processes are on, and where they are on none, those no other process holds (a warning says it cannot tell).
      type: list
      elements: str
      returned: always
    gpus_from:
      description:
        - Where C(wait_gpus) comes from. V(config) - C(gpus). For a running container whose config passes every GPU of
          the node (a C(devN) line for each C(/dev/nvidiaN), as Proxmox helper scripts write into every GPU container;
          C(c 195:*) with no node named; a bind of C(/dev)) while another running container passes GPUs too, such a
          config says nothing of which GPUs its work uses - V(processes) - the GPUs its processes kept busy before the
          fence (a context, or a node of a GPU whose process list cannot be trusted; not the nodes CUDA opens of every
          GPU it sees), at the discovery and in the release's look; V(unheld) - it held none - the GPUs of its config
          that no other container's processes held; V(config) again when they held every one (the wait then names
          them). A warning says which. The release is never narrowed - it stops the container's processes on whatever
          they hold.
      type: str
      returned: always
      choices: [config, processes, unheld]
    wait_gpus:
      description: What a wait after the fence covers of it (see C(gpus_from)); null means every GPU.
      type: list
      elements: int
      returned: always
    wait_mig_devices:
      description:
        - The GPUs it has only through MIG devices (C(mig_devices)), by index (a string) - their MIG UUIDs; a wait after
          the fence (C(proxmox_fence_result.container_gpus), M(gpuops.gpu.predeploy_host)) covers those MIG devices, not the
          GPU's others. Empty when it has none.
      type: dict
      returned: always
      sample: {"0": ["MIG-11ea0cf8-c5be-8cba-bdde-f32a839b7795"]}
  sample:
    - {"vmid": 129, "name": "gpu-ct", "status": "running", "lock": "", "running": true, "passthrough": true,
       "minors": [0, 1], "gpus": [0, 1], "gpu_uuids": ["GPU-3fb142e7-7102-c7ac-bd5a-fc829e11ed84",
       "GPU-8f0e2a51-1c3d-4b7a-9e21-5f0c8d7a6b42"], "passthrough_unknown": []}
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
waited_for_lock:
  description:
    - This fence waited for another run on one of its containers (O(lock_timeout)) before it read their services, as
      M(gpuops.gpu.gpu_release)'s RV(gpuops.gpu.gpu_release#module:waited_for_lock) says it (its keys are the same; the
      role's summary starts with its C(text)); C(release.waited_for_lock) is the release's own wait for a GPU.
  returned: when it waited
  type: dict
pct_calls:
  description:
    - How many C(pct) processes this run started (each one loads the PVE libraries first) - the discovery starts none;
      each named service costs one C(pct exec) per running container to read its state, and one more to stop it, a
      shutdown one C(pct shutdown), a unit stopped by the release one C(pct exec).
  returned: always
  type: int
  sample: 0
pending_passthrough:
  description:
    - The running containers whose pending changes touch their NVIDIA passthrough (their config with the
      C([pve:pending]) section applied, what C(pct config <vmid>) shows, differs from what they run with), each with
      C(vmid), C(removed) and C(added) (the passthrough lines, as C(pct config) prints them) and C(minors) (the GPU
      minors the container gets at its next start; null means every GPU). What they run with now is in RV(containers).
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
    - The union of the running containers' GPU indexes, sorted; when none of the named O(containers) runs, the union
      of their configs' GPUs (what they get when started). Null when one of them gets every GPU (or its GPUs could
      not be told).
  returned: always
  type: list
  elements: int
  sample: [0, 1]
wait_gpus:
  description:
    - What a wait after the fence covers - the union of the counted containers' C(wait_gpus) (the running ones', or,
      when none of the named ones runs, theirs); it differs from RV(gpus) only for a config that passes every GPU of
      a node shared with other GPU containers (RV(containers[].gpus_from)). Null means every GPU.
  returned: always
  type: list
  elements: int
  sample: [0, 1, 2, 3]
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
release:
  description:
    - With O(state=released), when a selected container runs - the outcome of the release of its GPU holders, as
      M(gpuops.gpu.gpu_release) returns it (C(released), C(survivors), C(respawned), C(protected),
      C(skipped_processes), C(stopped_units), C(unstopped_units), C(left_holders), C(quiet_since), C(counts),
      C(elapsed), C(gpu_errors), C(holder_processes)) with its GPUs before and after as records (C(gpus_before) and C(gpus) in
      the shape of RV(gpuops.gpu.gpu_release#module:gpus_before) - not the snapshot, as the wait after the fence takes
      its own) and without its diff (the fence's diff shows it); in check mode what would be released. On a failure of
      the release, what it did until then.
    - The release selects the GPUs of the running containers (RV(gpus)) unless O(gpus) is set (every GPU when RV(gpus)
      is null or empty) - a GPU they do not have whose process list cannot be read is in C(gpu_errors) and a warning,
      and does not fail the fence.
  returned: with O(state=released) and a running container
  type: dict
  sample: {"changed": true, "released": [{"pid": 8812, "name": "python3", "container": {"kind": "lxc", "id": 129},
           "signals": ["SIGTERM"], "seconds": 1.2}], "survivors": [], "respawned": [], "stopped_units": []}
"""

from ansible_collections.gpuops.gpu.plugins.module_utils._common import new_module, run_module
from ansible_collections.gpuops.gpu.plugins.module_utils._host import runs

ARGUMENT_SPEC = runs.FENCE_SPEC


def main() -> None:
    # The module's whole run is _host.runs.fence (predeploy_host runs the same in its one module run).
    module = new_module(dict(ARGUMENT_SPEC), supports_check_mode=True)
    run_module(module, *runs.fence(module, module.params))


if __name__ == "__main__":
    main()
