# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""Will the next server start here: the health checks, the fit, and the Xid events of the kernel log.

Pure, table-driven logic (the kernel log is read by _host.kernel_log). The backends (_host.nvml, _smi) fill the
raw fields of each GPU; this file judges them:

- ``CHECKS``: each health check, the field it reads, the NVML call and the nvidia-smi field behind
  it, the driver branches where it exists, whether it blocks a wait by default, and what to do.
- ``fit``: whether the free memory of a GPU is enough for the next server (``min_free_mib``,
  ``min_free_pct`` of the total: the larger of the two).
- ``XID``: the Xid codes of NVIDIA's Xid catalog (cited above XID_ACTIONS) with the catalog's immediate action each, whether
  that action blocks (``xid_needs_action``), and the parser of the kernel log's Xid lines.

A field a driver or GPU cannot give is None (and listed in the GPU's ``unsupported``): its check
passes, never fails, and never raises.
"""

from __future__ import annotations

import math
import re

# The fields the backends fill (None where unsupported), with the name listed in ``unsupported``.
HEALTH_FIELDS = {
    "remapped_rows": "remapped_rows",              # {corrected, uncorrected, pending, failure}
    "retired_pages_pending": "retired_pages",      # bool
    "ecc_uncorrected_volatile": "ecc",             # int, since the driver loaded
    "fabric": "fabric",                            # {state, status}
    "clock_event_reasons": "clock_event_reasons",  # [names of the active reasons]
    "inforom_corrupt": "inforom",                  # bool: the infoROM's checksums do not verify
}

# nvmlGpuFabricState_t (nvml.h NVML_GPU_FABRIC_STATE_*), as nvidia-smi prints them (fabric.state).
FABRIC_STATES = {0: "Not Supported", 1: "Not Started", 2: "In Progress", 3: "Completed"}
FABRIC_COMPLETED = "Completed"
FABRIC_NONE = "Not Supported"

# nvmlClocksEventReason* (nvml.h; the older nvmlClocksThrottleReason* have the same bits).
CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"), (0x100, "display_clock_setting"),
)
# The reasons that mean the hardware slows the GPU down (not a setting, not idleness).
HW_SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
# A GPU this busy with no process on it has latched its utilization (Blackwell, after a kill mid-kernel).
LATCHED_UTILIZATION_PCT = 90


def clock_reason_names(mask) -> list:
    """0x48 -> ['hw_slowdown', 'hw_thermal_slowdown']; None stays None."""
    if mask is None:
        return None
    return [name for bit, name in CLOCK_EVENT_REASONS if int(mask) & bit]


def hw_slowdown(gpu: dict):
    """The active hardware-slowdown reasons of a GPU ([] when none), or None when they cannot be read."""
    reasons = gpu.get("clock_event_reasons")
    if reasons is None:
        return None
    return [r for r in reasons if r in HW_SLOWDOWN_REASONS]


def utilization_latched(gpu: dict):
    """True when the GPU reports LATCHED_UTILIZATION_PCT % or more with no process on it; None when
    the utilization or the process list cannot be read."""
    util = (gpu.get("utilization") or {}).get("gpu")
    if util is None or gpu.get("processes_error"):
        return None
    return util >= LATCHED_UTILIZATION_PCT and not gpu.get("processes")


# --- the checks -------------------------------------------------------------------------------

def _remap_pending(gpu):
    rows = gpu.get("remapped_rows")
    if rows and rows.get("pending"):
        return ("a row remap is pending (uncorrectable errors on "
                f"{rows.get('uncorrected')} row(s), {rows.get('corrected')} corrected)")
    return ""


def _remap_failure(gpu):
    rows = gpu.get("remapped_rows")
    if rows and rows.get("failure"):
        return "row remapping failed (the GPU ran out of spare rows or could not remap one)"
    return ""


def _retired_pending(gpu):
    return "memory pages are pending retirement" if gpu.get("retired_pages_pending") else ""


def _fabric(gpu):
    fabric = gpu.get("fabric")
    if not fabric or fabric.get("state") in (None, FABRIC_NONE):
        return ""  # no NVSwitch fabric here (a PCIe card, a single GPU, a driver without the query)
    if fabric["state"] != FABRIC_COMPLETED:
        return (f"its fabric state is {fabric['state']}, not Completed: every CUDA program fails with error 802"
                " (system not yet initialized) until the fabric manager has registered the GPU")
    status = fabric.get("status")
    if status not in (None, "Success"):
        return f"its fabric registration Completed with status {status}"
    return ""


def _ecc(gpu):
    count = gpu.get("ecc_uncorrected_volatile")
    if count:
        return f"{count} uncorrectable ECC error(s) since the driver loaded"
    return ""


def _hw_slowdown(gpu):
    reasons = hw_slowdown(gpu)
    if reasons:
        return "the hardware slows its clocks down (" + ", ".join(reasons) + ")"
    return ""


def _latched(gpu):
    if utilization_latched(gpu):
        return (f"{(gpu.get('utilization') or {}).get('gpu')}% utilization with no process on it (a utilization"
                " latched after a process was killed mid-kernel)")
    return ""


def _inforom(gpu):
    if gpu.get("inforom_corrupt"):
        return ("its infoROM is corrupted (nvidia-smi exits 14 and prints WARNING: infoROM is corrupted): the GPU runs,"
                " but the ECC counts, retired pages and settings it keeps there may not be recorded")
    return ""


def _mig_pending(gpu):
    current, pending = gpu.get("mig_mode"), gpu.get("mig_mode_pending")
    if current is None or pending is None or bool(current) == bool(pending):
        return ""
    state = "on" if pending else "off"
    return (f"a MIG mode change is pending (MIG is {'on' if current else 'off'}, {state} after a reset): a GPU reset"
            " or a reboot applies it, and with it the GPU's MIG devices change")


def _xid(gpu):
    bad = [e for e in gpu.get("xid_events") or [] if xid_needs_action(e["xid"], e.get("message", ""))]
    if bad:
        last = bad[-1]
        _mnemonic, meaning, bucket, action = XID[last["xid"]]
        return (f"Xid {last['xid']} ({meaning}; NVIDIA's Xid catalog: {bucket}, {action}) in the kernel log since"
                " boot") + (f", and {len(bad) - 1} more" if len(bad) > 1 else "")
    return ""


# name: (the test, what to do ({index} is the GPU), blocking by default, NVML call, nvidia-smi
#        field(s), driver branches and GPUs where the data exists)
CHECKS = {
    "row_remap_pending": (
        _remap_pending,
        "reset the GPU once nothing holds it (nvidia-smi -r -i {index}) to apply the remap",
        True, "nvmlDeviceGetRemappedRows (pending)", "remapped_rows.pending",
        "R450 and later, Ampere and later GPUs (A100, H100, H200, B200); null before"),
    "row_remap_failure": (
        _remap_failure,
        "drain the GPU (no new work) and RMA it",
        True, "nvmlDeviceGetRemappedRows (failure)", "remapped_rows.failure",
        "R450 and later, Ampere and later GPUs"),
    "retired_pages_pending": (
        _retired_pending,
        "reset the GPU once nothing holds it (nvidia-smi -r -i {index}), or reboot, to retire the pages",
        True, "nvmlDeviceGetRetiredPagesPendingStatus", "retired_pages.pending",
        "every branch, Kepler to Volta GPUs with ECC (Ampere and later remap rows instead: null)"),
    "fabric": (
        _fabric,
        "start the fabric manager (systemctl start nvidia-fabricmanager) and wait until the GPU's fabric state is"
        " Completed (if it does not get there, restart it and read journalctl -u nvidia-fabricmanager)",
        True, "nvmlDeviceGetGpuFabricInfoV (R550+), else nvmlDeviceGetGpuFabricInfo (R525+)",
        "fabric.state, fabric.status",
        "R525 and later, NVSwitch systems (HGX H100/H200/B200); Not Supported elsewhere"),
    "ecc_uncorrectable": (
        _ecc,
        "drain the GPU and read nvidia-smi -q -d ECC,ROW_REMAPPER -i {index} (a reset clears the count, RMA the GPU"
        " if the errors come back)",
        True, "nvmlDeviceGetTotalEccErrors (uncorrected, volatile)", "ecc.errors.uncorrected.volatile.total",
        "every branch, GPUs with ECC memory on"),
    "hw_slowdown": (
        _hw_slowdown,
        "check the cooling and the power supply of the GPU (nvidia-smi -q -d PERFORMANCE -i {index})",
        False, "nvmlDeviceGetCurrentClocksEventReasons (R535+), else nvmlDeviceGetCurrentClocksThrottleReasons",
        "clocks_event_reasons.active (clocks_throttle_reasons.active before R535)", "every branch"),
    "utilization_latched": (
        _latched,
        "reset the GPU once nothing holds it (nvidia-smi -r -i {index})",
        False, "nvmlDeviceGetUtilizationRates with no process listed", "utilization.gpu", "every branch"),
    "inforom": (
        _inforom,
        "read nvidia-smi -q -i {index} (Inforom Version) and ask the vendor to reflash the infoROM or RMA the GPU;"
        " list inforom in health_checks to hold the GPU back until then",
        False, "nvmlDeviceValidateInforom (NVML_ERROR_CORRUPTED_INFOROM)",
        "the WARNING line of any query (exit 14)", "every branch, GPUs with an infoROM"),
    "mig_mode_pending": (
        _mig_pending,
        "reset the GPU once nothing holds it (nvidia-smi -r -i {index}), or reboot, to apply the MIG mode (or set it"
        " back with nvidia-smi -i {index} -mig 0|1)",
        False, "nvmlDeviceGetMigMode (current, pending)", "mig.mode.current, mig.mode.pending",
        "R450 and later, MIG-capable GPUs (A100, A30, H100, H200, B200); null before"),
    "xid": (
        _xid,
        "read the kernel log (dmesg | grep Xid) and do what the Xid needs: a reset, a reboot, an RMA",
        False, "the kernel log (/dev/kmsg or dmesg), not NVML", "none", "every branch (root on the node)"),
}
CHECK_NAMES = tuple(CHECKS)
DEFAULT_CHECKS = tuple(name for name, spec in CHECKS.items() if spec[2])


def failed_checks(gpu: dict, blocking=()) -> list:
    """Every check that fails on a GPU: [{check, detail, action, blocking}], in CHECKS order;
    ``blocking``: the check is one of ``blocking`` (a wait does not call the GPU ready)."""
    out = []
    blocking = set(blocking or ())
    for name, (test, action, _default, _call, _field, _where) in CHECKS.items():
        detail = test(gpu)
        if detail:
            out.append({"check": name, "detail": detail, "action": action.format(index=gpu.get("index")),
                        "blocking": name in blocking})
    return out


# --- fit ----------------------------------------------------------------------------------------

def memory_source(gpu: dict, backend=None):
    """Which query the memory figures of a GPU came from (None when it reports no memory)."""
    mem = gpu.get("memory") or {}
    if mem.get("free") is None:
        return None
    if backend == "nvidia-smi":
        return "nvidia-smi memory.free"
    if mem.get("used_includes_reserved"):
        return "nvmlDeviceGetMemoryInfo (v1: used includes the reserved memory)"
    return "nvmlDeviceGetMemoryInfo_v2 (used excludes the reserved memory)"


def fit(gpu: dict, min_free_mib=None, min_free_pct=None, backend=None):
    """Whether the next server fits on a GPU: {free_mib, need_mib, fits, memory}, or None when neither
    option is set. ``need_mib`` is the larger of ``min_free_mib`` and ``min_free_pct`` % of the total
    (rounded up, as a server computes its share of the total); ``fits`` is None when the driver reports no
    memory (a unified-memory GPU such as the GB10). ``memory`` says which figure was read: free memory is
    the same with both NVML queries (total - reserved - used with _v2, total - used with v1, whose used
    includes the reserved memory), and nvidia-smi's memory.free."""
    if min_free_mib is None and min_free_pct is None:
        return None
    mem = gpu.get("memory") or {}
    total, free = mem.get("total"), mem.get("free")
    need = int(min_free_mib or 0)
    if min_free_pct is not None:
        if total is None:
            need = None if not min_free_mib else need
        else:
            need = max(need, int(math.ceil(total * float(min_free_pct) / 100.0 - 1e-9)))
    fits = None if free is None or need is None else free >= need
    return {"free_mib": free, "need_mib": need, "fits": fits, "memory": memory_source(gpu, backend)}


def fit_text(gpu: dict, result: dict) -> str:
    """Why the next server does not fit ('' when it fits or cannot be told)."""
    if not result or result["fits"] is not False:
        return ""
    return (f"{result['free_mib']} MiB free, less than the {result['need_mib']} MiB the next server needs"
            " (min_free_mib / min_free_pct)")


# --- Xid events -----------------------------------------------------------------------------------

# The Xid table comes from NVIDIA's Xid catalog for Ampere and newer GPUs: "Analyzing Xid Errors with the Xid Catalog",
# https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (its spreadsheet: docs.nvidia.com/Xid-Catalog.xlsx).
# The page carries no version number; the text read (2026-12-04) lists Xid 1-172, its newest rows gated on
# "CUDA 12.9; GPU driver R575". Each code keeps the catalog's mnemonic and its "Resolution Bucket (Immediate Action)",
# the action "immediately needed in order to recover the system and get it back into service".

# The catalog's immediate actions, and whether the GPU must not take work until someone acts (the check ``xid``):
# a reset, a reboot, a site check or a vendor's look blocks; restarting the application or nothing does not.
XID_ACTIONS = {
    "RESET_GPU": True, "RESTART_BM": True, "RESTART_VM": True, "CHECK_MECHANICALS": True, "CONTACT_SUPPORT": True,
    # WORKFLOW_XID_48 (Xid 48) and WORKFLOW_NVLINK_ERR (Xid 74): the catalog's trigger text of both says "A GPU reset
    # or node reboot is needed to clear this error"; WORKFLOW_NVLINK5_ERR (Xid 144-150) is the NVLink5 form of it.
    "WORKFLOW_XID_48": True, "WORKFLOW_NVLINK_ERR": True, "WORKFLOW_NVLINK5_ERR": True,
    "RESTART_APP": False, "IGNORE": False,
    # Xid 45: "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)" - the application was torn down (Ctrl-C, a
    # kill, a reset); the Xid logged with it says what the GPU needs.
    "WORKFLOW_XID_45": False,
    # Xid 154 "summarizes the recovery action required for other Xids": judged by the action it names (xid_needs_action).
    "XID_154": None,
}

# code: (mnemonic, meaning, the catalog's immediate action, what to do). An "Unused" code (the catalog: applies to
# none of A100/H100/B100/GB200, "N/A; Unused") is kept, described as such: Volta and older have their own catalog.
XID = {
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "graphics engine exception (an out-of-bounds access, an illegal instruction)",
         "RESTART_APP", "restart the application; it is usually the application's fault (run it under compute-sanitizer)"),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault (an illegal memory access)",
         "RESTART_APP", "restart the application; it is usually the application's fault (run it under compute-sanitizer)"),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing (an application's software-induced fault)",
         "IGNORE", "nothing for the GPU: it remains healthy, the application faulted"),
    45: ("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "preemptive cleanup (an application torn down: Ctrl-C, a kill, a reset)",
         "WORKFLOW_XID_45", "nothing by itself; follow the Xid logged with it"),
    46: ("ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "RESET_GPU", "reset the GPU"),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "double-bit ECC error (an uncorrectable memory error)", "WORKFLOW_XID_48",
         "reset the GPU or reboot the node to clear it; if the SRAM threshold is exceeded, run field diagnostics (RMA)"),
    61: ("PMU_BREAKPOINT", "internal micro-controller breakpoint (the catalog: Unused on Ampere and newer)",
         "CONTACT_SUPPORT", "nothing on Ampere and newer (no GPU of theirs logs it); on older GPUs see NVIDIA's archived"
         " Xid catalog"),
    62: ("PMU_HALT_ERROR", "internal micro-controller halt", "RESET_GPU", "reset the GPU; contact support if it comes back"),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event (a row remap or page retirement recorded)", "IGNORE",
         "nothing for the Xid; a remap or retirement pending a reset is the row_remap_pending / retired_pages_pending check"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU",
         "reset the GPU; contact support if it comes back"),
    74: ("NVLINK_ERROR", "NVLink error", "WORKFLOW_NVLINK_ERR",
         "reset the GPU or reboot the node to clear it (nvidia-smi nvlink for the links); if it stays, contact the vendor"),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM",
         "drain the node and reboot it; check power, cooling and the PCIe slot"),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "high single-bit ECC error rate", "IGNORE",
         "nothing now (corrected errors); contact support if it persists"),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "contained memory error (one application stopped, the others unaffected)",
         "RESTART_APP", "restart the application; reset the GPU when convenient"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "uncontained memory error (every application on the GPU is affected)",
         "RESET_GPU", "reset the GPU before applications restart"),
    109: ("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "context switch timeout", "RESET_GPU", "reset the GPU"),
    110: ("SEC_FAULT_ERROR", "security fault", "RESET_GPU",
          "revert recent hardware changes and cold-reset the system; contact the vendor if it stays"),
    119: ("GSP_RPC_TIMEOUT", "GSP RPC timeout (the GPU System Processor did not answer)", "RESET_GPU",
          "reset the GPU; power-cycle the node if it persists"),
    120: ("GSP_ERROR", "GSP error", "RESET_GPU", "reset the GPU; power-cycle the node if it persists"),
    136: ("ALI_TRAINING_FAIL", "NVLink link training failed", "RESET_GPU", "reset the GPU; investigate the link"),
    137: ("NVLINK_PRIV_ERR", "NVLink privilege error (an illegal peer-to-peer access)", "IGNORE",
          "nothing for the GPU: usually the application's fault"),
    140: ("UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC unrecovered error (pages could not be offlined or rows remapped)",
          "RESET_GPU", "reset the GPU; contact the vendor if it persists"),
    143: ("GPU_INIT_ERROR", "GPU initialization error", "RESET_GPU", "reset the GPU; contact support if it comes back"),
    154: ("GPU_RECOVERY_ACTION_CHANGED", "GPU recovery action changed (the action the other Xids need)", "XID_154",
          "do the recovery action it names (None, Drain P2P, Drain and Reset, GPU Reset Required, Node Reboot Required)"),
    155: ("NVLINK_SW_DEFINED_ERROR", "NVLink software-defined error (a link taken down intentionally)", "RESET_GPU",
          "reset the GPU"),
    156: ("RESOURCE_RETIREMENT_EVENT", "resource retirement event", "RESET_GPU", "reset the GPU to apply the retirement"),
    157: ("RESOURCE_RETIREMENT_FAILURE", "resource retirement failure (no spare resources left)", "IGNORE",
          "nothing now: work may run and may meet the same Xid again; contact support"),
    158: ("GPU_FATAL_TIMEOUT", "GPU fatal timeout", "RESET_GPU", "reset the GPU; contact support if it comes back"),
}
# The codes the catalog calls "Unused" (description Unused, applies to none of A100/H100/B100/GB200; its action column
# CONTACT_SUPPORT with "N/A; Unused"): no Ampere or newer GPU logs them, so they never block.
XID_UNUSED = frozenset((61,))
# Xid 154's text: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)".
_XID_154_TO = re.compile(r"\bto\s+0x[0-9a-fA-F]+\s*\(([^)]*)\)")


def xid_needs_action(code: int, message: str = "") -> bool:
    """Whether an Xid keeps the GPU from taking work until someone acts (the check ``xid``): from the catalog's
    immediate action (XID_ACTIONS); Xid 154 by the recovery action its message names (None: no), an Xid the
    table does not hold never (its event says to look it up)."""
    entry = XID.get(code)
    if entry is None or code in XID_UNUSED:
        return False
    blocks = XID_ACTIONS[entry[2]]
    if blocks is None:  # Xid 154
        m = _XID_154_TO.search(message or "")
        return m is None or m.group(1).strip().lower() != "none"
    return blocks


# The codes whose catalog action blocks (Xid 154 by its message, above).
XID_NEEDS_ACTION = tuple(sorted(c for c, e in XID.items() if XID_ACTIONS[e[2]] and c not in XID_UNUSED))
MAX_XID_EVENTS = 20

# "NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=..., GPU has fallen off the bus."
_XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.\d)?\): (\d+),\s*(.*)$")
# /dev/kmsg records: "6,1234,5678901,-;message"; dmesg: "[ 5678.901234] message".
_KMSG = re.compile(r"^\d+,\d+,(\d+),[^;]*;(.*)$")
_DMESG = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")


def bus_key(domain, bus, device) -> str:
    """The key Xid lines and GPUs are matched on: '00000000:18:00'."""
    return f"{int(str(domain), 16):08X}:{int(str(bus), 16):02X}:{int(str(device), 16):02X}"


def gpu_bus_key(pci_bus_id):
    """'00000000:18:00.0' -> '00000000:18:00'; None when there is no bus id."""
    m = re.match(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})", pci_bus_id or "")
    return bus_key(*m.groups()) if m else None


def parse_xid_events(text: str) -> list:
    """The Xid events of a kernel log (the records of /dev/kmsg, or dmesg's lines):
    [{bus, xid, meaning, action, seconds (since boot, or None), message}] in log order."""
    events = []
    for line in text.splitlines():
        line = line.rstrip("\n")
        seconds = None
        m = _KMSG.match(line)
        if m:
            seconds, line = int(m.group(1)) / 1e6, m.group(2)
        else:
            m = _DMESG.match(line)
            if m:
                seconds, line = float(m.group(1)), m.group(2)
        x = _XID_LINE.search(line)
        if not x:
            continue
        code = int(x.group(4))
        _mnemonic, meaning, bucket, action = XID.get(code, (
            None, "an Xid this collection does not describe", None,
            "look it up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)"))
        events.append({"bus": bus_key(x.group(1), x.group(2), x.group(3)), "xid": code, "meaning": meaning,
                       "action": action, "catalog_action": bucket, "needs_action": xid_needs_action(code, x.group(5)),
                       "seconds": None if seconds is None else round(seconds, 6), "message": x.group(5)[:300]})
    return events


def xid_events_of(gpu: dict, events: list) -> list:
    """The events of one GPU (by its PCI bus id), the last MAX_XID_EVENTS of them."""
    key = gpu_bus_key(gpu.get("pci_bus_id"))
    mine = [dict(e) for e in events if key is not None and e["bus"] == key]
    for e in mine:
        e.pop("bus", None)
    return mine[-MAX_XID_EVENTS:]


def kernel_log_summary(log: dict, events=None) -> dict:
    """What gpu_facts reports of the kernel log: {source, readable, problem, xid_events}."""
    readable = log.get("text") is not None
    problem = log.get("problem")
    if not readable:
        problem = (f"the kernel log could not be read ({problem}): Xid events are not reported; run as root on the"
                   " node (not in a container) to read them")
    return {"source": log.get("source"), "readable": readable, "problem": problem,
            "xid_events": None if events is None else len(events)}
