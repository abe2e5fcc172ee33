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
      - A selector that matches no GPU is an error that lists the GPUs the host has.
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
      - A hung driver fails the task with a message instead of hanging the play.
    type: float
    default: 10
  device_files:
    description:
      - Glob patterns of the GPU device files whose holders are found by scanning C(/proc/*/fd).
      - C(nvidiaN) belongs to the GPU whose minor number is N; every other match (C(nvidiactl),
        C(nvidia-uvm)) belongs to every GPU.
    type: list
    elements: str
    default: ['/dev/nvidia*']
  include_device_holders:
    description:
      - Whether processes that hold a GPU's device file open (see O(device_files)) count as holders of
        that GPU besides the processes the driver reports - M(gpuops.gpu.gpu_release) stops them, and
        they keep the GPU from being idle even when the driver shows no context for them.
      - Protected daemons (see O(protect)) never count.
    type: bool
    default: true
  protect:
    description:
      - Process names or regular expressions (matched against the name and the command line) to add
        to the protected list. Protected processes are never signalled and do not keep a GPU busy.
      - Always protected, whatever this says - PID 1, kernel threads, the module's own process and its
        ancestors, C(nvidia-persistenced), C(nv-fabricmanager), C(nv-hostengine), C(dcgm-exporter), C(nvidia-smi).
    type: list
    elements: str
    default: []
"""

    IDLE = r"""
options:
  max_memory_used_mib:
    description:
      - A GPU with more memory in use than this is not idle.
      - The default, 64 MiB, sits above what an idle card reports with no process (0 to a few MiB of
        driver bookkeeping) and below the smallest CUDA context (hundreds of MiB on current GPUs).
    type: int
    default: 64
  max_utilization_pct:
    description:
      - When set, a GPU whose utilization is above this percentage is not idle.
    type: int
"""
