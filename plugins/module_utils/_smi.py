# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The nvidia-smi backend: the same raw snapshot as _nvml, from nvidia-smi's CSV query output.

The parsers are pure and table-tested; ``query`` takes a ``run`` callable (argv -> rc, out, err)
so that the module decides how commands run (argv lists, never a shell).
"""

from __future__ import annotations

import re

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _health, _raw

GPU_FIELDS = [
    "index", "uuid", "name", "serial", "pci.bus_id", "memory.total", "memory.used", "memory.free",
    "memory.reserved", "utilization.gpu", "utilization.memory", "temperature.gpu", "power.draw",
    "persistence_mode", "compute_mode", "mig.mode.current", "mig.mode.pending", "driver_version",
]
APP_FIELDS = ["gpu_uuid", "pid", "process_name", "used_memory"]
# Without these a row cannot be placed. Every other field can be done without: before R510 nvidia-smi has no
# memory.reserved and refuses the whole query for it (exit 2); then only the fields its --help-query-gpu lists
# are asked, for the rest of the run.
REQUIRED_FIELDS = ("index", "uuid")
NVML_HINT = ("The NVML backend (backend: nvml, with the nvidia-ml-py package on the target) reads every driver"
             " branch without nvidia-smi's field list.")
_LISTED_FIELD = re.compile(r'^"[^"]+"(?:\s+or\s+"[^"]+")*\s*$')
_REFUSED_FIELD = re.compile(r'Field "([^"]*)" is not a valid field to query')
# {executable: the names its --help-query-gpu lists, or None when it could not say}: read once per run, when
# the executable first refuses a field; {executable: the fields it refused}.
_LISTED = {}
_DROPPED = {}
_MISSING = re.compile(r"^\[.*\]$|^N/A$|^$")
_COMPUTE_MODES = {"Default": "default", "Exclusive_Thread": "exclusive_thread", "Prohibited": "prohibited",
                  "Exclusive_Process": "exclusive_process"}
# nvidia-smi's documented exit codes that mean "the driver cannot be used at all".
_EXIT_KINDS = {4: "no_permission", 9: "driver_not_loaded", 12: "library_not_found", 18: "version_mismatch"}
# nvidia-smi(1) RETURN VALUE: the codes after which the output is complete and valid - a warning, not a failure.
WARNING_EXITS = {14: "infoROM is corrupted"}
# A line nvidia-smi prints before (or among) its output to warn: "WARNING: infoROM is corrupted at gpu 0000:4E:00.0".
_WARNING_LINE = re.compile(r"^\s*WARNING:\s*(.*?)\s*$")
_INFOROM_AT = re.compile(r"infoROM is corrupted at gpu\s+([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])", re.I)
_LOST_GPU = re.compile(r"GPU\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")


def without_warnings(answer):
    """(rc, out, err, warnings) of one nvidia-smi answer (rc, out, err): its WARNING lines taken out of ``out`` and
    ``err`` (``warnings``: their text), and an exit code of WARNING_EXITS read as 0 (the output is complete)."""
    rc, out, err = answer
    warnings = []

    def strip(text):
        kept = []
        for line in (text or "").splitlines(True):
            m = _WARNING_LINE.match(line)
            if m:
                if m.group(1) and m.group(1) not in warnings:
                    warnings.append(m.group(1))
            else:
                kept.append(line)
        return "".join(kept)

    out, err = strip(out), strip(err)
    if rc in WARNING_EXITS:
        if not warnings:
            warnings.append(f"nvidia-smi exit {rc}: {WARNING_EXITS[rc]} (nvidia-smi(1) RETURN VALUE)")
        rc = 0
    return rc, out, err, warnings


def reading(run, warnings=None):
    """``run`` (argv -> rc, out, err) whose answers come without_warnings; their warnings are added to ``warnings``."""
    def run_read(argv):
        rc, out, err, said = without_warnings(run(argv))
        if warnings is not None:
            warnings.extend(w for w in said if w not in warnings)
        return rc, out, err
    return run_read


def merge_warnings(gpus: list, warnings: list) -> None:
    """nvidia-smi's warnings into a raw snapshot's GPUs: ``inforom_corrupt`` (True for the GPUs named by an infoROM
    warning, False for the others), and each warning in the ``errors`` of the GPU it names (of every GPU when it names
    none) - reported, never a failure."""
    named = {}
    for text in warnings:
        m = _INFOROM_AT.search(text)
        if m:
            named.setdefault(_health.gpu_bus_key(m.group(1)), []).append(text)
    for g in gpus:
        mine = named.get(_health.gpu_bus_key(g.get("pci_bus_id")), [])
        g["inforom_corrupt"] = bool(mine)
        for text in mine or [w for w in warnings if not _INFOROM_AT.search(w)]:
            g["errors"].append(f"GPU {g['index']}: nvidia-smi: WARNING: {text}")


def value(text: str):
    """One CSV cell: None for [N/A], [Not Supported], [Unknown Error], N/A, or a field not asked; else stripped text."""
    if text is None:
        return None
    text = text.strip()
    return None if _MISSING.match(text) else text


def to_int(text):
    v = value(text) if text is not None else None
    if v is None:
        return None
    try:
        return int(float(v))
    except ValueError:
        return None


def to_float(text):
    v = value(text) if text is not None else None
    if v is None:
        return None
    try:
        return float(v)
    except ValueError:
        return None


def to_bool_mode(text):
    v = value(text)
    return None if v is None else v.lower() == "enabled"


def _index(text: str, source: str, line: str) -> int:
    """A row's GPU index, or UnreadableOutput naming the row."""
    if not (text.isdigit() and text.isascii()):
        raise _errors.UnreadableOutput(source, f"the GPU index {text[:20]!r} is not a number", line, NVML_HINT)
    return int(text)


def parse_gpus(out: str, fields=None) -> list:
    """Rows of ``--query-gpu=<fields> --format=csv,noheader,nounits``; ``fields``: the ones asked (GPU_FIELDS
    by default), a field not asked reads as null."""
    fields = list(fields or GPU_FIELDS)
    gpus = []
    for line in out.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) != len(fields):
            raise _errors.UnreadableOutput("nvidia-smi --query-gpu", f"expected {len(fields)} fields, got {len(cells)}",
                                           line, NVML_HINT)
        row = dict(zip(fields, cells))
        mode = value(row.get("compute_mode"))
        gpu = _raw.empty_gpu(_index(row["index"], "nvidia-smi --query-gpu", line))
        used = to_int(row.get("memory.used"))
        gpu.update(
            uuid=value(row["uuid"]), name=value(row.get("name")), serial=value(row.get("serial")),
            pci_bus_id=value(row.get("pci.bus_id")),
            memory={"total": to_int(row.get("memory.total")), "used": used, "free": to_int(row.get("memory.free")),
                    "reserved": to_int(row.get("memory.reserved")),
                    # nvidia-smi reports memory.used without the reserved memory (memory.reserved, R510+); an
                    # nvidia-smi without memory.reserved (before R510) reads NVML's v1 figures, whose used includes it.
                    "used_includes_reserved": None if used is None else "memory.reserved" not in row},
            utilization={"gpu": to_int(row.get("utilization.gpu")), "memory": to_int(row.get("utilization.memory"))},
            temperature=to_int(row.get("temperature.gpu")), power=to_float(row.get("power.draw")),
            persistence_mode=to_bool_mode(row.get("persistence_mode")),
            compute_mode=None if mode is None else _COMPUTE_MODES.get(mode, mode.lower()),
            mig_mode=to_bool_mode(row.get("mig.mode.current")), mig_mode_pending=to_bool_mode(row.get("mig.mode.pending")),
            _driver_version=value(row.get("driver_version")))
        gpus.append(gpu)
        # nvidia-smi prints [N/A] (older: [Not Supported]) for what the GPU or driver cannot give.
        gpu["unsupported"] = [key for key, missing in (
            ("serial", gpu["serial"] is None), ("memory", gpu["memory"]["used"] is None),
            ("utilization", gpu["utilization"]["gpu"] is None), ("temperature", gpu["temperature"] is None),
            ("power", gpu["power"] is None), ("persistence_mode", gpu["persistence_mode"] is None),
            ("compute_mode", gpu["compute_mode"] is None), ("mig_mode", gpu["mig_mode"] is None)) if missing]
    return gpus


def parse_apps(out: str) -> list:
    """Rows of ``--query-compute-apps=<APP_FIELDS> --format=csv,noheader,nounits``.

    The process name may itself contain ', ', so the row is split twice from the left and once
    from the right.
    """
    apps = []
    for line in out.splitlines():
        if not line.strip() or line.strip().startswith("No running"):
            continue
        head = line.split(", ", 2)
        if len(head) != 3:
            raise _errors.UnreadableOutput("nvidia-smi --query-compute-apps", "expected gpu_uuid, pid, process_name,"
                                           " used_memory", line, NVML_HINT)
        name, sep, used = head[2].rpartition(", ")
        if not sep:
            raise _errors.UnreadableOutput("nvidia-smi --query-compute-apps", "expected gpu_uuid, pid, process_name,"
                                           " used_memory", line, NVML_HINT)
        pid = to_int(head[1])
        if pid is None:
            continue
        apps.append({"gpu_uuid": value(head[0]), "pid": pid, "name": value(name), "used_mib": to_int(used)})
    return apps


def _xml_root(xml_text: str):
    """The root of ``nvidia-smi -q -x``'s log; UnreadableOutput when it is not XML."""
    import xml.etree.ElementTree as ET  # a trusted local program's output, not user input

    try:
        return ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise _errors.UnreadableOutput("nvidia-smi -q -x", f"not XML ({exc})", xml_text) from None


def parse_minor_numbers(xml_text: str) -> dict:
    """{uuid: minor number} from ``nvidia-smi -q -x`` (the CSV queries have no minor number)."""
    root = _xml_root(xml_text)
    out = {}
    for gpu in root.iter("gpu"):
        uuid = (gpu.findtext("uuid") or "").strip()
        minor = to_int(gpu.findtext("minor_number") or "")
        if uuid and minor is not None:
            out[uuid] = minor
    return out


def error_for_exit(rc: int, out: str, err: str) -> _errors.GpuError:
    """The typed error for a failed nvidia-smi run."""
    text = " ".join((out + " " + err).split())
    kind = _EXIT_KINDS.get(rc)
    if kind:
        return _errors.message_for_init_failure(kind, "nvidia-smi", f"nvidia-smi exit {rc}: {text}")
    if rc == 15:
        m = _LOST_GPU.search(text)
        where = f"GPU {m.group(1)}" if m else "a GPU"
        return _errors.GpuLost(
            f"{where} has fallen off the bus (nvidia-smi exit 15: {text}). Reboot the host to recover it;"
            " check dmesg for Xid 79.", pci_bus_id=m.group(1) if m else None, backend="nvidia-smi")
    if rc == 6 and "No devices were found" in text:
        return _errors.BackendError("nvidia-smi found no GPUs (exit 6: No devices were found)",
                                    backend="nvidia-smi", rc=rc)
    return _errors.BackendError(f"nvidia-smi failed with exit {rc}: {text}. {NVML_HINT}", backend="nvidia-smi", rc=rc)


def parse_listed_fields(text: str) -> set:
    """The field names (and their aliases) of ``nvidia-smi --help-query-gpu``: the lines that hold only
    quoted names (``"name" or "gpu_name"``); a description that starts with a quoted word is not one."""
    names = set()
    for line in (text or "").splitlines():
        if _LISTED_FIELD.match(line.strip()):
            names.update(re.findall(r'"([^"]+)"', line))
    return names


def listed_fields(run, executable: str):
    """What this nvidia-smi's ``--help-query-gpu`` lists (a set), or None when it cannot say; asked once per run."""
    if executable not in _LISTED:
        rc, out, _err = reading(run)([executable, "--help-query-gpu"])
        names = parse_listed_fields(out) if rc == 0 else set()
        _LISTED[executable] = names if "index" in names and "uuid" in names else None
    return _LISTED[executable]


def gpu_fields(executable: str) -> list:
    """The GPU_FIELDS to ask this nvidia-smi: all of them, until it refused one in this run; then those its
    listing names, less those it refused (REQUIRED_FIELDS are always asked)."""
    listed, dropped = _LISTED.get(executable), _DROPPED.get(executable, set())
    return [f for f in GPU_FIELDS
            if f in REQUIRED_FIELDS or ((listed is None or f in listed) and f not in dropped)]


def _query_gpus(run, executable: str, fields: list, first=None):
    """(rc, out, err, fields) of ``--query-gpu``. When nvidia-smi refuses a field (exit 2, ``Field "x" is not
    a valid field to query.``), its ``--help-query-gpu`` is read (once per run) and the query asked again with
    the fields it lists, less the refused one: at most once per field."""
    answer = first
    for _attempt in range(len(GPU_FIELDS) + 1):
        if answer is None:
            answer = run([executable, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
        rc, out, err = answer
        m = _REFUSED_FIELD.search(out + err) if rc == 2 else None
        if not m or m.group(1) not in fields or m.group(1) in REQUIRED_FIELDS:
            return rc, out, err, fields
        _DROPPED.setdefault(executable, set()).add(m.group(1))
        listed_fields(run, executable)
        fields = gpu_fields(executable)
        answer = None
    return rc, out, err, fields  # pragma: no cover - bounded by the number of fields


_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s+(MIG-[0-9A-Fa-f-]+)\)\s*$")
_GPU_LINE = re.compile(r"^GPU\s+(\d+):.*\(UUID:\s+(GPU-[0-9A-Fa-f-]+)\)\s*$")


def parse_mig_list(text: str) -> dict:
    """{GPU UUID: [(profile, MIG UUID), ...] in device order} from ``nvidia-smi -L`` (a MIG device's line follows
    its GPU's: ``  MIG 3g.40gb     Device  0: (UUID: MIG-...)``)."""
    out, current = {}, None
    for line in (text or "").splitlines():
        m = _GPU_LINE.match(line)
        if m:
            current = out.setdefault(m.group(2), [])
            continue
        m = _MIG_LINE.match(line)
        if m and current is not None:
            current.append((m.group(1), m.group(3)))
    return out


def parse_mig_xml(xml_text: str) -> dict:
    """{GPU UUID: {"devices": [(gi, ci, memory)], "processes": [(pid, gi, ci)]}} from ``nvidia-smi -q -x``'s
    ``mig_devices`` (index order) and ``processes/process_info`` (tests/gpusim/README.md "MIG")."""
    root = _xml_root(xml_text)
    out = {}
    for gpu in root.iter("gpu"):
        uuid = (gpu.findtext("uuid") or "").strip()
        devices = []
        for dev in gpu.findall("mig_devices/mig_device"):
            mem = {k: to_int((dev.findtext(f"fb_memory_usage/{k}") or "").replace("MiB", ""))
                   for k in ("total", "used", "free", "reserved")}
            mem["used_includes_reserved"] = False
            devices.append((to_int(dev.findtext("gpu_instance_id") or ""), to_int(dev.findtext("compute_instance_id") or ""),
                            mem))
        procs = [(to_int(p.findtext("pid") or ""), to_int(p.findtext("gpu_instance_id") or ""),
                  to_int(p.findtext("compute_instance_id") or "")) for p in gpu.findall("processes/process_info")]
        out[uuid] = {"devices": devices, "processes": [p for p in procs if p[0] is not None],
                     "pending": to_bool_mode(gpu.findtext("mig_mode/pending_mig") or "")}
    return out


def mig_devices(run, executable: str, gpus: list) -> None:
    """The MIG devices of the GPUs in MIG mode (in place, _raw.mig_device each): their UUIDs and profiles from
    ``nvidia-smi -L``, their ids, memory and processes from ``-q -x`` (its ``process_info`` gives each process's GPU
    and compute instance; ``--query-compute-apps`` names only the GPU), their capability nodes from the driver's
    /proc files (_mig), and the pending MIG mode where ``--query-gpu`` could not give it (``mig_mode/pending_mig``).
    What nvidia-smi cannot say leaves ``mig_devices`` null (noted in ``errors``)."""
    migs = [g for g in gpus if g.get("mig_mode")]
    if not migs:
        return
    run = reading(run)
    try:
        rc_l, out_l, _err = run([executable, "-L"])
        rc_x, out_x, _err = run([executable, "-q", "-x"])
        listed = parse_mig_list(out_l) if rc_l == 0 else None
        xml = parse_mig_xml(out_x) if rc_x == 0 else None
    except (_errors.GpuError, ValueError) as exc:
        listed = xml = None
        problem = str(getattr(exc, "msg", exc))
    else:
        problem = f"nvidia-smi -L exited {rc_l}, -q -x exited {rc_x}"
    for g in migs:
        names, info = (listed or {}).get(g["uuid"]), (xml or {}).get(g["uuid"])
        if g.get("mig_mode_pending") is None:
            g["mig_mode_pending"] = None if info is None else info["pending"]
        if names is None or info is None or len(names) != len(info["devices"]):
            g["mig_devices"] = None
            why = problem if listed is None or xml is None else "nvidia-smi -L and -q -x disagree"
            g["errors"].append(f"GPU {g['index']}: its MIG devices could not be read ({why})")
            continue
        out = []
        for (profile, uuid), (gi, ci, mem) in zip(names, info["devices"]):
            dev = _raw.mig_device(uuid)
            dev.update(profile=profile, name=f"{g.get('name')} MIG {profile}", gpu_instance_id=gi, compute_instance_id=ci,
                       memory=mem)  # its device_nodes: _host.mig_caps
            by_pid = {p["pid"]: p for p in g["processes"]}
            for pid, pgi, pci in info["processes"]:
                if (pgi, pci) == (gi, ci):
                    dev["processes"].append(by_pid.get(pid) or _raw.process(pid, ["compute"], None))
            out.append(dev)
        g["mig_devices"] = out


def query(run, executable: str, minor_numbers=None, background=None) -> dict:
    """A raw snapshot through nvidia-smi. ``run(argv) -> (rc, out, err)``; ``background(fn, *args)``: a job whose
    ``result()`` is ``fn(*args)`` (_host.calls.Background), to run the GPU and the process queries at the same time
    (each costs a driver round trip); None: one after the other.

    ``minor_numbers``: a dict {uuid: minor} to fill in (from ``minor_query``), else they are null.
    A field this nvidia-smi refuses is left out for the rest of the run, and so is every field its
    ``--help-query-gpu`` does not list (read once, at the first refusal): the driver's ``missing_fields`` names the
    GPU_FIELDS it could not give (memory.reserved before R510).
    """
    warnings = []
    run = reading(run, warnings)
    fields = gpu_fields(executable)
    apps_argv = [executable, "--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader,nounits"]
    apps_job = background(run, apps_argv) if background else None
    first = run([executable, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
    apps = apps_job.result() if apps_job else run(apps_argv)
    rc, out, err, fields = _query_gpus(run, executable, fields, first)
    missing = [f for f in GPU_FIELDS if f not in fields]
    if rc == 6 and "No devices were found" in (out + err):
        return {"driver": {"backend": "nvidia-smi", "driver_version": None, "nvml_version": None,
                           "cuda_driver_version": None, "missing_fields": missing}, "gpus": []}
    if rc != 0:
        raise error_for_exit(rc, out, err)
    gpus = parse_gpus(out, fields)
    if not gpus:
        # exit 0 and no row is no answer, never "no GPU": nvidia-smi says that with exit 6 (above).
        raise _errors.BackendError(
            f"nvidia-smi --query-gpu exited 0 and gave no GPU row (asked: {', '.join(fields)}; not asked, as this"
            f" nvidia-smi does not list or refused them: {', '.join(missing) or 'none'}; output: {(out + err).strip()!r})."
            f" {NVML_HINT}", backend="nvidia-smi", rc=rc, missing_fields=missing)
    rc, out, err = apps
    if rc != 0:
        raise error_for_exit(rc, out, err)
    by_uuid = {g["uuid"]: g for g in gpus}
    for app in parse_apps(out):
        gpu = by_uuid.get(app["gpu_uuid"])
        if gpu is not None:
            gpu["processes"].append(_raw.process(app["pid"], ["compute"], app["used_mib"]))
    driver_version = gpus[0].pop("_driver_version") if gpus else None
    for g in gpus:
        g.pop("_driver_version", None)
        g["minor_number"] = (minor_numbers or {}).get(g["uuid"])
    mig_devices(run, executable, gpus)
    merge_warnings(gpus, warnings)
    return {"driver": {"backend": "nvidia-smi", "driver_version": driver_version, "nvml_version": None,
                       "cuda_driver_version": None, "missing_fields": missing}, "gpus": gpus}


def minor_query(run, executable: str) -> dict:
    """{uuid: minor} from one ``nvidia-smi -q -x``; {} when this nvidia-smi cannot say."""
    rc, out, _err = reading(run)([executable, "-q", "-x"])
    if rc != 0:
        return {}
    try:
        return parse_minor_numbers(out)
    except ValueError:
        return {}


# --- health (_health.CHECKS): one more --query-gpu, negotiated field by field -----------------------

# (field, the raw health field it fills, its name in ``unsupported``); the first of the clock reasons
# that this nvidia-smi knows is used (clocks_event_reasons from R535 on).
HEALTH_FIELDS = [
    ("remapped_rows.correctable", "remapped_rows", "remapped_rows"),
    ("remapped_rows.uncorrectable", "remapped_rows", "remapped_rows"),
    ("remapped_rows.pending", "remapped_rows", "remapped_rows"),
    ("remapped_rows.failure", "remapped_rows", "remapped_rows"),
    ("retired_pages.pending", "retired_pages_pending", "retired_pages"),
    ("ecc.errors.uncorrected.volatile.total", "ecc_uncorrected_volatile", "ecc"),
    ("fabric.state", "fabric", "fabric"),
    ("fabric.status", "fabric", "fabric"),
    ("clocks_event_reasons.active", "clock_event_reasons", "clock_event_reasons"),
    ("clocks_throttle_reasons.active", "clock_event_reasons", "clock_event_reasons"),
]
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
_YES = {"yes": True, "no": False, "1": True, "0": False, "true": True, "false": False, "enabled": True,
        "disabled": False}


def _yes(text):
    v = value(text) if text is not None else None
    return None if v is None else _YES.get(v.lower())


def parse_health(fields, out: str) -> dict:
    """{index: raw health fields} from ``--query-gpu=index,<fields> --format=csv,noheader,nounits``."""
    rows = {}
    for line in out.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) != len(fields) + 1:
            raise _errors.UnreadableOutput("nvidia-smi --query-gpu (health)", f"expected {len(fields) + 1} fields, got"
                                           f" {len(cells)}", line, NVML_HINT)
        row = dict(zip(fields, cells[1:]))
        health = {}
        if "remapped_rows.pending" in row:
            pending, failure = _yes(row["remapped_rows.pending"]), _yes(row.get("remapped_rows.failure"))
            health["remapped_rows"] = None if pending is None else {
                "corrected": to_int(row.get("remapped_rows.correctable")),
                "uncorrected": to_int(row.get("remapped_rows.uncorrectable")), "pending": pending,
                "failure": bool(failure)}
        if "retired_pages.pending" in row:
            health["retired_pages_pending"] = _yes(row["retired_pages.pending"])
        if "ecc.errors.uncorrected.volatile.total" in row:
            health["ecc_uncorrected_volatile"] = to_int(row["ecc.errors.uncorrected.volatile.total"])
        if "fabric.state" in row:
            state = value(row["fabric.state"])
            health["fabric"] = None if state is None else {"state": state, "status": value(row.get("fabric.status", ""))}
        reasons = row.get("clocks_event_reasons.active", row.get("clocks_throttle_reasons.active"))
        if reasons is not None:
            mask = value(reasons)
            try:
                health["clock_event_reasons"] = None if mask is None else _clock_names(int(mask, 16))
            except ValueError:
                health["clock_event_reasons"] = None
        rows[_index(cells[0], "nvidia-smi --query-gpu (health)", line)] = health
    return rows


def _clock_names(mask: int) -> list:
    from ansible_collections.gpuops.gpu.plugins.module_utils import _health  # only here: _health is pure

    return _health.clock_reason_names(mask)


def health_query(run, executable: str, known=None) -> dict:
    """{index: raw health fields} through one nvidia-smi query.

    ``known``: a dict kept by the caller across snapshots: the fields this nvidia-smi accepts are
    found once (an older nvidia-smi refuses a field it does not know, naming it: that field is left
    out and its health field listed as unsupported), then reused.
    """
    known = known if known is not None else {}
    run = reading(run)  # the warnings are the snapshot query's (query) to report
    if "fields" not in known:
        fields = [f for f, _key, _name in HEALTH_FIELDS if f != "clocks_throttle_reasons.active"]
        refused = []
    else:
        fields, refused = known["fields"], known["refused"]
    for _attempt in range(len(HEALTH_FIELDS) + 1):
        if not fields:
            break
        rc, out, err = run([executable, "--query-gpu=index," + ",".join(fields), "--format=csv,noheader,nounits"])
        m = _INVALID_FIELD.search(out + err) if rc == 2 else None
        if m and m.group(1) in fields:
            # A field this nvidia-smi does not know: its whole group goes (remapped_rows.*, fabric.*), which
            # the same query came with, so that an old nvidia-smi costs one run per group, not per field.
            group = m.group(1).rsplit(".", 1)[0] + "."
            bad = [f for f in fields if f == m.group(1) or (group in ("remapped_rows.", "fabric.") and f.startswith(group))]
            fields = [f for f in fields if f not in bad]
            refused.extend(bad)
            bad = m.group(1)
            if bad == "clocks_event_reasons.active" and "clocks_throttle_reasons.active" not in refused:
                fields.append("clocks_throttle_reasons.active")  # the name before R535
            continue
        if rc != 0:
            raise error_for_exit(rc, out, err)
        known["fields"], known["refused"] = fields, refused
        rows = parse_health(fields, out)
        break
    else:  # pragma: no cover - every field refused one by one
        fields, rows = [], {}
    known.setdefault("fields", fields)
    known.setdefault("refused", refused)
    return rows if fields else {}


def merge_health(gpus: list, rows: dict, problem=None) -> None:
    """Put the health fields into a raw snapshot's GPUs; a field nvidia-smi cannot give ([N/A], or a
    field this nvidia-smi does not know) is None and listed in the GPU's ``unsupported``. ``problem``:
    why the health query failed (then every field is None and each GPU's ``errors`` says so)."""
    names = {}
    for _f, key, name in HEALTH_FIELDS:
        names.setdefault(key, name)
    for g in gpus:
        health = (rows or {}).get(g["index"]) or {}
        for key, name in names.items():
            g[key] = health.get(key)
            if g[key] is None and problem is None and name not in g["unsupported"]:
                g["unsupported"].append(name)
        if problem:
            g["errors"].append(f"GPU {g['index']}: {problem}")
