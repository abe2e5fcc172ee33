# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    # The options every gpuops.gpu module shares: which GPUs, how they are read, what idle means.
    DOCUMENTATION = r"""
options:
  gpus:
    description:
      - The GPUs to act on, each named by its index (V(3)), its UUID (V(GPU-8f0e...)) or its PCI bus id
        (V(00000000:3B:00.0), also V(3b:00.0)).
      - An empty list selects every GPU of the host.
      - On a GPU in MIG mode a MIG device's UUID (V(MIG-b9f1b336-...), C(nvidia-smi -L)) selects that MIG device alone -
        the release stops its processes only (not those of the GPU's other MIG devices), the wait waits until it has
        no process and no memory in use; the GPU's index, UUID or bus id means all its MIG devices, also beside one
        of its MIG UUIDs.
      - Selectors are ASCII (an index is C([0-9]+), at most 4095 - V(01) is GPU 1; UUIDs and bus ids in any case);
        anything else fails before the GPUs are read. A
        selector that matches no GPU is an error that lists the GPUs the host has.
    type: list
    elements: str
    default: []
  backend:
    description:
      - How the GPUs are read.
      - V(nvml) uses the NVML library through the Python bindings C(pynvml) (the C(nvidia-ml-py) package).
      - V(nvidia-smi) runs C(nvidia-smi) with CSV queries; fields that it cannot give are null.
      - V(auto) takes V(nvml) when C(pynvml) imports and the library loads, else V(nvidia-smi).
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  nvidia_smi_path:
    description:
      - The C(nvidia-smi) program for O(backend=nvidia-smi) and as the fallback of O(backend=auto).
      - A bare name is looked up on C(PATH) and the usual sbin directories.
    type: str
    default: nvidia-smi
  query_timeout:
    description:
      - Time limit in seconds for each query of the driver (one NVML snapshot, one C(nvidia-smi) run).
      - A hung driver fails the task with a message instead of hanging the play. An C(nvidia-smi) that does not
        answer in time is killed together with its process group, so none is left behind.
      - Above 0 and at most 300; C(nan) and C(inf) are refused.
    type: float
    default: 10
  device_files:
    description:
      - Glob patterns of the NVIDIA device nodes whose holders are found by scanning C(/proc/*/fd) (and
        C(/proc/*/task/*/fd) when a process's main thread has exited).
      - Each pattern must name NVIDIA device nodes - an absolute path whose file name starts with C(nvidia)
        (or a file in C(nvidia-caps/)), with no glob in its directory part. Anything else (C(/dev/null*),
        C(/dev/*), C(/dev/pts/*)) fails before anything is scanned, unless O(allow_any_device_files).
      - C(nvidiaN) belongs to the GPU whose minor number is N; every other node (C(nvidiactl),
        C(nvidia-uvm), C(nvidia-modeset), C(nvidia-caps/*)) is a control node that every NVML or CUDA
        client holds, which places a process on no GPU.
    type: list
    elements: str
    default: ['/dev/nvidia*']
  allow_any_device_files:
    description:
      - Accept O(device_files) patterns that do not name NVIDIA device nodes (with a warning).
      - Every process holding a matching file is then treated as a holder of the GPUs; only for unusual
        layouts you have checked in check mode.
    type: bool
    default: false
  include_device_holders:
    description:
      - Whether processes that hold a GPU's device node (see O(device_files)) count besides the processes the
        driver reports, by the holding model (C(docs/holding-model.md)) - M(gpuops.gpu.gpu_release) stops the
        holders of a selected GPU's node unless the driver shows their context only on other GPUs, and a
        holder keeps a GPU busy only while the driver's process list cannot be trusted to be complete.
      - Protected daemons (see O(protect)) never count.
    type: bool
    default: true
  protect:
    description:
      - Process names or regular expressions (matched against the name and the command line) to add
        to the protected list. Protected processes are never signalled and do not keep a GPU busy.
      - Always protected, whatever this says - PID 1, kernel threads, the module's own process and its
        ancestors, C(nvidia-persistenced), C(nv-fabricmanager), C(nv-hostengine), C(dcgm-exporter), C(nvidia-smi),
        C(nvidia-cuda-mps-control) (the MPS control daemon).
      - The expressions see the real command line (not the redacted one the results show), its first 4096
        characters. An expression that repeats a group which itself repeats or alternates (V((a+\)+), V((a*\)*),
        V((a|aa\)+)) is refused before anything is read; a search that takes more than 0.5 s on one command line
        (or 2 s in all) is stopped and fails the task, naming this option.
    type: list
    elements: str
    default: []
  redact:
    description:
      - More regular expressions whose matches are hidden (replaced by C(****)) in every command line the
        module returns (facts, results, diffs, warnings); with capturing groups only the groups are hidden.
      - Always hidden, whatever this says - the value of C(--api-key), C(--token), C(--hf-token), C(--password),
        C(--secret*) and the same names with a prefix (C(--openai-api-key), C(--db-password)), as C(--opt value)
        or C(--opt=value); the value of environment-style words C(*_TOKEN=), C(*_KEY=), C(*_PASSWORD=),
        C(*_SECRET=); the password of C(scheme://user:password@host); C(Bearer <token>); bare C(hf_...) and
        C(sk-...) tokens (16 characters or more after the prefix).
      - The same rules as O(protect) apply (the first 4096 characters, no nested repeats, a time budget).
    type: list
    elements: str
    default: []
  cmdline:
    description:
      - Whether processes carry their command line in the results. V(false) makes every C(cmdline) null.
      - Command lines that are returned are redacted (see O(redact)) and cut at 1000 characters, with a marker
        C([... N more characters cut]) that says so.
      - The O(protect) expressions (and those of M(gpuops.gpu.gpu_release)) still match the real command line.
    type: bool
    default: true
  detail:
    description:
      - How much of the result the task returns. ansible-runner (AWX) drops a task's result whose text is over
        700,000 characters, and a host with many GPUs and many processes per GPU returns more than that in full.
      - V(summary) keeps every GPU and every verdict whole (C(idle), C(busy_reasons) not empty, C(blockers) not empty,
        C(fits), C(health), C(idle_gpus)) and caps each list that grows with the processes - a GPU's C(processes)
        (1), C(holders) by evidence, C(blockers) and C(lingering) (8 pids each), C(busy_reasons) (4, each cut at
        200 characters); the holders' details (32, the blockers' first, each with 8 files per directory and 8
        GPUs); the processes and units released, surviving, respawned, skipped or protected, and a wait's
        C(left_blockers) (16); a release's C(left_holders) (64); a wait's C(blockers) (8 per GPU) and C(samples)
        (16 per GPU - the first, where the wait began, and the latest 15). What is kept comes first by what matters
        (a GPU's blockers first); command lines are cut at 100 characters; a failure's C(msg) at 2,000; the diff
        names 8 holders per GPU and 8 units.
      - Those caps (but the number of holders' details and of samples) are a host's of 64 GPUs or more; a host of N GPUs
        gets 64 / N times as many (rounded down), so a small host's lists are cut only where a large host's would be.
      - 'An object whose lists were cut carries C(more), the entries left out by key (C({"processes": 12, "holders":
        {"lingering": 1000}})); the lists of the result itself that were cut are counted in C(detail.more).'
      - A result of 64 GPUs with 16 processes on each stays under 200,000 characters, with C(--diff) too (the
        collection's C(benchmarks/bench_output.py) prints the sizes).
      - V(full) returns the whole result, as big as the host makes it.
    type: str
    choices: [summary, full]
    default: summary
  detail_file:
    description:
      - An absolute path on the host the module runs on where the whole result (as O(detail=full) returns it) is
        written as JSON, mode C(0600), whatever O(detail) is; C(detail.file) in the result says where. Command lines in it are
        redacted as in the result.
      - A file that cannot be written is a warning; the task's result is returned all the same.
      - Unset - no file.
    type: path
"""

    IDLE = r"""
options:
  max_memory_used_mib:
    description:
      - A GPU with more memory in use than this is not idle.
      - The default, 64 MiB, sits above what an idle card reports with no process (0 to a few MiB of
        driver bookkeeping) and below the smallest CUDA context (hundreds of MiB on current GPUs).
      - From 0 to 16777216 (16 TiB).
    type: int
    default: 64
  max_utilization_pct:
    description:
      - When set, a GPU whose utilization is above this percentage is not idle. From 0 to 100.
    type: int
  min_free_mib:
    description:
      - The free memory (MiB) the next server needs on each selected GPU. A GPU with less is not ready (with
        O(min_free_pct), the larger of the two counts).
      - Free memory is the driver's C(free) - C(total - reserved - used) from C(nvmlDeviceGetMemoryInfo_v2),
        which leaves out the memory the driver reserves (R510 and later); before R510, C(total - used) from the
        v1 query, whose C(used) includes it (the same amount); with O(backend=nvidia-smi), C(memory.free). Each
        GPU's C(fit.memory) says which was read.
      - From 0 to 16777216. Unset - no requirement.
    type: int
  min_free_pct:
    description:
      - The free memory the next server needs on each selected GPU, in percent of the GPU's total memory (rounded up
        to a whole MiB). A GPU with less is not ready.
      - Set it to the next server's C(gpu_memory_utilization) times 100 - vLLM refuses to start when the free memory
        is below C(gpu_memory_utilization) times the total (V(90) for the default 0.9).
      - A GPU whose driver reports no memory (a unified-memory GB10) cannot be judged - its C(fits) is null and it
        is not held back for it.
      - From 0 to 100. Unset - no requirement.
    type: float
  health_checks:
    description:
      - The health checks that keep a GPU from being ready while they fail. Every check that fails is reported in
        the GPU's C(health.checks) all the same; V([]) blocks on none.
      - V(row_remap_pending) - a row remap is pending (C(nvmlDeviceGetRemappedRows); Ampere and later) - reset the GPU.
      - V(row_remap_failure) - row remapping failed - drain the GPU and RMA it.
      - V(retired_pages_pending) - pages are pending retirement (C(nvmlDeviceGetRetiredPagesPendingStatus); before
        Ampere) - reset the GPU or reboot.
      - V(fabric) - on an NVSwitch system, the GPU's fabric state is not C(Completed), or completed with an error
        (C(nvmlDeviceGetGpuFabricInfoV), R525 and later) - every CUDA program fails with error 802 until then;
        start the fabric manager.
      - V(ecc_uncorrectable) - uncorrectable ECC errors since the driver loaded (C(nvmlDeviceGetTotalEccErrors),
        volatile) - drain the GPU.
      - V(hw_slowdown) - the hardware slows the clocks down (thermal, power brake; C(nvmlDeviceGetCurrentClocksEventReasons)).
      - V(utilization_latched) - 90% or more utilization with no process (a Blackwell GPU after a kill mid-kernel) -
        reset the GPU.
      - "V(inforom) - the infoROM is corrupted (C(nvmlDeviceValidateInforom); nvidia-smi prints C(WARNING: infoROM is
        corrupted at gpu ...) and exits 14, read as a warning) - the GPU runs, but its ECC and retirement records may
        not be kept; have it reflashed or RMA it."
      - V(mig_mode_pending) - a MIG mode change is pending (C(nvmlDeviceGetMigMode) current and pending differ,
        nvidia-smi C(mig.mode.current) and C(mig.mode.pending); R450 and later) - a GPU reset or a reboot applies it.
      - V(xid) - an Xid in the kernel log since boot (read at the full scans; see O(kernel_log)) whose immediate action
        in NVIDIA's Xid catalog (U(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), Ampere and
        newer, no version on the page; read 2026-12-04, Xid 1-172, newest rows R575) is a reset, a reboot, a site check
        or support - 46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158, and 154 unless the
        recovery action it names is None. Xids the catalog answers with IGNORE or RESTART_APP (13, 31, 43, 45, 63, 92,
        94, 137, 157) and Xids it lists as Unused (61) are reported, never blocking.
      - A check whose data the driver or GPU cannot give (listed in C(unsupported)) passes.
    type: list
    elements: str
    choices: [row_remap_pending, row_remap_failure, retired_pages_pending, fabric, ecc_uncorrectable, hw_slowdown,
              utilization_latched, inforom, mig_mode_pending, xid]
    default: [row_remap_pending, row_remap_failure, retired_pages_pending, fabric, ecc_uncorrectable]
  kernel_log:
    description:
      - Where Xid events are read from - a file in the format of C(/dev/kmsg) or of C(dmesg) (a saved log).
      - Unset - the file named by the environment variable C(GPUOPS_KERNEL_LOG) when it is set (the simulator's),
        else C(/dev/kmsg), else the output of C(dmesg). Reading the kernel log needs root on the node; where it
        cannot be read, the Xid events are null and the module says why.
    type: path
"""

    # How holders are released: gpu_release, and proxmox_gpu_containers with state=released.
    RELEASE = r"""
options:
  signal:
    description: The first signal, by name (V(SIGTERM), V(TERM), V(SIGINT)) or number.
    type: str
    default: SIGTERM
  grace_period:
    description:
      - Seconds to wait after O(signal) for the processes to exit.
      - From 0 to 86400 (a day); C(nan) and C(inf) are refused before anything is signalled.
    type: float
    default: 10
  escalate:
    description: Send SIGKILL to the processes still alive after O(grace_period).
    type: bool
    default: true
  kill_timeout:
    description:
      - Seconds to wait after SIGKILL for the processes to be gone. A zombie counts as gone.
      - The default covers the teardown of a large inference server, which with pinned host memory takes 20-40 s
        after SIGKILL on 8 x H100/H200 hosts; the process is gone as soon as it exits, so a shorter teardown costs no
        more.
      - From 0 to 86400 (a day).
    type: float
    default: 45
  fail_on_survivors:
    description:
      - Fail when a process survives (one stuck in the kernel, state D, outlives SIGKILL).
    type: bool
    default: true
  stop_units:
    description:
      - When a target runs in a systemd service unit (read from its cgroup - C(/lxc/129/ns/system.slice/sglang.service)
        inside a container, C(/system.slice/vllm.service) on the host), stop the unit first - C(pct exec <vmid> --
        systemctl stop <unit>) for a container when run on the Proxmox node, C(systemctl stop <unit>) on the host -
        so that its supervisor cannot restart it; then whatever is left is signalled.
      - Never the unit of a protected process, nor the unit the module itself runs in.
      - V(false) only signals; a supervised server then comes back, the release result's C(respawned) names the unit
        and the supervisor, and the module fails (the GPUs are held again).
      - A unit is stopped only when every GPU job in it is a target; one that also runs other GPU jobs is left running
        (with a warning) and only the targets in it are signalled.
      - A unit that could not be stopped (its container did not answer, C(systemctl) failed) fails the release after
        its processes are signalled (RV(gpuops.gpu.gpu_release#module:unstopped_units)) - its supervisor can restart
        them. A target in a frozen container (a suspend-mode backup, C(lxc-freeze)) fails it before anything is
        stopped or signalled (C(error=container_frozen)).
    type: bool
    default: true
  pct:
    description:
      - The C(pct) program - a path, or a name looked up in C(/usr/sbin), C(/usr/bin) and C(PATH). Every C(pct) the
        module runs is this one (the unit stop of O(stop_units) in a container, C(pct exec <vmid> -- systemctl stop
        <unit>); in M(gpuops.gpu.proxmox_gpu_containers) also the discovery and O(gpuops.gpu.proxmox_gpu_containers#module:state=shutdown)).
      - Where the default V(pct) is not there (a host that is not a Proxmox VE node, or inside a container), a unit in a
        container cannot be stopped - its processes are signalled, with a warning; any other value that is not there
        fails the task before anything runs.
    type: str
    default: pct
  lock_timeout:
    description:
      - One release at a time per container and per GPU. A run that signals (not in check mode) holds lock files
        under C(/run/gpuops.gpu) for as long as it runs - C(ct-<vmid>.lock) for each container it is narrowed to,
        and C(gpu-<index>.lock) for each GPU it selected, shared when it is narrowed to containers (two containers'
        releases run side by side), exclusive when it may reach any process on that GPU; a lock goes with the
        process, so a run that was killed leaves none behind.
      - Seconds to wait for a lock another run holds. A run that waited reads the GPUs again - it finds what the
        other one left, and reports only what it released itself. After that long the task fails with
        C(error=locked) before anything is signalled, naming the other run (C(another release of CT 129 is running
        (pid 4242, proxmox_gpu_containers, for 35 s))).
      - The default covers one release (grace period, kill timeout, watch). V(0) fails at once - for a hook that must
        never follow another one's release. From 0 to 86400.
    type: float
    default: 120
"""

    # The return value every module shares (its RETURN names this fragment: ansible-core 2.20 and later merge it).
    RETURN = r"""
detail:
  description:
    - What this result holds of the whole (O(detail), O(detail_file)).
  returned: always
  type: dict
  contains:
    level:
      description:
        - V(summary) - each list that grows with the processes is capped (see O(detail)), and what was left out is
          counted, in C(more) of the object whose lists were cut (a GPU, a holder's details, a process) and in
          RV(detail.more) for the lists of the result itself; V(full) - the whole result.
      type: str
      returned: always
      sample: summary
    file:
      description: The path of O(detail_file), where the whole result was written; null when none was asked for or it could not be written.
      type: str
      returned: always
      sample: /root/gpu-result.json
    more:
      description:
        - How many entries the summary left out of each list or mapping of the result itself, by its dotted key
          (C(holder_processes), C(released), C(release.released), C(ansible_facts.gpu_holder_processes),
          C(blockers.3), C(samples.0)); empty when nothing was left out (and always with V(full)). C(msg) counts the
          characters cut from a failure's message, which a summary keeps under 2,000 characters (the whole of it with
          V(full) and in O(detail_file)).
        - A GPU's own lists that were cut are counted in its C(more) - C(processes), C(blockers), C(busy_reasons),
          C(lingering), and C(holders) by evidence - and a process's (or a holder's details') in its C(more) -
          C(files) by directory, C(gpus); the GPUs themselves, their C(idle), C(fits), C(health) and C(idle_gpus) are
          never cut, and a busy GPU keeps at least one blocker and one busy reason.
      type: dict
      returned: always
      sample: {"holder_processes": 976, "released": 1024}
"""

    # The input of the report's output filters (gpu_report_markdown, gpu_report_prometheus, gpu_report_table).
    REPORT_ROWS = r"""
options:
  _input:
    description: Rows of P(gpuops.gpu.gpu_report_rows#filter).
    type: list
    elements: dict
    required: true
"""
