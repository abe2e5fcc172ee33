# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Memory still being freed told apart from a leak, and the ready verdict's diagnosis (_wait, _holding)."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _wait
from ansible_collections.gpuops.gpu.plugins.module_utils._holding import verdict

GIB = 1024

# (id, samples [t, used MiB, holders], now, kind, extra checks)
TREND_CASES = [
    ("a holder: nothing to say", [[0.0, 81920, 1]], 40.0, None, {}),
    ("memory at baseline", [[0.0, 81920, 1], [1.0, 0, 0]], 40.0, None, {}),
    ("falling: being freed", [[0.0, 81920, 1], [1.0, 81920, 0], [2.0, 73728, 0], [3.0, 65536, 0], [4.0, 57344, 0]],
     4.5, "draining", {"rate": 8192.0, "left": (57344 - 64) / 8192.0}),
    ("falling long ago, then still for leak_after: a leak", [[0.0, 81920, 0], [1.0, 40960, 0]], 31.0, "leaked",
     {"still": 30.0}),
    ("held, not moving yet, within leak_after", [[0.0, 81920, 1], [1.0, 81920, 0]], 10.0, "unchanged", {"still": 9.0}),
    ("held from the start, never moving", [[0.0, 1200, 0]], 30.0, "leaked", {"still": 30.0}),
    ("only the last 5 s count for the rate", [[0.0, 100000, 0], [1.0, 90000, 0], [20.0, 89000, 0], [21.0, 88000, 0]],
     21.5, "draining", {"rate": 1000.0}),
]


@pytest.mark.parametrize("name, series, now, kind, extra", TREND_CASES, ids=[c[0] for c in TREND_CASES])
def test_memory_trend(name, series, now, kind, extra):
    trend = _wait.memory_trend(series, now, leak_after=30.0, max_memory_used_mib=64)
    assert (trend or {}).get("kind") == kind
    for key, value in extra.items():
        assert trend[key] == pytest.approx(value), key


def make_gpu(index, used=0, procs=(), **fields):
    g = {"index": index, "memory": {"used": used, "total": 143771, "free": 143771 - used,
                                    "used_includes_reserved": False},
         "utilization": {"gpu": 0}, "health": {"status": "ok", "detail": None},
         "processes": [{"pid": p, "name": "python3", "visible": True} for p in procs], "holders": []}
    g.update(fields)
    return g


def judged(g, **kw):
    from ansible_collections.gpuops.gpu.plugins.module_utils import _health
    g["health"]["checks"] = _health.failed_checks(g, kw.get("health_checks", _health.DEFAULT_CHECKS))
    g["idle"], g["busy_reasons"], blockers, _lingering = verdict(
        g, 64, in_container=False, health_checks=kw.get("health_checks", _health.DEFAULT_CHECKS),
        min_free_mib=kw.get("min_free_mib"), min_free_pct=kw.get("min_free_pct"), backend="nvml")
    g["blockers"] = [b["pid"] for b in blockers]
    return g


def test_draining_gpus_are_named_once_with_the_slowest_rate():
    gpus = [judged(make_gpu(i, used=60 * GIB)) for i in (0, 1)]
    memory = {"0": {"kind": "draining", "used": 60 * GIB, "rate": 4096.0, "left": 15.0},
              "1": {"kind": "draining", "used": 60 * GIB, "rate": 2048.0, "left": 30.0}}
    text = _wait.diagnosis(gpus, 64, memory)
    assert text == ("GPUs 0, 1: memory still being freed (61440 MiB in use on each, 2.0 GiB/s, about 30 s left at this"
                    " rate) with no process holding them: raise timeout (gpu_idle_timeout)")


def test_leaked_gpus_are_named_once_with_each_reset():
    gpus = [judged(make_gpu(i, used=1200)) for i in (2, 5)]
    memory = {"2": {"kind": "leaked", "used": 1200, "still": 31.0}, "5": {"kind": "leaked", "used": 1200, "still": 40.0}}
    text = _wait.diagnosis(gpus, 64, memory, leak_after=30)
    assert text.startswith("GPUs 2, 5: memory leaked (1200 MiB on GPU 2, 1200 MiB on GPU 5, not freed for 31 s")
    assert "nvidia-smi -r -i 2, nvidia-smi -r -i 5" in text and "leak_after 30 s" in text
    assert text.count("memory leaked") == 1


def test_both_causes_and_a_holder_in_one_diagnosis():
    gpus = [judged(make_gpu(0, used=60 * GIB)), judged(make_gpu(1, used=1200)), judged(make_gpu(2, used=4096, procs=[77]))]
    gpus[2]["blockers"] = [77]
    memory = {"0": {"kind": "draining", "used": 60 * GIB, "rate": 4096.0, "left": 15.0},
              "1": {"kind": "leaked", "used": 1200, "still": 31.0}, "2": None}
    parts = _wait.diagnosis(gpus, 64, memory).split("; ")
    assert parts[0] == "GPU 2 is used by pid 77 (python3)"
    assert parts[1].startswith("GPU 0: memory still being freed (61440 MiB in use, 4.0 GiB/s, about 15 s left")
    assert parts[2].startswith("GPU 1: memory leaked (1200 MiB on GPU 1")


def test_unchanged_memory_keeps_the_old_sentence_and_says_how_long():
    gpus = [judged(make_gpu(2, used=1200))]
    text = _wait.diagnosis(gpus, 64, {"2": {"kind": "unchanged", "used": 1200, "still": 3.0}})
    assert text.startswith("GPU 2: 1200 MiB used and no process holds it: the driver is still freeing")
    assert text.endswith("unchanged for 3 s with no process (a leak once it stays so for leak_after, 30 s): raise timeout"
                         " (gpu_idle_timeout) to give the driver time to free it")
    # without samples (check mode) it is what it always was
    assert _wait.diagnosis(gpus, 64) == "GPU 2: " + gpus[0]["busy_reasons"][0]


def test_health_failures_are_named_once_per_check_with_the_gpus():
    fabric = {"state": "In Progress", "status": None}
    gpus = [judged(make_gpu(i, fabric=fabric)) for i in range(3)]
    gpus.append(judged(make_gpu(3, remapped_rows={"corrected": 0, "uncorrected": 1, "pending": True, "failure": False})))
    assert not any(g["idle"] for g in gpus)
    parts = _wait.diagnosis(gpus, 64).split("; ")
    assert parts[0].startswith("GPUs 0, 1, 2: health check fabric failed: its fabric state is In Progress")
    assert "systemctl start nvidia-fabricmanager" in parts[0]
    assert parts[1].startswith("GPU 3: health check row_remap_pending failed: a row remap is pending")
    assert parts[1].endswith("(nvidia-smi -r -i 3) to apply the remap")


def test_a_check_not_asked_for_is_reported_but_does_not_block():
    g = judged(make_gpu(0, ecc_uncorrected_volatile=5), health_checks=["fabric"])
    assert g["idle"] and g["health"]["checks"][0]["check"] == "ecc_uncorrectable"
    assert g["health"]["checks"][0]["blocking"] is False


@pytest.mark.parametrize("used, pct, mib, idle", [
    (10000, 90, None, False),   # 133771 free < 129394? no: fits -> but used 10000 > 64 without process: busy anyway
    (0, 90, None, True),
    (0, None, 150000, False),   # more than the GPU has
    (0, 100, None, True),       # all of it is free
])
def test_fit_is_part_of_ready(used, pct, mib, idle):
    g = judged(make_gpu(0, used=used), min_free_pct=pct, min_free_mib=mib)
    assert g["idle"] is idle, g["busy_reasons"]
    if mib == 150000:
        assert any("less than the 150000 MiB the next server needs" in r for r in g["busy_reasons"])


def test_from_a_container_unmoving_memory_is_not_called_a_leak():
    g = make_gpu(4, used=1200)
    g["health"]["checks"] = []
    g["idle"], g["busy_reasons"], _b, _l = verdict(g, 64, in_container=True)
    g["blockers"] = []
    text = _wait.diagnosis([g], 64, {"4": {"kind": "leaked", "used": 1200, "still": 40.0}})
    assert "memory leaked" not in text and "not visible from this PID namespace" in text and "unchanged for 40 s" in text
