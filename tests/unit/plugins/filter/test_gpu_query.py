# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations
import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.gpu.plugins.filter.gpu_query import gpu_query

FACTS = [
    {"index": 0, "idle": False, "busy_reasons": ["used by pid 8812 (python3) in CT 129"], "memory": {"used": 81920},
     "processes": [{"pid": 8812, "container": {"kind": "lxc", "id": 129}}]},
    {"index": 1, "idle": True, "busy_reasons": [], "memory": {"used": 0}, "processes": []},
    {"index": 2, "idle": False, "busy_reasons": ["host"], "memory": {"used": 512}, "processes": [{"pid": 77, "container": None}]},
]

CASES = [
    ("busy GPUs", "[?!idle].index", [0, 2]),
    ("ct 129 pids", "[].processes[?container.id==`129`][].pid", [8812]),
    ("memory pairs", "[].[index, memory.used]", [[0, 81920], [1, 0], [2, 512]]),
    ("count idle", "length([?idle])", 1),
    ("nothing", "[?index==`9`]", []),
]


@pytest.mark.parametrize("name, expr, expected", CASES, ids=[c[0] for c in CASES])
def test_gpu_query(name, expr, expected):
    assert gpu_query(FACTS, expr) == expected


@pytest.mark.parametrize("expr, phrase", [("[?idle", "bad JMESPath expression"), ("", "non-empty"), (None, "non-empty"),
                                          ("length(index)", "failed on this data")])
def test_gpu_query_errors(expr, phrase):
    with pytest.raises(AnsibleFilterError, match=phrase):
        gpu_query(FACTS, expr)
