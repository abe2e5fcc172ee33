# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the modules' results prove, for the controller: module_outcome (whether a module result is a success),
gpu_idle_result (the record of a release and a wait, the fact gpu_idle_result) and proxmox_fence_result (the record of
a fence, the fact proxmox_fence_result). The action plugin predeploy_host records them; their keys are documented
there (plugins/modules/predeploy_host.py, RETURN).

A module result is a success only when it has the keys a success of that module has and no sign of a failure;
anything else is a failure with a kind (the module's own error, failed, crashed, unreachable, skipped, missing,
incomplete, inconsistent) and a reason that says what happened and what to do."""

from __future__ import annotations

import json
import signal

from ansible.errors import AnsibleError

from ansible_collections.gpuops.gpu.plugins.module_utils import _bound, _mig
from ansible_collections.gpuops.gpu.plugins.module_utils._redact import LINE, cut, line, redact_text

# --- whether a registered module result is a success (module_outcome), for both roles' filters ------------
# proxmox_fence_result imports module_outcome from here. A result counts as a success only when it has the
# keys a success of its module has (each module's RETURN) and no sign of a failure; anything else is a failure
# with a kind and a reason that says what happened and what to do.

MODULES = ("gpu_facts", "gpu_release", "gpu_wait_idle", "proxmox_gpu_containers")
# Modules whose success never carries msg: a msg is a failure (ansible-core before 2.19 keeps no other sign of
# it under failed_when=false). gpu_wait_idle's success says how long it took; gpu_facts' missing=ignore says why.
NO_MSG_ON_SUCCESS = ("gpu_release", "proxmox_gpu_containers")
# What ansible-core puts in msg when a module printed no JSON (2.19+, then older releases).
NO_JSON = ("Module result deserialization failed", "MODULE FAILURE")
SHOWN = 300  # characters of a crash's last line of output, at most

NOTHING_PROVED = {
    "gpu_wait_idle": "nothing proves that the GPUs are idle",
    "gpu_release": "what it stopped is not known",
    "proxmox_gpu_containers": "which containers and services were fenced is not known",
    "gpu_facts": "the GPUs were not read",
}


def _outcome(module, kind=None, reason=None, skipped=False):
    return {"ok": kind is None, "skipped": skipped, "module": module, "kind": kind, "reason": reason}


def _last_line(text) -> str:
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    return cut(redact_text(lines[-1]), SHOWN) if lines else ""


def _signal_of(rc):
    """The signal that killed the interpreter, from the rc that the shell (128 + n) or Python (-n) gives."""
    if not isinstance(rc, int) or isinstance(rc, bool):
        return None
    number = rc - 128 if 128 < rc < 128 + 65 else (-rc if rc < 0 else None)
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


HINTS = {
    "SIGKILL": "the kernel's OOM killer or an operator may have killed it: look at `dmesg` and the memory of the host",
    "SIGSEGV": "a segmentation fault (in the NVIDIA library or in Python): look at `dmesg` and the driver (nvidia-smi)",
    "SIGABRT": "it aborted (in the NVIDIA library or in Python): look at `dmesg` and the driver (nvidia-smi)",
    "exception": "an unhandled error is a bug of the module, or an answer of the driver it did not expect",
}


def _crash_advice(module, how=""):
    hint = HINTS.get(how, "look at the host (dmesg, the driver)")
    return (f"{NOTHING_PROVED[module]}. {hint[0].upper() + hint[1:]}; run the play again, and report the crash"
            " (with -vvv and ANSIBLE_DISPLAY_TRACEBACK=error) if it happens again.")


def _where(host) -> str:
    return f" on {host}" if host else ""


def _no_json(result, module, host):
    rc = result.get("rc")
    sig = _signal_of(rc)
    said = _last_line(result.get("module_stderr")) or _last_line(result.get("module_stdout"))
    if sig:
        how = f"killed by {sig} (rc {rc})"
    elif rc is not None:
        how = f"it exited with rc {rc} and printed no result"
    else:
        how = "it printed no result"
    tail = f"; its last output: {said!r}" if said else ""
    return f"{module} crashed{_where(host)}: {how}{tail} - {_crash_advice(module, sig or '')}"


def _unhandled(result, module, host):
    trace = result.get("failed_when_suppressed_exception") or result.get("exception")
    if not isinstance(trace, str):
        # ansible-core 2.19+ (a result of _execute_module): an ErrorSummary, its event's traceback when it was
        # kept (ANSIBLE_DISPLAY_TRACEBACK), else its message
        event = getattr(trace, "event", None)
        trace = getattr(event, "formatted_traceback", None) or getattr(event, "msg", None) or ""
    line = _last_line(trace)
    if line and line != "(traceback unavailable)":
        said = f": {line}"
    else:
        said = (" (ansible-core keeps its message only in the traceback: run again with"
                " ANSIBLE_DISPLAY_TRACEBACK=error to see it)")
    return f"{module} crashed{_where(host)} with an unhandled error{said} - {_crash_advice(module, 'exception')}"


def _failed(result) -> bool:
    """Any sign of a failure: ansible-core 2.19+ moves a failure's exception (a fail_json too) to
    failed_when_suppressed_exception under failed_when; a task without failed_when says failed."""
    return bool(result.get("failed") or result.get("failed_when_suppressed_exception") or result.get("exception")
                or result.get("error"))


def _gpu_list(value) -> bool:
    return isinstance(value, list) and len(value) > 0 and all(isinstance(g, dict) for g in value)


def _success_checks(r, module):
    """(the key as the reason names it, whether the result has it) for each key that a success of the module has."""
    if module == "gpu_wait_idle":
        if "would_wait" in r:  # check mode: one look
            return (("would_wait", isinstance(r["would_wait"], bool)), ("gpus", _gpu_list(r.get("gpus"))))
        return (("ready: true", r.get("ready") is True), ("gpus (the GPUs it checked)", _gpu_list(r.get("gpus"))),
                ("idle_gpus", isinstance(r.get("idle_gpus"), list)))
    if module == "gpu_release":  # gpus: null when its last look failed (gpus_before: not in check mode)
        lists = ("released", "survivors")
        return tuple((k, isinstance(r.get(k), list)) for k in lists) + (("gpus", "gpus" in r),)
    if module == "proxmox_gpu_containers":
        lists = ("containers", "running", "skipped_containers", "services_stopped", "shut_down")
        return tuple((k, isinstance(r.get(k), list)) for k in lists) + (("check_mode", isinstance(r.get("check_mode"), bool)),)
    facts = r.get("ansible_facts") if isinstance(r.get("ansible_facts"), dict) else {}
    return (("ansible_facts.gpu_devices", isinstance(facts.get("gpu_devices"), list)),
            ("ansible_facts.gpu_count", isinstance(facts.get("gpu_count"), int)),
            ("ansible_facts.gpu_driver", isinstance(facts.get("gpu_driver"), dict)))


def _busy_in_ready(result):
    """The GPUs that a ready gpu_wait_idle result itself shows busy (never, unless the module is wrong)."""
    idle = result.get("idle_gpus") or []
    return [g.get("index") for g in result.get("gpus") or [] if g.get("idle") is not True or g.get("index") not in idle]


def _not_run(result, module, host):
    """The outcome of a step that gave no result, was skipped or could not reach its host; else None."""
    where = _where(host)
    if not isinstance(result, dict) or not result:
        return _outcome(module, "missing",
                        f"{module} gave no result{where}: its task did not run (the play stopped before it: a failed"
                        f" task or an unreachable host) or its result was lost - {NOTHING_PROVED[module]}. Look at the"
                        " tasks before it, fix what failed and run the play again.")
    if result.get("skipped"):
        why = result.get("false_condition") or result.get("skip_reason") or "skipped"
        return _outcome(module, "skipped",
                        f"{module} was skipped{where} ({why}) - {NOTHING_PROVED[module]}. Run it: do not skip its"
                        " tags (gpuops_wait, gpuops_fence), nor start the play after it (--start-at-task).",
                        skipped=True)
    if result.get("unreachable"):
        said = _last_line(result.get("msg")) or "unreachable"
        return _outcome(module, "unreachable",
                        f"{module} could not run: {host or 'the host it runs on'} could not be reached ({said}) -"
                        f" {NOTHING_PROVED[module]}. Check the connection to it (ansible -m ping) and run the play again.")
    return None


def module_outcome(result, module, host=""):
    """Whether ``result``, the registered result of ``module`` (one of MODULES), is a success.

    Returns {ok, skipped, module, kind, reason}: ok - a success; kind and reason - None, or the kind of the
    failure (the module's own ``error`` when it gives one) and what happened and what to do (a failure's own
    ``msg`` as it is). ``host``: where the module ran, named in the reason. A skipped task is a failure: call it
    only for a step that had to run."""
    if module not in MODULES:
        raise AnsibleError(f"module_outcome: module must be one of {', '.join(MODULES)}, got {module!r}")
    where = _where(host)
    if isinstance(result, dict) and isinstance(result.get("lost_with"), dict):
        # predeploy_host's one module run died in a later step (lost_with: its module and that run's result): this
        # step succeeded on the node, its result died with the run - the answer is that step's crash
        died = result["lost_with"]
        return module_outcome(died.get("result"), died.get("module"), host)
    not_run = _not_run(result, module, host)
    if not_run is not None:
        return not_run
    msg = result.get("msg")
    kind = result.get("error") if isinstance(result.get("error"), str) and result.get("error") else None
    if "module_stdout" in result or "module_stderr" in result or (isinstance(msg, str) and msg.startswith(NO_JSON)):
        return _outcome(module, kind or "crashed", _no_json(result, module, host))
    if _failed(result):
        if msg:
            return _outcome(module, kind or "failed", str(msg))
        if kind:
            return _outcome(module, kind, f"{module} failed{where} ({kind}) without saying why - {NOTHING_PROVED[module]}."
                                          " Run the play again with -vvv to see its whole result.")
        return _outcome(module, "crashed", _unhandled(result, module, host))
    if msg and module in NO_MSG_ON_SUCCESS:
        return _outcome(module, kind or "failed", str(msg))
    missing = [key for key, has in _success_checks(result, module) if not has]
    if missing:
        marked = module == "gpu_wait_idle" and ("ready" in result or "would_wait" in result)
        if msg and not marked:  # a failure that ansible-core did not mark (before 2.19, under failed_when=false)
            return _outcome(module, kind or "failed", str(msg))
        return _outcome(module, "incomplete",
                        f"{module} returned{where} without the keys a success has (no {', '.join(missing)}) -"
                        f" {NOTHING_PROVED[module]}. Run the play again; if it happens again, report it with the"
                        " task's whole result (-v).")
    if module == "gpu_wait_idle" and "would_wait" not in result:
        busy = _busy_in_ready(result)
        if busy:
            return _outcome(module, "inconsistent",
                            f"{module} said ready{where}, but its own result shows GPU {', '.join(map(str, busy))}"
                            " not idle - nothing proves that the GPUs are idle. Run the play again; if it happens"
                            " again, report it with the task's whole result (-v).")
    return _outcome(module)


# --- gpu_idle_result -------------------------------------------------------------------------------------


def _ran(result) -> bool:
    return isinstance(result, dict) and bool(result) and not result.get("skipped")


def _unit_text(entry) -> str:
    unit = entry.get("unit") or "?"
    ct = entry.get("container") if "container" in entry else entry.get("vmid")
    return f"{unit} (CT {ct})" if ct is not None else unit


def _failure(wait, release, fence, release_required, where):
    """The first step that did not prove its part - the fence, the release, the wait - as a module_outcome, or None."""
    if fence.get("error"):
        # the kind of the fence's own failure (unreachable, crashed, scope, ...) when it has one
        kind = (fence.get("failure") or {}).get("kind") or "fence"
        return {"ok": False, "skipped": False, "module": "proxmox_fence", "kind": kind,
                "reason": f"the fence before the wait failed: {fence['error']}"}
    if release_required is None:
        release_required = _ran(release)
    if release_required or _ran(release):
        outcome = module_outcome(release, "gpu_release", host=where)
        if not outcome["ok"]:
            return outcome  # the wait is not run after a failed release: its failure is the answer
    outcome = module_outcome(wait, "gpu_wait_idle", host=where)
    return None if outcome["ok"] else outcome


def _process_line(verb: str, proc: dict) -> str:
    """'released pid 8812 python3 (CT 129, sglang.service, GPU 0, 1; SIGTERM, gone after 1.2 s): <cmdline>'."""
    ct = (proc.get("container") or {}).get("id")
    where = [f"CT {ct}" if ct is not None else None, proc.get("unit")]
    if proc.get("gpus"):
        where.append("GPU " + ", ".join(str(g) for g in proc["gpus"]))
    how = ", ".join(proc.get("signals") or [])
    if proc.get("seconds") is not None:
        how += (", " if how else "") + f"gone after {proc['seconds']:g} s"
    inside = ", ".join(w for w in where if w) + (f"; {how}" if how else "")
    cmd = proc.get("cmdline") or ""
    return cut(f"{verb} pid {proc.get('pid')} {proc.get('name') or '?'}" + (f" ({inside})" if inside else "")
               + (f": {cmd}" if cmd else ""), SHOWN)


def outside_fence(gpus, fence: dict, details=None) -> str:
    # pylint: disable-next=import-outside-toplevel  # the tables' code (and _holding, _snapshot) only where a table is made
    from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import _gpus, describe, holders
    # pylint: disable-next=import-outside-toplevel  # (as the tables' code: the holding model's advice, stop_advice)
    from ansible_collections.gpuops.gpu.plugins.module_utils import _holding

    """One sentence per process that keeps the fenced containers' GPUs busy from outside the fence (another
    container, the node), with its GPUs and its (redacted) command line, and what to do; '' when none."""
    fenced = {str(v) for v in (fence.get("containers") or [])}
    if not fenced:
        return ""
    found = {}
    for gpu in _gpus(gpus, details):
        for h in holders(gpu) if gpu.get("idle") is not True else []:
            ct = (h.get("container") or {}).get("id")
            if h.get("pid") is not None and (ct is None or str(ct) not in fenced):
                found.setdefault(h["pid"], (h, []))[1].append(gpu.get("index"))
    where = "CT " + ", CT ".join(sorted(fenced, key=lambda v: (len(v), v)))
    out = []
    for h, indexes in found.values():
        cmd = f": {cut(h['cmdline'], 200)}" if h.get("cmdline") else ""
        # A container's process: stop it, or fence that container too; the node's own, an MPS server: as it fits.
        ct = (h.get("container") or {}).get("id")
        todo = ("stop it yourself, or fence its container too (a GPU host of its own in the inventory)"
                if ct is not None and not h.get("mps_server") else _holding.stop_advice(h))
        out.append(f"{describe(h, mib=False)} holds GPU {', '.join(str(i) for i in indexes)} and is outside the fence"
                   f" ({where}), so it was not stopped{cmd} - {todo}, before the deploy")
    return "; ".join(out)


def process_lines(fence: dict, release: dict) -> list:
    """Each process the fence and the release acted on or met, once: released, survived, respawned."""
    lines, seen = [], set()
    for verb, key in (("released", "released"), ("SURVIVED", "survivors"), ("RESPAWNED", "respawned")):
        for proc in (fence.get(key) or []) + (release.get(key) or []):
            ident = (proc.get("pid"), proc.get("start_time"))
            if ident not in seen:
                seen.add(ident)
                lines.append(_process_line(verb, proc))
    return lines


def _looks(wait: dict, release: dict, fence: dict) -> tuple:
    """(the GPUs before, the GPUs after): the first look of the step that acted (the release, else the fence's
    release, else the wait), and the last look (the wait's when it ran, else the release's)."""
    if _ran(release) and release.get("gpus_before") is not None:
        before = release["gpus_before"]
    elif fence.get("gpus_before") is not None:
        before = fence["gpus_before"]
    else:
        before = wait.get("gpus_before")
    after = wait.get("gpus") if _ran(wait) else None
    if after is None:
        after = release.get("gpus") if release.get("gpus") is not None else release.get("gpus_before")
    return before, after


def _counted(wait: dict, release: dict, fence: dict) -> tuple:
    """(pids released, pids respawned, what a result in summary left out of those lists - _bound: the modules'
    detail option -, the units stopped) of the fence and the release together."""
    released = [r.get("pid") for r in (fence.get("released") or []) + (release.get("released") or [])]
    respawned = [r.get("pid") for r in (fence.get("respawned") or []) + (release.get("respawned") or [])]
    more = {k: (fence.get("more") or {}).get(k, 0) + _bound.left_out(release, k) for k in ("released", "respawned")}
    units = [_unit_text(u) for u in (fence.get("services_stopped") or []) + (fence.get("stopped_units") or [])
             + (release.get("stopped_units") or [])]
    return released, respawned, {k: v for k, v in more.items() if v}, units


def _holder_details(*looks) -> dict:
    """The device-file holders' details of the steps' looks, each once (_snapshot.compact_result): the latest look's
    win."""
    details = {}
    for look in looks:
        details.update(look.get("holder_processes") or {})
    return details


def _diagnosis(failure, after, fence: dict, details: dict) -> tuple:
    """(error, blockers) of a failure: its reason - after a wait that failed, with what holds the fenced containers'
    GPUs from outside the fence - and one line per GPU the last look shows busy; (None, []) with no failure."""
    # pylint: disable-next=import-outside-toplevel  # (as gpu_idle_result: the tables' code only where it is used)
    from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import gpu_blockers

    if failure is None:
        return None, []
    error = failure["reason"]
    if after is None:
        return error, []
    if failure["module"] == "gpu_wait_idle":
        outside = outside_fence(after, fence, details)
        error = f"{error.rstrip('.')}. {outside[0].upper()}{outside[1:]}." if outside else error
    return error, gpu_blockers(after, holder_processes=details)


def gpu_idle_result(wait, release=None, fence=None, host="", seen_from="", check_mode=False, release_required=None):
    """The role's record of one host (DOCUMENTATION above), put together from the three steps' results; each rule it
    applies is a helper above (_looks, _counted, _failure, _diagnosis, process_lines)."""
    # Imported here, not at the top: module_outcome (proxmox_fence_result's verdict, in a worker of its own per host)
    # needs none of the tables' code, which costs more to import than the rest of this file.
    # pylint: disable-next=import-outside-toplevel
    from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import gpu_table

    wait = wait if isinstance(wait, dict) else {}
    release = release if isinstance(release, dict) else {}
    fence = fence if isinstance(fence, dict) else {}
    released, respawned, more, units = _counted(wait, release, fence)
    before, after = _looks(wait, release, fence)
    would_wait = bool(wait.get("would_wait", False))
    in_check = bool(check_mode) or "would_wait" in wait
    failure = _failure(wait, release, fence, release_required, seen_from or host)
    # What holds the GPUs, from the last look that was taken (never the snapshot before the release).
    details = _holder_details(fence, release, wait)
    error, blockers = _diagnosis(failure, after, fence, details)
    # Ready only when every step proved its part: the wait said ready (in check mode: nothing to wait for).
    ready = failure is None and (not would_wait if in_check else True)
    gpus = after if after is not None else (before or [])
    msg = error if error is not None else (wait.get("msg") or "")
    table = gpu_table(after or [], before=before if before is not None and before is not after else None,
                      holder_processes=details,
                      host=host, seen_from=seen_from if seen_from and seen_from != host else "",
                      title="GPUs" if before is None else "GPUs before -> after")
    out = dict(
        ready=ready,
        elapsed=float(wait.get("elapsed") or 0.0),
        gpus=len(gpus),
        idle_gpus=list(wait.get("idle_gpus") or []),
        released=released,
        respawned=respawned,
        stopped_units=units,
        shut_down=list(fence.get("shut_down") or []),
        check_mode=in_check,
        would_wait=would_wait,
        msg=msg,
        error=error,
        failure={"module": failure["module"], "kind": failure["kind"]} if failure else None,
        blockers=blockers,
        table=table,
        processes=process_lines(fence, release),
    )
    out["summary"] = {k: out[k] for k in ("ready", "elapsed", "gpus", "idle_gpus", "released", "respawned",
                                          "stopped_units", "shut_down", "check_mode", "error", "failure")}
    if more:
        out["more"] = out["summary"]["more"] = more
    return out


# --- proxmox_fence_result --------------------------------------------------------------------------------


# The role variable behind a module option that a message starts with ("containers: ...").
ROLE_VARIABLES = {"containers": "proxmox_fence_containers", "services": "proxmox_fence_services",
                  "shutdown_timeout": "proxmox_fence_shutdown_timeout", "pct": "proxmox_fence_pct",
                  "signal": "proxmox_fence_signal", "grace_period": "proxmox_fence_grace_period",
                  "kill_timeout": "proxmox_fence_kill_timeout", "device_files": "proxmox_fence_device_files"}


def _fence_failure(result, module, host):
    """The module_outcome of a result when it is not a success, its reason as the role says it: a module's own
    msg names the role variable when it is about a module option, else the module; the other reasons (a crash,
    an unreachable node, no result) name the module themselves."""
    outcome = module_outcome(result, module, host=host)
    if outcome["ok"]:
        return None
    msg = result.get("msg") if isinstance(result, dict) else None
    if msg is not None and outcome["reason"] == str(msg):
        option, sep, rest = outcome["reason"].partition(": ")
        reason = f"{ROLE_VARIABLES[option]}: {rest}" if sep and option in ROLE_VARIABLES else f"{module}: {msg}"
        outcome = dict(outcome, reason=reason)
    return outcome


def _summary_parts(containers, release, method, running, services, units, released, more, shut_down, error) -> list:
    """The clauses of the fence's one-line summary: what was fenced, stopped, released or shut down, skipped,
    respawned, and whether it failed."""
    respawned = list(release.get("respawned") or [])
    parts = []
    waited = containers.get("waited_for_lock") or release.get("waited_for_lock")
    if isinstance(waited, dict) and waited.get("text"):  # another run fenced first: what it left is all this one saw
        parts.append(str(waited["text"]))
    if running:
        parts.append("fenced CT " + ", CT ".join(str(v) for v in running) + f" ({method})")
    elif not error:
        parts.append("no running container to fence")
    for s in services:
        parts.append(f"stopped {s['unit']} in CT {s['vmid']}")
    for u in units:
        parts.append(f"stopped {u.get('unit')} in CT {u.get('container')}" if u.get("container") is not None
                     else f"stopped {u.get('unit')}")
    if error and not (running or released or shut_down):
        pass  # it failed before anything ran: the error says it all
    elif method == "processes":
        pids = [r.get("pid") for r in released]
        parts.append(f"released {len(pids) + more.get('released', 0)} process(es)" + (
            f" (pid {', '.join(map(str, pids))}" + (f", +{more['released']} more" if more.get("released") else "") + ")"
            if pids else ""))
    else:
        parts.append(f"shut down {len(shut_down)} container(s)")
    for s in containers.get("skipped_containers") or []:
        parts.append(f"skipped CT {s.get('vmid')} ({s.get('reason')})")
    if respawned:
        parts.append("RESPAWNED pid " + ", ".join(str(r.get("pid")) for r in respawned)
                     + " - a supervisor restarts the work: its unit was not stopped (see respawned[].advice)")
    gpu_errors = list(release.get("gpu_errors") or [])
    for e in gpu_errors:
        parts.append(f"GPU {e.get('index')} not fenced (not the containers'; its process list could not be read)")
    if error:
        parts.append("failed (the error follows)")  # said once, by the role's last task
    return parts


def proxmox_fence_result(containers, release=None, method="processes", check_mode=False, host=""):
    failure = _fence_failure(containers, "proxmox_gpu_containers", host)
    containers = containers if isinstance(containers, dict) else {}
    if release is None:
        release = containers.get("release")
    release = release if isinstance(release, dict) else {}
    running = list(containers.get("running") or [])
    rows = [c for c in containers.get("containers") or [] if c.get("vmid") in running]
    per_ct = {c["vmid"]: c.get("gpus") for c in rows}
    union = _mig.wait_cover(containers)
    services = [{"vmid": s.get("vmid"), "unit": s.get("unit")} for s in containers.get("services_stopped") or []]
    released = list(release.get("released") or [])
    respawned = list(release.get("respawned") or [])
    # What a result in summary left out of its lists (_bound: the module's detail option), counted, never lost.
    more = {k: _bound.left_out(release, k) or _bound.left_out(containers, f"release.{k}") for k in ("released", "respawned")}
    more = {k: v for k, v in more.items() if v}
    units = list(release.get("stopped_units") or [])
    shut_down = list(containers.get("shut_down") or [])
    in_check = bool(containers.get("check_mode", check_mode))
    # The release must have run when the containers were found and some run (method processes); when it ran
    # anyway (after a service that would not stop), its result is judged too.
    if failure is None and ((method == "processes" and running) or _ran(release)):
        failure = _fence_failure(release, "gpu_release", host)
    error = failure["reason"] if failure else None
    changed = bool(containers.get("changed")) or bool(release.get("changed"))

    parts = _summary_parts(containers, release, method, running, services, units, released, more, shut_down, error)
    summary = ("Check mode, nothing was stopped - would have: " if in_check else "") + "; ".join(parts) \
        + f"; changed={changed}"
    stats = {"containers": running, "services_stopped": services, "released": [r.get("pid") for r in released],
             "stopped_units": [{"unit": u.get("unit"), "container": u.get("container")} for u in units],
             "shut_down": shut_down, "changed": changed, "check_mode": in_check, "error": error,
             "failure": {"module": failure["module"], "kind": failure["kind"]} if failure else None}
    if more:
        stats["more"] = more
    return dict(method=method, containers=running, skipped=list(containers.get("skipped_containers") or []), gpus=per_ct,
                gpus_from={c["vmid"]: c.get("gpus_from", "config") for c in rows}, container_gpus=union,
                services_stopped=services, released=released, respawned=respawned,
                stopped_units=units, shut_down=shut_down, gpus_before=release.get("gpus_before"),
                holder_processes=release.get("holder_processes") or {}, quiet_since=release.get("quiet_since"),
                left_holders=list(release.get("left_holders") or []), gpu_errors=list(release.get("gpu_errors") or []), changed=changed,
                check_mode=in_check, error=error, failure=stats["failure"], summary=summary, stats=stats, more=more)


# --- for the action plugin predeploy_host: the verdict of a release, bounded lines, the play's artifacts -------

# No line printed at the default verbosity is longer than LINE (_redact.line). A failure's message, as Ansible prints
# it: in the fail task's `fatal: [HOST]: FAILED! => {"changed": false, "msg": "..."}` (a JSON string: a quote, a
# backslash or a control character takes two characters or more) and in ansible-core 2.19+'s `[ERROR]: Task failed:
# Action failed: ...`. At most MESSAGE characters so printed keeps both lines under LINE for a host name of up to 140
# characters.
MESSAGE = LINE - 200
# With -v the task prints the processes the fence and the release acted on: at most this many lines (a line of about
# 300 characters each: with a table of 8 GPUs and a failure's message, -v stays under 15 KB); every one with -vv.
PROCESS_LINES = 8


def release_proved(release, host="") -> bool:
    """Whether a release's result proves its part (the wait runs only after one that does)."""
    return module_outcome(release, "gpu_release", host=host)["ok"]


def printed(record: dict, verbosity: int) -> list:
    """The lines the task prints for a host (gpu_idle_result's ``record``): its table; with -v the processes the fence
    and the release acted on, at most PROCESS_LINES and a count of the others (every one with -vv; all of them are in
    the record's ``processes``)."""
    lines = list(record["table"])
    if verbosity >= 1:
        processes = record["processes"]
        shown = processes if verbosity >= 2 else processes[:PROCESS_LINES]
        lines += shown
        if len(shown) < len(processes):
            lines.append(f"+{len(processes) - len(shown)} more process(es): every one with -vv, and in"
                         " gpu_idle_result.processes")
    return [line(text) for text in lines]


def printed_length(text: str) -> int:
    """How many characters ``text`` takes in a result as Ansible prints it (a JSON string, less its quotes)."""
    return len(json.dumps(text, ensure_ascii=False)) - 2


def fit_message(whole: str, tail: str) -> str:
    """``whole`` when it prints in at most MESSAGE characters (printed_length), else as much of its start as fits
    with ``tail`` (what says where the whole is) after it."""
    if printed_length(whole) <= MESSAGE:
        return whole
    head = whole[:max(MESSAGE - printed_length(tail), 0)]
    while head and printed_length(head + tail) > MESSAGE:
        head = head[:len(head) - (printed_length(head + tail) - MESSAGE)]
    return head + tail


def message(record: dict) -> str:
    """A failure's message: the diagnosis, then one clause per busy GPU (the whole of both is in the record)."""
    blockers = record.get("blockers") or []
    return record["error"] + (" Busy: " + "; ".join(blockers) if blockers else "")


NO_RESULT = ("no result: its task did not run or did not finish (a failure before it, the run stopped early by"
             " max_fail_percentage or an interrupt, or a later batch of a rolling run not run yet) - nothing proves"
             " that its GPUs are idle")


def host_answer(record) -> dict:
    """A host's entry in the result file and the per-job artifact: ready, the reason, the blockers, elapsed."""
    if not isinstance(record, dict) or "ready" not in record:
        return {"ready": False, "reason": NO_RESULT, "failure": {"module": None, "kind": "missing"}, "blockers": [],
                "elapsed": None}
    return {"ready": record["ready"] is True, "reason": record.get("error"), "failure": record.get("failure"),
            "blockers": list(record.get("blockers") or []), "elapsed": record.get("elapsed"),
            "check_mode": bool(record.get("check_mode"))}


def artifacts(answers: dict, summaries: dict, fences: dict, job_id=None) -> dict:
    """The play's set_stats data: ``answers`` (host_answer of every host of the play), ``summaries`` (the
    gpu_idle_result summary of each host that has one) and ``fences`` (the proxmox_fence_result stats of each host
    fenced in this run, the nodes fenced on their own too).

    gpu_idle_ready is true only when every host of the play has a ready result. Under AWX job slicing each slice is
    a job whose artifacts a workflow merges with dict.update, the last finished winning: gpu_idle_ready and
    gpu_idle_summary are then the last slice's, and the key gpu_idle_job_<awx_job_id> (one per job) keeps each
    slice's answer whatever finishes after it."""
    ready = bool(answers) and all(a["ready"] for a in answers.values())
    elapsed = [a["elapsed"] for a in answers.values() if a["elapsed"] is not None]
    data = {"gpu_idle_ready": ready, "gpu_idle_elapsed": max(elapsed) if elapsed else 0.0,
            "gpu_idle_summary": dict(summaries), "proxmox_fence_summary": dict(fences)}
    if job_id is not None:
        data[f"gpu_idle_job_{job_id}"] = {"ready": ready, "hosts": len(answers),
                                          "not_ready": {h: a["reason"] for h, a in answers.items() if not a["ready"]}}
    return data
