"""``nvidia-smi`` for the simulated host.

It reads the host only through the simulated ``libnvidia-ml.so.1`` (loaded by absolute path with
ctypes, with NVML's real struct layouts), exactly as the real tool reads a real host through the
real library. It does not use pynvml, so it runs where pynvml is not installed.

Formats follow the R580 driver (580.159.03); what the library gives follows the scenario's driver
profile (gpusimkit/profiles.py), as the real tool of each branch reads its own library: the version
strings come from the library, the processes from ``_v3`` read with the entry size that branch's
library writes (the scenario's ``process_v3_entry_bytes``: 24, or 32 on early R535), else from
``_v2``, else from the unversioned query, and memory from ``nvmlDeviceGetMemoryInfo_v2``, else v1
(``[N/A]`` in CSV and ``Not Supported`` in the table where neither answers, as on a GB10):

- ``--query-gpu=`` / ``--query-compute-apps=`` with ``--format=csv[,noheader][,nounits]``;
  fields separated by ", ", units in the header (``memory.used [MiB]``) and in the values
  (``81920 MiB``); ``[N/A]`` for values the library does not support.
- ``-L``, ``-i``/``--id`` (index, comma list, UUID, PCI bus id or serial).
- the default table, including the Processes section.
- ``-q``/``--query`` with ``-x``/``--xml-format``: the XML log (``nvsmi_device_v12.dtd``), a subset
  of the real elements in the real order; without ``-x`` the same subset as the real text layout.
- the real tool's messages and exit codes for init failures (9, 12, 18, 4), GPUs that cannot be
  opened (15 lost, 255 unknown error), and no devices (6).

The pure parts (argument parsing, value formatting, the table) work on plain data so that tests
can check them without the library: see ``format_value``, ``render_csv``, ``render_table``.

Entry point: ``main(argv, simdir) -> int`` (``argv`` without the program name).
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import os
import re
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union
from xml.sax.saxutils import escape as _xml_escape
from xml.sax.saxutils import quoteattr as _xml_quoteattr

from . import profiles

# --- NVML constants ---------------------------------------------------------

SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_CORRUPTED_INFOROM = 14
ERROR_GPU_IS_LOST = 15
ERROR_LIB_RM_VERSION_MISMATCH = 18
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_UNKNOWN = 999

VALUE_NOT_AVAILABLE = 2**64 - 1
NO_INSTANCE_ID = 0xFFFFFFFF
MIB = 1048576
NVML_MEMORY_V2 = 0x02000028  # sizeof(nvmlMemory_v2_t) | 2 << 24

# The wording nvidia-smi uses for NVML return codes (the real tool prints its own strings for
# these; for any other code it asks the library).
ERROR_TEXT = {
    ERROR_UNINITIALIZED: "Uninitialized",
    ERROR_INVALID_ARGUMENT: "Invalid Argument",
    ERROR_NOT_SUPPORTED: "Not Supported",
    ERROR_NO_PERMISSION: "Insufficient Permissions",
    ERROR_NOT_FOUND: "Not Found",
    ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    ERROR_GPU_IS_LOST: "GPU is lost",
    ERROR_LIB_RM_VERSION_MISMATCH: "Driver/library version mismatch",
    ERROR_UNKNOWN: "Unknown Error",
}

# --- messages (verbatim from the real tool) --------------------------------

HELP_HINT = "Please run 'nvidia-smi -h' for help."
MSG_LIB_NOT_FOUND = (
    "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the "
    "NVIDIA Display Driver is properly installed and present in your system.\n"
    "Please also try adding directory that contains libnvidia-ml.so to your system PATH.\n"
)
MSG_DRIVER_NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
    "the latest NVIDIA driver is installed and running.\n"
)
MSG_NO_DEVICES = "No devices were found\n"
MSG_LOST_SUFFIX = "GPU is lost.  Reboot the system to recover this GPU"

EXIT_OK = 0
EXIT_BAD_ARGS = 2
EXIT_NOT_FOUND = 6
EXIT_INFOROM_CORRUPTED = 14  # "infoROM is corrupted" (nvidia-smi(1) RETURN VALUE)

USAGE = """\
NVIDIA System Management Interface -- v{version}

NVSMI provides monitoring information for Tesla and select Quadro devices.
The data is presented in either a plain text or an XML format, via stdout or a file.
(This is the gpusim stand-in: only the options below are implemented.)

nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.
          --version             Print version information and exit.

  LIST OPTIONS:

    -L,   --list-gpus           Display a list of GPUs connected to the system.

  SUMMARY OPTIONS:

    <no arguments>              Show a summary of GPUs connected to the system.
    -i,   --id=                 Target a specific GPU.

  SELECTIVE QUERY OPTIONS:

    Allows the caller to pass an explicit list of properties to query.

    [one of]

    --query-gpu                 Information about GPU.
                                Call --help-query-gpu for more info.
    --query-compute-apps        List of currently active compute processes.
                                Call --help-query-compute-apps for more info.

    [mandatory]

    --format=                   Comma separated list of format options:
                                  csv - comma separated values (MANDATORY)
                                  noheader - skip the first line with column headers
                                  nounits - don't print units for numerical values

  QUERY OPTIONS:

    -q,   --query               Display GPU info.

    [plus any of]

    -i,   --id=                 Target a specific GPU.
    -x,   --xml-format          Produce XML output.
"""


class Err:
    """An NVML error in place of a value (``code``: the NVML return code)."""

    __slots__ = ("code", "text")

    def __init__(self, code: int, text: str = ""):
        self.code = code
        self.text = text or ERROR_TEXT.get(code, f"Unknown Error ({code})")

    def __eq__(self, other):
        return isinstance(other, Err) and other.code == self.code

    def __hash__(self):
        return hash(self.code)

    def __repr__(self):
        return f"Err({self.code}, {self.text!r})"


NA = Err(ERROR_NOT_SUPPORTED)


def is_err(v) -> bool:
    return v is None or isinstance(v, Err)


# --- query fields -------------------------------------------------------------
#
# Each field: canonical name (what the header shows), unit (None: no unit), and how to get the raw
# value from a GPU record (a dict built by collect(), or by hand in tests).

COMPUTE_MODE_CSV = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
COMPUTE_MODE_TABLE = {0: "Default", 1: "E. Thread", 2: "Prohibited", 3: "E. Process"}


def _enabled(v) -> str:
    return "Enabled" if v else "Disabled"


def _mem(key: str) -> Callable[[Dict, Dict], object]:
    return lambda g, snap: (g.get("memory") or {}).get(key, NA)


def _key(key: str) -> Callable[[Dict, Dict], object]:
    return lambda g, snap: g.get(key, NA)


def _pci(key: str, fmt: str) -> Callable[[Dict, Dict], object]:
    def get(g, snap):
        v = g.get(key, NA)
        return v if is_err(v) else fmt % v
    return get


def _timestamp(g, snap) -> str:
    return format_timestamp(snap.get("timestamp") or _dt.datetime.now())


def format_timestamp(ts: _dt.datetime) -> str:
    """``2025/07/05 14:53:15.123`` as the real tool prints ``timestamp``."""
    return ts.strftime("%Y/%m/%d %H:%M:%S.") + f"{ts.microsecond // 1000:03d}"


# kind: how format_value renders the raw value
#   "str": as is; "mib": bytes -> MiB; "pct": percent; "watt": milliwatts -> W with 2 decimals;
#   "enabled": Enabled/Disabled; "compute_mode": Default/Exclusive_Process/Prohibited; "pstate"
GPU_FIELDS: Dict[str, Tuple[Optional[str], str, Callable[[Dict, Dict], object]]] = {
    "timestamp": (None, "str", _timestamp),
    "driver_version": (None, "str", lambda g, snap: snap.get("driver_version", NA)),
    "count": (None, "str", lambda g, snap: snap.get("count", NA)),
    "name": (None, "str", _key("name")),
    "serial": (None, "str", _key("serial")),
    "uuid": (None, "str", _key("uuid")),
    "pci.bus_id": (None, "str", _key("bus_id")),
    "pci.domain": (None, "str", _pci("pci_domain", "0x%04X")),
    "pci.bus": (None, "str", _pci("pci_bus", "0x%02X")),
    "pci.device": (None, "str", _pci("pci_device", "0x%02X")),
    "pci.device_id": (None, "str", _pci("pci_device_id", "0x%08X")),
    "pci.sub_device_id": (None, "str", _pci("pci_subsystem_id", "0x%08X")),
    "index": (None, "str", _key("index")),
    "persistence_mode": (None, "enabled", _key("persistence")),
    "display_mode": (None, "enabled", _key("display_mode")),
    "display_active": (None, "enabled", _key("display_active")),
    "compute_mode": (None, "compute_mode", _key("compute_mode")),
    "mig.mode.current": (None, "enabled", _key("mig_current")),
    "mig.mode.pending": (None, "enabled", _key("mig_pending")),
    "memory.total": ("MiB", "mib", _mem("total")),
    "memory.reserved": ("MiB", "mib", _mem("reserved")),
    "memory.used": ("MiB", "mib", _mem("used")),
    "memory.free": ("MiB", "mib", _mem("free")),
    "utilization.gpu": ("%", "pct", _key("util_gpu")),
    "utilization.memory": ("%", "pct", _key("util_mem")),
    "temperature.gpu": (None, "str", _key("temperature")),
    "fan.speed": ("%", "pct", _key("fan")),
    "pstate": (None, "pstate", _key("pstate")),
    "power.draw": ("W", "watt", _key("power_mw")),
    "power.draw.instant": ("W", "watt", _key("power_mw")),
    "power.limit": ("W", "watt", _key("power_limit_mw")),
    "enforced.power.limit": ("W", "watt", _key("power_limit_mw")),
}

# Health (README "Health"): what read_health() puts in the GPU record, as the real tool prints it.
HEALTH_GPU_FIELDS: Dict[str, Tuple[Optional[str], str, Callable[[Dict, Dict], object]]] = {
    "remapped_rows.correctable": (None, "str", _key("remap_corrected")),
    "remapped_rows.uncorrectable": (None, "str", _key("remap_uncorrected")),
    "remapped_rows.pending": (None, "str", _key("remap_pending")),
    "remapped_rows.failure": (None, "str", _key("remap_failure")),
    "retired_pages.pending": (None, "str", _key("retired_pending")),
    "ecc.mode.current": (None, "str", _key("ecc_mode_text")),
    "ecc.errors.corrected.volatile.total": (None, "str", _key("ecc_corrected_volatile")),
    "ecc.errors.uncorrected.volatile.total": (None, "str", _key("ecc_uncorrected_volatile")),
    "fabric.state": (None, "str", _key("fabric_state")),
    "fabric.status": (None, "str", _key("fabric_status")),
    "clocks_event_reasons.active": (None, "str", _key("clock_reasons")),
    "clocks_throttle_reasons.active": (None, "str", _key("clock_reasons")),
}
GPU_FIELDS.update(HEALTH_GPU_FIELDS)
# A field the nvidia-smi of a branch knows only when that branch's library has the query behind it
# (the tool and the library ship together): another branch's tool refuses it as "not a valid field".
FIELD_SYMBOLS = {
    "remapped_rows.correctable": "nvmlDeviceGetRemappedRows",
    "remapped_rows.uncorrectable": "nvmlDeviceGetRemappedRows",
    "remapped_rows.pending": "nvmlDeviceGetRemappedRows",
    "remapped_rows.failure": "nvmlDeviceGetRemappedRows",
    "fabric.state": "nvmlDeviceGetGpuFabricInfo",
    "fabric.status": "nvmlDeviceGetGpuFabricInfo",
    "clocks_event_reasons.active": "nvmlDeviceGetCurrentClocksEventReasons",
}
FABRIC_STATE_TEXT = {0: "Not Supported", 1: "Not Started", 2: "In Progress", 3: "Completed"}

GPU_ALIASES = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "pci.bus_id": "pci.bus_id",
    "fan": "fan.speed",
    "power.draw": "power.draw",
    "persistence.mode": "persistence_mode",
    "compute.mode": "compute_mode",
    "performance_state": "pstate",
    "temperature": "temperature.gpu",
    "driver.version": "driver_version",
}

APP_FIELDS: Dict[str, Tuple[Optional[str], str, Callable[[Dict, Dict], object]]] = {
    "timestamp": (None, "str", lambda p, snap: format_timestamp(snap.get("timestamp") or _dt.datetime.now())),
    "gpu_name": (None, "str", lambda p, snap: p["gpu"].get("name", NA)),
    "gpu_bus_id": (None, "str", lambda p, snap: p["gpu"].get("bus_id", NA)),
    "gpu_serial": (None, "str", lambda p, snap: p["gpu"].get("serial", NA)),
    "gpu_uuid": (None, "str", lambda p, snap: p["gpu"].get("uuid", NA)),
    "pid": (None, "str", lambda p, snap: p["pid"]),
    "process_name": (None, "str", lambda p, snap: p.get("name", NA)),
    "used_gpu_memory": ("MiB", "mib", lambda p, snap: p.get("used_bytes", NA)),
}

APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


def resolve_fields(spec: str, kind: str) -> Tuple[List[str], Optional[str]]:
    """``"index,gpu_name"`` -> (["index", "name"], None), or ([], bad_field)."""
    table, aliases = (GPU_FIELDS, GPU_ALIASES) if kind == "gpu" else (APP_FIELDS, APP_ALIASES)
    out = []
    for raw in spec.split(","):
        name = raw.strip()
        canon = aliases.get(name.lower(), name.lower())
        if canon not in table:
            return [], name
        out.append(canon)
    return out, None


def error_value(err: Err) -> str:
    """How a CSV field shows an NVML error: ``[N/A]``, ``[Unknown Error]``, ..."""
    if err is None or err.code == ERROR_NOT_SUPPORTED:
        return "[N/A]"
    return f"[{err.text}]"


def format_value(kind: str, raw, unit: Optional[str], units: bool = True) -> str:
    """One CSV value. ``kind``: see GPU_FIELDS; ``unit``: the field's unit; ``units``: False for nounits."""
    if is_err(raw):
        return error_value(raw)
    if kind == "mib":
        if raw == VALUE_NOT_AVAILABLE:
            return "[N/A]"
        text = str(int(raw) // MIB)
    elif kind == "pct":
        text = str(int(raw))
    elif kind == "watt":
        text = f"{int(raw) / 1000.0:.2f}"
    elif kind == "enabled":
        return _enabled(raw)
    elif kind == "compute_mode":
        return COMPUTE_MODE_CSV.get(int(raw), "Unknown")
    elif kind == "pstate":
        return "P%d" % int(raw) if 0 <= int(raw) <= 15 else "Unknown"
    else:
        return str(raw)
    if units and unit:
        return f"{text} {unit}"
    return text


def field_header(name: str, unit: Optional[str], units: bool = True) -> str:
    # The real tool keeps the unit in the header even with nounits.
    return f"{name} [{unit}]" if unit else name


def render_csv(fields: Sequence[str], records: Sequence[Dict], snap: Dict, kind: str,
               header: bool = True, units: bool = True) -> str:
    """The CSV body (one record per GPU for kind "gpu", per process for kind "app")."""
    table = GPU_FIELDS if kind == "gpu" else APP_FIELDS
    lines = []
    if header:
        lines.append(", ".join(field_header(f, table[f][0], units) for f in fields))
    for rec in records:
        vals = []
        for f in fields:
            unit, fkind, get = table[f]
            vals.append(format_value(fkind, get(rec, snap), unit, units))
        lines.append(", ".join(vals))
    return "".join(line + "\n" for line in lines)


# --- the default table -----------------------------------------------------------

WIDTH = 91  # every line of the R5xx table is 91 characters


def cuda_version_text(v) -> str:
    if is_err(v):
        return "N/A"
    return f"{int(v) // 1000}.{(int(v) % 1000) // 10}"


def _table_name(name: str) -> str:
    return name if len(name) <= 27 else name[:24] + "..."


def _table_proc_name(name: str) -> str:
    return name if len(name) <= 32 else "..." + name[-29:]


def _cell(v, fmt: Callable[[object], str], na: str = "N/A") -> str:
    if isinstance(v, Err) and v.code not in (ERROR_NOT_SUPPORTED,):
        return "ERR!"
    if is_err(v):
        return na
    return fmt(v)


def _mib(v) -> int:
    return int(v) // MIB


def gpu_rows(g: Dict) -> List[str]:
    """The three lines of one GPU in the table (without the separator)."""
    pm = _cell(g.get("persistence", NA), lambda v: "On" if v else "Off")
    name = _table_name(g.get("name") if not is_err(g.get("name")) else "N/A")
    disp = _cell(g.get("display_active", 0), lambda v: "On" if v else "Off")
    ecc = _cell(g.get("ecc_uncorrected", 0), str)
    bus = _cell(g.get("bus_id", NA), str)
    line1 = f"|{g['index']:>4}  {name:<27}    {pm:<3} |   {bus:<16} {disp:>3} |{ecc:>21} |"

    fan = _cell(g.get("fan", NA), lambda v: f"{int(v)}%")
    temp = _cell(g.get("temperature", NA), lambda v: f"{int(v)}C")
    perf = _cell(g.get("pstate", 0), lambda v: f"P{int(v)}")
    draw = _cell(g.get("power_mw", NA), lambda v: f"{int(round(int(v) / 1000.0))}W")
    cap = _cell(g.get("power_limit_mw", NA), lambda v: f"{int(round(int(v) / 1000.0))}W")
    # No power cap (a GB10): "3W /  N/A  |" (580.126.09), the N/A one column left of a number's end.
    power = f"{draw} / {cap:>5}" if cap != "N/A" else f"{draw} /  N/A "
    mem = g.get("memory") or {}
    used = _cell(mem.get("used", NA), lambda v: f"{_mib(v)}MiB")
    total = _cell(mem.get("total", NA), lambda v: f"{_mib(v)}MiB")
    if isinstance(mem.get("used", NA), Err) and mem.get("used", NA).code == ERROR_NOT_SUPPORTED:
        memory = f" {'Not Supported':<23}"  # unified memory (a GB10): "| Not Supported          |"
    else:
        memory = f"{used:>11} / {total:>9} "
    util = _cell(g.get("util_gpu", NA), lambda v: f"{int(v)}%")
    cmode = _cell(g.get("compute_mode", NA), lambda v: COMPUTE_MODE_TABLE.get(int(v), "Unknown"))
    line2 = f"|{fan:>4}  {temp:>4}    {perf:>2}{power:>24} |{memory}|{util:>8}{cmode:>13} |"

    mig = _cell(g.get("mig_current", NA), _enabled)
    line3 = f"|{'':41}|{'':24}|{mig:>21} |"
    return [line1, line2, line3]


SEP_FULL = "+" + "-" * 89 + "+"
SEP_GPU = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
HDR_GPU = [
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
    "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
    "|                                         |                        |               MIG M. |",
    "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
]
HDR_PROC = [
    "| Processes:" + " " * 78 + "|",
    "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
    "|        ID   ID                                                               Usage      |",
    "|" + "=" * 89 + "|",
]


def proc_row(p: Dict) -> str:
    gi = "N/A" if p.get("gi") in (None, NO_INSTANCE_ID) else str(p["gi"])
    ci = "N/A" if p.get("ci") in (None, NO_INSTANCE_ID) else str(p["ci"])
    used = p.get("used_bytes")
    name = _table_proc_name(str(p.get("name", "")))
    gpu = p["gpu"]["index"] if isinstance(p["gpu"], dict) else p["gpu"]
    head = f"|{gpu:>5}   {gi:>3}  {ci:>3}{p['pid']:>16}{p['types']:>7}   {name:<32}"
    if is_err(used) or used == VALUE_NOT_AVAILABLE:
        return head + "      N/A      |"
    return head + f"{str(_mib(used)) + 'MiB':>14} |"


def render_table(snap: Dict) -> str:
    """The default ``nvidia-smi`` output for the GPUs in ``snap["gpus"]``.

    ``snap``: timestamp (datetime), driver_version, cuda_version (int, e.g. 13000), gpus (dicts,
    see gpu_rows), processes (dicts: gpu, pid, types, name, used_bytes, gi, ci; rows whose name is
    an Err are not shown), procs_reported (bool: NVML reported at least one process).
    """
    ts = snap.get("timestamp") or _dt.datetime.now()
    drv = snap.get("driver_version", "N/A")
    out = [ts.strftime("%a %b ") + f"{ts.day:>2}" + ts.strftime(" %H:%M:%S %Y") + "       "]
    out.append(SEP_FULL)
    cuda = cuda_version_text(snap.get("cuda_version"))
    out.append(f"| NVIDIA-SMI {drv:<22} Driver Version: {drv:<14} CUDA Version: {cuda:<9}|")
    out.append(SEP_GPU)
    out.extend(HDR_GPU)
    for g in snap.get("gpus", []):
        out.extend(gpu_rows(g))
        out.append(SEP_GPU)
    out.append("")
    out.append(SEP_FULL)
    out.extend(HDR_PROC)
    rows = [proc_row(p) for p in snap.get("processes", []) if not is_err(p.get("name"))]
    out.extend(rows)
    if not rows and not snap.get("procs_reported") and not _memory_in_use(snap.get("gpus", [])):
        out.append("|  No running processes found" + " " * 61 + "|")
    out.append(SEP_FULL)
    return "".join(line + "\n" for line in out)


def _memory_in_use(gpus: Sequence[Dict]) -> bool:
    """Memory used with no process reported: the real tool then prints no "No running processes"
    line (what users see inside containers)."""
    for g in gpus:
        used = (g.get("memory") or {}).get("used")
        if not is_err(used) and _mib(used) > 0:
            return True
    return False


def render_list(gpus: Sequence[Dict]) -> str:
    """-L: a line per GPU, then one per MIG device (tests/field exporter-linux-h100-mig-590.48.01 list.txt:
    ``  MIG 3g.40gb     Device  0: (UUID: MIG-...)``)."""
    out = []
    for g in gpus:
        out.append(f"GPU {g['index']}: {g.get('name')} (UUID: {g.get('uuid')})\n")
        for d in g.get("mig") or ():
            out.append(f"  MIG {d['profile']:<11} Device {d['index']:>2}: (UUID: {d['uuid']})\n")
    return "".join(out)


# MIG (README "MIG"): GPU instance profile ids and placement sizes of an H100/H200 by slice count (the MIG user
# guide's H100 profile table: 7g 0, 4g 5, 3g 9, 2g 14, 1g 19; a compute instance taking its whole GPU instance: CI
# profile 0 (1 slice) .. 4 (7 slices)); the placements here are sequential (assumed).
MIG_GI_PROFILE_IDS = {7: 0, 4: 5, 3: 9, 2: 14, 1: 19}
MIG_PLACEMENT_SIZE = {7: 8, 4: 4, 3: 4, 2: 2, 1: 1}
MIG_CI_PROFILE_IDS = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


def _slices(profile: str) -> int:
    m = re.match(r"(?:\d\+)?(\d+)g\.", profile)
    return int(m.group(1)) if m else 1


def render_mig_list(gpus: Sequence[Dict], what: str) -> str:
    """``nvidia-smi mig -lgi`` (what "gi") / ``-lci`` ("ci"): the tables of the MIG user guide ("Getting Started")."""
    rows = [(g, d) for g in gpus for d in g.get("mig") or ()]
    if what == "gi":
        seen = set()
        lines = ["+-------------------------------------------------------+",
                 "| GPU instances:                                        |",
                 "| GPU   Name             Profile  Instance   Placement  |",
                 "|                          ID       ID       Start:Size |",
                 "|=======================================================|"]
        for g, d in rows:
            if (g["index"], d["gi"]) in seen:
                continue
            seen.add((g["index"], d["gi"]))
            n = _slices(d["profile"])
            lines.append(f"| {g['index']:>3}  {'MIG ' + d['profile']:<19}{MIG_GI_PROFILE_IDS.get(n, 19):>3}{d['gi']:>9}"
                         f"{'%d:%d' % (d['start'], MIG_PLACEMENT_SIZE.get(n, n)):>13}     |")
        lines.append("+-------------------------------------------------------+")
    else:
        lines = ["+--------------------------------------------------------------------+",
                 "| Compute instances:                                                 |",
                 "| GPU     GPU       Name             Profile   Instance   Placement  |",
                 "|       Instance                       ID        ID       Start:Size |",
                 "|         ID                                                         |",
                 "|====================================================================|"]
        for g, d in rows:
            n = _slices(d["profile"])
            lines.append(f"| {g['index']:>3}{d['gi']:>7}       {'MIG ' + d['profile']:<19}{MIG_CI_PROFILE_IDS.get(n, 0):>3}"
                         f"{d['ci']:>10}{'0:%d' % n:>13}     |")
        lines.append("+--------------------------------------------------------------------+")
    return "".join(line + "\n" for line in lines)


def read_mig(nv: "Nvml", g: Dict) -> None:
    """g["mig"]: the MIG devices of a GPU in MIG mode, by nvmlDeviceGetMigDeviceHandleByIndex over
    nvmlDeviceGetMaxMigDeviceCount (indexes without a device skipped): {index, uuid, profile, gi, ci, memory, start}."""
    g["mig"] = []
    if g.get("mig_current") != 1 or not nv.has("nvmlDeviceGetMigDeviceHandleByIndex"):
        return
    count = nv.uint("nvmlDeviceGetMaxMigDeviceCount", g["handle"])
    start = 0
    for i in range(0 if isinstance(count, Err) else count):
        h = ctypes.c_void_p()
        if nv.call("nvmlDeviceGetMigDeviceHandleByIndex", g["handle"], ctypes.c_uint(i), ctypes.byref(h)) != SUCCESS:
            continue
        name = nv.string("nvmlDeviceGetName", h, size=96)
        profile = name.rsplit(" MIG ", 1)[-1] if isinstance(name, str) else "N/A"
        mem = c_nvmlMemory_v2_t(version=NVML_MEMORY_V2)
        memory = None
        if nv.call("nvmlDeviceGetMemoryInfo_v2", h, ctypes.byref(mem)) == SUCCESS:
            memory = {"total": mem.total, "reserved": mem.reserved, "used": mem.used, "free": mem.free}
        d = {"index": len(g["mig"]), "uuid": nv.string("nvmlDeviceGetUUID", h, size=96), "profile": profile,
             "gi": nv.uint("nvmlDeviceGetGpuInstanceId", h), "ci": nv.uint("nvmlDeviceGetComputeInstanceId", h),
             "memory": memory or {}, "start": start}
        if all(x["gi"] != d["gi"] for x in g["mig"]):
            start += MIG_PLACEMENT_SIZE.get(_slices(profile), 1)
        g["mig"].append(d)


def query_mig_nodes(g: Dict) -> list:
    """``<mig_devices>``: one ``<mig_device>`` per MIG device (index, gpu_instance_id, compute_instance_id,
    fb_memory_usage: tests/field netdata-a100-sxm4-mig and telegraf-a100-sxm4-v12 q.xml), else "None"."""
    if not g.get("mig"):
        return ["None"]
    out = []
    for d in g["mig"]:
        mem = d.get("memory") or {}
        out.append(("mig_device", None, [
            ("index", None, str(d["index"])),
            ("gpu_instance_id", None, query_value(d["gi"])),
            ("compute_instance_id", None, query_value(d["ci"])),
            ("fb_memory_usage", None, [
                ("total", None, query_value(mem.get("total", NA), _q_mib)),
                ("reserved", None, query_value(mem.get("reserved", NA), _q_mib)),
                ("used", None, query_value(mem.get("used", NA), _q_mib)),
                ("free", None, query_value(mem.get("free", NA), _q_mib)),
            ]),
        ]))
    return out


# --- -q / -q -x: the query log -------------------------------------------------------
#
# One tree per GPU, rendered either as the XML log or as the text layout. A node is
# (xml tag, text label, value): value is a str (the same in both), a (xml, text) pair, or a list of
# child nodes (a plain str among the children is a line of text of its own, as in
# "<mig_devices>\n\t\t\tNone\n\t\t</mig_devices>"). A label None: the node is XML only.

QueryNode = Tuple[str, Optional[str], Union[str, Tuple[str, str], list]]

XML_HEADER = '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n'
TEXT_LABEL_WIDTH = 42  # "    Product Name                          : " (indent included)

# nvmlBrandType_t -> "Product Brand"
BRANDS = {
    0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
    7: "NVIDIA Virtual Applications", 8: "NVIDIA Virtual PC", 9: "NVIDIA Virtual Compute Server",
    10: "NVIDIA RTX Virtual Workstation", 11: "NVIDIA Cloud Gaming", 12: "Quadro RTX", 13: "NVIDIA RTX",
    14: "NVIDIA", 15: "GeForce RTX", 16: "Titan RTX",
}


def query_value(v, fmt: Callable[[object], str] = str) -> str:
    """A -q value: ``N/A`` where the library cannot give it (not supported, no such function),
    the error's text for any other error (``Unknown Error``), else ``fmt(v)``."""
    if v is None or (isinstance(v, Err) and v.code in (ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND)):
        return "N/A"
    if isinstance(v, Err):
        return v.text
    return fmt(v)


def _q_mib(v) -> str:
    return "N/A" if v == VALUE_NOT_AVAILABLE else f"{_mib(v)} MiB"


def _q_watt(v) -> str:
    return f"{int(v) / 1000.0:.2f} W"


def _q_hex(width: int, prefix: str) -> Callable[[object], str]:
    return lambda v: prefix + "%0*X" % (width, int(v))


def _q_pair(v, width: int) -> Tuple[str, str]:
    """A PCI number: ``18`` in the XML, ``0x18`` in the text."""
    return query_value(v, _q_hex(width, "")), query_value(v, _q_hex(width, "0x"))


def _q_instance(v) -> str:
    return "N/A" if v is None or v == NO_INSTANCE_ID else str(v)


def query_process_node(p: Dict) -> QueryNode:
    return ("process_info", None, [
        ("gpu_instance_id", "GPU instance ID", _q_instance(p.get("gi"))),
        ("compute_instance_id", "Compute instance ID", _q_instance(p.get("ci"))),
        ("pid", "Process ID", str(p["pid"])),
        ("type", "Type", p["types"]),
        ("process_name", "Name", query_value(p.get("name"))),
        ("used_memory", "Used GPU Memory", query_value(p.get("used_bytes"), _q_mib)),
    ])


def query_gpu_nodes(g: Dict, processes: Sequence[Dict]) -> List[QueryNode]:
    """The elements of one ``<gpu>`` (``g``: see gpu_rows, plus brand, util_enc, util_dec,
    power_requested_mw; ``processes``: this GPU's, as read_processes returns them; those whose
    name cannot be read are left out, as in the table)."""
    mem = g.get("memory") or {}
    pstate = query_value(g.get("pstate", NA), lambda v: "P%d" % int(v) if 0 <= int(v) <= 15 else "Unknown")
    procs = [query_process_node(p) for p in processes if not is_err(p.get("name"))]
    return [
        ("product_name", "Product Name", query_value(g.get("name"))),
        ("product_brand", "Product Brand", query_value(g.get("brand", NA), lambda v: BRANDS.get(int(v), "Unknown"))),
        ("persistence_mode", "Persistence Mode", query_value(g.get("persistence", NA), _enabled)),
        ("mig_mode", "MIG Mode", [
            ("current_mig", "Current", query_value(g.get("mig_current", NA), _enabled)),
            ("pending_mig", "Pending", query_value(g.get("mig_pending", NA), _enabled)),
        ]),
        ("mig_devices", None, query_mig_nodes(g)),
        ("serial", "Serial Number", query_value(g.get("serial"))),
        ("uuid", "GPU UUID", query_value(g.get("uuid"))),
        ("minor_number", "Minor Number", query_value(g.get("minor"))),
        ("pci", "PCI", [
            ("pci_bus", "Bus", _q_pair(g.get("pci_bus"), 2)),
            ("pci_device", "Device", _q_pair(g.get("pci_device"), 2)),
            ("pci_domain", "Domain", _q_pair(g.get("pci_domain"), 4)),
            ("pci_device_id", "Device Id", _q_pair(g.get("pci_device_id"), 8)),
            ("pci_bus_id", "Bus Id", query_value(g.get("bus_id"))),
            ("pci_sub_system_id", "Sub System Id", _q_pair(g.get("pci_subsystem_id"), 8)),
        ]),
        ("fan_speed", "Fan Speed", query_value(g.get("fan", NA), lambda v: f"{int(v)} %")),
        ("performance_state", "Performance State", pstate),
        ("fb_memory_usage", "FB Memory Usage", [
            ("total", "Total", query_value(mem.get("total", NA), _q_mib)),
            ("reserved", "Reserved", query_value(mem.get("reserved", NA), _q_mib)),
            ("used", "Used", query_value(mem.get("used", NA), _q_mib)),
            ("free", "Free", query_value(mem.get("free", NA), _q_mib)),
        ]),
        ("compute_mode", "Compute Mode", query_value(g.get("compute_mode", NA), lambda v: COMPUTE_MODE_CSV.get(int(v), "Unknown"))),
        ("utilization", "Utilization", [
            ("gpu_util", "GPU", query_value(g.get("util_gpu", NA), lambda v: f"{int(v)} %")),
            ("memory_util", "Memory", query_value(g.get("util_mem", NA), lambda v: f"{int(v)} %")),
            ("encoder_util", "Encoder", query_value(g.get("util_enc", NA), lambda v: f"{int(v)} %")),
            ("decoder_util", "Decoder", query_value(g.get("util_dec", NA), lambda v: f"{int(v)} %")),
        ]),
        ("temperature", "Temperature", [
            ("gpu_temp", "GPU Current Temp", query_value(g.get("temperature", NA), lambda v: f"{int(v)} C")),
        ]),
        ("gpu_power_readings", "GPU Power Readings", [
            ("power_state", None, pstate),
            ("average_power_draw", "Average Power Draw", query_value(g.get("power_mw", NA), _q_watt)),
            ("instant_power_draw", "Instantaneous Power Draw", query_value(g.get("power_mw", NA), _q_watt)),
            ("current_power_limit", "Current Power Limit", query_value(g.get("power_limit_mw", NA), _q_watt)),
            ("requested_power_limit", "Requested Power Limit", query_value(g.get("power_requested_mw", NA), _q_watt)),
        ]),
        ("processes", "Processes", procs),
    ]


def _query_snapshot_head(snap: Dict) -> Tuple[str, str, str, str]:
    ts = snap.get("timestamp") or _dt.datetime.now()
    when = ts.strftime("%a %b ") + f"{ts.day:>2}" + ts.strftime(" %H:%M:%S %Y")
    return (when, query_value(snap.get("driver_version", NA)), cuda_version_text(snap.get("cuda_version")),
            query_value(snap.get("count", NA)))


def _procs_of(snap: Dict, g: Dict) -> List[Dict]:
    return [p for p in snap.get("processes", []) if p["gpu"] is g]


def _xml_lines(nodes: Sequence, depth: int, out: List[str]) -> None:
    ind = "\t" * depth
    for node in nodes:
        if isinstance(node, str):
            out.append(ind + _xml_escape(node))
            continue
        tag, _label, value = node
        if isinstance(value, list):
            out.append(f"{ind}<{tag}>")
            _xml_lines(value, depth + 1, out)
            out.append(f"{ind}</{tag}>")
        else:
            text = value[0] if isinstance(value, tuple) else value
            out.append(f"{ind}<{tag}>{_xml_escape(text)}</{tag}>")


def render_query_xml(snap: Dict) -> str:
    """``nvidia-smi -q -x`` for the GPUs in ``snap["gpus"]`` (``snap``: as render_table's, plus
    count, the number of GPUs attached, selected or not)."""
    when, drv, cuda, count = _query_snapshot_head(snap)
    out = ["<nvidia_smi_log>", f"\t<timestamp>{when}</timestamp>", f"\t<driver_version>{_xml_escape(drv)}</driver_version>",
           f"\t<cuda_version>{cuda}</cuda_version>", f"\t<attached_gpus>{count}</attached_gpus>"]
    for g in snap.get("gpus", []):
        out.append(f"\t<gpu id={_xml_quoteattr(query_value(g.get('bus_id')))}>")
        _xml_lines(query_gpu_nodes(g, _procs_of(snap, g)), 2, out)
        out.append("\t</gpu>")
    out.append("</nvidia_smi_log>")
    return XML_HEADER + "".join(line + "\n" for line in out)


def _text_kv(ind: str, label: str, value: str) -> str:
    return f"{ind + label:<{TEXT_LABEL_WIDTH}}: {value}"


def _text_lines(nodes: Sequence, depth: int, out: List[str]) -> None:
    ind = "    " * depth
    for node in nodes:
        if isinstance(node, str):
            continue
        tag, label, value = node
        if label is None:
            continue
        if tag == "processes":
            if not value:
                out.append(_text_kv(ind, label, "None"))
                continue
            out.append(ind + label)
            for proc in value:
                # GPU instance ID, Compute instance ID, Process ID; then, one level in, the rest
                for k, (_tag, plabel, pvalue) in enumerate(proc[2]):
                    out.append(_text_kv(ind + "    " * (1 if k < 3 else 2), plabel, pvalue))
        elif isinstance(value, list):
            out.append(ind + label)
            _text_lines(value, depth + 1, out)
        else:
            out.append(_text_kv(ind, label, value[1] if isinstance(value, tuple) else value))


def render_query_text(snap: Dict) -> str:
    """``nvidia-smi -q``: the same subset as render_query_xml, in the real text layout."""
    when, drv, cuda, count = _query_snapshot_head(snap)
    out = ["", "==============NVSMI LOG==============", "", _text_kv("", "Timestamp", when),
           _text_kv("", "Driver Version", drv), _text_kv("", "CUDA Version", cuda), "",
           _text_kv("", "Attached GPUs", count)]
    for g in snap.get("gpus", []):
        out.append(f"GPU {query_value(g.get('bus_id'))}")
        _text_lines(query_gpu_nodes(g, _procs_of(snap, g)), 1, out)
        out.append("")
    return "".join(line + "\n" for line in out)


# --- argument parsing ----------------------------------------------------------------


class UsageError(Exception):
    """Bad command line: message for stdout, exit code."""

    def __init__(self, message: str, code: int = EXIT_BAD_ARGS):
        super().__init__(message)
        self.message = message
        self.code = code


class Args:
    def __init__(self):
        self.help = False
        self.version = False
        self.list = False
        self.ids: Optional[List[str]] = None
        self.query_gpu: Optional[str] = None
        self.query_apps: Optional[str] = None
        self.format: Optional[str] = None
        self.help_query: Optional[str] = None
        self.query = False  # -q
        self.xml = False  # -x
        self.reset = False  # -r
        self.mig: Optional[str] = None  # `mig -lgi` ("gi") / `mig -lci` ("ci")


_VALUE_OPTS = {
    "-i": "ids", "--id": "ids",
    "--query-gpu": "query_gpu", "--query-compute-apps": "query_apps",
    "--format": "format",
}
_FLAG_OPTS = {
    "-h": "help", "--help": "help", "--version": "version",
    "-L": "list", "--list-gpus": "list",
    "-q": "query", "--query": "query",
    "-x": "xml", "--xml-format": "xml",
    "-r": "reset", "--gpu-reset": "reset",
}


def parse_args(argv: Sequence[str]) -> Args:
    """Parse as the real tool does (``--opt=value``, ``--opt value``, ``-i0``, ``-i 0``)."""
    a = Args()
    i = 0
    argv = list(argv)
    if argv and argv[0] == "mig":  # nvidia-smi mig -lgi|-lci [-i ID]: the listing subcommands only
        rest = argv[1:]
        kinds = {"-lgi": "gi", "--list-gpu-instances": "gi", "-lci": "ci", "--list-compute-instances": "ci"}
        for j, tok in enumerate(rest):
            if tok in kinds:
                a.mig = kinds[tok]
            elif tok == "-i" and j + 1 < len(rest):
                a.ids = [s.strip() for s in rest[j + 1].split(",") if s.strip()]
            elif j == 0 or rest[j - 1] != "-i":
                raise UsageError(f"ERROR: Option {tok} is not recognized. {HELP_HINT}\n")
        if a.mig is None:
            raise UsageError(f"Invalid combination of input arguments. {HELP_HINT}\n")
        return a
    while i < len(argv):
        tok = argv[i]
        i += 1
        if tok in ("--help-query-gpu", "--help-query-compute-apps"):
            a.help_query = "gpu" if tok.endswith("gpu") else "app"
            continue
        if tok in _FLAG_OPTS:
            setattr(a, _FLAG_OPTS[tok], True)
            continue
        name, value = tok, None
        if tok.startswith("--") and "=" in tok:
            name, value = tok.split("=", 1)
        elif tok.startswith("-i") and not tok.startswith("--") and len(tok) > 2:
            name, value = "-i", tok[2:].lstrip("=")
        if name not in _VALUE_OPTS:
            raise UsageError(f"ERROR: Option {tok} is not recognized. {HELP_HINT}\n")
        if value is None:
            if i >= len(argv):
                raise UsageError(f"ERROR: Option {name} is missing its value. {HELP_HINT}\n")
            value = argv[i]
            i += 1
        dest = _VALUE_OPTS[name]
        if dest == "ids":
            a.ids = [s.strip() for s in value.split(",") if s.strip()]
            if not a.ids:
                raise UsageError(f"ERROR: Option {name} is missing its value. {HELP_HINT}\n")
        else:
            setattr(a, dest, value)
    if a.help or a.version or a.help_query:
        return a
    if a.query_gpu is not None and a.query_apps is not None:
        raise UsageError("Only one --query-* switch can be used at a time.\n")
    query = a.query_gpu is not None or a.query_apps is not None
    if query and a.format is None:
        raise UsageError(f'"--format=" switch is missing. {HELP_HINT}\n')
    if (a.format is not None and not query) or (a.list and query):
        raise UsageError(f"Invalid combination of input arguments. {HELP_HINT}\n")
    # -x only qualifies -q; -q shows everything, so it takes no other view
    if (a.xml and not a.query) or (a.query and (a.list or query)):
        raise UsageError(f"Invalid combination of input arguments. {HELP_HINT}\n")
    if a.reset and (a.query or a.list or query):
        raise UsageError(f"Invalid combination of input arguments. {HELP_HINT}\n")
    return a


def parse_format(spec: str) -> Tuple[bool, bool]:
    """``csv,noheader,nounits`` -> (header, units)."""
    opts = [s.strip() for s in spec.split(",") if s.strip()]
    if "csv" not in opts:
        raise UsageError(f'"--format=" switch is missing the mandatory "csv" option. {HELP_HINT}\n')
    bad = [o for o in opts if o not in ("csv", "noheader", "nounits")]
    if bad:
        raise UsageError(f'"--format=" switch has an invalid option "{bad[0]}". {HELP_HINT}\n')
    return "noheader" not in opts, "nounits" not in opts


def _norm_bus(text: str) -> Optional[Tuple[int, int, int]]:
    """``00000000:18:00.0`` / ``0000:18:00.0`` / ``18:00.0`` -> (domain, bus, device)."""
    parts = text.strip().split(":")
    try:
        if len(parts) == 3:
            dom, bus, rest = int(parts[0], 16), int(parts[1], 16), parts[2]
        elif len(parts) == 2:
            dom, bus, rest = 0, int(parts[0], 16), parts[1]
        else:
            return None
        dev = int(rest.split(".")[0], 16)
    except ValueError:
        return None
    return dom, bus, dev


def _is_index(tok: str) -> bool:
    """A GPU index (a serial number is digits too, but 13 of them)."""
    return tok.isdigit() and len(tok) < 6


def match_ids(ids: Sequence[str], idents: Sequence[Dict]) -> Optional[List[int]]:
    """Indexes selected by ``-i`` tokens (index, UUID, PCI bus id, serial), in index order;
    None when a token matches nothing. ``idents``: per GPU index, dict with uuid, bus_id, serial."""
    chosen = set()
    for tok in ids:
        found = None
        if _is_index(tok):
            found = int(tok) if int(tok) < len(idents) else None
        elif tok.upper().startswith(("GPU-", "MIG-")):
            for i, d in enumerate(idents):
                if isinstance(d.get("uuid"), str) and d["uuid"].lower() == tok.lower():
                    found = i
        elif ":" in tok:
            want = _norm_bus(tok)
            for i, d in enumerate(idents):
                if want is not None and isinstance(d.get("bus_id"), str) and _norm_bus(d["bus_id"]) == want:
                    found = i
        else:
            for i, d in enumerate(idents):
                if isinstance(d.get("serial"), str) and d["serial"] == tok:
                    found = i
        if found is None:
            return None
        chosen.add(found)
    return sorted(chosen)


# --- the library --------------------------------------------------------------------


class c_nvmlMemory_t(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class c_nvmlMemory_v2_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class c_nvmlProcessInfo_v1_t(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class c_nvmlProcessInfo_t(ctypes.Structure):  # _v2 and _v3 take this one
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class c_nvmlProcessInfo_v3_t(ctypes.Structure):  # what _v3 wrote in 535.43.02 .. 535.86.x
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
        ("usedGpuCcProtectedMemory", ctypes.c_ulonglong),
    ]


class nvmlPciInfo_t(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class c_nvmlGpuFabricInfo_t(ctypes.Structure):  # nvml.h: the state is one byte
    _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int), ("cliqueId", ctypes.c_uint),
                ("state", ctypes.c_ubyte)]


class c_nvmlUtilization_t(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


assert ctypes.sizeof(c_nvmlMemory_t) == 24 and ctypes.sizeof(c_nvmlMemory_v2_t) == 40
assert ctypes.sizeof(c_nvmlProcessInfo_t) == 24 and ctypes.sizeof(nvmlPciInfo_t) == 68
assert ctypes.sizeof(c_nvmlProcessInfo_v3_t) == 32


class Missing(Exception):
    """The library does not export a symbol."""


class Nvml:
    """A thin ctypes view of the NVML C API (return codes, no exceptions).

    ``v3_entry_bytes``: the size of the entries the library's ``_v3`` process queries write (the
    real tool is built with its own branch's header, so it always reads the right one)."""

    v3_entry_bytes = 24

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self._fn: Dict[str, object] = {}
        try:
            es = self.lib.nvmlErrorString
            es.restype = ctypes.c_char_p
            es.argtypes = [ctypes.c_int]
            self._errstr = es
        except AttributeError:
            self._errstr = None

    def has(self, name: str) -> bool:
        try:
            self.fn(name)
            return True
        except Missing:
            return False

    def fn(self, name: str):
        f = self._fn.get(name)
        if f is None:
            try:
                f = getattr(self.lib, name)
            except AttributeError:
                raise Missing(name) from None
            self._fn[name] = f
        return f

    def call(self, name: str, *args) -> int:
        try:
            return int(self.fn(name)(*args))
        except Missing:
            return ERROR_FUNCTION_NOT_FOUND

    def error_string(self, code: int) -> str:
        if code in ERROR_TEXT:
            return ERROR_TEXT[code]
        if self._errstr is not None:
            s = self._errstr(code)
            if s:
                return s.decode("utf-8", "replace")
        return f"Unknown Error ({code})"

    def err(self, code: int) -> Err:
        return Err(code, self.error_string(code))

    # -- helpers returning a value or an Err
    def string(self, name: str, *args, size: int = 96):
        buf = ctypes.create_string_buffer(size)
        ret = self.call(name, *args, buf, ctypes.c_uint(size))
        if ret != SUCCESS:
            return self.err(ret)
        return buf.value.decode("utf-8", "replace")

    def uint(self, name: str, *args):
        v = ctypes.c_uint(0)
        ret = self.call(name, *args, ctypes.byref(v))
        return v.value if ret == SUCCESS else self.err(ret)

    def uint2(self, name: str, *args):
        a, b = ctypes.c_uint(0), ctypes.c_uint(0)
        ret = self.call(name, *args, ctypes.byref(a), ctypes.byref(b))
        return (a.value, b.value) if ret == SUCCESS else self.err(ret)

    def processes(self, h, kind: str):
        """Running processes of a kind ("Compute", "Graphics", "MPSCompute"): a list of
        (pid, used_bytes, gi, ci), or an Err. _v3 (entries of v3_entry_bytes), then _v2, then the
        v1 symbol."""
        base = f"nvmlDeviceGet{kind}RunningProcesses"
        v3 = c_nvmlProcessInfo_v3_t if self.v3_entry_bytes == ctypes.sizeof(c_nvmlProcessInfo_v3_t) \
            else c_nvmlProcessInfo_t
        for sym, struct in ((base + "_v3", v3), (base + "_v2", c_nvmlProcessInfo_t),
                            (base, c_nvmlProcessInfo_v1_t)):
            if not self.has(sym):
                continue
            return self._two_call(sym, h, struct)
        return Err(ERROR_FUNCTION_NOT_FOUND)

    def _two_call(self, sym: str, h, struct):
        count = ctypes.c_uint(0)
        ret = self.call(sym, h, ctypes.byref(count), None)
        if ret == SUCCESS:
            return []
        for _attempt in range(5):  # processes may appear between the calls
            if ret != ERROR_INSUFFICIENT_SIZE:
                return self.err(ret)
            n = count.value * 2 + 5
            arr = (struct * n)()
            count = ctypes.c_uint(n)
            ret = self.call(sym, h, ctypes.byref(count), arr)
            if ret == SUCCESS:
                out = []
                for k in range(min(count.value, n)):
                    e = arr[k]
                    gi = getattr(e, "gpuInstanceId", NO_INSTANCE_ID)
                    ci = getattr(e, "computeInstanceId", NO_INSTANCE_ID)
                    out.append((int(e.pid), int(e.usedGpuMemory), gi, ci))
                return out
        return self.err(ret)


class DeviceFailure(Exception):
    """A GPU the tool cannot open ("Unable to determine the device handle ...")."""

    def __init__(self, index: int, legacy_bus: Optional[str], code: int, text: str):
        super().__init__(text)
        self.index, self.legacy_bus, self.code, self.text = index, legacy_bus, code, text

    def message(self) -> str:
        where = f"GPU{self.index}: {self.legacy_bus}" if self.legacy_bus else f"GPU{self.index}"
        what = MSG_LOST_SUFFIX if self.code == ERROR_GPU_IS_LOST else self.text
        return f"Unable to determine the device handle for {where}: {what}\n"

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.code)


def exit_code_for(code: int) -> int:
    return code if 0 < code < 256 and code != ERROR_UNKNOWN else 255


FATAL = (ERROR_GPU_IS_LOST,)


def identify(nv: Nvml, index: int) -> Dict:
    """Handle and the identity of a GPU (these queries work on a lost GPU too)."""
    h = ctypes.c_void_p()
    ret = nv.call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(h))
    if ret == ERROR_FUNCTION_NOT_FOUND:
        ret = nv.call("nvmlDeviceGetHandleByIndex", ctypes.c_uint(index), ctypes.byref(h))
    g: Dict = {"index": index}
    if ret != SUCCESS:
        g["handle_error"] = nv.err(ret)
        return g
    g["handle"] = h
    pci = nvmlPciInfo_t()
    ret = nv.call("nvmlDeviceGetPciInfo_v3", h, ctypes.byref(pci))
    if ret == ERROR_FUNCTION_NOT_FOUND:
        ret = nv.call("nvmlDeviceGetPciInfo", h, ctypes.byref(pci))
    if ret == SUCCESS:
        g["bus_id"] = pci.busId.decode("ascii", "replace")
        g["bus_id_legacy"] = pci.busIdLegacy.decode("ascii", "replace")
        g["pci_domain"], g["pci_bus"], g["pci_device"] = pci.domain, pci.bus, pci.device
        g["pci_device_id"], g["pci_subsystem_id"] = pci.pciDeviceId, pci.pciSubSystemId
    else:
        g["bus_id"] = nv.err(ret)
    g["name"] = nv.string("nvmlDeviceGetName", h, size=96)
    g["uuid"] = nv.string("nvmlDeviceGetUUID", h, size=96)
    g["serial"] = nv.string("nvmlDeviceGetSerial", h, size=30)
    g["minor"] = nv.uint("nvmlDeviceGetMinorNumber", h)
    return g


def _legacy_bus(g: Dict) -> Optional[str]:
    if isinstance(g.get("bus_id_legacy"), str) and g["bus_id_legacy"]:
        return g["bus_id_legacy"]
    if isinstance(g.get("bus_id"), str):
        return g["bus_id"][4:]
    return None


def _check(g: Dict, v):
    """A query result: GPU_IS_LOST fails the whole GPU, as the real tool does."""
    if isinstance(v, Err) and v.code in FATAL:
        raise DeviceFailure(g["index"], _legacy_bus(g), v.code, v.text)
    return v


def read_gpu(nv: Nvml, g: Dict, need_table: bool) -> Dict:
    """Fill the dynamic values of an identified GPU; raises DeviceFailure if it cannot be used."""
    if "handle_error" in g:
        e = g["handle_error"]
        raise DeviceFailure(g["index"], None, e.code, e.text)
    for key in ("name", "uuid", "bus_id"):
        v = g.get(key)
        if isinstance(v, Err) and v.code != ERROR_NOT_SUPPORTED:
            raise DeviceFailure(g["index"], _legacy_bus(g), v.code, v.text)
    h = g["handle"]
    # The first dynamic query stands for opening the device: on a real host a lost GPU (or one
    # that answers UNKNOWN) fails already in nvmlDeviceGetHandleByIndex.
    mem2 = c_nvmlMemory_v2_t(version=NVML_MEMORY_V2)
    ret = nv.call("nvmlDeviceGetMemoryInfo_v2", h, ctypes.byref(mem2))
    if ret in (ERROR_FUNCTION_NOT_FOUND, ERROR_ARGUMENT_VERSION_MISMATCH, ERROR_NOT_SUPPORTED):
        mem1 = c_nvmlMemory_t()
        ret = nv.call("nvmlDeviceGetMemoryInfo", h, ctypes.byref(mem1))
        if ret == SUCCESS:
            g["memory"] = {"total": mem1.total, "used": mem1.used, "free": mem1.free, "reserved": NA}
    elif ret == SUCCESS:
        g["memory"] = {"total": mem2.total, "used": mem2.used, "free": mem2.free, "reserved": mem2.reserved}
    if ret != SUCCESS:
        if ret in (ERROR_GPU_IS_LOST, ERROR_UNKNOWN):
            raise DeviceFailure(g["index"], _legacy_bus(g), ret, nv.error_string(ret))
        e = nv.err(ret)
        g["memory"] = {"total": e, "used": e, "free": e, "reserved": e}

    util = c_nvmlUtilization_t()
    ret = nv.call("nvmlDeviceGetUtilizationRates", h, ctypes.byref(util))
    if ret == SUCCESS:
        g["util_gpu"], g["util_mem"] = util.gpu, util.memory
    else:
        g["util_gpu"] = g["util_mem"] = _check(g, nv.err(ret))
    g["temperature"] = _check(g, nv.uint("nvmlDeviceGetTemperature", h, ctypes.c_uint(0)))
    g["power_mw"] = _check(g, nv.uint("nvmlDeviceGetPowerUsage", h))
    g["power_limit_mw"] = _check(g, nv.uint("nvmlDeviceGetEnforcedPowerLimit", h))
    g["persistence"] = _check(g, nv.uint("nvmlDeviceGetPersistenceMode", h))
    g["compute_mode"] = _check(g, nv.uint("nvmlDeviceGetComputeMode", h))
    mig = _check(g, nv.uint2("nvmlDeviceGetMigMode", h))
    g["mig_current"], g["mig_pending"] = (mig if isinstance(mig, tuple) else (mig, mig))
    fan = nv.uint("nvmlDeviceGetFanSpeed", h)
    g["fan"] = NA if isinstance(fan, Err) and fan.code == ERROR_FUNCTION_NOT_FOUND else _check(g, fan)
    ps = nv.uint("nvmlDeviceGetPerformanceState", h)
    g["pstate"] = 0 if isinstance(ps, Err) and ps.code == ERROR_FUNCTION_NOT_FOUND else _check(g, ps)
    if need_table:
        g["ecc_uncorrected"] = _ecc(nv, g, h)
        da = nv.uint("nvmlDeviceGetDisplayActive", h)
        g["display_active"] = 0 if isinstance(da, Err) and da.code == ERROR_FUNCTION_NOT_FOUND else _check(g, da)
    return g


def read_query_extras(nv: Nvml, g: Dict) -> Dict:
    """The values only ``-q`` shows (after read_gpu): brand, encoder/decoder utilization, the
    requested power limit. A lost GPU raises DeviceFailure, as in read_gpu."""
    h = g["handle"]
    g["brand"] = _check(g, nv.uint("nvmlDeviceGetBrand", h))
    for key, sym in (("util_enc", "nvmlDeviceGetEncoderUtilization"), ("util_dec", "nvmlDeviceGetDecoderUtilization")):
        v = _check(g, nv.uint2(sym, h))  # (utilization, sampling period in us)
        g[key] = v[0] if isinstance(v, tuple) else v
    g["power_requested_mw"] = _check(g, nv.uint("nvmlDeviceGetPowerManagementLimit", h))
    return g


def read_health(nv: Nvml, g: Dict) -> Dict:
    """The health values of the CSV query (HEALTH_GPU_FIELDS), each an Err where the library or the
    GPU cannot give it (printed [N/A]). A lost GPU raises DeviceFailure, as in read_gpu."""
    h = g["handle"]
    rows = [ctypes.c_uint(0), ctypes.c_uint(0), ctypes.c_uint(0), ctypes.c_uint(0)]
    ret = nv.call("nvmlDeviceGetRemappedRows", h, *[ctypes.byref(r) for r in rows])
    if ret == SUCCESS:
        g["remap_corrected"], g["remap_uncorrected"] = rows[0].value, rows[1].value
        g["remap_pending"] = "Yes" if rows[2].value else "No"
        g["remap_failure"] = "Yes" if rows[3].value else "No"
    else:
        g["remap_corrected"] = g["remap_uncorrected"] = g["remap_pending"] = g["remap_failure"] = _check(g, nv.err(ret))
    pending = _check(g, nv.uint("nvmlDeviceGetRetiredPagesPendingStatus", h))
    g["retired_pending"] = pending if isinstance(pending, Err) else ("Yes" if pending else "No")
    mode = _check(g, nv.uint2("nvmlDeviceGetEccMode", h))
    g["ecc_mode_text"] = mode if isinstance(mode, Err) else _enabled(mode[0])
    for key, kind in (("ecc_corrected_volatile", 0), ("ecc_uncorrected_volatile", 1)):
        v = ctypes.c_ulonglong(0)
        ret = nv.call("nvmlDeviceGetTotalEccErrors", h, ctypes.c_uint(kind), ctypes.c_uint(0), ctypes.byref(v))
        g[key] = v.value if ret == SUCCESS else _check(g, nv.err(ret))
    info = c_nvmlGpuFabricInfo_t()
    ret = nv.call("nvmlDeviceGetGpuFabricInfo", h, ctypes.byref(info))
    if ret == SUCCESS:
        g["fabric_state"] = FABRIC_STATE_TEXT.get(info.state, "Unknown")
        g["fabric_status"] = (("Success" if info.status == SUCCESS else nv.error_string(info.status))
                              if info.state == 3 else NA)
    else:
        g["fabric_state"] = g["fabric_status"] = _check(g, nv.err(ret))
    mask = ctypes.c_ulonglong(0)
    sym = ("nvmlDeviceGetCurrentClocksEventReasons" if nv.has("nvmlDeviceGetCurrentClocksEventReasons")
           else "nvmlDeviceGetCurrentClocksThrottleReasons")
    ret = nv.call(sym, h, ctypes.byref(mask))
    g["clock_reasons"] = f"0x{mask.value:016X}" if ret == SUCCESS else _check(g, nv.err(ret))
    return g


def unknown_fields(nv: Nvml, fields: Sequence[str]) -> Optional[str]:
    """The first requested field this branch's tool does not know (FIELD_SYMBOLS), or None."""
    for name in fields:
        sym = FIELD_SYMBOLS.get(name)
        if sym and not nv.has(sym):
            return name
    return None


def _ecc(nv: Nvml, g: Dict, h):
    """Volatile uncorrected ECC errors; a library without the ECC calls reads as 0 (an H200)."""
    if not nv.has("nvmlDeviceGetTotalEccErrors"):
        return 0
    mode = nv.uint2("nvmlDeviceGetEccMode", h) if nv.has("nvmlDeviceGetEccMode") else (1, 1)
    if isinstance(mode, Err):
        return _check(g, mode)
    if not mode[0]:
        return "Off"
    v = ctypes.c_ulonglong(0)
    ret = nv.call("nvmlDeviceGetTotalEccErrors", h, ctypes.c_uint(1), ctypes.c_uint(0), ctypes.byref(v))
    return v.value if ret == SUCCESS else _check(g, nv.err(ret))


def read_processes(nv: Nvml, g: Dict, kinds: Sequence[Tuple[str, str]]) -> Tuple[List[Dict], bool]:
    """Processes on a GPU, merged by pid ("C", "G", "C+G", "M+C"). Returns (rows, reported_any)."""
    h = g["handle"]
    merged: Dict[int, Dict] = {}
    order: List[int] = []
    for kind, letter in kinds:
        res = _check(g, nv.processes(h, kind))
        if isinstance(res, Err):
            continue
        for pid, used, gi, ci in res:
            if pid not in merged:
                merged[pid] = {"gpu": g, "pid": pid, "types": letter, "used_bytes": used, "gi": gi, "ci": ci}
                order.append(pid)
            elif letter not in merged[pid]["types"].split("+"):
                have = merged[pid]["types"].split("+") + [letter]
                merged[pid]["types"] = "+".join(t for t in "MCG" if t in have)  # C+G, M+C
    rows = []
    for pid in order:
        p = merged[pid]
        if p["used_bytes"] == VALUE_NOT_AVAILABLE:
            p["used_bytes"] = NA
        p["name"] = nv.string("nvmlSystemGetProcessName", ctypes.c_uint(pid), size=1024)
        rows.append(p)
    return rows, bool(order)


# --- main ------------------------------------------------------------------------------


def library_path(simdir: str) -> str:
    return os.path.join(os.path.abspath(simdir), "lib", "libnvidia-ml.so.1")


def init_failure(ret: int, library_version: str = "N/A", text: str = "") -> Tuple[str, int]:
    """The message (stdout) and exit code of a failed nvmlInit."""
    if ret == ERROR_DRIVER_NOT_LOADED:
        return MSG_DRIVER_NOT_LOADED + "\n", 9
    if ret == ERROR_LIB_RM_VERSION_MISMATCH:
        return ("Failed to initialize NVML: Driver/library version mismatch\n"
                f"NVML library version: {library_version}\n"), 18
    text = text or ERROR_TEXT.get(ret, "Unknown Error")
    return f"Failed to initialize NVML: {text}\n", exit_code_for(ret)


def short_nvml_version(v: str) -> str:
    """``580.159`` from an NVML version (``13.580.159.03``; older libraries: ``12.535.161.07``)."""
    parts = v.split(".")
    return f"{parts[1]}.{parts[2]}" if len(parts) >= 3 else v


def _library_version(nv: Nvml, simdir: str) -> str:
    """The library's own version. A real nvidia-smi knows it without nvmlInit; here the simulated
    library has it in its scenario (``nvml_version``), readable only after init, so when init
    fails it is read from the same scenario file the library reads."""
    v = nv.string("nvmlSystemGetNVMLVersion", size=80)
    if isinstance(v, str) and v:
        return short_nvml_version(v)
    v = scenario_value(simdir, "nvml_version")
    return short_nvml_version(v) if v else "N/A"


def scenario_value(simdir: str, key: str) -> Optional[str]:
    """A key of DIR/scenario (what the real tool knows of its own library without asking it: its
    version, the layout its header gives the _v3 process entries), or None."""
    try:
        with open(os.path.join(simdir, "scenario"), encoding="utf-8") as f:
            for line in f:
                k, _sep, val = line.strip().partition(" ")
                if k == key and val.strip():
                    return val.strip()
    except OSError:
        pass
    return None


def v3_entry_bytes(simdir: str) -> int:
    v = scenario_value(simdir, "process_v3_entry_bytes")
    return 32 if v == "32" else 24


class Io:
    def __init__(self, out=None, err=None):
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def o(self, s: str):
        self.out.write(s)

    def e(self, s: str):
        self.err.write(s)


def absent_fields(simdir: str) -> Tuple[str, ...]:
    """The --query-gpu fields the nvidia-smi of the scenario's driver branch does not list
    (profiles.Profile.smi_absent_fields: memory.reserved before R510, ...)."""
    prof = profiles.PROFILES.get(scenario_value(simdir, "driver_profile") or profiles.DEFAULT_PROFILE)
    return prof.smi_absent_fields if prof else ()


def help_query_text(kind: str, absent: Sequence[str] = ()) -> str:
    table, aliases = (GPU_FIELDS, GPU_ALIASES) if kind == "gpu" else (APP_FIELDS, APP_ALIASES)
    lines = ["List of valid properties to query for the switch \"--query-%s\":" %
             ("gpu" if kind == "gpu" else "compute-apps"), ""]
    for name in table:
        if name in absent:
            continue
        alias = [a for a, c in aliases.items() if c == name and a != name]
        label = " or ".join(f'"{n}"' for n in [name] + alias)
        lines.append(label)
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str], simdir: str, out=None, err=None) -> int:
    """Run ``nvidia-smi argv`` against the simulated host in ``simdir``; returns the exit code."""
    io = Io(out, err)
    try:
        code = _main(argv, simdir, io)
        io.out.flush()
        return code
    except BrokenPipeError:
        # `nvidia-smi | head -1`: the reader went away; say nothing more (as a tool killed by
        # SIGPIPE would) and keep the interpreter's final flush from failing too.
        if io.out is sys.stdout:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return 141


def _main(argv: Sequence[str], simdir: str, io: Io) -> int:
    try:
        args = parse_args(argv)
        header = units = True
        fields: List[str] = []
        if args.query_gpu is not None or args.query_apps is not None:
            header, units = parse_format(args.format or "")
            kind = "gpu" if args.query_gpu is not None else "app"
            fields, bad = resolve_fields(args.query_gpu if kind == "gpu" else args.query_apps, kind)
            if bad is not None:
                raise UsageError(f'Field "{bad}" is not a valid field to query.\n\n')
            absent = absent_fields(simdir) if kind == "gpu" else ()
            for raw in args.query_gpu.split(",") if absent else ():
                if resolve_fields(raw, "gpu")[0][0] in absent:  # the branch's tool does not list it
                    raise UsageError(f'Field "{raw.strip()}" is not a valid field to query.\n\n')
    except UsageError as e:
        io.o(e.message)
        return e.code
    if args.help:
        io.o(USAGE.format(version=scenario_value(simdir, "driver_version") or "580.159.03"))
        return EXIT_OK
    if args.help_query:
        io.o(help_query_text(args.help_query, absent_fields(simdir) if args.help_query == "gpu" else ()))
        return EXIT_OK

    path = library_path(simdir)
    if not os.path.isfile(path):
        io.o(MSG_LIB_NOT_FOUND + "\n")
        return ERROR_LIBRARY_NOT_FOUND
    try:
        nv = Nvml(path)
    except OSError:
        io.o(MSG_LIB_NOT_FOUND + "\n")
        return ERROR_LIBRARY_NOT_FOUND
    nv.v3_entry_bytes = v3_entry_bytes(simdir)
    unknown = unknown_fields(nv, fields) if args.query_gpu is not None else None
    if unknown is not None:
        io.o(f'Field "{unknown}" is not a valid field to query.\n\n')
        return EXIT_BAD_ARGS
    ret = nv.call("nvmlInitWithFlags", ctypes.c_uint(0))
    if ret == ERROR_FUNCTION_NOT_FOUND:
        ret = nv.call("nvmlInit_v2")
    if ret != SUCCESS:
        libver = _library_version(nv, simdir) if ret == ERROR_LIB_RM_VERSION_MISMATCH else "N/A"
        text, code = init_failure(ret, libver, nv.error_string(ret))
        io.o(text)
        return code
    nv.simdir = simdir
    try:
        if args.reset:
            return gpu_reset(nv, args, simdir, io)
        return _run(nv, args, fields, header, units, io)
    finally:
        nv.call("nvmlShutdown")


def _run(nv: Nvml, args: Args, fields: List[str], header: bool, units: bool, io: Io) -> int:
    now = _dt.datetime.now()
    drv = nv.string("nvmlSystemGetDriverVersion", size=80)
    if args.version:
        cuda = nv.uint("nvmlSystemGetCudaDriverVersion")
        io.o(f"NVIDIA-SMI version  : {drv}\nNVML version        : {_library_version(nv, '')}\n"
             f"DRIVER version      : {drv}\nCUDA Version        : {cuda_version_text(cuda)}\n")
        return EXIT_OK
    count = nv.uint("nvmlDeviceGetCount_v2")
    if isinstance(count, Err) and count.code == ERROR_FUNCTION_NOT_FOUND:
        count = nv.uint("nvmlDeviceGetCount")
    if isinstance(count, Err):
        io.o(f"Unable to determine the number of GPUs: {count.text}\n")
        return exit_code_for(count.code)
    if count == 0:
        io.o(MSG_NO_DEVICES)
        return EXIT_NOT_FOUND

    idents: Dict[int, Dict] = {}
    if args.ids and not all(_is_index(t) for t in args.ids):
        # UUID, PCI bus id or serial: look at every GPU's identity
        idents = {i: identify(nv, i) for i in range(count)}
        sel = match_ids(args.ids, [idents[i] for i in range(count)])
    elif args.ids:
        sel = sorted({int(t) for t in args.ids})
        if any(i >= count for i in sel):
            sel = None
    else:
        sel = list(range(count))
    if sel is None:
        io.o(MSG_NO_DEVICES)
        return EXIT_NOT_FOUND

    if args.query:
        mode = "xml" if args.xml else "text"
    elif args.mig:
        mode = "mig"
    else:
        mode = "list" if args.list else ("gpu" if args.query_gpu is not None else
                                         "app" if args.query_apps is not None else "table")
    gpus: List[Dict] = []
    procs: List[Dict] = []
    reported = False
    failures: List[DeviceFailure] = []
    for i in sel:
        g = idents.get(i) or identify(nv, i)
        try:
            read_gpu(nv, g, need_table=(mode == "table"))
            if mode in ("xml", "text"):
                read_query_extras(nv, g)
            if mode in ("xml", "text", "list", "mig"):
                read_mig(nv, g)
            if mode == "gpu" and any(f in HEALTH_GPU_FIELDS for f in fields):
                read_health(nv, g)
            if mode == "gpu" and any(f.startswith("display_") for f in fields):
                read_display(nv, g)
            if mode in ("table", "xml", "text"):
                rows, rep = read_processes(nv, g, [("Compute", "C"), ("Graphics", "G"), ("MPSCompute", "M")])
            elif mode == "app":
                rows, rep = read_processes(nv, g, [("Compute", "C")])
            else:
                rows, rep = [], False
        except DeviceFailure as f:
            failures.append(f)
            continue
        gpus.append(g)
        procs.extend(rows)
        reported = reported or rep

    for f in failures:
        io.e(f.message())
    # A corrupted infoROM (nvmlDeviceValidateInforom: NVML_ERROR_CORRUPTED_INFOROM): a warning line on stdout
    # before the output, which is complete, and exit 14 (nvidia-smi(1) RETURN VALUE); `-q` says nothing and
    # exits 0 (README "Health", infoROM).
    corrupt = [] if mode in ("xml", "text") else [
        g for g in gpus if nv.call("nvmlDeviceValidateInforom", g["handle"]) == ERROR_CORRUPTED_INFOROM]
    for g in corrupt:
        io.o(f"WARNING: infoROM is corrupted at gpu {_legacy_bus(g)}\n")
    snap = {"timestamp": now, "driver_version": drv, "count": count, "gpus": gpus,
            "processes": procs, "procs_reported": reported}
    if mode == "mig":
        migs = [g for g in gpus if g.get("mig_current") == 1]
        if not migs:
            io.o("No MIG-enabled devices found.\n")
            return EXIT_NOT_FOUND
        if not any(g.get("mig") for g in migs):
            io.o("No GPU instances found: Not Found\n" if args.mig == "gi" else "No compute instances found: Not Found\n")
            return EXIT_NOT_FOUND
        io.o(render_mig_list(migs, args.mig))
    elif mode == "list":
        io.o(render_list(gpus))
    elif mode == "gpu":
        io.o(render_csv(fields, gpus, snap, "gpu", header, units))
    elif mode == "app":
        io.o(render_csv(fields, procs, snap, "app", header, units))
    elif mode in ("xml", "text"):
        # every selected GPU failed: the log is still printed, with no GPU in it
        snap["cuda_version"] = nv.uint("nvmlSystemGetCudaDriverVersion")
        io.o(render_query_xml(snap) if mode == "xml" else render_query_text(snap))
    else:
        if gpus:
            snap["cuda_version"] = nv.uint("nvmlSystemGetCudaDriverVersion")
            io.o(render_table(snap))
        else:
            io.o(MSG_NO_DEVICES)
    if failures:
        codes = [f.code for f in failures]
        return exit_code_for(ERROR_GPU_IS_LOST if ERROR_GPU_IS_LOST in codes else codes[0])
    return EXIT_INFOROM_CORRUPTED if corrupt else EXIT_OK


def read_display(nv: Nvml, g: Dict) -> None:
    """display_active / display_mode from the scenario (the library has no nvmlDeviceGetDisplayActive/Mode)."""
    from . import scenario as _scn  # noqa: PLC0415

    sim = _scn.load(nv.simdir).gpus[g["index"]]
    g["display_active"], g["display_mode"] = sim.display_active, sim.display_mode


# --- nvidia-smi -r (README "nvidia-smi -r": each message and exit code with its source) ----------------

RESET_DONE = "GPU {bus} was successfully reset.\n"
RESET_PRIMARY = "GPU Reset couldn't run because GPU {bus} is the primary GPU.\n"
RESET_IN_USE = (
    "GPU {bus} is currently in use by another process.\n\n1 device is currently being used by one or more other"
    " processes (e.g., Fabric Manager, CUDA application, graphics application such as an X server, or a monitoring"
    " application such as another instance of nvidia-smi). Please first kill all processes using this device and all"
    " compute applications running in the system.\n")
RESET_CLIENT = (
    "The following GPUs could not be reset:\n  GPU {bus}: In use by another client\n\n1 device is currently being"
    " used by one or more other processes (e.g. Fabric Manager, CUDA application, graphics application such as an X"
    " server, or a monitoring application such as another instance of nvidia-smi). Please first kill all processes"
    " using this device and all compute applications running in the system.\n")
RESET_NVSWITCH = (  # assumed wording (README): no public output of this refusal was found
    "GPU Reset couldn't run because GPU {bus} is connected to an NVSwitch fabric: the GPUs and NVSwitches of the"
    " fabric must be reset together.\n")
EXIT_RESET_REFUSED = 255  # "In use by another client": exit=255 (NVIDIA/NVSentinel#1690)
EXIT_NOT_AVAILABLE = 3  # "The requested operation is not available on target device" (nvidia-smi(1) RETURN VALUE)


def node_holders(path: str) -> List[int]:
    """The pids (other than this one) with ``path`` open: by device and inode, as fuser does."""
    try:
        want = os.stat(path)
    except OSError:
        return []
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        fddir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fddir)
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"{fddir}/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
                out.append(int(entry))
                break
    return out


def gpu_reset(nv: Nvml, args: Args, simdir: str, io: Io) -> int:
    """``nvidia-smi -r [-i ID]``: refuses a display GPU, an NVSwitch GPU, a GPU whose node a process holds, and one
    in persistence mode; else clears what a reset clears (leaked memory, pending remaps/retirements, volatile ECC)."""
    from . import scenario as _scn  # noqa: PLC0415

    sc = _scn.load(simdir)
    count = len(sc.gpus)
    if args.ids and not all(_is_index(t) for t in args.ids):
        sel = match_ids(args.ids, [identify(nv, i) for i in range(count)])
    elif args.ids:
        sel = sorted({int(t) for t in args.ids})
        sel = None if any(i >= count for i in sel) else sel
    else:
        sel = list(range(count))
    if not sel:
        io.o(MSG_NO_DEVICES)
        return EXIT_NOT_FOUND
    code = EXIT_OK
    for i in sel:
        g = sc.gpus[i]
        bus = g.pci_bus_id
        if g.display_active or g.display_mode:
            io.o(RESET_PRIMARY.format(bus=bus))
            code = code or EXIT_NOT_AVAILABLE
        elif g.fabric_state != 0:
            io.o(RESET_NVSWITCH.format(bus=bus))
            code = code or EXIT_NOT_AVAILABLE
        elif node_holders(os.path.join(simdir, "dev", f"nvidia{g.minor}")):
            io.o(RESET_IN_USE.format(bus=bus))
            code = code or EXIT_RESET_REFUSED
        elif g.persistence:
            io.o(RESET_CLIENT.format(bus=bus))
            code = code or EXIT_RESET_REFUSED
        else:
            with _scn.edit(simdir) as cur:
                c = cur.gpus[i]
                c.leaked_mib = 0
                c.remap_pending = c.retired_pending = 0
                c.ecc_volatile_corrected = c.ecc_volatile_uncorrected = 0
                # a pending MIG mode takes effect (README "MIG"): MIG on starts with no MIG device, MIG off has none
                if c.mig_current != c.mig_pending:
                    c.mig_current, c.mig_devices = c.mig_pending, []
            io.o(RESET_DONE.format(bus=bus))
    if not args.ids and code == EXIT_OK:
        io.o("All done.\n")
    return code


def _cli() -> int:  # pragma: no cover - `GPUSIM_DIR=DIR python -m gpusimkit.smi ...`
    # Without a scenario directory there is no library: the tool says so (exit 12).
    return main(sys.argv[1:], os.environ.get("GPUSIM_DIR") or os.path.join(os.sep, "nonexistent"))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_cli())
