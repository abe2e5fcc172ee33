# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The nvidia-smi fallback of the health fields (_smi.health_query): parsing and field negotiation."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _smi, _validate

ALL = [f for f, _key, _name in _smi.HEALTH_FIELDS if f != "clocks_throttle_reasons.active"]


def test_parse_health_rows():
    out = ("0, 0, 0, No, No, [N/A], 0, Completed, Success, 0x0000000000000001\n"
           "1, 2, 1, Yes, No, [N/A], 3, In Progress, [N/A], 0x0000000000000048\n")
    rows = _smi.parse_health(ALL, out)
    assert rows[0] == {"remapped_rows": {"corrected": 0, "uncorrected": 0, "pending": False, "failure": False},
                       "retired_pages_pending": None, "ecc_uncorrected_volatile": 0,
                       "fabric": {"state": "Completed", "status": "Success"}, "clock_event_reasons": ["gpu_idle"]}
    assert rows[1]["remapped_rows"]["pending"] is True and rows[1]["ecc_uncorrected_volatile"] == 3
    assert rows[1]["fabric"] == {"state": "In Progress", "status": None}
    assert rows[1]["clock_event_reasons"] == ["hw_slowdown", "hw_thermal_slowdown"]


def test_parse_health_not_supported_everywhere():
    rows = _smi.parse_health(ALL, "0, [N/A], [N/A], [N/A], [N/A], [N/A], [N/A], [N/A], [N/A], [N/A]\n")
    assert all(v is None for v in rows[0].values())
    with pytest.raises(ValueError, match="expected 10 fields"):
        _smi.parse_health(ALL, "0, 1\n")


class OldSmi:
    """An nvidia-smi that knows neither fabric.* nor clocks_event_reasons.* (an R470 one)."""

    def __init__(self, unknown=("fabric.state", "fabric.status", "clocks_event_reasons.active")):
        self.unknown = unknown
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv)
        fields = argv[1].split("=", 1)[1].split(",")
        for f in fields:
            if f in self.unknown:
                return 2, f'Field "{f}" is not a valid field to query.\n\n', ""
        values = {"index": "0", "remapped_rows.pending": "Yes", "remapped_rows.failure": "No",
                  "clocks_throttle_reasons.active": "0x0000000000000001"}
        return 0, ", ".join(values.get(f, "0") for f in fields) + "\n", ""


def test_health_query_leaves_out_the_fields_an_older_nvidia_smi_refuses():
    run, known = OldSmi(), {}
    rows = _smi.health_query(run, "nvidia-smi", known)
    assert rows[0]["remapped_rows"]["pending"] is True and rows[0]["clock_event_reasons"] == ["gpu_idle"]
    assert "fabric" not in rows[0]
    assert "clocks_throttle_reasons.active" in known["fields"] and "fabric.state" not in known["fields"]
    tries = len(run.calls)
    _smi.health_query(run, "nvidia-smi", known)  # the negotiated fields are reused: one run
    assert len(run.calls) == tries + 1
    gpus = [{"index": 0, "unsupported": []}]
    _smi.merge_health(gpus, rows)
    assert gpus[0]["fabric"] is None and gpus[0]["unsupported"] == ["fabric"]


def test_health_query_failure_is_the_typed_error():
    with pytest.raises(_errors.GpuError, match="fallen off the bus"):
        _smi.health_query(lambda argv: (15, "Unable to determine the device handle for GPU0000:5D:00.0: GPU is lost", ""),
                          "nvidia-smi", {})


@pytest.mark.parametrize("params, option", [
    ({"min_free_mib": -1}, "min_free_mib"),
    ({"min_free_mib": 2 ** 40}, "min_free_mib"),
    ({"min_free_pct": 100.5}, "min_free_pct"),
    ({"min_free_pct": float("nan")}, "min_free_pct"),
    ({"kernel_log": "relative/kmsg"}, "kernel_log"),
])
def test_idle_options_are_bounded(params, option):
    with pytest.raises(_errors.InvalidOption) as exc:
        _validate.idle(params)
    assert exc.value.details["option"] == option


def test_leak_after_is_bounded():
    base = {"timeout": 10, "delay": 0, "sleep": 0.5, "settle": 1}
    _validate.wait(dict(base, leak_after=2))
    for bad in (0, -1, float("inf")):
        with pytest.raises(_errors.InvalidOption):
            _validate.wait(dict(base, leak_after=bad))
