"""gpu_release against a real LXC container with systemd as PID 1 whose service respawns (Restart=always).

The unit is a real systemd unit of the container (gpusim ct create --systemd; hold(service=...)):
its restarted process is a child of the container's PID 1, in /lxc/<vmid>/ns/system.slice/<unit>,
as on a Proxmox VE node.  Issue 18, item 2: such a restart is a respawn, reported and never signalled.
"""

import time

import pytest
from modrun import alive, run_module

VMID = 7129


def release(host, collection, **args):
    args.setdefault("device_files", [host.dir + "/dev/nvidia*"])
    return run_module(host, collection, "gpu_release", args)


def show(host, prop):
    r = host.systemctl("show", "-p", prop, "--value", "sglang.service", ct=VMID)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture
def service(gpusim):
    """sglang.service in CT VMID (systemd as PID 1), holding GPU 0, restarted 0.2 s after it dies."""
    gpusim.ct_create(VMID, hostname="gpu-ct", gpus="all", systemd=True)
    gpusim.ct_start(VMID)
    pid = gpusim.hold(gpus=[0], mib=4096, ct=VMID, service="sglang", respawn=True, restart_delay=0.2)
    with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
        assert f"0::/lxc/{VMID}/ns/system.slice/sglang.service\n" in f.read()
    assert show(gpusim, "Restart") == "always"
    return pid


def test_stop_units_stops_the_unit_through_pct_exec_and_nothing_respawns(gpusim, collection, service):
    res = release(gpusim, collection, containers=[VMID], grace_period=5)
    assert not res.get("failed"), res.get("msg")
    (unit,) = res["stopped_units"]
    assert (unit["unit"], unit["container"], unit["rc"]) == ("sglang.service", VMID, 0)
    assert unit["command"][-6:] == ["exec", str(VMID), "--", "systemctl", "stop", "sglang.service"]
    assert res["respawned"] == []
    deadline = time.monotonic() + 10
    while alive(service) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(service)
    time.sleep(1.0)  # five restart delays: systemd would have restarted it by now
    assert show(gpusim, "ActiveState") == "inactive"
    assert show(gpusim, "NRestarts") == "0"
    assert gpusim.service_mainpid("sglang", ct=VMID) is None
    assert gpusim.status()["gpus"][0]["memory_used_mib"] == 0


def test_without_stop_units_the_restart_by_systemd_is_reported_and_never_signalled(gpusim, collection, service):
    # Issue 18 item 2. Before the scope gate (0385675) gpu_release SIGKILLed each restart as "appeared during the
    # release (forked by a target, or orphaned by it)", reported no respawn, did not fail, and systemd restarted it again.
    res = release(gpusim, collection, containers=[VMID], grace_period=5, stop_units=False)
    assert res["stopped_units"] == []
    assert service in {r["pid"] for r in res["released"]}
    # stop_units: false plus a respawn fails with the report, never "idle"
    assert res.get("failed"), res
    respawned = [r for r in res["respawned"] if r.get("unit") == "sglang.service"]
    assert respawned, res["respawned"]
    entry = respawned[0]
    assert entry["in_scope"] is True
    assert "systemd" in str(entry["supervisor"]) and f"CT {VMID}" in entry["advice"], entry
    # never signalled: the process systemd restarted is the one running now, systemd restarted it once
    time.sleep(1.0)
    new = gpusim.service_mainpid("sglang", ct=VMID)
    assert new is not None and new != service and alive(new)
    assert entry["pid"] == new
    assert new not in {r["pid"] for r in res["released"]}
    assert show(gpusim, "NRestarts") == "1"
    assert gpusim.status()["gpus"][0]["memory_used_mib"] == 4096
    assert gpusim.systemctl("stop", "sglang", ct=VMID).returncode == 0
