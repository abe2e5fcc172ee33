# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""gpuops.gpu.predeploy_host: one GPU host's pre-deploy job in one task (the pattern of ansible.builtin.reboot).

Over the delegate's connection (the task's delegate_to: the Proxmox VE node of a container, else the host) it runs
the fence (proxmox_gpu_containers, state released or shutdown), the optional release (gpu_release) and the wait
(gpu_wait_idle, in slices with a progress line between them); records proxmox_fence_result and gpu_idle_result as
facts; prints the before/after table; publishes the artifacts and rewrites the result file. It never fails for the
GPUs (facts and set_stats of a failed task are dropped by ansible-core): the play's next task fails each host that
is not ready, once, with its bounded message. Its settings are the roles' variables (gpu_idle_*, proxmox_fence_*), read from the host's
variables (proxmox_fence_*: else the node's), checked against the roles' own argument specs (their defaults too).
The documentation is plugins/modules/predeploy_host.py."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time

from ansible import constants as C
from ansible import context
from ansible.errors import AnsibleConnectionFailure
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

try:
    from ansible.plugins.action import VariableLayer
except ImportError:  # ansible-core 2.20: the facts of the result are set as the host's variables
    VariableLayer = None
from ansible.utils.display import Display

from ansible_collections.gpuops.gpu.plugins.module_utils import _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._errors import STEP_MARK, STEP_MODULES, InvalidOption
from ansible_collections.gpuops.gpu.plugins.plugin_utils import _results
# Every host's task makes a table: imported here, in ansible-playbook's main process, which imports this class before
# it forks the task's workers (see SPECS), not in each worker from source (_results imports them where it makes one).
from ansible_collections.gpuops.gpu.plugins.plugin_utils import _tables  # noqa: F401 pylint: disable=unused-import
from ansible_collections.gpuops.gpu.plugins.plugin_utils._slices import SLICE_SECONDS, run_wait

display = Display()

ROLES = os.path.join(os.path.dirname(__file__), "..", "..", "roles")
# The spec keys that ArgumentSpecValidator understands (the roles' specs also carry their documentation).
SPEC_KEYS = ("type", "elements", "choices", "default", "required", "options", "no_log")
# Variables the roles read for their own tasks (delegate_to), never options of a step.
ROLE_ONLY = ("gpu_idle_delegate_to", "proxmox_fence_delegate_to")

# role variable -> module option, per step (None: the value is handled by the plugin).
FENCE = ("containers", "services", "shutdown_timeout", "force", "pct", "signal", "grace_period", "kill_timeout",
         "escalate", "device_files", "stop_units")
SELECT = ("gpus", "backend", "device_files", "protect")
RELEASE = ("containers", "users", "match", "exclude", "pids", "tree", "signal", "grace_period", "escalate",
           "kill_timeout", "pct")
WAIT = ("max_memory_used_mib", "max_utilization_pct", "timeout", "settle", "sleep", "confirm_with_nvidia_smi",
        "min_free_mib", "min_free_pct", "health_checks", "leak_after", "reset_leaked", "blocker_grace")
WAIT_CHECKED = ("timeout", "settle", "sleep", "expected_count", "max_memory_used_mib", "max_utilization_pct",
                "min_free_mib", "min_free_pct", "leak_after", "blocker_grace")


def _read_spec(role: str) -> dict:
    """The options of the role's meta/argument_specs.yml (main), as ArgumentSpecValidator takes them."""
    import yaml  # pylint: disable=import-outside-toplevel  # ansible-playbook has it loaded already

    with open(os.path.join(ROLES, role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
        options = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))["argument_specs"]["main"]["options"]
    return {name: {k: v for k, v in spec.items() if k in SPEC_KEYS} for name, spec in options.items()
            if name not in ROLE_ONLY}


# Read once per run, as this file is imported: ansible-playbook's strategy imports the action's class in its main
# process before it forks the task's workers (lib/ansible/plugins/strategy/linear.py, free.py:
# action_loader.get(..., class_only=True)), and each worker, a fork (ansible/utils/multiprocessing.py), inherits it.
SPECS = {role: _read_spec(role) for role in ("gpu_idle", "proxmox_fence")}


def role_spec(role: str) -> dict:
    """The role's argument spec (read once, SPECS), a copy per use."""
    return {name: dict(spec) for name, spec in SPECS[role].items()}


def wanted(tag: str) -> bool:
    """Whether this run's --tags/--skip-tags select ``tag`` (the task itself is tagged always)."""
    only = set(context.CLIARGS.get("tags") or ()) - {"all"}
    skip = set(context.CLIARGS.get("skip_tags") or ())
    return tag not in skip and (not only or bool(only & {tag, "tagged"}))


def _given(values: dict, names) -> dict:
    """The module options of ``names`` whose value is set (an empty list or string, or null: the module's default)."""
    return {k: values[k] for k in names if values.get(k) not in (None, "", [])}


def _write_json(path: str, value) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=1, sort_keys=True)
    os.replace(tmp, path)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("fence", "wait", "containers", "result_file"))
    _requires_connection = False  # the steps connect when they run (a connection that fails is their result)
    _changed = False  # whether a module run changed something (set per run, on the instance)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        args = self.validate_argument_spec(argument_spec={
            "fence": {"type": "bool", "default": False}, "wait": {"type": "bool", "default": True},
            "containers": {"type": "list", "elements": "str"}, "result_file": {"type": "path"}})[1]
        result_file = args["result_file"] or self._var(task_vars, "predeploy_result_file")
        host = task_vars.get("inventory_hostname", "")
        node = self._task.delegate_to or host
        try:
            fence_vars = self._role_vars("proxmox_fence", task_vars, node) if args["fence"] else None
            idle_vars = self._role_vars("gpu_idle", task_vars, None) if args["wait"] else None
            if idle_vars is not None:
                self._check_wait(idle_vars)
        except InvalidOption as exc:
            result.update(failed=True, msg=exc.msg)
            return result
        facts, diffs = {}, []
        fence = None
        fence_on = fence_vars is not None and wanted("gpuops_fence")
        if fence_on and args["containers"] is not None:
            fence_vars["proxmox_fence_containers"] = args["containers"]
        steps = self._steps(fence_vars, fence_on, idle_vars, task_vars, diffs)
        if fence_on:
            fence = self._fence(steps, fence_vars, task_vars, node)
            facts["proxmox_fence_result"] = fence
        if idle_vars is not None:
            facts["gpu_idle_result"] = self._idle(steps, idle_vars, fence, task_vars, host, node, diffs)
        result["changed"] = self._changed
        if VariableLayer is not None:
            # Host variables as set_fact sets them (ansible-core 2.21+; not injected facts, which are deprecated).
            self.register_host_variables({}, VariableLayer.CACHEABLE_FACT)
            self.register_host_variables(facts, VariableLayer.EPHEMERAL_FACT)
        else:
            result["ansible_facts"] = facts
        stats = self._record_run(task_vars, facts, result_file)
        if stats:
            result["ansible_stats"] = stats
        if diffs:
            result["diff"] = diffs
        if display.verbosity < 2:
            # Not printed at -v (as gather_facts' facts): the table and the progress lines say it for the terminal,
            # the facts and the artifacts (AWX's events keep the result) for the rest; -vv prints it.
            result["_ansible_verbose_override"] = True
        return result

    # --- the run's answer ----------------------------------------------------------------------------------

    def _play_key(self, task_vars: dict) -> str:
        parent = self._task
        while parent is not None and getattr(parent, "_play", None) is None:
            parent = getattr(parent, "_parent", None)
        play = getattr(parent, "_play", None)
        return str(getattr(play, "_uuid", None) or task_vars.get("ansible_play_name", ""))

    def _record_run(self, task_vars: dict, facts: dict, result_file):
        """This host's answer in the run's state (a file in the controller's per-run directory, under a lock); the
        result file rewritten from it; and the artifacts: a fence alone adds its host's proxmox_fence_summary (merged);
        the host whose answer completes its batch publishes the play's (the only one that publishes them, so that no
        earlier view can be taken up after it): gpu_idle_ready true only when every host of the play proved ready."""
        host = task_vars.get("inventory_hostname", "")
        fence, idle = facts.get("proxmox_fence_result"), facts.get("gpu_idle_result")
        if idle is None and not fence:
            return None
        path = os.path.join(C.DEFAULT_LOCAL_TMP, "gpuops-run.json")
        key = self._play_key(task_vars)
        with open(path + ".lock", "a", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(path, encoding="utf-8") as handle:
                    state = json.load(handle)
            except (OSError, ValueError):
                state = {"fence": {}, "plays": {}}
            if fence:
                state["fence"][host] = fence["stats"]  # what a later publish of the run carries (a fence alone too)
            if idle is None:
                _write_json(path, state)
                return {"data": {"proxmox_fence_summary": {host: fence["stats"]}}, "per_host": False, "aggregate": True}
            play = state["plays"].setdefault(key, {})
            play[host] = {"answer": _results.host_answer(idle), "summary": idle["summary"]}
            _write_json(path, state)
            hosts = list(task_vars.get("ansible_play_hosts_all") or [host])
            answers = {h: play[h]["answer"] if h in play else _results.host_answer(None) for h in hosts}
            if result_file:
                _write_json(result_file, {"ready": all(a["ready"] for a in answers.values()), "hosts": answers})
            if not all(h in play for h in task_vars.get("ansible_play_batch") or [host]):
                return None
        data = _results.artifacts(answers, {h: p["summary"] for h, p in play.items()}, state["fence"],
                                  job_id=task_vars.get("awx_job_id"))
        return {"data": data, "per_host": False, "aggregate": False}

    # --- settings ------------------------------------------------------------------------------------------

    def _var(self, task_vars, name, default=None):
        return self._templar.template(task_vars[name]) if name in task_vars else default

    def _role_vars(self, role: str, task_vars: dict, node) -> dict:
        """The role's variables for this host, validated by the role's argument spec (its defaults applied): the
        host's value, else (proxmox_fence_*) the node's, else gpuops_device_files for the device files."""
        spec = role_spec(role)
        node_vars = None
        if node and node != task_vars.get("inventory_hostname"):
            node_vars = (task_vars.get("hostvars") or {}).get(node)
        given = {}
        for name in spec:
            if name in task_vars:
                given[name] = self._templar.template(task_vars[name])
            elif node_vars is not None and name in node_vars:
                given[name] = node_vars[name]
        if f"{role}_device_files" not in given and "gpuops_device_files" in task_vars:
            given[f"{role}_device_files"] = self._templar.template(task_vars["gpuops_device_files"])
        checked = ArgumentSpecValidator(spec).validate(given)
        if checked.error_messages:
            raise InvalidOption(f"{role} variables: " + "; ".join(checked.error_messages), option=role)
        return checked.validated_parameters

    @staticmethod
    def _check_wait(idle_vars: dict) -> None:
        """The wait's bounds, checked before the fence or the release changes anything (naming the variable)."""
        params = {"delay": 0.0, **{k: idle_vars.get(f"gpu_idle_{k}") for k in WAIT_CHECKED}}
        try:
            _validate.wait(params)
            _validate.idle(params)
        except InvalidOption as exc:
            option = exc.details.get("option")
            msg = exc.msg[len(option):] if option and exc.msg.startswith(option) else f": {exc.msg}"
            raise InvalidOption(f"gpu_idle_{option}{msg}", option=option) from None

    # --- the steps -----------------------------------------------------------------------------------------

    def _module(self, name: str, margs: dict, task_vars: dict, diffs: list) -> dict:
        """One module run on the delegate; a connection that fails is a result (unreachable), not an exception."""
        try:
            res = self._execute_module(module_name=name, module_args=margs, task_vars=task_vars)
        except AnsibleConnectionFailure as exc:
            return {"unreachable": True, "msg": str(exc)}
        return self._taken(res, diffs)

    def _taken(self, res: dict, diffs: list) -> dict:
        """A module's result with its diff moved to the task's (``diffs``) and its change counted."""
        self._changed = self._changed or bool(res.get("changed"))
        diff = res.pop("diff", None)
        diffs.extend(d for d in (diff if isinstance(diff, list) else [diff]) if isinstance(d, dict) and d)
        return res

    def _steps(self, fence_vars, fence_on: bool, idle_vars, task_vars: dict, diffs: list) -> dict:
        """The fence, the release and the wait's first slice (those that this run asks for) in one module run on the
        delegate (gpuops.gpu.predeploy_host, module_utils/_host/runs.steps): {step: its module's result}, and
        ``handed`` (what the wait was handed). A step after one that failed has no result (nothing more ran); a run
        that gave no step's result (a crash, an unreachable delegate) is the first step's result."""
        asked = {}
        if fence_on:
            method = fence_vars["proxmox_fence_method"]
            asked["fence"] = dict({k: fence_vars[f"proxmox_fence_{k}"] for k in FENCE},
                                  state="shutdown" if method == "shutdown" else "released")
        if idle_vars is not None:
            v = idle_vars
            select = {k: v[f"gpu_idle_{k}"] for k in SELECT}
            count = {} if v["gpu_idle_expected_count"] is None else {"expected_count": v["gpu_idle_expected_count"]}
            if v["gpu_idle_release"]:
                asked["release"] = dict(select, **count, **_given({k: v[f"gpu_idle_release_{k}"] for k in RELEASE}, RELEASE))
                if fence_vars is not None:
                    asked["release"]["pct"] = fence_vars["proxmox_fence_pct"]
            if wanted("gpuops_wait"):
                asked["wait"] = dict(select, **count, **_given({k: v[f"gpu_idle_{k}"] for k in WAIT}, WAIT))
                if not self._play_context.check_mode:  # check mode: one look, in one piece
                    asked["wait"]["progress_slice"] = SLICE_SECONDS
        if not asked:
            return {}
        res = self._module("gpuops.gpu.predeploy_host", {"steps": asked}, task_vars, diffs)
        steps = {"asked": asked, "handed": res.get("handed") or {}}
        for name in asked:
            if isinstance(res.get(name), dict):
                steps[name] = self._taken(res[name], diffs)
        if not any(name in steps for name in asked):
            died = self._died_in(res, asked)
            steps[died] = res
            # The steps before it succeeded (the run goes on only after one that does); their results died with it.
            for name, module in STEP_MODULES:
                if name == died:
                    break
                if name in asked:
                    steps[name] = {"lost_with": {"module": dict(STEP_MODULES)[died], "result": res}}
        return steps

    @staticmethod
    def _died_in(res: dict, asked: dict) -> str:
        """The step of a run that gave no step's result (it died, or did not run): the last one that its stderr says
        started, else the first one asked."""
        started = [line[len(STEP_MARK):].strip() for line in str(res.get("module_stderr") or "").splitlines()
                   if line.startswith(STEP_MARK)]
        step = {module: name for name, module in STEP_MODULES}.get(started[-1]) if started else None
        return step if step in asked else next(iter(asked))

    def _fence(self, steps: dict, v: dict, task_vars: dict, node: str) -> dict:
        fenced = _results.proxmox_fence_result(steps.get("fence") or {}, method=v["proxmox_fence_method"],
                                               check_mode=self._play_context.check_mode, host=node)
        display.display(_results.line(f"[{task_vars.get('inventory_hostname')}] {fenced['summary']}"))
        return self._bounded(fenced, task_vars.get("inventory_hostname", ""))

    def _idle(self, steps: dict, v: dict, fence, task_vars: dict, host: str, node: str, diffs: list) -> dict:
        fence = fence or {}
        check = self._play_context.check_mode
        release, wait = None, None
        if fence.get("error"):
            pass  # the fence's failure is the answer: nothing more ran
        elif v["gpu_idle_release"]:
            release = steps.get("release") or {}
        if not fence.get("error") and (release is None or _results.release_proved(release, node)):
            if "wait" in steps.get("asked", {}):
                wait = self._wait(steps, task_vars, host, check, diffs)
            else:
                wait = {"skipped": True, "skip_reason": "this run's --tags/--skip-tags leave out gpuops_wait"}
        recorded = _results.gpu_idle_result(wait, release=release, fence=fence, host=host, seen_from=node,
                                            check_mode=check, release_required=bool(v["gpu_idle_release"]))
        for line in _results.printed(recorded, display.verbosity):
            display.display(line)
        return self._bounded(recorded, host)

    @staticmethod
    def _bounded(record: dict, host: str) -> dict:
        """The record with its failure's ``message`` (what the play's last task fails with): at most MESSAGE characters
        as Ansible prints it; a longer one is cut, and the whole is in ``detail_file`` on the controller and printed at
        -vv."""
        record["message"] = record["detail_file"] = None
        if record.get("error") is None:
            return record
        whole = _results.message(record)
        record["message"] = whole
        if _results.printed_length(whole) > _results.MESSAGE:
            display.vv(f"[{host}] the whole diagnosis: {whole}")
            try:
                fd, path = tempfile.mkstemp(prefix=f"gpuops-{host}-", suffix=".txt",
                                            dir=os.path.dirname(C.DEFAULT_LOCAL_TMP) or None)
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(whole + "\n")
            except OSError:
                path = None
            tail = f" ... (cut: the whole diagnosis is in {path}, and printed with -vv)" if path else \
                " ... (cut: the whole diagnosis is printed with -vv)"
            record["message"] = _results.fit_message(whole, tail)
            record["detail_file"] = path
        return record

    def _wait(self, steps: dict, task_vars: dict, host: str, check: bool, diffs: list) -> dict:
        """The wait's result: its first slice from the one module run, then (pending) its later slices, each a run of
        gpu_wait_idle with what the first was handed."""
        start = time.monotonic()
        first = steps.get("wait") or {}
        margs = {k: v for k, v in steps["asked"]["wait"].items() if k != "progress_slice"}
        margs.update(steps.get("handed") or {})

        def execute(slice_args):
            return self._module("gpuops.gpu.gpu_wait_idle", slice_args, task_vars, diffs)

        res = run_wait(execute, margs, host, whole=check, first=first)
        res.setdefault("elapsed", round(time.monotonic() - start, 1))
        return res
