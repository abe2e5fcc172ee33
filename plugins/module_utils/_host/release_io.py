# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The real host of a release (gpu_release, the fence): snapshots, /proc, pidfd signals, the clock - what
_release's steps are given as ``io`` (a protocols.ReleaseHost) (unit tests give it a fake)."""

from __future__ import annotations

import os
import time

from ansible_collections.gpuops.gpu.plugins.module_utils._host import calls, procs as _procs
from ansible_collections.gpuops.gpu.plugins.module_utils._host.signals import Target, check_may_signal, wait_gone


class ReleaseIO:
    """The real host: /proc, pidfd signals, the clock. gpu_release adds the snapshot and commands."""

    def __init__(self, taker, run_command, warn, bins):
        self.taker = taker
        self.run_command = run_command      # (argv, timeout, what) -> (rc, out, err); QueryTimeout
        self.warn = warn
        self.bins = bins                    # name -> path or None (systemctl, pct)

    def snapshot(self, holders=True):
        return self.taker.take(gather_holders=holders)["gpus"]

    def read(self, pid):
        return self.taker.read_process(pid)

    def text(self, proc):
        return self.taker.match_text(proc)

    # What the host answers as it is: the host's own functions.
    exe = staticmethod(_procs.read_exe)
    children = staticmethod(_procs.children_map)
    host_namespace = staticmethod(_procs.in_initial_pid_namespace)
    wait_gone = staticmethod(wait_gone)
    check_may_signal = staticmethod(check_may_signal)
    state = staticmethod(_procs.process_state)
    frozen = staticmethod(_procs.cgroup_frozen)
    cgroup_procs = staticmethod(_procs.cgroup_procs)
    now = staticmethod(time.monotonic)
    boot_id = staticmethod(_procs.boot_id)
    sleep = staticmethod(time.sleep)

    @staticmethod
    def me():
        me = os.getpid()
        return me, _procs.ancestors(me)

    @staticmethod
    def pin(info):
        target = Target(info["pid"], info["start_time"], info)
        return target, target.open()

    @staticmethod
    def exec_watch(vmid, pct_limit):
        """argv -> the watch of ``pct exec <vmid> -- ...`` (calls.ExecWatch: the container frozen, the node's pct or
        the container's systemd hung); None for another command."""
        def make(argv):
            if vmid is None or len(argv) < 2 or argv[1] != "exec":
                return None
            return calls.ExecWatch(vmid, " ".join([os.path.basename(argv[0])] + list(argv[1:])), pct_limit)
        return make

    @staticmethod
    def ticks_now():
        """Now on the clock of /proc/<pid>/stat's start time (clock ticks since boot)."""
        return time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK")

    @staticmethod
    def ticks_per_s():
        return os.sysconf("SC_CLK_TCK")
