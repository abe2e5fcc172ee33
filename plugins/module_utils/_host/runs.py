# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""Each module's run over the real host, in one place: the argument spec and the body (``(body, partial)`` for
_common.outcome) of proxmox_gpu_containers (``fence``), gpu_release (``release``) and gpu_wait_idle (``wait``). Each
module's main() runs its own; predeploy_host runs the fence, the release and the wait's first slice in one module run
(``steps``), each as its module would, handing on what the next one takes."""

from __future__ import annotations

import sys
import traceback

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.gpuops.gpu.plugins.module_utils import _bound, _errors, _fence, _mig, _release, _snapshot, _validate, _wait
from ansible_collections.gpuops.gpu.plugins.module_utils._common import (
    IDLE_ARGS,
    RELEASE_ARGS,
    SNAPSHOT_ARGS,
    find_pct,
    outcome,
    programs,
    validate_snapshot_params,
)
from ansible_collections.gpuops.gpu.plugins.module_utils._host import files, lock as _lock
from ansible_collections.gpuops.gpu.plugins.module_utils._host.calls import run_in_group
from ansible_collections.gpuops.gpu.plugins.module_utils._host.node_io import NodeIO, PctCounter
from ansible_collections.gpuops.gpu.plugins.module_utils._host.release_io import ReleaseIO
from ansible_collections.gpuops.gpu.plugins.module_utils._host.snapshots import SBIN_DIRS, SnapshotTaker
from ansible_collections.gpuops.gpu.plugins.module_utils._host.wait_io import WaitIO

FENCE_SPEC = dict(
    SNAPSHOT_ARGS,
    **RELEASE_ARGS,
    containers=dict(type="list", elements="raw", default=[]),
    services=dict(type="list", elements="str", default=[]),
    state=dict(type="str", choices=list(_fence.STATES), default="present"),
    include_stopped=dict(type="bool", default=False),
    pct_timeout=dict(type="float", default=_fence.PCT_TIMEOUT),
    shutdown_timeout=dict(type="int", default=60),
    force=dict(type="bool", default=False),
)
RELEASE_SPEC = dict(
    SNAPSHOT_ARGS,
    **RELEASE_ARGS,
    containers=dict(type="list", elements="int"),
    users=dict(type="list", elements="str"),
    match=dict(type="str"),
    pids=dict(type="list", elements="int"),
    exclude=dict(type="str"),
    tree=dict(type="bool", default=True),
    all=dict(type="bool", default=False),
    expected_count=dict(type="int"),
)
WAIT_SPEC = dict(SNAPSHOT_ARGS, **IDLE_ARGS)
WAIT_SPEC.update(
    expected_count=dict(type="int"),
    timeout=dict(type="float", default=300.0),
    delay=dict(type="float", default=0.0),
    sleep=dict(type="float", default=0.5),
    settle=dict(type="float", default=1.0),
    quiet_since=dict(type="dict", options=dict(
        clock=dict(type="float", required=True),
        boot_id=dict(type="str", required=True),
        gpus=dict(type="list", elements="int", required=True),
        device_holders=dict(type="list", elements="raw", default=[]),
    )),
    left_holders=dict(type="list", elements="dict", default=[], options=dict(
        pid=dict(type="int", required=True),
        start_time=dict(type="int"),
        reason=dict(type="str", default=""),
    )),
    blocker_grace=dict(type="float", default=_wait.BLOCKER_GRACE),
    msg=dict(type="str"),
    confirm_with_nvidia_smi=dict(type="bool"),
    leak_after=dict(type="float", default=_wait.LEAK_AFTER),
    reset_leaked=dict(type="bool", default=False),
    progress_slice=dict(type="float"),
    progress_state=dict(type="dict"),
)


def fence(module, p):
    """proxmox_gpu_containers' run with the options ``p``."""
    made = []

    def body():
        # Everything is validated before anything runs (_pct and _validate have the rules and bounds).
        params = _fence.validate(p)
        first_signal = _validate.signal_number(p["signal"])
        pct = find_pct(module, True, p)
        taker = SnapshotTaker(module, p, selection=params["filters"]["gpus"])
        runner = PctCounter(run_in_group, pct)   # every pct this run starts, counted (pct_calls)
        host = ReleaseIO(taker, runner, module.warn, programs(module, pct))
        io = NodeIO(pct, taker, host, p["lock_timeout"], runner=runner)
        made.append(_fence.Fence(params, io, module.check_mode, module._diff, first_signal=first_signal))
        return True, made[0].run()

    # A fence that failed after it began says what it did until then.
    return body, lambda exc: made[0].finish() if made else {}


def release(module, p):
    """gpu_release's run with the options ``p``."""
    def body():
        # Everything is validated before anything is read or signalled (_validate has the bounds).
        selection = validate_snapshot_params(p, module)
        first_signal = _validate.signal_number(p["signal"])
        filters = _validate.release(p, selection)
        taker = SnapshotTaker(module, p, selection=selection)
        io = ReleaseIO(taker, run_in_group, module.warn, programs(module, find_pct(module, False, p)))
        # A container this node does not have is refused as the fence refuses it (on a Proxmox VE node).
        _fence.check_node_containers(NodeIO(None, taker, io), filters["containers"])

        def lock(containers, gpus):  # one release at a time per container and GPU (held until the run ends)
            return _lock.Locks("gpu_release", containers, p["lock_timeout"], module.warn, gpus=gpus).acquire()

        # Each holder once (_snapshot.compact_result): gpus_before and gpus name pids, holder_processes has the details.
        return True, _snapshot.compact_result(_release.run_release(p, filters, io, first_signal, module.check_mode,
                                                                   module._diff, lock=lock))

    # A release that failed after it began says what it did until then (its partial result).
    return body, lambda exc: _snapshot.compact_result(getattr(exc, "partial", None) or {})


def wait(module, p):
    """gpu_wait_idle's run (one slice of it with progress_slice) with the options ``p``."""
    def bin_path(name):
        return module.get_bin_path(name, required=False, opt_dirs=SBIN_DIRS)

    def body():
        # Every option is checked before anything is read (_validate has the bounds).
        selection = validate_snapshot_params(p)
        _validate.wait(p)
        taker = SnapshotTaker(module, p, selection=selection)
        for warning in _validate.device_pattern_warnings(p):
            module.warn(warning)
        # The wait itself (check mode's look, the polls, nvidia-smi's confirmation, reset_leaked, the timeout's
        # diagnosis) is _wait.Wait, over the real host; every failure it returns carries its error kind.
        io = WaitIO(taker, p, bin_path, run_in_group)
        ok, result = _wait.Wait(p, io, selection, check_mode=module.check_mode, diff=module._diff).run()
        # Each holder once (_snapshot.compact_result): gpus_before and gpus name pids, holder_processes has the details.
        result = _snapshot.compact_result(result)
        if p["progress_state"] and p["detail_file"]:
            result = _bound.carry(files.read_json(p["detail_file"]), result)  # the first slice's look stays in the file
        return ok, result

    return body, None


# predeploy_host's steps, in their order (_errors.STEP_MODULES): (option, the module, its spec, its run).
STEPS = tuple((name, module, spec, run) for (name, module), spec, run in
              zip(_errors.STEP_MODULES, (FENCE_SPEC, RELEASE_SPEC, WAIT_SPEC), (fence, release, wait)))


def handoff(fence_result, release_result, wait_args: dict) -> dict:
    """What the wait takes from the steps before it, as predeploy_host hands it on: the GPUs the fence's containers
    hold (when the wait's gpus is not set), and the release's quiet_since and left_holders (else the fence's
    release's)."""
    handed = {}
    if fence_result is not None and not wait_args.get("gpus"):
        cover = _mig.wait_cover(fence_result)
        if cover:
            handed["gpus"] = [str(g) for g in cover]
    source = release_result if release_result is not None else (fence_result or {}).get("release") or {}
    if source.get("quiet_since"):
        handed["quiet_since"] = source["quiet_since"]
    handed["left_holders"] = list(source.get("left_holders") or [])
    return handed


def steps(module, asked: dict) -> dict:
    """predeploy_host's one module run: each step of ``asked`` ({step: its module's options}), in order, with those
    options checked by its module's spec and its result as its module returns it (``failed`` when it failed); a step
    runs only after the one before succeeded; each writes _errors.STEP_MARK and its module's name to stderr as it
    starts. A step that raises something other than a GpuError (a bug) is a crash of that step, with its traceback,
    and nothing more runs. ``handed``: what the wait was handed (its later slices take it too)."""
    out, done = {}, {}
    for name, module_name, spec, run in STEPS:
        given = asked.get(name)
        if given is None:
            continue
        if name == "wait":
            given = dict(given, **handoff(done.get("fence"), done.get("release"), given))
            out["handed"] = {k: given[k] for k in ("gpus", "quiet_since", "left_holders") if k in given}
        checked = ArgumentSpecValidator(spec).validate(given)
        if checked.error_messages:
            out[name] = {"failed": True, "msg": "; ".join(checked.error_messages), "error": _errors.InvalidOption.kind}
            break
        params = checked.validated_parameters
        try:
            sys.stderr.write(f"{_errors.STEP_MARK}{module_name}\n")
            sys.stderr.flush()
            ok, result = outcome(module, *run(module, params), params=params)
        except Exception:  # pylint: disable=broad-exception-caught  # a bug of the step: a crash with its traceback
            out[name] = {"failed": True, "exception": traceback.format_exc()}
            break
        out[name] = result if ok else dict(result, failed=True)
        if not ok:
            break
        done[name] = result
    return out
