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

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _holding, _procs, _smi, _snapshot
from ansible_collections.gpuops.gpu.plugins.module_utils._host import calls


class WaitIO:
    """The real host of a wait: snapshots (a SnapshotTaker), /proc, nvidia-smi, the clock.

    ``bin_path(name)``: the path of a program or None; ``run_command(argv, timeout, what, env)`` ->
    (rc, out, err), raising QueryTimeout (calls.run_in_group)."""

    def __init__(self, taker, params: dict, bin_path, run_command):
        self.taker = taker
        self.p = params
        self.bin_path = bin_path
        self.run_command = run_command
        self._count_checked = bool(params.get("progress_state"))  # a later slice: the first one checked it
        self.selection = taker.selection  # the gpus option, as _validate parsed it
        indexes = self.selection.indexes()
        if indexes is not None and (params["expected_count"] is None or self._count_checked):
            # nvidia-smi is asked about the selected GPUs only, from the first look on: an unselected GPU
            # that is lost or failing makes nvidia-smi exit non-zero, and must not fail this wait.
            taker.smi_ids = [str(i) for i in indexes]

    def snapshot(self, full: bool) -> list:
        """The selected GPUs; ``full``: with the device-file scan (when include_device_holders)."""
        taker, p = self.taker, self.p
        snap = taker.take(gather_processes=True, gather_holders=full and p["include_device_holders"])
        if not self._count_checked:
            _snapshot.check_count(snap["gpus"], p["expected_count"])
            self._count_checked = True
        try:
            selected = self.selection.pick(snap["gpus"])
        except _errors.SelectionError:
            if not (taker.smi_ids and taker.backend == "nvidia-smi"):
                raise
            taker.smi_ids = None  # once more, unrestricted: the message lists the GPUs the host has
            selected = self.selection.pick(taker.take(gather_processes=False, gather_holders=False)["gpus"])
        if self.selection:
            # From now on nvidia-smi (the backend, and the final confirmation) sees the selected GPUs only.
            taker.smi_ids = [str(g["index"]) for g in selected]
        return selected

    @staticmethod
    def alive(pid, start_time) -> bool:
        ident = _procs.read_identity(pid)
        return ident is not None and (start_time is None or ident[1] == start_time)

    @staticmethod
    def now() -> float:
        return time.monotonic()

    @staticmethod
    def boot_id():
        return _procs.boot_id()

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)

    def confirm_path(self):
        """The nvidia-smi that confirm_with_nvidia_smi asks (nvidia_smi_path), or None."""
        return self.bin_path(self.p["nvidia_smi_path"])

    def smi_path(self):
        """The nvidia-smi that resets a GPU: the backend's when it is nvidia-smi, else nvidia_smi_path."""
        return self.taker.smi or self.confirm_path()

    def smi_query(self, path) -> dict:
        return _smi.query(self.taker.run_smi, path)

    def run(self, argv: list, what: str):
        return self.run_command(argv, self.p["query_timeout"], what, {"LC_ALL": "C"})

    def node_holders(self, gpus: list) -> dict:
        """{index: every process that holds the GPU's device node (/dev/nvidia<minor>)}, by one full device-file
        scan, whatever include_device_holders says: the protected daemons count too."""
        scan = _procs.scan_fd_holders(self.p["device_files"], exclude_pids=(os.getpid(),))
        out = {}
        for gpu in gpus:
            found = out.setdefault(gpu["index"], [])
            for pid, files in sorted(scan.items()):
                if not any(_holding.node_of(f)[1] == gpu.get("minor_number") for f in files):
                    continue
                info = self.taker._read_for_build(pid) or {"pid": pid, "name": None}  # the raw command line, to match only
                names = _snapshot._names(info) & set(_snapshot.PROTECTED_NAMES)
                found.append({"pid": pid, "name": sorted(names)[0] if names else info.get("name"),
                              "protected": bool(_snapshot.is_protected(info, extra=self.taker.protect,
                                                                       exe_of=_procs.read_exe))})
        return out

    @staticmethod
    def background(func, *args):
        return calls.Background(func, *args)
