"""Every pct the collection runs is the configured one (issue 29, item 5), on a real LXC container with systemd.

The unit of a server in a container is stopped with ``pct exec <vmid> -- systemctl stop <unit>``. Before this,
gpu_release had no ``pct`` option and proxmox_gpu_containers' release looked ``pct`` up on PATH whatever its option
said: a node with another pct first on PATH (a wrapper, an old copy) ran that one, and where there was none the
respawn advice said the supervisor restarted a unit "although the unit was stopped" - one it never stopped.

The configured pct here is a wrapper that writes its argv to a log and runs the simulator's pct; a ``pct`` first on
PATH writes to another log and fails, so that a run of it is seen.
"""

import os
import stat
import time

import pytest
from modrun import alive, run_module

VMID = 7135


def script(path, body):
    with open(path, "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def lines(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


@pytest.fixture
def node(gpusim, tmp_path):
    """CT VMID (systemd as PID 1) with sglang.service on GPU 0 (Restart=always); the configured pct (a logging
    wrapper of the simulator's) and another pct first on PATH."""
    gpusim.ct_create(VMID, hostname="gpu-ct", gpus="all", systemd=True)
    gpusim.ct_start(VMID)
    server = gpusim.hold(gpus=[0], mib=4096, ct=VMID, service="sglang", respawn=True, restart_delay=0.2)
    (tmp_path / "pve").mkdir()
    (tmp_path / "other").mkdir()
    configured = script(str(tmp_path / "pve" / "pct"),
                        f'echo "$*" >> {tmp_path}/configured.log\nexec {gpusim.path("bin", "pct")} "$@"\n')
    script(str(tmp_path / "other" / "pct"), f'echo "$*" >> {tmp_path}/other.log\nexit 1\n')
    env = {"PATH": os.pathsep.join([str(tmp_path / "other"), gpusim.env()["PATH"]])}
    return {"host": gpusim, "server": server, "pct": configured, "env": env,
            "configured": str(tmp_path / "configured.log"), "other": str(tmp_path / "other.log")}


def gone_within(pid, seconds=10.0):
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_gpu_release_stops_the_unit_with_the_configured_pct(node, collection):
    host = node["host"]
    res = run_module(host, collection, "gpu_release", {"device_files": [host.dir + "/dev/nvidia*"], "containers": [VMID],
                                                       "grace_period": 5, "pct": node["pct"]}, env=node["env"])
    assert not res.get("failed"), res.get("msg")
    (unit,) = res["stopped_units"]
    assert unit["command"][0] == node["pct"] and unit["rc"] == 0, unit
    assert f"exec {VMID} -- systemctl stop sglang.service" in lines(node["configured"])
    assert lines(node["other"]) == [] and res["respawned"] == []
    assert gone_within(node["server"])


def test_proxmox_gpu_containers_runs_no_pct_but_its_own(node, collection):
    host = node["host"]
    res = run_module(host, collection, "proxmox_gpu_containers",
                     {"device_files": [host.dir + "/dev/nvidia*"], "containers": [VMID], "state": "released",
                      "grace_period": 5, "pct": node["pct"]}, env=node["env"])
    assert not res.get("failed"), res.get("msg")
    assert lines(node["other"]) == [], lines(node["other"])
    assert f"exec {VMID} -- systemctl stop sglang.service" in lines(node["configured"])
    assert [u["command"][0] for u in res["release"]["stopped_units"]] == [node["pct"]]
    assert gone_within(node["server"])


def test_a_configured_pct_that_is_not_there_fails_before_anything_is_signalled(node, collection):
    host = node["host"]
    res = run_module(host, collection, "gpu_release", {"device_files": [host.dir + "/dev/nvidia*"], "containers": [VMID],
                                                       "pct": "/nonexistent/pct"}, env=node["env"])
    assert res.get("failed") and res["error"] == "pct_not_found" and "/nonexistent/pct" in res["msg"], res
    assert alive(node["server"]) and lines(node["configured"]) == lines(node["other"]) == []


def test_without_pct_the_advice_does_not_say_the_unit_was_stopped(node, collection):
    # No pct anywhere (the default name, none on PATH): the unit cannot be stopped; its processes are signalled and
    # systemd restarts the server. The advice says so - not that it restarted "although the unit was stopped".
    host = node["host"]
    path = os.pathsep.join(p for p in host.env()["PATH"].split(os.pathsep) if p != host.path("bin"))
    res = run_module(host, collection, "gpu_release", {"device_files": [host.dir + "/dev/nvidia*"], "containers": [VMID],
                                                       "grace_period": 5}, env={"PATH": path})
    assert res["stopped_units"] == [] and res.get("failed"), res
    (unstopped,) = res["unstopped_units"]
    assert unstopped["unit"] == "sglang.service" and "no pct here (the pct option" in unstopped["error"], unstopped
    respawned = [r for r in res["respawned"] if r.get("unit") == "sglang.service"]
    assert respawned and res.get("failed"), res
    assert "although the unit was stopped" not in respawned[0]["advice"], respawned[0]
    assert "could not be stopped" in respawned[0]["advice"], respawned[0]
    assert host.systemctl("stop", "sglang", ct=VMID).returncode == 0
