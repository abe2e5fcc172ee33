"""`make demo`: the embedded default, a simulated GPU host as the seeds describe it.

A Proxmox VE node with 8 x NVIDIA H200 passed through to container 129, where an inference
server (an API process and one worker per GPU) runs under a supervisor that restarts it.
The demo shows what nvidia-smi and pct show there - on the node and inside the container -
and cleans up after itself.
"""

import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gpusimkit.host import SimHost  # noqa: E402  pylint: disable=wrong-import-position

VMID = 129
WORKER_MIB = 130048  # what an SGLang worker with --mem-fraction-static 0.9 takes on an H200


def show(title, argv, env):
    print(f"\n$ {' '.join(argv)}    # {title}", flush=True)
    proc = subprocess.run(argv, env=env, check=False)
    if proc.returncode != 0:
        print(f"(exit status {proc.returncode})", flush=True)


def main() -> int:
    base = tempfile.mkdtemp(prefix="gpuops-demo-")
    simdir = os.path.join(base, "host")
    t0 = time.monotonic()
    host = SimHost.up(simdir, gpus=8, release_lag_ms=1500)
    try:
        host.ct_create(VMID, hostname="gpu-ct")
        host.ct_start(VMID)
        api = host.hold(gpus="0-7", mib=WORKER_MIB, ct=VMID, tree=True, respawn=True, service="sglang",
                        name="python3 -m sglang.launch_server --tp 8")
        print(f"simulated Proxmox VE node with 8 x NVIDIA H200 in {simdir}; CT {VMID} runs the service 'sglang'"
              f" (API pid {api} on the node) - ready in {time.monotonic() - t0:.1f} s", flush=True)
        env = host.env()
        show("what the node sees", ["nvidia-smi"], env)
        show("the containers", ["pct", "list"], env)
        show("the GPU passthrough of CT 129", ["pct", "config", str(VMID)], env)
        show("what the container sees: its own processes, with the container's pids (new drivers)",
             ["pct", "exec", str(VMID), "--", "nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
              "--format=csv"], env)
        show("the container's services", ["pct", "exec", str(VMID), "--", "systemctl", "status", "sglang"], env)
    finally:
        report = host.down()
        left = (report.get("left") or []) + (report.get("errors") or [])
        print("\ncleaned up: container stopped, simulated host down" + (f"; LEFT BEHIND: {left}" if left else
              ", nothing left behind"), flush=True)
        if os.path.isdir(base):
            os.rmdir(base)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
