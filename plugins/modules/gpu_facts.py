#!/usr/bin/python
# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_facts
short_description: One snapshot of a host's NVIDIA GPUs, the processes on them and who holds them
version_added: 0.1.0
description:
  - Gathers, in one snapshot, the host's NVIDIA GPUs (identity, memory, utilization, temperature, power,
    modes, health), the processes the driver reports on each GPU, and the processes that hold each
    GPU's device file open.
  - Each process is attributed to the Proxmox VE LXC container it lives in (from C(/proc/<pid>/cgroup)),
    with its pid inside the container.
  - Each GPU carries C(idle) and C(busy_reasons), by the same definition that M(gpuops.gpu.gpu_wait_idle) waits for.
  - Each GPU carries its health - remapped rows, retired pages pending, uncorrectable ECC errors, the NVSwitch fabric
    state, the clock event reasons that mean a hardware slowdown, a utilization latched with no process - through
    NVML, or C(nvidia-smi) with O(backend=nvidia-smi); a field the driver or GPU cannot give is null and listed in
    C(unsupported). C(health.checks) lists the checks that fail, with what to do.
  - With O(min_free_mib) or O(min_free_pct), each GPU carries C(fit) and C(fits) - whether the next server fits.
  - The Xid events of the kernel log (V(xid) in O(gather)) are listed per GPU with their meaning.
  - Inside a container the driver may report memory in use but no process, or pids that do not exist
    there; the module says so instead of guessing. Run it on the Proxmox node for complete attribution.
author:
  - gpuops developers (@gpuops)
extends_documentation_fragment:
  - gpuops.gpu.gpu
  - gpuops.gpu.gpu.idle
  - gpuops.gpu._attributes
  - gpuops.gpu._attributes.facts_module
options:
  gather:
    description:
      - What to gather besides the driver's view of the GPUs.
      - V(processes) reads name, command line, user and container of every process the driver reports.
      - V(holders) scans C(/proc/*/fd) for the O(device_files).
      - V(xid) reads the Xid events of the kernel log (O(kernel_log)).
    type: list
    elements: str
    choices: [processes, holders, xid]
    default: [processes, holders, xid]
  missing:
    description:
      - What to do on a host where no NVIDIA driver can be used (no library, no C(nvidia-smi), driver not loaded).
      - V(fail) fails the task with the cause.
      - V(ignore) returns C(gpu_count=0) so that a mixed fleet can gather facts everywhere.
    type: str
    choices: [fail, ignore]
    default: fail
requirements:
  - The NVIDIA driver, and either C(nvidia-ml-py) (C(import pynvml)) or C(nvidia-smi) on the target.
notes:
  - Reading other users' C(/proc/<pid>/fd) needs root; without it holders of other users are not seen, and the
    module warns that C(holders) are incomplete (run it with C(become=true)).
  - Holders are found by the identity of the open file (device and inode, and the device number of a character
    device), as C(fuser) does, not by its name, so a container's process that holds a node bound from another
    path is found; C(files) are the paths of the matched O(device_files).
seealso:
  - module: gpuops.gpu.gpu_release
  - module: gpuops.gpu.gpu_wait_idle
"""

EXAMPLES = r"""
---
- name: Gather GPU facts (as root - every process's /proc entries and open files)
  gpuops.gpu.gpu_facts:
  become: true

- name: Show what keeps each busy GPU busy
  ansible.builtin.debug:
    msg: "GPU {{ item.index }}: {{ item.busy_reasons | join('; ') }}"
  loop: "{{ ansible_facts.gpu_devices | rejectattr('idle') }}"
  loop_control:
    label: "{{ item.index }}"

- name: Facts for two GPUs, through nvidia-smi, without the device-file scan
  gpuops.gpu.gpu_facts:
    gpus: ["0", "GPU-3fb142e7-7102-c7ac-bd5a-fc829e11ed84"]
    backend: nvidia-smi
    gather: [processes]

- name: Will a vLLM server with gpu_memory_utilization 0.9 fit, and are the GPUs healthy?
  gpuops.gpu.gpu_facts:
    min_free_pct: 90
  become: true
  register: gpu_check

- name: Show what keeps each GPU from taking the next server
  ansible.builtin.debug:
    msg: "GPU {{ item.index }}: fits={{ item.fits }}, checks={{ item.health.checks | map(attribute='check') | list }}"
  loop: "{{ ansible_facts.gpu_devices }}"
  loop_control:
    label: "{{ item.index }}"

- name: Facts on a mixed fleet where some hosts have no GPU
  gpuops.gpu.gpu_facts:
    missing: ignore
"""

RETURN = r"""
extends_documentation_fragment:
  - gpuops.gpu.gpu
ansible_facts:
  description: The GPU facts, all prefixed C(gpu_).
  returned: always
  type: dict
  contains:
    gpu_driver:
      description: Driver versions and the backend that was used.
      returned: always
      type: dict
      sample: {"backend": "nvml", "driver_version": "580.159.03", "cuda_driver_version": "13.0", "nvml_version": "13.580.159.03",
               "process_query": {"function": "nvmlDeviceGetComputeRunningProcesses_v3", "entry_bytes": 24}}
      contains:
        process_query:
          description:
            - With O(backend=nvml), the NVML process query this driver was read with and the size of its entries
              (32 bytes for the C(_v3) query on the R535 branch, 24 for C(_v3) elsewhere and for C(_v2),
              16 for the unversioned query of R440 and older); null with nvidia-smi.
          type: dict
          returned: always
        missing_fields:
          description:
            - With the nvidia-smi backend, the C(--query-gpu) fields this driver's nvidia-smi does not have and the facts
              were read without (C(memory.reserved) before R510, when C(memory.reserved) is null and C(memory.used)
              includes it).
          type: list
          elements: str
          returned: with the nvidia-smi backend
    gpu_kernel_log:
      description:
        - Where the Xid events came from - C(source) (the file, C(/dev/kmsg) or V(dmesg)), C(readable), C(problem)
          (why it could not be read - not root on the node, a container without the host's log) and C(xid_events)
          (how many, over every GPU); null when V(xid) is not in O(gather).
      returned: always
      type: dict
      sample: {"source": "/dev/kmsg", "readable": true, "problem": null, "xid_events": 1}
    gpu_count:
      description: The number of GPUs the driver shows (all of them, whatever O(gpus) selects).
      returned: always
      type: int
      sample: 8
    gpu_holder_processes:
      description:
        - The details of every process named in a GPU's C(holders), once each, keyed by its pid (a string) - the
          same fields as C(processes) (C(pid), C(name), C(cmdline), C(user), C(uid), C(ppid), C(start_time),
          C(container), C(unit)), plus C(files) (the matched O(device_files) it holds, by directory - each directory
          once, with the names of the files in it), C(protected) (why it is never signalled, or
          null) and C(gpus) (the indexes of the selected GPUs it holds - a context there, or the GPU's C(/dev/nvidiaN);
          empty for a process that holds only the control nodes).
        - Give it to the filters that name holders (P(gpuops.gpu.gpu_table#filter), P(gpuops.gpu.gpu_blockers#filter),
          P(gpuops.gpu.gpu_report_rows#filter)) as their C(holder_processes).
      returned: always
      type: dict
      sample: {"8813": {"pid": 8813, "name": "python3", "cmdline": "python3 -m vllm.entrypoints.openai.api_server",
                        "user": "root", "uid": 0, "ppid": 8790, "start_time": 123456, "unit": null,
                        "container": {"id": "129", "kind": "lxc"}, "protected": null,
                        "files": {"/dev": ["nvidia-uvm", "nvidia0", "nvidia1", "nvidiactl"]}, "gpus": [0, 1]}}
    gpu_devices:
      description:
        - One entry per selected GPU, in index order.
        - Fields a backend cannot give are null.
      returned: always
      type: list
      elements: dict
      contains:
        index: {description: GPU index as the driver numbers it., type: int, returned: always}
        uuid: {description: GPU UUID., type: str, returned: always}
        name: {description: Product name., type: str, returned: always, sample: NVIDIA H200}
        serial: {description: Board serial number., type: str, returned: always}
        pci_bus_id: {description: PCI bus id., type: str, returned: always, sample: "00000000:18:00.0"}
        minor_number:
          description: Device minor number (C(/dev/nvidiaN)); with O(backend=nvidia-smi) it comes from C(nvidia-smi -q -x).
          type: int
          returned: always
        memory:
          description:
            - Memory in MiB - C(total), C(used), C(free), C(reserved); each null when the GPU cannot report it (unified-memory
              parts such as the GB10 report no memory at all).
            - C(used_includes_reserved) is true when the driver has no C(nvmlDeviceGetMemoryInfo_v2) (before R510) or it
              was not supported, so that the v1 query was used, whose C(used) includes the memory the driver reserves
              (C(reserved) is then null).
          type: dict
          returned: always
          sample: {"total": 143771, "used": 81920, "free": 61851, "reserved": 0, "used_includes_reserved": false}
        utilization: {description: "C(gpu) and C(memory) utilization, in %.", type: dict, returned: always}
        temperature: {description: GPU temperature in C., type: int, returned: always}
        power: {description: Power draw in W., type: float, returned: always}
        persistence_mode: {description: Whether persistence mode is on., type: bool, returned: always}
        compute_mode: {description: "V(default), V(exclusive_process) or V(prohibited).", type: str, returned: always}
        mig_mode: {description: Whether MIG mode is on., type: bool, returned: always}
        mig_mode_pending:
          description:
            - The MIG mode the GPU takes at its next reset (C(nvmlDeviceGetMigMode)); when it differs from C(mig_mode) the
              check V(mig_mode_pending) fails. Null where the driver has no MIG (before R450); with O(backend=nvidia-smi)
              it is read (C(nvidia-smi -q -x) C(mig_mode/pending_mig)) for the GPUs in MIG mode only, null for the others.
          type: bool
          returned: always
        mig_selected:
          description:
            - Only when O(gpus) names this GPU by MIG UUIDs alone (not by its index, UUID or bus id, which mean all its
              MIG devices) - those MIG devices' UUIDs. The GPU is then judged as far as they go - its C(processes),
              C(holders), C(memory) (their sum), C(mig_devices) and C(idle) are theirs; the release stops their
              processes only and the wait waits for them only.
          type: list
          elements: str
          returned: when O(gpus) names MIG devices
        mig_unselected_pids:
          description: With C(mig_selected) - the pids on this GPU's other MIG devices (left out of it).
          type: list
          elements: int
          returned: when O(gpus) names MIG devices
        mig_devices:
          description:
            - The MIG devices of a GPU in MIG mode (empty otherwise; null when the driver cannot list them), in the
              driver's order (C(nvmlDeviceGetMigDeviceHandleByIndex); with O(backend=nvidia-smi), C(nvidia-smi -L) and
              C(-q -x)) - C(uuid) (C(MIG-...)), C(gpu) (this GPU's index), C(gpu_instance_id), C(compute_instance_id),
              C(name) and C(profile) (V(3g.71gb)), C(memory) (C(total), C(used), C(free), C(reserved) in MiB, the
              device's own), C(processes) (the pids the driver lists on this MIG device; the GPU's C(processes) entries
              name it in their C(mig_device)), C(processes_error), C(device_nodes) (its GPU instance's and compute
              instance's C(/dev/nvidia-caps/nvidia-capN), from C(/proc/driver/nvidia/capabilities)), C(holders) (the pids
              that hold those nodes) and C(idle) (no process, no unprotected holder of its nodes, no more than
              O(max_memory_used_mib) in use).
            - Give a C(uuid) to O(gpus) of M(gpuops.gpu.gpu_release) and M(gpuops.gpu.gpu_wait_idle) to act on that MIG
              device alone.
          type: list
          elements: dict
          returned: always
          sample: [{"uuid": "MIG-b9f1b336-ba76-9bca-0471-3b5ad9dcf7e1", "gpu": 0, "gpu_instance_id": 1,
                    "compute_instance_id": 0, "name": "NVIDIA H200 MIG 3g.71gb", "profile": "3g.71gb",
                    "memory": {"total": 68160, "used": 4096, "free": 64064, "reserved": 0, "used_includes_reserved": false},
                    "processes": [8812], "processes_error": null, "holders": [8812], "idle": false,
                    "device_nodes": ["/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"]}]
        health:
          description:
            - C(status) (V(ok), V(lost) or V(error)) and C(detail).
            - C(checks) - every health check that fails on this GPU (O(health_checks) lists them), each with C(check),
              C(detail), C(action) (what to do) and C(blocking) (it is one of O(health_checks), so the GPU is not idle).
          type: dict
          returned: always
          sample: {"status": "ok", "detail": null, "checks": [{"check": "row_remap_pending", "blocking": true,
                   "detail": "a row remap is pending (uncorrectable errors on 1 row(s), 0 corrected)",
                   "action": "reset the GPU once nothing holds it (nvidia-smi -r -i 3) to apply the remap"}]}
        remapped_rows:
          description:
            - The row remapper (C(nvmlDeviceGetRemappedRows), nvidia-smi C(remapped_rows.*); Ampere and later, R450 and
              later) - C(corrected) and C(uncorrected) rows, C(pending) (a reset applies it) and C(failure).
          type: dict
          returned: always
          sample: {"corrected": 0, "uncorrected": 1, "pending": true, "failure": false}
        retired_pages_pending:
          description:
            - Whether memory pages are pending retirement (C(nvmlDeviceGetRetiredPagesPendingStatus), nvidia-smi
              C(retired_pages.pending)); GPUs before Ampere (later ones remap rows instead - null).
          type: bool
          returned: always
        inforom_corrupt:
          description:
            - "Whether the GPU's infoROM is corrupted (C(nvmlDeviceValidateInforom), read once per run; with nvidia-smi its
              C(WARNING: infoROM is corrupted at gpu ...) line and exit 14, which are a warning, not a failure); null
              when it cannot be told. The check V(inforom) of O(health_checks)."
          type: bool
          returned: always
        ecc_uncorrected_volatile:
          description:
            - Uncorrectable ECC errors since the driver loaded (C(nvmlDeviceGetTotalEccErrors), nvidia-smi
              C(ecc.errors.uncorrected.volatile.total)); null where ECC is off or absent.
          type: int
          returned: always
        fabric:
          description:
            - The NVSwitch fabric - C(state) (V(Not Supported) where there is none, V(Not Started), V(In Progress),
              V(Completed)) and C(status) (V(Success), or the error, once completed). C(nvmlDeviceGetGpuFabricInfoV) on
              R550 and later, C(nvmlDeviceGetGpuFabricInfo) on R525 and later, nvidia-smi C(fabric.state) and
              C(fabric.status); null before R525.
          type: dict
          returned: always
          sample: {"state": "Completed", "status": "Success"}
        clock_event_reasons:
          description:
            - Why the clocks are where they are (C(nvmlDeviceGetCurrentClocksEventReasons), before R535
              C(nvmlDeviceGetCurrentClocksThrottleReasons); nvidia-smi C(clocks_event_reasons.active)) - V(gpu_idle),
              V(sw_power_cap), V(hw_slowdown), V(hw_thermal_slowdown), V(hw_power_brake_slowdown) and others.
          type: list
          elements: str
          returned: always
          sample: ["gpu_idle"]
        hw_slowdown:
          description: Whether a clock event reason means the hardware slows the GPU down (null when they cannot be read).
          type: bool
          returned: always
        utilization_latched:
          description:
            - Whether the GPU reports 90% utilization or more with no process on it (a utilization latched after a kill
              mid-kernel, seen on Blackwell); null when the utilization or the processes cannot be read.
          type: bool
          returned: always
        xid_events:
          description:
            - The Xid events of this GPU in the kernel log since boot (the last 20) - C(xid), C(meaning), C(action),
              C(catalog_action) (the immediate action of NVIDIA's Xid catalog, null for a code the collection does not
              hold), C(needs_action) (whether it fails the check C(xid)), C(seconds) (since boot) and C(message); null
              when the log was not read (see C(gpu_kernel_log)).
          type: list
          elements: dict
          returned: always
          sample: [{"xid": 79, "meaning": "GPU has fallen off the bus", "seconds": 5123.45,
                    "action": "drain the node and reboot it; check power, cooling and the PCIe slot",
                    "catalog_action": "RESTART_BM", "needs_action": true,
                    "message": "pid=0, name=<unknown>, GPU has fallen off the bus."}]
        fit:
          description:
            - With O(min_free_mib) or O(min_free_pct) - C(free_mib), C(need_mib) (the larger of the two), C(fits), and
              C(memory) (the query the free memory was read with); else null.
          type: dict
          returned: always
          sample: {"free_mib": 143771, "need_mib": 129394, "fits": true,
                   "memory": "nvmlDeviceGetMemoryInfo_v2 (used excludes the reserved memory)"}
        fits:
          description: Whether the next server fits (C(fit.fits)); null without O(min_free_mib) and O(min_free_pct), or
            when the driver reports no memory.
          type: bool
          returned: always
        processes:
          description:
            - The processes the driver reports on this GPU.
            - C(pid) is the pid as the driver reports it; C(visible=false) when it does not exist from where
              the module runs (a process in another PID namespace), or when, outside the host's PID namespace, the
              process with that pid here does not hold the GPU's device node (a driver that reports host pids names
              another process here); C(unverified) then says so, and nothing of that other process is given.
            - C(container) is C({kind, id, pid_in_container, uid_in_container}) for a process in a Proxmox/LXC container,
              else null.
            - C(uid) is the node's uid of the process. For a process in a container, C(user) is its name in the
              container's own C(/etc/passwd), and C(container.uid_in_container) is its uid there, mapped through the
              container's idmap (node uid 101000 is uid 1000 in an unprivileged container). C(user) is that number
              when the container's passwd has no name for it.
            - C(unit) is the systemd unit the process runs in, read from its cgroup (C(sglang.service) for
              C(/lxc/129/ns/system.slice/sglang.service)), inside a container or on the host; null for a login
              session or none.
            - C(cmdline) has its secrets hidden (see O(redact)) and is cut at 1000 characters; null with O(cmdline=false).
            - C(type) is V(compute), V(graphics), V(mps) or their combination (V(compute+mps) is an MPS client, which the
              driver lists in its compute and MPS lists).
            - C(mig_device), on a GPU in MIG mode - the UUID of the MIG device the driver lists the process on (see
              C(mig_devices)); null for a process on no MIG device.
            - C(mps_server), only on the entries of an MPS server (C(nvidia-cuda-mps-server)) - C(gpus), the GPUs it
              is listed on (every GPU it serves, of all the host's GPUs), C(container), the server's own, and
              C(clients), the MPS clients listed on them (C(pid), C(start_time), C(gpus), C(visible), C(container)).
              Their contexts run inside the server; the C(busy_reasons) of its GPUs name them and where they live.
          type: list
          elements: dict
          returned: always
          sample:
            - {"pid": 8812, "type": "compute", "used_mib": 81920, "name": "python3", "cmdline": "python3 -m sglang.launch_server",
               "user": "root", "uid": 0, "ppid": 8800, "start_time": 123456, "visible": true,
               "container": {"kind": "lxc", "id": 129, "pid_in_container": 245, "uid_in_container": 0}, "unit": "sglang.service"}
        processes_error:
          description:
            - Why the driver's process list of this GPU could not be read (an NVML error after retries, naming the
              function; a query the driver does not support; entries that cannot be real processes), else null.
            - A GPU whose list could not be read is never idle, and M(gpuops.gpu.gpu_release) fails on it rather than
              report nothing to release.
          type: str
          returned: always
          sample: "processes could not be read: Unknown Error, 3 tries (nvmlDeviceGetComputeRunningProcesses_v3)"
        unsupported:
          description:
            - The fields this driver or GPU cannot give (the NVML function is missing from this driver branch, or
              answers NOT_SUPPORTED); each of them is null. The rest of the GPU is read as usual.
          type: list
          elements: str
          returned: always
          sample: ["mig_mode", "memory"]
        errors:
          description: NVML calls that failed on this GPU, each naming the GPU (index and bus id) and the function.
          type: list
          elements: str
          returned: always
          sample: ["GPU 3 (00000000:5D:00.0): nvmlDeviceGetTemperature: Unknown Error, 3 tries"]
        holders:
          description:
            - The processes that hold NVIDIA device nodes open, as lists of pids keyed by their evidence on this GPU
              (V(context), V(device), V(control), and V(lingering) for the device holders that keep nothing busy; see
              the sample); each one's details (name, command line,
              user, container, unit, C(files), C(protected)) are once in RV(ansible_facts.gpu_holder_processes), under
              its pid. CUDA opens every C(/dev/nvidiaN) and every NVML client holds C(nvidiactl), so the same process
              is named on many GPUs; its details are never repeated, and the facts of 64 GPUs stay small.
            - V(context) - it also has a context on this GPU; V(device) - it holds this GPU's C(/dev/nvidiaN) and the
              driver lists no context for it here; V(control) - it holds only C(nvidiactl), C(nvidia-uvm),
              C(nvidia-uvm-tools), C(nvidia-modeset) or C(nvidia-caps/*), as every NVML or CUDA client does (named on
              every GPU).
            - CUDA opens the device node of every GPU it can see, so a V(device) holder keeps a GPU busy only when
              the driver's process list cannot be trusted to be complete (it could not be read, or memory is in use
              beyond what the listed processes account for); otherwise it is listed under V(lingering) (and not under
              V(device)). V(control) holders never keep a GPU busy. The rules are in the collection's
              C(docs/holding-model.md).
          type: dict
          returned: always
          sample: {"context": [8812], "device": [], "control": [2210], "lingering": [8813, 8814]}
        blockers:
          description: The pids that keep this GPU busy by the holding model (its contexts, and device holders that count).
          type: list
          elements: int
          returned: always
          sample: [8812]
        idle:
          description: Whether the GPU is idle by the definition M(gpuops.gpu.gpu_wait_idle) uses.
          type: bool
          returned: always
        busy_reasons:
          description: Short sentences saying what keeps the GPU from being idle.
          type: list
          elements: str
          returned: always
          sample: ["used by pid 8812 (python3) in CT 129, 80 GiB"]
        more:
          description:
            - With O(detail=summary), how many entries of this GPU's lists were left out - C(processes) (2 kept),
              C(blockers) (8), C(busy_reasons) (4), C(lingering) (8) and C(holders) by evidence (8 pids each), at 64
              GPUs (64 / N times as many on N GPUs); the GPU's blockers come first in each list. Absent when nothing
              was left out.
          type: dict
          returned: when a list of this GPU was cut
          sample: {"processes": 12, "blockers": 8, "holders": {"context": 8, "lingering": 1000}}
"""

import os

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _snapshot
from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs
from ansible_collections.gpuops.gpu.plugins.module_utils._common import (
    IDLE_ARGS,
    SNAPSHOT_ARGS,
    new_module,
    run_module,
    validate_snapshot_params,
)
from ansible_collections.gpuops.gpu.plugins.module_utils._host.snapshots import SnapshotTaker

NO_GPU_KINDS = ("library_not_found", "driver_not_loaded")


def main() -> None:
    argument_spec = dict(SNAPSHOT_ARGS, **IDLE_ARGS)
    argument_spec.update(
        gather=dict(type="list", elements="str", choices=["processes", "holders", "xid"],
                    default=["processes", "holders", "xid"]),
        missing=dict(type="str", choices=["fail", "ignore"], default="fail"),
    )
    module = new_module(argument_spec, supports_check_mode=True)
    params = module.params

    def body():
        selection = validate_snapshot_params(params, module)
        taker = SnapshotTaker(module, selection=selection)
        try:
            snap = taker.take(gather_processes="processes" in params["gather"],
                              gather_holders="holders" in params["gather"], gather_xid="xid" in params["gather"])
        except _errors.GpuError as exc:
            if params["missing"] == "ignore" and exc.kind in NO_GPU_KINDS:
                return True, dict(changed=False, msg=exc.msg, ansible_facts=_snapshot.compact_facts(dict(
                    gpu_driver={"backend": None, "driver_version": None, "cuda_driver_version": None, "nvml_version": None},
                    gpu_count=0, gpu_devices=[], gpu_kernel_log=None)))
            raise
        selected = selection.pick(snap["gpus"])
        for warning in facts_warnings(taker, selected, params["gather"]):
            module.warn(warning)
        kernel_log = taker.kernel_log if "xid" in params["gather"] else None
        # Each holder once: gpu_devices' holders name pids, gpu_holder_processes has their details (compact_facts).
        return True, dict(changed=False, ansible_facts=_snapshot.compact_facts(dict(
            gpu_driver=snap["driver"], gpu_count=len(snap["gpus"]), gpu_devices=selected, gpu_kernel_log=kernel_log)))

    run_module(module, body)


def facts_warnings(taker, selected: list, gather) -> list:
    """What the task warns of: GPUs not visible from here, read warnings, holders incomplete without root, a GPU off
    the bus, a kernel log that cannot be read, a fit that cannot be checked."""
    out = _snapshot.visibility_warnings(selected, taker.in_container()) + _snapshot.read_warnings(selected)
    if "holders" in gather:
        # Without root, /proc/<pid>/fd of other users' processes is refused: say that holders are incomplete.
        denied = _procs.holders_incomplete_warning(_procs.fd_scan_denied(), os.geteuid())
        if denied:
            out.append(denied)
    for gpu in selected:
        if gpu["health"]["status"] == "lost":
            out.append(f"GPU {gpu['index']} ({gpu.get('pci_bus_id')}) has fallen off the bus: reboot the host to"
                       " recover it; check dmesg for Xid 79")
    kernel_log = taker.kernel_log if "xid" in gather else None
    if kernel_log and not kernel_log["readable"]:
        out.append(kernel_log["problem"])
    for gpu in selected:
        if gpu.get("fit") and gpu["fit"]["fits"] is None:
            out.append(f"GPU {gpu['index']}: min_free_mib/min_free_pct cannot be checked: the driver reports no memory"
                       " for it (a unified-memory GPU)")
    return out


if __name__ == "__main__":
    main()
