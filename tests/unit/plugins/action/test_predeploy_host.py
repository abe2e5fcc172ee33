# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The controller-side rules of the action plugin predeploy_host that need no host: the failure's message bound
(1,800 characters as Ansible prints it, so that its fatal line stays under 2,000;
the whole in detail_file), the tags that leave a step out, the wait's bounds checked before
anything runs (naming the role variable), the roles' argument specs read as its own."""

from __future__ import annotations

import json

import pytest

from ansible import context
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.gpuops.gpu.plugins.action import predeploy_host
from ansible_collections.gpuops.gpu.plugins.module_utils._errors import InvalidOption
from ansible_collections.gpuops.gpu.plugins.plugin_utils import _results

ActionModule = predeploy_host.ActionModule


@pytest.mark.parametrize("holder", ["pid {} python3 (CT 129, worker.service)",
                                    # a command line of quotes and backslashes: two characters each in the fatal line
                                    'pid {} python3 (CT 129): python3 -c "import x; x.run(\\"a\\")"'])
def test_a_long_failure_is_cut_to_fit_its_line_and_kept_whole_in_the_detail_file(tmp_path, monkeypatch, holder):
    monkeypatch.setattr(predeploy_host.C, "DEFAULT_LOCAL_TMP", str(tmp_path / "ansible-local-1"))
    blockers = [f"GPU {i}: " + ", ".join(holder.format(1000 + j) for j in range(60)) for i in range(64)]
    record = ActionModule._bounded({"error": "timed out after 300 s: 64 GPUs are busy", "blockers": blockers}, "gpu-ct")
    whole = _results.message({"error": "timed out after 300 s: 64 GPUs are busy", "blockers": blockers})
    assert len(whole) > 100_000
    # as the fail task prints it (ansible-core's default callback: JSON, not ASCII-escaped), a host name of 140
    fatal = f"fatal: [{'h' * 140}]: FAILED! => " + json.dumps({"changed": False, "msg": record["message"]},
                                                              ensure_ascii=False)
    assert _results.printed_length(record["message"]) <= _results.MESSAGE and len(fatal) <= _results.LINE, len(fatal)
    assert record["message"].startswith("timed out after 300 s: 64 GPUs are busy Busy: GPU 0: pid 1000")
    assert record["detail_file"] and record["detail_file"] in record["message"]
    with open(record["detail_file"], encoding="utf-8") as handle:
        assert handle.read() == whole + "\n"


def test_a_short_failure_is_whole_and_a_success_has_no_message():
    record = ActionModule._bounded({"error": "GPU 3 is lost", "blockers": []}, "h")
    assert record["message"] == "GPU 3 is lost" and record["detail_file"] is None
    assert ActionModule._bounded({"error": None}, "h")["message"] is None


@pytest.mark.parametrize("tags, skip, fence, wait", [
    ((), (), True, True),
    (("all",), (), True, True),
    (("gpuops_fence",), (), True, False),
    (("gpuops_wait",), (), False, True),
    (("tagged",), (), True, True),
    ((), ("gpuops_wait",), True, False),
    (("other",), (), False, False),
])
def test_the_tags_of_the_run_select_the_steps(monkeypatch, tags, skip, fence, wait):
    monkeypatch.setattr(context, "CLIARGS", context.CLIArgs({"tags": tags, "skip_tags": skip}))
    assert (predeploy_host.wanted("gpuops_fence"), predeploy_host.wanted("gpuops_wait")) == (fence, wait)


@pytest.mark.parametrize("given, said", [
    ({"gpu_idle_timeout": 5, "gpu_idle_settle": 10}, "gpu_idle_settle (10 s) must not be above timeout"),
    ({"gpu_idle_timeout": float("nan")}, "gpu_idle_timeout"),
    ({"gpu_idle_sleep": 0}, "gpu_idle_sleep"),
    ({"gpu_idle_min_free_pct": 120}, "gpu_idle_min_free_pct"),
])
def test_the_wait_s_bounds_fail_naming_the_role_variable(given, said):
    params = ArgumentSpecValidator(predeploy_host.role_spec("gpu_idle")).validate(given).validated_parameters
    with pytest.raises(InvalidOption, match=said.replace("(", r"\(").replace(")", r"\)")):
        ActionModule._check_wait(params)


def test_the_roles_argument_specs_are_its_own_with_their_defaults():
    idle = ArgumentSpecValidator(predeploy_host.role_spec("gpu_idle")).validate({})
    assert not idle.error_messages and idle.validated_parameters["gpu_idle_timeout"] == 300
    fence = ArgumentSpecValidator(predeploy_host.role_spec("proxmox_fence")).validate({"proxmox_fence_method": "kill"})
    assert "proxmox_fence_method" in " ".join(fence.error_messages)
    assert "gpu_idle_delegate_to" not in predeploy_host.role_spec("gpu_idle")  # the role's task reads it, not the plugin


def test_the_roles_argument_specs_are_read_once_as_the_plugin_is_imported(monkeypatch):
    """ansible-playbook imports the action's class before it forks a worker per host: a spec read per host would open
    the roles' files in every worker."""
    def no_open(*args, **kwargs):
        raise AssertionError(f"opened {args[0]} after the import")

    monkeypatch.setattr("builtins.open", no_open)
    spec = predeploy_host.role_spec("gpu_idle")
    assert spec["gpu_idle_timeout"]["default"] == 300
    spec["gpu_idle_timeout"]["default"] = 1  # a copy per use: the next host's is whole
    assert predeploy_host.role_spec("gpu_idle")["gpu_idle_timeout"]["default"] == 300


ASKED = {"fence": {}, "release": {}, "wait": {}}
MARK = predeploy_host.STEP_MARK  # imported there from _errors


@pytest.mark.parametrize("stderr, asked, died", [
    ("", ASKED, "fence"),  # nothing started (or nothing said): the first step asked
    (f"{MARK}proxmox_gpu_containers\n", ASKED, "fence"),
    (f"{MARK}proxmox_gpu_containers\nwarning\n{MARK}gpu_release\n", ASKED, "release"),
    (f"{MARK}proxmox_gpu_containers\n{MARK}gpu_wait_idle\nSegmentation fault\n", ASKED, "wait"),
    (f"{MARK}gpu_release\n{MARK}gpu_wait_idle\n", {"release": {}, "wait": {}}, "wait"),
    (f"{MARK}gpu_wait_idle\n", {"fence": {}}, "fence"),  # a step not asked: the first asked
])
def test_a_run_that_died_is_the_crash_of_the_step_it_was_in(stderr, asked, died):
    assert ActionModule._died_in({"module_stderr": stderr, "rc": -11}, asked) == died


def test_a_step_whose_result_died_with_a_later_one_answers_with_that_crash():
    died = {"failed": True, "module_stdout": "", "module_stderr": f"{MARK}gpu_wait_idle\n", "rc": -11}
    lost = {"lost_with": {"module": "gpu_wait_idle", "result": died}}
    outcome = _results.module_outcome(lost, "gpu_release", host="pve")
    assert not outcome["ok"] and outcome["module"] == "gpu_wait_idle" and outcome["kind"] == "crashed", outcome
    assert "gpu_wait_idle crashed on pve" in outcome["reason"], outcome
