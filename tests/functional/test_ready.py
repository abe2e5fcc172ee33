"""Ready means the next server will start (issue 21): health checks, fit, draining vs leaked memory.

Every test runs the modules as Ansible runs them (modrun: a fresh interpreter and an args file)
against a simulated host whose faults come from tests/gpusim (README "Health"): a health fault
blocks gpu_wait_idle with the check, the GPU and what to do in its message; a field the driver or
GPU cannot give is null and listed in ``unsupported``, never an error; memory that falls after the
last process has gone is "still being freed" (with its rate), memory that does not move for
``leak_after`` seconds is a leak; ``min_free_pct`` holds back a GPU the next server would not fit on.
"""

import json
import time

import pytest
from modrun import run_module

WAIT = {"timeout": 4, "settle": 0.3, "sleep": 0.1}


def devices(host):
    return [host.dir + "/dev/nvidia*"]


def wait(host, collection, **args):
    return run_module(host, collection, "gpu_wait_idle", dict(WAIT, device_files=devices(host), **args))


def facts(host, collection, **args):
    res = run_module(host, collection, "gpu_facts", dict(device_files=devices(host), **args))
    assert not res.get("failed"), res.get("msg")
    return res


# --- each health fault blocks the wait, with the right message -------------------------------------

# (id, driver profile, health fields of GPU 1, the message's words: the check and detail, what to do)
HEALTH_FAULTS = [
    ("row remap pending", "r580", {"remap_pending": 1, "remap_uncorrected": 1},
     "GPU 1: health check row_remap_pending failed: a row remap is pending", "nvidia-smi -r -i 1"),
    ("row remap failure", "r550", {"remap_failure": 1},
     "GPU 1: health check row_remap_failure failed: row remapping failed", "drain the GPU (no new work) and RMA it"),
    ("retired pages pending (a V100)", "r440", {"retired_pending": 1},
     "GPU 1: health check retired_pages_pending failed: memory pages are pending retirement", "nvidia-smi -r -i 1"),
    ("fabric not started", "r580", {"fabric_state": "not_started"},
     "GPU 1: health check fabric failed: its fabric state is Not Started, not Completed: every CUDA program fails"
     " with error 802", "systemctl start nvidia-fabricmanager"),
    ("fabric in progress (R535: the unversioned query)", "r535", {"fabric_state": "in_progress"},
     "its fabric state is In Progress", "systemctl start nvidia-fabricmanager"),
    ("fabric completed with an error", "r580", {"fabric_state": "completed", "fabric_status": 999},
     "its fabric registration Completed with status Unknown Error", "journalctl -u nvidia-fabricmanager"),
    ("uncorrectable ECC errors", "r525", {"ecc_volatile_uncorrected": 2},
     "GPU 1: health check ecc_uncorrectable failed: 2 uncorrectable ECC error(s) since the driver loaded",
     "RMA the GPU if the errors come back"),
]


@pytest.mark.parametrize("backend", ["nvml", "nvidia-smi"])
@pytest.mark.parametrize("name, driver, fields, detail, action", HEALTH_FAULTS, ids=[c[0] for c in HEALTH_FAULTS])
def test_health_fault_blocks_the_wait(gpusim_factory, collection, name, driver, fields, detail, action, backend):
    host = gpusim_factory(driver=driver, gpus=2)
    host.fault(health={1: fields})
    res = wait(host, collection, backend=backend)
    assert res.get("failed") and res["msg"].startswith("timed out after 4 s: "), res.get("msg")
    assert detail in res["msg"] and action in res["msg"], res["msg"]
    assert "GPU 0" not in res["msg"]
    assert res["idle_gpus"] == [0]
    gpu1 = res["gpus"][1]
    assert [c["check"] for c in gpu1["health"]["checks"] if c["blocking"]], gpu1["health"]
    # the GPU that passes is ready on its own; the check can be turned off
    assert wait(host, collection, backend=backend, gpus=["0"], timeout=10).get("ready")
    assert wait(host, collection, backend=backend, health_checks=[], timeout=10).get("ready")


@pytest.mark.parametrize("check, setup, words", [
    ("hw_slowdown", lambda host: host.fault(health={1: {"clock_reasons": 0x40}}),
     ["health check hw_slowdown failed: the hardware slows its clocks down (hw_thermal_slowdown)", "cooling"]),
    ("utilization_latched", lambda host: _util(host, 1, 100),
     ["health check utilization_latched failed: 100% utilization with no process on it", "nvidia-smi -r -i 1"]),
    ("xid", lambda host: host.fault(xid={1: 79}),
     ["health check xid failed: Xid 79 (GPU has fallen off the bus; NVIDIA's Xid catalog: RESTART_BM,",
      "in the kernel log since boot", "reboot"]),
])
def test_checks_that_block_only_when_asked(gpusim_factory, collection, check, setup, words):
    host = gpusim_factory(gpus=2)
    setup(host)
    assert wait(host, collection).get("ready")  # not a default check: reported, not blocking
    gpu1 = facts(host, collection, gpus=["1"])["ansible_facts"]["gpu_devices"][0]
    assert gpu1["idle"] and [c["check"] for c in gpu1["health"]["checks"]] == [check]
    assert gpu1["health"]["checks"][0]["blocking"] is False
    res = wait(host, collection, health_checks=[check])
    assert res.get("failed"), res
    for w in words:
        assert w in res["msg"], res["msg"]


def _util(host, index, pct):
    host.set_gpu(index, util_gpu=pct)


def test_one_message_per_check_with_the_gpus(gpusim_factory, collection):
    host = gpusim_factory(gpus=8)
    host.fault(health={i: {"fabric_state": "in_progress"} for i in range(8)})
    res = wait(host, collection)
    assert res["msg"].count("health check fabric failed") == 1, res["msg"]
    assert "GPUs 0, 1, 2, 3, 4, 5, 6, 7: health check fabric failed" in res["msg"]


# --- unsupported fields degrade to null ------------------------------------------------------------

# (NOT_SUPPORTED field of the simulator, the gpu_facts field that is null, the name listed in unsupported)
UNSUPPORTED = [
    ("remapped_rows", "remapped_rows", "remapped_rows"),
    ("ecc", "ecc_uncorrected_volatile", "ecc"),
    ("fabric", "fabric", "fabric"),
    ("clock_reasons", "clock_event_reasons", "clock_event_reasons"),
]


@pytest.mark.parametrize("backend", ["nvml", "nvidia-smi"])
@pytest.mark.parametrize("field, key, listed", UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_unsupported_health_field_is_null_and_listed(gpusim_factory, collection, field, key, listed, backend):
    host = gpusim_factory(gpus=2)
    host.fault(not_supported={0: [field]})
    res = facts(host, collection, backend=backend)
    g0, g1 = res["ansible_facts"]["gpu_devices"]
    assert g0[key] is None and listed in g0["unsupported"], g0["unsupported"]
    assert g0["errors"] == [] and g0["idle"] and g0["health"] == {"status": "ok", "detail": None, "checks": []}
    assert g1[key] is not None and listed not in g1["unsupported"]
    if key == "clock_event_reasons":
        assert g0["hw_slowdown"] is None and g1["hw_slowdown"] is False
    assert wait(host, collection, backend=backend).get("ready")


def test_retired_pages_on_a_v100_and_not_after(gpusim_factory, collection):
    """Pages are retired before Ampere, rows remapped from Ampere on: each is null on the other."""
    v100 = facts(gpusim_factory(driver="r440", gpus=1), collection)["ansible_facts"]["gpu_devices"][0]
    assert v100["retired_pages_pending"] is False and v100["remapped_rows"] is None
    a100 = facts(gpusim_factory(driver="r470", gpus=1), collection)["ansible_facts"]["gpu_devices"][0]
    assert a100["retired_pages_pending"] is None and a100["remapped_rows"]["pending"] is False


# --- draining vs leaked ----------------------------------------------------------------------------

def test_a_30_s_draining_curve_succeeds_within_the_timeout(gpusim_factory, collection):
    host = gpusim_factory(gpus=2)
    host.fault(drain_ms=30000)
    pid = host.hold(gpus=[0], mib=120 * 1024)
    assert host.kill(pid)
    t0 = time.monotonic()
    res = wait(host, collection, timeout=60, settle=0.5, sleep=0.5)
    took = time.monotonic() - t0
    assert res.get("ready"), res.get("msg")
    assert 25.0 <= res["elapsed"] <= 40.0 and took < 50, (res["elapsed"], took)
    used = [mib for _t, mib, _h in res["samples"]["0"]]
    assert used[0] > 100 * 1024 and used[-1] == 0
    assert len(used) > 10 and all(a >= b for a, b in zip(used, used[1:])), used  # released over time, never back up


def test_draining_at_the_timeout_is_still_being_freed(gpusim_factory, collection):
    host = gpusim_factory(gpus=3)
    host.fault(drain_ms=20000)
    for gpu in (0, 1):
        host.kill(host.hold(gpus=[gpu], mib=80 * 1024))
    res = wait(host, collection, timeout=3, sleep=0.2)
    assert res.get("failed"), res
    msg = res["msg"]
    assert "GPUs 0, 1: memory still being freed (" in msg and "GiB/s, about" in msg, msg
    assert "s left at this rate) with no process holding them: raise timeout (gpu_idle_timeout)" in msg
    assert msg.count("still being freed") == 1 and "leak" not in msg
    assert res["memory"]["0"]["kind"] == "draining" and res["memory"]["2"] is None
    rate = res["memory"]["0"]["rate"] / 1024
    assert 2.5 < rate < 6.0, rate  # 80 GiB over 20 s: 4 GiB/s


def test_a_leak_fails_with_the_leak_message(gpusim_factory, collection):
    host = gpusim_factory(gpus=3)
    host.fault(leak={1: 2048, 2: 300})
    res = wait(host, collection, timeout=3, leak_after=1.5)
    msg = res["msg"]
    assert res.get("failed") and "GPUs 1, 2: memory leaked (2048 MiB on GPU 1, 300 MiB on GPU 2, not freed for" in msg, msg
    assert "leak_after 1.5 s): a leaked context; reset the GPU once nothing holds it (nvidia-smi -r -i 1," \
           " nvidia-smi -r -i 2)" in msg
    assert msg.count("memory leaked") == 1 and "still being freed" not in msg
    assert res["memory"]["1"]["kind"] == "leaked" and res["memory"]["0"] is None
    # a leak not yet as old as leak_after: the sentence of before, with how long it has not moved
    res = wait(host, collection, timeout=2, gpus=["1"])
    assert "GPU 1: 2048 MiB used and no process holds it" in res["msg"] and "unchanged for" in res["msg"], res["msg"]


# --- fit -------------------------------------------------------------------------------------------

def test_min_free_pct_holds_back_a_gpu_the_next_server_would_not_fit_on(gpusim_factory, collection):
    host = gpusim_factory(gpus=2)
    host.fault(leak={1: 30000})  # 113771 of 143771 MiB free: 79 %
    common = {"max_memory_used_mib": 65536}  # the memory alone does not keep it busy
    res = wait(host, collection, min_free_pct=90, **common)
    assert res.get("failed"), res
    assert "GPU 1: 113771 MiB free, less than the 129394 MiB the next server needs" in res["msg"], res["msg"]
    assert res["idle_gpus"] == [0]
    assert wait(host, collection, min_free_pct=75, **common).get("ready")
    assert wait(host, collection, min_free_pct=75, min_free_mib=120000, **common).get("failed")  # the larger counts
    for backend, memory in (("nvml", "nvmlDeviceGetMemoryInfo_v2"), ("nvidia-smi", "nvidia-smi memory.free")):
        g0, g1 = facts(host, collection, min_free_pct=90, backend=backend, **common)["ansible_facts"]["gpu_devices"]
        assert (g0["fits"], g1["fits"]) == (True, False)
        assert g1["fit"]["free_mib"] == 113771 and g1["fit"]["need_mib"] == 129394
        assert g1["fit"]["memory"].startswith(memory)
    plain = facts(host, collection)["ansible_facts"]["gpu_devices"][0]
    assert plain["fit"] is None and plain["fits"] is None


def test_fit_on_a_unified_memory_gpu_cannot_be_told(gpusim_factory, collection):
    host = gpusim_factory(driver="gb10")
    res = facts(host, collection, min_free_pct=90)
    gpu = res["ansible_facts"]["gpu_devices"][0]
    assert gpu["fits"] is None and gpu["idle"]
    assert any("min_free_mib/min_free_pct cannot be checked" in str(w) for w in res.get("warnings") or [])


# --- Xid events ------------------------------------------------------------------------------------

def test_xid_events_with_their_meaning(gpusim_factory, collection):
    host = gpusim_factory(gpus=2)
    host.fault(xid={1: [13, 79]})
    res = facts(host, collection)
    log = res["ansible_facts"]["gpu_kernel_log"]
    assert log["readable"] and log["source"] == host.path("kmsg") and log["xid_events"] == 2
    g0, g1 = res["ansible_facts"]["gpu_devices"]
    assert g0["xid_events"] == []
    assert [(e["xid"], e["meaning"], e["catalog_action"], e["needs_action"]) for e in g1["xid_events"]] == [
        (13, "graphics engine exception (an out-of-bounds access, an illegal instruction)", "RESTART_APP", False),
        (79, "GPU has fallen off the bus", "RESTART_BM", True)]
    assert "reboot" in g1["xid_events"][1]["action"] and g1["xid_events"][1]["seconds"] > 0
    # nvidia-smi backend: the same log, the same events
    assert facts(host, collection, backend="nvidia-smi")["ansible_facts"]["gpu_devices"][1]["xid_events"] == g1["xid_events"]


def test_a_benign_xid_never_blocks_and_a_newer_one_does(gpusim_factory, collection):
    """Issue 27: the verdict is NVIDIA's Xid catalog's immediate action. GPU 0 logged Xids the catalog calls
    IGNORE (63, the remap itself is row_remap_pending), RESTART_APP (94) and Unused (61): ready. GPU 1 logged
    Xid 140 (ECC unrecovered error, RESET_GPU), which the table of before did not know: not ready."""
    host = gpusim_factory(gpus=2)
    host.fault(xid={0: [63, 94, 61], 1: [140]})
    res = wait(host, collection, health_checks=["xid"])
    assert res.get("failed") and "GPU 1: health check xid failed: Xid 140" in res["msg"], res.get("msg")
    assert "RESET_GPU" in res["msg"] and "GPU 0" not in res["msg"]
    assert res["idle_gpus"] == [0]
    assert wait(host, collection, health_checks=["xid"], gpus=["0"], timeout=10).get("ready")


def test_a_kernel_log_that_cannot_be_read_is_said(gpusim_factory, collection):
    host = gpusim_factory(gpus=1)
    res = facts(host, collection, kernel_log=host.path("no-such-log"))
    log = res["ansible_facts"]["gpu_kernel_log"]
    assert not log["readable"] and "could not be read" in log["problem"] and "no-such-log" in log["problem"]
    assert res["ansible_facts"]["gpu_devices"][0]["xid_events"] is None
    assert any("Xid events are not reported" in str(w) for w in res.get("warnings") or []), res.get("warnings")
    quiet = facts(host, collection, gather=["processes", "holders"])
    assert quiet["ansible_facts"]["gpu_kernel_log"] is None and not quiet.get("warnings")


def test_lost_gpu_logs_xid_79(gpusim_factory, collection):
    host = gpusim_factory(gpus=2)
    host.fault(lose_gpu=1)
    res = facts(host, collection, gpus=["0"])
    assert res["ansible_facts"]["gpu_kernel_log"]["xid_events"] == 1
    with open(host.path("kmsg"), encoding="utf-8") as f:
        assert "NVRM: Xid (PCI:0000:2a:00): 79" in f.read()


def test_check_mode_reports_health_without_waiting(gpusim_factory, collection):
    host = gpusim_factory(gpus=2)
    host.fault(health={0: {"ecc_volatile_uncorrected": 1}})
    res = run_module(host, collection, "gpu_wait_idle", dict(WAIT, device_files=devices(host)), check_mode=True)
    assert res["would_wait"] is True and not res.get("failed")
    assert "GPU 0: health check ecc_uncorrectable failed" in res["msg"], json.dumps(res)[:2000]


# --- the fields on every driver profile, through both backends -------------------------------------

PROFILES = ("r440", "r470", "r525", "r535-early", "r535", "r550", "r580", "gb10")
HEALTH_KEYS = ("remapped_rows", "retired_pages_pending", "ecc_uncorrected_volatile", "fabric", "clock_event_reasons",
               "hw_slowdown", "utilization_latched")


@pytest.mark.parametrize("profile", PROFILES)
def test_both_backends_agree_on_health_on_every_profile(gpusim_factory, collection, profile):
    host = gpusim_factory(driver=profile, gpus=None if profile == "gb10" else 2)
    fields = {"remap_pending": 1, "remap_uncorrected": 1, "retired_pending": 1, "ecc_volatile_uncorrected": 2,
              "clock_reasons": 0x48}
    host.fault(health={0: fields})
    nvml = facts(host, collection, backend="nvml")["ansible_facts"]["gpu_devices"][0]
    smi = facts(host, collection, backend="nvidia-smi")["ansible_facts"]["gpu_devices"][0]
    for key in HEALTH_KEYS:
        assert nvml[key] == smi[key], (profile, key, nvml[key], smi[key])
    health = ["remapped_rows", "retired_pages", "ecc", "fabric", "clock_event_reasons"]
    assert [u for u in nvml["unsupported"] if u in health] == [u for u in smi["unsupported"] if u in health]
    assert nvml["hw_slowdown"] is True
    failing = {c["check"] for c in nvml["health"]["checks"]}
    # a V100 retires pages, later GPUs remap rows; a GB10 has neither, nor ECC
    expected = {"hw_slowdown"} | ({"retired_pages_pending", "ecc_uncorrectable"} if profile == "r440" else
                                  set() if profile == "gb10" else {"row_remap_pending", "ecc_uncorrectable"})
    assert failing == expected, (profile, failing)
    assert nvml["idle"] is (profile == "gb10")


# --- the predeploy hook, as the README's inventory sets it ------------------------------------------

PREDEPLOY_CASES = [
    # (id, driver profile, fault, extra host variables, the words of the one fatal line)
    ("row_remap_pending", "r580", {"health": {1: {"remap_pending": 1, "remap_uncorrected": 1}}}, {},
     "GPU 1: health check row_remap_pending failed: a row remap is pending"),
    ("row_remap_failure", "r580", {"health": {1: {"remap_failure": 1}}}, {},
     "GPU 1: health check row_remap_failure failed: row remapping failed"),
    ("retired_pages_pending", "r440", {"health": {1: {"retired_pending": 1}}}, {},
     "GPU 1: health check retired_pages_pending failed: memory pages are pending retirement"),
    ("fabric", "r580", {"health": {1: {"fabric_state": "in_progress"}}}, {},
     "GPU 1: health check fabric failed: its fabric state is In Progress"),
    ("ecc_uncorrectable", "r580", {"health": {1: {"ecc_volatile_uncorrected": 3}}}, {},
     "GPU 1: health check ecc_uncorrectable failed: 3 uncorrectable ECC error(s)"),
    ("fit (gpu_memory_utilization 0.9)", "r580", {"leak": {1: 30000}},
     {"next_server_gpu_memory_utilization": 0.9, "gpu_idle_min_free_pct": "{{ next_server_gpu_memory_utilization * 100 }}",
      "gpu_idle_max_memory_used_mib": 65536},
     "GPU 1: 113771 MiB free, less than the 129394 MiB the next server needs"),
    ("leak", "r580", {"leak": {1: 2048}}, {"gpu_idle_leak_after": 1},
     "GPU 1: memory leaked (2048 MiB on GPU 1"),
]


@pytest.mark.parametrize("name, driver, fault, host_vars, words", PREDEPLOY_CASES, ids=[c[0] for c in PREDEPLOY_CASES])
def test_predeploy_fails_once_naming_the_check(gpusim_factory, collection, tmp_path, name, driver, fault, host_vars,
                                               words):
    import test_predeploy as predeploy

    host = gpusim_factory(driver=driver, gpus=2)
    host.fault(**fault)
    inv = predeploy.inventory(host, {"gpu-host": dict({"gpu_idle_timeout": 3, "gpu_idle_expected_count": 2}, **host_vars)})
    rc, out, _took = predeploy.playbook(host, collection, tmp_path, inv)
    assert rc != 0, out[-3000:]
    fatal = [line for line in out.splitlines() if line.startswith("fatal: ")]
    assert len(fatal) == 1, out[-4000:]
    assert words in fatal[0], fatal[0]
    print(f"{name}: {fatal[0]}")
