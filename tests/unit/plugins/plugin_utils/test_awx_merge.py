# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""AWX job slicing: each slice of a sliced job template is a job of its own, and the workflow that runs them hands
the next node their artifacts merged with a shallow dict.update in the order the slices finished
(awx/main/models/workflow.py, WorkflowJob.get_effective_artifacts: ``.order_by('finished', 'id')`` then
``artifacts.update(...)``). This plays that merge over the artifacts of two slices, one of them not ready."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.plugin_utils._results import artifacts, host_answer

READY = {"ready": True, "error": None, "failure": None, "blockers": [], "elapsed": 3.0,
         "summary": {"ready": True, "elapsed": 3.0}}
BUSY = {"ready": False, "error": "timed out after 300 s: GPU 3 is used by pid 8812 (python3)",
        "failure": {"module": "gpu_wait_idle", "kind": "wait_timeout"}, "blockers": ["GPU 3: pid 8812 python3"],
        "elapsed": 300.0, "summary": {"ready": False, "elapsed": 300.0}}


def slice_artifacts(job_id, records):
    """What one slice's job publishes (its hosts' records), as the action plugin computes it."""
    return artifacts({h: host_answer(r) for h, r in records.items()}, {h: r["summary"] for h, r in records.items()},
                     {}, job_id=job_id)


def awx_merge(*finished_in_order):
    merged = {}
    for job_artifacts in finished_in_order:
        merged.update(job_artifacts)
    return merged


def ready_over_slices(merged):
    """What a workflow branches on: every slice's own key says ready (and there is at least one)."""
    jobs = [v for k, v in merged.items() if k.startswith("gpu_idle_job_")]
    return bool(jobs) and all(j["ready"] is True for j in jobs)


@pytest.mark.parametrize("order", ["busy slice first", "busy slice last"])
def test_a_slice_that_is_not_ready_stays_visible_after_the_merge(order):
    busy = slice_artifacts(101, {"gpu-a": READY, "gpu-b": BUSY})
    ready = slice_artifacts(102, {"gpu-c": READY, "gpu-d": READY})
    merged = awx_merge(busy, ready) if order == "busy slice first" else awx_merge(ready, busy)
    # the run-wide keys are the last finished slice's only (what the merge does to any artifact)
    assert merged["gpu_idle_ready"] is (order == "busy slice first")
    assert set(merged["gpu_idle_summary"]) == ({"gpu-c", "gpu-d"} if order == "busy slice first" else {"gpu-a", "gpu-b"})
    # each slice's own key survives it, whatever finished last
    assert merged["gpu_idle_job_101"] == {"ready": False, "hosts": 2, "not_ready": {"gpu-b": BUSY["error"]}}
    assert merged["gpu_idle_job_102"] == {"ready": True, "hosts": 2, "not_ready": {}}
    assert ready_over_slices(merged) is False


def test_every_slice_ready_is_ready_over_the_slices():
    merged = awx_merge(slice_artifacts(201, {"gpu-a": READY}), slice_artifacts(202, {"gpu-b": READY}))
    assert merged["gpu_idle_ready"] is True and ready_over_slices(merged) is True


def test_a_host_without_a_result_is_not_ready_in_its_slice():
    answers = {"gpu-a": host_answer(READY), "gpu-b": host_answer(None)}
    out = artifacts(answers, {"gpu-a": READY["summary"]}, {}, job_id=7)
    assert out["gpu_idle_ready"] is False
    assert out["gpu_idle_job_7"]["not_ready"]["gpu-b"].startswith("no result")


def test_without_awx_there_is_no_per_job_key():
    out = artifacts({"gpu-a": host_answer(READY)}, {"gpu-a": READY["summary"]}, {})
    assert not [k for k in out if k.startswith("gpu_idle_job_")]
