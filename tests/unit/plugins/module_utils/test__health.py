# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The health checks, the fit, and the Xid events of the kernel log (_health): table-driven."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _health
from ansible_collections.gpuops.gpu.plugins.module_utils._host import kernel_log


def gpu(**fields):
    memory = {"total": 143771, "used": 0, "free": 143771, "used_includes_reserved": False}
    g = {"index": 3, "pci_bus_id": "00000000:5D:00.0", "memory": memory, "utilization": {"gpu": 0}, "processes": [],
         "processes_error": None}
    g.update(fields)
    return g


ROWS_OK = {"corrected": 0, "uncorrected": 0, "pending": False, "failure": False}

# (id, GPU fields, the checks that fail, a word of the first failure's detail, a word of its action)
CHECK_CASES = [
    ("healthy", {"remapped_rows": ROWS_OK, "retired_pages_pending": False, "ecc_uncorrected_volatile": 0,
                 "fabric": {"state": "Completed", "status": "Success"}, "clock_event_reasons": ["gpu_idle"]},
     [], None, None),
    ("every field unsupported (None): every check passes", {}, [], None, None),
    ("row remap pending", {"remapped_rows": dict(ROWS_OK, pending=True, uncorrected=1)},
     ["row_remap_pending"], "pending", "nvidia-smi -r -i 3"),
    ("row remap failure", {"remapped_rows": dict(ROWS_OK, failure=True)}, ["row_remap_failure"], "failed", "RMA"),
    ("retired pages pending", {"retired_pages_pending": True}, ["retired_pages_pending"], "retirement",
     "nvidia-smi -r -i 3"),
    ("fabric not started", {"fabric": {"state": "Not Started", "status": None}}, ["fabric"], "error 802",
     "nvidia-fabricmanager"),
    ("fabric in progress", {"fabric": {"state": "In Progress", "status": None}}, ["fabric"], "In Progress",
     "fabric manager"),
    ("fabric completed with an error", {"fabric": {"state": "Completed", "status": "Unknown Error"}}, ["fabric"],
     "status Unknown Error", "fabric manager"),
    ("no fabric (PCIe card, single GPU)", {"fabric": {"state": "Not Supported", "status": None}}, [], None, None),
    ("uncorrectable ECC", {"ecc_uncorrected_volatile": 2}, ["ecc_uncorrectable"], "2 uncorrectable", "drain"),
    ("hardware slowdown", {"clock_event_reasons": ["hw_thermal_slowdown", "sw_power_cap"]}, ["hw_slowdown"],
     "hw_thermal_slowdown", "cooling"),
    ("software power cap is not a hardware slowdown", {"clock_event_reasons": ["sw_power_cap"]}, [], None, None),
    ("latched utilization", {"utilization": {"gpu": 100}}, ["utilization_latched"], "100%", "nvidia-smi -r -i 3"),
    ("busy with a process is not latched", {"utilization": {"gpu": 100}, "processes": [{"pid": 1}]}, [], None, None),
    ("an Xid that needs a reboot", {"xid_events": [{"xid": 79, "meaning": "GPU has fallen off the bus"}]}, ["xid"],
     "RESTART_BM", "reboot"),
    ("an application's Xid", {"xid_events": [{"xid": 13, "meaning": "graphics engine exception"}]}, [], None, None),
    # NVIDIA's Xid catalog: 63 IGNORE (the remap itself is row_remap_pending), 61 Unused on Ampere and newer,
    # 94 RESTART_APP; newer codes that need a reset: 136, 140, 143
    ("benign Xids never block", {"xid_events": [{"xid": c, "meaning": ""} for c in (63, 61, 94, 92, 43, 45, 137)]},
     [], None, None),
    ("Xid 140 needs a reset", {"xid_events": [{"xid": 63, "meaning": ""}, {"xid": 140, "meaning": ""}]}, ["xid"],
     "RESET_GPU", "reset"),
    ("Xid 154 naming a reboot", {"xid_events": [{"xid": 154, "meaning": "", "message": "GPU recovery action changed from"
                                                 " 0x0 (None) to 0x2 (Node Reboot Required)"}]}, ["xid"], "Xid 154", "reboot"),
    ("Xid 154 back to None", {"xid_events": [{"xid": 154, "meaning": "", "message": "GPU recovery action changed from"
                                              " 0x2 (Node Reboot Required) to 0x0 (None)"}]}, [], None, None),
]


@pytest.mark.parametrize("name, fields, failing, detail, action", CHECK_CASES, ids=[c[0] for c in CHECK_CASES])
def test_failed_checks(name, fields, failing, detail, action):
    out = _health.failed_checks(gpu(**fields), blocking=_health.DEFAULT_CHECKS)
    assert [f["check"] for f in out] == failing
    if failing:
        assert detail in out[0]["detail"] and action in out[0]["action"]
        assert out[0]["blocking"] is (failing[0] in _health.DEFAULT_CHECKS)


def test_default_checks_are_the_issues():
    assert _health.DEFAULT_CHECKS == ("row_remap_pending", "row_remap_failure", "retired_pages_pending", "fabric",
                                      "ecc_uncorrectable")
    # every check names its NVML call, its nvidia-smi field and where it exists (the docs' table)
    for name, (test, action, default, call, field, where) in _health.CHECKS.items():
        assert callable(test) and action and call and field and where, name


# (id, memory, min_free_mib, min_free_pct, free, need, fits)
FIT_CASES = [
    ("no option: no verdict", {"total": 143771, "free": 143771}, None, None, None, None, None),
    ("percent of the total, rounded up", {"total": 143771, "free": 143771}, None, 90, 143771, 129394, True),
    ("the larger of the two: MiB", {"total": 81559, "free": 70000}, 75000, 50, 70000, 75000, False),
    ("the larger of the two: percent", {"total": 81559, "free": 70000}, 1000, 90, 70000, 73404, False),
    ("exactly enough", {"total": 1000, "free": 900}, None, 90, 900, 900, True),
    ("a unified-memory GPU cannot be judged", {"total": None, "free": None}, None, 90, None, None, None),
    ("zero asks for nothing", {"total": 1000, "free": 0}, 0, 0, 0, 0, True),
]


@pytest.mark.parametrize("name, memory, mib, pct, free, need, fits", FIT_CASES, ids=[c[0] for c in FIT_CASES])
def test_fit(name, memory, mib, pct, free, need, fits):
    result = _health.fit(gpu(memory=dict(memory, used_includes_reserved=False)), mib, pct, "nvml")
    if mib is None and pct is None:
        assert result is None
        return
    assert (result["free_mib"], result["need_mib"], result["fits"]) == (free, need, fits)
    text = _health.fit_text(gpu(), result)
    assert ("less than the" in text) is (fits is False)


@pytest.mark.parametrize("backend, includes, expected", [
    ("nvml", False, "nvmlDeviceGetMemoryInfo_v2"),
    ("nvml", True, "nvmlDeviceGetMemoryInfo (v1"),
    ("nvidia-smi", False, "nvidia-smi memory.free"),
])
def test_fit_says_which_memory_figure(backend, includes, expected):
    g = gpu(memory={"total": 100, "free": 100, "used_includes_reserved": includes})
    assert _health.fit(g, 10, None, backend)["memory"].startswith(expected)


@pytest.mark.parametrize("mask, names", [
    (0x0, []), (0x1, ["gpu_idle"]), (0x48, ["hw_slowdown", "hw_thermal_slowdown"]),
    (0x80, ["hw_power_brake_slowdown"]), (None, None),
])
def test_clock_reason_names(mask, names):
    assert _health.clock_reason_names(mask) == names


KMSG = """\
6,1,1000000,-;Linux version 6.8.0
3,812,5123450000,-;NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
 SUBSYSTEM=pci
3,813,5123460000,-;NVRM: Xid (PCI:0000:18:00): 48, pid=1234, name=python3, An uncorrectable double bit error
4,814,5123470000,-;NVRM: Xid (PCI:0000:5d:00): 999, pid=0, something new
"""
DMESG = """\
[    1.000000] Linux version 6.8.0
[ 5123.450000] NVRM: Xid (PCI:0000:5d:00): 94, pid=77, name=vllm, Contained: SM (0x1). RST: No, D-RST: No
"""


@pytest.mark.parametrize("text, expected", [
    (KMSG, [("00000000:5D:00", 79, 5123.45), ("00000000:18:00", 48, 5123.46), ("00000000:5D:00", 999, 5123.47)]),
    (DMESG, [("00000000:5D:00", 94, 5123.45)]),
    ("NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics SM Warp Exception\n", [("00000000:3B:00", 13, None)]),
    ("no Xid here\n", []),
])
def test_parse_xid_events(text, expected):
    events = _health.parse_xid_events(text)
    assert [(e["bus"], e["xid"], e["seconds"]) for e in events] == expected
    for e in events:
        assert e["meaning"] and e["action"]


def test_common_xids_have_a_meaning():
    for code in (13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 136, 140, 143, 154):
        mnemonic, meaning, bucket, action = _health.XID[code]
        assert mnemonic.isupper() and meaning and action and bucket in _health.XID_ACTIONS
    unknown = _health.parse_xid_events(KMSG)[-1]
    assert "does not describe" in unknown["meaning"] and "xid-errors" in unknown["action"]


# (code, NVIDIA's Xid catalog's "Resolution Bucket (Immediate Action)", blocks readiness): the catalog's own rows
# (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), issue 27.
XID_CATALOG_ROWS = [
    (13, "RESTART_APP", False), (31, "RESTART_APP", False), (43, "IGNORE", False), (45, "WORKFLOW_XID_45", False),
    (46, "RESET_GPU", True), (48, "WORKFLOW_XID_48", True), (61, "CONTACT_SUPPORT", True), (62, "RESET_GPU", True),
    (63, "IGNORE", False), (64, "RESET_GPU", True), (74, "WORKFLOW_NVLINK_ERR", True), (79, "RESTART_BM", True),
    (92, "IGNORE", False), (94, "RESTART_APP", False), (95, "RESET_GPU", True), (109, "RESET_GPU", True),
    (110, "RESET_GPU", True), (119, "RESET_GPU", True), (120, "RESET_GPU", True), (136, "RESET_GPU", True),
    (137, "IGNORE", False), (140, "RESET_GPU", True), (143, "RESET_GPU", True), (155, "RESET_GPU", True),
    (156, "RESET_GPU", True), (157, "IGNORE", False), (158, "RESET_GPU", True),
]


@pytest.mark.parametrize("code, bucket, blocks", XID_CATALOG_ROWS)
def test_xid_verdicts_come_from_the_catalog_action(code, bucket, blocks):
    assert _health.XID[code][2] == bucket
    # 61 is "Unused" on Ampere and newer: CONTACT_SUPPORT in the catalog, never logged by those GPUs - not a block
    assert _health.xid_needs_action(code) is (blocks and code != 61)
    assert (code in _health.XID_NEEDS_ACTION) is (blocks and code != 61)


def test_unknown_xid_does_not_block_and_says_where_to_look():
    (event,) = _health.parse_xid_events("NVRM: Xid (PCI:0000:3b:00): 999, pid=1, something new\n")
    assert event["catalog_action"] is None and event["needs_action"] is False and "xid-catalog" in event["action"]


def test_xid_events_carry_the_catalog_action():
    events = _health.parse_xid_events(KMSG + DMESG)
    assert [(e["xid"], e["catalog_action"], e["needs_action"]) for e in events] == [
        (79, "RESTART_BM", True), (48, "WORKFLOW_XID_48", True), (999, None, False), (94, "RESTART_APP", False)]


def test_xid_events_of_one_gpu():
    events = _health.parse_xid_events(KMSG)
    mine = _health.xid_events_of(gpu(), events)
    assert [e["xid"] for e in mine] == [79, 999] and "bus" not in mine[0]
    assert _health.xid_events_of(gpu(pci_bus_id=None), events) == []


def test_read_kernel_log_from_a_file(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(KMSG)
    got = kernel_log.read_kernel_log(str(log))
    assert got["text"] == KMSG and got["source"] == str(log) and got["problem"] is None
    missing = kernel_log.read_kernel_log(str(tmp_path / "nope"))
    assert missing["text"] is None and "nope" in missing["problem"]
    summary = _health.kernel_log_summary(missing)
    assert not summary["readable"] and "run as root on the node" in summary["problem"]


def test_read_kernel_log_falls_back_to_dmesg(monkeypatch):
    def denied(_path):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(kernel_log, "_read_kmsg", denied)
    got = kernel_log.read_kernel_log(None, lambda argv: (0, DMESG, ""))
    assert got["source"] == "dmesg" and got["text"] == DMESG
    got = kernel_log.read_kernel_log(None, lambda argv: (1, "", "dmesg: read kernel buffer failed: Operation not permitted"))
    assert got["text"] is None
    assert "/dev/kmsg: Operation not permitted" in got["problem"] and "dmesg: exit 1" in got["problem"]


def test_the_docs_list_the_blocking_xids():
    """The health_checks doc (doc_fragments/gpu.py) names the codes that block, as the table derives them."""
    import re
    from ansible_collections.gpuops.gpu.plugins.doc_fragments.gpu import ModuleDocFragment

    text = " ".join(next(v for k, v in vars(ModuleDocFragment).items() if isinstance(v, str) and "V(xid)" in v).split())
    listed = text.split("V(xid)", 1)[1].split("or support - ", 1)[1].split(", and 154", 1)[0]
    assert tuple(int(c) for c in re.findall(r"\d+", listed)) == _health.XID_NEEDS_ACTION
    assert "analyzing-xid-catalog" in text and "(61)" in text
