# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The real Proxmox VE node of a fence (proxmox_gpu_containers): its files, the kernel's sockets, ``pct`` under a time
limit, the locks, the GPUs - what _fence.Fence is given as ``io`` (unit tests give it a fake: test__fence.FakeNode)."""

from __future__ import annotations

import os
import threading

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _pct
from ansible_collections.gpuops.gpu.plugins.module_utils._fence import FenceFailed
from ansible_collections.gpuops.gpu.plugins.module_utils._host import lock as _lock
from ansible_collections.gpuops.gpu.plugins.module_utils._host.calls import Background, run_all, run_in_group

# Where the node's state is: pmxcfs' mount and LXC's lxcpath (pve-container runs lxc-* with the default one); the
# simulator points each simulated node at its own (tests/gpusim, SimHost.env_vars).
PVE_DIR = "/etc/pve"
PVE_DIR_ENV = "GPUOPS_PVE_DIR"
LXC_PATH = "/var/lib/lxc"
LXC_PATH_ENV = "GPUOPS_LXC_PATH"


class PctCounter:
    """A command runner (``run_in_group``'s signature) that counts the ``pct`` processes it starts: every pct the
    module runs goes through one (the fence's and the release's unit stops), and the result says how many."""

    def __init__(self, run, pct_path):
        self.run = run
        self.pct_path = pct_path
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, argv, *args, **kwargs):
        if argv and self.pct_path and argv[0] == self.pct_path:
            with self._lock:
                self.calls += 1
        return self.run(argv, *args, **kwargs)


class NodeIO:
    """The Proxmox VE node: its containers from its files (``node``, ``config``), ``pct`` under a time limit, the
    GPUs' minor numbers, the locks, and the release's host (``release_io``). It reads and acts; the fence decides."""

    def __init__(self, pct_path, taker, release_io, lock_timeout=0.0, runner=None, pve_dir=None, lxc_path=None):
        self.pct_path = pct_path
        self.taker = taker
        self.release_io = release_io      # _host.release_io.ReleaseIO over the same snapshot taker (and the same runner)
        self.lock_timeout = lock_timeout
        self.warn = release_io.warn
        self.now = release_io.now
        self.runner = runner or PctCounter(run_in_group, pct_path)
        self.pve_dir = pve_dir or os.environ.get(PVE_DIR_ENV) or PVE_DIR
        self.lxc_path = lxc_path or os.environ.get(LXC_PATH_ENV) or LXC_PATH
        self._node = None
        self._gpus = None

    background = staticmethod(Background)
    run_all = staticmethod(run_all)

    def pct(self, argv, timeout, what, watch=None):
        """pct ``argv`` under ``timeout``; ``watch``: what to watch while it runs (exec_watch)."""
        return self.runner([self.pct_path] + list(argv), timeout, what, **({"watch": watch} if watch else {}))

    def exec_watch(self, vmid, pct_limit):
        return self.release_io.exec_watch(vmid, pct_limit)

    def pct_calls(self) -> int:
        return self.runner.calls

    def where(self) -> str:
        return self.pve_dir

    def _read(self, name):
        with open(os.path.join(self.pve_dir, name), encoding="utf-8", errors="replace") as f:
            return f.read()

    def node(self):
        """(this node's container ids, sorted; the set of those running): pmxcfs' .vmlist, as PVE::LXC::config_list,
        and the LXC monitors' command sockets in /proc/net/unix, as PVE::LXC::list_active_containers. FenceFailed
        (pve_unavailable) when /etc/pve is not there (pmxcfs down)."""
        try:
            vmlist = self._read(".vmlist")
        except OSError as exc:
            raise FenceFailed(
                "pve_unavailable",
                f"cannot read {os.path.join(self.pve_dir, '.vmlist')} ({exc.strerror or exc}): {self.pve_dir} is not"
                " mounted - the Proxmox VE cluster filesystem (pmxcfs) is down or this is not a Proxmox VE node. Start"
                " it (systemctl status pve-cluster) or run the task on a node. Nothing was stopped.") from None
        try:
            local = os.readlink(os.path.join(self.pve_dir, "local"))   # pmxcfs' link: nodes/<this node>
            self._node = local.rstrip("/").rsplit("/", 1)[-1]
        except OSError:
            self._node = os.uname().nodename.split(".")[0]              # PVE::INotify::nodename
        try:
            vmids = _pct.node_containers(vmlist, self._node)
        except _errors.UnreadableOutput as exc:
            raise FenceFailed("pve_unavailable", f"{os.path.join(self.pve_dir, '.vmlist')}: {exc.details['problem']}. Is"
                                                 " pmxcfs healthy (systemctl status pve-cluster)? Nothing was stopped.",
                              sample=exc.details["sample"]) from None
        try:
            with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
                sockets = f.read()
        except OSError as exc:
            raise FenceFailed("pve_unavailable", f"cannot read /proc/net/unix ({exc.strerror or exc}): which containers"
                                                 " run cannot be told. Nothing was stopped.") from None
        return vmids, _pct.active_vmids(sockets, self.lxc_path, vmids)

    def config(self, vmid):
        """The text of CT ``vmid``'s config file (nodes/<node>/lxc/<vmid>.conf, what /etc/pve/lxc links to), None when
        it is not there."""
        try:
            return self._read(os.path.join("nodes", self._node, "lxc", f"{int(vmid)}.conf"))
        except FileNotFoundError:
            return None
        except OSError as exc:
            said = exc.strerror or exc
            raise FenceFailed("pve_unavailable", f"cannot read CT {vmid}'s config in {self.pve_dir} ({said})."
                                                 " Nothing was stopped.") from None

    def take_locks(self, vmids) -> dict:
        """The release locks of these containers, held until the module exits (their GPUs' are the release's); when it
        waited for another run's, what it waited for (_lock.Locks.acquire: empty when it did not wait)."""
        return _lock.Locks("proxmox_gpu_containers", vmids, self.lock_timeout, self.warn).acquire()

    def gpu_locks(self, _containers, gpus) -> dict:
        """The release's GPU locks, shared (a release narrowed to the containers whose locks take_locks holds)."""
        return _lock.Locks("proxmox_gpu_containers", (), self.lock_timeout, self.warn, gpus=gpus,
                           gpus_exclusive=False).acquire()

    def gpus(self):
        """The GPUs (index, uuid, minor_number, memory, processes), read once (a GpuError when the driver cannot be
        read: the next call tries again)."""
        if self._gpus is None:
            self._gpus = self.taker.raw(need_minors=True)["gpus"]
        return self._gpus

    def look(self) -> list:
        """A full snapshot's GPUs (processes, device-file holders and their containers)."""
        return self.taker.take()["gpus"]
