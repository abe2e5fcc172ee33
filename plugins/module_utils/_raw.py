# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The raw snapshot both backends fill (_nvml through NVML, _smi through nvidia-smi), declared once.

A raw GPU is ``empty_gpu(index)`` with what the backend could read filled in: a field it cannot give
stays None (and is named in ``unsupported`` or ``errors``). A raw process is ``process(pid, types,
used_mib)``. _snapshot.build turns them into the facts.
"""

from __future__ import annotations

from ansible_collections.gpuops.gpu.plugins.module_utils import _health

# The keys of a raw GPU's process (the driver's view: no /proc yet).
PROCESS_KEYS = ("pid", "types", "used_mib")


def empty_gpu(index: int) -> dict:
    """A raw GPU of which nothing is known yet but its index: every field None, no process, healthy."""
    gpu = {"index": index, "health": {"status": "ok", "detail": None}}
    for key in ("uuid", "name", "serial", "minor_number", "pci_bus_id", "temperature", "power",
                "persistence_mode", "compute_mode", "mig_mode", "mig_mode_pending"):
        gpu[key] = None
    gpu["mig_devices"] = []  # MIG devices (mig_device each) while MIG mode is on; None when they cannot be read
    gpu["memory"] = {"total": None, "used": None, "free": None, "reserved": None, "used_includes_reserved": None}
    gpu["utilization"] = {"gpu": None, "memory": None}
    gpu["processes"] = []
    gpu["processes_error"] = None
    for key in _health.HEALTH_FIELDS:
        gpu[key] = None
    gpu["unsupported"] = []
    gpu["errors"] = []
    return gpu


def mig_device(uuid) -> dict:
    """A raw MIG device (_mig): its MIG UUID, GPU and compute instance ids, profile, memory, the driver's processes on
    it (process entries) and its capability nodes (/dev/nvidia-caps/nvidia-cap<N>)."""
    return {"uuid": uuid, "name": None, "profile": None, "gpu_instance_id": None, "compute_instance_id": None,
            "memory": {"total": None, "used": None, "free": None, "reserved": None, "used_includes_reserved": None},
            "processes": [], "processes_error": None, "device_nodes": []}


def process(pid: int, types=(), used_mib=None) -> dict:
    """A raw process entry: its pid, the kinds of context it has on the GPU (compute, graphics, mps) and its
    memory there in MiB (None when the driver does not say)."""
    return dict(zip(PROCESS_KEYS, (pid, list(types), used_mib)))
