# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The outcome filters of the roles (gpu_idle_result, proxmox_fence_result), table-driven over
module results shaped as the modules return them (registered with failed_when: false)."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.plugin_utils._results import gpu_idle_result
from ansible_collections.gpuops.gpu.plugins.plugin_utils._results import proxmox_fence_result


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
              "gpus": [gpu(0, 130048, False, reasons=["130048 MiB used"])], "survivors": [], "protected": [],
              "skipped_processes": [], "elapsed": 2.1, "stopped_units": [{"unit": "sglang.service", "container": 129}]}
RELEASE_NOTHING = dict(RELEASE_OK, changed=False, released=[], stopped_units=[], gpus=[FREE], gpus_before=[FREE])
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
    pytest.param(CTS_ALL_GPUS, RELEASE_NOTHING, "processes",
                 {"container_gpus": None, "changed": False, "released": [], "error": None}, id="every-gpu"),
    # A config that passes every GPU of a node shared with another GPU container: the wait covers what its workload
    # held (wait_gpus, gpus_from processes), not the config's GPUs
    pytest.param(dict(CTS, containers=[{"vmid": 129, "gpus": list(range(8)), "wait_gpus": [0, 1, 2, 3], "running": True,
                                        "gpus_from": "processes"}]), RELEASE_OK, "processes",
                 {"container_gpus": [0, 1, 2, 3], "gpus": {129: list(range(8))}, "gpus_from": {129: "processes"}},
                 id="every-gpu-config-fenced-by-processes"),
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


@pytest.mark.parametrize("containers, expect", [
    # state released: the release is the module result's own
    pytest.param(dict(CTS, release=RELEASE_OK), {"error": None, "changed": True, "gpus_before": [BUSY]}, id="released"),
    pytest.param(dict(CTS, release=None), {"failure": {"module": "gpu_release", "kind": "missing"}}, id="no-release"),
    # A named container that is stopped: the wait covers the GPUs of its config
    pytest.param(dict(CTS, running=[], gpus=[4], services_stopped=[], changed=False),
                 {"container_gpus": [4], "error": None}, id="stopped-named"),
    # The fence failed in its release: the module's failure, with its kind
    pytest.param({"changed": True, "failed": True, "error": "release_incomplete", "msg": "1 process(es) survived SIGKILL",
                  "release": RELEASE_OK}, {"failure": {"module": "proxmox_gpu_containers", "kind": "release_incomplete"},
                                           "error": "proxmox_gpu_containers: 1 process(es) survived SIGKILL"}, id="failed"),
])
def test_proxmox_fence_result_of_one_module_run(containers, expect):
    out = proxmox_fence_result(containers)
    assert {k: out[k] for k in expect} == expect


def test_proxmox_fence_result_summary_names_what_was_stopped():
    out = proxmox_fence_result(CTS, release=RELEASE_OK)
    assert out["summary"] == ("fenced CT 129 (processes); stopped sglang in CT 129; stopped sglang.service in CT 129;"
                              " released 2 process(es) (pid 8812, 8813); skipped CT 131 (stopped); changed=True")
    assert out["stats"]["released"] == [8812, 8813]


def test_a_fence_that_waited_for_another_run_says_so():
    # Two runs on one container: the second waited for the first's locks and found nothing left; its summary says why
    # "released 0 process(es)" is not "nothing was there".
    waited = {"seconds": 3.1, "for": "CT 129", "pid": 4242, "module": "proxmox_gpu_containers",
              "text": "waited 3.1 s for another run's fence of CT 129 (pid 4242, proxmox_gpu_containers), which ran"
                      " first: what it stopped and released is in its own result; this run found what it left"}
    out = proxmox_fence_result(dict(CTS, services_stopped=[], waited_for_lock=waited),
                               release=dict(RELEASE_OK, released=[], stopped_units=[], changed=False))
    assert out["summary"].startswith(waited["text"] + "; fenced CT 129 (processes); released 0 process(es)"), out["summary"]


# --- "ready" only when proved: every kind of non-success result of each module the roles call ------------

CRASH_EXCEPTION = {"changed": False, "failed": False, "failed_when_result": False,
                   "failed_when_suppressed_exception": "(traceback unavailable)"}
CRASH_SEGV = dict(CRASH_EXCEPTION, rc=139, module_stdout="", module_stderr="Segmentation fault\n",
                  msg="Module result deserialization failed: No start of json char found")
UNREACHABLE = {"changed": False, "unreachable": True, "msg": "Task failed: Failed to connect to the host via ssh"}
WAIT_SLICE_CRASH = dict(CRASH_SEGV, gpus_before=[BUSY])  # a later slice died: the action plugin keeps the first look


@pytest.mark.parametrize("wait, release, release_required, failure, said", [
    pytest.param(CRASH_EXCEPTION, SKIPPED, False, ("gpu_wait_idle", "crashed"),
                 "gpu_wait_idle crashed on pve with an unhandled error", id="wait-exception"),
    pytest.param(CRASH_SEGV, SKIPPED, False, ("gpu_wait_idle", "crashed"), "killed by SIGSEGV (rc 139)", id="wait-segv"),
    pytest.param(WAIT_SLICE_CRASH, SKIPPED, False, ("gpu_wait_idle", "crashed"), "SIGSEGV", id="wait-slice-crash"),
    pytest.param(UNREACHABLE, SKIPPED, False, ("gpu_wait_idle", "unreachable"), "could not be reached",
                 id="wait-unreachable"),
    pytest.param(None, None, None, ("gpu_wait_idle", "missing"), "gpu_wait_idle gave no result", id="wait-missing"),
    pytest.param(SKIPPED, RELEASE_OK, True, ("gpu_wait_idle", "skipped"), "gpu_wait_idle was skipped", id="wait-skipped"),
    pytest.param({"changed": False, "msg": "", "gpus": [FREE]}, SKIPPED, False, ("gpu_wait_idle", "incomplete"),
                 "without the keys a success has", id="wait-incomplete"),
    pytest.param(dict(WAIT_OK, gpus=[BUSY], idle_gpus=[]), SKIPPED, False, ("gpu_wait_idle", "inconsistent"),
                 "its own result shows GPU 0 not idle", id="wait-ready-but-busy"),
    pytest.param(SKIPPED, CRASH_EXCEPTION, True, ("gpu_release", "crashed"), "gpu_release crashed on pve",
                 id="release-exception"),
    pytest.param(SKIPPED, CRASH_SEGV, True, ("gpu_release", "crashed"), "SIGSEGV", id="release-segv"),
    pytest.param(WAIT_OK, SKIPPED, True, ("gpu_release", "skipped"), "gpu_release was skipped", id="release-skipped"),
    pytest.param(WAIT_OK, None, True, ("gpu_release", "missing"), "gpu_release gave no result", id="release-missing"),
    pytest.param(SKIPPED, dict(RELEASE_REFUSED, error="scope"), True, ("gpu_release", "scope"), RELEASE_REFUSED["msg"],
                 id="release-error-kind"),
    pytest.param(WAIT_OK, dict(RELEASE_OK, survivors=None), True, ("gpu_release", "incomplete"), "no survivors",
                 id="release-incomplete"),
])
def test_gpu_idle_result_is_ready_only_when_proved(wait, release, release_required, failure, said):
    out = gpu_idle_result(wait, release=release, host="gpu-ct", seen_from="pve", release_required=release_required)
    assert out["ready"] is False
    assert out["failure"] == {"module": failure[0], "kind": failure[1]}
    assert said in out["error"], out["error"]
    assert out["msg"] == out["error"]
    assert out["summary"]["ready"] is False and out["summary"]["error"] == out["error"]
    assert out["summary"]["failure"] == out["failure"]


def test_gpu_idle_result_blockers_come_from_the_last_look_only():
    """A wait that crashed took no last look: the fence's snapshot before the release names processes that
    are gone, so no blocker line is made from it."""
    out = gpu_idle_result(CRASH_SEGV, release=SKIPPED, fence=FENCE, host="gpu-ct")
    assert out["ready"] is False and out["blockers"] == []
    out = gpu_idle_result(WAIT_TIMEOUT, release=SKIPPED, fence=FENCE, host="gpu-ct")
    assert out["blockers"] == ["GPU 0: pid 8812 python3 (CT 129, sglang.service) 130048 MiB"]


def test_gpu_idle_result_a_failed_fence_is_not_ready():
    out = gpu_idle_result(WAIT_OK, fence=dict(FENCE, error="gpu_release: the targets live in 2 places"), host="h")
    assert out["ready"] is False and out["failure"] == {"module": "proxmox_fence", "kind": "fence"}
    assert out["error"] == "the fence before the wait failed: gpu_release: the targets live in 2 places"
    # the fence's own kind, when it says it: a deploy script tells an unreachable node from a busy GPU
    fence = dict(FENCE, error="proxmox_gpu_containers could not run", failure={"module": "x", "kind": "unreachable"})
    out = gpu_idle_result(WAIT_OK, fence=fence, host="h")
    assert out["failure"] == {"module": "proxmox_fence", "kind": "unreachable"}


def test_gpu_idle_result_with_nothing_yet_is_not_ready():
    """The role's first task records this: a host whose role stops half-way stays not ready."""
    out = gpu_idle_result(None, host="gpu-ct", seen_from="pve")
    assert out["ready"] is False and out["failure"] == {"module": "gpu_wait_idle", "kind": "missing"}
    assert out["table"] and out["gpus"] == 0


@pytest.mark.parametrize("containers, release, method, failure, said", [
    pytest.param(CRASH_EXCEPTION, SKIPPED, "processes", ("proxmox_gpu_containers", "crashed"),
                 "proxmox_gpu_containers crashed on pve with an unhandled error", id="containers-exception"),
    pytest.param(CRASH_SEGV, SKIPPED, "processes", ("proxmox_gpu_containers", "crashed"),
                 "proxmox_gpu_containers crashed on pve: killed by SIGSEGV", id="containers-segv"),
    pytest.param(UNREACHABLE, SKIPPED, "processes", ("proxmox_gpu_containers", "unreachable"), "could not be reached",
                 id="node-unreachable"),
    pytest.param(None, None, "processes", ("proxmox_gpu_containers", "missing"), "gave no result", id="containers-missing"),
    pytest.param(CTS, CRASH_EXCEPTION, "processes", ("gpu_release", "crashed"), "gpu_release crashed on pve",
                 id="release-exception"),
    pytest.param(CTS, CRASH_SEGV, "processes", ("gpu_release", "crashed"), "SIGSEGV", id="release-segv"),
    pytest.param(CTS, SKIPPED, "processes", ("gpu_release", "skipped"), "gpu_release was skipped", id="release-skipped"),
    pytest.param(CTS, None, "processes", ("gpu_release", "missing"), "gpu_release gave no result", id="release-missing"),
    pytest.param(CTS, dict(RELEASE_REFUSED, error="scope"), "processes", ("gpu_release", "scope"),
                 "gpu_release: " + RELEASE_REFUSED["msg"], id="release-error-kind"),
    pytest.param(CTS_UNKNOWN, SKIPPED, "processes", ("proxmox_gpu_containers", "failed"),
                 "proxmox_fence_containers: no container 131", id="option-named-by-its-role-variable"),
])
def test_proxmox_fence_result_fails_on_anything_but_a_success(containers, release, method, failure, said):
    out = proxmox_fence_result(containers, release=release, method=method, host="pve")
    assert out["failure"] == {"module": failure[0], "kind": failure[1]}
    assert out["error"] and said in out["error"], out["error"]
    assert out["stats"]["error"] == out["error"] and out["stats"]["failure"] == out["failure"]
    assert out["summary"].endswith(f"failed (the error follows); changed={out['changed']}")


def test_proxmox_fence_result_nothing_running_needs_no_release():
    out = proxmox_fence_result(dict(CTS, running=[], services_stopped=[], changed=False), release=SKIPPED)
    assert out["error"] is None and out["failure"] is None


def test_gpu_idle_result_lists_each_process_once():
    """-v adds each process once (the fence's and the release's), not the results themselves."""
    proc = {"pid": 8812, "start_time": 5, "name": "python3", "cmdline": "python3 -m sglang.launch_server",
            "container": {"kind": "lxc", "id": 129}, "unit": "sglang.service", "gpus": [0, 1],
            "signals": ["SIGTERM"], "seconds": 1.25}
    out = gpu_idle_result(WAIT_OK, release={"released": [proc], "survivors": [], "gpus_before": [], "gpus": []},
                          fence={"released": [proc], "respawned": [dict(proc, pid=9001, signals=[], seconds=None)]})
    assert out["processes"] == [
        "released pid 8812 python3 (CT 129, sglang.service, GPU 0, 1; SIGTERM, gone after 1.25 s): python3 -m sglang.launch_server",
        "RESPAWNED pid 9001 python3 (CT 129, sglang.service, GPU 0, 1): python3 -m sglang.launch_server"]


@pytest.mark.parametrize("holder, fenced, expect", [
    # the server of the fenced container itself: nothing more to say
    (SERVER, [129], None),
    # a job of another container, and one on the node: named as outside the fence, with its command line
    (dict(SERVER, pid=9001, container={"kind": "lxc", "id": 130}, unit=None, cmdline="python3 train.py --token=********"),
     [129], "Pid 9001 python3 (CT 130) holds GPU 0 and is outside the fence (CT 129), so it was not stopped:"
            " python3 train.py --token=********"),
    (dict(SERVER, pid=9002, container=None, unit=None, cmdline="python3 secret-job.py"),
     [129], "Pid 9002 python3 holds GPU 0 and is outside the fence (CT 129), so it was not stopped: python3 secret-job.py"
            " - it runs on the node itself, in no container: stop it on the node (`kill 9002`), before the deploy"),
    # no fence (the role alone): no fence to be outside of
    (dict(SERVER, pid=9002, container=None), [], None),
])
def test_a_holder_outside_the_fence_is_named_as_such(holder, fenced, expect):
    busy = gpu(0, 2048, False, [holder])
    wait = dict(WAIT_TIMEOUT, gpus=[busy], msg="timed out after 300 s: GPU 0 is used by pid 9001 (python3)")
    out = gpu_idle_result(wait, fence={"containers": fenced}, host="gpu-ct")
    assert out["error"].startswith("timed out after 300 s: GPU 0 is used by pid 9001 (python3)")
    if expect is None:
        assert "outside the fence" not in out["error"]
    else:
        assert expect in out["error"] and out["error"].endswith("before the deploy."), out["error"]
        assert out["error"].count("outside the fence") == 1
        # a container's process: fence its container too; the node's own: advice for the node (issue 33, item 4)
        assert ("fence its container too" in out["error"]) is (holder.get("container") is not None), out["error"]


def test_the_holders_of_every_look_are_read_once_each():
    """The release's and the wait's holder_processes name the same pids (a lingering holder seen by both)."""
    same = {"4242": {"pid": 4242, "name": "python3", "gpus": [0]}}
    release = {"released": [], "survivors": [], "gpus_before": [BUSY], "gpus": [BUSY], "holder_processes": same}
    out = gpu_idle_result(dict(WAIT_OK, holder_processes=dict(same)), release=release,
                          fence={"holder_processes": dict(same)})
    assert out["ready"] is True and out["error"] is None
