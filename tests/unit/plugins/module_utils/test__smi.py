# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations
import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors
from ansible_collections.gpuops.gpu.plugins.module_utils._smi import (
    error_for_exit,
    parse_apps,
    parse_gpus,
    parse_minor_numbers,
    query,
    value,
)

H200_ROW = ("0, GPU-84132344-1ae6-1959-e645-01ebbeb26ecd, NVIDIA H200, 1654055875253, 00000000:18:00.0, 143771, 81920, "
            "61851, 0, 97, 40, 45, 512.33, Enabled, Default, Disabled, 580.159.03")
OLD_ROW = ("1, GPU-c4834347-29a5-4963-56ab-807ab2313db4, GeForce GTX 770, [Not Supported], 00000000:01:00.0, 2004, "
           "[Unknown Error], [N/A], [N/A], [Not Supported], [Not Supported], 52, [N/A], Disabled, Exclusive_Process, "
           "[N/A], 470.42.01")


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
    assert gpu["mig_mode"] is False
    assert gpu["minor_number"] is None  # nvidia-smi's CSV cannot give it: null, never guessed


def test_parse_gpus_bracketed_values_become_null():
    (gpu,) = parse_gpus(OLD_ROW)
    assert gpu["serial"] is None
    assert gpu["memory"] == {"total": 2004, "used": None, "free": None, "reserved": None, "used_includes_reserved": None}
    assert gpu["unsupported"] == ["serial", "memory", "utilization", "power", "mig_mode"]
    assert gpu["utilization"] == {"gpu": None, "memory": None}
    assert gpu["power"] is None and gpu["mig_mode"] is None
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


def scripted(answers):
    """A run_command stand-in answering by the query in the argv; records every call."""
    calls = []

    def run(argv):
        calls.append(argv)
        for key, answer in answers.items():
            if argv[1].startswith(key):
                return answer
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
