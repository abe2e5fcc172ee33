"""gpu_wait_idle reset_leaked (issue 21, item 4): a GPU whose memory leaked is reset on request.

On the simulator (tests/gpusim, README "nvidia-smi -r"): a leak is cleared by ``nvidia-smi -r -i N`` and the wait
then returns ready; check mode resets nothing and says what it would; each refusal (a plain process or a
protected daemon holding the GPU's device node, persistence mode on, an NVSwitch GPU, a display GPU) comes with
its reason, and the simulated ``nvidia-smi -r`` refuses each with the real tool's message and exit code.
"""

import subprocess

import pytest
from modrun import alive, run_module_text

WAIT = {"timeout": 4, "settle": 0.3, "sleep": 0.1, "leak_after": 1, "reset_leaked": True}
LEAK = 2048


def wait(host, collection, check_mode=False, **args):
    payload = dict(WAIT, device_files=[host.dir + "/dev/nvidia*"], **args)
    return run_module_text(host, collection, "gpu_wait_idle", payload, check_mode=check_mode, diff=True)[0]


def leaky(gpusim_factory, **fields):
    """A 3-GPU host whose GPU 2 leaked LEAK MiB; by default resettable (persistence off, no fabric, no display)."""
    host = gpusim_factory(gpus=3)
    host.fault(leak={2: LEAK})
    host.set_gpu(2, **dict({"persistence": 0, "fabric_state": 0, "fabric_status": 0}, **fields))
    return host


def used(host, index):
    return host.status()["gpus"][index]["memory_used_mib"]


def smi_reset(host, index):
    proc = subprocess.run([host.dir + "/bin/nvidia-smi", "-r", "-i", str(index)], env=host.env(),
                          capture_output=True, text=True, timeout=30, check=False)
    return proc.returncode, proc.stdout


def test_a_leak_is_reset_on_request_and_the_wait_returns_ready(gpusim_factory, collection):
    host = leaky(gpusim_factory)
    bus = host.scenario().gpus[2].pci_bus_id
    res = wait(host, collection, timeout=10)
    assert res.get("ready"), res.get("msg")
    assert res["changed"] is True
    [r] = res["resets"]
    assert (r["index"], r["action"], r["rc"], r["used_mib"]) == (2, "done", 0, LEAK), r
    assert r["output"] == f"GPU {bus} was successfully reset.", r
    assert res["diff"] == {"before": f"GPU 2: {LEAK} MiB leaked\n", "after": "GPU 2: reset\n"}
    assert used(host, 2) == 0


def test_check_mode_resets_nothing(gpusim_factory, collection):
    host = leaky(gpusim_factory)
    res = wait(host, collection, check_mode=True)
    assert not res.get("failed"), res.get("msg")
    [r] = res["resets"]
    assert (r["index"], r["action"], r["rc"], r["output"]) == (2, "would", None, None), r
    assert res["changed"] is True and res["would_wait"] is True
    assert res["diff"] == {"before": f"GPU 2: {LEAK} MiB leaked\n", "after": "GPU 2: reset\n"}
    assert used(host, 2) == LEAK


def test_without_reset_leaked_nothing_is_reset(gpusim_factory, collection):
    host = leaky(gpusim_factory)
    res = wait(host, collection, timeout=2, reset_leaked=False)
    assert res.get("failed") and "memory leaked" in res["msg"] and "resets" not in res, res.get("msg")
    assert used(host, 2) == LEAK


# (id, the GPU's scenario fields, a workload holding GPU 2's node (its name), module args, the reason's words)
REFUSALS = [
    ("persistence mode on", {"persistence": 1}, None, {},
     ["persistence mode is on for GPU 2", "nvidia-smi -pm 0 -i 2"]),
    ("an NVSwitch GPU", {"fabric_state": 3}, None, {},
     ["GPU 2 is on an NVSwitch system (fabric state Completed)", "every GPU of the fabric"]),
    ("a display GPU", {"display_active": 1}, None, {},
     ["GPU 2 is in use by a display (display_active/display_mode Enabled)", "primary GPU"]),
    ("a protected daemon holds the node", {}, "nvidia-persistenced", {},
     ["(nvidia-persistenced, an NVIDIA daemon: systemctl stop nvidia-persistenced) holds the device node of GPU 2",
      "this module never does"]),
    ("a plain process holds the node", {}, "gpu-probe", {"include_device_holders": False},
     ["holds the device node of GPU 2: the driver refuses a reset while any process holds it"]),
    # Issue 28: with protect set, the node holders' protection was asked with the compiled patterns where
    # _snapshot.is_protected took strings - TypeError (first argument must be string or compiled pattern).
    ("a plain process holds the node, protect set", {}, "gpu-probe",
     {"include_device_holders": False, "protect": ["jupyter", r"dcgm-\w+"]},
     ["holds the device node of GPU 2: the driver refuses a reset while any process holds it"]),
    ("a protected process holds the node, by the protect option", {}, "gpu-probe", {"protect": ["gpu-pro+be"]},
     ["holds the device node of GPU 2"]),
]


@pytest.mark.parametrize("name, fields, holder, args, words", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_each_refusal_with_its_reason(gpusim_factory, collection, name, fields, holder, args, words):
    host = leaky(gpusim_factory, **fields)
    pid = host.hold(gpus=[2], device_only=True, name=holder) if holder else None
    res = wait(host, collection, timeout=3, **args)
    assert res.get("failed"), res
    [r] = res["resets"]
    assert (r["index"], r["action"], r["rc"]) == (2, "refused", None), r
    for w in words:
        assert w in r["reason"], (w, r["reason"])
    if pid:
        assert f"pid {pid} (" in r["reason"], r["reason"]
        assert alive(pid)  # never stopped by the module
    assert "reset_leaked: GPU 2 not reset: " + r["reason"] in res["msg"], res["msg"]
    assert res["changed"] is False and "diff" not in res
    assert used(host, 2) == LEAK


# --- the simulated nvidia-smi -r: each refusal with the real tool's words and exit code (README "nvidia-smi -r")

def test_simulated_nvidia_smi_reset_refusals_and_success(gpusim_factory):
    host = leaky(gpusim_factory, persistence=1)
    bus = host.scenario().gpus[2].pci_bus_id
    rc, out = smi_reset(host, 2)
    assert rc == 255 and out.startswith(f"The following GPUs could not be reset:\n  GPU {bus}: In use by another client\n")
    host.set_gpu(2, persistence=0)
    pid = host.hold(gpus=[2], device_only=True, name="gpu-probe")
    rc, out = smi_reset(host, 2)
    assert rc == 255 and out.startswith(f"GPU {bus} is currently in use by another process.\n\n1 device is currently"
                                        " being used by one or more other processes"), out
    host.kill(pid)
    host.set_gpu(2, display_active=1)
    rc, out = smi_reset(host, 2)
    assert (rc, out) == (3, f"GPU Reset couldn't run because GPU {bus} is the primary GPU.\n")
    host.set_gpu(2, display_active=0, fabric_state=3)
    rc, out = smi_reset(host, 2)
    assert rc == 3 and "NVSwitch" in out, out
    assert used(host, 2) == LEAK
    host.set_gpu(2, fabric_state=0)
    assert smi_reset(host, 2) == (0, f"GPU {bus} was successfully reset.\n")
    assert used(host, 2) == 0
