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

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors

GPU_FIELDS = [
    "index", "uuid", "name", "serial", "pci.bus_id", "memory.total", "memory.used", "memory.free",
    "memory.reserved", "utilization.gpu", "utilization.memory", "temperature.gpu", "power.draw",
    "persistence_mode", "compute_mode", "mig.mode.current", "driver_version",
]
APP_FIELDS = ["gpu_uuid", "pid", "process_name", "used_memory"]
_MISSING = re.compile(r"^\[.*\]$|^N/A$|^$")
_COMPUTE_MODES = {"Default": "default", "Exclusive_Thread": "exclusive_thread", "Prohibited": "prohibited",
                  "Exclusive_Process": "exclusive_process"}
# nvidia-smi's documented exit codes that mean "the driver cannot be used at all".
_EXIT_KINDS = {4: "no_permission", 9: "driver_not_loaded", 12: "library_not_found", 18: "version_mismatch"}
_LOST_GPU = re.compile(r"GPU\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")


def value(text: str):
    """One CSV cell: None for [N/A], [Not Supported], [Unknown Error], N/A; else stripped text."""
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


def parse_gpus(out: str) -> list:
    """Rows of ``--query-gpu=<GPU_FIELDS> --format=csv,noheader,nounits``."""
    gpus = []
    for line in out.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) != len(GPU_FIELDS):
            raise ValueError(f"nvidia-smi --query-gpu: expected {len(GPU_FIELDS)} fields, got {len(cells)}: {line!r}")
        row = dict(zip(GPU_FIELDS, cells))
        mode = value(row["compute_mode"])
        gpus.append({
            "index": int(row["index"]),
            "uuid": value(row["uuid"]),
            "name": value(row["name"]),
            "serial": value(row["serial"]),
            "pci_bus_id": value(row["pci.bus_id"]),
            "minor_number": None,
            "memory": {
                "total": to_int(row["memory.total"]),
                "used": to_int(row["memory.used"]),
                "free": to_int(row["memory.free"]),
                "reserved": to_int(row["memory.reserved"]),
                # nvidia-smi reports memory.used without the reserved memory (memory.reserved, R510+).
                "used_includes_reserved": False if to_int(row["memory.used"]) is not None else None,
            },
            "utilization": {"gpu": to_int(row["utilization.gpu"]), "memory": to_int(row["utilization.memory"])},
            "temperature": to_int(row["temperature.gpu"]),
            "power": to_float(row["power.draw"]),
            "persistence_mode": to_bool_mode(row["persistence_mode"]),
            "compute_mode": None if mode is None else _COMPUTE_MODES.get(mode, mode.lower()),
            "mig_mode": to_bool_mode(row["mig.mode.current"]),
            "health": {"status": "ok", "detail": None},
            "processes": [],
            "processes_error": None,
            "unsupported": [],
            "errors": [],
            "_driver_version": value(row["driver_version"]),
        })
        gpu = gpus[-1]
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
            raise ValueError(f"nvidia-smi --query-compute-apps: cannot parse {line!r}")
        name, sep, used = head[2].rpartition(", ")
        if not sep:
            raise ValueError(f"nvidia-smi --query-compute-apps: cannot parse {line!r}")
        pid = to_int(head[1])
        if pid is None:
            continue
        apps.append({"gpu_uuid": value(head[0]), "pid": pid, "name": value(name), "used_mib": to_int(used)})
    return apps


def parse_minor_numbers(xml_text: str) -> dict:
    """{uuid: minor number} from ``nvidia-smi -q -x`` (the CSV queries have no minor number)."""
    import xml.etree.ElementTree as ET  # a trusted local program's output, not user input

    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise ValueError(f"nvidia-smi -q -x: not XML ({exc})") from None
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
    return _errors.BackendError(f"nvidia-smi failed with exit {rc}: {text}", backend="nvidia-smi", rc=rc)


def _run_both(run, first, second):
    """Run two independent nvidia-smi queries at once: each costs a driver round trip."""
    import threading

    box = {}

    def target():
        try:
            box["second"] = run(second)
        except Exception as exc:  # pylint: disable=broad-except  # re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    one = run(first)
    thread.join()
    if "error" in box:
        raise box["error"]
    return one, box["second"]


def query(run, executable: str, minor_numbers=None) -> dict:
    """A raw snapshot through nvidia-smi. ``run(argv) -> (rc, out, err)``.

    ``minor_numbers``: a dict {uuid: minor} to fill in (from ``minor_query``), else they are null.
    The GPU and the process queries run at the same time.
    """
    (rc, out, err), apps = _run_both(
        run,
        [executable, "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"],
        [executable, "--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader,nounits"])
    if rc == 6 and "No devices were found" in (out + err):
        return {"driver": {"backend": "nvidia-smi", "driver_version": None, "nvml_version": None,
                           "cuda_driver_version": None}, "gpus": []}
    if rc != 0:
        raise error_for_exit(rc, out, err)
    gpus = parse_gpus(out)
    rc, out, err = apps
    if rc != 0:
        raise error_for_exit(rc, out, err)
    by_uuid = {g["uuid"]: g for g in gpus}
    for app in parse_apps(out):
        gpu = by_uuid.get(app["gpu_uuid"])
        if gpu is not None:
            gpu["processes"].append({"pid": app["pid"], "types": ["compute"], "used_mib": app["used_mib"]})
    driver_version = gpus[0].pop("_driver_version") if gpus else None
    for g in gpus:
        g.pop("_driver_version", None)
        g["minor_number"] = (minor_numbers or {}).get(g["uuid"])
    return {"driver": {"backend": "nvidia-smi", "driver_version": driver_version, "nvml_version": None,
                       "cuda_driver_version": None}, "gpus": gpus}


def minor_query(run, executable: str) -> dict:
    """{uuid: minor} from one ``nvidia-smi -q -x``; {} when this nvidia-smi cannot say."""
    rc, out, _err = run([executable, "-q", "-x"])
    if rc != 0:
        return {}
    try:
        return parse_minor_numbers(out)
    except ValueError:
        return {}
