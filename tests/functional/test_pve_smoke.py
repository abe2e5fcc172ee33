"""tools/pve_smoke.py (`make pve-smoke`, for a real Proxmox VE node) on the simulator: the fence's reading of the
node's files agrees with the simulated pct's answers, for a running container with pending changes and a stopped one,
and pct's cost is recorded."""

import json
import os
import subprocess
import sys


TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(TOP, "tools", "pve_smoke.py")


def test_pve_smoke_on_the_simulator(gpusim, tmp_path):
    running, stopped = 7261, 7262   # this file's own (cgroups under lxc/ are machine-wide)
    gpusim.ct_create(running, "gpu-a", "0,1", devices_style="dev")
    gpusim.ct_create(stopped, "gpu-b", "2", devices_style="lxc")
    gpusim.ct_start(running)
    with open(gpusim.ct_config_path(running), "a", encoding="utf-8") as f:
        f.write("\n[pve:pending]\ndev1: /dev/nvidia3\ndelete: dev0\n\n[snap1]\ndev0: /dev/nvidia5\n")
    out = tmp_path / "pve-smoke.json"
    env = dict(gpusim.env(), GPUSIM_PCT_STARTUP_S="0.05")
    proc = subprocess.run([sys.executable, SCRIPT, "--pct", gpusim.path("bin", "pct"), "--runs", "2", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["ok"] and report["problems"] == []
    by = {c["vmid"]: c for c in report["containers"]}
    assert by[running]["files"]["status"] == "running" and by[stopped]["files"]["status"] == "stopped"
    assert all(c["config"] == {"current": True, "pending": True} for c in report["containers"])
    assert [c["argv"][:2] for c in report["costs"]] == [["pct", "help"], ["pct", "list"], ["pct", "config"]]
    assert all(c["min_s"] >= 0.05 for c in report["costs"])   # the simulated start-up is spent by each call
