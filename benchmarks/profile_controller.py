#!/usr/bin/env python
"""Where the controller's CPU goes: cProfile of ansible-playbook (its main process and every forked worker) over
bench_fleet's fleet.

    .venv/bin/python benchmarks/profile_controller.py [--hosts 32] [--methods b,d] [--idle] [--vmid-base 7300] [--top 25]

For each method, on N simulated nodes at once (bench_fleet's Fleet: each node its own simulator and container,
2 x H200, a server in each; local connection, forks = hosts): a fresh server in every container, then the method
(b: bench_e2e's hand-written playbook, c: its two modules, d: `ansible-playbook gpuops.gpu.predeploy`) runs
once under cProfile - the main process (the strategy loop, templating of the task headers, result processing,
callbacks) and each worker (one per host and task: templating the task's arguments, the action plugin, the
connection, the module's payload), each worker written to a file of its own and summed. `--idle` runs (d) a
second time right after, nothing left to release (the idle-node run). Prints, per run, the CPU of the main
process and of the workers, the number of workers (host x task runs), and the functions with the most
cumulative time in each; the .prof files stay under benchmarks/results/profile/ (git-ignored) for pstats or
snakeviz. A profiled run is slower than a plain one (cProfile costs about 2x): compare shares, not seconds.
"""

import argparse
import contextlib
import glob
import io
import os
import pstats
import shutil
import sys
import time

import benchlib
import bench_e2e
import bench_fleet

# Runs ansible-playbook with cProfile on the main process and on every forked worker (WorkerProcess._run).
WRAPPER = r'''
import cProfile, json, os, resource, sys
out = sys.argv.pop(1)
COUNT = os.environ.get("GPUOPS_PROFILE_COUNT") == "1"
from ansible.executor.process import worker
from ansible._internal._templating import _jinja_bits
_run = worker.WorkerProcess._run
_from_string = _jinja_bits.AnsibleEnvironment.from_string
MAIN = cProfile.Profile()
COMPILED = [0]
def _counted(self, source, *args, **kwargs):
    COMPILED[0] += 1
    return _from_string(self, source, *args, **kwargs)
_jinja_bits.AnsibleEnvironment.from_string = _counted
def _profiled(self):
    MAIN.disable()  # the parent's profiler, inherited by the fork
    COMPILED[0] = 0
    prof = cProfile.Profile()
    if not COUNT:
        prof.enable()
    try:
        return _run(self)
    finally:
        if COUNT:
            ru = resource.getrusage(resource.RUSAGE_SELF)
            rc = resource.getrusage(resource.RUSAGE_CHILDREN)
            with open(os.path.join(out, f"count-{os.getpid()}.json"), "w") as f:
                json.dump({"task": self._task.get_name(), "host": self._host.name, "compiled": COMPILED[0],
                           "cpu_s": ru.ru_utime + ru.ru_stime, "children_cpu_s": rc.ru_utime + rc.ru_stime}, f)
        else:
            prof.disable()
            prof.dump_stats(os.path.join(out, f"worker-{os.getpid()}.prof"))
worker.WorkerProcess._run = _profiled
from ansible.cli.playbook import main
if not COUNT:
    MAIN.enable()
try:
    rc = main()
finally:
    MAIN.disable()
    MAIN.dump_stats(os.path.join(out, "main.prof"))
sys.exit(rc)
'''


def top(stats, n, sort="cumulative"):
    buf = io.StringIO()
    stats.stream = buf
    stats.sort_stats(sort).print_stats(n)
    text = buf.getvalue()
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    return "\n".join(lines[start:])


def total_s(stats):
    return stats.total_tt


def profile_run(ws, fleet, method, label, args):
    size = len(fleet.hosts)
    rundir = ws.path(f"profile-{size}-{label}")
    os.makedirs(rundir)
    outdir = os.path.join(benchlib.ROOT, "benchmarks", "results", "profile", f"{size}-{label}")
    shutil.rmtree(outdir, ignore_errors=True)
    os.makedirs(outdir)
    fleet.write_interpreters(label)
    inventory = fleet.inventory(os.path.join(rundir, "inventory.yml"))
    base = {k: v for k, v in os.environ.items() if k not in ("GPUSIM_DIR", "GPUSIM_VMID")}
    env = bench_e2e.ansible_env(ws, dict(base, PYTHONDONTWRITEBYTECODE="1"), False)
    wrapper = bench_e2e.write(os.path.join(rundir, "profiled.py"), WRAPPER)
    head = [os.path.join(benchlib.ROOT, ".venv", "bin", "python"), wrapper, outdir]
    if method == "d":
        argv = head + ["gpuops.gpu.predeploy", "-i", inventory, "--forks", str(size)]
    else:
        argv = head + ["-i", inventory, "--forks", str(size),
                       bench_e2e.write(os.path.join(rundir, f"{method}.yml"), bench_fleet.fleet_playbook(method, args.gpus))]
    if args.count:
        env["GPUOPS_PROFILE_COUNT"] = "1"
    rc, wall, cpu, _t0 = bench_e2e.run_command(argv, env, rundir, 900, os.path.join(rundir, "output.log"))
    node_cpu = sum(benchlib.wrapper_cpu(h["cpu_log"])[0] for h in fleet.hosts)
    if args.count:
        return counted(outdir, label, size, rc, wall, cpu, node_cpu)
    main = pstats.Stats(os.path.join(outdir, "main.prof"))
    workers = sorted(glob.glob(os.path.join(outdir, "worker-*.prof")))
    wstats, readable = None, []
    for path in workers:
        try:
            if wstats is None:
                wstats = pstats.Stats(path)
            else:
                wstats.add(path)
            readable.append(path)
        except (EOFError, ValueError, TypeError):
            pass  # a worker that had not finished writing (or was ended) when the run returned
    workers = readable
    print(f"\n=== {label}: {size} host(s), rc {rc}, wall {wall:.2f} s, CPU {cpu:.2f} s (modules {node_cpu:.2f} s,"
          f" controller {cpu - node_cpu:.2f} s = {(cpu - node_cpu) / size:.3f} s per host; profiled)")
    print(f"main process: {total_s(main):.2f} s profiled; workers: {len(workers)} ({len(workers) / size:.1f} per host),"
          f" {total_s(wstats) if wstats else 0:.2f} s profiled ({(total_s(wstats) if wstats else 0) / size:.3f} s per host)")
    print(f"-- main process, top {args.top} cumulative\n{top(main, args.top)}")
    if wstats:
        print(f"-- workers (summed), top {args.top} cumulative\n{top(wstats, args.top)}")
        print(f"-- workers (summed), top {args.top} own time\n{top(wstats, args.top, 'tottime')}")
    if rc != 0:
        print(bench_e2e.tail(os.path.join(rundir, "output.log"), 3000))
    return outdir


def counted(outdir, label, size, rc, wall, cpu, node_cpu):
    """--count: per task, the workers' own CPU (not profiled) and the Jinja templates each compiled."""
    import json  # pylint: disable=import-outside-toplevel
    tasks = {}
    for path in glob.glob(os.path.join(outdir, "count-*.json")):
        with open(path, encoding="utf-8") as f:
            c = json.load(f)
        t = tasks.setdefault(c["task"], {"runs": 0, "cpu_s": 0.0, "children_cpu_s": 0.0, "compiled": 0, "order": len(tasks)})
        t["runs"] += 1
        t["cpu_s"] += c["cpu_s"]
        t["children_cpu_s"] += c["children_cpu_s"]
        t["compiled"] += c["compiled"]
    runs = sum(t["runs"] for t in tasks.values())
    own = sum(t["cpu_s"] for t in tasks.values())
    print(f"\n=== {label}: {size} host(s), rc {rc}, wall {wall:.2f} s, CPU {cpu:.2f} s (modules {node_cpu:.2f} s,"
          f" controller {cpu - node_cpu:.2f} s = {(cpu - node_cpu) / size:.3f} s per host)")
    print(f"workers: {runs} ({runs / size:.1f} per host), their own CPU {own:.2f} s ({own / size:.3f} s per host),"
          f" templates compiled {sum(t['compiled'] for t in tasks.values())}"
          f" ({sum(t['compiled'] for t in tasks.values()) / size:.0f} per host)")
    rows = [[name[:70], t["runs"], f"{t['cpu_s'] / t['runs'] * 1000:.0f} ms", f"{t['children_cpu_s'] / t['runs'] * 1000:.0f} ms",
             f"{t['compiled'] / t['runs']:.0f}"] for name, t in sorted(tasks.items(), key=lambda kv: kv[1]["order"])]
    benchlib.table("per task (a worker per host): worker's own CPU per run, its children's (shell, module), templates"
                   " compiled per run", ["task", "runs", "worker CPU", "children CPU", "templates"], rows)
    return outdir


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--methods", default="b,d", help="comma list of b, c, d (default b,d)")
    ap.add_argument("--idle", action="store_true", help="run (d) again right after, on the idle fleet")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--vmid-base", type=int, default=7300)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--count", action="store_true",
                    help="no cProfile: per task, each worker's own CPU and the Jinja templates it compiled")
    args = ap.parse_args(argv)
    args.lag_ms = bench_e2e.LAG_MS
    benchlib.install_signal_handlers()
    with benchlib.workspace("gpubench-profile-") as ws, contextlib.ExitStack() as stack:
        fleet = bench_fleet.Fleet(ws, stack, args.hosts, args)
        for method in args.methods.split(","):
            fleet.start_servers()
            time.sleep(0.5)
            profile_run(ws, fleet, method, method, args)
            if method == "d" and args.idle:
                profile_run(ws, fleet, "d", "d-idle", args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
