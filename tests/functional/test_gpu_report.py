"""gpuops.gpu.gpu_report over the simulated host: the table, and the Markdown and JSON reports."""

import json
import os
import subprocess
import sys

INVENTORY = """\
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: {python}
    gpuops_device_files: ["{simdir}/dev/nvidia*"]
  children:
    proxmox_nodes:
      hosts:
        pve: {{}}
    gpu_hosts:
      hosts:
        gpu-ct: {{proxmox_node: pve, proxmox_vmid: 129}}
"""


def test_gpu_report_writes_markdown_and_json(gpusim, collection, tmp_path):
    pid = gpusim.hold(gpus=[0, 1], mib=40960)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(INVENTORY.format(python=sys.executable, simdir=gpusim.dir))
    out = tmp_path / "report"
    env = dict(gpusim.env(), ANSIBLE_COLLECTIONS_PATH=collection, ANSIBLE_NOCOLOR="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    proc = subprocess.run(["ansible-playbook", "gpuops.gpu.gpu_report", "-i", str(inventory), "-e", f"gpu_report_dir={out}"],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = json.loads((out / "gpu_report.json").read_text())["rows"]
    assert len(rows) == 16  # two hosts that see the same 8 GPUs
    busy = [r for r in rows if r["host"] == "pve" and r["index"] in (0, 1)]
    assert all(r["used_mib"] == 40960 and not r["idle"] and pid in r["holders"] for r in busy)
    assert all(r["idle"] for r in rows if r["index"] > 1)
    md = (out / "gpu_report.md").read_text()
    assert "| host | GPU | name | used MiB |" in md
    assert f"| pve | 0 | NVIDIA H200 | 40960 | 143771 | no | ok | {pid} python" in md
    assert "pve                  GPU 0  NVIDIA H200" in proc.stdout
