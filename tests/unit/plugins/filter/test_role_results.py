# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The outcome filters of the roles (gpu_idle_result, proxmox_fence_result), table-driven over
module results shaped as the modules return them (registered with failed_when: false)."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.filter.gpu_idle_result import gpu_idle_result
from ansible_collections.gpuops.gpu.plugins.filter.proxmox_fence_result import proxmox_fence_result


def gpu(index, used=0, idle=True, procs=(), reasons=()):
    return {"index": index, "name": "NVIDIA H200", "uuid": f"GPU-{index}", "memory": {"used": used, "total": 143771},
            "idle": idle, "busy_reasons": list(reasons), "blockers": [p["pid"] for p in procs],
            "processes": list(procs), "holders": []}


SERVER = {"pid": 8812, "name": "python3", "used_mib": 130048, "container": {"kind": "lxc", "id": 129},
          "unit": "sglang.service", "visible": True, "evidence": "context"}
BUSY = gpu(0, 130048, False, [SERVER])
FREE = gpu(0)
SKIPPED = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}
WAIT_OK = {"changed": False, "ready": True, "msg": "1 GPU(s) idle after 1.61 s", "elapsed": 1.61, "idle_gpus": [0],
           "gpus": [FREE], "gpus_before": [gpu(0, 130048, False, reasons=["130048 MiB used"])]}
WAIT_TIMEOUT = {"changed": False, "failed_when_result": False, "elapsed": 300.0, "idle_gpus": [],
                "msg": "timed out after 300 s: GPU 0 is used by pid 8812 (python3) in CT 129",
                "gpus": [BUSY], "gpus_before": [BUSY]}
WAIT_CHECK_BUSY = {"changed": False, "would_wait": True, "elapsed": 0.0, "idle_gpus": [], "gpus": [BUSY],
                   "gpus_before": [BUSY], "msg": "GPU 0 is used by pid 8812"}
WAIT_COUNT = {"changed": False, "failed_when_result": False,
              "msg": "expected 8 GPUs, the driver shows 7: a GPU fell off the bus (check dmesg for Xid 79), or ..."}
RELEASE_OK = {"changed": True, "released": [{"pid": 8812}, {"pid": 8813}], "respawned": [], "gpus_before": [BUSY],
              "gpus": [gpu(0, 130048, False, reasons=["130048 MiB used"])],
              "stopped_units": [{"unit": "sglang.service", "container": 129}]}
RELEASE_REFUSED = {"changed": False, "failed_when_result": False, "released": [], "respawned": [],
                   "msg": "the targets live in 2 places: CT 129, CT 130", "gpus_before": [BUSY]}
FENCE = {"released": [{"pid": 7001}], "respawned": [], "services_stopped": [{"vmid": 129, "unit": "sglang"}],
         "stopped_units": [], "shut_down": [], "gpus_before": [BUSY]}


@pytest.mark.parametrize("wait, release, fence, check_mode, expect", [
    pytest.param(WAIT_OK, SKIPPED, None, False,
                 {"ready": True, "error": None, "released": [], "gpus": 1, "idle_gpus": [0], "check_mode": False,
                  "blockers": [], "msg": "1 GPU(s) idle after 1.61 s"}, id="wait-only-ready"),
    pytest.param(WAIT_OK, RELEASE_OK, None, False,
                 {"ready": True, "error": None, "released": [8812, 8813], "stopped_units": ["sglang.service (CT 129)"]},
                 id="release-then-wait"),
    pytest.param(WAIT_OK, SKIPPED, FENCE, False,
                 {"ready": True, "released": [7001], "stopped_units": ["sglang (CT 129)"]}, id="fence-carried"),
    pytest.param(WAIT_TIMEOUT, SKIPPED, None, False,
                 {"ready": False, "error": WAIT_TIMEOUT["msg"], "idle_gpus": [], "gpus": 1,
                  "blockers": ["GPU 0: pid 8812 python3 (CT 129, sglang.service) 130048 MiB"]}, id="timeout"),
    pytest.param(WAIT_CHECK_BUSY, SKIPPED, None, False,
                 {"ready": False, "error": None, "check_mode": True, "would_wait": True}, id="check-mode-busy"),
    pytest.param(dict(WAIT_CHECK_BUSY, would_wait=False, gpus=[FREE]), SKIPPED, None, True,
                 {"ready": True, "error": None, "check_mode": True, "would_wait": False}, id="check-mode-idle"),
    pytest.param(WAIT_COUNT, SKIPPED, None, False,
                 {"ready": False, "error": WAIT_COUNT["msg"], "gpus": 0, "blockers": []}, id="count-mismatch"),
    pytest.param(SKIPPED, RELEASE_REFUSED, None, False,
                 {"ready": False, "error": RELEASE_REFUSED["msg"], "gpus": 1}, id="release-refused-no-wait"),
])
def test_gpu_idle_result(wait, release, fence, check_mode, expect):
    out = gpu_idle_result(wait, release=release, fence=fence, host="gpu-ct", seen_from="pve", check_mode=check_mode)
    assert {k: out[k] for k in expect} == expect
    assert out["summary"]["ready"] == out["ready"]
    assert out["summary"]["released"] == out["released"]
    assert out["table"] and "gpu-ct" in out["table"][0]


def test_gpu_idle_result_table_shows_before_and_after():
    out = gpu_idle_result(WAIT_OK, release=RELEASE_OK, host="h1")
    assert len(out["table"]) == 2
    line = out["table"][1]
    assert "130048 -> 0" in line and "pid 8812" in line and "idle" in line


def test_gpu_idle_result_seen_from_only_when_another_host():
    assert "seen from" not in gpu_idle_result(WAIT_OK, host="h1", seen_from="h1")["table"][0]
    assert "seen from pve" in gpu_idle_result(WAIT_OK, host="gpu-ct", seen_from="pve")["table"][0]


CTS = {"changed": True, "check_mode": False, "running": [129], "skipped_containers": [{"vmid": 131, "reason": "stopped"}],
       "containers": [{"vmid": 129, "gpus": [0, 1, 2, 3], "running": True}, {"vmid": 131, "gpus": [4], "running": False}],
       "services_stopped": [{"vmid": 129, "unit": "sglang", "state_before": "active", "rc": 0, "seconds": 0.4}],
       "shut_down": []}
CTS_PCT_FAILED = {"changed": False, "failed_when_result": False, "msg": "pct list failed (rc 255): ipcc_send_rec failed"}
CTS_ALL_GPUS = dict(CTS, containers=[{"vmid": 129, "gpus": None, "running": True}], services_stopped=[], changed=False)
CTS_UNKNOWN = {"changed": False, "failed_when_result": False,
               "msg": "containers: no container 131 on this node (pct list shows 129). Nothing was stopped."}


@pytest.mark.parametrize("containers, release, method, expect", [
    pytest.param(CTS, RELEASE_OK, "processes",
                 {"containers": [129], "container_gpus": [0, 1, 2, 3], "changed": True, "error": None,
                  "services_stopped": [{"vmid": 129, "unit": "sglang"}], "gpus_before": [BUSY]}, id="processes"),
    pytest.param(CTS_ALL_GPUS, SKIPPED, "processes",
                 {"container_gpus": None, "changed": False, "released": []}, id="every-gpu"),
    pytest.param(dict(CTS, shut_down=[129]), SKIPPED, "shutdown",
                 {"shut_down": [129], "changed": True}, id="shutdown"),
    pytest.param(CTS_UNKNOWN, SKIPPED, "processes",
                 {"containers": [], "changed": False,
                  "error": "proxmox_fence_containers: no container 131 on this node (pct list shows 129). Nothing was stopped."},
                 id="unknown-vmid"),
    pytest.param(CTS_PCT_FAILED, SKIPPED, "processes",
                 {"error": "proxmox_gpu_containers: pct list failed (rc 255): ipcc_send_rec failed"}, id="pct-failed"),
    pytest.param(CTS, RELEASE_REFUSED, "processes",
                 {"error": "gpu_release: " + RELEASE_REFUSED["msg"]}, id="release-failed"),
    pytest.param(dict(CTS, check_mode=True), dict(RELEASE_OK, changed=True), "processes",
                 {"check_mode": True, "changed": True}, id="check-mode"),
])
def test_proxmox_fence_result(containers, release, method, expect):
    out = proxmox_fence_result(containers, release=release, method=method)
    assert {k: out[k] for k in expect} == expect
    assert out["stats"]["changed"] == out["changed"]
    assert out["stats"]["error"] == out["error"]
    if out["error"]:
        assert out["error"] not in out["summary"] and out["summary"].endswith(f"failed (the error follows); changed={out['changed']}")
    if out["check_mode"]:
        assert out["summary"].startswith("Check mode, nothing was stopped")


def test_proxmox_fence_result_summary_names_what_was_stopped():
    out = proxmox_fence_result(CTS, release=RELEASE_OK)
    assert out["summary"] == ("fenced CT 129 (processes); stopped sglang in CT 129; stopped sglang.service in CT 129;"
                              " released 2 process(es) (pid 8812, 8813); skipped CT 131 (stopped); changed=True")
    assert out["stats"]["released"] == [8812, 8813]
