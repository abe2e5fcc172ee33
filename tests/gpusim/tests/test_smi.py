"""Tests of the simulated ``nvidia-smi`` (gpusimkit/smi.py).

Two parts:

- pure logic, table-driven: field names and aliases, value formatting, the CSV, argument
  parsing, ``-i`` matching, and the default table checked line by line against lines captured
  from real R580 drivers;
- end to end: a scenario directory in tmp with the simulated library installed, real ``sleep``
  processes registered in ``procs``, ``smi.main`` run in a fresh interpreter (so the library is
  loaded anew each time), and every fault's exit code and message.
"""

from __future__ import annotations

import ctypes
import datetime
import io
import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

GPUSIM = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if GPUSIM not in sys.path:
    sys.path.insert(0, GPUSIM)

from gpusimkit import scenario, smi  # noqa: E402

MIB = 1048576
WHEN = datetime.datetime(2026, 7, 5, 14, 53, 15, 123456)

# --- lines captured from real R580 drivers (public outputs) --------------------------------
REAL_R580 = {
    # 580.159.03, 2 x Quadro RTX 8000
    "quadro_1": "|   0  Quadro RTX 8000                Off |   00000000:15:00.0 Off |                  Off |",
    "quadro_2": "| 33%   30C    P8             13W /  260W |   14453MiB /  49152MiB |      1%      Default |",
    # 580.105.08, Tesla T4
    "t4_1": "|   0  Tesla T4                       On  |   00000000:00:1E.0 Off |                    0 |",
    "t4_2": "| N/A   30C    P8              9W /   70W |       0MiB /  15360MiB |      0%      Default |",
    "t4_3": "|                                         |                        |                  N/A |",
    # 580.65.05, a name longer than the column
    "long_1": "|   0  NVIDIA GeForce RTX 5090 ...    On  |   00000000:01:00.0 Off |                  N/A |",
    "long_2": "| N/A   45C    P8              5W /  150W |   22504MiB /  24463MiB |      0%      Default |",
    "version": "| NVIDIA-SMI 580.159.03             Driver Version: 580.159.03     CUDA Version: 13.0     |",
    "proc_c": "|    0   N/A  N/A           17892      C   /app/.venv/bin/python3                 3444MiB |",
    "proc_na": "|    0   N/A  N/A              32      G   /Xwayland                             N/A      |",
    "proc_long": "|    0   N/A  N/A           36532      C   ...urce\\repos\\CARTAN\\geomind.exe      N/A      |",
}

# What an idle 1 x H200 host prints (R580 layout, values of the simulator's defaults).
# (The first line ends in 7 spaces, as the real one does.)
H200_IDLE_TABLE = "Sun Jul  5 14:53:15 2026" + " " * 7 + """
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.159.03             Driver Version: 580.159.03     CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H200                    On  |   00000000:18:00.0 Off |                    0 |
| N/A   31C    P0             76W /  700W |       0MiB / 143771MiB |      0%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
"""


def h200(index=0, used_mib=0, **kw):
    g = {
        "index": index, "name": "NVIDIA H200", "uuid": f"GPU-00000000-0000-0000-0000-00000000000{index}",
        "serial": "165400000000%d" % index, "bus_id": "00000000:%02X:00.0" % scenario.HGX_BUSES[index],
        "minor": index, "persistence": 1, "fan": smi.NA, "temperature": 31, "pstate": 0,
        "power_mw": 76000, "power_limit_mw": 700000, "util_gpu": 0, "util_mem": 0, "compute_mode": 0,
        "mig_current": 0, "mig_pending": 0, "ecc_uncorrected": 0, "display_active": 0,
        "memory": {"total": 143771 * MIB, "used": used_mib * MIB, "free": (143771 - used_mib) * MIB, "reserved": 0},
    }
    g.update(kw)
    return g


def snap(gpus, processes=(), reported=None):
    return {"timestamp": WHEN, "driver_version": "580.159.03", "cuda_version": 13000, "count": len(gpus),
            "gpus": list(gpus), "processes": list(processes),
            "procs_reported": bool(processes) if reported is None else reported}


# =========================================================================================
# pure logic
# =========================================================================================


@pytest.mark.parametrize("spec, kind, fields", [
    ("index,uuid,name", "gpu", ["index", "uuid", "name"]),
    ("gpu_name,gpu_uuid,gpu_bus_id,gpu_serial", "gpu", ["name", "uuid", "pci.bus_id", "serial"]),
    ("memory.used, memory.total", "gpu", ["memory.used", "memory.total"]),
    ("Persistence_Mode,MIG.MODE.CURRENT", "gpu", ["persistence_mode", "mig.mode.current"]),
    ("pid,name,used_memory", "app", ["pid", "process_name", "used_gpu_memory"]),
    ("gpu_uuid,gpu_bus_id,gpu_name,gpu_serial,process_name,used_gpu_memory", "app",
     ["gpu_uuid", "gpu_bus_id", "gpu_name", "gpu_serial", "process_name", "used_gpu_memory"]),
])
def test_resolve_fields(spec, kind, fields):
    assert smi.resolve_fields(spec, kind) == (fields, None)


@pytest.mark.parametrize("spec, kind, bad", [
    ("index,xyz", "gpu", "xyz"),
    ("cuda_version", "gpu", "cuda_version"),
    ("pid,memory.used", "app", "memory.used"),
    ("uuid", "app", "uuid"),
])
def test_resolve_fields_rejects(spec, kind, bad):
    assert smi.resolve_fields(spec, kind) == ([], bad)


@pytest.mark.parametrize("field, raw, units, expected", [
    ("memory.used", 81920 * MIB, True, "81920 MiB"),
    ("memory.used", 81920 * MIB, False, "81920"),
    ("memory.total", 143771 * MIB, True, "143771 MiB"),
    ("memory.free", 143771 * MIB - 1, True, "143770 MiB"),  # whole MiB, rounded down
    ("memory.reserved", smi.NA, True, "[N/A]"),
    ("utilization.gpu", 37, True, "37 %"),
    ("utilization.gpu", 37, False, "37"),
    ("utilization.memory", smi.NA, True, "[N/A]"),
    ("temperature.gpu", 31, True, "31"),  # no unit, even with units
    ("power.draw", 76000, True, "76.00 W"),
    ("power.draw", 76543, False, "76.54"),
    ("power.limit", 700000, True, "700.00 W"),
    ("persistence_mode", 1, True, "Enabled"),
    ("persistence_mode", 0, True, "Disabled"),
    ("compute_mode", 0, True, "Default"),
    ("compute_mode", 2, True, "Prohibited"),
    ("compute_mode", 3, True, "Exclusive_Process"),
    ("mig.mode.current", 1, True, "Enabled"),
    ("mig.mode.current", 0, True, "Disabled"),
    ("mig.mode.current", smi.NA, True, "[N/A]"),
    ("pstate", 0, True, "P0"),
    ("fan.speed", smi.NA, True, "[N/A]"),
    ("name", "NVIDIA H200", True, "NVIDIA H200"),
    ("index", 3, True, "3"),
    ("serial", smi.Err(smi.ERROR_UNKNOWN), True, "[Unknown Error]"),
    ("serial", smi.Err(smi.ERROR_NO_PERMISSION), True, "[Insufficient Permissions]"),
    ("serial", None, True, "[N/A]"),
])
def test_format_value(field, raw, units, expected):
    unit, kind, _width = smi.GPU_FIELDS[field]
    assert smi.format_value(kind, raw, unit, units) == expected


@pytest.mark.parametrize("raw, units, expected", [
    (185 * MIB, True, "185 MiB"),
    (185 * MIB, False, "185"),
    (smi.VALUE_NOT_AVAILABLE, True, "[N/A]"),
    (smi.NA, False, "[N/A]"),
])
def test_format_process_memory(raw, units, expected):
    unit, kind, _width = smi.APP_FIELDS["used_gpu_memory"]
    assert smi.format_value(kind, raw, unit, units) == expected


def test_render_csv_header_units_and_separator():
    fields, _rest = smi.resolve_fields("index,gpu_name,memory.used,utilization.gpu,power.draw,temperature.gpu", "gpu")
    gpus = [h200(0, 81920, util_gpu=100), h200(1)]
    text = smi.render_csv(fields, gpus, snap(gpus), "gpu")
    assert text == (
        "index, name, memory.used [MiB], utilization.gpu [%], power.draw [W], temperature.gpu\n"
        "0, NVIDIA H200, 81920 MiB, 100 %, 76.00 W, 31\n"
        "1, NVIDIA H200, 0 MiB, 0 %, 76.00 W, 31\n"
    )
    assert smi.render_csv(fields, gpus, snap(gpus), "gpu", header=False, units=False) == (
        "0, NVIDIA H200, 81920, 100, 76.00, 31\n"
        "1, NVIDIA H200, 0, 0, 76.00, 31\n"
    )
    # nounits keeps the unit in the header
    assert smi.render_csv(fields, gpus, snap(gpus), "gpu", header=True, units=False).splitlines()[0] == (
        "index, name, memory.used [MiB], utilization.gpu [%], power.draw [W], temperature.gpu"
    )


def test_render_csv_apps():
    g = h200(0, 185)
    procs = [{"gpu": g, "pid": 40170, "types": "C", "name": "/usr/bin/python3", "used_bytes": 185 * MIB},
             {"gpu": g, "pid": 40171, "types": "C", "name": smi.Err(smi.ERROR_NOT_FOUND), "used_bytes": smi.NA}]
    fields, _rest = smi.resolve_fields("pid,name,used_memory", "app")
    assert smi.render_csv(fields, procs, snap([g]), "app") == (
        "pid, process_name, used_gpu_memory [MiB]\n"
        "40170, /usr/bin/python3, 185 MiB\n"
        "40171, [Not Found], [N/A]\n"
    )
    assert smi.render_csv(fields, [], snap([g]), "app", header=False) == ""


@pytest.mark.parametrize("argv, attrs", [
    ([], {"list": False, "ids": None, "query_gpu": None}),
    (["-L"], {"list": True}),
    (["--list-gpus", "-i", "0,3"], {"list": True, "ids": ["0", "3"]}),
    (["-i0"], {"ids": ["0"]}),
    (["--id=GPU-abc"], {"ids": ["GPU-abc"]}),
    (["--id", "00000000:18:00.0"], {"ids": ["00000000:18:00.0"]}),
    (["--query-gpu=index,uuid", "--format=csv,noheader"], {"query_gpu": "index,uuid", "format": "csv,noheader"}),
    (["--query-gpu", "index", "--format", "csv"], {"query_gpu": "index", "format": "csv"}),
    (["--query-compute-apps=pid", "--format=csv"], {"query_apps": "pid"}),
    (["-h"], {"help": True}),
    (["--help"], {"help": True}),
    (["-q"], {"query": True, "xml": False}),
    (["-q", "-x"], {"query": True, "xml": True, "ids": None}),
    (["-x", "-q", "-i", "0,1"], {"query": True, "xml": True, "ids": ["0", "1"]}),
    (["--query", "--xml-format", "--id=GPU-abc"], {"query": True, "xml": True, "ids": ["GPU-abc"]}),
])
def test_parse_args(argv, attrs):
    a = smi.parse_args(argv)
    for k, v in attrs.items():
        assert getattr(a, k) == v, k


@pytest.mark.parametrize("argv, message", [
    (["--bogus"], "ERROR: Option --bogus is not recognized. Please run 'nvidia-smi -h' for help."),
    (["-d"], "ERROR: Option -d is not recognized."),
    (["-x"], "Invalid combination of input arguments."),
    (["--xml-format", "-L"], "Invalid combination of input arguments."),
    (["-q", "-L"], "Invalid combination of input arguments."),
    (["-q", "-x", "--query-gpu=index", "--format=csv"], "Invalid combination of input arguments."),
    (["-q", "--format=csv"], "Invalid combination of input arguments."),
    (["-i"], "ERROR: Option -i is missing its value."),
    (["--query-gpu=index"], '"--format=" switch is missing.'),
    (["--format=csv"], "Invalid combination of input arguments."),
    (["-L", "--query-gpu=index", "--format=csv"], "Invalid combination of input arguments."),
    (["--query-gpu=index", "--query-compute-apps=pid", "--format=csv"], "Only one --query-* switch"),
])
def test_parse_args_rejects(argv, message):
    with pytest.raises(smi.UsageError) as e:
        smi.parse_args(argv)
    assert message in e.value.message
    assert e.value.code == 2


@pytest.mark.parametrize("spec, result", [
    ("csv", (True, True)),
    ("csv,noheader", (False, True)),
    ("csv,nounits", (True, False)),
    ("csv,noheader,nounits", (False, False)),
    ("noheader,csv", (False, True)),
])
def test_parse_format(spec, result):
    assert smi.parse_format(spec) == result


@pytest.mark.parametrize("spec", ["", "noheader", "csv,xml", "json"])
def test_parse_format_rejects(spec):
    with pytest.raises(smi.UsageError):
        smi.parse_format(spec)


IDENTS = [{"uuid": "GPU-aaaa0000-0000-0000-0000-000000000000", "bus_id": "00000000:18:00.0", "serial": "1654000000001"},
          {"uuid": "GPU-bbbb0000-0000-0000-0000-000000000000", "bus_id": "00000000:2A:00.0", "serial": "1654000000002"},
          {"uuid": "GPU-cccc0000-0000-0000-0000-000000000000", "bus_id": "00000000:3A:00.0", "serial": "1654000000003"}]


@pytest.mark.parametrize("ids, result", [
    (["0"], [0]),
    (["2", "0"], [0, 2]),
    (["1", "1"], [1]),
    (["GPU-bbbb0000-0000-0000-0000-000000000000"], [1]),
    (["gpu-BBBB0000-0000-0000-0000-000000000000"], [1]),
    (["00000000:3A:00.0"], [2]),
    (["0000:3a:00.0"], [2]),
    (["2A:00.0"], [1]),
    (["1654000000003"], [2]),
    (["0", "GPU-cccc0000-0000-0000-0000-000000000000"], [0, 2]),
    (["3"], None),
    (["GPU-dddd0000-0000-0000-0000-000000000000"], None),
    (["00000000:99:00.0"], None),
    (["0", "bogus"], None),
])
def test_match_ids(ids, result):
    assert smi.match_ids(ids, IDENTS) == result


# --- the table, against real R580 lines ----------------------------------------------------


def test_gpu_rows_match_real_captures():
    quadro = h200(0, 14453, name="Quadro RTX 8000", persistence=0, bus_id="00000000:15:00.0",
                  ecc_uncorrected="Off", fan=33, temperature=30, pstate=8, power_mw=13000,
                  power_limit_mw=260000, util_gpu=1, mig_current=smi.NA,
                  memory={"total": 49152 * MIB, "used": 14453 * MIB})
    assert smi.gpu_rows(quadro)[:2] == [REAL_R580["quadro_1"], REAL_R580["quadro_2"]]
    t4 = h200(0, 0, name="Tesla T4", bus_id="00000000:00:1E.0", temperature=30, pstate=8, power_mw=9000,
              power_limit_mw=70000, mig_current=smi.NA, memory={"total": 15360 * MIB, "used": 0})
    assert smi.gpu_rows(t4) == [REAL_R580["t4_1"], REAL_R580["t4_2"], REAL_R580["t4_3"]]
    long = h200(0, 0, name="NVIDIA GeForce RTX 5090 Laptop GPU", bus_id="00000000:01:00.0",
                ecc_uncorrected=smi.NA, temperature=45, pstate=8, power_mw=5000, power_limit_mw=150000,
                memory={"total": 24463 * MIB, "used": 22504 * MIB})
    assert smi.gpu_rows(long)[:2] == [REAL_R580["long_1"], REAL_R580["long_2"]]


def test_process_rows_match_real_captures():
    assert smi.proc_row({"gpu": 0, "pid": 17892, "types": "C", "name": "/app/.venv/bin/python3",
                         "used_bytes": 3444 * MIB, "gi": smi.NO_INSTANCE_ID, "ci": smi.NO_INSTANCE_ID}) == REAL_R580["proc_c"]
    assert smi.proc_row({"gpu": 0, "pid": 32, "types": "G", "name": "/Xwayland", "used_bytes": smi.NA}) == REAL_R580["proc_na"]
    assert smi.proc_row({"gpu": 0, "pid": 36532, "types": "C", "name": "C:\\Users\\me\\source\\repos\\CARTAN\\geomind.exe",
                         "used_bytes": smi.VALUE_NOT_AVAILABLE}) == REAL_R580["proc_long"]


def test_idle_table_is_the_real_layout():
    text = smi.render_table(snap([h200(0)]))
    assert text == H200_IDLE_TABLE
    assert REAL_R580["version"] in text.splitlines()
    for line in text.splitlines()[1:]:
        assert line == "" or len(line) == 91, line


def test_table_with_processes():
    gpus = [h200(0, 81920), h200(1, 1024)]
    procs = [{"gpu": gpus[0], "pid": 8812, "types": "C", "name": "python3", "used_bytes": 81920 * MIB},
             {"gpu": gpus[1], "pid": 1234567, "types": "C+G", "name": "/usr/bin/python3", "used_bytes": 1024 * MIB}]
    lines = smi.render_table(snap(gpus, procs)).splitlines()
    assert "|    0   N/A  N/A            8812      C   python3                               81920MiB |" in lines
    assert "|    1   N/A  N/A         1234567    C+G   /usr/bin/python3                       1024MiB |" in lines
    assert "| N/A   31C    P0             76W /  700W |   81920MiB / 143771MiB |      0%      Default |" in lines
    assert not any("No running processes found" in line for line in lines)
    assert lines[-1] == smi.SEP_FULL and len(lines[-2]) == 91


def test_table_memory_used_without_process_has_no_rows_and_no_message():
    """Inside a container the real tool shows the memory but an empty Processes section."""
    lines = smi.render_table(snap([h200(0, 40960), h200(1)], reported=False)).splitlines()
    start = lines.index(smi.HDR_PROC[-1])
    assert lines[start + 1:] == [smi.SEP_FULL]
    assert "|   40960MiB / 143771MiB |" in "\n".join(lines)


def test_table_process_whose_name_cannot_be_read_is_not_shown():
    """Old drivers give host PIDs inside a container: no name, no row, and no message either."""
    g = h200(0, 100)
    procs = [{"gpu": g, "pid": 4242, "types": "C", "name": smi.Err(smi.ERROR_NOT_FOUND), "used_bytes": 100 * MIB}]
    lines = smi.render_table(snap([g], procs)).splitlines()
    assert lines[lines.index(smi.HDR_PROC[-1]) + 1:] == [smi.SEP_FULL]


def test_grep_0mib_pitfall_on_the_pure_table():
    """`nvidia-smi | grep "0MiB"` counts a GPU at 10MiB as free: our table has the same trap."""
    text = smi.render_table(snap([h200(0, 10), h200(1, 0)], reported=False))
    hits = [line for line in text.splitlines() if "0MiB" in line]
    assert len(hits) == 2
    assert "      10MiB / 143771MiB" in hits[0] and "       0MiB / 143771MiB" in hits[1]


def test_table_na_and_error_cells():
    g = h200(0, temperature=smi.NA, power_mw=smi.Err(smi.ERROR_UNKNOWN), util_gpu=smi.NA)
    line2 = smi.gpu_rows(g)[1]
    assert len(line2) == 91
    assert " N/A " in line2 and "ERR!" in line2


@pytest.mark.parametrize("ret, libver, out, code", [
    (9, "", smi.MSG_DRIVER_NOT_LOADED + "\n", 9),
    (18, "580.159", "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159\n", 18),
    (4, "", "Failed to initialize NVML: Insufficient Permissions\n", 4),
    (999, "", "Failed to initialize NVML: Unknown Error\n", 255),
])
def test_init_failure(ret, libver, out, code):
    assert smi.init_failure(ret, libver) == (out, code)


def test_timestamp_format():
    assert smi.format_timestamp(WHEN) == "2026/07/05 14:53:15.123"
    fields, _rest = smi.resolve_fields("timestamp,index", "gpu")
    assert smi.render_csv(fields, [h200(0)], snap([h200(0)]), "gpu", header=False) == "2026/07/05 14:53:15.123, 0\n"


@pytest.mark.parametrize("version, short", [("13.580.159.03", "580.159"), ("12.535.161.07", "535.161")])
def test_short_nvml_version(version, short):
    assert smi.short_nvml_version(version) == short


def test_device_failure_messages():
    lost = smi.DeviceFailure(3, "0000:5D:00.0", 15, "GPU is lost")
    assert lost.message() == ("Unable to determine the device handle for GPU3: 0000:5D:00.0: "
                              "GPU is lost.  Reboot the system to recover this GPU\n")
    assert lost.exit_code == 15
    unknown = smi.DeviceFailure(1, None, 999, "Unknown Error")
    assert unknown.message() == "Unable to determine the device handle for GPU1: Unknown Error\n"
    assert unknown.exit_code == 255


def test_usage_errors_through_main_need_no_library(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    assert smi.main(["--query-gpu=xyz", "--format=csv"], str(tmp_path), out, err) == 2
    assert out.getvalue() == 'Field "xyz" is not a valid field to query.\n\n'
    out = io.StringIO()
    assert smi.main(["--nope"], str(tmp_path), out, err) == 2
    assert out.getvalue().startswith("ERROR: Option --nope is not recognized.")
    out = io.StringIO()
    assert smi.main(["-h"], str(tmp_path), out, err) == 0
    assert "--query-gpu" in out.getvalue() and "--format=" in out.getvalue()
    out = io.StringIO()
    assert smi.main(["--help-query-gpu"], str(tmp_path), out, err) == 0
    assert '"name" or "gpu_name"' in out.getvalue()


# --- -q -x / -q, pure ------------------------------------------------------------------------

H200_IDLE_XML = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
\t<timestamp>Sun Jul  5 14:53:15 2026</timestamp>
\t<driver_version>580.159.03</driver_version>
\t<cuda_version>13.0</cuda_version>
\t<attached_gpus>1</attached_gpus>
\t<gpu id="00000000:18:00.0">
\t\t<product_name>NVIDIA H200</product_name>
\t\t<product_brand>NVIDIA</product_brand>
\t\t<persistence_mode>Enabled</persistence_mode>
\t\t<mig_mode>
\t\t\t<current_mig>Disabled</current_mig>
\t\t\t<pending_mig>Disabled</pending_mig>
\t\t</mig_mode>
\t\t<mig_devices>
\t\t\tNone
\t\t</mig_devices>
\t\t<serial>1654000000000</serial>
\t\t<uuid>GPU-00000000-0000-0000-0000-000000000000</uuid>
\t\t<minor_number>0</minor_number>
\t\t<pci>
\t\t\t<pci_bus>18</pci_bus>
\t\t\t<pci_device>00</pci_device>
\t\t\t<pci_domain>0000</pci_domain>
\t\t\t<pci_device_id>233510DE</pci_device_id>
\t\t\t<pci_bus_id>00000000:18:00.0</pci_bus_id>
\t\t\t<pci_sub_system_id>18BE10DE</pci_sub_system_id>
\t\t</pci>
\t\t<fan_speed>N/A</fan_speed>
\t\t<performance_state>P0</performance_state>
\t\t<fb_memory_usage>
\t\t\t<total>143771 MiB</total>
\t\t\t<reserved>0 MiB</reserved>
\t\t\t<used>0 MiB</used>
\t\t\t<free>143771 MiB</free>
\t\t</fb_memory_usage>
\t\t<compute_mode>Default</compute_mode>
\t\t<utilization>
\t\t\t<gpu_util>0 %</gpu_util>
\t\t\t<memory_util>0 %</memory_util>
\t\t\t<encoder_util>0 %</encoder_util>
\t\t\t<decoder_util>0 %</decoder_util>
\t\t</utilization>
\t\t<temperature>
\t\t\t<gpu_temp>31 C</gpu_temp>
\t\t</temperature>
\t\t<gpu_power_readings>
\t\t\t<power_state>P0</power_state>
\t\t\t<average_power_draw>76.00 W</average_power_draw>
\t\t\t<instant_power_draw>76.00 W</instant_power_draw>
\t\t\t<current_power_limit>700.00 W</current_power_limit>
\t\t\t<requested_power_limit>700.00 W</requested_power_limit>
\t\t</gpu_power_readings>
\t\t<processes>
\t\t</processes>
\t</gpu>
</nvidia_smi_log>
"""


def h200q(index=0, used_mib=0, **kw):
    """h200() plus the values only -q shows."""
    g = h200(index, used_mib, pci_domain=0, pci_bus=scenario.HGX_BUSES[index], pci_device=0,
             pci_device_id=scenario.H200_PCI_DEVICE_ID, pci_subsystem_id=scenario.H200_PCI_SUBSYSTEM_ID,
             brand=14, util_enc=0, util_dec=0, power_requested_mw=700000)
    g["uuid"] = "GPU-00000000-0000-0000-0000-00000000000%d" % index
    g.update(kw)
    return g


def test_query_xml_idle_h200_is_the_real_layout():
    """Element names, order and value formats of the R580 log (tab indents, units after a space)."""
    assert smi.render_query_xml(snap([h200q(0)])) == H200_IDLE_XML
    root = ET.fromstring(H200_IDLE_XML)
    assert root.tag == "nvidia_smi_log" and root.find("gpu").get("id") == "00000000:18:00.0"


def test_query_xml_processes_and_na():
    g0 = h200q(0, 82944, memory={"total": 143771 * MIB, "used": 82944 * MIB, "free": 60827 * MIB, "reserved": smi.NA})
    g1 = h200q(1, mig_current=smi.NA, mig_pending=smi.NA, minor=smi.NA, serial=smi.Err(smi.ERROR_UNKNOWN),
               power_mw=smi.NA, util_gpu=smi.NA, util_mem=smi.NA, brand=smi.Err(smi.ERROR_FUNCTION_NOT_FOUND), fan=44)
    procs = [{"gpu": g0, "pid": 4242, "types": "C", "name": "/usr/bin/python3", "used_bytes": 81920 * MIB,
              "gi": smi.NO_INSTANCE_ID, "ci": smi.NO_INSTANCE_ID},
             {"gpu": g0, "pid": 4243, "types": "C+G", "name": "a<b>&c", "used_bytes": smi.NA},
             {"gpu": g0, "pid": 4244, "types": "C", "name": smi.Err(smi.ERROR_NOT_FOUND), "used_bytes": MIB}]
    text = smi.render_query_xml(snap([g0, g1], procs))
    assert "\t\t\t\t<process_name>a&lt;b&gt;&amp;c</process_name>\n" in text
    root = ET.fromstring(text)
    assert root.findtext("attached_gpus") == "2"
    x0, x1 = root.findall("gpu")
    assert [(p.findtext("gpu_instance_id"), p.findtext("compute_instance_id"), p.findtext("pid"), p.findtext("type"),
             p.findtext("process_name"), p.findtext("used_memory")) for p in x0.find("processes")] == [
        ("N/A", "N/A", "4242", "C", "/usr/bin/python3", "81920 MiB"),
        ("N/A", "N/A", "4243", "C+G", "a<b>&c", "N/A"),  # 4244: its name cannot be read, not shown (as in the table)
    ]
    assert [e.text for e in x0.find("fb_memory_usage")] == ["143771 MiB", "N/A", "82944 MiB", "60827 MiB"]
    assert list(x1.find("processes")) == []
    assert x1.findtext("mig_mode/current_mig") == x1.findtext("mig_mode/pending_mig") == "N/A"
    assert (x1.findtext("minor_number"), x1.findtext("serial"), x1.findtext("product_brand")) == ("N/A", "Unknown Error", "N/A")
    assert x1.findtext("gpu_power_readings/average_power_draw") == "N/A"
    assert x1.findtext("gpu_power_readings/current_power_limit") == "700.00 W"
    assert (x1.findtext("utilization/gpu_util"), x1.findtext("fan_speed")) == ("N/A", "44 %")


def test_query_text_layout():
    g0 = h200q(0, 81920)
    procs = [{"gpu": g0, "pid": 4242, "types": "C", "name": "/usr/bin/python3", "used_bytes": 81920 * MIB}]
    lines = smi.render_query_text(snap([g0, h200q(1, minor=smi.NA)], procs)).splitlines()
    assert lines[:9] == [
        "",
        "==============NVSMI LOG==============",
        "",
        "Timestamp                                 : Sun Jul  5 14:53:15 2026",
        "Driver Version                            : 580.159.03",
        "CUDA Version                              : 13.0",
        "",
        "Attached GPUs                             : 2",
        "GPU 00000000:18:00.0",
    ]
    assert "    Minor Number                          : 0" in lines
    assert "    Minor Number                          : N/A" in lines
    assert lines.index("GPU 00000000:2A:00.0") > lines.index("GPU 00000000:18:00.0")
    i = lines.index("    MIG Mode")
    assert lines[i + 1:i + 3] == ["        Current                           : Disabled",
                                  "        Pending                           : Disabled"]
    i = lines.index("    PCI")
    assert lines[i + 1] == "        Bus                               : 0x18"
    assert lines[i + 4] == "        Device Id                         : 0x233510DE"
    i = lines.index("    Processes")
    assert lines[i + 1:i + 7] == [
        "        GPU instance ID                   : N/A",
        "        Compute instance ID               : N/A",
        "        Process ID                        : 4242",
        "            Type                          : C",
        "            Name                          : /usr/bin/python3",
        "            Used GPU Memory               : 81920 MiB",
    ]
    assert lines[-2:] == ["    Processes                             : None", ""]


# --- the process protocol against a fake library written in Python --------------------------


class FakeProcLib:
    """Process queries only; ``v3=False`` drops the _v3 symbols (an older library)."""

    def __init__(self, procs, v3=True, grow_once=False):
        self.procs = list(procs)
        self.v3 = v3
        self.grow_once = grow_once
        self.calls = []
        for kind in ("Compute", "Graphics", "MPSCompute"):
            for suffix in (("_v3", "_v2") if v3 else ("_v2",)):
                setattr(self, f"nvmlDeviceGet{kind}RunningProcesses{suffix}", self._make(kind, suffix))

    def _make(self, kind, suffix):
        def fn(handle, count_ref, arr):
            self.calls.append((kind, suffix, arr is None))
            rows = [p for p in self.procs if p[0] == kind]
            if arr is None or count_ref._obj.value < len(rows):
                count_ref._obj.value = len(rows)
                if self.grow_once and arr is None:
                    self.procs.append((kind, 99, 1 * MIB))  # appears between the two calls
                return smi.SUCCESS if not rows else smi.ERROR_INSUFFICIENT_SIZE
            for k, (_uuid, pid, used) in enumerate(rows):
                arr[k].pid, arr[k].usedGpuMemory = pid, used
                arr[k].gpuInstanceId = arr[k].computeInstanceId = smi.NO_INSTANCE_ID
            count_ref._obj.value = len(rows)
            return smi.SUCCESS
        return fn


def fake_nvml(lib):
    nv = smi.Nvml.__new__(smi.Nvml)
    nv.lib, nv._fn, nv._errstr = lib, {}, None
    return nv


def test_two_call_protocol_and_v2_fallback():
    procs = [("Compute", 10, 5 * MIB), ("Compute", 11, smi.VALUE_NOT_AVAILABLE), ("Graphics", 10, 5 * MIB)]
    for v3 in (True, False):
        lib = FakeProcLib(procs, v3=v3)
        nv = fake_nvml(lib)
        g = {"index": 0, "handle": ctypes.c_void_p(1)}
        nv.string = lambda *a, **k: "proc"
        rows, reported = smi.read_processes(nv, g, [("Compute", "C"), ("Graphics", "G")])
        assert reported
        assert [(r["pid"], r["types"], r["used_bytes"]) for r in rows] == [(10, "C+G", 5 * MIB), (11, "C", smi.NA)]
        suffixes = {c[1] for c in lib.calls}
        assert suffixes == ({"_v3"} if v3 else {"_v2"})
        assert lib.calls[0] == ("Compute", "_v3" if v3 else "_v2", True)  # first call: NULL array


def test_types_are_merged_in_the_real_order():
    lib = FakeProcLib([("MPSCompute", 7, MIB), ("Compute", 7, MIB), ("Graphics", 8, MIB), ("Compute", 8, MIB)])
    nv = fake_nvml(lib)
    nv.string = lambda *a, **k: "proc"
    g = {"index": 0, "handle": ctypes.c_void_p(1)}
    rows, _rest = smi.read_processes(nv, g, [("Compute", "C"), ("Graphics", "G"), ("MPSCompute", "M")])
    assert [(r["pid"], r["types"]) for r in rows] == [(7, "M+C"), (8, "C+G")]


def test_process_appearing_between_the_two_calls():
    lib = FakeProcLib([("Compute", 10, 5 * MIB)], grow_once=True)
    nv = fake_nvml(lib)
    res = nv.processes(ctypes.c_void_p(1), "Compute")
    assert sorted(p[0] for p in res) == [10, 99]


def test_no_processes_is_one_call():
    lib = FakeProcLib([])
    nv = fake_nvml(lib)
    assert nv.processes(ctypes.c_void_p(1), "Compute") == []
    assert len(lib.calls) == 1


# =========================================================================================
# end to end, through the simulated library
# =========================================================================================

RUNNER = ("import sys; sys.path.insert(0, sys.argv[1]); from gpusimkit import smi; "
          "sys.exit(smi.main(sys.argv[3:], sys.argv[2]))")


@pytest.fixture(scope="session")
def built_library():
    from gpusimkit.build import ensure_built
    return ensure_built()


@pytest.fixture
def simdir(tmp_path, built_library):
    from gpusimkit.build import install_library
    d = str(tmp_path / "sim")
    os.makedirs(d)
    scenario.save(d, scenario.new_scenario(8, seed=d))
    install_library(d)
    return d


def run_smi(simdir, *args, env=None):
    e = dict(os.environ)
    e.pop("GPUSIM_DIR", None)  # the library finds DIR from its own path
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", RUNNER, GPUSIM, simdir, *args], env=e,
                          capture_output=True, text=True, timeout=60, check=False)


def query(simdir, fields, *extra):
    p = run_smi(simdir, f"--query-gpu={fields}", "--format=csv,noheader,nounits", *extra)
    assert p.returncode == 0, p.stdout + p.stderr
    return [line.split(", ") for line in p.stdout.splitlines()]


class Procs:
    """Real processes registered in DIR/procs as the driver daemon would write them."""

    def __init__(self, simdir):
        self.simdir = simdir
        self.children = []
        self.lines = []

    def start(self, holds, argv=("sleep", "600")):
        """holds: [(gpu, types, used_mib)]; returns the process."""
        child = subprocess.Popen(list(argv))  # pylint: disable=consider-using-with  # reaped in stop()
        self.children.append(child)
        with open(f"/proc/{child.pid}/stat", encoding="utf-8") as f:
            starttime = f.read().rsplit(")", 1)[1].split()[19]
        with open(f"/proc/{child.pid}/status", encoding="utf-8") as f:
            nspid = [line.split()[-1] for line in f if line.startswith("NSpid:")][0]
        ns = scenario.pidns_inode(str(child.pid))
        for gpu, types, mib in holds:
            self.lines.append(f"proc {child.pid} {starttime} {gpu} {types} {mib} {ns} {nspid}")
        self.write()
        return child

    def write(self):
        tmp = os.path.join(self.simdir, "procs.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in self.lines))
        os.replace(tmp, os.path.join(self.simdir, "procs"))

    def stop(self):
        for child in self.children:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)  # only processes this test started, by pid
            child.wait()


@pytest.fixture
def procs(simdir):
    p = Procs(simdir)
    yield p
    p.stop()


def test_e2e_query_gpu_matches_the_scenario(simdir):
    sc = scenario.load(simdir)
    with scenario.edit(simdir) as s:
        s.gpus[2].memory_reserved_mib = 512
        s.gpus[2].util_gpu, s.gpus[2].util_mem = 55, 12
        s.gpus[3].persistence, s.gpus[3].compute_mode, s.gpus[3].mig_current = 0, 3, 1
        s.gpus[4].compute_mode, s.gpus[4].temperature, s.gpus[4].power_mw = 2, 47, 123456
    fields = ("index,uuid,name,serial,pci.bus_id,memory.total,memory.used,memory.free,memory.reserved,"
              "utilization.gpu,utilization.memory,temperature.gpu,power.draw,power.limit,persistence_mode,"
              "compute_mode,mig.mode.current,driver_version,count")
    rows = query(simdir, fields)
    assert len(rows) == 8
    for row, g in zip(rows, sc.gpus):
        assert row[:5] == [str(g.index), g.uuid, "NVIDIA H200", g.serial, g.pci_bus_id]
        assert row[17:] == ["580.159.03", "8"]  # no minor_number: no real listing has that field
    assert rows[0][5:17] == ["143771", "0", "143771", "0", "0", "0", "31", "76.00", "700.00", "Enabled", "Default", "Disabled"]
    assert rows[2][5:11] == ["143771", "0", "143259", "512", "55", "12"]
    assert rows[3][14:17] == ["Disabled", "Exclusive_Process", "Enabled"]
    assert rows[4][11:13] == ["47", "123.46"]
    assert rows[4][15] == "Prohibited"
    # header and units
    p = run_smi(simdir, "--query-gpu=index,gpu_name,memory.used,utilization.gpu,power.draw", "--format=csv", "-i", "0")
    assert p.stdout == ("index, name, memory.used [MiB], utilization.gpu [%], power.draw [W]\n"
                        "0, NVIDIA H200, 0 MiB, 0 %, 76.00 W\n")
    aliases = query(simdir, "gpu_name,gpu_uuid,gpu_bus_id,gpu_serial", "-i", "1")
    assert aliases == [["NVIDIA H200", sc.gpus[1].uuid, sc.gpus[1].pci_bus_id, sc.gpus[1].serial]]


def test_e2e_processes_in_csv_and_table(simdir, procs):
    a = procs.start([(0, "C", 81920), (1, "C", 40960)])
    b = procs.start([(1, "CG", 1024)])
    c = procs.start([(2, "G", 512)])
    d = procs.start([(3, "C", -1)])
    sc = scenario.load(simdir)

    used = query(simdir, "index,memory.used,memory.free")
    assert [r[1] for r in used] == ["81920", str(40960 + 1024), "512", "0", "0", "0", "0", "0"]
    assert used[0][2] == str(143771 - 81920)

    p = run_smi(simdir, "--query-compute-apps=gpu_uuid,gpu_bus_id,gpu_name,gpu_serial,pid,process_name,used_memory",
                "--format=csv")
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "gpu_uuid, gpu_bus_id, gpu_name, gpu_serial, pid, process_name, used_gpu_memory [MiB]"
    rows = [line.split(", ") for line in lines[1:]]
    got = sorted((r[0], int(r[4]), r[5], r[6]) for r in rows)
    want = sorted([(sc.gpus[0].uuid, a.pid, "sleep", "81920 MiB"), (sc.gpus[1].uuid, a.pid, "sleep", "40960 MiB"),
                   (sc.gpus[1].uuid, b.pid, "sleep", "1024 MiB"), (sc.gpus[3].uuid, d.pid, "sleep", "[N/A]")])
    assert got == want  # c is graphics only: not a compute app
    for r in rows:
        g = next(g for g in sc.gpus if g.uuid == r[0])
        assert r[1:4] == [g.pci_bus_id, "NVIDIA H200", g.serial]

    nounits = run_smi(simdir, "--query-compute-apps=pid,used_gpu_memory", "--format=csv,noheader,nounits", "-i", "0")
    assert nounits.stdout == f"{a.pid}, 81920\n"

    table = run_smi(simdir)
    assert table.returncode == 0, table.stderr
    tl = table.stdout.splitlines()
    assert "| N/A   31C    P0             76W /  700W |   81920MiB / 143771MiB |      0%      Default |" in tl
    assert "| N/A   31C    P0             76W /  700W |   41984MiB / 143771MiB |      0%      Default |" in tl
    rows = tl[tl.index(smi.HDR_PROC[-1]) + 1:-1]
    assert rows == [
        f"|    0   N/A  N/A{a.pid:>16}      C   sleep                                 81920MiB |",
        f"|    1   N/A  N/A{a.pid:>16}      C   sleep                                 40960MiB |",
        f"|    1   N/A  N/A{b.pid:>16}    C+G   sleep                                  1024MiB |",
        f"|    2   N/A  N/A{c.pid:>16}      G   sleep                                   512MiB |",
        f"|    3   N/A  N/A{d.pid:>16}      C   sleep                                 N/A      |",
    ]
    for line in tl[1:]:
        assert line == "" or len(line) == 91, line

    # a process that exits is no longer reported, and (release lag 0) its memory is free
    os.kill(a.pid, signal.SIGKILL)
    a.wait()
    assert [r[0] for r in query(simdir, "memory.used", "-i", "0,1")] == ["0", "1024"]
    p = run_smi(simdir, "--query-compute-apps=pid", "--format=csv,noheader")
    assert sorted(int(x) for x in p.stdout.split()) == sorted([b.pid, d.pid])


def test_e2e_no_compute_apps_prints_only_the_header(simdir):
    p = run_smi(simdir, "--query-compute-apps=pid,process_name", "--format=csv")
    assert (p.returncode, p.stdout) == (0, "pid, process_name\n")
    p = run_smi(simdir, "--query-compute-apps=pid", "--format=csv,noheader")
    assert (p.returncode, p.stdout) == (0, "")


def test_e2e_list_and_select(simdir):
    sc = scenario.load(simdir)
    p = run_smi(simdir, "-L")
    assert p.returncode == 0
    assert p.stdout.splitlines() == [f"GPU {g.index}: NVIDIA H200 (UUID: {g.uuid})" for g in sc.gpus]
    assert re.fullmatch(r"GPU 0: NVIDIA H200 \(UUID: GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\)",
                        p.stdout.splitlines()[0])
    assert [r[0] for r in query(simdir, "index", "-i", "3")] == ["3"]
    assert [r[0] for r in query(simdir, "index", "-i", "5,1")] == ["1", "5"]
    assert [r[0] for r in query(simdir, "index", f"--id={sc.gpus[6].uuid}")] == ["6"]
    assert [r[0] for r in query(simdir, "index", "-i", sc.gpus[4].pci_bus_id)] == ["4"]
    assert [r[0] for r in query(simdir, "index", "-i", sc.gpus[4].pci_bus_id[4:].lower())] == ["4"]
    assert [r[0] for r in query(simdir, "index", "-i", sc.gpus[2].serial)] == ["2"]
    assert run_smi(simdir, "-L", "-i", "7").stdout == f"GPU 7: NVIDIA H200 (UUID: {sc.gpus[7].uuid})\n"
    table = run_smi(simdir, "-i", "2").stdout
    assert "|   2  NVIDIA H200" in table and "|   0  NVIDIA H200" not in table
    for bad in ("8", "GPU-00000000-0000-0000-0000-000000000000", "00000000:01:00.0", "0,9"):
        p = run_smi(simdir, "--query-gpu=index", "--format=csv", "-i", bad)
        assert (p.returncode, p.stdout) == (6, "No devices were found\n"), bad


def test_e2e_memory_used_without_process(simdir):
    """A leaked context: memory in use, the Processes section empty and without its message."""
    with scenario.edit(simdir) as s:
        s.gpus[5].leaked_mib = 40960
    p = run_smi(simdir)
    assert p.returncode == 0
    lines = p.stdout.splitlines()
    assert "| N/A   31C    P0             76W /  700W |   40960MiB / 143771MiB |      0%      Default |" in lines
    assert lines[lines.index(smi.HDR_PROC[-1]) + 1:] == [smi.SEP_FULL]
    assert "No running processes found" not in p.stdout
    assert run_smi(simdir, "--query-compute-apps=pid", "--format=csv,noheader").stdout == ""


def test_e2e_grep_0mib_matches_a_busy_gpu(simdir):
    """The manual check `nvidia-smi | grep "0MiB" | wc -l` counts a GPU holding 10MiB as free."""
    with scenario.edit(simdir) as s:
        s.gpus = s.gpus[:2]
        s.gpus[0].leaked_mib = 10
    out = run_smi(simdir).stdout
    hits = [line for line in out.splitlines() if "0MiB" in line]
    assert len(hits) == 2
    assert "|      10MiB / 143771MiB |" in hits[0]
    assert "|       0MiB / 143771MiB |" in hits[1]


def test_e2e_not_supported_fields_are_na(simdir):
    with scenario.edit(simdir) as s:
        s.gpus[0].not_supported = ["power", "temperature", "serial", "mig_mode", "utilization"]
    row = query(simdir, "serial,temperature.gpu,power.draw,mig.mode.current,utilization.gpu,memory.used", "-i", "0")
    assert row == [["[N/A]", "[N/A]", "[N/A]", "[N/A]", "[N/A]", "0"]]
    p = run_smi(simdir, "-i", "0")
    assert p.returncode == 0
    assert "| N/A   N/A    P0             N/A /  700W |       0MiB / 143771MiB |     N/A      Default |" in p.stdout


V3 = ["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
      "nvmlDeviceGetMPSComputeRunningProcesses_v3"]
V2 = [s.replace("_v3", "_v2") for s in V3]


@pytest.mark.parametrize("hidden", [V3, V3 + V2], ids=["v2", "v1"])
def test_e2e_hidden_symbols_fall_back(simdir, procs, hidden):
    """An older library: the process queries fall back to _v2 (then to the v1 symbol), memory to v1."""
    from gpusimkit.build import install_library
    install_library(simdir, hidden + ["nvmlDeviceGetMemoryInfo_v2"])
    a = procs.start([(0, "C", 2048)])
    p = run_smi(simdir, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    assert (p.returncode, p.stdout) == (0, f"{a.pid}, 2048\n")
    assert query(simdir, "memory.used,memory.reserved", "-i", "0") == [["2048", "[N/A]"]]
    assert f"{a.pid:>16}      C   sleep" in run_smi(simdir).stdout


# --- faults ---------------------------------------------------------------------------------


def test_e2e_library_missing(tmp_path):
    d = str(tmp_path)
    scenario.save(d, scenario.new_scenario(2, seed=d))
    for args in ([], ["-L"], ["--query-gpu=index", "--format=csv"]):
        p = run_smi(d, *args)
        assert p.returncode == 12
        assert p.stdout.startswith(
            "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the "
            "NVIDIA Display Driver is properly installed and present in your system.\n"
            "Please also try adding directory that contains libnvidia-ml.so to your system PATH.\n")


@pytest.mark.parametrize("init_error, code, text", [
    (9, 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
           "Make sure that the latest NVIDIA driver is installed and running.\n"),
    (18, 18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159\n"),
    (4, 4, "Failed to initialize NVML: Insufficient Permissions\n"),
])
def test_e2e_init_errors(simdir, init_error, code, text):
    with scenario.edit(simdir) as s:
        s.init_error = init_error
    for args in ([], ["-L"], ["--query-gpu=index", "--format=csv,noheader"]):
        p = run_smi(simdir, *args)
        assert p.returncode == code
        assert p.stdout.startswith(text)
        assert p.stdout.strip() == text.strip()


def test_e2e_no_devices(tmp_path, built_library):
    from gpusimkit.build import install_library
    d = str(tmp_path)
    scenario.save(d, scenario.new_scenario(0, seed=d))
    install_library(d)
    for args in ([], ["-L"], ["--query-gpu=index", "--format=csv"]):
        p = run_smi(d, *args)
        assert (p.returncode, p.stdout) == (6, "No devices were found\n")


def test_e2e_lost_gpu(simdir):
    sc = scenario.load(simdir)
    with scenario.edit(simdir) as s:
        s.gpus[3].lost_at_ns = 0  # lost since boot
    lost = ("Unable to determine the device handle for GPU3: 0000:5D:00.0: "
            "GPU is lost.  Reboot the system to recover this GPU\n")
    p = run_smi(simdir)
    assert p.returncode == 15
    assert p.stderr == lost
    assert "|   3  NVIDIA H200" not in p.stdout and "|   4  NVIDIA H200" in p.stdout
    assert p.stdout.count("NVIDIA H200") == 7

    p = run_smi(simdir, "--query-gpu=index,memory.used", "--format=csv,noheader")
    assert (p.returncode, p.stderr) == (15, lost)
    assert [line.split(",")[0] for line in p.stdout.splitlines()] == ["0", "1", "2", "4", "5", "6", "7"]

    p = run_smi(simdir, "-L")
    assert (p.returncode, p.stderr) == (15, lost)
    assert len(p.stdout.splitlines()) == 7

    p = run_smi(simdir, "--query-compute-apps=pid", "--format=csv", "-i", sc.gpus[3].uuid)
    assert (p.returncode, p.stderr) == (15, lost)

    # a GPU that is not lost is not affected
    p = run_smi(simdir, "--query-gpu=index", "--format=csv,noheader", "-i", "0,4")
    assert (p.returncode, p.stdout, p.stderr) == (0, "0\n4\n", "")

    # every selected GPU lost: nothing to show
    p = run_smi(simdir, "-i", "3")
    assert (p.returncode, p.stdout, p.stderr) == (15, "No devices were found\n", lost)


def test_e2e_unknown_error(simdir):
    with scenario.edit(simdir) as s:
        s.unknown_every = 1
    for args in ([], ["-L"], ["--query-gpu=index", "--format=csv,noheader"]):
        p = run_smi(simdir, *args)
        assert p.returncode == 255, args
        lines = p.stderr.splitlines()
        assert len(lines) == 8
        assert lines[0].startswith("Unable to determine the device handle for GPU0") and lines[0].endswith(": Unknown Error")


def test_e2e_usage_errors(simdir):
    p = run_smi(simdir, "--query-gpu=index,xyz", "--format=csv")
    assert (p.returncode, p.stdout) == (2, 'Field "xyz" is not a valid field to query.\n\n')
    p = run_smi(simdir, "--query-compute-apps=pid,memory.used", "--format=csv")
    assert (p.returncode, p.stdout) == (2, 'Field "memory.used" is not a valid field to query.\n\n')
    p = run_smi(simdir, "--query-gpu=index")
    assert p.returncode == 2 and '"--format=" switch is missing' in p.stdout
    p = run_smi(simdir, "--frobnicate")
    assert p.returncode == 2 and "is not recognized" in p.stdout
    p = run_smi(simdir, "-h")
    assert p.returncode == 0 and "nvidia-smi [OPTION1 [ARG1]]" in p.stdout


# --- -q -x end to end -----------------------------------------------------------------------


def smi_xml(simdir, *extra, code=0):
    p = run_smi(simdir, "-q", "-x", *extra)
    assert p.returncode == code, p.stdout + p.stderr
    return ET.fromstring(p.stdout), p


def test_e2e_query_xml_matches_the_scenario(simdir, procs):
    with scenario.edit(simdir) as s:
        for g in s.gpus:
            g.minor = 7 - g.index  # minor numbers that are not the indexes: read, not guessed
        s.gpus[2].memory_reserved_mib = 512
        s.gpus[3].persistence, s.gpus[3].compute_mode, s.gpus[3].mig_current, s.gpus[3].mig_pending = 0, 3, 1, 1
        s.gpus[4].temperature, s.gpus[4].power_mw, s.gpus[4].util_gpu = 47, 123456, 55
    sc = scenario.load(simdir)
    a = procs.start([(0, "C", 81920), (1, "C", 40960)])
    b = procs.start([(1, "CG", 1024)])
    c = procs.start([(2, "G", 512)])
    d = procs.start([(3, "C", -1)])

    root, p = smi_xml(simdir)
    assert p.stdout.startswith('<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n<nvidia_smi_log>\n')
    assert p.stderr == ""
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}", root.findtext("timestamp"))
    assert (root.findtext("driver_version"), root.findtext("cuda_version"), root.findtext("attached_gpus")) == ("580.159.03", "13.0", "8")
    gpus = root.findall("gpu")
    assert [x.get("id") for x in gpus] == [g.pci_bus_id for g in sc.gpus]
    used = [81920, 40960 + 1024, 512, 0, 0, 0, 0, 0]
    for x, g in zip(gpus, sc.gpus):
        assert x.findtext("product_name") == "NVIDIA H200" and x.findtext("product_brand") == "NVIDIA"
        assert (x.findtext("uuid"), x.findtext("serial"), x.findtext("minor_number")) == (g.uuid, g.serial, str(7 - g.index))
        assert x.findtext("pci/pci_bus_id") == g.pci_bus_id
        assert x.findtext("pci/pci_bus") == g.pci_bus_id[9:11]
        assert x.findtext("pci/pci_device_id") == "233510DE"
        reserved = g.memory_reserved_mib
        assert [e.text for e in x.find("fb_memory_usage")] == [
            "143771 MiB", f"{reserved} MiB", f"{used[g.index]} MiB", f"{143771 - reserved - used[g.index]} MiB"]
        assert x.findtext("gpu_power_readings/current_power_limit") == "700.00 W"
    assert [gpus[3].findtext(k) for k in ("persistence_mode", "compute_mode", "mig_mode/current_mig", "mig_mode/pending_mig")] == [
        "Disabled", "Exclusive_Process", "Enabled", "Enabled"]
    assert [gpus[0].findtext(k) for k in ("persistence_mode", "compute_mode", "mig_mode/current_mig")] == ["Enabled", "Default", "Disabled"]
    assert gpus[4].findtext("temperature/gpu_temp") == "47 C"
    assert gpus[4].findtext("gpu_power_readings/average_power_draw") == "123.46 W"
    assert gpus[4].findtext("utilization/gpu_util") == "55 %"

    def rows(x):
        return [(int(e.findtext("pid")), e.findtext("type"), e.findtext("process_name"), e.findtext("used_memory"),
                 e.findtext("gpu_instance_id"), e.findtext("compute_instance_id")) for e in x.find("processes")]
    assert rows(gpus[0]) == [(a.pid, "C", "sleep", "81920 MiB", "N/A", "N/A")]
    assert rows(gpus[1]) == [(a.pid, "C", "sleep", "40960 MiB", "N/A", "N/A"), (b.pid, "C+G", "sleep", "1024 MiB", "N/A", "N/A")]
    assert rows(gpus[2]) == [(c.pid, "G", "sleep", "512 MiB", "N/A", "N/A")]
    assert rows(gpus[3]) == [(d.pid, "C", "sleep", "N/A", "N/A", "N/A")]
    assert all(rows(x) == [] for x in gpus[4:])

    # the long spelling and -i: by index, a comma list, a UUID; attached_gpus stays the machine's count
    p = run_smi(simdir, "--query", "--xml-format", "--id=1")
    assert p.returncode == 0, p.stdout + p.stderr
    one = ET.fromstring(p.stdout)
    assert one.findtext("attached_gpus") == "8"
    assert [x.findtext("uuid") for x in one.findall("gpu")] == [sc.gpus[1].uuid]
    assert rows(one.find("gpu")) == rows(gpus[1])
    root, p = smi_xml(simdir, "-i", "5,2")
    assert [x.findtext("uuid") for x in root.findall("gpu")] == [sc.gpus[2].uuid, sc.gpus[5].uuid]
    root, p = smi_xml(simdir, "-i", sc.gpus[6].uuid)
    assert [x.findtext("minor_number") for x in root.findall("gpu")] == ["1"]
    p = run_smi(simdir, "-q", "-x", "-i", "8")
    assert (p.returncode, p.stdout) == (6, "No devices were found\n")

    # the exit of a process is seen: gone from the log, its memory free (release lag 0)
    os.kill(a.pid, signal.SIGKILL)
    a.wait()
    root, p = smi_xml(simdir, "-i", "0,1")
    x0, x1 = root.findall("gpu")
    assert (rows(x0), x0.findtext("fb_memory_usage/used")) == ([], "0 MiB")
    assert [r[0] for r in rows(x1)] == [b.pid] and x1.findtext("fb_memory_usage/used") == "1024 MiB"


def test_e2e_query_text(simdir, procs):
    sc = scenario.load(simdir)
    a = procs.start([(1, "C", 2048)])
    p = run_smi(simdir, "-q")
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[1] == "==============NVSMI LOG==============" and "Attached GPUs                             : 8" in lines
    assert [line for line in lines if "Minor Number" in line] == [f"    Minor Number                          : {i}" for i in range(8)]
    assert [line[4:] for line in lines if line.startswith("GPU ")] == [g.pci_bus_id for g in sc.gpus]
    assert f"        Process ID                        : {a.pid}" in lines
    assert lines.count("    Processes                             : None") == 7
    p = run_smi(simdir, "-q", "-i", "1")
    assert [line for line in p.stdout.splitlines() if line.startswith(("GPU ", "    GPU UUID"))] == [
        f"GPU {sc.gpus[1].pci_bus_id}", f"    GPU UUID                              : {sc.gpus[1].uuid}"]


def test_e2e_query_xml_not_supported_and_missing_symbols(simdir):
    from gpusimkit.build import install_library
    with scenario.edit(simdir) as s:
        s.gpus[0].not_supported = ["minor_number", "mig_mode", "power", "memory", "serial", "encoder"]
    install_library(simdir, ["nvmlDeviceGetBrand", "nvmlDeviceGetMemoryInfo_v2"])
    root, p = smi_xml(simdir, "-i", "0,1")
    x0, x1 = root.findall("gpu")
    assert [x0.findtext(k) for k in ("minor_number", "mig_mode/current_mig", "serial", "gpu_power_readings/average_power_draw",
                                     "fb_memory_usage/total", "utilization/encoder_util", "product_brand")] == ["N/A"] * 7
    assert x0.findtext("gpu_power_readings/current_power_limit") == "700.00 W"
    # an older library: v1 memory (no reserved), no brand
    assert [e.text for e in x1.find("fb_memory_usage")] == ["143771 MiB", "N/A", "0 MiB", "143771 MiB"]
    assert (x1.findtext("minor_number"), x1.findtext("product_brand")) == ("1", "N/A")


@pytest.mark.parametrize("init_error, code, text", [
    (9, 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
           "Make sure that the latest NVIDIA driver is installed and running.\n"),
    (18, 18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159\n"),
    (4, 4, "Failed to initialize NVML: Insufficient Permissions\n"),
])
def test_e2e_query_init_errors(simdir, init_error, code, text):
    with scenario.edit(simdir) as s:
        s.init_error = init_error
    for args in (["-q", "-x"], ["-q"]):
        p = run_smi(simdir, *args)
        assert (p.returncode, p.stdout.strip()) == (code, text.strip())


def test_e2e_query_library_missing(tmp_path):
    d = str(tmp_path)
    scenario.save(d, scenario.new_scenario(2, seed=d))
    p = run_smi(d, "-q", "-x")
    assert p.returncode == 12 and p.stdout.startswith("NVIDIA-SMI couldn't find libnvidia-ml.so library")


def test_e2e_query_xml_lost_gpu(simdir):
    sc = scenario.load(simdir)
    with scenario.edit(simdir) as s:
        s.gpus[3].lost_at_ns = 0
    lost = ("Unable to determine the device handle for GPU3: 0000:5D:00.0: "
            "GPU is lost.  Reboot the system to recover this GPU\n")
    root, p = smi_xml(simdir, code=15)
    assert p.stderr == lost
    assert root.findtext("attached_gpus") == "8"
    assert [x.findtext("uuid") for x in root.findall("gpu")] == [g.uuid for g in sc.gpus if g.index != 3]
    p = run_smi(simdir, "-q")
    assert (p.returncode, p.stderr) == (15, lost)
    assert f"GPU {sc.gpus[3].pci_bus_id}" not in p.stdout and f"GPU {sc.gpus[4].pci_bus_id}" in p.stdout
    # only the lost one selected: a log with no GPU in it
    root, p = smi_xml(simdir, "-i", sc.gpus[3].uuid, code=15)
    assert (p.stderr, root.findall("gpu")) == (lost, [])
    # a GPU that is not lost is not affected
    root, p = smi_xml(simdir, "-i", "0,4")
    assert p.stderr == "" and len(root.findall("gpu")) == 2


def test_e2e_query_xml_unknown_error(simdir):
    with scenario.edit(simdir) as s:
        s.unknown_every = 1
    root, p = smi_xml(simdir, code=255)
    assert root.findall("gpu") == []
    lines = p.stderr.splitlines()
    assert len(lines) == 8 and all(line.endswith(": Unknown Error") for line in lines)


def test_e2e_query_usage_errors(simdir):
    for args in (["-x"], ["-q", "-L"], ["-q", "-x", "--query-gpu=index", "--format=csv"]):
        p = run_smi(simdir, *args)
        assert (p.returncode, p.stdout) == (2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"), args
    p = run_smi(simdir, "-h")
    assert "-x,   --xml-format" in p.stdout and "-q,   --query" in p.stdout
