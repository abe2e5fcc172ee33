"""_wait.reset_decision and friends (gpu_wait_idle reset_leaked, issue 21 item 4): table-driven, pure."""

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _wait


def gpu(**kw):
    g = {"index": 2, "minor_number": 2, "pci_bus_id": "00000000:3A:00.0", "persistence_mode": False,
         "fabric": {"state": "Not Supported", "status": None}, "display_active": False, "display_mode": False}
    g.update(kw)
    return g


PERSISTENCED = {"pid": 900, "name": "nvidia-persistenced", "protected": True}
PLAIN = {"pid": 4242, "name": "python3", "protected": False}

# (id, gpu fields, holders, smi path, action, words in the reason)
CASES = [
    ("resettable", {}, [], "/usr/bin/nvidia-smi", "reset", ["nothing holds"]),
    ("no fabric query (null)", {"fabric": None}, [], "nvidia-smi", "reset", []),
    ("persistence on", {"persistence_mode": True}, [], "nvidia-smi", "refuse",
     ["persistence mode is on for GPU 2", "nvidia-smi -pm 0 -i 2"]),
    ("NVSwitch", {"fabric": {"state": "Completed", "status": "Success"}}, [], "nvidia-smi", "refuse",
     ["NVSwitch system (fabric state Completed)", "every GPU of the fabric"]),
    ("NVSwitch in progress", {"fabric": {"state": "In Progress"}}, [], "nvidia-smi", "refuse", ["In Progress"]),
    ("display active", {"display_active": True}, [], "nvidia-smi", "refuse", ["in use by a display"]),
    ("display mode", {"display_mode": True}, [], "nvidia-smi", "refuse", ["in use by a display"]),
    ("display unknown", {"display_active": None, "display_mode": None}, [], "nvidia-smi", "reset", []),
    ("a plain holder", {}, [PLAIN], "nvidia-smi", "refuse",
     ["pid 4242 (python3) holds the device node of GPU 2", "stop it (this module never does)"]),
    ("a protected daemon", {}, [PERSISTENCED], "nvidia-smi", "refuse",
     ["pid 900 (nvidia-persistenced, an NVIDIA daemon: systemctl stop nvidia-persistenced) holds"]),
    ("two holders", {}, [PERSISTENCED, PLAIN], "nvidia-smi", "refuse", ["pid 4242 (python3) hold the", "stop them"]),
    ("fabric manager", {}, [{"pid": 7, "name": "nv-fabricmanager", "protected": True}], "nvidia-smi", "refuse",
     ["systemctl stop nvidia-fabricmanager"]),
    ("every reason at once", {"persistence_mode": True, "display_active": True}, [PLAIN], "nvidia-smi", "refuse",
     ["display", "persistence mode", "pid 4242"]),
    ("no minor number", {"minor_number": None}, [], "nvidia-smi", "refuse", ["no minor number"]),
    ("no nvidia-smi", {}, [], None, "refuse", ["nvidia-smi was not found"]),
]


@pytest.mark.parametrize("name, fields, holders, smi, action, words", CASES, ids=[c[0] for c in CASES])
def test_reset_decision(name, fields, holders, smi, action, words):
    d = _wait.reset_decision(gpu(**fields), holders, smi)
    assert d["index"] == 2 and d["action"] == action, d
    for w in words:
        assert w in d["reason"], (w, d["reason"])


def test_leaked_to_reset_only_leaked_undecided_unheld():
    gpus = [
        {"index": 0, "idle": True},
        {"index": 1, "idle": False, "blockers": [], "processes": [], "holders": []},
        {"index": 2, "idle": False, "blockers": [], "processes": [], "holders": []},
        {"index": 3, "idle": False, "blockers": [9], "processes": [{"pid": 9}], "holders": []},
        {"index": 4, "idle": False, "blockers": [], "processes": [], "holders": [],
         "busy_reasons": ["memory used, not visible from this PID namespace"]},
    ]
    leaked = {"kind": "leaked", "used": 2048, "still": 5.0}
    memory = {"0": None, "1": leaked, "2": dict(leaked), "3": leaked, "4": leaked}
    assert [g["index"] for g, _t in _wait.leaked_to_reset(gpus, memory, {"2": {"action": "refused"}})] == [1]
    memory["1"] = {"kind": "unchanged", "used": 2048, "still": 0.5}
    assert _wait.leaked_to_reset(gpus, memory, {"2": {}}) == []


def test_reset_diff_and_summary():
    resets = {"2": {"index": 2, "action": "done", "used_mib": 2048, "reason": "x"},
              "10": {"index": 10, "action": "would", "used_mib": 300, "reason": "x"},
              "3": {"index": 3, "action": "refused", "used_mib": 100, "reason": "persistence mode is on"}}
    assert _wait.reset_diff(resets) == {"before": "GPU 2: 2048 MiB leaked\nGPU 10: 300 MiB leaked\n",
                                        "after": "GPU 2: reset\nGPU 10: reset\n"}
    assert _wait.reset_summary(resets) == "reset_leaked: GPU 3 not reset: persistence mode is on"
    assert _wait.reset_summary({}) == ""
