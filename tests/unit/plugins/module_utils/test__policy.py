# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations
import re

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils._policy import (
    classify,
    compile_regex,
    outside_filters,
    validate_vmids,
)


def proc(pid, name="python3", cmdline=None, user="root", uid=0, ct=None, ppid=1, gpus=(0,)):
    return {"pid": pid, "name": name, "cmdline": cmdline or name, "user": user, "uid": uid, "ppid": ppid,
            "start_time": pid * 10, "container": {"kind": "lxc", "id": ct, "pid_in_container": 5} if ct else None,
            "gpus": list(gpus)}


FILTER_CASES = [
    ("no filters", proc(10), {}, ""),
    ("container match", proc(10, ct=129), {"containers": [129]}, ""),
    ("other container", proc(10, ct=130), {"containers": [129]}, "in CT 130, not in containers 129"),
    ("host process with containers filter", proc(10), {"containers": [129]}, "not in a container"),
    ("user by name", proc(10, user="ml", uid=1000), {"users": ["ml"]}, ""),
    ("user by uid", proc(10, user="ml", uid=1000), {"users": ["1000"]}, ""),
    ("other user", proc(10, user="bob", uid=1001), {"users": ["ml"]}, "user bob is not in users"),
    ("match", proc(10, cmdline="python3 -m sglang.launch_server"), {"match": re.compile("sglang")}, ""),
    ("no match", proc(10, cmdline="python3 train.py"), {"match": re.compile("sglang")}, "does not match"),
    ("pids", proc(10), {"pids": {10, 11}}, ""),
    ("not in pids", proc(12), {"pids": {10, 11}}, "pid not in pids"),
    ("excluded", proc(10, cmdline="jupyter lab"), {"exclude": re.compile("jupyter")}, "matches exclude"),
]


@pytest.mark.parametrize("name, p, filters, phrase", FILTER_CASES, ids=[c[0] for c in FILTER_CASES])
def test_outside_filters(name, p, filters, phrase):
    why = outside_filters(p, **filters)
    assert (phrase in why) if phrase else why == ""


@pytest.mark.parametrize("values, expected", [([129, "130"], [129, 130]), ([], []), (None, [])])
def test_validate_vmids(values, expected):
    assert validate_vmids(values) == expected


@pytest.mark.parametrize("bad", [99, "abc", 0, -1, 1000000000, "12x"])
def test_validate_vmids_rejects(bad):
    with pytest.raises(ValueError, match="containers"):
        validate_vmids([bad])


def test_compile_regex_names_the_option():
    with pytest.raises(ValueError, match="match: '\\(' is not a valid regular expression"):
        compile_regex("match", "(")


def test_classify_protects_filters_and_walks_the_tree():
    api = proc(100, cmdline="python3 -m vllm.entrypoints.api_server", ct=129)
    persistenced = proc(200, name="nvidia-persistenced")
    other_ct = proc(300, ct=130)
    ansible = proc(400, name="python3", cmdline="ansible module")
    workers = {101: proc(101, cmdline="vllm worker 0", ct=129, ppid=100), 102: proc(102, cmdline="vllm worker 1", ct=129, ppid=100),
               103: proc(103, cmdline="jupyter kernel", ct=129, ppid=100), 104: proc(104, name="nvidia-smi", ppid=101)}
    children = {100: [101, 102, 103], 101: [104]}
    targets, protected, skipped = classify(
        [api, persistenced, other_ct, ansible], protected_pids={400: "an ancestor of the module"},
        filters={"containers": [129], "exclude": re.compile("jupyter")}, tree=True, children=children, read=workers.get)
    assert [t["pid"] for t in targets] == [100, 101, 102]
    assert [t.get("via") for t in targets] == [None, 100, 100]
    assert {p["pid"]: p["reason"] for p in protected} == {
        104: "NVIDIA daemon (nvidia-smi)", 200: "NVIDIA daemon (nvidia-persistenced)", 400: "an ancestor of the module"}
    assert [(s["pid"], s["reason"].split(",")[0]) for s in skipped] == [(103, "descendant of pid 100"), (300, "in CT 130")]


def test_classify_without_tree_leaves_children():
    targets, _p, _s = classify([proc(100)], {}, tree=False, children={100: [101]}, read=lambda pid: proc(pid, ppid=100))
    assert [t["pid"] for t in targets] == [100]


def test_filters_and_protect_see_the_raw_command_line_through_text_of():
    # The reported command lines are redacted; match, exclude and protect see what text_of gives.
    raw = {100: "vllm serve --api-key sk-tenant-a-0123456789", 101: "vllm serve --api-key sk-tenant-b-0123456789",
           102: "vllm serve --api-key sk-tenant-c-0123456789"}
    shown = [proc(pid, cmdline="vllm serve --api-key ****") for pid in (100, 101, 102)]
    filters = {"match": compile_regex("match", "tenant-[ab]"), "exclude": compile_regex("exclude", "tenant-b")}
    targets, protected, skipped = classify(shown, {}, protect=["tenant-c"], filters=filters, tree=False,
                                           text_of=lambda p: raw[p["pid"]])
    assert [t["pid"] for t in targets] == [100]
    assert [s["pid"] for s in skipped] == [101] and "matches exclude" in skipped[0]["reason"]
    assert [p["pid"] for p in protected] == [102]
    assert all(t["cmdline"] == "vllm serve --api-key ****" for t in targets + skipped + protected)


def test_without_text_of_the_reported_command_line_is_matched():
    assert "does not match" in outside_filters(proc(10, cmdline="vllm --api-key ****"), match=compile_regex("match", "sk-"))


@pytest.mark.parametrize("bad", ["١٢٩", "²", True, 10 ** 12])
def test_validate_vmids_is_ascii_and_bounded(bad):
    with pytest.raises(ValueError, match="^containers"):
        validate_vmids([bad])
