"""Run every benchmark: `.venv/bin/python benchmarks/run.py [--smoke] [--only NAME ...]`.

Each benchmark runs as its own process, prints its table and writes benchmarks/results/<name>.json (a smoke run: benchmarks/results/smoke/<name>.json).
--smoke: small sizes and one or two repetitions, a few seconds each (what `make test` runs);
its figures mean nothing, it only proves the benchmarks still run. The exit status is non-zero
only when a benchmark crashes (or hangs past its time limit), never because of a timing.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHES = ("scan", "snapshot", "release", "wait", "e2e")
# Generous limits, for a hang only: a full run takes about 7.5 minutes on 2 cores (e2e: 5 of them),
# a smoke run 35 s (e2e: 25 s).
LIMIT_S = {"smoke": 180, "full": 900}
# e2e: 12 method/variant pairs, each of which may run into bench_e2e's own --timeout (30 s smoke, 120 s full) once.
LIMIT_S_OF = {"e2e": {"smoke": 300, "full": 1800}}


def run_one(name, smoke, limit):
    argv = [sys.executable, os.path.join(HERE, f"bench_{name}.py")] + (["--smoke"] if smoke else [])
    print(f"\n=== bench {name}{' (smoke)' if smoke else ''}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=os.path.dirname(HERE))  # pylint: disable=consider-using-with
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
    return rc, time.monotonic() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description="Run the benchmarks (tables on stdout, JSON in benchmarks/results/).")
    ap.add_argument("--smoke", action="store_true", help="quick run for CI: small sizes, 1-2 repetitions")
    ap.add_argument("--only", nargs="+", choices=BENCHES, help="run only these benchmarks")
    args = ap.parse_args(argv)
    mode = "smoke" if args.smoke else "full"
    t0 = time.monotonic()
    outcome = []
    for name in args.only or BENCHES:
        rc, took = run_one(name, args.smoke, LIMIT_S_OF.get(name, LIMIT_S)[mode])
        outcome.append((name, rc, took))
    total = time.monotonic() - t0
    print(f"\n=== benchmarks{' (smoke)' if args.smoke else ''}: {total:.1f} s")
    for name, rc, took in outcome:
        print(f"  {name:<9} {'ok' if rc == 0 else f'FAILED ({rc})':<12} {took:6.1f} s   benchmarks/results/{'smoke/' if args.smoke else ''}{name}.json")
    failed = [name for name, rc, _took in outcome if rc != 0]
    if failed:
        print(f"crashed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
