# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The pure parts of the NVML backend: which process query and entry layout a library gets.

The ctypes calls themselves are exercised against the simulator's driver profiles
(tests/functional/test_driver_profiles.py), with the real bindings.
"""

from __future__ import annotations
import ctypes

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils._host.nvml import (
    PciInfo,
    PciInfoV1,
    ProcessInfoV1,
    ProcessInfoV2,
    ProcessInfoV3,
    branch_of,
    choose_process_query,
    implausible_pid,
    read_pid_max,
)

V3 = "nvmlDeviceGetComputeRunningProcesses_v3"
V2 = "nvmlDeviceGetComputeRunningProcesses_v2"
V1 = "nvmlDeviceGetComputeRunningProcesses"
CC = "nvmlDeviceGetConfComputeMemSizeInfo"
DETAIL = "nvmlDeviceGetRunningProcessDetailList"

# (branch, symbols the library exports, expected symbol, expected entry size)
LAYOUT_CASES = [
    ("R440: only the unversioned query", {V1}, V1, 16),
    ("R470: _v2, no _v3", {V1, V2}, V2, 24),
    ("R525: _v3 without ConfCompute", {V1, V2, V3}, V3, 24),
    ("R535: _v3 with ConfCompute, no DetailList", {V1, V2, V3, CC}, V3, 32),
    ("R550+: _v3 with both", {V1, V2, V3, CC, DETAIL}, V3, 24),
    ("DetailList alone (no ConfCompute) is not R535", {V1, V2, V3, DETAIL}, V3, 24),
    ("_v3 only", {V3}, V3, 24),
    ("_v3 only, R535 markers", {V3, CC}, V3, 32),
    ("_v2 with R535 markers: _v2 is always 24", {V1, V2, CC}, V2, 24),
    ("nothing at all", set(), None, None),
]


@pytest.mark.parametrize("name, symbols, symbol, size", LAYOUT_CASES, ids=[c[0] for c in LAYOUT_CASES])
def test_choose_process_query(name, symbols, symbol, size):
    chosen, struct = choose_process_query(symbols.__contains__)
    assert chosen == symbol
    assert (ctypes.sizeof(struct) if struct else None) == size


def test_choose_process_query_other_kinds():
    symbols = {"nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetMPSComputeRunningProcesses"}
    assert choose_process_query(symbols.__contains__, "Graphics")[0] == "nvmlDeviceGetGraphicsRunningProcesses_v2"
    assert choose_process_query(symbols.__contains__, "MPSCompute")[0] == "nvmlDeviceGetMPSComputeRunningProcesses"
    assert choose_process_query(symbols.__contains__, "Compute") == (None, None)


@pytest.mark.parametrize("struct, size, offsets", [
    (ProcessInfoV1, 16, {"pid": 0, "usedGpuMemory": 8}),
    (ProcessInfoV2, 24, {"pid": 0, "usedGpuMemory": 8, "gpuInstanceId": 16, "computeInstanceId": 20}),
    (ProcessInfoV3, 32, {"pid": 0, "usedGpuMemory": 8, "gpuInstanceId": 16, "computeInstanceId": 20,
                         "usedGpuCcProtectedMemory": 24}),
    (PciInfo, 68, {"busIdLegacy": 0, "domain": 16, "bus": 20, "device": 24, "busId": 36}),
    (PciInfoV1, 52, {"busId": 0, "domain": 16, "bus": 20, "device": 24}),
])
def test_layouts_match_nvml_h(struct, size, offsets):
    assert ctypes.sizeof(struct) == size
    for field, offset in offsets.items():
        assert getattr(struct, field).offset == offset


@pytest.mark.parametrize("pid, expected", [
    (0, True), (1, False), (3070, False), (4194303, False), (4194304, True), (4294967295, True), (-1, True),
])
def test_implausible_pid(pid, expected):
    assert implausible_pid(pid, 4194304) is expected


def test_implausible_pid_follows_pid_max():
    assert implausible_pid(40000, 32768) and not implausible_pid(32767, 32768)


@pytest.mark.parametrize("version, branch", [
    ("535.216.01", "R535"), ("440.118.02", "R440"), ("580.159.03", "R580"), ("", ""), (None, ""), ("x.1", ""),
])
def test_branch_of(version, branch):
    assert branch_of(version) == branch


def test_read_pid_max(tmp_path):
    path = tmp_path / "pid_max"
    path.write_text("32768\n")
    assert read_pid_max(str(path)) == 32768
    assert read_pid_max(str(tmp_path / "missing")) == 4194304
