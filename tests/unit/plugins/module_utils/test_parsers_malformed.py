# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Every parser of what a program or a kernel file prints, fed what real hosts print when something is wrong -
truncated, reordered, with extra fields, not UTF-8 (decoded with replacement, as the callers read it), empty -
gives its result or one of the error family (_errors.GpuError: unreadable_output with the input that broke it),
never another exception: a module's failure boundary (_common.run_module) turns that into a failed task with its
kind, never a traceback (issue 28, item 2)."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _health, _pct, _smi
from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs

# the 17 fields of _smi.GPU_FIELDS, as R580 prints them
GPU_ROW = ("0, GPU-0, NVIDIA H200, 1650123456789, 00000000:18:00.0, 143771, 0, 143771, 0, 0, 0, 34, 70.00, Enabled,"
           " Default, Disabled, Disabled, 580.95.05")
STAT = "4242 (python3) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 81234 1000 10 18446744073709551615"
STATUS = "Name:\tpython3\nUid:\t0\t0\t0\t0\nNSpid:\t4242\t17\n"
CONFIG = "arch: amd64\nhostname: gpu-a\ndev0: /dev/nvidia0\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
LIST = "VMID       Status     Lock         Name\n129        running                 gpu-a\n"
VMLIST = '{"version": 3, "ids": {"129": {"node": "pve1", "type": "lxc", "version": 1}}}'
XID = "3,1,1000,-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
APPS = "GPU-0, 4242, python3, 4096 MiB\n"
XML = "<nvidia_smi_log><gpu id='00000000:18:00.0'><uuid>GPU-0</uuid><minor_number>0</minor_number></gpu></nvidia_smi_log>"
NOT_UTF8 = b"\xff\xfe\x80 caf\xe9 \xc3(".decode("utf-8", "replace")


def variants(text: str) -> list:
    """What a host prints when something is wrong, built from a good text."""
    lines = text.splitlines()
    return [
        ("empty", ""),
        ("truncated mid-line", text[: max(1, len(text) * 2 // 3)]),
        ("the first line only, cut", lines[0][: len(lines[0]) // 2]),
        ("a field fewer", "\n".join(line.rsplit(", ", 1)[0] for line in lines)),
        ("a field more", "\n".join(line + ", 42" for line in lines)),
        ("reordered", "\n".join(reversed(text.split(", ")))),
        ("not UTF-8", NOT_UTF8 + text + NOT_UTF8),
        ("binary noise", "\x00\x01\x02" * 30),
        ("a warning line first", "WARNING: something\n" + text),
    ]


PARSERS = [
    ("_smi.parse_gpus", _smi.parse_gpus, GPU_ROW),
    ("_smi.parse_apps", _smi.parse_apps, APPS),
    ("_smi.parse_minor_numbers", _smi.parse_minor_numbers, XML),
    ("_smi.parse_listed_fields", _smi.parse_listed_fields, '"index"\n"uuid"\n'),
    ("_smi.parse_health", lambda t: _smi.parse_health(["remapped_rows.pending"], t), "0, No\n"),
    ("_procs.parse_stat", _procs.parse_stat, STAT),
    ("_procs.parse_status", _procs.parse_status, STATUS),
    ("_procs.container_from_cgroup", _procs.container_from_cgroup, "0::/lxc/129/ns/.lxc\n"),
    ("_procs.parse_id_map", _procs.parse_id_map, "         0     100000      65536\n"),
    ("_procs.parse_passwd", _procs.parse_passwd, "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n"),
    ("_pct.parse_list", _pct.parse_list, LIST),
    ("_pct.parse_config", _pct.parse_config, CONFIG),
    ("_pct.parse_conf_file", _pct.parse_conf_file, CONFIG + "\n[pve:pending]\ndelete: dev0\n"),
    ("_pct.node_containers", lambda t: _pct.node_containers(t, "pve1"), VMLIST),
    ("_pct.parse_is_active", _pct.parse_is_active, "active\n"),
    ("_health.parse_xid_events", _health.parse_xid_events, XID),
]
CASES = [(name, fn, vname, vtext) for name, fn, good in PARSERS for vname, vtext in variants(good)]


@pytest.mark.parametrize("name, parse, good", PARSERS, ids=[p[0] for p in PARSERS])
def test_the_good_input_parses(name, parse, good):
    parse(good)  # the table's good input is good: the malformed cases below start from something real


@pytest.mark.parametrize("name, parse, variant, text", CASES, ids=[f"{c[0]}: {c[2]}" for c in CASES])
def test_malformed_input_is_a_result_or_a_kind_of_the_error_family(name, parse, variant, text):
    try:
        parse(text)
    except _errors.GpuError as exc:
        assert exc.kind and exc.msg, (name, variant)
        if isinstance(exc, _errors.UnreadableOutput):
            assert exc.details["source"] and len(exc.details["sample"]) <= _errors.UnreadableOutput.SAMPLE_CHARS
    # any other exception fails the test: it would be a traceback from the module
