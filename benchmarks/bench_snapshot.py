"""The whole snapshot (8 GPUs, 50 processes): SnapshotTaker.take() with NVML vs the nvidia-smi queries.

Holds 50 simulated workloads across 8 GPUs (small memory each), then, in a child process
started with the simulated host's environment (pynvml finds libnvidia-ml.so.1 only through an
LD_LIBRARY_PATH set before the process starts, so this script re-execs itself):

- ours:  `SnapshotTaker(stub).take()` with the NVML backend, in-process: GPUs, memory, every
  process with its /proc details and container, and the device-file holder scan;
- today: `nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits` and
  `nvidia-smi --query-compute-apps=<fields> --format=csv,noheader,nounits`, two subprocesses
  (the same fields the collection's nvidia-smi backend reads).

Also shown, for information: the first take() of a process (NVML initialisation included) and
the collection's nvidia-smi backend. Reports medians and the ratios ours/nvidia-smi. With --idle
500,2000,5000 it measures again with that many idle processes (`sleep`) on the machine: the
snapshot's holder scan reads every process's fds, nvidia-smi does not.

    .venv/bin/python benchmarks/bench_snapshot.py [--smoke] [--procs N] [--idle N[,N...]] [--reps R]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import benchlib


class StubModule:
    """A stand-in for AnsibleModule, for in-process use only: SnapshotTaker needs just `params`,
    `get_bin_path`, `run_command` and `warn`. A real module run builds an AnsibleModule instead."""

    def __init__(self, params):
        self.params = params
        self.warnings = []

    def get_bin_path(self, name, required=False, opt_dirs=None):  # pylint: disable=unused-argument
        return shutil.which(name)

    def run_command(self, argv, environ_update=None):
        env = dict(os.environ, **(environ_update or {}))
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        return proc.returncode, proc.stdout, proc.stderr

    def warn(self, msg):
        self.warnings.append(msg)


def child(args):
    """Runs with the simulated host's environment: the measurements themselves."""
    # pylint: disable-next=import-outside-toplevel,import-error
    from ansible_collections.gpuops.gpu.plugins.module_utils import _common, _smi
    # pylint: disable-next=import-outside-toplevel,import-error
    from ansible_collections.gpuops.gpu.plugins.module_utils._host.snapshots import SnapshotTaker

    def params(backend):
        out = {k: v.get("default") for k, v in dict(_common.SNAPSHOT_ARGS, **_common.IDLE_ARGS).items()}
        out.update(backend=backend, device_files=[args.device_glob])
        return out

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0

    def smi_queries():
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(_smi.GPU_FIELDS), "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True)
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=" + ",".join(_smi.APP_FIELDS),
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True)
        return len(gpu.stdout.splitlines()), len(apps.stdout.splitlines())

    def counts(snap):
        return len(snap["gpus"]), sum(len(g["processes"]) for g in snap["gpus"]), \
            len({h["pid"] for g in snap["gpus"] for h in g["holders"]})

    nvml = SnapshotTaker(StubModule(params("nvml")))
    snap, cold = timed(nvml.take)
    seen = {"ours_nvml": counts(snap)}
    smi_backend = SnapshotTaker(StubModule(params("nvidia-smi")))
    snap, smi_backend_cold = timed(smi_backend.take)
    seen["ours_smi_backend"] = counts(snap)
    seen["nvidia_smi"] = smi_queries()
    samples = {"ours_nvml": [], "nvidia_smi": [], "ours_smi_backend": []}
    for _rep in range(args.reps):  # round-robin, so that drift on the machine hits all alike
        samples["ours_nvml"].append(timed(nvml.take)[1])
        samples["nvidia_smi"].append(timed(smi_queries)[1])
        samples["ours_smi_backend"].append(timed(smi_backend.take)[1])
    print(json.dumps({"samples_s": samples, "cold_s": {"ours_nvml": cold, "ours_smi_backend": smi_backend_cold},
                      "seen": seen, "backend": nvml.backend}))
    return 0


def measure(ws, host, args, idle_count):
    argv = [sys.executable, __file__, "--child", "--device-glob", benchlib.device_glob(host), "--reps", str(args.reps)]
    nprocs = benchlib.process_count()
    proc = subprocess.run(argv, env=ws.env(host.env()), capture_output=True, text=True, check=False, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the measuring child failed (rc {proc.returncode}): {proc.stderr[-3000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    med = {k: benchlib.median(v) for k, v in data["samples_s"].items()}
    return {
        "idle_processes": idle_count, "processes_on_machine": nprocs,
        "median_s": med, "cold_s": data["cold_s"], "samples_s": data["samples_s"], "seen": data["seen"],
        "backend": data["backend"],
        "ratio_ours_nvidia_smi": benchlib.ratio(med["ours_nvml"], med["nvidia_smi"]),
        "ratio_ours_cold_nvidia_smi": benchlib.ratio(data["cold_s"]["ours_nvml"], med["nvidia_smi"]),
    }


def print_size(args, r):
    f = benchlib.fmt
    med, seen, smi = r["median_s"], r["seen"], r["median_s"]["nvidia_smi"]
    rows = [
        ["ours: SnapshotTaker.take(), NVML, in-process", f(med["ours_nvml"], "ms"), f(r["ratio_ours_nvidia_smi"], "x"),
         f"{seen['ours_nvml'][0]} GPUs, {seen['ours_nvml'][1]} procs, {seen['ours_nvml'][2]} holders"],
        ["ours: first take() in a process (NVML init included)", f(r["cold_s"]["ours_nvml"], "ms"),
         f(r["ratio_ours_cold_nvidia_smi"], "x"), ""],
        ["today: nvidia-smi --query-gpu + --query-compute-apps", f(smi, "ms"), "1.00x",
         f"{seen['nvidia_smi'][0]} GPU rows, {seen['nvidia_smi'][1]} process rows"],
        ["(info) ours with backend=nvidia-smi", f(med["ours_smi_backend"], "ms"),
         f(benchlib.ratio(med["ours_smi_backend"], smi), "x"),
         f"{seen['ours_smi_backend'][1]} procs, {seen['ours_smi_backend'][2]} holders"],
    ]
    benchlib.table(f"Snapshot of 8 GPUs with {args.procs} GPU processes, {r['processes_on_machine']} processes on the"
                   f" machine ({r['idle_processes']} idle started here), median of {args.reps}",
                   ["method", "median wall", "this / nvidia-smi", "what it saw"], rows)
    print(f"ratio ours/nvidia-smi: {f(r['ratio_ours_nvidia_smi'], 'x')}"
          f" (first take in a process: {f(r['ratio_ours_cold_nvidia_smi'], 'x')})")


def parent(args):
    started = benchlib.machine()  # the machine and its load when the measurement starts
    results = []
    with benchlib.workspace("gpubench-snap-") as ws, benchlib.sim_host(gpus=8) as host:
        t0 = time.monotonic()
        for index in range(args.procs):
            host.hold([index % 8], mib=args.mib)
        setup = time.monotonic() - t0
        idle = benchlib.IdleProcesses()
        try:
            for size in args.idle:  # ascending: each size adds idle processes to the last one's
                idle.start(size - len(idle.procs))
                results.append(measure(ws, host, args, size))
                print_size(args, results[-1])
        finally:
            idle.stop()

    result = {
        "name": "snapshot",
        "smoke": args.smoke,
        "machine": started,
        "params": {"gpus": 8, "workloads": args.procs, "mib_each": args.mib, "reps": args.reps, "setup_s": setup,
                   "idle_processes": args.idle},
        "sizes": results,
        "note": "the simulator's nvidia-smi is a Python program over the simulated library: its cost is mostly"
                " interpreter start-up, where a real nvidia-smi spends its time in the driver",
    }
    benchlib.write_json("snapshot", result)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="small and quick: 8 workloads, 1 repetition")
    ap.add_argument("--procs", type=int, help="workloads to hold (default 50; smoke 8)")
    ap.add_argument("--mib", type=int, default=256, help="MiB each workload holds (default 256)")
    ap.add_argument("--reps", type=int, help="repetitions (default 9; smoke 1)")
    ap.add_argument("--idle", type=benchlib.sizes_arg, default=[0],
                    help="idle processes (sleep) to start on the machine besides the workloads, or a comma list of"
                         " sizes measured one after the other (default 0; run.py's full run: 500,2000,5000)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--device-glob", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.procs = args.procs if args.procs is not None else (8 if args.smoke else 50)
    args.reps = args.reps or (1 if args.smoke else 9)
    if args.child:
        return child(args)
    benchlib.install_signal_handlers()
    parent(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
