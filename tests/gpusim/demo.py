"""`make demo`: the main job on the embedded default - the pre-deploy run on the seed's scenario.

A simulated Proxmox VE node with 8 x NVIDIA H200 passed through to container 129 (a real LXC
container with systemd as PID 1), where an inference server (an API process and one worker per GPU)
runs as the systemd unit `sglang.service` (Restart=always); the driver frees a process's memory 1.5 s
after it exits.

The demo shows what nvidia-smi and pct show there, runs `ansible-playbook gpuops.gpu.predeploy`
against it (fence CT 129 on the node, then wait until every GPU is free), prints the time until
ready, runs it a second time to show that nothing changes, and cleans up.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(TOP, "tests", "functional"))

from gpusimkit import SimHost  # noqa: E402  pylint: disable=wrong-import-position
from modrun import controller_env  # noqa: E402  pylint: disable=wrong-import-position,import-error

VMID = 129
WORKER_MIB = 130048  # what an SGLang worker with --mem-fraction-static 0.9 takes on an H200

INVENTORY = """\
# The seed's topology, on the simulated host: every host is reached with a local connection.
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: {python}
    gpuops_device_files: ["{simdir}/dev/nvidia*"]
  children:
    proxmox_nodes:
      hosts:
        pve:
    gpu_hosts:
      hosts:
        gpu-ct:
          proxmox_node: pve
          proxmox_vmid: {vmid}
          gpu_idle_expected_count: 8
"""


def show(title, argv, env):
    print(f"\n$ {' '.join(argv)}    # {title}", flush=True)
    proc = subprocess.run(argv, env=env, check=False)
    if proc.returncode != 0:
        print(f"(exit status {proc.returncode})", flush=True)


def playbook(env, inventory, label):
    print(f"\n$ ansible-playbook gpuops.gpu.predeploy -i inventory.yml    # {label}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(["ansible-playbook", "gpuops.gpu.predeploy", "-i", inventory], env=env, check=False,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    took = time.monotonic() - t0
    sys.stdout.write(proc.stdout)
    changed = sum(int(n) for n in re.findall(r"changed=(\d+)", proc.stdout))
    return proc.returncode, took, changed


def main() -> int:
    base = tempfile.mkdtemp(prefix="gpuops-demo-")
    simdir = os.path.join(base, "host")
    host = SimHost.up(simdir, gpus=8, release_lag_ms=1500)
    rc = 1
    try:
        host.ct_create(VMID, hostname="gpu-ct", systemd=True)
        host.ct_start(VMID)
        api = host.hold(gpus="0-7", mib=WORKER_MIB, ct=VMID, tree=True, respawn=True, service="sglang",
                        name="python3 -m sglang.launch_server --tp 8")
        print(f"simulated Proxmox VE node with 8 x NVIDIA H200 in {simdir}; CT {VMID} runs the service 'sglang'"
              f" (API pid {api} on the node; a systemd unit with Restart=always; memory is freed 1.5 s after an exit)",
              flush=True)
        env = controller_env(os.path.join(TOP, "build"), base, base=host.env(), ANSIBLE_STDOUT_CALLBACK="default",
                             ANSIBLE_DISPLAY_SKIPPED_HOSTS="false")
        show("what the node sees", ["nvidia-smi"], env)
        show("the containers", ["pct", "list"], env)
        show("what the container sees: its own processes, with the container's pids",
             ["pct", "exec", str(VMID), "--", "nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
              "--format=csv"], env)

        inventory = os.path.join(base, "inventory.yml")
        with open(inventory, "w", encoding="utf-8") as f:
            f.write(INVENTORY.format(python=sys.executable, simdir=simdir, vmid=VMID))
        rc1, took1, changed1 = playbook(env, inventory, "first run: fence CT 129, wait until the GPUs are free")
        show("after the first run", ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader"], env)
        rc2, took2, changed2 = playbook(env, inventory, "second run: nothing left to do")
        print(f"\npredeploy, first run: {'ready' if rc1 == 0 else 'FAILED'} in {took1:.1f} s ({changed1} changes);"
              f" second run: {'ready' if rc2 == 0 else 'FAILED'} in {took2:.1f} s ({changed2} changes)", flush=True)
        rc = 0 if (rc1 == 0 and rc2 == 0 and changed2 == 0) else 1
    finally:
        report = host.down()
        left = (report.get("left") or []) + (report.get("errors") or [])
        print("cleaned up: container stopped, simulated host down" + (f"; LEFT BEHIND: {left}" if left else
              ", nothing left behind"), flush=True)
        # The inventory and Ansible's files (controller_env); down() removed the host's (never rmtree base: a
        # mount point left under the host's directory would be followed).
        for name in ("inventory.yml", "ansible-home", "tmp"):
            path = os.path.join(base, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.unlink(path)
        if os.path.isdir(base):
            os.rmdir(base)
    return rc if not left else 1


if __name__ == "__main__":
    sys.exit(main())
