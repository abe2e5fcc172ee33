# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""_bound: a result in summary keeps every GPU and verdict, caps the lists that grow with the processes and counts
what it left out; in full it is the whole; detail_file has the whole."""

from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _bound
from ansible_collections.gpuops.gpu.plugins.module_utils._host import files
from ansible_collections.gpuops.gpu.plugins.module_utils._snapshot import compact_result


def busy_gpu(index, contexts, lingering, reasons=None):
    """A compacted GPU: ``contexts`` pids with a context (processes, blockers), ``lingering`` device holders."""
    return {
        "index": index, "idle": False, "fits": None, "health": {"status": "ok"},
        "processes": [{"pid": p, "name": f"w{p}", "cmdline": "x" * 500, "used_mib": 1024} for p in contexts],
        "holders": {"context": list(contexts), "device": [], "control": [1], "lingering": list(lingering)},
        "blockers": list(contexts),
        "busy_reasons": reasons if reasons is not None else [f"used by pid {p}" for p in contexts],
    }


def idle_gpu(index):
    return {"index": index, "idle": True, "processes": [], "holders": {"context": [], "device": [], "control": [1],
                                                                       "lingering": []},
            "blockers": [], "busy_reasons": []}


GPU_CASES = [
    # (name, gpu, expected lists' lengths, expected more)
    ("small: as it is", busy_gpu(0, [10], [20]), {"processes": 1, "blockers": 1, "busy_reasons": 1}, None),
    ("two contexts: one process with its details, both blockers", busy_gpu(0, [10, 11], [20]),
     {"processes": 1, "blockers": 2, "busy_reasons": 2}, {"processes": 1}),
    ("idle: as it is", idle_gpu(0), {"processes": 0, "blockers": 0, "busy_reasons": 0}, None),
    ("many contexts: capped and counted", busy_gpu(0, list(range(100, 130)), list(range(200, 300))),
     {"processes": _bound.CAP_PROCESSES, "blockers": _bound.CAP, "busy_reasons": _bound.CAP_REASONS},
     {"processes": 30 - _bound.CAP_PROCESSES, "blockers": 30 - _bound.CAP, "busy_reasons": 30 - _bound.CAP_REASONS,
      "holders": {"context": 30 - _bound.CAP, "lingering": 100 - _bound.CAP}}),
]


@pytest.mark.parametrize("name, entry, lengths, more", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_capped_with_counts(name, entry, lengths, more):
    out = _bound.gpu(entry)
    assert {k: len(out[k]) for k in lengths} == lengths, name
    assert out.get("more") == more
    assert out["idle"] is entry["idle"] and out["index"] == entry["index"]
    # a busy GPU keeps a blocker and a reason, and its blockers are among the processes and holders it keeps
    if entry["blockers"]:
        assert out["blockers"] and out["busy_reasons"]
        named = {p["pid"] for p in out["processes"]} | {p for pids in out["holders"].values() for p in pids}
        assert set(out["blockers"]) <= named
    assert all(len(p["cmdline"]) < _bound.CMDLINE + 40 for p in out["processes"])
    assert all(p["cmdline"] == "x" * 500 for p in entry["processes"]), "the input is not changed"


def test_the_blockers_come_first_in_each_list():
    """A device holder that blocks (the driver's list cannot be trusted) sorts after lingering ones by pid: it is kept."""
    entry = busy_gpu(0, [], list(range(200, 300)))
    entry["holders"]["device"] = list(range(300, 320))
    entry["blockers"] = [315]
    out = _bound.gpu(entry)
    assert out["holders"]["device"][0] == 315 and out["blockers"] == [315]


def release_result(gpus, per_gpu, others):
    """A gpu_release result in the snapshot's form (compacted as the module does), every holder with 66 files."""
    files = [f"/dev/nvidia{i}" for i in range(gpus)] + ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    contexts = {g: [1000 + g * per_gpu + k for k in range(per_gpu)] for g in range(gpus)}
    everyone = [p for ps in contexts.values() for p in ps] + list(range(5000, 5000 + others))

    def gpu(g):
        holders = [{"pid": p, "name": "w", "cmdline": "python3 -m server " + "y" * 300, "files": files,
                    "evidence": "context" if p in contexts[g] else "device", "container": None} for p in everyone]
        return {"index": g, "idle": False, "processes": [{"pid": p, "name": "w", "used_mib": 1} for p in contexts[g]],
                "holders": holders, "blockers": contexts[g], "lingering": [p for p in everyone if p not in contexts[g]],
                "busy_reasons": [f"used by pid {p}" for p in contexts[g]]}

    released = [{"pid": p, "name": "w", "gpus": list(range(gpus)), "signals": ["SIGTERM"]} for p in everyone]
    left = [{"pid": p, "start_time": 1, "reason": "on the host, not in containers (7700)"} for p in everyone]
    return compact_result({"changed": True, "released": released, "survivors": [], "left_holders": left,
                           "gpus_before": [gpu(g) for g in range(gpus)],
                           "gpus": [gpu(g) for g in range(gpus)], "samples": {"0": [[i, 1, 1] for i in range(40)]}})


def test_a_result_in_summary_is_bounded_and_counts_what_it_left_out():
    whole = release_result(64, 16, 20)
    out = _bound.bound(whole)
    assert len(str(whole)) > 1_000_000 and len(str(out)) < 300_000, (len(str(whole)), len(str(out)))
    more = out["detail"]["more"]
    assert out["detail"]["level"] == "summary" and out["detail"]["file"] is None
    assert len(out["released"]) + more["released"] == len(whole["released"])
    assert len(out["holder_processes"]) + more["holder_processes"] == len(whole["holder_processes"])
    assert len(out["holder_processes"]) <= _bound.CAP_DETAILS
    assert len(out["left_holders"]) == _bound.CAP_LEFT and more["left_holders"] == len(whole["left_holders"]) - _bound.CAP_LEFT
    assert len(out["samples"]["0"]) == _bound.CAP_SAMPLES and more["samples.0"] == 40 - _bound.CAP_SAMPLES
    assert out["samples"]["0"][-1] == whole["samples"]["0"][-1], "the latest points are kept"
    assert out["samples"]["0"][0] == whole["samples"]["0"][0], "and the first: where the wait began"
    # every GPU there, each with its verdict; the details kept are the blockers' first
    assert [g["index"] for g in out["gpus"]] == list(range(64)) and all(g["idle"] is False for g in out["gpus"])
    assert {str(p) for p in out["gpus_before"][0]["blockers"]} <= set(out["holder_processes"])
    entry = next(iter(out["holder_processes"].values()))
    assert len(entry["files"]["/dev"]) == _bound.CAP and entry["more"]["files"]["/dev"] == 66 - _bound.CAP
    assert _bound.left_out(out, "released") == more["released"]
    assert _bound.left_out(out["gpus"][0], "holders", "lingering") > 0


def test_full_is_the_whole_result():
    whole = release_result(8, 2, 2)
    out = _bound.bound(whole, _bound.FULL)
    assert {k: v for k, v in out.items() if k != "detail"} == whole
    assert out["detail"] == {"level": "full", "file": None, "more": {}}


def test_nested_results_are_bounded_with_their_prefix():
    fence = {"containers": [], "release": release_result(64, 2, 40)}
    release = release_result(64, 2, 40)
    facts = {"ansible_facts": {"gpu_devices": release["gpus"], "gpu_holder_processes": release["holder_processes"]}}
    assert "release.released" in _bound.bound(fence)["detail"]["more"]
    out = _bound.bound(facts)
    assert "ansible_facts.gpu_holder_processes" in out["detail"]["more"]
    assert all("more" in g for g in out["ansible_facts"]["gpu_devices"])


@pytest.mark.parametrize("length, level, shown", [
    (1999, _bound.SUMMARY, 1999), (2000, _bound.SUMMARY, 2000),
    (2001, _bound.SUMMARY, None), (19000, _bound.SUMMARY, None),  # a wait's failure on a busy host: cut
    (19000, _bound.FULL, 19000),
])
def test_a_message_in_summary_is_at_most_2000_characters(tmp_path, length, level, shown):
    msg = "".join(f"GPU {i}: held by pid {1000 + i} (python3) in CT 129; " for i in range(length))[:length]
    path = str(tmp_path / "r.json")
    out = _bound.bound({"failed": True, "msg": msg}, level, path, write=files.write_json)
    if shown is None:
        assert len(out["msg"]) <= _bound.MSG and out["msg"].startswith(msg[:1800]) and "detail_file" in out["msg"]
        assert out["detail"]["more"]["msg"] == length - len(out["msg"].split(" [... ")[0])
    else:
        assert out["msg"] == msg and "msg" not in out["detail"]["more"]
    with open(path, encoding="utf-8") as f:
        assert json.load(f)["msg"] == msg  # the whole of it


def test_detail_file_has_the_whole_result(tmp_path):
    whole = release_result(16, 4, 4)
    path = str(tmp_path / "r.json")
    out = _bound.bound(whole, _bound.SUMMARY, path, write=files.write_json)
    assert out["detail"]["file"] == path and out["detail"]["more"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == json.loads(json.dumps(whole))
    assert not [n for n in os.listdir(tmp_path) if n != "r.json"], "no temp file left"


@pytest.mark.parametrize("path", ["/nonexistent-dir/r.json", "relative.json"])
def test_a_detail_file_that_cannot_be_written_is_a_warning(path):
    said = []
    out = _bound.bound({"changed": False}, _bound.SUMMARY, path, said.append, files.write_json)
    assert out["detail"]["file"] is None
    assert len(said) == (1 if path.startswith("/") else 0)  # a relative path: the option's own check fails the task


def test_a_later_slice_carries_the_first_look_from_the_file(tmp_path):
    path = str(tmp_path / "w.json")
    (tmp_path / "w.json").write_text(json.dumps({"gpus_before": [{"index": 0}], "holder_processes": {"5": {"pid": 5}}}))
    out = _bound.carry(files.read_json(path), {"gpus": [{"index": 0}], "holder_processes": {"6": {"pid": 6}}})
    assert out["gpus_before"] == [{"index": 0}] and set(out["holder_processes"]) == {"5", "6"}
    assert files.read_json(str(tmp_path / "none.json")) is None
    assert _bound.carry(None, {"gpus": []}) == {"gpus": []}


@pytest.mark.parametrize("gpus, processes_kept", [(64, _bound.CAP_PROCESSES), (128, _bound.CAP_PROCESSES),
                                                  (32, 2 * _bound.CAP_PROCESSES), (8, 8 * _bound.CAP_PROCESSES),
                                                  (1, 64 * _bound.CAP_PROCESSES)])
def test_a_smaller_host_keeps_more_per_gpu(gpus, processes_kept):
    """The caps of a GPU's lists are a 64-GPU host's; N GPUs get 64 / N times as many: the same bound in all."""
    result = {"gpus": [busy_gpu(g, list(range(1000 * g, 1000 * g + 200)), []) for g in range(gpus)]}
    out = _bound.summarize(result)
    assert {len(g["processes"]) for g in out["gpus"]} == {processes_kept}
    assert {g["more"]["processes"] for g in out["gpus"]} == {200 - processes_kept}


@pytest.mark.parametrize("count, level, expected", [
    (3, "summary", "a0, a1, a2"),
    (_bound.CAP, "summary", ", ".join(f"a{i}" for i in range(_bound.CAP))),
    (_bound.CAP + 5, "summary", ", ".join(f"a{i}" for i in range(_bound.CAP)) + ", and 5 more (detail: full names them)"),
    (2000, "summary", ", ".join(f"a{i}" for i in range(_bound.CAP)) + ", and 1992 more (detail: full names them)"),
    (20, "full", ", ".join(f"a{i}" for i in range(20))),
    (0, "summary", ""),
])
def test_a_message_names_a_few_and_counts_the_rest(count, level, expected):
    assert _bound.listed((f"a{i}" for i in range(count)), level) == expected


def test_a_one_gpu_result_of_2000_released_stays_small():
    # The result's own lists do not grow with its GPUs: a release of 2,000 processes on one GPU (250 KB when scaled
    # as a one-GPU result's) keeps an 8-GPU host's share.
    whole = {"gpus_before": [busy_gpu(0, [], [])], "released": [
        {"pid": 1000 + i, "name": "sleep", "cmdline": "x" * 200, "signals": ["SIGTERM"]} for i in range(2000)]}
    out = _bound.bound(whole)
    assert len(out["released"]) == _bound.CAP_ENTRIES * _bound.ENTRY_TIMES
    assert out["detail"]["more"]["released"] == 2000 - len(out["released"])
    assert len(json.dumps(out)) < 60_000
