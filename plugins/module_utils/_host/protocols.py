# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The host's interfaces: what the rules are given as ``io``, each member with its call's shape. Each is implemented by
the adapter named in its docstring on a real host and by a fake in the unit tests (test_host_boundary.py and the fakes'
own tests check both). Adapters read and act; they decide nothing."""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable


@runtime_checkable
class Job(Protocol):
    """A call in the background (calls.Background)."""

    result: Callable          # (timeout=None) -> its value; its error, or QueryTimeout past the timeout


@runtime_checkable
class WaitHost(Protocol):
    """What _wait.Wait reads and does (_host.wait_io.WaitIO; test__wait_run.FakeHost)."""

    snapshot: Callable        # (full, processes=True) -> every GPU the driver shows (nvidia-smi: those restricted to)
    restrict: Callable        # (GPU indexes, or None: all) -> None: what nvidia-smi is asked about
    restricted: Callable      # () -> whether nvidia-smi, the backend, is asked about some GPUs only
    alive: Callable           # (pid, start_time) -> bool
    now: Callable             # () -> monotonic seconds
    set_deadline: Callable    # (monotonic seconds, or None) -> None: every later call of the driver ends by then
    boot_id: Callable         # () -> this boot's id
    sleep: Callable           # (seconds) -> None
    confirm_path: Callable    # () -> the nvidia-smi that confirms, or None
    smi_path: Callable        # () -> the nvidia-smi that resets, or None
    smi_query: Callable       # (path) -> nvidia-smi's raw snapshot (_smi.query)
    run: Callable             # (argv, what) -> (rc, out, err) under query_timeout; QueryTimeout
    device_holders: Callable  # () -> {pid: [device files]}: one full device-file scan
    read: Callable            # (pid) -> the process, its raw command line to match, or None
    exe: Callable             # (pid) -> its executable's path, or None
    background: Callable      # (func, *args) -> Job


@runtime_checkable
class ReleaseHost(Protocol):
    """What _release's steps and run_release read and do (_host.release_io.ReleaseIO; test__release.FakeHost)."""

    snapshot: Callable        # (holders=True) -> every GPU
    read: Callable            # (pid) -> the process (redacted), or None
    text: Callable            # (proc) -> its raw command line, to match
    exe: Callable             # (pid) -> its executable's path, or None
    children: Callable        # () -> {ppid: [pids]}
    me: Callable              # () -> (this pid, its ancestors)
    host_namespace: Callable  # () -> whether this runs in the initial PID namespace (None: cannot tell)
    pin: Callable             # (proc) -> (a signal target pinned by pid and start time, whether it is the same process)
    wait_gone: Callable       # (targets, timeout) -> those still alive
    check_may_signal: Callable  # (procs) -> None; NotPermitted
    state: Callable           # (pid) -> its state letter, or None
    frozen: Callable          # (pid) -> whether its cgroup is frozen
    cgroup_procs: Callable    # (cgroup path) -> the pids in it and in its init.scope
    now: Callable             # () -> monotonic seconds
    boot_id: Callable         # () -> this boot's id
    ticks_now: Callable       # () -> now in clock ticks since boot (/proc/<pid>/stat's start time)
    ticks_per_s: Callable     # () -> clock ticks per second
    sleep: Callable           # (seconds) -> None
    run_command: Callable     # (argv, timeout, what, watch=None) -> (rc, out, err); QueryTimeout (calls.run_in_group)
    exec_watch: Callable      # (vmid, pct limit) -> (argv -> the watch of a pct exec: calls.ExecWatch), or None
    warn: Callable            # (text) -> None
    bins: Callable            # (name) -> its path, or None (systemctl, pct)


@runtime_checkable
class NodeHost(Protocol):
    """What _fence.Fence reads and does on a Proxmox VE node (_host.node_io.NodeIO; test__fence.FakeNode)."""

    node: Callable            # () -> (the node's vmids, the running ones); FenceFailed
    config: Callable          # (vmid) -> its config file's text, or None
    where: Callable           # () -> the cluster filesystem's path
    pct: Callable             # (argv, timeout, what) -> (rc, out, err); QueryTimeout
    exec_watch: Callable      # (vmid, pct limit) -> (argv -> the watch of a pct exec: calls.ExecWatch), or None
    pct_calls: Callable       # () -> how many pct processes ran
    gpus: Callable            # () -> the GPUs (minor numbers, uuids), read once; GpuError
    look: Callable            # () -> a full snapshot's GPUs
    take_locks: Callable      # (vmids) -> whether it waited: the containers' release locks, held to the module's exit
    gpu_locks: Callable       # (containers, gpus) -> whether it waited: the release's GPU locks
    background: Callable      # (func, *args, what=None) -> Job
    run_all: Callable         # (func, items, workers) -> [func(item), ...], a few at a time
    warn: Callable            # (text) -> None
    now: Callable             # () -> monotonic seconds
    release_io: Any           # the ReleaseHost of the release the fence runs
