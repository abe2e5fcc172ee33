"""Releasing 8 GPUs: gpu_release (SIGTERM, wait on pidfds) vs the seed's `kill -9` + `sleep 2`.

One simulated workload per GPU (each honours SIGTERM), then either

- ours:  the gpu_release module, run as Ansible runs it on a target (`python -m ... args.json`),
  selecting every holder of the 8 GPUs; measured from the module's result (`released[].seconds`,
  first signal to gone, max over the 8; the module's `elapsed`, its two snapshots included) and
  the wall clock around the module process (interpreter and Ansible start-up included);
- today (the seed): `kill -9 <pids>` followed by a fixed `sleep 2`, then on to the next step.
  When the processes were really gone is recorded too (polled, for information).

A second scenario uses workers that take 0.3 s to exit after SIGTERM (--exit-delay 0.3), to
show that the module returns their own exit time plus at most ~0.1 s; a third one an inference
server tree (API process + one worker per GPU), released through its tree.

    .venv/bin/python benchmarks/bench_release.py [--smoke] [--reps R]
"""

import argparse
import subprocess
import sys
import time

import benchlib


def hold_workers(host, workers, exit_delay=None, mib=40960):
    return [host.hold(gpus, mib=mib, exit_delay=exit_delay) for gpus in workers]


def gone(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return True


def ours(ws, host, env, expect):
    args = {"device_files": [benchlib.device_glob(host)], "grace_period": 10}
    res, wall, cpu, rc, _t0 = ws.run_module("gpu_release", args, env)
    if rc != 0:
        raise RuntimeError(f"gpu_release failed: {res.get('msg')}")
    seconds = [r["seconds"] for r in res["released"]]
    # expect None: a tree, whose API process forwards SIGTERM to its workers - a worker that exits before
    # the module's own signal reaches it is not in `released` (it was never signalled by the module).
    if (expect is not None and len(seconds) != expect) or res["survivors"] or not seconds:
        raise RuntimeError(f"gpu_release released {len(seconds)} of {expect} (survivors: {res['survivors']})")
    return {"wall_s": wall, "elapsed_s": res["elapsed"], "max_seconds": max(seconds), "cpu_s": cpu,
            "released": len(seconds), "signals": sorted({s for r in res["released"] for s in r["signals"]})}


def seed(pids, sleep_s):
    """`kill -9 <pids>; sleep 2`, as in the seed; when they were really gone is polled on the side."""
    t0 = time.monotonic()
    subprocess.run(["kill", "-9", *map(str, pids)], check=False)
    gone_at = None
    while time.monotonic() - t0 < sleep_s:
        if gone_at is None and all(gone(p) for p in pids):
            gone_at = time.monotonic() - t0
        time.sleep(0.005 if gone_at is None else max(0.0, sleep_s - (time.monotonic() - t0)))
    return {"wall_s": time.monotonic() - t0, "really_gone_s": gone_at}


def run(args):
    started = benchlib.machine()  # the machine and its load when the measurement starts
    scen = {"sigterm": [], "seed": [], "exit_delay": [], "tree": []}
    with benchlib.workspace("gpubench-rel-") as ws, benchlib.sim_host(gpus=8) as host:
        env = ws.env(host.env())
        for _rep in range(args.reps):  # interleaved, so that drift on the machine hits both alike
            hold_workers(host, args.workers)
            scen["sigterm"].append(ours(ws, host, env, len(args.workers)))
            scen["seed"].append(seed(hold_workers(host, args.workers), args.seed_sleep))
            hold_workers(host, args.workers, exit_delay=args.exit_delay)
            scen["exit_delay"].append(ours(ws, host, env, len(args.workers)))
        host.hold("all", mib=40960, tree=True)
        scen["tree"].append(ours(ws, host, env, None))

    def avg(name, key):
        return benchlib.mean([x[key] for x in scen[name] if x[key] is not None])

    seed_wall = avg("seed", "wall_s")
    summary = {
        "ours_wall_s": avg("sigterm", "wall_s"), "ours_elapsed_s": avg("sigterm", "elapsed_s"),
        "ours_max_seconds": avg("sigterm", "max_seconds"), "seed_wall_s": seed_wall,
        "seed_really_gone_s": avg("seed", "really_gone_s"),
        "exit_delay_max_seconds": avg("exit_delay", "max_seconds"),
        "exit_delay_overhead_s": max(x["max_seconds"] for x in scen["exit_delay"]) - args.exit_delay,
        "exit_delay_elapsed_s": avg("exit_delay", "elapsed_s"), "exit_delay_wall_s": avg("exit_delay", "wall_s"),
        "tree_max_seconds": avg("tree", "max_seconds"), "tree_released": scen["tree"][0]["released"], "tree_wall_s": avg("tree", "wall_s"),
    }
    summary["ratio_ours_wall_seed"] = benchlib.ratio(summary["ours_wall_s"], seed_wall)
    summary["ratio_ours_elapsed_seed"] = benchlib.ratio(summary["ours_elapsed_s"], seed_wall)
    summary["ratio_ours_gone_seed"] = benchlib.ratio(summary["ours_max_seconds"], seed_wall)
    result = {"name": "release", "smoke": args.smoke, "machine": started,
              "params": {"workers": args.workers, "reps": args.reps, "exit_delay_s": args.exit_delay, "seed_sleep_s": args.seed_sleep},
              "summary": summary, "runs": scen}
    f = benchlib.fmt
    rows = [
        [f"ours: gpu_release, {len(args.workers)} worker(s), SIGTERM", f(summary["ours_max_seconds"], "s"), f(summary["ours_elapsed_s"], "s"),
         f(summary["ours_wall_s"], "s"), f(summary["ratio_ours_wall_seed"], "x")],
        [f"today: kill -9 <pids>; sleep {args.seed_sleep:g} (seed)", f(summary["seed_really_gone_s"], "s"), "-", f(seed_wall, "s"), "1.00x"],
        [f"ours: {len(args.workers)} worker(s) that exit {args.exit_delay:g} s after SIGTERM", f(summary["exit_delay_max_seconds"], "s"),
         f(summary["exit_delay_elapsed_s"], "s"), f(summary["exit_delay_wall_s"], "s"),
         f(benchlib.ratio(summary["exit_delay_wall_s"], seed_wall), "x")],
        [f"ours: inference tree (API + 8 workers; {summary['tree_released']} signalled)", f(summary["tree_max_seconds"], "s"), "-",
         f(summary["tree_wall_s"], "s"),
         f(benchlib.ratio(summary["tree_wall_s"], seed_wall), "x")],
    ]
    benchlib.table(f"Releasing 8 GPUs, mean of {args.reps} (tree: 1 run)",
                   ["method", "signal -> all gone", "module elapsed", "wall (whole step)", "wall / seed"], rows)
    print(f"ratio ours/seed: wall {f(summary['ratio_ours_wall_seed'], 'x')}, module elapsed"
          f" {f(summary['ratio_ours_elapsed_seed'], 'x')}, signal->gone {f(summary['ratio_ours_gone_seed'], 'x')};"
          f" exit-delay {args.exit_delay:g} s workers: gone after their exit time + "
          f"{summary['exit_delay_overhead_s']:.3f} s at most (target <= 0.1 s)")
    benchlib.write_json("release", result)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="one repetition")
    ap.add_argument("--reps", type=int, help="repetitions (default 5; smoke 1)")
    ap.add_argument("--seed-sleep", type=float, help="the seed's fixed sleep (default 2 s; smoke 0.5 s)")
    ap.add_argument("--exit-delay", type=float, default=0.3, help="exit time of the slow workers (default 0.3 s)")
    args = ap.parse_args(argv)
    args.reps = args.reps or (1 if args.smoke else 5)
    # 8 workers, one per GPU; the smoke run holds all 8 GPUs with one (quicker to start).
    args.workers = ["all"] if args.smoke else [[index] for index in range(8)]
    args.seed_sleep = args.seed_sleep if args.seed_sleep is not None else (0.5 if args.smoke else 2.0)
    benchlib.install_signal_handlers()
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
