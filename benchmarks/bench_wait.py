"""Waiting until the GPUs are free: gpu_wait_idle vs the `until` loop users write vs the manual sleeps.

The seed scenario: the driver frees a process's memory 1.5 s after it exits (release lag), and
the wait needs the GPUs idle and settled for 1.0 s. Each repetition holds 8 workers (40 GiB on
each GPU), SIGKILLs them, reads their exit times from the driver's `procs` file (the `exit`
lines, CLOCK_MONOTONIC), so that the moment the last GPU's memory is freed is known exactly
(last exit + lag), and starts the waiter at once. Detection latency = waiter done - memory freed.

- ours:  the gpu_wait_idle module (`python -m ... args.json`, as the action plugin's `async` path
  runs it: one piece; no Ansible per-task overhead on either side), settle 1.0, sleep 0.5, with
  its final nvidia-smi confirmation (the default when nvidia-smi exists), and again without it;
- idiomatic: the Ansible task users write today, emulated in Python:
  `command: nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits` with
  `until: all <= 64` / `retries` / `delay: 2` - a query, then `time.sleep(2)` between attempts
  (`--task-overhead S` adds S per attempt for the command module's own start-up; default 0);
- manual: the seed's `sleep 2; nvidia-smi | grep 0MiB | wc -l`, then `sleep 3` and the check again.

Then the CPU cost of waiting: gpu_wait_idle on a GPU that never frees (timeout 30 s) with 2000
idle processes on the machine; CPU time of the module process (getrusage(RUSAGE_CHILDREN))
over its wall time, and the same for a run that times out at once (start-up and one full scan),
from which the steady state follows.

    .venv/bin/python benchmarks/bench_wait.py [--smoke] [--reps R] [--cpu-timeout S] [--procs N]
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import time

import benchlib

THRESHOLD_MIB = 64  # the collection's default max_memory_used_mib; the idiomatic loop uses the same


def kill_and_time_free(host, pids, lag_s):
    """SIGKILL the workers; return (kill time, the moment the last GPU's memory is freed, exact?)."""
    from gpusimkit import starttime  # pylint: disable=import-outside-toplevel,import-error

    keys = {(pid, starttime(pid)) for pid in pids}
    for pid, start in keys:  # workers this benchmark started (host.hold), checked by start time
        if start is not None and starttime(pid) == start:
            os.kill(pid, signal.SIGKILL)
    t_kill = time.monotonic()
    deadline = t_kill + min(1.0, lag_s * 0.5)
    exits = {}
    while time.monotonic() < deadline:
        exits = host.procs()[1]
        if all(k in exits for k in keys):
            return t_kill, max(exits[k] for k in keys) / 1e9 + lag_s, True
        time.sleep(0.002)
    return t_kill, t_kill + lag_s, False  # not seen in time: approximated by the kill time


def smi_used(env):
    proc = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], env=env,
                          capture_output=True, text=True, check=False)
    return [int(x) for x in proc.stdout.split()] if proc.returncode == 0 else None


def idiomatic(env, delay, overhead, gpus=8):
    """until: all used <= threshold; retries: N; delay: 2 - returns (done time, attempts)."""
    attempts = 0
    while True:
        attempts += 1
        if overhead:
            time.sleep(overhead)
        used = smi_used(env)
        if used is not None and len(used) == gpus and all(u <= THRESHOLD_MIB for u in used):
            return time.monotonic(), attempts
        if attempts >= 200:
            raise RuntimeError("the idiomatic loop never saw the GPUs free")
        time.sleep(delay)


def count_0mib(env):
    """`nvidia-smi | grep "0MiB" | wc -l`."""
    out = subprocess.run(["nvidia-smi"], env=env, capture_output=True, text=True, check=False).stdout
    return sum(1 for line in out.splitlines() if "0MiB" in line)


def manual(env, first, second):
    time.sleep(first)
    counts = [count_0mib(env)]
    time.sleep(second)
    counts.append(count_0mib(env))
    return time.monotonic(), counts


def wait_args(host, args, confirm):
    out = {"device_files": [benchlib.device_glob(host)], "expected_count": 8, "settle": args.settle, "sleep": args.sleep,
           "timeout": 120}
    if not confirm:
        out["confirm_with_nvidia_smi"] = False
    return out


def ours(ws, host, env, args, confirm):
    res, wall, cpu, rc, t_start = ws.run_module("gpu_wait_idle", wait_args(host, args, confirm), env)
    if rc != 0:
        raise RuntimeError(f"gpu_wait_idle failed: {res.get('msg')}")
    t_end = t_start + wall
    # When the poll that saw every GPU free ran: the module's clock starts after its imports, at
    # about t_end - elapsed (a little earlier in truth: the exit after `elapsed` is not counted,
    # so this estimate errs late, against us).
    firsts = [next((t for t, used, holders in series if used is not None and used <= THRESHOLD_MIB and holders == 0), None)
              for series in res["samples"].values()]
    freed_at = max(firsts) if firsts and None not in firsts else res["elapsed"]
    return t_end, {"detected_at": t_end - res["elapsed"] + freed_at, "elapsed_s": res["elapsed"], "polls": res["polls"],
                   "cpu_s": cpu, "wall_s": wall}


def latency_rows(args, env, ws, host):
    methods = ["ours", "ours_no_confirm", "idiomatic", "manual"]
    runs = {m: [] for m in methods}
    lag_s = args.lag_ms / 1000.0
    rng = random.Random(args.seed)
    for _rep in range(args.reps):
        for method in methods:  # round-robin, so that drift on the machine hits all alike
            pids = [host.hold(gpus, mib=40960) for gpus in args.workers]
            t_kill, t_free, exact = kill_and_time_free(host, pids, lag_s)
            entry = {"exact_free_time": exact, "free_after_kill_s": t_free - t_kill}
            if args.jitter:  # the waiter starts a random time after the kill: a random poll phase
                entry["start_after_kill_s"] = rng.uniform(0.0, args.jitter)
                time.sleep(max(0.0, t_kill + entry["start_after_kill_s"] - time.monotonic()))
            if method.startswith("ours"):
                t_end, extra = ours(ws, host, env, args, confirm=method == "ours")
                entry.update(extra)
                entry["detect_latency_s"] = extra["detected_at"] - t_free
                del entry["detected_at"]
            elif method == "idiomatic":
                t_end, entry["attempts"] = idiomatic(env, args.delay, args.task_overhead)
            else:
                t_end, entry["counts"] = manual(env, args.manual_first, args.manual_second)
            entry["latency_s"] = t_end - t_free
            runs[method].append(entry)
    return runs


def cpu_cost(ws, host, env, args):
    """gpu_wait_idle on a GPU that never frees, with N idle processes; then one that times out at once."""
    host.hold([0], mib=40960)
    out = {}
    with benchlib.idle_processes(args.procs):
        nprocs = benchlib.process_count()
        for name, timeout in (("long", args.cpu_timeout), ("instant", 0.0)):
            wa = {"device_files": [benchlib.device_glob(host)], "expected_count": 8, "settle": 0.0 if timeout == 0 else 1.0,
                  "timeout": timeout}
            res, wall, cpu, rc, _t0 = ws.run_module("gpu_wait_idle", wa, env)
            if rc == 0 or "timed out" not in (res.get("msg") or ""):
                raise RuntimeError(f"gpu_wait_idle did not time out as expected: rc {rc}, {res.get('msg')}")
            out[name] = {"wall_s": wall, "cpu_s": cpu, "cpu_pct": 100.0 * cpu / wall, "polls": res.get("polls"),
                         "timeout_s": timeout}
    steady = (out["long"]["cpu_s"] - out["instant"]["cpu_s"]) / (out["long"]["wall_s"] - out["instant"]["wall_s"])
    out["steady_cpu_pct"] = 100.0 * steady
    out["processes_on_machine"] = nprocs
    return out


def run(args):
    started = benchlib.machine()  # the machine and its load when the measurement starts
    with benchlib.workspace("gpubench-wait-") as ws, benchlib.sim_host(gpus=8, release_lag_ms=args.lag_ms) as host:
        env = ws.env(host.env())
        busy = [host.hold(gpus, mib=40960) for gpus in args.workers]
        false_free = count_0mib(env)  # the manual check on 8 busy GPUs (40960MiB contains "0MiB")
        for pid in busy:
            host.kill(pid)
        runs = latency_rows(args, env, ws, host)
        cpu = None if args.skip_cpu else cpu_cost(ws, host, env, args)

    f = benchlib.fmt

    def stat(method, key="latency_s"):
        values = [r[key] for r in runs[method]]
        return benchlib.mean(values), max(values)

    summary = {m: {"mean_latency_s": stat(m)[0], "max_latency_s": stat(m)[1]} for m in runs}
    for m in ("ours", "ours_no_confirm"):
        summary[m]["mean_detect_latency_s"], summary[m]["max_detect_latency_s"] = stat(m, "detect_latency_s")
    ratios = {
        "ours_idiomatic": benchlib.ratio(summary["ours"]["mean_latency_s"], summary["idiomatic"]["mean_latency_s"]),
        "ours_no_confirm_idiomatic": benchlib.ratio(summary["ours_no_confirm"]["mean_latency_s"],
                                                    summary["idiomatic"]["mean_latency_s"]),
        "ours_detect_idiomatic": benchlib.ratio(summary["ours"]["mean_detect_latency_s"],
                                                summary["idiomatic"]["mean_latency_s"]),
        "ours_manual": benchlib.ratio(summary["ours"]["mean_latency_s"], summary["manual"]["mean_latency_s"]),
    }
    result = {
        "name": "wait" if not args.jitter else f"wait-jitter{args.jitter:g}", "smoke": args.smoke, "machine": started,
        "params": {"release_lag_ms": args.lag_ms, "settle_s": args.settle, "sleep_s": args.sleep, "reps": args.reps,
                   "idiomatic_delay_s": args.delay, "idiomatic_task_overhead_s": args.task_overhead,
                   "manual_sleeps_s": [args.manual_first, args.manual_second], "threshold_mib": THRESHOLD_MIB,
                   "workers": args.workers, "cpu_idle_processes": args.procs, "jitter_s": args.jitter},
        "summary": summary, "ratios": ratios, "runs": runs, "cpu": cpu,
        "manual_check_on_busy_gpus_counts": false_free,
        "targets": {"ratio_ours_idiomatic_max": 0.4, "max_latency_ours_s": args.sleep + 0.1, "cpu_pct_max": 2.0},
    }
    idio = summary["idiomatic"]["mean_latency_s"]
    rows = []
    labels = {"ours": "ours: gpu_wait_idle (nvidia-smi confirmation, default)",
              "ours_no_confirm": "ours: gpu_wait_idle, confirm_with_nvidia_smi=false",
              "idiomatic": f"idiomatic: until/retries/delay {args.delay:g} over nvidia-smi --query-gpu",
              "manual": f"manual: sleep {args.manual_first:g}; check; sleep {args.manual_second:g}; check"}
    for m, label in labels.items():
        s = summary[m]
        rows.append([label, f(s["mean_latency_s"], "s"), f(s["max_latency_s"], "s"),
                     f(s.get("mean_detect_latency_s"), "s"), f(s.get("max_detect_latency_s"), "s"),
                     f(benchlib.ratio(s["mean_latency_s"], idio), "x")])
    title = (f"Detection latency after the memory is freed (release lag {args.lag_ms} ms, settle {args.settle:g} s),"
             f" {args.reps} repetitions, {len(args.workers)} worker(s)"
             + (f", each waiter started 0..{args.jitter:g} s after the kill" if args.jitter else ""))
    benchlib.table(title, ["method", "mean (done)", "max (done)", "mean (idle poll)", "max (idle poll)", "mean / idiomatic"], rows)
    print(f"ratio ours/idiomatic: {f(ratios['ours_idiomatic'], 'x')} (without the nvidia-smi confirmation:"
          f" {f(ratios['ours_no_confirm_idiomatic'], 'x')}; idle poll: {f(ratios['ours_detect_idiomatic'], 'x')};"
          f" target <= 0.40); max of ours {f(summary['ours']['max_latency_s'], 's')}, idle poll"
          f" {f(summary['ours']['max_detect_latency_s'], 's')} (target <= {args.sleep + 0.1:.1f} s)")
    print(f"manual check on 8 BUSY GPUs (40960 MiB each): `grep 0MiB | wc -l` says {false_free}")
    if cpu is None:
        benchlib.write_json(result["name"], result)
        return result
    benchlib.table(f"CPU cost of waiting on a GPU that never frees ({cpu['processes_on_machine']} processes on the machine)",
                   ["run", "wall", "CPU", "CPU / wall", "polls"],
                   [[f"gpu_wait_idle timeout {cpu['long']['timeout_s']:g} s", f(cpu["long"]["wall_s"], "s"),
                     f(cpu["long"]["cpu_s"], "s"), f(cpu["long"]["cpu_pct"], "%"), cpu["long"]["polls"]],
                    ["gpu_wait_idle timeout 0 (start-up + one full scan)", f(cpu["instant"]["wall_s"], "s"),
                     f(cpu["instant"]["cpu_s"], "s"), f(cpu["instant"]["cpu_pct"], "%"), cpu["instant"]["polls"]],
                    ["steady state (difference of the two)", "", "", f(cpu["steady_cpu_pct"], "%"), ""]])
    print("CPU target: <= 2 % of one core")
    benchlib.write_json(result["name"], result)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="quick: one repetition, times scaled down, 200 processes")
    ap.add_argument("--reps", type=int, help="repetitions (default 5; smoke 1)")
    ap.add_argument("--lag-ms", type=int, help="driver release lag (default 1500; smoke 300)")
    ap.add_argument("--settle", type=float, help="gpu_wait_idle settle (default 1.0; smoke 0.2)")
    ap.add_argument("--sleep", type=float, default=0.5, help="gpu_wait_idle poll interval (default 0.5)")
    ap.add_argument("--delay", type=float, help="the idiomatic loop's delay (default 2; smoke 0.4)")
    ap.add_argument("--task-overhead", type=float, default=0.0, help="Ansible per-attempt overhead to add (default 0)")
    ap.add_argument("--jitter", type=float, default=0.0,
                    help="start each waiter a random 0..S s after the kill (default 0: at once, as a playbook does)")
    ap.add_argument("--seed", type=int, default=1, help="random seed for --jitter")
    ap.add_argument("--skip-cpu", action="store_true", help="skip the CPU-cost measurement")
    ap.add_argument("--cpu-timeout", type=float, help="the CPU-cost wait's timeout (default 30; smoke 1)")
    ap.add_argument("--procs", type=int, help="idle processes during the CPU-cost wait (default 2000; smoke 200)")
    args = ap.parse_args(argv)
    smoke = args.smoke
    args.reps = args.reps or (1 if smoke else 5)
    args.lag_ms = args.lag_ms if args.lag_ms is not None else (300 if smoke else 1500)
    args.settle = args.settle if args.settle is not None else (0.2 if smoke else 1.0)
    args.delay = args.delay if args.delay is not None else (0.4 if smoke else 2.0)
    args.manual_first, args.manual_second = (0.4, 0.6) if smoke else (2.0, 3.0)
    args.cpu_timeout = args.cpu_timeout if args.cpu_timeout is not None else (1.0 if smoke else 30.0)
    args.procs = args.procs if args.procs is not None else (200 if smoke else 2000)
    # 8 workers, one per GPU; the smoke run holds all 8 GPUs with one (quicker to start).
    args.workers = ["all"] if smoke else [[index] for index in range(8)]
    benchlib.install_signal_handlers()
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
