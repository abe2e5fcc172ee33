# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Controller side of gpuops.gpu.gpu_wait_idle: run the wait in slices and print progress (plugin_utils/_slices)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpuops.gpu.plugins.plugin_utils._slices import INTERNAL, MODULE, run_wait


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
        is_async = bool(self._task.async_val)

        def execute(margs):
            return self._execute_module(module_name=MODULE, module_args=margs, task_vars=task_vars, wrap_async=is_async)

        host = task_vars.get("inventory_hostname", "") if task_vars else ""
        # async: the module runs in one piece on the target; check mode: one look.
        result.update(run_wait(execute, dict(self._task.args), host, whole=is_async or self._play_context.check_mode))
        return result
