"""The size of the modules' results, as ansible-runner measures them: gpu_facts, gpu_release --check,
gpu_wait_idle --check and the fence (proxmox_gpu_containers state=released --check), in summary (the default,
detail: summary) and in full (detail: full), at 8, 32 and 64 GPUs with 1, 4 and 16 processes per GPU.

ansible-runner (AWX) replaces an event's result by {} when len(str(result)) is over 700,000 characters
(ansible_runner/display_callback/callback/awx_display.py, MAX_EVENT_RES), so a larger result never reaches AWX.
Per GPU count, one simulated host (tests/gpusim) with that many GPUs and

- in container CT <vmid-base>: a small job on GPU 0 and an NVML agent (what the fence releases);
- on the host: --others other processes (default 20): NVML-only clients and CUDA clients holding every device
  node with no context;
- servers of one worker per GPU (trees of up to 16 GPUs each: an API process and one worker per GPU, each with a
  context on its own GPU and every /dev/nvidiaN open, as CUDA does), with a real server's command line (about 300
  characters): 1, then 4, then 16 of them (--per-gpu), so 1, 4 and 16 processes with a context on each GPU.

With --fenced (the heavy node of issue 34): one host of --sizes GPUs whose --per-gpu servers run inside the fenced
container, and the fence (proxmox_gpu_containers state=released) then the wait (gpu_wait_idle) as a play under
ansible-runner itself, with --diff, in check mode and then for real: the largest event's len(str(res)) as
ansible-runner measures it (MAX_EVENT_RES raised, so that what it would drop is measured too), against the 200,000
of DESIGN.md 6b.

With --predeploy (issue 34's busy 8-GPU host): the GPU host gpu-ct, a container of a node with --sizes GPUs, runs
--per-gpu servers; ansible-playbook gpuops.gpu.predeploy, not ready (a server of the node's own, outside the fence,
holds every GPU: the wait times out after 2 s) at the default verbosity, -v and --diff, then ready at the default
verbosity and -v, each after a fresh start of the servers: the bytes it prints and its longest line (goals: -v at
most 15,000 bytes; no line over 2,000 characters at the default verbosity; the functional test
test_output_size.py checks them with -v --diff).

At each step each module runs as Ansible runs it (tests/functional/modrun.py's run_module: a fresh interpreter and
an args file, with ``_ansible_inject_invocation`` so that the result carries its ``invocation`` as ansible-runner
sees it) in summary and in full. Measured: len(str(result)). Nothing asserts on a size (the functional test
tests/functional/test_output_size.py does): the table says which results fit under the limit.

    .venv/bin/python benchmarks/bench_output.py [--smoke] [--sizes 8,32,64] [--per-gpu 1,4,16] [--others 20]
                                                [--vmid-base 7700] [--dump DIR]
    .venv/bin/python benchmarks/bench_output.py --fenced [--sizes 64] [--per-gpu 4]
    .venv/bin/python benchmarks/bench_output.py --predeploy [--sizes 8] [--per-gpu 4]
"""

import argparse
import json
import os
import pathlib
import signal
import sys
import time

import benchlib

sys.path.insert(0, os.path.join(benchlib.ROOT, "tests", "functional"))
import modrun  # noqa: E402  pylint: disable=wrong-import-position,import-error

RUNNER_LIMIT = 700000  # ansible-runner's MAX_EVENT_RES (characters of str(result))
EVENT_GOAL = 200000    # DESIGN.md 6b: every event under this, even on a 64-GPU node with --diff
WORKER_MIB = 1024
MODULES = ("gpu_facts", "gpu_release", "gpu_wait_idle", "proxmox_gpu_containers")
LEVELS = ("summary", "full")
COMMAND = ("python3 -m sglang.launch_server --model-path /models/Qwen3-235B-A22B-Instruct-2507-FP8 --tp-size 8"
           " --host 0.0.0.0 --port 30000 --mem-fraction-static 0.88 --context-length 131072 --chunked-prefill-size"
           " 8192 --enable-metrics --served-model-name qwen3 --trust-remote-code --log-level info")


def start_base(host, others, vmid):
    """The fence's container (a job on GPU 0, an NVML agent) and ``others`` NVML and CUDA clients on the host."""
    host.ct_create(vmid, hostname=f"out-{vmid}")
    host.ct_start(vmid)
    host.hold([0], mib=512, ct=vmid, name="ct-job")
    host.hold(None, control_only=True, ct=vmid, name="ct-agent")
    for index in range(others):
        if index % 2 == 0:
            host.hold(None, control_only=True, name="nvml-agent")
        else:
            host.hold("all", device_only=True, name="cuda-client")


TREE_GPUS = 16  # the workers of one tree start at once: at most this many (a loaded machine starts 64 in over 30 s)


def add_servers(host, count, first, ct=None):
    """``count`` servers of one worker per GPU (numbered from ``first``), each as trees of TREE_GPUS workers (in
    container ``ct``, or on the host); the pids of the trees' API processes (SIGTERM ends a tree)."""
    gpus = len(host.scenario().gpus)
    return [host.hold(gpus=f"{low}-{min(low + TREE_GPUS, gpus) - 1}", mib=WORKER_MIB, tree=True, ct=ct,
                      name=f"{COMMAND} --worker-set {index}")
            for index in range(first, first + count) for low in range(0, gpus, TREE_GPUS)]


def fenced_play(host, vmid):
    """The fence of CT ``vmid`` and the wait after it, on this simulated node, as one play (predeploy's two steps)."""
    devices = [benchlib.device_glob(host)]
    return [{"name": "Fence and wait on a heavy node", "hosts": "node", "gather_facts": False, "tasks": [
        {"name": "Fence", "gpuops.gpu.proxmox_gpu_containers": {
            "containers": [vmid], "state": "released", "pct": host.path("bin", "pct"), "device_files": devices}},
        {"name": "Wait", "gpuops.gpu.gpu_wait_idle": {"device_files": devices, "timeout": 60}}]}]


def run_fenced(host, vmid, colroot, tmp, cmdline):
    """The fenced play under ansible-runner (``cmdline``: '--diff', '--check --diff'): {status, events: [(size,
    event, task)] the largest first, dropped: events whose res ansible-runner's own limit would drop}."""
    inventory = {"all": {"hosts": {"node": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}
    run = modrun.run_under_runner(colroot, tmp, fenced_play(host, vmid), inventory, base=host.env_vars(),
                                  cmdline=cmdline, MAX_EVENT_RES=str(10 ** 9))
    sizes = modrun.event_sizes(run.events)
    return {"status": run.status, "events": sizes, "over_goal": [s for s in sizes if s[0] >= EVENT_GOAL],
            "dropped": [s for s in sizes if s[0] > RUNNER_LIMIT]}


def hosts(sizes, prefix):
    """(a workspace, a fresh simulated host, its GPU count) for each of ``sizes``; each host torn down after its turn."""
    with benchlib.workspace(prefix) as ws:
        for gpus in sizes:
            with benchlib.sim_host(gpus=gpus) as host:
                yield ws, host, gpus


def run_fenced_bench(args):
    """--fenced: per size, the servers in the fenced container; the play in check mode, then for real."""
    started = benchlib.machine()
    rows, data = [], []
    for ws, host, gpus in hosts(args.sizes, "gpubench-fenced-"):
        host.ct_create(args.vmid_base, hostname=f"fenced-{args.vmid_base}")
        host.ct_start(args.vmid_base)
        t0 = time.monotonic()
        add_servers(host, args.per_gpu[-1], 0, ct=args.vmid_base)
        start_s = time.monotonic() - t0
        for mode, cmdline in (("check", "--check --diff"), ("real", "--diff")):
            t0 = time.monotonic()
            out = run_fenced(host, args.vmid_base, ws.colroot, ws.path(f"runner-{gpus}-{mode}"), cmdline)
            biggest = out["events"][0] if out["events"] else (0, None, None)
            data.append({"gpus": gpus, "per_gpu": args.per_gpu[-1], "mode": mode, "start_s": round(start_s, 1),
                         "seconds": round(time.monotonic() - t0, 1), "status": out["status"],
                         "events": [list(e) for e in out["events"][:8]]})
            rows.append([gpus, args.per_gpu[-1], mode, out["status"], f"{biggest[0]:,}", biggest[2],
                         "yes" if biggest[0] < EVENT_GOAL else "NO", "yes" if not out["dropped"] else "NO"])
    benchlib.table(f"Servers in the fenced container, --diff: the largest event's len(str(res)) (goal < {EVENT_GOAL:,};"
                   f" ansible-runner drops a res over {RUNNER_LIMIT:,})",
                   ["GPUs", "servers", "mode", "status", "largest event", "task", f"< {EVENT_GOAL:,}",
                    f"< {RUNNER_LIMIT:,}"], rows)
    result = {"name": "output-fenced", "machine": started, "runs": data,
              "params": {"sizes": args.sizes, "servers": args.per_gpu[-1], "vmid": args.vmid_base, "goal": EVENT_GOAL,
                         "limit": RUNNER_LIMIT, "measure": "len(str(event_data['res'])) under ansible-runner"}}
    benchlib.write_json("output-fenced", result)
    return result


# --predeploy: (case, verbosity, ansible-playbook's arguments); each run after a fresh start of the servers
PREDEPLOY_RUNS = (("not ready", "default", ()), ("not ready", "-v", ("-v",)), ("not ready", "--diff", ("--diff",)),
                  ("ready", "default", ()), ("ready", "-v", ("-v",)))
VERBOSE_GOAL = 15000  # bytes: predeploy -v on a busy 8-GPU host (issue 34)
LINE_GOAL = 2000      # characters: the longest line at the default verbosity (DESIGN.md 6b)


def run_predeploy_bench(args):
    """--predeploy: per size, the GPU host gpu-ct (CT --vmid-base, every GPU) with --per-gpu servers in it, run by
    ansible-playbook gpuops.gpu.predeploy: not ready (a server of the node's own, outside the fence, holds every GPU;
    the wait times out after 2 s), then ready; at each verbosity of PREDEPLOY_RUNS: the bytes printed, the longest
    line."""
    started = benchlib.machine()
    rows, data = [], []
    for ws, host, gpus in hosts(args.sizes, "gpubench-predeploy-"):
        host.ct_create(args.vmid_base, hostname="gpu-ct")
        host.ct_start(args.vmid_base)
        outsiders = add_servers(host, 1, args.per_gpu[-1])
        for case, verbosity, extra in PREDEPLOY_RUNS:
            if case == "ready":
                for pid in outsiders:
                    host.kill(pid, signal.SIGTERM, wait=True)
                outsiders = []
            add_servers(host, args.per_gpu[-1], 0, ct=args.vmid_base)
            tmp = pathlib.Path(ws.path(f"predeploy-{gpus}-{len(data)}"))
            tmp.mkdir()
            rc, _out, (size, longest) = modrun.run_predeploy(host, ws.colroot, tmp, args.vmid_base, *extra,
                                                             *(("-e", "gpu_idle_timeout=2") if case != "ready" else ()))
            data.append({"gpus": gpus, "per_gpu": args.per_gpu[-1], "case": case, "verbosity": verbosity, "rc": rc,
                         "bytes": size, "longest_line": longest})
            rows.append([gpus, args.per_gpu[-1], case, verbosity, rc, f"{size:,}", f"{longest:,}"])
    benchlib.table(f"predeploy on a busy node: all it prints (goal with -v at 8 GPUs: <= {VERBOSE_GOAL:,} bytes) and its"
                   f" longest line (goal at the default verbosity: <= {LINE_GOAL:,} characters)",
                   ["GPUs", "servers", "case", "verbosity", "rc", "bytes printed", "longest line"], rows)
    result = {"name": "output-predeploy", "machine": started, "runs": data,
              "params": {"sizes": args.sizes, "servers": args.per_gpu[-1], "vmid": args.vmid_base,
                         "measure": "len(stdout) in bytes and its longest line, ansible-playbook gpuops.gpu.predeploy"}}
    benchlib.write_json("output-predeploy", result)
    return result


def run_modules(ws, host, vmid, dump=None):
    """{module: {level: len(str(result)), 'failed': msg or None, 'more': the summary's detail.more}}."""
    base = {"device_files": [benchlib.device_glob(host)], "_ansible_inject_invocation": True}
    runs = {
        "gpu_facts": (base, False),
        "gpu_release": (dict(base, all=True), True),
        "gpu_wait_idle": (dict(base, timeout=5), True),
        # the fence in one run: the container, its GPUs and the release of its holders
        "proxmox_gpu_containers": (dict(base, containers=[vmid], state="released", pct=host.path("bin", "pct")), True),
    }
    out = {}
    gpus = len(host.scenario().gpus)
    for name in MODULES:
        args, check = runs[name]
        row = {"failed": None}
        for level in LEVELS:
            result = modrun.run_module(host, ws.colroot, name, dict(args, detail=level), check_mode=check)
            row[level] = len(str(result))
            if result.get("failed"):
                row["failed"] = str(result.get("msg"))[:200]
            if level == "summary":
                row["more"] = (result.get("detail") or {}).get("more")
            if dump:
                os.makedirs(dump, exist_ok=True)
                with open(os.path.join(dump, f"{name}-{gpus}-{level}.json"), "w", encoding="utf-8") as f:
                    json.dump(result, f, indent=1)
        out[name] = row
    return out


def run(args):
    started = benchlib.machine()
    rows, data = [], []
    for ws, host, gpus in hosts(args.sizes, "gpubench-out-"):
        start_base(host, args.others, args.vmid_base)
        servers = 0
        for per_gpu in args.per_gpu:
            t0 = time.monotonic()
            add_servers(host, per_gpu - servers, servers)
            servers = per_gpu
            start_s = time.monotonic() - t0
            count = benchlib.process_count()
            results = run_modules(ws, host, args.vmid_base, args.dump and os.path.join(args.dump, f"x{per_gpu}"))
            processes = per_gpu * (gpus + -(-gpus // TREE_GPUS)) + args.others + 2
            data.append({"gpus": gpus, "per_gpu": per_gpu, "gpu_processes": processes, "machine_processes": count,
                         "start_s": round(start_s, 1), "results": results})
            for name in MODULES:
                r = results[name]
                rows.append([gpus, per_gpu, processes, name + (" (check)" if name != "gpu_facts" else ""),
                             f"{r['summary']:,}", "yes" if r["summary"] < RUNNER_LIMIT else "NO",
                             f"{r['full']:,}", "yes" if r["full"] < RUNNER_LIMIT else "NO",
                             "failed: " + r["failed"][:60] if r["failed"] else "ok"])
    benchlib.table(f"Result sizes (len(str(result)), invocation included; ansible-runner's limit: {RUNNER_LIMIT:,})",
                   ["GPUs", "per GPU", "GPU processes", "module", "summary", f"< {RUNNER_LIMIT:,}", "full",
                    f"< {RUNNER_LIMIT:,}", "result"], rows)
    result = {"name": "output", "smoke": args.smoke, "machine": started,
              "params": {"sizes": args.sizes, "per_gpu": args.per_gpu, "others": args.others, "vmid_base": args.vmid_base,
                         "worker_mib": WORKER_MIB, "limit": RUNNER_LIMIT, "measure": "len(str(result))"},
              "runs": data}
    benchlib.write_json("output", result)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="8 GPUs, 1 and 4 processes per GPU, 4 other processes")
    ap.add_argument("--sizes", type=benchlib.sizes_arg, help="GPU counts (default 8,32,64; smoke 8)")
    ap.add_argument("--per-gpu", type=benchlib.sizes_arg, help="processes per GPU, in steps (default 1,4,16; smoke 1,4)")
    ap.add_argument("--others", type=int, help="other processes on the host (default 20; smoke 4)")
    ap.add_argument("--dump", metavar="DIR", help="also write each result to DIR/x<per GPU>/<module>-<GPUs>-<level>.json")
    ap.add_argument("--vmid-base", type=int, default=7700, help="the fence's container (default 7700)")
    ap.add_argument("--predeploy", action="store_true",
                    help="predeploy on a busy node (--per-gpu servers in the GPU host's container): bytes printed and the"
                         " longest line, not ready and ready, at the default verbosity, -v and --diff (default 8 GPUs, 4"
                         " servers)")
    ap.add_argument("--fenced", action="store_true",
                    help="the servers (--per-gpu, its last) in the fenced container; the fence and the wait under"
                         " ansible-runner with --diff, in check mode and for real (default 64 GPUs, 4 servers)")
    args = ap.parse_args(argv)
    if args.predeploy:
        args.sizes = args.sizes or [8]
        args.per_gpu = args.per_gpu or [4]
    if args.fenced:
        args.sizes = args.sizes or [64]
        args.per_gpu = args.per_gpu or [4]
    args.sizes = args.sizes or ([8] if args.smoke else [8, 32, 64])
    args.per_gpu = args.per_gpu or ([1, 4] if args.smoke else [1, 4, 16])
    args.others = args.others if args.others is not None else (4 if args.smoke else 20)
    if args.vmid_base < 100:
        ap.error("--vmid-base: a Proxmox VE vmid is 100 or more")
    if args.per_gpu[0] < 1:
        ap.error("--per-gpu: at least 1")
    benchlib.install_signal_handlers()
    (run_predeploy_bench if args.predeploy else run_fenced_bench if args.fenced else run)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
