#!/usr/bin/python
# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_release
short_description: Stop exactly the processes that hold the chosen GPUs, gracefully and safely
version_added: 0.1.0
description:
  - Finds the processes that hold the selected GPUs, narrows them with the filters, and stops them -
    O(signal) first, then after O(grace_period) SIGKILL when O(escalate) is set.
  - What holds a GPU is decided by the collection's holding model (C(docs/holding-model.md)) - every process
    the driver reports with a context on a selected GPU; with O(include_device_holders), every process that
    holds a selected GPU's C(/dev/nvidiaN), unless the driver shows it with contexts only on GPUs that are
    not selected (CUDA opens the node of every GPU it can see); never a process that holds only the control
    nodes (C(nvidiactl), C(nvidia-uvm), ...) that every NVML or CUDA client holds, unless O(pids) names it.
    Each released process says its C(evidence) (V(context), V(device) or V(control)).
  - When the driver's process list of a selected GPU cannot be read, the module fails and signals nothing
    (unless O(pids) names what to stop), rather than report nothing to release.
  - With O(tree) the descendants of each holder are stopped too, at the same time as the holder
    (children and parent are signalled together, each by pid, not by process group), so that the
    workers of an inference server go with its API process.
  - Never signalled, whatever the filters say - PID 1, kernel threads, the module's own process and all
    its ancestors (the SSH session, Ansible), the NVIDIA daemons (C(nvidia-persistenced),
    C(nv-fabricmanager), C(nv-hostengine), C(dcgm-exporter), C(nvidia-smi), the MPS control daemon
    C(nvidia-cuda-mps-control)) and whatever O(protect) adds.
  - An MPS server (C(nvidia-cuda-mps-server)) runs the CUDA contexts of its clients. Releasing a job stops its
    clients; the server is signalled only when every MPS client the driver lists on the GPUs it serves is a target
    of this release (and, when no client is listed, only when it serves no GPU outside the release), even when
    O(pids) names it. Otherwise it is in RV(skipped_processes) with the clients it carries, and it exits by itself
    once its last client has exited (or C(echo quit | nvidia-cuda-mps-control) stops MPS).
  - Never signals a recycled PID - each process is pinned by (pid, start time) and a pidfd where the kernel
    and Python allow, and its identity is checked again before each signal.
  - Returns when the processes are gone. It does not wait for the GPU memory to be freed; chain
    M(gpuops.gpu.gpu_wait_idle) for that.
author:
  - gpuops developers (@gpuops)
extends_documentation_fragment:
  - gpuops.gpu.gpu
  - gpuops.gpu.gpu.release
  - gpuops.gpu._attributes
attributes:
  check_mode:
    support: full
    details:
      - Lists exactly what would be signalled and signals nothing.
  diff_mode:
    support: full
    details:
      - Shows the units it stops (V(unit sglang.service in CT 129 - active), then V(stopped)) and one line per selected
        GPU before and after - its memory in use and what keeps it busy (V(GPU 0 - 130048 MiB used, pid 8812 (python3)
        in CT 129)), then V(idle), V(released) or what is left. With O(detail=summary) each line names at most 8
        holders (V(and 12 more)) and the diff at most 8 units, the rest counted.
options:
  containers:
    description:
      - Only processes inside these Proxmox VE containers (vmids, 100 to 999999999). Others are reported in
        RV(skipped_processes).
      - Run the module on the Proxmox node to see the containers' processes.
      - On a Proxmox VE node a vmid that the node does not have (C(/etc/pve/.vmlist)) fails the task before anything
        is stopped (C(error=no_such_container)), as M(gpuops.gpu.proxmox_gpu_containers) refuses it.
    type: list
    elements: int
  users:
    description:
      - Only processes of these users (names or uids).
      - Each process is named where it lives. On the host, by the node's passwd and uid. In a Proxmox VE container,
        by the container's own C(/etc/passwd) and its uid in the container, mapped through the container's idmap
        (an unprivileged container's default C(lxc.idmap u 0 100000 65536) makes its uid 1000 node uid 101000).
        So V(alice) or V(1000) selects the container's alice. The node uid V(101000) does not, and neither does a
        node user that has the same name or uid.
      - Use it together with O(containers) to mean one container's users.
    type: list
    elements: str
  match:
    description:
      - Only processes whose command line matches this regular expression.
      - It sees the real command line (the results show it redacted, see O(redact)), its first 4096 characters.
        The rules of O(protect) apply - no repeated group that itself repeats or alternates, a time budget.
    type: str
  pids:
    description: Only these pids (as seen from where the module runs), each from 1 to 4194304.
    type: list
    elements: int
  exclude:
    description:
      - Never processes whose command line matches this regular expression (descendants included).
      - It sees the real command line, as O(match) does, with the same rules.
    type: str
  tree:
    description:
      - Also stop the workload of each target - its descendants, and its ancestors in the same cgroup up to the
        workload's root (an API process that holds no GPU itself) - through the same scope gate as the holders.
      - An ancestor joins only when every GPU holder below it is a target (a launcher that also runs other jobs stays);
        a descendant that holds a context only on GPUs that are not selected is another job and stays.
      - A process that appears during the release is signalled only when it descends from a signalled target (or was
        orphaned by one); every other new holder is reported in RV(respawned), never signalled.
    type: bool
    default: true
  expected_count:
    description:
      - The number of GPUs the host must show. Any other number fails before anything is signalled, naming both
        (a GPU fell off the bus, or the play runs on the wrong host). From 0 to 1024.
    type: int
  all:
    description:
      - With no filter (O(containers), O(users), O(match), O(pids)), the release proceeds only when every target
        lives in one place (one container, or the host); otherwise it fails without signalling and lists the places.
      - V(true) releases every holder of the selected GPUs wherever it lives.
    type: bool
    default: false
seealso:
  - module: gpuops.gpu.gpu_facts
  - module: gpuops.gpu.gpu_wait_idle
"""

EXAMPLES = r"""
---
- name: Stop whatever holds the GPUs of CT 129 (on the Proxmox node), SIGTERM then SIGKILL after 10 s
  gpuops.gpu.gpu_release:
    containers: [129]

- name: Stop only the inference server on GPUs 0-3, with a longer grace period, keeping a notebook
  gpuops.gpu.gpu_release:
    gpus: ["0", "1", "2", "3"]
    # (?i): vLLM renames its engine and workers VLLM::EngineCore, VLLM::Worker_TP0, ... (they outlive a killed API
    # server), and match is case-sensitive
    match: "(?i)sglang|vllm"
    exclude: jupyter
    grace_period: 30

- name: What would be stopped?
  gpuops.gpu.gpu_release:
    containers: [129]
  check_mode: true
  register: would_release

- name: Release the GPUs of CT 129, then wait until every GPU is free
  become: true
  block:
    - name: Release the GPUs
      gpuops.gpu.gpu_release:
        containers: [129]
      register: release
    - name: Wait for the memory to be freed
      gpuops.gpu.gpu_wait_idle:
        expected_count: 8
        quiet_since: "{{ release.quiet_since }}"
        left_holders: "{{ release.left_holders }}"

- name: Every holder of GPU 7, wherever it lives (on the host and in any container)
  gpuops.gpu.gpu_release:
    gpus: ["7"]
    all: true
"""

RETURN = r"""
extends_documentation_fragment:
  - gpuops.gpu.gpu
released:
  description: The processes that were (in check mode - would be) signalled.
  returned: always
  type: list
  elements: dict
  contains:
    pid: {description: Host pid (as seen from where the module runs)., type: int, returned: always}
    name: {description: Process name., type: str, returned: always}
    cmdline:
      description:
        - Command line, with secrets hidden (see O(redact)) and cut at 1000 characters; null with O(cmdline=false).
      type: str
      returned: always
    user:
      description: User name; for a process in a container, its name in the container's C(/etc/passwd) (its uid there
        when that has none).
      type: str
      returned: always
    container:
      description:
        - C({kind, id, pid_in_container, uid_in_container}) or null. C(uid_in_container) is the process's uid in the
          container (through its idmap); null when the idmap does not hold the process's node uid.
      type: dict
      returned: always
    gpus: {description: Indices of the selected GPUs it held (or its ancestor held)., type: list, elements: int, returned: always}
    via: {description: For a descendant - the pid of the holder it descends from; else null., type: int, returned: always}
    signals:
      description:
        - Signals sent, in order.
        - Empty in check mode, and for a process that exited before its signal was sent (its parent stopped it).
      type: list
      elements: str
      returned: always
    seconds: {description: Seconds from the first signal until it was gone (null in check mode)., type: float, returned: always}
  sample:
    - {"pid": 8812, "name": "python3", "cmdline": "python3 -m sglang.launch_server", "user": "root",
       "container": {"kind": "lxc", "id": 129, "pid_in_container": 245, "uid_in_container": 0}, "gpus": [0], "via": null,
       "signals": ["SIGTERM"], "seconds": 0.21}
quiet_since:
  description:
    - Since when this release saw no holder of the selected GPUs - its last target gone, the last holder its watch for
      newcomers saw - for O(gpuops.gpu.gpu_wait_idle#module:quiet_since) of the wait that follows on this host, so that
      its settle window counts from then. C(clock) is in seconds of C(CLOCK_MONOTONIC), from the boot C(boot_id);
      C(gpus) the GPUs watched; C(device_holders) the C([pid, start time]) of the processes that held a device node of
      them with no context, all along.
    - Null in check mode, and when the watch ended with a context on a selected GPU or a new holder.
  returned: always
  type: dict
  sample: {"clock": 18254.031, "boot_id": "6f2b0c1e-0f4e-4d59-9d7b-3c1a2b4e5f60", "gpus": [0, 1], "device_holders": [[4711, 81234]]}
left_holders:
  description:
    - The processes that still keep a selected GPU busy at the end and that this release left by its verdict -
      outside its scope (RV(skipped_processes)) or protected (RV(protected)) - each C({pid, start_time, reason}).
      Nothing this release or the wait after it does will stop them.
    - For O(gpuops.gpu.gpu_wait_idle#module:left_holders) of the wait that follows on this host, which then fails
      fast on them, naming each and why it was left, instead of waiting out its timeout.
    - With O(detail=summary), at most 64 of them (at 64 GPUs; 64 / N times as many on N GPUs), counted in
      C(detail.more) - each one keeps a GPU busy, so the wait fails fast on any one of them all the same.
  returned: when not failed
  type: list
  elements: dict
  sample: [{"pid": 872, "start_time": 81234, "reason": "in CT 130, not in containers (129)"}]
survivors:
  description: Processes still alive after SIGKILL and O(kill_timeout) (or after O(grace_period) without O(escalate)).
  returned: always
  type: list
  elements: dict
protected:
  description: Holders that were not signalled because they are protected, with C(reason).
  returned: always
  type: list
  elements: dict
skipped_processes:
  description:
    - Holders outside the filters (or not reachable from here), with C(reason). Never signalled.
    - An MPS server that carries a client outside the release is here, its C(reason) naming each such client and
      its GPUs (V(pid 4242 on GPU 1 (not selected\))).
    - Named so, not C(skipped), because Ansible reserves C(skipped) in task results.
  returned: always
  type: list
  elements: dict
respawned:
  description:
    - Holders of the selected GPUs after the release that were not there before and do not descend from a signalled
      target (a supervisor restarting the server, or a job that started meanwhile). They are never signalled.
    - Each has its C(unit), C(supervisor) (the first process up its parent chain that is older than the release, such
      as systemd as PID 1 of the container, an init, a shell loop or supervisord), C(in_scope) (whether it would be in
      this release's scope - a respawn of what was released, or a new job in the same place) and C(advice), for example
      C(pid 812 started 1.1 s after the release in sglang.service in CT 129 by systemd (pid 4012, PID 1 of CT 129) -
      its supervisor restarted it ...).
    - An entry with C(in_scope) true fails the module (the GPUs are held again); one outside the scope is a warning.
  returned: always
  type: list
  elements: dict
stopped_units:
  description:
    - The systemd units stopped before the signals (in check mode - that would be), with C(unit), C(container),
      C(pids) (the targets in it), C(command), C(rc) and C(seconds).
  returned: always
  type: list
  elements: dict
  sample: [{"unit": "sglang.service", "container": 129, "pids": [8812, 8813], "rc": 0, "seconds": 1.2,
            "command": ["/usr/sbin/pct", "exec", "129", "--", "systemctl", "stop", "sglang.service"]}]
unstopped_units:
  description:
    - The units of the targets that could not be stopped (C(pct exec) into a container that did not answer, C(systemctl)
      failed, no C(pct) here), with C(unit), C(container) and C(error). Their processes are signalled all the same,
      but their supervisor (systemd's C(Restart=)) can start the work again - the module fails
      (C(error=release_incomplete)), naming each unit and the command that stops it.
  returned: always
  type: list
  elements: dict
  sample: [{"unit": "sglang.service", "container": 129, "error": "stopping sglang.service in CT 129 failed (rc 1): ..."}]
frozen:
  description:
    - The targets in a frozen cgroup, by container (C(container) null - the host), when the release was refused for it
      (C(error=container_frozen), before anything is stopped or signalled, in check mode too) or, frozen after the
      plan, left unsignalled (C(error=release_incomplete)). A frozen container (a suspend-mode backup, C(lxc-freeze))
      answers no C(systemctl stop), runs no signal handler, and its supervisor restarts the work after the thaw -
      wait for the backup, or thaw it (C(lxc-unfreeze -n <vmid>)), then run again. (C(pct suspend) does not freeze - it
      checkpoints the container with CRIU and stops it.)
  returned: when a target was frozen
  type: list
  elements: dict
  sample: [{"container": 129, "pids": [8812, 8813]}]
containers_changed:
  description:
    - The containers of the targets whose init (PID 1) was no longer the same process after the release, with
      C(container), C(init) and C(now) (C({pid, start_time}); C(now) null when none runs) and C(what) - V(stopped)
      (a warning - its processes ended with it) or V(restarted) (the module fails - what starts at its boot may hold
      the GPUs again).
  returned: when the release ran (not in check mode)
  type: list
  elements: dict
  sample: [{"container": 129, "init": {"pid": 4012, "start_time": 81234}, "now": null, "what": "stopped"}]
places:
  description: Where the targets live, when an unscoped release was refused (see O(all)).
  returned: when the release was refused for that reason
  type: dict
  sample: {"CT 129": [8812], "CT 130": [9120]}
gpus_before:
  description:
    - The selected GPUs as the release found them, before any signal - one record per GPU of what a before and after
      table reads (the result carries the snapshot once, RV(gpus)) - C(index), C(uuid), C(name), C(memory)
      (C(used), C(total)), C(health) (C(status)), C(idle), C(busy_reasons), C(blockers), C(process_count) and
      C(holder_count) (how many processes and device-file holders it had), and of its blockers only - C(processes)
      (the driver's entries - C(pid), C(used_mib), C(name), C(container), C(unit), C(visible)) and C(holders) (pids by
      their evidence, V(context), V(device), V(control), V(lingering); their details in RV(holder_processes)). The
      filter P(gpuops.gpu.gpu_table#filter) renders it as O(gpuops.gpu.gpu_table#filter:before).
  returned: when the GPUs could be read, but in check mode (its one look is RV(gpus))
  type: list
  elements: dict
holder_processes:
  description:
    - The details of every process named in the C(holders) of RV(gpus_before) (its blockers) and RV(gpus), once each, keyed by its
      pid (a string) - as M(gpuops.gpu.gpu_facts) returns them in C(gpu_holder_processes) (C(name), C(cmdline),
      C(user), C(container), C(unit), C(files) by directory, C(protected), ...), with C(gpus) the indexes of the GPUs
      it holds (a context or the GPU's node), before or after. A pid seen in both looks has the details of the first.
    - Give it to P(gpuops.gpu.gpu_table#filter) and P(gpuops.gpu.gpu_blockers#filter) as their C(holder_processes).
  returned: when the GPUs could be read
  type: dict
  sample: {"8813": {"pid": 8813, "name": "python3", "container": {"id": "129", "kind": "lxc"}, "unit": null,
                    "protected": null, "files": {"/dev": ["nvidia0", "nvidiactl"]}, "gpus": [0]}}
gpus:
  description:
    - The selected GPUs after the release (its last look, after the respawn watch), in the shape of
      M(gpuops.gpu.gpu_facts) C(gpu_devices); in check mode its one look (no RV(gpus_before)). Null when that
      look failed. Memory that the driver frees after an exit may still show here.
    - Each GPU's C(holders) are lists of pids keyed by their evidence (V(context), V(device), V(control),
      V(lingering)), their details once in RV(holder_processes).
    - With O(detail=summary) a GPU's lists are capped, and its C(more) counts what was left out (see
      M(gpuops.gpu.gpu_facts) C(gpu_devices[].more) and C(detail)).
  returned: when the release ran
  type: list
  elements: dict
counts:
  description:
    - How many entries each list of the outcome has in the whole result - C(released), C(survivors), C(respawned),
      C(protected), C(skipped_processes), C(stopped_units), C(unstopped_units) and C(left_holders) - whatever
      O(detail) left in the lists themselves.
  returned: when the release ran (in check mode too)
  type: dict
  sample: {"released": 260, "survivors": 0, "respawned": 0, "protected": 1, "skipped_processes": 12,
           "stopped_units": 1, "unstopped_units": 0, "left_holders": 0}
waited_for_lock:
  description:
    - This run waited for another run's release or fence of the same container or GPU (O(lock_timeout)) - what it
      found, stopped and released is what the other run left. C(seconds) it waited, C(for) what (C(CT 129),
      C(GPU 3)), the other run's C(pid) and C(module), and C(text), the sentence that says it (also a warning).
  returned: when it waited
  type: dict
  sample: {"seconds": 3.1, "for": "CT 129", "pid": 4242, "module": "proxmox_gpu_containers",
           "text": "waited 3.1 s for another run's fence of CT 129 (pid 4242, proxmox_gpu_containers), which ran first:
                    what it stopped and released is in its own result; this run found what it left"}
elapsed:
  description: Seconds the release took.
  returned: always
  type: float
unreadable_gpus:
  description:
    - The selected GPUs whose process list the driver could not give (an NVML error, or a list whose entries
      cannot be real processes). The module then fails and signals nothing, unless O(pids) names what to stop.
  returned: when the module failed for that reason
  type: list
  elements: int
  sample: [3]
gpu_errors:
  description:
    - The GPUs that are not selected (O(gpus)) whose process list the driver could not give, each with C(index),
      C(pci_bus_id) and C(error). Reported (and warned about), never a failure - the selected GPUs were released - but
      what holds those GPUs is not known.
  returned: when such a GPU was seen
  type: list
  elements: dict
  sample: [{"index": 5, "pci_bus_id": "00000000:AB:00.0", "error": "processes could not be read: Unknown Error"}]
"""

from ansible_collections.gpuops.gpu.plugins.module_utils._common import new_module, run_module
from ansible_collections.gpuops.gpu.plugins.module_utils._host import runs

ARGUMENT_SPEC = runs.RELEASE_SPEC


def main() -> None:
    # The module's whole run is _host.runs.release (predeploy_host runs the same in its one module run).
    module = new_module(dict(ARGUMENT_SPEC), supports_check_mode=True)
    run_module(module, *runs.release(module, module.params))


if __name__ == "__main__":
    main()
