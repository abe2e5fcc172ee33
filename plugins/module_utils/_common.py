# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""Glue shared by the modules: the common argument spec and one call that takes a snapshot.

This is the only module_utils file that talks to AnsibleModule (get_bin_path, params); the
logic it calls lives in the pure files next to it.
"""

from __future__ import annotations

import os
import time

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _nvml, _procs, _smi, _snapshot
from ansible_collections.gpuops.gpu.plugins.module_utils._waiting import call_with_timeout

# The options of the doc fragment gpuops.gpu.gpu (every module).
SNAPSHOT_ARGS = dict(
    gpus=dict(type="list", elements="str", default=[]),
    backend=dict(type="str", choices=["auto", "nvml", "nvidia-smi"], default="auto"),
    nvidia_smi_path=dict(type="str", default="nvidia-smi"),
    query_timeout=dict(type="float", default=10.0),
    device_files=dict(type="list", elements="str", default=["/dev/nvidia*"]),
    include_device_holders=dict(type="bool", default=True),
    protect=dict(type="list", elements="str", default=[]),
)
# The options of the doc fragment gpuops.gpu.gpu.idle (gpu_facts, gpu_wait_idle).
IDLE_ARGS = dict(
    max_memory_used_mib=dict(type="int", default=_snapshot.DEFAULT_MAX_MEMORY_USED_MIB),
    max_utilization_pct=dict(type="int"),
)

SBIN_DIRS = ["/usr/bin", "/usr/sbin", "/sbin", "/usr/local/bin"]


def validate_snapshot_params(params: dict) -> None:
    """Bad input fails before anything is read or signalled."""
    import re

    if params["query_timeout"] <= 0:
        raise _errors.GpuError(f"query_timeout must be > 0, got {params['query_timeout']}")
    if params.get("max_memory_used_mib", 0) < 0:
        raise _errors.GpuError(f"max_memory_used_mib must be >= 0, got {params['max_memory_used_mib']}")
    pct = params.get("max_utilization_pct")
    if pct is not None and not 0 <= pct <= 100:
        raise _errors.GpuError(f"max_utilization_pct must be between 0 and 100, got {pct}")
    for pattern in params["device_files"]:
        if not pattern.startswith("/"):
            raise _errors.GpuError(f"device_files: {pattern!r} must be an absolute path or glob (like /dev/nvidia*)")
    for pattern in params["protect"]:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise _errors.GpuError(f"protect: {pattern!r} is not a valid regular expression: {exc}") from None


class SnapshotTaker:
    """Takes snapshots for one module run; keeps the backend decision and NVML initialised."""

    def __init__(self, module, params=None):
        self.module = module
        self.params = params or module.params
        self.backend = None
        self.smi = None
        self.minors = None

    def run_smi(self, argv):
        """One nvidia-smi run (argv list, no shell) under query_timeout."""
        return call_with_timeout(
            lambda: self.module.run_command(argv, environ_update={"LC_ALL": "C"}),
            self.params["query_timeout"], f"{argv[0]} {argv[1] if len(argv) > 1 else ''}".strip())

    def _find_smi(self):
        path = self.module.get_bin_path(self.params["nvidia_smi_path"], required=False, opt_dirs=SBIN_DIRS)
        if not path:
            raise _errors.LibraryNotFound(
                f"no NVIDIA driver libraries here: a container without them, or not a GPU host"
                f" ({self.params['nvidia_smi_path']} not found, and NVML is not usable). Run on the host"
                " that has the GPUs (on Proxmox VE: the node), or set missing=ignore to gather facts on a"
                " mixed fleet.", backend="nvidia-smi")
        return path

    def _choose_backend(self):
        wanted = self.params["backend"]
        if wanted in ("nvml", "auto"):
            try:
                call_with_timeout(_nvml.init, self.params["query_timeout"], "NVML initialisation")
                return "nvml"
            except _errors.LibraryNotFound:
                if wanted == "nvml":
                    raise
        self.smi = self._find_smi()
        return "nvidia-smi"

    def raw(self, need_minors=False) -> dict:
        if self.backend is None:
            self.backend = self._choose_backend()
        if self.backend == "nvml":
            timeout = self.params["query_timeout"]
            deadline = time.monotonic() + timeout
            return call_with_timeout(lambda: _nvml.query(deadline=deadline), timeout, "NVML query")
        if need_minors and self.minors is None:
            # Minor numbers tie /dev/nvidiaN to a GPU; only nvidia-smi's XML report has them.
            self.minors = _smi.minor_query(self.run_smi, self.smi)
        return _smi.query(self.run_smi, self.smi, self.minors)

    def take(self, gather_processes=True, gather_holders=True) -> dict:
        """One snapshot of every GPU (selection is applied by the caller)."""
        raw = self.raw(need_minors=gather_holders)
        holders = None
        if gather_holders:
            holders = _procs.scan_fd_holders(self.params["device_files"], exclude_pids=(os.getpid(),))
        return _snapshot.build(
            raw,
            read_process=_procs.read_process if gather_processes else None,
            holders=holders,
            protect=self.params["protect"],
            max_memory_used_mib=self.params.get("max_memory_used_mib", _snapshot.DEFAULT_MAX_MEMORY_USED_MIB),
            max_utilization_pct=self.params.get("max_utilization_pct"),
            include_device_holders=self.params["include_device_holders"],
        )


def fail(module, exc: _errors.GpuError, **extra):
    result = exc.result()
    result.update(extra)
    module.fail_json(**result)
