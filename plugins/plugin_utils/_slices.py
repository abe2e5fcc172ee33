# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The wait of gpuops.gpu.gpu_wait_idle run in slices from the controller, printing a progress line between them:
the action plugins gpu_wait_idle and predeploy_host share it."""

from __future__ import annotations

import time

from ansible.utils.display import Display

from ansible_collections.gpuops.gpu.plugins.module_utils import _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._redact import line

display = Display()

MODULE = "gpuops.gpu.gpu_wait_idle"
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


def run_wait(execute, args: dict, host: str = "", whole: bool = False, first=None) -> dict:
    """The wait's result: ``execute(module_args)`` runs gpu_wait_idle once on the target (the action's
    _execute_module); ``whole`` (async, check mode): in one piece, else in slices of SLICE_SECONDS with a progress
    line between them, the controller's clock carrying the elapsed time across slices. ``first``: the first slice's
    result when it already ran (predeploy_host's one module run); the later slices follow it."""
    if whole:
        return execute(dict(args)) if first is None else first
    start = time.monotonic() - (float(first.get("elapsed") or 0.0) if first is not None else 0.0)
    deadline = controller_deadline(args)
    state = said = None
    first_look = first_details = None
    while True:
        margs = dict(args, progress_slice=SLICE_SECONDS)
        if state is not None:
            margs["progress_state"] = dict(state, offset=time.monotonic() - start)
        res = first if state is None and first is not None else execute(margs)
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
            return res
        progress = str(res.get("progress"))
        what, sep, when = progress.rpartition(" - ")
        if sep and what == said and "; waiting on " in what:
            # The GPUs as the slice before found them: said in a few words, not a clause per busy GPU again.
            progress = f"{what.split(';')[0]}; waiting on the same GPUs and holders{sep}{when}"
        said = what if sep else None
        # (a clause per busy GPU: at most LINE characters, however many GPUs the host has)
        display.display(line(f"[{host}] {progress}" if host else progress))
        state = res["progress_state"]
        if deadline is not None and time.monotonic() - start > deadline:
            # The module ends at its timeout; a target that keeps answering "pending" must not hold the play.
            return {"failed": True, "msg": f"gpu_wait_idle: still pending after {time.monotonic() - start:.0f} s,"
                                           f" more than timeout + delay + {2 * SLICE_SECONDS + MARGIN_SECONDS:g} s"}
