# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations
import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _health, _smi
from ansible_collections.gpuops.gpu.plugins.module_utils._smi import (
    error_for_exit,
    parse_apps,
    parse_gpus,
    parse_minor_numbers,
    query,
    value,
)

H200_ROW = ("0, GPU-84132344-1ae6-1959-e645-01ebbeb26ecd, NVIDIA H200, 1654055875253, 00000000:18:00.0, 143771, 81920, "
            "61851, 0, 97, 40, 45, 512.33, Enabled, Default, Disabled, Enabled, 580.159.03")
OLD_ROW = ("1, GPU-c4834347-29a5-4963-56ab-807ab2313db4, GeForce GTX 770, [Not Supported], 00000000:01:00.0, 2004, "
           "[Unknown Error], [N/A], [N/A], [Not Supported], [Not Supported], 52, [N/A], Disabled, Exclusive_Process, "
           "[N/A], [N/A], 470.42.01")


@pytest.mark.parametrize("cell, expected", [
    ("[N/A]", None), ("[Not Supported]", None), ("[Unknown Error]", None), ("[Insufficient Permissions]", None),
    ("N/A", None), ("", None), (" 42 ", "42"), ("NVIDIA H200", "NVIDIA H200"),
])
def test_value(cell, expected):
    assert value(cell) == expected


def test_parse_gpus_full_row():
    (gpu,) = parse_gpus(H200_ROW + "\n")
    assert gpu["index"] == 0
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["memory"] == {"total": 143771, "used": 81920, "free": 61851, "reserved": 0, "used_includes_reserved": False}
    assert gpu["unsupported"] == []
    assert gpu["utilization"] == {"gpu": 97, "memory": 40}
    assert gpu["power"] == 512.33
    assert gpu["persistence_mode"] is True
    assert gpu["compute_mode"] == "default"
    # the MIG mode a reset applies (mig.mode.pending), read for every GPU: here MIG comes on at the next reset
    assert gpu["mig_mode"] is False and gpu["mig_mode_pending"] is True
    assert gpu["minor_number"] is None  # nvidia-smi's CSV cannot give it: null, never guessed


def test_parse_gpus_bracketed_values_become_null():
    (gpu,) = parse_gpus(OLD_ROW)
    assert gpu["serial"] is None
    assert gpu["memory"] == {"total": 2004, "used": None, "free": None, "reserved": None, "used_includes_reserved": None}
    assert gpu["unsupported"] == ["serial", "memory", "utilization", "power", "mig_mode"]
    assert gpu["utilization"] == {"gpu": None, "memory": None}
    assert gpu["power"] is None and gpu["mig_mode"] is None and gpu["mig_mode_pending"] is None
    assert gpu["compute_mode"] == "exclusive_process"


def test_parse_gpus_rejects_a_short_row():
    with pytest.raises(ValueError):
        parse_gpus("0, GPU-x, NVIDIA H200")


APPS_CASES = [
    ("plain", "GPU-a, 8812, python3, 81920", [{"gpu_uuid": "GPU-a", "pid": 8812, "name": "python3", "used_mib": 81920}]),
    ("name with comma", "GPU-a, 8812, /opt/my, app/python3, 10",
     [{"gpu_uuid": "GPU-a", "pid": 8812, "name": "/opt/my, app/python3", "used_mib": 10}]),
    ("memory N/A (WDDM, containers)", "GPU-b, 77, python3, [N/A]",
     [{"gpu_uuid": "GPU-b", "pid": 77, "name": "python3", "used_mib": None}]),
    ("empty", "", []),
    ("no running processes line", "No running processes found", []),
    ("two rows", "GPU-a, 1, a, 5\nGPU-b, 2, b, 6\n",
     [{"gpu_uuid": "GPU-a", "pid": 1, "name": "a", "used_mib": 5}, {"gpu_uuid": "GPU-b", "pid": 2, "name": "b", "used_mib": 6}]),
]


@pytest.mark.parametrize("name, out, expected", APPS_CASES, ids=[c[0] for c in APPS_CASES])
def test_parse_apps(name, out, expected):
    assert parse_apps(out) == expected


EXIT_CASES = [
    (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", _errors.DriverNotLoaded, "not loaded"),
    (12, "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.", _errors.LibraryNotFound, "no NVIDIA driver libraries"),
    (18, "Failed to initialize NVML: Driver/library version mismatch", _errors.VersionMismatch, "without a reboot"),
    (4, "Failed to initialize NVML: Insufficient Permissions", _errors.NoPermission, "become"),
    (15, "Unable to determine the device handle for GPU00000000:3B:00.0: GPU is lost.", _errors.GpuLost, "GPU 00000000:3B:00.0 has fallen off the bus"),
    (255, "Unknown Error", _errors.BackendError, "exit 255"),
]


@pytest.mark.parametrize("rc, out, cls, phrase", EXIT_CASES, ids=[str(c[0]) for c in EXIT_CASES])
def test_error_for_exit(rc, out, cls, phrase):
    exc = error_for_exit(rc, out, "")
    assert isinstance(exc, cls) and exc.kind == cls.kind
    assert phrase in exc.msg


@pytest.fixture(autouse=True)
def _forget_listed_fields():
    """nvidia-smi's field list is read once per run (per process): each test is a run of its own."""
    _smi._LISTED.clear()
    _smi._DROPPED.clear()
    yield
    _smi._LISTED.clear()
    _smi._DROPPED.clear()


def listing(fields):
    """An ``nvidia-smi --help-query-gpu`` in the real layout (names, then a description line)."""
    body = "".join(f'"{f}"\nWhat {f} is.\n\n' for f in fields)
    return f'List of valid properties to query for the switch "--query-gpu":\n\n{body}'


LISTING_ALL = listing(_smi.GPU_FIELDS)


def scripted(answers):
    """A run_command stand-in answering by the query in the argv; records every call. ``--help-query-gpu``
    lists every field unless the answers say otherwise."""
    calls = []
    answers = dict({"--help-query-gpu": (0, LISTING_ALL, "")}, **answers)

    def run(argv):
        calls.append(argv)
        for key, answer in answers.items():
            if argv[1].startswith(key):
                return answer(argv) if callable(answer) else answer
        raise AssertionError(f"unexpected argv {argv}")

    return run, calls


def test_query_scripted_runner_joins_apps_to_gpus():
    run, calls = scripted({"--query-gpu=": (0, H200_ROW + "\n", ""),
                           "--query-compute-apps=": (0, "GPU-84132344-1ae6-1959-e645-01ebbeb26ecd, 8812, python3, 81920\n", "")})
    raw = query(run, "/usr/bin/nvidia-smi")
    assert sorted(c[1].split("=")[0] for c in calls) == ["--query-compute-apps", "--query-gpu"]
    gpu_call = [c for c in calls if c[1].startswith("--query-gpu=")][0]
    assert gpu_call[0] == "/usr/bin/nvidia-smi" and gpu_call[1].startswith("--query-gpu=index,uuid,")
    assert gpu_call[2] == "--format=csv,noheader,nounits"
    assert raw["driver"]["driver_version"] == "580.159.03"
    assert raw["gpus"][0]["processes"] == [{"pid": 8812, "types": ["compute"], "used_mib": 81920}]


@pytest.mark.parametrize("gpu_answer", [(0, "", ""), (0, "\n", ""), (0, "", "some text on stderr\n")])
def test_query_exit_0_without_a_row_is_not_an_empty_success(gpu_answer):
    """Issue 27 item 3: no row with exit 0 fails, naming the fields asked and lacking; 'no GPU' is exit 6 only."""
    run, _calls = scripted({"--help-query-gpu": (0, listing(PRE_R510_FIELDS), ""),
                            "--query-gpu=": lambda argv: (2, 'Field "memory.reserved" is not a valid field to query.\n\n', "")
                            if "memory.reserved" in argv[1] else gpu_answer,
                            "--query-compute-apps=": (0, "", "")})
    with pytest.raises(_errors.BackendError) as info:
        query(run, "nvidia-smi")
    assert "gave no GPU row" in info.value.msg and "memory.reserved" in info.value.msg
    assert info.value.details["missing_fields"] == ["memory.reserved"]


def test_query_no_devices_is_zero_gpus():
    raw = query(lambda argv: (6, "No devices were found\n", ""), "nvidia-smi")
    assert raw["gpus"] == []


XML = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
  <driver_version>580.159.03</driver_version>
  <attached_gpus>2</attached_gpus>
  <gpu id="00000000:18:00.0"><uuid>GPU-a</uuid><minor_number>0</minor_number></gpu>
  <gpu id="00000000:2A:00.0"><uuid>GPU-b</uuid><minor_number>N/A</minor_number></gpu>
</nvidia_smi_log>
"""


def test_parse_minor_numbers():
    assert parse_minor_numbers(XML) == {"GPU-a": 0}
    with pytest.raises(ValueError):
        parse_minor_numbers("not xml")


def test_query_fills_minor_numbers():
    run, _calls = scripted({"--query-gpu=": (0, H200_ROW + "\n", ""), "--query-compute-apps=": (0, "", "")})
    raw = query(run, "nvidia-smi", {"GPU-84132344-1ae6-1959-e645-01ebbeb26ecd": 0})
    assert raw["gpus"][0]["minor_number"] == 0


# --- fields negotiated with the driver's nvidia-smi (pre-R510 has no memory.reserved) -------------------

PRE_R510_FIELDS = [f for f in _smi.GPU_FIELDS if f != "memory.reserved"]
# A 470-branch row of PRE_R510_FIELDS (no memory.reserved column)
R470_ROW = ("0, GPU-c4834347-29a5-4963-56ab-807ab2313db4, NVIDIA A100-SXM4-80GB, 1324120000000, 00000000:07:00.0, "
            "81251, 3, 81248, 0, 0, 31, 63.14, Enabled, Default, Disabled, Disabled, 470.256.02")
REFUSAL = (2, 'Field "memory.reserved" is not a valid field to query.\n\n', "")


def answer_gpu(fields_ok, row):
    """nvidia-smi's --query-gpu as a driver that knows ``fields_ok``: it refuses the first unknown field."""
    def run(argv):
        asked = argv[1].split("=", 1)[1].split(",")
        for f in asked:
            if f not in fields_ok:
                return 2, f'Field "{f}" is not a valid field to query.\n\n', ""
        return 0, row + "\n", ""
    return run


def test_parse_listed_fields_reads_names_and_aliases_only():
    text = ('List of valid properties to query for the switch "--query-gpu=":\n\n"timestamp"\nThe timestamp.\n\n'
            '"name" or "gpu_name"\nThe official product name.\n\n"compute_mode"\nThe compute mode flag.\n'
            '"Default" means multiple contexts are allowed per device.\n\n'
            '"clocks_event_reasons.active" or "clocks_throttle_reasons.active"\nBitmask.\n')
    assert _smi.parse_listed_fields(text) == {"timestamp", "name", "gpu_name", "compute_mode",
                                              "clocks_event_reasons.active", "clocks_throttle_reasons.active"}


def test_pre_r510_query_asks_only_listed_fields_and_says_which_it_could_not_get():
    run, calls = scripted({"--help-query-gpu": (0, listing(PRE_R510_FIELDS), ""),
                           "--query-gpu=": answer_gpu(PRE_R510_FIELDS, R470_ROW),
                           "--query-compute-apps=": (0, "GPU-c4834347-29a5-4963-56ab-807ab2313db4, 77, python3, 3\n", "")})
    raw = query(run, "nvidia-smi")
    # refused once (exit 2), then the listing read and the query asked with what it lists
    assert [c[1] for c in calls if not c[1].startswith("--query-compute-apps")] == [
        "--query-gpu=" + ",".join(_smi.GPU_FIELDS), "--help-query-gpu", "--query-gpu=" + ",".join(PRE_R510_FIELDS)]
    assert raw["driver"]["missing_fields"] == ["memory.reserved"]
    assert raw["driver"]["driver_version"] == "470.256.02"
    (gpu,) = raw["gpus"]
    # that nvidia-smi reads NVML's v1 figures: used includes the reserved memory, which it cannot tell
    assert gpu["memory"] == {"total": 81251, "used": 3, "free": 81248, "reserved": None, "used_includes_reserved": True}
    assert gpu["processes"] == [{"pid": 77, "types": ["compute"], "used_mib": 3}]
    calls.clear()
    query(run, "nvidia-smi")  # the rest of the run asks the listed fields at once
    assert [c[1] for c in calls].count("--help-query-gpu") == 0
    assert [c[1] for c in calls if c[1].startswith("--query-gpu=")] == ["--query-gpu=" + ",".join(PRE_R510_FIELDS)]


def test_refused_field_is_dropped_when_the_listing_cannot_be_read():
    run, calls = scripted({"--help-query-gpu": (255, "", "Unknown Error"),
                           "--query-gpu=": answer_gpu(PRE_R510_FIELDS, R470_ROW),
                           "--query-compute-apps=": (0, "", "")})
    raw = query(run, "nvidia-smi")
    gpu_calls = [c[1] for c in calls if c[1].startswith("--query-gpu=")]
    assert len(gpu_calls) == 2 and "memory.reserved" in gpu_calls[0] and "memory.reserved" not in gpu_calls[1]
    assert raw["driver"]["missing_fields"] == ["memory.reserved"]
    assert raw["gpus"][0]["memory"]["used_includes_reserved"] is True


def test_a_refused_required_field_fails_suggesting_nvml():
    run, _calls = scripted({"--query-gpu=": (2, 'Field "uuid" is not a valid field to query.\n\n', ""),
                            "--query-compute-apps=": (0, "", "")})
    with pytest.raises(_errors.BackendError) as info:
        query(run, "nvidia-smi")
    assert "exit 2" in info.value.msg and "nvidia-ml-py" in info.value.msg and "backend: nvml" in info.value.msg


def test_a_driver_that_refuses_nothing_costs_no_extra_call():
    run, calls = scripted({"--query-gpu=": (0, H200_ROW + "\n", ""), "--query-compute-apps=": (0, "", "")})
    assert query(run, "nvidia-smi")["driver"]["missing_fields"] == []
    assert "--help-query-gpu" not in [c[1] for c in calls]


INFOROM_LINE = "WARNING: infoROM is corrupted at gpu 0000:18:00.0\n"


@pytest.mark.parametrize("answer, expected", [
    # nvidia-smi(1) RETURN VALUE 14 "infoROM is corrupted": its line first, the output complete
    ((14, INFOROM_LINE + "0, a\n", ""), (0, "0, a\n", "", ["infoROM is corrupted at gpu 0000:18:00.0"])),
    # the same line with exit 0 (an nvidia-smi that warns and succeeds): taken out all the same
    ((0, INFOROM_LINE + "0, a\n", ""), (0, "0, a\n", "", ["infoROM is corrupted at gpu 0000:18:00.0"])),
    # exit 14 with no line: the man page's meaning is the warning
    ((14, "0, a\n", ""), (0, "0, a\n", "", ["nvidia-smi exit 14: infoROM is corrupted (nvidia-smi(1) RETURN VALUE)"])),
    # a warning on stderr, among other text; other exit codes stay failures
    ((15, "", "WARNING: something\nUnable to determine the device handle for GPU3\n"),
     (15, "", "Unable to determine the device handle for GPU3\n", ["something"])),
    ((0, "0, a\n", ""), (0, "0, a\n", "", [])),
])
def test_without_warnings(answer, expected):
    assert _smi.without_warnings(answer) == expected


def test_query_with_the_inforom_warning_and_exit_14_gives_every_gpu_and_the_finding():
    """Before: exit 14 failed every module; with exit 0, the WARNING line failed the CSV parse."""
    for rc in (14, 0):
        run, _calls = scripted({"--query-gpu=": (rc, INFOROM_LINE + H200_ROW + "\n", ""),
                                "--query-compute-apps=": (rc, INFOROM_LINE, "")})
        raw = query(run, "nvidia-smi")
        gpu = raw["gpus"][0]
        assert gpu["pci_bus_id"] == "00000000:18:00.0" and gpu["inforom_corrupt"] is True
        assert gpu["errors"] == ["GPU 0: nvidia-smi: WARNING: infoROM is corrupted at gpu 0000:18:00.0"]
        checks = [c for c in _health.failed_checks(gpu) if c["check"] == "inforom"]
        assert len(checks) == 1 and checks[0]["blocking"] is False
    run, _calls = scripted({"--query-gpu=": (0, H200_ROW + "\n", ""), "--query-compute-apps=": (0, "", "")})
    gpu = query(run, "nvidia-smi")["gpus"][0]
    assert gpu["inforom_corrupt"] is False and gpu["errors"] == []
    assert "inforom" not in [c["check"] for c in _health.failed_checks(gpu)]


def test_minor_numbers_and_health_read_past_exit_14():
    assert _smi.minor_query(lambda argv: (14, INFOROM_LINE + XML, ""), "nvidia-smi") == {"GPU-a": 0}
    rows = _smi.health_query(lambda argv: (14, INFOROM_LINE + "0, 0, 0, No, No, [N/A], 0, Completed, Success, 0x1\n", ""),
                             "nvidia-smi")
    assert list(rows) == [0]
