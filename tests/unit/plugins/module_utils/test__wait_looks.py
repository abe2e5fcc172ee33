# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The wait's look at its GPUs (_wait.Looks): the count check, the selection and which GPUs nvidia-smi is asked about
are the rule's decisions; the host (_host.wait_io.WaitIO, a fake here) only reads and restricts."""

from __future__ import annotations

import types

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _selection, _validate, _wait


class FakeWaitHost:
    """Four GPUs; nvidia-smi (the backend here) answers for those ``restrict`` named."""

    def __init__(self, count=4):
        self.gpus = [{"index": i, "uuid": f"GPU-{i}", "pci_bus_id": f"00000000:{i:02X}:00.0"} for i in range(count)]
        self.ids = None
        self.restricts = []   # each restrict() call, in order
        self.looks = []       # (full, processes) of each look

    def snapshot(self, full, processes=True):
        self.looks.append((full, processes))
        return [g for g in self.gpus if not self.ids or str(g["index"]) in self.ids]

    def restrict(self, indexes):
        self.restricts.append(indexes)
        self.ids = indexes

    def restricted(self):
        return bool(self.ids)


@pytest.mark.parametrize("params, selected, restricts", [
    # no selection: every GPU, nvidia-smi never restricted
    ({}, [0, 1, 2, 3], []),
    # by index alone: nvidia-smi asked about them from the first look on
    ({"gpus": ["2", "01"]}, [1, 2], [["1", "2"], ["1", "2"]]),
    # ... but not while the count is still to be checked (it needs every GPU)
    ({"gpus": ["2"], "expected_count": 4}, [2], [["2"]]),
    # a later slice: the first one checked the count
    ({"gpus": ["2"], "expected_count": 4, "progress_state": {"wait": {}}}, [2], [["2"], ["2"]]),
    # by UUID: restricted from the first selection on
    ({"gpus": ["GPU-3"]}, [3], [["3"]]),
])
def test_the_wait_selects_and_restricts(params, selected, restricts):
    host = FakeWaitHost()
    look = _wait.Looks(params, host, _selection.parse(params.get("gpus")))
    assert [g["index"] for g in look(True)] == selected
    assert host.restricts == restricts


def test_the_count_is_checked_at_the_first_look_only():
    host = FakeWaitHost(count=3)
    with pytest.raises(_errors.GpuError, match="^expected 4 GPUs, the driver shows 3"):
        _wait.Looks({"expected_count": 4}, host, _selection.Selection())(True)
    look = _wait.Looks({"expected_count": 3}, host, _selection.Selection())
    look(True)
    host.gpus.pop()
    assert len(look(False)) == 2   # a GPU lost later is the wait's to report (_check_lost), not a count failure


def test_an_unknown_gpu_is_named_against_every_gpu_the_host_has():
    """nvidia-smi restricted to a GPU the host does not have: the selection is read again unrestricted (a cheap look,
    no processes), so that the error lists the GPUs there are."""
    host = FakeWaitHost()
    with pytest.raises(_errors.SelectionError) as exc:
        _wait.Looks({"gpus": ["7"]}, host, _selection.parse(["7"]))(True)
    assert host.restricts == [["7"], None] and host.looks == [(True, True), (False, False)]
    assert "7" in exc.value.msg


HOLDERS = {9: ["/dev/nvidia2"], 10: ["/dev/nvidiactl", "/dev/nvidia2"], 11: ["/dev/nvidia3"], 12: ["/dev/nvidiactl"]}
PROCS = {9: {"pid": 9, "name": "nvidia-persistenced", "cmdline": "/usr/bin/nvidia-persistenced --verbose"},
         10: {"pid": 10, "name": "python3", "cmdline": "python3 keeper.py"}}


@pytest.mark.parametrize("protect, expected", [
    ([], [{"pid": 9, "name": "nvidia-persistenced", "protected": True}, {"pid": 10, "name": "python3", "protected": False}]),
    (["keeper"], [{"pid": 9, "name": "nvidia-persistenced", "protected": True},
                  {"pid": 10, "name": "python3", "protected": True}]),
])
def test_who_holds_a_gpus_node_is_the_rules_to_judge(protect, expected):
    """The host scans and reads (device_holders, read, exe); which holder is on the GPU's node and which is protected
    is _wait.node_holders'. Pid 11 holds another GPU's node, pid 12 a control node only."""
    host = types.SimpleNamespace(device_holders=lambda: HOLDERS, read=PROCS.get, exe=lambda pid: None)
    got = _wait.node_holders(host, [{"index": 2, "minor_number": 2}], _validate.regexes("protect", protect))
    assert got == {2: expected}
