# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpus option, parsed once (_selection): its forms, what it names whole and through MIG devices, what it names
that the host does not have (issue 35, item 2)."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _selection

A, B = "MIG-aaaaaaaa-0000-0000-0000-000000000000", "MIG-bbbbbbbb-0000-0000-0000-000000000000"
C = "MIG-cccccccc-0000-0000-0000-000000000000"
GPUS = [
    {"index": 0, "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000", "pci_bus_id": "00000000:18:00.0", "mig_devices": []},
    {"index": 1, "uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000", "pci_bus_id": "00000000:3B:00.0",
     "mig_devices": [{"uuid": A}, {"uuid": B}]},
    {"index": 2, "uuid": "GPU-cccccccc-0000-0000-0000-000000000000", "pci_bus_id": "00000000:5D:00.0",
     "mig_devices": [{"uuid": C}]},
]

# (case, the option, GPU indexes whole, {index: MIG UUIDs (lower case)} of the GPUs named only through MIG devices)
CASES = [
    ("nothing: every GPU", [], {0, 1, 2}, {}),
    ("None: every GPU", None, {0, 1, 2}, {}),
    ("indexes, twice", ["2", "0", "2"], {0, 2}, {}),
    ("an index with leading zeros", ["01"], {1}, {}),
    ("an index with spaces", [" 1 "], {1}, {}),
    ("a GPU UUID in any case", ["GPU-BBBBBBBB-0000-0000-0000-000000000000"], {1}, {}),
    ("a GPU UUID with a lower-case prefix", ["gpu-bbbbbbbb-0000-0000-0000-000000000000"], {1}, {}),
    ("the driver's bus id", ["00000000:3B:00.0"], {1}, {}),
    ("a 4-digit domain, lower case", ["0000:3b:00.0"], {1}, {}),
    ("a short bus id", ["3b:00.0"], {1}, {}),
    ("a short bus id, upper case", ["5D:00.0"], {2}, {}),
    ("a MIG UUID: its GPU as far as it goes", [A], set(), {1: {A.lower()}}),
    ("two MIG UUIDs, hex in any case", [A, "MIG-" + B[4:].upper()], set(), {1: {A.lower(), B.lower()}}),
    ("the GPU whole beside one of its MIG devices: whole", [A, "1"], {1}, {}),
    ("... by an index with a leading zero", ["01", A], {1}, {}),
    ("... by its UUID", [A, "GPU-bbbbbbbb-0000-0000-0000-000000000000"], {1}, {}),
    ("... by a short bus id", [A, "3b:00.0"], {1}, {}),
    ("... by a long bus id", ["00000000:3b:00.0", A], {1}, {}),
    ("another GPU whole beside a MIG device", [A, "2"], {2}, {1: {A.lower()}}),
]


@pytest.mark.parametrize("name, option, whole, mig", CASES, ids=[c[0] for c in CASES])
def test_resolve_and_pick(name, option, whole, mig):
    selection = _selection.parse(option)
    assert selection.resolve(GPUS) == (whole, mig, [])
    assert [g["index"] for g in selection.pick(GPUS)] == sorted(whole | set(mig))


@pytest.mark.parametrize("option, missing, phrase", [
    (["7"], ["7"], "no GPU matches '7' on this host; it has: 0 (GPU-aaaaaaaa"),
    (["0", "GPU-deadbeef-0000-0000-0000-000000000000"], ["GPU-deadbeef-0000-0000-0000-000000000000"], "no GPU matches"),
    (["99:00.0", "1"], ["99:00.0"], "no GPU matches '99:00.0'"),
    (["MIG-dddddddd-0000-0000-0000-000000000000"], ["MIG-dddddddd-0000-0000-0000-000000000000"], A),
])
def test_what_names_nothing_fails_the_pick_naming_what_the_host_has(option, missing, phrase):
    selection = _selection.parse(option)
    assert selection.resolve(GPUS)[2] == missing
    with pytest.raises(_errors.SelectionError) as info:
        selection.pick(GPUS)
    assert phrase in info.value.msg


@pytest.mark.parametrize("value", ["gpu0", "²", "-1", "4096", "99999", "GPU-zz", "3b:00", "zz:00.0", "MIG-", ""])
def test_what_is_no_form_fails_naming_the_option(value):
    with pytest.raises(_errors.InvalidOption) as info:
        _selection.parse(["0", value])
    assert info.value.msg.startswith("gpus: ") and info.value.details["option"] == "gpus"


@pytest.mark.parametrize("option, expected", [
    ([], None), (["2", "01", "2"], [1, 2]), (["0", A], None), (["3b:00.0"], None), (["GPU-aaaaaaaa"], None),
])
def test_indexes_only_when_every_id_is_an_index(option, expected):
    assert _selection.parse(option).indexes() == expected


def test_of_indexes_is_the_selection_of_those_gpus():
    assert _selection.of_indexes([2, 0]).resolve(GPUS) == ({0, 2}, {}, [])
    assert not _selection.of_indexes([]) and _selection.of_indexes([1])


@pytest.mark.parametrize("text, expected", [
    ("00000000:3B:00.0", ("bus", "00000000:3B:00.0")), ("0000:3b:00.0", ("bus", "00000000:3B:00.0")),
    ("3b:00.0", ("bus", "00000000:3B:00.0")), ("0007", ("index", 7)), (A.upper(), ("mig", A.lower())),
    ("3b:00", None), ("zz:00.0", None), ("GPU", None),
])
def test_selector(text, expected):
    assert _selection.selector(text) == expected


def test_a_uuid_prefix_matches_only_where_asked():
    assert [g["index"] for g, _d in _selection.match("uuid", "gpu-cccc", GPUS, prefix=True)] == [2]
    assert _selection.match("uuid", "gpu-cccc", GPUS) == []
