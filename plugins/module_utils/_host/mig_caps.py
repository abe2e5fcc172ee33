# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The MIG devices' capability nodes, as the driver lists them in /proc/driver/nvidia/capabilities (_mig has the
rest of MIG)."""

from __future__ import annotations

import os
import re

from ansible_collections.gpuops.gpu.plugins.module_utils._mig import CAP_DEV_DIR

# Where the driver lists the capabilities (a simulator points GPUOPS_NVIDIA_CAPS elsewhere).
CAPS_ENV = "GPUOPS_NVIDIA_CAPS"
CAPS_DIR = "/proc/driver/nvidia/capabilities"
_MINOR_LINE = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)


def caps_dir() -> str:
    return os.environ.get(CAPS_ENV) or CAPS_DIR


def cap_minor(gpu_minor, gi, ci=None):
    """The minor of the capability node of GPU instance ``gi`` (``ci`` None) or of its compute instance ``ci`` on the
    GPU of minor number ``gpu_minor``; None when the driver does not list it (or it cannot be read)."""
    if gpu_minor is None or gi is None:
        return None
    parts = [caps_dir(), f"gpu{gpu_minor}", "mig", f"gi{gi}"] + ([] if ci is None else [f"ci{ci}"]) + ["access"]
    try:
        with open(os.path.join(*parts), encoding="utf-8") as f:
            m = _MINOR_LINE.search(f.read())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def device_nodes(gpu_minor, gi, ci) -> list:
    """The capability nodes of a MIG device, as the node names them: [GPU instance's, compute instance's]."""
    out = []
    for minor in (cap_minor(gpu_minor, gi), cap_minor(gpu_minor, gi, ci)):
        if minor is not None:
            out.append(f"{CAP_DEV_DIR}/nvidia-cap{minor}")
    return out


def fill_device_nodes(gpus) -> None:
    """Each MIG device's ``device_nodes`` (its GPU instance's and compute instance's capability nodes)."""
    for g in gpus:
        for dev in g.get("mig_devices") or ():
            dev["device_nodes"] = device_nodes(g.get("minor_number"), dev.get("gpu_instance_id"),
                                               dev.get("compute_instance_id"))
