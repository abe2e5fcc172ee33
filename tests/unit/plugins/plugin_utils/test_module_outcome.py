# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""module_outcome, table-driven: every kind of result a registered module task can leave, for each
module the roles and playbooks call. The shapes are the ones ansible-core gives under
failed_when: false (2.21, and 2.17/2.18 where they differ), as tests/functional/test_ready_proved.py
sees them from real crashes."""

from __future__ import annotations

import pytest

from ansible.errors import AnsibleError

from ansible_collections.gpuops.gpu.plugins.plugin_utils._results import module_outcome


def gpu(index, idle=True):
    return {"index": index, "uuid": f"GPU-{index}", "memory": {"used": 0 if idle else 4096, "total": 143771},
            "idle": idle, "processes": [], "holders": [], "blockers": []}


# --- what a success of each module has (plugins/modules/*.py RETURN) ---------------------------------
WAIT_OK = {"changed": False, "ready": True, "msg": "2 GPU(s) idle after 1.52 s", "elapsed": 1.52, "polls": 4,
           "idle_gpus": [0, 1], "gpus": [gpu(0), gpu(1)], "gpus_before": [gpu(0, False), gpu(1)], "samples": {},
           "confirmation": None}
WAIT_CHECK = {"changed": False, "would_wait": True, "elapsed": 0.0, "polls": 1, "idle_gpus": [1],
              "gpus": [gpu(0, False), gpu(1)], "gpus_before": [gpu(0, False), gpu(1)], "samples": {},
              "msg": "GPU 0 is used by pid 8812"}
RELEASE_OK = {"changed": True, "released": [{"pid": 8812}], "survivors": [], "protected": [], "skipped_processes": [],
              "respawned": [], "stopped_units": [], "gpus_before": [gpu(0, False)], "gpus": [gpu(0)], "elapsed": 1.2}
CTS_OK = {"changed": False, "check_mode": False, "containers": [{"vmid": 129, "gpus": [0], "running": True}],
          "running": [129], "gpus": [0], "skipped_containers": [], "services_stopped": [], "shut_down": []}
FACTS_OK = {"changed": False, "ansible_facts": {"gpu_driver": {"backend": "nvml"}, "gpu_count": 1, "gpu_devices": [gpu(0)]}}
FACTS_NONE = {"changed": False, "msg": "no NVIDIA driver libraries here: ...",  # missing=ignore on a host without GPUs
              "ansible_facts": {"gpu_driver": {"backend": None}, "gpu_count": 0, "gpu_devices": []}}
SUCCESS = {"gpu_wait_idle": WAIT_OK, "gpu_release": RELEASE_OK, "proxmox_gpu_containers": CTS_OK, "gpu_facts": FACTS_OK}
MODULES = sorted(SUCCESS)

# --- what ansible-core registers for the other outcomes (failed_when: false) --------------------------
SUPPRESSED = {"changed": False, "failed": False, "failed_when_result": False}
# An unhandled exception in the module (2.19+): its message lives only in the exception, which failed_when moves
# to failed_when_suppressed_exception - rendered as a traceback when ANSIBLE_DISPLAY_TRACEBACK allows it.
CRASH_EXCEPTION = dict(SUPPRESSED, failed_when_suppressed_exception="(traceback unavailable)")
CRASH_TRACEBACK = dict(SUPPRESSED, failed_when_suppressed_exception=(
    "Traceback (most recent call last):\n  File \"/tmp/ansible_x/_loader.py\", line 62, in _run_module\n"
    "    runpy.run_module(mod_name=module_fqn)\nKeyError: 'memory'\n"))
# The interpreter died: no JSON. 2.19+ (deserialization) and 2.17/2.18 (MODULE FAILURE).
CRASH_SEGV = dict(SUPPRESSED, failed_when_suppressed_exception="(traceback unavailable)", rc=139, module_stdout="",
                  module_stderr="Segmentation fault\n",
                  msg="Module result deserialization failed: No start of json char found")
CRASH_OOM_OLD = {"changed": False, "failed_when_result": False, "rc": 137, "module_stdout": "", "module_stderr": "Killed\n",
                 "msg": "MODULE FAILURE\nSee stdout/stderr for the exact error"}
CRASH_PY_OLD = {"changed": False, "failed_when_result": False, "rc": 1, "module_stdout": "",
                "module_stderr": "Traceback (most recent call last):\n  ...\nZeroDivisionError: division by zero\n",
                "msg": "MODULE FAILURE\nSee stdout/stderr for the exact error",
                "exception": "Traceback (most recent call last):\n  ...\nZeroDivisionError: division by zero\n"}
CRASH_NEGATIVE_RC = dict(CRASH_SEGV, rc=-6, module_stderr="")
CRASH_SECRET = dict(CRASH_SEGV, module_stderr="ValueError: bad line python3 serve.py --api-key sk-abcdefghijklmnopqrstuv\n")
UNREACHABLE = {"changed": False, "unreachable": True, "exception": "(traceback unavailable)",
               "msg": "Task failed: Failed to connect to the host via ssh: ssh: connect to host 10.0.0.9 port 22: No route"}
SKIPPED = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False",
           "false_condition": "gpu_idle_release | bool"}
FAILED_KIND = dict(SUPPRESSED, failed_when_suppressed_exception="(traceback unavailable)",
                   msg="no NVIDIA driver libraries here: ...", error="library_not_found")
FAILED_PLAIN = dict(SUPPRESSED, failed_when_suppressed_exception="(traceback unavailable)",
                    msg="timed out after 300 s: GPU 0 is used by pid 8812 (python3)")
FAILED_KIND_NO_MSG = dict(SUPPRESSED, failed_when_suppressed_exception="(traceback unavailable)", error="gpu_lost")
# Before 2.19 a fail_json under failed_when: false leaves its msg and no other sign.
FAILED_OLD = {"changed": False, "failed_when_result": False, "msg": "the targets live in 2 places: CT 129, CT 130"}


def shape(module, **extra):
    return dict(SUCCESS[module], **extra)


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("result, kind, said", [
    pytest.param(None, "missing", ["gave no result on pve", "did not run"], id="none"),
    pytest.param({}, "missing", ["gave no result on pve"], id="empty"),
    pytest.param("garbage", "missing", ["gave no result"], id="not-a-dict"),
    pytest.param(SKIPPED, "skipped", ["was skipped on pve (gpu_idle_release | bool)"], id="skipped"),
    pytest.param(UNREACHABLE, "unreachable", ["could not be reached", "Failed to connect", "ansible -m ping"],
                 id="unreachable"),
    pytest.param(CRASH_EXCEPTION, "crashed", ["crashed on pve with an unhandled error", "ANSIBLE_DISPLAY_TRACEBACK=error"],
                 id="exception-no-msg"),
    pytest.param(CRASH_TRACEBACK, "crashed", ["crashed on pve with an unhandled error: KeyError: 'memory'"],
                 id="exception-traceback"),
    pytest.param(CRASH_SEGV, "crashed", ["crashed on pve: killed by SIGSEGV (rc 139)", "'Segmentation fault'", "dmesg"],
                 id="sigsegv"),
    pytest.param(CRASH_OOM_OLD, "crashed", ["crashed on pve: killed by SIGKILL (rc 137)", "OOM killer"],
                 id="sigkill-ansible-2.17"),
    pytest.param(CRASH_PY_OLD, "crashed", ["exited with rc 1 and printed no result", "ZeroDivisionError: division by zero"],
                 id="exception-ansible-2.17"),
    pytest.param(CRASH_NEGATIVE_RC, "crashed", ["killed by SIGABRT (rc -6)"], id="negative-rc"),
    pytest.param(FAILED_KIND, "library_not_found", ["no NVIDIA driver libraries here: ..."], id="failed-with-error-kind"),
    pytest.param(FAILED_PLAIN, "failed", ["timed out after 300 s"], id="failed"),
    pytest.param(FAILED_KIND_NO_MSG, "gpu_lost", ["failed on pve (gpu_lost) without saying why"], id="kind-without-msg"),
    pytest.param(FAILED_OLD, "failed", ["the targets live in 2 places"], id="failed-ansible-2.17"),
    pytest.param({"changed": False}, "incomplete", ["without the keys a success has"], id="no-keys"),
])
def test_every_kind_of_non_success(module, result, kind, said):
    out = module_outcome(result, module, host="pve")
    assert out["ok"] is False
    assert out["kind"] == kind
    assert out["module"] == module
    assert all(s in out["reason"] for s in said), out["reason"]
    if kind in ("missing", "skipped", "unreachable", "crashed", "incomplete"):
        assert out["reason"].startswith(module), out["reason"]  # says which module


@pytest.mark.parametrize("module", MODULES)
def test_a_success_is_a_success(module):
    expected = {"ok": True, "skipped": False, "module": module, "kind": None, "reason": None}
    assert module_outcome(SUCCESS[module], module) == expected


@pytest.mark.parametrize("module, result, kind, said", [
    # gpu_wait_idle: ready: true and the GPUs it checked, each idle
    pytest.param("gpu_wait_idle", WAIT_CHECK, None, None, id="wait-check-mode"),
    pytest.param("gpu_wait_idle", shape("gpu_wait_idle", ready=False), "incomplete", "no ready: true", id="wait-ready-false"),
    pytest.param("gpu_wait_idle", shape("gpu_wait_idle", ready="yes"), "incomplete", "no ready: true", id="wait-ready-string"),
    # without ready, a msg is taken for a failure that ansible-core before 2.19 did not mark (a timeout)
    pytest.param("gpu_wait_idle", {k: v for k, v in WAIT_OK.items() if k != "ready"}, "failed", "idle after",
                 id="wait-no-ready"),
    pytest.param("gpu_wait_idle", {k: v for k, v in WAIT_OK.items() if k not in ("ready", "msg")}, "incomplete",
                 "no ready: true", id="wait-no-ready-no-msg"),
    pytest.param("gpu_wait_idle", shape("gpu_wait_idle", gpus=[]), "incomplete", "gpus (the GPUs it checked)",
                 id="wait-checked-no-gpu"),
    pytest.param("gpu_wait_idle", shape("gpu_wait_idle", gpus=None), "incomplete", "gpus", id="wait-gpus-null"),
    pytest.param("gpu_wait_idle", shape("gpu_wait_idle", gpus=[gpu(0), gpu(1, False)], idle_gpus=[0]), "inconsistent",
                 "GPU 1 not idle", id="wait-ready-but-busy"),
    pytest.param("gpu_wait_idle", shape("gpu_wait_idle", idle_gpus=[0]), "inconsistent", "GPU 1 not idle",
                 id="wait-ready-but-not-in-idle-gpus"),
    pytest.param("gpu_wait_idle", dict(WAIT_CHECK, would_wait="no"), "incomplete", "would_wait", id="wait-check-garbled"),
    # partial results: the action plugin adds gpus_before to a later slice's crash
    pytest.param("gpu_wait_idle", dict(CRASH_SEGV, gpus_before=[gpu(0)]), "crashed", "SIGSEGV", id="wait-slice-crash"),
    # gpu_release: released, survivors, gpus; a msg is a failure (its success has none)
    pytest.param("gpu_release", shape("gpu_release", msg="1 process survived SIGKILL"), "failed", "survived",
                 id="release-msg-is-failure"),
    pytest.param("gpu_release", shape("gpu_release", msg="refused", error="scope"), "scope", "refused",
                 id="release-error-kind"),
    pytest.param("gpu_release", {k: v for k, v in RELEASE_OK.items() if k != "gpus"}, "incomplete", "no gpus",
                 id="release-no-after"),
    pytest.param("gpu_release", shape("gpu_release", gpus=None), None, None, id="release-last-look-failed"),
    # check mode: one look, said once in gpus (no gpus_before)
    pytest.param("gpu_release", {k: v for k, v in RELEASE_OK.items() if k != "gpus_before"}, None, None,
                 id="release-check-one-look"),
    # proxmox_gpu_containers
    pytest.param("proxmox_gpu_containers", {k: v for k, v in CTS_OK.items() if k != "check_mode"}, "incomplete",
                 "no check_mode", id="containers-no-check-mode"),
    pytest.param("proxmox_gpu_containers", shape("proxmox_gpu_containers", msg="CT 129: systemctl stop x failed", rc=1),
                 "failed", "systemctl stop", id="containers-failure-with-rc"),
    # gpu_facts: its missing=ignore success has a msg
    pytest.param("gpu_facts", FACTS_NONE, None, None, id="facts-missing-ignore"),
    pytest.param("gpu_facts", {"changed": False, "ansible_facts": {"gpu_count": 1}}, "incomplete",
                 "ansible_facts.gpu_devices", id="facts-partial"),
])
def test_each_module_own_success_keys(module, result, kind, said):
    out = module_outcome(result, module, host="pve")
    assert out["kind"] == kind, out
    assert out["ok"] is (kind is None)
    if said:
        assert said in out["reason"], out["reason"]


def test_a_secret_in_a_crash_output_is_hidden():
    out = module_outcome(CRASH_SECRET, "gpu_wait_idle")
    assert "sk-abcdefghijklmnopqrstuv" not in out["reason"] and "--api-key ****" in out["reason"]


def test_a_long_crash_output_is_cut():
    out = module_outcome(dict(CRASH_SEGV, module_stderr="x" * 5000), "gpu_release")
    assert len(out["reason"]) < 1000


def test_an_unknown_module_is_refused():
    with pytest.raises(AnsibleError, match="module must be one of"):
        module_outcome(WAIT_OK, "gpu_wait")
