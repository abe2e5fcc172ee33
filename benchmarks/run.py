"""Run every benchmark: `.venv/bin/python benchmarks/run.py [--smoke] [--only NAME ...]`.

Each benchmark runs as its own process, prints its table and writes benchmarks/results/<name>.json (a smoke run: benchmarks/results/smoke/<name>.json).
--smoke: small sizes and one or two repetitions, a few seconds each (what `make test` runs);
its figures mean nothing, it only proves the benchmarks still run. The exit status is non-zero
only when a benchmark crashes (or hangs past its time limit), never because of a timing.
A full run (not --smoke) ends with tools/performance_doc.py, which regenerates docs/performance.md
and the figures of docs/scale.md from benchmarks/results/*.json; run.json there records this run.
"""

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time

import benchlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCHES = ("scan", "snapshot", "release", "wait", "e2e", "fleet", "output")
# What a full run adds to each script's defaults: the scan and the snapshot at three machine sizes,
# the per-task profile of the end-to-end methods (docs/scale.md reasons from it).
SIZES = "500,2000,5000"
FULL_ARGS = {"scan": ["--procs", SIZES], "snapshot": ["--idle", SIZES], "e2e": ["--profile-tasks", "--reps", "3"]}
# Generous limits, for a hang only: a full run takes about 25 minutes on 2 cores (e2e: 15 of them, 3 repetitions - two
# connections, local and SSH, times two kinds of GPU bystanders; fleet: 4.5), a smoke run about 2 minutes
# (e2e: 115 s, local and NVML bystanders only; fleet: 8 s).
LIMIT_S = {"smoke": 180, "full": 900}
# e2e: 4 x 12 method/variant pairs and 3 latency methods, each of which may run into bench_e2e's own --timeout
# (30 s smoke, 120 s full) once; fleet: 7 playbook runs over up to 64 hosts; output: hosts of 8, 32 and 64 GPUs,
# with 1, 4 and 16 servers of one worker per GPU (up to 1,062 simulated processes: about 9 minutes on 2 cores, most
# of it starting the processes; a smoke run 15 s).
LIMIT_S_OF = {"e2e": {"smoke": 300, "full": 4800}, "fleet": {"smoke": 300, "full": 2400}, "output": {"smoke": 180, "full": 1500}}
DOC_TOOL = os.path.join(ROOT, "tools", "performance_doc.py")


def bench_argv(name, args):
    argv = [sys.executable, os.path.join(HERE, f"bench_{name}.py")]
    argv += ["--smoke"] if args.smoke else FULL_ARGS.get(name, [])
    if name == "e2e" and args.vmid is not None:
        argv += ["--vmid", str(args.vmid)]
    if name == "fleet" and args.fleet_vmid_base is not None:
        argv += ["--vmid-base", str(args.fleet_vmid_base)]
    if name == "output" and args.output_vmid_base is not None:
        argv += ["--vmid-base", str(args.output_vmid_base)]
    return argv


def run_one(name, argv, smoke, limit):
    print(f"\n=== bench {name}{' (smoke)' if smoke else ''}: {' '.join(shlex.quote(a) for a in argv[1:])}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT)  # pylint: disable=consider-using-with
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the benchmark cleans up what it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        print(f"bench {name}: no result after {limit} s, stopped", flush=True)
        rc = "hung"
    except BaseException:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        raise
    return rc, time.monotonic() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description="Run the benchmarks (tables on stdout, JSON in benchmarks/results/).")
    ap.add_argument("--smoke", action="store_true", help="quick run for CI: small sizes, 1-2 repetitions")
    ap.add_argument("--only", nargs="+", choices=BENCHES, help="run only these benchmarks")
    ap.add_argument("--vmid", type=int, help="bench_e2e's container (its default: 129, the seeds')")
    ap.add_argument("--fleet-vmid-base", type=int, help="bench_fleet's first container (its default: 7300)")
    ap.add_argument("--output-vmid-base", type=int, help="bench_output's container (its default: 7700)")
    ap.add_argument("--no-docs", action="store_true", help="a full run: do not regenerate docs/performance.md and docs/scale.md")
    args = ap.parse_args(argv)
    mode = "smoke" if args.smoke else "full"
    started = benchlib.machine()
    t0 = time.monotonic()
    outcome = []
    for name in args.only or BENCHES:
        argv_one = bench_argv(name, args)
        rc, took = run_one(name, argv_one, args.smoke, LIMIT_S_OF.get(name, LIMIT_S)[mode])
        outcome.append({"name": name, "rc": rc, "seconds": took,
                        "command": " ".join(shlex.quote(os.path.relpath(a, ROOT) if a.startswith(ROOT + os.sep) else a)
                                            for a in argv_one)})
    total = time.monotonic() - t0
    print(f"\n=== benchmarks{' (smoke)' if args.smoke else ''}: {total:.1f} s")
    for o in outcome:
        status = "ok" if o["rc"] == 0 else f"FAILED ({o['rc']})"
        print(f"  {o['name']:<9} {status:<12} {o['seconds']:6.1f} s"
              f"   benchmarks/results/{'smoke/' if args.smoke else ''}{o['name']}.json")
    benchlib.write_json("run", {"name": "run", "smoke": args.smoke, "machine": started, "total_s": total,
                                "finished": time.strftime("%Y-%m-%d %H:%M:%S %z"), "benches": outcome})
    failed = [o["name"] for o in outcome if o["rc"] != 0]
    if not args.smoke and not args.no_docs:
        print(f"\n=== docs: {os.path.relpath(DOC_TOOL, ROOT)}", flush=True)
        doc = subprocess.run([sys.executable, DOC_TOOL], cwd=ROOT, check=False)
        if doc.returncode != 0:
            failed.append("tools/performance_doc.py")
    if failed:
        print(f"crashed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
