# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Controller side of gpuops.gpu.gpu_wait_idle: run the wait in slices and print progress."""

from __future__ import annotations

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpuops.gpu.plugins.module_utils import _validate

display = Display()

SLICE_SECONDS = 10.0
INTERNAL = ("progress_slice", "progress_state")
# Round trips to the target on top of the module's own time, before the controller gives up.
MARGIN_SECONDS = 120.0


def controller_deadline(args):
    """Seconds after which the controller stops asking for more slices, or None when the module will
    refuse the arguments anyway (its own validation then fails the first slice, naming the option)."""
    try:
        timeout = _validate.number("timeout", args.get("timeout", 300.0))
        delay = _validate.number("delay", args.get("delay", 0.0))
    except ValueError:
        return None
    return delay + timeout + 2 * SLICE_SECONDS + MARGIN_SECONDS


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        given = sorted(k for k in self._task.args if k in INTERNAL)
        if given:
            result.update(failed=True, msg=f"{', '.join(given)}: internal to gpu_wait_idle (its action plugin sets it to"
                                           " slice the wait and print progress); remove it from the task")
            return result
        args = dict(self._task.args)
        module = "gpuops.gpu.gpu_wait_idle"
        if self._task.async_val or self._play_context.check_mode:
            # async: the module runs in one piece on the target; check mode: one look.
            result.update(self._execute_module(module_name=module, module_args=args, task_vars=task_vars,
                                               wrap_async=bool(self._task.async_val)))
            return result
        start = time.monotonic()
        deadline = controller_deadline(args)
        state = None
        first_look = first_details = None
        host = task_vars.get("inventory_hostname", "") if task_vars else ""
        while True:
            margs = dict(args, progress_slice=SLICE_SECONDS)
            if state is not None:
                # The controller's clock carries the elapsed time across slices (round trips included).
                margs["progress_state"] = dict(state, offset=time.monotonic() - start)
            res = self._execute_module(module_name=module, module_args=margs, task_vars=task_vars)
            if state is None and "gpus_before" in res:
                # Only the first slice took it; its device-file holders' details (each once) travel with it.
                first_look, first_details = res["gpus_before"], res.get("holder_processes") or {}
            elif "gpus_before" not in res and first_look is not None:
                res["gpus_before"] = first_look
                res["holder_processes"] = {**first_details, **(res.get("holder_processes") or {})}
            if not res.get("pending"):
                for key in ("pending", "progress", "progress_state"):
                    res.pop(key, None)
                invocation = res.get("invocation")
                if isinstance(invocation, dict) and isinstance(invocation.get("module_args"), dict):
                    # The task's arguments, not the slices' state (its size grows with the holders and the polls).
                    res["invocation"] = dict(invocation, module_args={k: v for k, v in invocation["module_args"].items()
                                                                      if k not in INTERNAL})
                result.update(res)
                return result
            display.display(f"[{host}] {res.get('progress')}" if host else str(res.get("progress")))
            state = res["progress_state"]
            if deadline is not None and time.monotonic() - start > deadline:
                # The module ends at its timeout; a target that keeps answering "pending" must not hold the play.
                result.update(failed=True, msg=f"gpu_wait_idle: still pending after {time.monotonic() - start:.0f} s,"
                                               f" more than timeout + delay + {2 * SLICE_SECONDS + MARGIN_SECONDS:g} s")
                return result
