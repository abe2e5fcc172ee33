# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The real host of a wait (gpu_wait_idle): snapshots, /proc liveness, nvidia-smi, the clock - what
_wait.Wait is given as ``io`` (unit tests give it a fake)."""

from __future__ import annotations

import os
import time

from ansible_collections.gpuops.gpu.plugins.module_utils import _smi
from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs
from ansible_collections.gpuops.gpu.plugins.module_utils._host import calls


class WaitIO:
    """The real host of a wait: snapshots (a SnapshotTaker), /proc, nvidia-smi, the clock.

    ``bin_path(name)``: the path of a program or None; ``run_command(argv, timeout, what)`` ->
    (rc, out, err), raising QueryTimeout (calls.run_in_group)."""

    def __init__(self, taker, params: dict, bin_path, run_command):
        self.taker = taker
        self.p = params
        self.bin_path = bin_path
        self.run_command = run_command

    def snapshot(self, full: bool, processes: bool = True) -> list:
        """Every GPU the driver shows (nvidia-smi: those ``restrict`` named); ``full``: with the device-file scan (when
        include_device_holders); ``processes``: with the GPUs' processes read."""
        return self.taker.take(gather_processes=processes,
                               gather_holders=processes and full and self.p["include_device_holders"])["gpus"]

    def restrict(self, indexes) -> None:
        """nvidia-smi (the backend, and the confirmation) is asked about these GPU indexes only (None: every GPU)."""
        self.taker.smi_ids = indexes

    def restricted(self) -> bool:
        """Whether the backend, nvidia-smi, is asked about some GPUs only."""
        return bool(self.taker.smi_ids) and self.taker.backend == "nvidia-smi"

    @staticmethod
    def alive(pid, start_time) -> bool:
        try:
            ident = _procs.read_identity(pid, strict=True)
        except OSError:
            return True  # cannot tell (EMFILE, EACCES, ...): never taken for gone
        return ident is not None and (start_time is None or ident[1] == start_time)

    now = staticmethod(time.monotonic)
    boot_id = staticmethod(_procs.boot_id)
    sleep = staticmethod(time.sleep)
    exe = staticmethod(_procs.read_exe)
    background = staticmethod(calls.Background)

    def set_deadline(self, deadline) -> None:
        """Every call of the snapshots and of nvidia-smi ends by ``deadline`` (time.monotonic(); None: none)."""
        self.taker.deadline = deadline

    def confirm_path(self):
        """The nvidia-smi that confirm_with_nvidia_smi asks (nvidia_smi_path), or None."""
        return self.bin_path(self.p["nvidia_smi_path"])

    def smi_path(self):
        """The nvidia-smi that resets a GPU: the backend's when it is nvidia-smi, else nvidia_smi_path."""
        return self.taker.smi or self.confirm_path()

    def smi_query(self, path) -> dict:
        return _smi.query(self.taker.run_smi, path, background=calls.Background)

    def run(self, argv: list, what: str):
        return self.run_command(argv, self.p["query_timeout"], what)

    def device_holders(self) -> dict:
        """{pid: [device files]} of every process that holds a GPU device file: one full scan, whatever
        include_device_holders says."""
        return _procs.scan_fd_holders(self.p["device_files"], exclude_pids=(os.getpid(),))

    def read(self, pid: int):
        """The process with its raw command line (to match protect only), or None when it is gone."""
        return self.taker.read_for_build(pid)
