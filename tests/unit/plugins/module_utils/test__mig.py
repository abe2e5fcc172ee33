# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""MIG's pure rules (_mig), the health check mig_mode_pending and nvidia-smi's MIG outputs from the field corpus."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _health, _mig, _pct, _smi

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FIELD = os.path.join(TOP, "tests", "field", "smi")
A, B = "MIG-aaaaaaaa-0000-0000-0000-000000000000", "MIG-bbbbbbbb-0000-0000-0000-000000000000"


def gpus():
    return [{"index": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000", "pci_bus_id": "00000000:18:00.0",
             "mig_devices": [
                 {"uuid": A, "device_nodes": ["/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"],
                  "memory": {"total": 68160, "used": 4096, "free": 64064, "reserved": 0}},
                 {"uuid": B, "device_nodes": ["/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"],
                  "memory": {"total": 17280, "used": 0, "free": 17280, "reserved": 0}}]},
            {"index": 1, "uuid": "GPU-11111111-0000-0000-0000-000000000000", "pci_bus_id": "00000000:2A:00.0",
             "mig_devices": []}]


@pytest.mark.parametrize("paths, expected", [
    (["/dev/nvidia0", "/dev/nvidiactl"], []),
    (["/dev/nvidia-caps/nvidia-cap13"], [A]),
    (["/tmp/sim/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap12"], [A, B]),
    (["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"], []),  # config, monitor: no MIG device's
])
def test_devices_of_nodes(paths, expected):
    assert _mig.devices_of_nodes(gpus(), paths) == expected


def test_narrow_keeps_the_selected_mig_devices_work_only():
    gpu = gpus()[0]
    gpu.update(processes=[{"pid": 10, "mig_device": A}, {"pid": 11, "mig_device": B}],
               holders=[{"pid": 10, "mig_devices": [A], "evidence": "context"},
                        {"pid": 11, "mig_devices": [B], "evidence": "context"},
                        {"pid": 12, "mig_devices": [], "evidence": "control"},
                        {"pid": 13, "mig_devices": [], "evidence": "device"}],
               memory={"total": 143771, "used": 4096, "free": 139675, "reserved": 0})
    _mig.narrow(gpu, {B.lower()})
    assert gpu["mig_selected"] == [B] and gpu["mig_unselected_pids"] == [10]
    assert [p["pid"] for p in gpu["processes"]] == [11]
    assert [h["pid"] for h in gpu["holders"]] == [11, 12]
    assert gpu["memory"] == {"total": 17280, "used": 0, "free": 17280, "reserved": 0}


def test_scan_patterns_look_into_nvidia_caps_only_on_a_mig_host():
    assert _mig.scan_patterns(["/dev/nvidia*"], gpus()[1:]) == ["/dev/nvidia*"]
    assert _mig.scan_patterns(["/dev/nvidia*", "/x/nvidia3"], gpus()) == ["/dev/nvidia*", "/x/nvidia3",
                                                                          "/dev/nvidia-caps/nvidia-cap*"]


@pytest.mark.parametrize("current, pending, fails", [
    (False, True, True), (True, False, True), (True, True, False), (False, False, False), (None, None, False),
    (True, None, False),
])
def test_mig_mode_pending(current, pending, fails):
    found = [c for c in _health.failed_checks({"index": 3, "mig_mode": current, "mig_mode_pending": pending})
             if c["check"] == "mig_mode_pending"]
    assert bool(found) == fails
    if fails:
        assert "reset" in found[0]["detail"] and "nvidia-smi -r -i 3" in found[0]["action"]


def test_the_field_corpus_mig_list():
    with open(os.path.join(FIELD, "exporter-linux-h100-mig-590.48.01", "list.txt"), encoding="utf-8") as f:
        listed = _smi.parse_mig_list(f.read())
    assert len(listed) == 1
    devices = next(iter(listed.values()))
    assert [p for p, _u in devices] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert devices[1][1] == "MIG-00000001-0000-0000-0000-000000000001"


@pytest.mark.parametrize("name, ids, total", [
    ("telegraf-a100-sxm4-v12", (3, 0), 19968),
    ("netdata-a100-sxm4-mig", (1, 0), 19968),
])
def test_the_field_corpus_mig_xml(name, ids, total):
    with open(os.path.join(FIELD, name, "q.xml"), encoding="utf-8") as f:
        parsed = _smi.parse_mig_xml(f.read())
    first = next(v for v in parsed.values() if v["devices"])
    gi, ci, mem = first["devices"][0]
    assert (gi, ci) == ids and mem["total"] == total and mem["used"] is not None
    assert first["pending"] is True


def test_a_toolkit_mig_id_gives_its_gpu():
    assert _pct.visible_gpus([B, "MIG-cccccccc-0000-0000-0000-000000000000"], gpus()) == (
        [0], ["MIG-cccccccc-0000-0000-0000-000000000000"])


def test_narrow_does_not_guess_where_an_unplaced_process_runs():
    gpu = gpus()[0]
    gpu.update(processes=[{"pid": 10, "mig_device": A}, {"pid": 14, "mig_device": None}], holders=[],
               memory={"total": 143771, "used": 4096, "free": 139675, "reserved": 0}, processes_error=None)
    _mig.narrow(gpu, {B.lower()})
    assert [p["pid"] for p in gpu["processes"]] == [14]
    assert "pid 14" in gpu["processes_error"] and "none of its MIG devices" in gpu["processes_error"]


CT = {"kind": "lxc", "id": 129}


@pytest.mark.parametrize("processes, holders, expected", [
    # a context on a MIG device, in a container and on the node
    ([{"pid": 1, "mig_device": A, "container": CT}, {"pid": 2, "mig_device": B}], [], {129: {A}, None: {B}}),
    # the capability nodes open (no context yet); a protected holder (a monitoring agent) holds none
    ([], [{"pid": 3, "mig_devices": [B], "container": CT}, {"pid": 4, "mig_devices": [A], "protected": True}],
     {129: {B}}),
    # a process on the whole GPU, a holder of control nodes only: nothing
    ([{"pid": 5, "mig_device": None, "container": CT}], [{"pid": 6, "mig_devices": []}], {}),
])
def test_held_by_place(processes, holders, expected):
    """_mig.held: the MIG devices each container's (and the node's) processes are on, over a snapshot."""
    assert _mig.held([{"index": 0, "processes": processes, "holders": holders}]) == expected
    assert _mig.in_order(gpus(), {B.lower(), A}) == [A, B]
