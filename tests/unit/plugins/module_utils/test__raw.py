# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The raw snapshot is declared once (_raw): both backends give GPUs and processes of the same shape."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _health, _raw, _smi

H200_ROW = ("0, GPU-5f4a1c2e-0000-0000-0000-000000000000, NVIDIA H200, 1654922017361, 00000000:18:00.0,"
            " 143771, 81920, 61851, 0, 97, 40, 34, 512.33, Enabled, Default, Disabled, Disabled, 580.95.05")


def test_an_empty_gpu_has_every_field_null_and_no_process():
    gpu = _raw.empty_gpu(3)
    assert gpu["index"] == 3 and gpu["health"] == {"status": "ok", "detail": None}
    assert gpu["processes"] == [] and gpu["processes_error"] is None and gpu["unsupported"] == [] and gpu["errors"] == []
    assert all(gpu[k] is None for k in ("uuid", "name", "serial", "minor_number", "pci_bus_id", "temperature", "power",
                                        "persistence_mode", "compute_mode", "mig_mode"))
    assert all(gpu[k] is None for k in _health.HEALTH_FIELDS)
    assert set(gpu["memory"]) == {"total", "used", "free", "reserved", "used_includes_reserved"}
    assert _raw.empty_gpu(3) is not _raw.empty_gpu(3) and _raw.empty_gpu(3)["processes"] is not gpu["processes"]


@pytest.mark.parametrize("args, expected", [
    ((812,), {"pid": 812, "types": [], "used_mib": None}),
    ((812, ["compute"], 40960), {"pid": 812, "types": ["compute"], "used_mib": 40960}),
    ((812, ("compute", "graphics"), 0), {"pid": 812, "types": ["compute", "graphics"], "used_mib": 0}),
])
def test_a_process(args, expected):
    assert _raw.process(*args) == expected and tuple(_raw.process(*args)) == _raw.PROCESS_KEYS


def test_nvidia_smi_gives_the_same_keys_as_an_empty_gpu():
    (gpu,) = _smi.parse_gpus(H200_ROW + "\n")
    assert set(gpu) - {"_driver_version"} == set(_raw.empty_gpu(0))
