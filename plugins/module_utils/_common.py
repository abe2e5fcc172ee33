# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""Glue shared by the modules: the common argument specs, the module itself (new_module), the programs a release
runs (programs, find_pct) and the one failure boundary of every module (run_module).

With _host/ (the real host's adapters, which ask the module for programs and warnings), the only module_utils that
talk to AnsibleModule; the logic they call lives in the pure files next to them.
"""

from __future__ import annotations

import math

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.gpu.plugins.module_utils import _bound, _errors, _health, _snapshot, _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._host import files, lock as _lock
from ansible_collections.gpuops.gpu.plugins.module_utils._host.snapshots import SBIN_DIRS

# The options of the doc fragment gpuops.gpu.gpu (every module).
SNAPSHOT_ARGS = dict(
    gpus=dict(type="list", elements="str", default=[]),
    backend=dict(type="str", choices=["auto", "nvml", "nvidia-smi"], default="auto"),
    nvidia_smi_path=dict(type="str", default="nvidia-smi"),
    query_timeout=dict(type="float", default=10.0),
    device_files=dict(type="list", elements="str", default=["/dev/nvidia*"]),
    allow_any_device_files=dict(type="bool", default=False),
    include_device_holders=dict(type="bool", default=True),
    protect=dict(type="list", elements="str", default=[]),
    redact=dict(type="list", elements="str", default=[]),
    cmdline=dict(type="bool", default=True),
    **_bound.DETAIL_ARGS,
)
# The options of the doc fragment gpuops.gpu.gpu.idle (gpu_facts, gpu_wait_idle).
IDLE_ARGS = dict(
    max_memory_used_mib=dict(type="int", default=_snapshot.DEFAULT_MAX_MEMORY_USED_MIB),
    max_utilization_pct=dict(type="int"),
    min_free_mib=dict(type="int"),
    min_free_pct=dict(type="float"),
    health_checks=dict(type="list", elements="str", choices=list(_health.CHECK_NAMES),
                       default=list(_health.DEFAULT_CHECKS)),
    kernel_log=dict(type="path"),
)
# The options of the doc fragment gpuops.gpu.gpu.release (gpu_release, and proxmox_gpu_containers' state released).
RELEASE_ARGS = dict(
    signal=dict(type="str", default="SIGTERM"),
    grace_period=dict(type="float", default=10.0),
    escalate=dict(type="bool", default=True),
    kill_timeout=dict(type="float", default=45.0),
    fail_on_survivors=dict(type="bool", default=True),
    stop_units=dict(type="bool", default=True),
    pct=dict(type="str", default="pct"),
    lock_timeout=dict(type="float", default=120.0),
)
# Where Proxmox VE installs pct (pve-container: /usr/sbin/pct); then PATH.
PCT_DIRS = ["/usr/sbin", "/usr/bin"]


def programs(module, pct=None):
    """``name -> path or None``: the programs a release runs (systemctl, pct). ``pct`` is the configured one
    (the ``pct`` option, resolved by ``find_pct``): every ``pct`` the module runs is that one, never another on PATH."""
    def find(name):
        if name == "pct":
            return pct
        return module.get_bin_path(name, opt_dirs=SBIN_DIRS)
    return find


def find_pct(module, required: bool, params=None):
    """The path of the ``pct`` option's program (a path, or a name looked up in PCT_DIRS and PATH), or None where
    there is none and it is the default ``pct`` and not ``required`` (a host or a container: no unit is stopped
    through it). A ``pct`` set to something else that is not there is an error, before anything runs. ``params``:
    the run's options (default the module's)."""
    name = (params or module.params)["pct"]
    path = module.get_bin_path(name, opt_dirs=PCT_DIRS)
    if path or (not required and name == "pct"):
        return path
    raise _errors.PctNotFound(f"pct: {name!r} not found (in {', '.join(PCT_DIRS)} and PATH): run this module on a"
                              " Proxmox VE node (delegate_to the node), or set pct to the program's path.")


def validate_snapshot_params(params: dict, module=None):
    """Bad input fails before anything is read or signalled (_validate has every bound); returns the gpus option
    parsed (_selection.Selection), the one value of it that the run takes."""
    selection = _validate.snapshot(params)
    if module is not None:
        for warning in _validate.device_pattern_warnings(params):
            module.warn(warning)
    return selection


def _not_finite(value) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_not_finite(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return False
    try:
        return not math.isfinite(float(value))
    except (ValueError, OverflowError):
        return False


def new_module(argument_spec: dict, **kwargs):
    """AnsibleModule(argument_spec, ...), except that an infinite value of an integer option fails naming the option.

    ansible-core's check_type_int turns inf, -inf or "Infinity" into an OverflowError, a traceback and a MODULE
    FAILURE (fixed upstream in ansible/ansible#87253, not in every ansible-core this collection supports). Then the
    arguments are read again with those options untyped, and the module fails cleanly, before anything runs.
    """
    try:
        return AnsibleModule(argument_spec=argument_spec, **kwargs)
    except OverflowError:
        integers = [k for k, v in argument_spec.items() if v.get("type") == "int" or v.get("elements") == "int"]
        loose = {k: (dict(v, type="raw") if v.get("type") == "int" else dict(v, elements="raw")) if k in integers else v
                 for k, v in argument_spec.items()}
        module = AnsibleModule(argument_spec=loose, **kwargs)
        bad = [k for k in integers if _not_finite(module.params.get(k))] or integers
        module.fail_json(msg=f"{bad[0]} must be a finite integer, got {module.params.get(bad[0])!r}", option=bad[0],
                         error=_errors.InvalidOption.kind)
        raise  # not reached: fail_json exits


def outcome(module, body, partial=None, params=None):
    """(ok, result) of one module's run, bounded: ``body()`` returns (ok, result), a result that carries its
    ``error`` kind when not ok. A GpuError that ``body`` raises (an option, a driver, a parser that cannot read what
    nvidia-smi, /proc or pct printed: _errors.UnreadableOutput) is a failure with its kind and message, and
    ``partial(exc)`` - what was done until then - beside them. Either way the result is bounded here (_bound: in
    summary unless detail=full, the whole of it in detail_file; ``params``: the run's options, default the module's).

    Anything else is a bug of this collection and stays a traceback, which ansible-core reports as a module failure
    (and the roles as a crash): it is not turned into a failure that looks handled."""
    try:
        ok, result = body()
    except _errors.GpuError as exc:
        ok, result = False, exc.result()
        result.update(partial(exc) if partial else {})
    finally:
        _lock.release_all()  # the release locks go with the run (a process of its own lets go of them anyway)
    params = (module.params if params is None else params) or {}
    return ok, _bound.bound(result, params.get("detail") or _bound.SUMMARY, params.get("detail_file"), module.warn,
                            files.write_json)


def run_module(module, body, partial=None) -> None:
    """The one failure boundary of every module: exit_json(**result) when ``outcome`` is ok, else fail_json(**result)
    - every module's every result leaves through here."""
    ok, result = outcome(module, body, partial)
    if ok:
        module.exit_json(**result)
    module.fail_json(**result)
