"""The size of the modules' results: gpu_facts, gpu_release --check, gpu_wait_idle --check and the fence
(proxmox_gpu_containers state=released --check) at 8, 32 and 64 GPUs.

ansible-runner (AWX) drops any event over 700,000 characters, so a result larger than that never reaches AWX.
Per size, one simulated host (tests/gpusim) with that many GPUs and

- a server in container CT <vmid-base> (an API process and one worker per GPU: each worker opens every
  /dev/nvidiaN, as CUDA does, and has a context on its own GPU);
- --others other processes (default 100): 40 % NVML-only clients on the host (nvidiactl, nvidia-uvm),
  40 % CUDA clients on the host holding every device node with no context, 20 % in container
  CT <vmid-base + 1> (a quarter of them with a small context on one GPU, the rest NVML-only or CUDA clients).

Then each module runs as Ansible runs it (tests/functional/modrun.py's run_module: a fresh interpreter and an
args file): gpu_facts; gpu_release in check mode, scoped to the server's container; gpu_wait_idle in check
mode; proxmox_gpu_containers with state=released in check mode, on the server's container. Measured:
len(json.dumps(result)) of each, and of its largest keys. Nothing asserts on a size: the table says which
results fit under the limit.

    .venv/bin/python benchmarks/bench_output.py [--smoke] [--sizes 8,32,64] [--others 100] [--vmid-base 7700]
"""

import argparse
import json
import os
import sys

import benchlib

sys.path.insert(0, os.path.join(benchlib.ROOT, "tests", "functional"))
import modrun  # noqa: E402  pylint: disable=wrong-import-position,import-error

RUNNER_LIMIT = 700000  # ansible-runner's event size limit (characters of the JSON)
WORKER_MIB = 40960
MODULES = ("gpu_facts", "gpu_release", "gpu_wait_idle", "proxmox_gpu_containers")


def start_processes(host, gpus, others, vmid_base):
    """The server (API + one worker per GPU) in CT vmid_base, then ``others`` processes; returns their counts."""
    server_ct, other_ct = vmid_base, vmid_base + 1
    for vmid in (server_ct, other_ct):
        host.ct_create(vmid, hostname=f"out-{vmid}")
        host.ct_start(vmid)
    host.hold(gpus="all", mib=WORKER_MIB, ct=server_ct, tree=True, name="sglang-server")
    in_ct = others // 5
    on_host = others - in_ct
    kinds = {"control": 0, "device": 0, "ct_context": 0, "ct_control": 0, "ct_device": 0}
    for index in range(on_host):
        if index % 2 == 0:
            host.hold(None, control_only=True, name="nvml-agent")
            kinds["control"] += 1
        else:
            host.hold("all", device_only=True, name="cuda-client")
            kinds["device"] += 1
    for index in range(in_ct):
        if index % 4 == 0:
            host.hold([index % gpus], mib=512, ct=other_ct, name="ct-job")
            kinds["ct_context"] += 1
        elif index % 4 in (1, 2):
            host.hold("all", device_only=True, ct=other_ct, name="ct-cuda")
            kinds["ct_device"] += 1
        else:
            host.hold(None, control_only=True, ct=other_ct, name="ct-agent")
            kinds["ct_control"] += 1
    return {"server_ct": server_ct, "other_ct": other_ct, "workers": gpus, "others": kinds}


def measure(result: dict) -> dict:
    """The size of the whole result and of each of its largest keys (ansible_facts' too)."""
    out = {"total": len(json.dumps(result))}
    parts = dict(result)
    parts.update({f"ansible_facts.{k}": v for k, v in (result.get("ansible_facts") or {}).items()})
    parts.pop("ansible_facts", None)
    sizes = sorted(((len(json.dumps(v)), k) for k, v in parts.items()), reverse=True)
    out["largest"] = {k: n for n, k in sizes[:4]}
    return out


def run_modules(ws, host, server_ct, dump=None):
    device_files = [benchlib.device_glob(host)]
    runs = {
        "gpu_facts": ({"device_files": device_files}, False),
        "gpu_release": ({"device_files": device_files, "containers": [server_ct]}, True),
        "gpu_wait_idle": ({"device_files": device_files, "timeout": 5}, True),
        # the fence in one run: the server's container, its GPUs and the release of its holders
        "proxmox_gpu_containers": ({"device_files": device_files, "containers": [server_ct], "state": "released",
                                    "pct": host.path("bin", "pct")}, True),
    }
    out = {}
    for name in MODULES:
        args, check = runs[name]
        result = modrun.run_module(host, ws.colroot, name, args, check_mode=check)
        if dump:
            os.makedirs(dump, exist_ok=True)
            with open(os.path.join(dump, f"{name}-{len(host.scenario().gpus)}.json"), "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1)
        out[name] = dict(measure(result), failed=bool(result.get("failed")), msg=result.get("msg") if result.get("failed") else None)
    return out


def run(args):
    started = benchlib.machine()
    rows, data = [], []
    with benchlib.workspace("gpubench-out-") as ws:
        for gpus in args.sizes:
            with benchlib.sim_host(gpus=gpus) as host:
                procs = start_processes(host, gpus, args.others, args.vmid_base)
                count = benchlib.process_count()
                results = run_modules(ws, host, procs["server_ct"], args.dump)
            data.append({"gpus": gpus, "processes": procs, "machine_processes": count, "results": results})
            for name in MODULES:
                r = results[name]
                largest = ", ".join(f"{k} {v:,}" for k, v in r["largest"].items())
                rows.append([gpus, 1 + gpus + args.others, name + (" (check)" if name != "gpu_facts" else ""),
                             f"{r['total']:,}", "yes" if r["total"] < RUNNER_LIMIT else "NO",
                             "failed: " + str(r["msg"])[:60] if r["failed"] else "ok", largest])
    benchlib.table(f"Result sizes (len(json.dumps(result)); ansible-runner's limit: {RUNNER_LIMIT:,})",
                   ["GPUs", "GPU processes", "module", "characters", f"< {RUNNER_LIMIT:,}", "result", "largest keys"], rows)
    result = {"name": "output", "smoke": args.smoke, "machine": started,
              "params": {"sizes": args.sizes, "others": args.others, "vmid_base": args.vmid_base, "worker_mib": WORKER_MIB,
                         "limit": RUNNER_LIMIT},
              "runs": data}
    benchlib.write_json("output", result)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="8 GPUs and 20 other processes only")
    ap.add_argument("--sizes", type=benchlib.sizes_arg, help="GPU counts (default 8,32,64; smoke 8)")
    ap.add_argument("--others", type=int, help="other processes besides the server (default 100; smoke 20)")
    ap.add_argument("--dump", metavar="DIR", help="also write each module's result to DIR/<module>-<GPUs>.json")
    ap.add_argument("--vmid-base", type=int, default=7700,
                    help="the server's container; the other processes' is vmid-base+1 (default 7700)")
    args = ap.parse_args(argv)
    args.sizes = args.sizes or ([8] if args.smoke else [8, 32, 64])
    args.others = args.others if args.others is not None else (20 if args.smoke else 100)
    if args.vmid_base < 100:
        ap.error("--vmid-base: a Proxmox VE vmid is 100 or more")
    benchlib.install_signal_handlers()
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
