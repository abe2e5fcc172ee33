"""Device-file holder scan: _procs.scan_fd_holders vs `fuser <files>` vs a naive Python scan.

Starts N real idle processes (`sleep 600`) and a few holders (Python children that keep
<tmp>/dev/nvidia0..7 and nvidiactl open), then times, round-robin, several repetitions of:

- ours:  `_procs.scan_fd_holders([<tmp>/dev/nvidia*])`, in-process (as the modules call it);
- fuser: `fuser <tmp>/dev/nvidia0 ... nvidiactl nvidia-uvm` (psmisc), a subprocess, as users run it;
- naive: os.listdir(/proc/<pid>/fd) + os.readlink + fnmatch of every link (no prefix test).

Reports the median wall time, the ratio ours/fuser (the issue's target: <= 0.7) and the CPU time
of one scan, for each size (--procs 500,2000,5000: the idle processes are added to the last size's).
Every process it started is killed (by pid) at the end.

    .venv/bin/python benchmarks/bench_scan.py [--smoke] [--procs N[,N...]] [--reps R]
"""

import argparse
import fnmatch
import glob
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import benchlib

HOLDER = ("import os, sys, time\n"
          "fds = [os.open(p, os.O_RDONLY) for p in sys.argv[1:]]\n"
          "print('ready', flush=True)\n"
          "time.sleep(600)\n")


def naive_scan(patterns, proc="/proc"):
    """What a first Python version looks like: every fd link of every process through fnmatch."""
    found = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        fd_dir = f"{proc}/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            for pattern in patterns:
                if fnmatch.fnmatch(target, pattern):
                    found.setdefault(int(name), set()).add(target)
    return {pid: sorted(paths) for pid, paths in found.items()}


def fuser_scan(files):
    """`fuser FILE...`: pids on stdout (names and access letters on stderr); exit 1 when none."""
    proc = subprocess.run(["fuser", *files], capture_output=True, text=True, check=False)
    return {int(tok.rstrip("cefFrm")) for tok in proc.stdout.split() if tok.rstrip("cefFrm").isdigit()}


def timed_inprocess(fn):
    c0 = time.process_time()
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def timed_child(fn):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def start_holders(count, files):
    holders = []
    for _index in range(count):
        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-c", HOLDER, *files], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        holders.append(proc)
    for proc in holders:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"holder {proc.pid} did not start")
    return holders


def stop_holders(holders):
    for proc in holders:
        if proc.poll() is None:
            proc.kill()
    for proc in holders:
        proc.wait()
        proc.stdout.close()


def measure(args, methods, expected, size):
    """One size: warm-up, then args.reps round-robin repetitions of every method."""
    samples = {name: [] for name in methods}
    cpu = {name: [] for name in methods}
    found = {}
    nprocs = benchlib.process_count()
    for name, fn in methods.items():  # warm-up: dentry caches, the page cache of fuser
        found[name] = fn()[0]
    for _rep in range(args.reps):
        for name, fn in methods.items():
            out, wall, used = fn()
            samples[name].append(wall)
            cpu[name].append(used)
            found[name] = out
    med = {k: benchlib.median(v) for k, v in samples.items()}
    return {
        "idle_processes": size, "processes_on_machine": nprocs,
        "median_s": med, "cpu_s_median": {k: benchlib.median(v) for k, v in cpu.items()}, "samples_s": samples,
        "found_expected_holders": {k: sorted(v) == sorted(expected) for k, v in found.items()},
        "ratio_ours_fuser": benchlib.ratio(med["ours"], med.get("fuser")),
        "ratio_ours_naive": benchlib.ratio(med["ours"], med["naive"]),
    }


def print_size(args, r, have_fuser):
    f = benchlib.fmt
    med, cpu_med, agree = r["median_s"], r["cpu_s_median"], r["found_expected_holders"]
    rows = [
        ["ours: _procs.scan_fd_holders (in-process)", f(med["ours"], "ms"), f(cpu_med["ours"], "ms"), "1.00x",
         f(agree.get("ours"))],
        ["fuser <files> (psmisc, subprocess)" if have_fuser else "fuser: not installed",
         f(med.get("fuser"), "ms"), f(cpu_med.get("fuser"), "ms"), f(r["ratio_ours_fuser"], "x"), f(agree.get("fuser"))],
        ["naive Python scan (fnmatch every fd)", f(med["naive"], "ms"), f(cpu_med["naive"], "ms"),
         f(r["ratio_ours_naive"], "x"), f(agree.get("naive"))],
    ]
    benchlib.table(f"Device-file holder scan: {r['processes_on_machine']} processes on the machine ({r['idle_processes']}"
                   f" idle started here, {args.holders} holders), median of {args.reps}",
                   ["method", "median wall", "CPU / scan", "ours / this", "found the holders"], rows)
    print(f"ratio ours/fuser: {f(r['ratio_ours_fuser'], 'x')} (target <= 0.70)")


def run(args):
    started = benchlib.machine()  # the machine and its load when the measurement starts
    have_fuser = shutil.which("fuser") is not None
    results = []
    with benchlib.workspace("gpubench-scan-") as ws:
        ws.activate()
        # pylint: disable-next=import-outside-toplevel,import-error
        from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs

        devdir = os.path.join(tempfile.mkdtemp(prefix="dev-", dir=ws.dir), "dev")
        os.makedirs(devdir)
        names = [f"nvidia{i}" for i in range(8)] + ["nvidiactl", "nvidia-uvm"]
        for name in names:
            with open(os.path.join(devdir, name), "w", encoding="utf-8"):
                pass
        pattern = os.path.join(devdir, "nvidia*")
        files = sorted(glob.glob(pattern))
        held = [os.path.join(devdir, n) for n in names[:9]]  # nvidia0..7 and nvidiactl

        holders = []
        idle = benchlib.IdleProcesses()
        try:
            holders = start_holders(args.holders, held)
            expected = {p.pid for p in holders}
            methods = {
                "ours": lambda: timed_inprocess(lambda: set(_procs.scan_fd_holders([pattern]))),
                "naive": lambda: timed_inprocess(lambda: set(naive_scan([pattern]))),
            }
            if have_fuser:
                methods["fuser"] = lambda: timed_child(lambda: fuser_scan(files))
            for size in args.procs:  # ascending: each size adds idle processes to the last one's
                idle.start(size - len(idle.procs))
                results.append(measure(args, methods, expected, size))
                print_size(args, results[-1], have_fuser)
        finally:
            idle.stop()
            stop_holders(holders)

    result = {
        "name": "scan",
        "smoke": args.smoke,
        "machine": started,
        "params": {"idle_processes": args.procs, "holders": args.holders, "reps": args.reps,
                   "fuser": shutil.which("fuser") or "not installed"},
        "sizes": results,
        "target": {"ratio_ours_fuser_max": 0.7},
    }
    benchlib.write_json("scan", result)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="small and quick: 200 processes, 2 repetitions")
    ap.add_argument("--procs", type=benchlib.sizes_arg,
                    help="idle processes to start, or a comma list of sizes measured one after the other"
                         " (default 2000; smoke 200; run.py's full run: 500,2000,5000)")
    ap.add_argument("--holders", type=int, default=3, help="processes that hold the device files (default 3)")
    ap.add_argument("--reps", type=int, help="repetitions (default 9; smoke 2)")
    args = ap.parse_args(argv)
    args.procs = args.procs if args.procs is not None else [200 if args.smoke else 2000]
    args.reps = args.reps or (2 if args.smoke else 9)
    benchlib.install_signal_handlers()
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
