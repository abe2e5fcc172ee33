# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.filter.gpu_table import FilterModule
from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import (
    gpu_blockers,
    gpu_report_markdown,
    gpu_report_rows,
    gpu_report_table,
    gpu_table,
)

LEAK = ("1200 MiB used by processes not visible from this PID namespace (another container or the host),"
        " or a leaked context")


def gpu(index, used=0, total=143771, procs=(), holders=(), blockers=None, idle=None, reasons=None, name="NVIDIA H200",
        uuid=None, health="ok"):
    """A GPU dict shaped like _snapshot.build's, small."""
    procs, holders = list(procs), list(holders)
    blockers = sorted({p["pid"] for p in procs}) if blockers is None else blockers
    reasons = [f"used by pid {p['pid']}" for p in procs] if reasons is None else reasons
    return {"index": index, "name": name, "uuid": uuid or f"GPU-{index:04d}", "memory": {"used": used, "total": total},
            "health": {"status": health, "detail": None}, "processes": procs, "holders": holders, "blockers": blockers,
            "idle": (not reasons) if idle is None else idle, "busy_reasons": reasons}


def proc(pid, name="python3", mib=None, ct=None, unit=None, visible=True):
    return {"pid": pid, "name": name, "used_mib": mib, "container": {"kind": "lxc", "id": ct} if ct else None,
            "unit": unit, "visible": visible}


def holder(pid, name="python3", evidence="device", ct=None):
    return {"pid": pid, "name": name, "container": {"kind": "lxc", "id": ct} if ct else None, "unit": None,
            "evidence": evidence, "files": ["/dev/nvidia0"]}


IDLE = gpu(0)
SGLANG = gpu(3, used=130048, procs=[proc(8812, mib=130048, ct=129, unit="sglang.service")],
             holders=[holder(8812, evidence="context", ct=129)])
DEVICE = gpu(1, used=900, holders=[holder(77, name="sleeper")], blockers=[77], reasons=["device file held by pid 77"])
HIDDEN = gpu(2, used=4096, procs=[proc(4242, name=None, mib=4096, visible=False)])
NO_MEMORY = dict(gpu(4), memory=None, name=None, index=None)
MANY = gpu(5, used=5000, procs=[proc(100 + i, mib=1000) for i in range(5)])
LEAKED = gpu(6, used=1200, reasons=[LEAK])

TABLE = [
    ("idle", [IDLE], {}, ["1 GPU(s)", "GPU 0  NVIDIA H200  0 / 143771 MiB  idle"]),
    ("busy in a container with a unit", [SGLANG], {},
     ["1 GPU(s)", "GPU 3  NVIDIA H200  130048 / 143771 MiB  pid 8812 python3 (CT 129, sglang.service, 130048 MiB)"]),
    ("device-file holder", [DEVICE], {}, ["1 GPU(s)", "GPU 1  NVIDIA H200  900 / 143771 MiB  pid 77 sleeper (device file)"]),
    ("pid not visible from here", [HIDDEN], {},
     ["1 GPU(s)", "GPU 2  NVIDIA H200  4096 / 143771 MiB  pid 4242 (not visible from here)"]),
    ("missing memory, name and index", [NO_MEMORY], {}, ["1 GPU(s)", "GPU ?  ?  ? / ? MiB  idle"]),
    ("many holders are cut after three", [MANY], {},
     ["1 GPU(s)", "GPU 5  NVIDIA H200  5000 / 143771 MiB  pid 100 python3 (1000 MiB), pid 101 python3 (1000 MiB),"
                  " pid 102 python3 (1000 MiB), +2 more"]),
    ("a long reason is cut, whole words", [LEAKED], {},
     ["1 GPU(s)", "GPU 6  NVIDIA H200  1200 / 143771 MiB  1200 MiB used by processes not visible from this PID namespace..."]),
    ("header: title, host, driver, seen from; names padded", [IDLE, dict(gpu(1), name="H100")],
     {"title": "after", "host": "gpu-ct", "seen_from": "pve", "driver": {"driver_version": "550.163.01", "backend": "nvml"}},
     ["after - gpu-ct: 2 GPU(s), driver 550.163.01 (nvml), seen from pve",
      "GPU 0  NVIDIA H200  0 / 143771 MiB  idle",
      "GPU 1  H100         0 / 143771 MiB  idle"]),
    ("gpu_count differs; seen from itself is not said; driver as text", [IDLE],
     {"host": "pve", "seen_from": "pve", "gpu_count": 8, "driver": "550.163.01"},
     ["pve: 1 of 8 GPU(s), driver 550.163.01", "GPU 0  NVIDIA H200  0 / 143771 MiB  idle"]),
    ("unknown driver left out", [IDLE], {"title": "before", "driver": {"driver_version": None, "backend": None}, "gpu_count": 1},
     ["before: 1 GPU(s)", "GPU 0  NVIDIA H200  0 / 143771 MiB  idle"]),
    ("health first when not ok", [dict(SGLANG, health={"status": "error", "detail": "Xid"})], {},
     ["1 GPU(s)", "GPU 3  NVIDIA H200  130048 / 143771 MiB  health error: pid 8812 python3 (CT 129, sglang.service, 130048 MiB)"]),
    ("nothing", None, {"host": "h"}, ["h: 0 GPU(s)"]),
    ("entries that are not GPUs are left out", [IDLE, None, "x"], {}, ["1 GPU(s)", "GPU 0  NVIDIA H200  0 / 143771 MiB  idle"]),
    ("busy with no reason given", [gpu(0, idle=False, reasons=[])], {}, ["1 GPU(s)", "GPU 0  NVIDIA H200  0 / 143771 MiB  busy"]),
    ("idle unknown", [dict(gpu(0), idle=None)], {}, ["1 GPU(s)", "GPU 0  NVIDIA H200  0 / 143771 MiB  ?"]),
]


@pytest.mark.parametrize("name, after, kwargs, expected", TABLE, ids=[c[0] for c in TABLE])
def test_gpu_table(name, after, kwargs, expected):
    assert gpu_table(after, **kwargs) == expected


AFTER_IDLE = dict(gpu(3), uuid=SGLANG["uuid"])
BEFORE_AFTER = [
    ("released", [SGLANG], [AFTER_IDLE],
     ["GPU 3  NVIDIA H200  130048 -> 0 / 143771 MiB  pid 8812 python3 (CT 129, sglang.service, 130048 MiB) -> idle"]),
    ("still held", [SGLANG], [SGLANG],
     # nothing changed on the GPU: its state once, not "x -> x"
     ["GPU 3  NVIDIA H200  130048 / 143771 MiB  pid 8812 python3 (CT 129, sglang.service, 130048 MiB)"]),
    ("matched by uuid, not by position or index", [IDLE, SGLANG], [dict(AFTER_IDLE, index=7), dict(IDLE, used=0)],
     ["GPU 7  NVIDIA H200  130048 -> 0 / 143771 MiB  pid 8812 python3 (CT 129, sglang.service, 130048 MiB) -> idle",
      "GPU 0  NVIDIA H200            0 / 143771 MiB  idle"]),
    ("by index when there is no uuid", [dict(SGLANG, uuid=None)], [dict(gpu(3), uuid=None)],
     ["GPU 3  NVIDIA H200  130048 -> 0 / 143771 MiB  pid 8812 python3 (CT 129, sglang.service, 130048 MiB) -> idle"]),
    ("a GPU gone after, one new", [SGLANG], [gpu(0)],
     ["GPU 0  NVIDIA H200       ? -> 0 / 143771 MiB  ? -> idle",
      "GPU 3  NVIDIA H200  130048 -> ? / 143771 MiB  pid 8812 python3 (CT 129, sglang.service, 130048 MiB) -> not seen"]),
    ("empty before", [], [IDLE], ["GPU 0  NVIDIA H200  ? -> 0 / 143771 MiB  ? -> idle"]),
]


@pytest.mark.parametrize("name, before, after, lines", BEFORE_AFTER, ids=[c[0] for c in BEFORE_AFTER])
def test_gpu_table_before_after(name, before, after, lines):
    out = gpu_table(after, before=before, host="gpu-ct", title="after")
    assert out[0] == f"after - gpu-ct: {len(after)} GPU(s)"
    assert out[1:] == lines


BLOCKERS = [
    ("idle GPUs are left out", [IDLE, dict(gpu(1), idle=True)], []),
    ("a process in a container", [IDLE, SGLANG], ["GPU 3: pid 8812 python3 (CT 129, sglang.service) 130048 MiB"]),
    ("a device-file holder", [DEVICE], ["GPU 1: pid 77 sleeper (device file)"]),
    ("not visible", [HIDDEN], ["GPU 2: pid 4242 (not visible from here) 4096 MiB"]),
    ("memory with no process: the holding model's reason, whole", [LEAKED], [f"GPU 6: {LEAK}"]),
    ("every holder, none cut", [MANY], ["GPU 5: " + ", ".join(f"pid {100 + i} python3 1000 MiB" for i in range(5))]),
    ("busy, nothing said", [gpu(0, idle=False, reasons=[], blockers=[])], ["GPU 0: busy"]),
    ("no GPUs", None, []),
    ("missing fields", [{"idle": False, "blockers": [9], "processes": [{"pid": 9}]}], ["GPU ?: pid 9 ?"]),
]


@pytest.mark.parametrize("name, gpus, expected", BLOCKERS, ids=[c[0] for c in BLOCKERS])
def test_gpu_blockers(name, gpus, expected):
    assert gpu_blockers(gpus) == expected


def test_gpu_report_rows_name_the_container_host():
    rows = gpu_report_rows([IDLE, SGLANG, NO_MEMORY], "pve", containers={129: "gpu-ct", "130": "other"})
    assert rows[0] == {"host": "pve", "seen_from": "pve", "index": 0, "name": "NVIDIA H200", "uuid": "GPU-0000",
                       "used_mib": 0, "total_mib": 143771, "free_mib": None, "idle": True, "fits": None, "need_mib": None,
                       "health": "ok", "healthy": True, "checks": [], "blocking_checks": [], "unsupported": [],
                       "holders": [], "holders_text": "", "container_hosts": [], "busy_reasons": []}
    assert rows[1]["holders"] == [8812] and rows[1]["container_hosts"] == ["gpu-ct"]
    assert rows[1]["holders_text"] == "pid 8812 python3 (CT 129 gpu-ct, sglang.service, 130048 MiB)"
    assert rows[1]["busy_reasons"] == ["used by pid 8812"] and rows[1]["idle"] is False
    assert (rows[2]["used_mib"], rows[2]["total_mib"], rows[2]["name"], rows[2]["index"]) == (None, None, None, None)


@pytest.mark.parametrize("seen_from, containers, text", [
    ("pve", None, "pid 8812 python3 (CT 129, sglang.service, 130048 MiB)"),
    (None, {"130": "other"}, "pid 8812 python3 (CT 129, sglang.service, 130048 MiB)"),
])
def test_gpu_report_rows_seen_from_and_unknown_containers(seen_from, containers, text):
    row = gpu_report_rows([SGLANG], "gpu-ct", seen_from=seen_from, containers=containers)[0]
    assert row["seen_from"] == (seen_from or "gpu-ct") and row["holders_text"] == text and row["container_hosts"] == []


ROWS = gpu_report_rows([IDLE, SGLANG, LEAKED], "pve", containers={129: "gpu-ct"}) + gpu_report_rows([NO_MEMORY], "gpu-host-2")


def test_gpu_report_table():
    assert gpu_report_table(ROWS) == [
        "host        GPU  name         used / total MiB  state  fits  health  holders",
        "pve         0    NVIDIA H200       0 / 143771   idle   -     ok      -",
        "pve         3    NVIDIA H200  130048 / 143771   busy   -     ok      pid 8812 python3 (CT 129 gpu-ct, sglang.service, 130048 MiB)",
        "pve         6    NVIDIA H200    1200 / 143771   busy   -     ok      1200 MiB used by processes not visible from this PID"
        " namespace...",
        "gpu-host-2  ?    ?                 ? / ?        idle   -     ok      -",
    ]


@pytest.mark.parametrize("rows, lines", [
    ([], ["host  GPU  name  used / total MiB  state  fits  health  holders"]),
    (None, ["host  GPU  name  used / total MiB  state  fits  health  holders"]),
])
def test_gpu_report_table_empty(rows, lines):
    assert gpu_report_table(rows) == lines


def test_gpu_report_markdown():
    md = gpu_report_markdown(ROWS + [dict(ROWS[0], name="a|b", idle=None, health=None)])
    assert md.splitlines() == [
        "# GPU report",
        "",
        "| host | GPU | name | used MiB | free MiB | total MiB | idle | fits | health | holders |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        "| pve | 0 | NVIDIA H200 | 0 | ? | 143771 | yes | - | ok | - |",
        "| pve | 3 | NVIDIA H200 | 130048 | ? | 143771 | no | - | ok | pid 8812 python3 (CT 129 gpu-ct, sglang.service, 130048 MiB) |",
        f"| pve | 6 | NVIDIA H200 | 1200 | ? | 143771 | no | - | ok | {LEAK} |",
        "| gpu-host-2 | ? | ? | ? | ? | ? | yes | - | ok | - |",
        "| pve | 0 | a\\|b | 0 | ? | 143771 | ? | - | ? | - |",
    ]
    assert md.endswith("|\n")


def test_the_filters():
    """gpu_table is a filter of this file; the others are exported here or by a file of their own, same function."""
    funcs = {"gpu_table": gpu_table, "gpu_blockers": gpu_blockers, "gpu_report_rows": gpu_report_rows,
             "gpu_report_table": gpu_report_table, "gpu_report_markdown": gpu_report_markdown}
    exported = FilterModule().filters()
    assert exported["gpu_table"] is gpu_table
    assert all(funcs.get(name) is func for name, func in exported.items())
