"""Fleet scale: `ansible-playbook gpuops.gpu.predeploy` over 1, 8, 32 and 64 simulated GPU nodes at once.

Each simulated host is a Proxmox VE node of its own (SimHost, its own simulator directory, 2 x
H200 by default, release lag 1.5 s) with one container, CT 7300+i (every GPU passed through), where
an inference server (an API process and one worker per GPU, 130,048 MiB each) runs. The inventory
is the README's topology once per host: a node `pve-NNN` in proxmox_nodes and a GPU host `gpu-NNN`
(proxmox_node: pve-NNN, proxmox_vmid: 7300+i) in gpu_hosts; local connection.

How host i's modules see simulator i and no other: its `ansible_python_interpreter` is a small
shell script in the benchmark's temp dir that exports that host's PATH (the simulator's nvidia-smi
and pct first), LD_LIBRARY_PATH (its libnvidia-ml.so.1) and GPUSIM_DIR, then runs Python; with the
local connection the interpreter of the inventory is what runs the module (the delegated tasks
run with the node's), so this is a per-host environment, as SSH to a different machine would
give. ansible-playbook itself runs without any of them. The script also appends the module's CPU
time (the shell's `times`) to a log, which splits the CPU time of a run in two: the modules and
what they ran (nvidia-smi, pct: what would run on the nodes), and the rest (ansible-playbook,
its forked workers, the local connection's shell commands: the controller).

Per size: the hosts come up, then for each forks setting (forks = hosts, and forks 8 where that
differs) a fresh server starts in every container and the playbook runs once (`--forks F`).
Recorded: wall time; CPU time of ansible-playbook and everything it ran (getrusage(RUSAGE_CHILDREN)
delta), split as above, in total and per host; peak controller memory: ansible-playbook's main
process (RSS) and the main process with its forked workers (the sum of their PSS, which counts a
page shared after fork once; sampled every 0.5 s from /proc/<pid>/smaps_rollup), and the most
workers alive at once; each host ready (all its GPUs <= 64 MiB) when the playbook returned, its
server gone, its container running, its PLAY RECAP; the per-task times (a callback, as
bench_e2e.py --profile-tasks). The growth of the wall time with the hosts is the ratio to the
1-host run of the same invocation (target: 32 hosts <= 4 x one host).

    .venv/bin/python benchmarks/bench_fleet.py [--smoke] [--sizes 1,8,32,64] [--forks hosts,8] [--gpus 2]
                                               [--lag-ms 1500] [--vmid-base 7300] [--timeout S]

Every simulated host is torn down (down()) whatever happens, also on SIGTERM and Ctrl-C; only the
processes the simulators started, and the playbook's own process group, are ever signalled.
"""

import argparse
import contextlib
import os
import signal
import sys
import threading
import time

import benchlib
import bench_e2e

WORKER_MIB = 130048
THRESHOLD_MIB = 64
SERVER_NAME = "python3 -m sglang.launch_server --tp {gpus}"
DEFAULT_SIZES = (1, 8, 32, 64)
SMOKE_SIZES = (1, 2)
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- the fleet ----------------------------------------------------------------------------------

class Fleet:
    """N simulated nodes, each with a container vmid_base+i and a per-host interpreter."""

    def __init__(self, ws, stack, size, args):
        self.ws, self.args, self.hosts = ws, args, []
        for index in range(size):
            host = stack.enter_context(benchlib.sim_host(gpus=args.gpus, release_lag_ms=args.lag_ms))
            vmid = args.vmid_base + index
            host.ct_create(vmid, hostname=f"gpu-{index:03d}")
            host.ct_start(vmid)
            hdir = ws.path(f"fleet-{size}/host-{index:03d}")
            os.makedirs(hdir)
            self.hosts.append({"index": index, "host": host, "vmid": vmid, "dir": hdir,
                               "node": f"pve-{index:03d}", "gpu_host": f"gpu-{index:03d}",
                               "python": os.path.join(hdir, "python")})

    def start_servers(self):
        """A fresh server in every container; returns {index: {pid: starttime}} of the server's processes."""
        from gpusimkit import starttime  # pylint: disable=import-outside-toplevel,import-error

        servers = {}
        for h in self.hosts:
            host = h["host"]
            before = {(p["pid"], p["starttime"]) for p in host.procs()[0]}
            api = host.hold(gpus="all", mib=WORKER_MIB, ct=h["vmid"], tree=True,
                            name=SERVER_NAME.format(gpus=self.args.gpus))
            workers = {p["pid"] for p in host.procs()[0] if (p["pid"], p["starttime"]) not in before}
            servers[h["index"]] = {pid: starttime(pid) for pid in [api, *sorted(workers)]}
        return servers

    def write_interpreters(self, run_id):
        """Each host's interpreter script, with a fresh CPU log for this run."""
        for h in self.hosts:
            h["cpu_log"] = os.path.join(h["dir"], f"cpu-{run_id}.log")
            benchlib.interpreter_wrapper(h["python"], f"{h['node']} and {h['gpu_host']}", h["host"].env_vars(),
                                         cpu_log=h["cpu_log"])

    def inventory(self, path):
        import yaml  # pylint: disable=import-outside-toplevel  # PyYAML: ansible-core's dependency

        nodes, gpu_hosts = {}, {}
        for h in self.hosts:
            common = {"ansible_python_interpreter": h["python"],
                      "gpuops_device_files": [benchlib.device_glob(h["host"])]}
            nodes[h["node"]] = dict(common, fleet_vmid=h["vmid"])
            gpu_hosts[h["gpu_host"]] = dict(common, proxmox_node=h["node"], proxmox_vmid=h["vmid"],
                                            gpu_idle_expected_count=self.args.gpus)
        inv = {"all": {"vars": {"ansible_connection": "local"},
                       "children": {"proxmox_nodes": {"hosts": nodes}, "gpu_hosts": {"hosts": gpu_hosts}}}}
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"# bench_fleet: {len(self.hosts)} simulated Proxmox VE nodes, one GPU container on each\n")
            yaml.safe_dump(inv, f, sort_keys=False)
        return path

    def observe(self, servers):
        from gpusimkit import alive  # pylint: disable=import-outside-toplevel,import-error

        out = []
        for h in self.hosts:
            status = h["host"].status()
            used = [g["memory_used_mib"] for g in status["gpus"]]
            left = [pid for pid, start in servers[h["index"]].items() if alive(pid, start)]
            out.append({"host": h["gpu_host"], "ready": len(used) == self.args.gpus and all(u <= THRESHOLD_MIB for u in used),
                        "used_mib": used, "server_gone": not left, "server_left": left,
                        "container_running": h["host"].ct_status(h["vmid"]) == "running"})
        return out


# --- measuring a run ----------------------------------------------------------------------------

def _process_tree(root):
    """root and its descendants, from the parent pid of every process in /proc (a process's
    /proc/<pid>/task/<tid>/children is a snapshot the kernel documents as unreliable while children
    come and go, as forked workers do)."""
    kids = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _read(f"/proc/{name}/stat")
        if not stat:
            continue
        try:
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += kids.get(pid, [])
    return tree


def _read(path, mode="r"):
    try:
        with open(path, mode) as f:  # pylint: disable=unspecified-encoding
            return f.read()
    except OSError:
        return None


def _rollup(pid):
    """(RSS KiB, PSS KiB) from /proc/<pid>/smaps_rollup."""
    text = _read(f"/proc/{pid}/smaps_rollup")
    rss = pss = 0
    for line in (text or "").splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1])
        elif line.startswith("Pss:"):
            pss = int(line.split()[1])
    return rss, pss


class MemorySampler:
    """Every `interval` s (or less often: at most 10 % of one core): the main process (ansible-playbook)
    and its forked workers (the same command line), their RSS and PSS; the peak of each, and of the
    number of workers."""

    def __init__(self, pid, interval=0.2):
        self.pid, self.interval = pid, interval
        self.cmdline = _read(f"/proc/{pid}/cmdline", "rb")
        self.peak = {"main_rss_kib": 0, "controller_pss_kib": 0, "controller_rss_sum_kib": 0, "workers": 0,
                     "descendants": 0}
        self.samples = 0
        self.series = []  # (s since start, workers, controller PSS KiB, main RSS KiB)
        self.main_cpu_s = 0.0  # the main process's own CPU time (the strategy loop), at the last sample
        self.cost_s = 0.0
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self):
        c0 = time.monotonic()
        tree = _process_tree(self.pid)
        # read again: right after the spawn the exec may not have completed (an empty command line)
        self.cmdline = _read(f"/proc/{self.pid}/cmdline", "rb") or self.cmdline
        controller = [p for p in tree if p == self.pid or (self.cmdline and _read(f"/proc/{p}/cmdline", "rb") == self.cmdline)]
        rollups = {p: _rollup(p) for p in controller}
        peak = self.peak
        peak["main_rss_kib"] = max(peak["main_rss_kib"], rollups.get(self.pid, (0, 0))[0])
        peak["controller_pss_kib"] = max(peak["controller_pss_kib"], sum(v[1] for v in rollups.values()))
        peak["controller_rss_sum_kib"] = max(peak["controller_rss_sum_kib"], sum(v[0] for v in rollups.values()))
        peak["workers"] = max(peak["workers"], len(controller) - 1)
        peak["descendants"] = max(peak["descendants"], len(tree) - 1)
        stat = _read(f"/proc/{self.pid}/stat")
        if stat:
            fields = stat.rsplit(")", 1)[1].split()
            self.main_cpu_s = max(self.main_cpu_s, (int(fields[11]) + int(fields[12])) / CLK_TCK)
        self.samples += 1
        self.series.append((round(c0 - self._t0, 2), len(controller) - 1, sum(v[1] for v in rollups.values()),
                            rollups.get(self.pid, (0, 0))[0]))
        self.cost_s += time.monotonic() - c0

    def _run(self):
        # PSS costs a walk of the page tables: the sampler keeps to a tenth of one core at most, so that
        # it takes little from the run it measures (it is not part of the CPU time measured either)
        wait = self.interval
        while not self._stop.wait(wait):
            c0 = time.monotonic()
            self.sample()
            wait = max(self.interval, 9 * (time.monotonic() - c0))

    def __enter__(self):
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# The hand-written playbook (b) and the two tasks (c) of bench_e2e.py over the fleet: every node, its own container
# (fleet_vmid, a node variable).
FLEET_VMID = 999999998  # a placeholder in bench_e2e's playbooks, replaced by the node's fleet_vmid


def fleet_playbook(method, gpus):
    """bench_e2e's (b) or (c) for every node of the fleet (hosts: proxmox_nodes, each its own CT fleet_vmid)."""
    if method == "b":
        import shlex  # pylint: disable=import-outside-toplevel
        text = bench_e2e.PLAYBOOK_B.format(vmid=FLEET_VMID, stop=shlex.quote(f"pct exec {FLEET_VMID} -- pkill -f sglang"),
                                           threshold=THRESHOLD_MIB)
    else:
        text = bench_e2e.PLAYBOOK_C.format(vmid=FLEET_VMID, gpus=gpus, stop_task="\n")
    # names are templated before a host is chosen: no host variable there
    text = text.replace(f"CT {FLEET_VMID} ", "each node's container ").replace(f"CT {FLEET_VMID}\n", "each node's container\n")
    text = text.replace(f"[{FLEET_VMID}]", '["{{ fleet_vmid }}"]').replace(str(FLEET_VMID), "{{ fleet_vmid }}")
    return text.replace("hosts: pve\n", "hosts: proxmox_nodes\n")


def pct_calls(fleet):
    return sum(len(h["host"].pct_calls()) for h in fleet.hosts)


def one_run(ws, fleet, forks, args, run_id, method="d"):
    """One run of `method` over the fleet: d predeploy (the default), b or c (fleet_playbook)."""
    size = len(fleet.hosts)
    rundir = ws.path(f"fleet-{size}/run-{run_id}-{method}-forks-{forks}")
    os.makedirs(rundir)
    servers = fleet.start_servers()
    fleet.write_interpreters(run_id)
    inventory = fleet.inventory(os.path.join(rundir, "inventory.yml"))
    base = {k: v for k, v in os.environ.items() if k not in ("GPUSIM_DIR", "GPUSIM_VMID")}
    env = bench_e2e.ansible_env(ws, dict(base, PYTHONDONTWRITEBYTECODE="1"), args.profile_tasks)
    profile = os.path.join(rundir, "profile.json")
    env["GPUOPS_E2E_PROFILE"] = profile
    if method == "d":
        argv = [bench_e2e.ansible_playbook(), "gpuops.gpu.predeploy", "-i", inventory, "--forks", str(forks)]
    else:
        argv = [bench_e2e.ansible_playbook(), "-i", inventory, "--forks", str(forks),
                bench_e2e.write(os.path.join(rundir, f"{method}.yml"), fleet_playbook(method, args.gpus))]
    log = os.path.join(rundir, "output.log")
    pct_before = pct_calls(fleet)
    samplers = []

    def sampler(pid):
        samplers.append(MemorySampler(pid))
        return samplers[-1]

    rc, wall, cpu, t0 = bench_e2e.run_command(argv, env, rundir, args.timeout, log, during=sampler)
    pct_run = pct_calls(fleet) - pct_before
    sampled = samplers[0]
    mem = dict(sampled.peak, samples=sampled.samples, interval_s=sampled.interval, main_cpu_s=sampled.main_cpu_s,
               sampling_cost_s=sampled.cost_s, series=sampled.series)
    hosts = fleet.observe(servers)
    node_cpu, module_runs = 0.0, 0
    for h in fleet.hosts:
        c, n = benchlib.wrapper_cpu(h["cpu_log"])
        node_cpu += c
        module_runs += n
    out = bench_e2e.tail(log, 400000)
    recap = {m[0]: {"ok": int(m[1]), "changed": int(m[2]), "unreachable": int(m[3]), "failed": int(m[4])}
             for m in bench_e2e.RECAP_RE.findall(out)}
    entry = {"method": method, "pct_calls": pct_run, "hosts": size, "forks": forks, "rc": rc, "wall_s": wall, "cpu_s": cpu, "node_cpu_s": node_cpu,
             "controller_cpu_s": max(0.0, cpu - node_cpu), "module_runs": module_runs,
             "cpu_per_host_s": cpu / size, "controller_cpu_per_host_s": max(0.0, cpu - node_cpu) / size,
             "node_cpu_per_host_s": node_cpu / size, "memory": mem,
             # the main process alone (templating, the strategy loop, callbacks): one core at most
             "main_cpu_s": mem["main_cpu_s"], "main_cpu_per_host_s": mem["main_cpu_s"] / size,
             "ready": sum(h["ready"] for h in hosts), "server_gone": sum(h["server_gone"] for h in hosts),
             "containers_running": sum(h["container_running"] for h in hosts),
             "failed_hosts": sorted(k for k, v in recap.items() if v["failed"] or v["unreachable"]),
             "recap_hosts": len(recap), "per_host": hosts}
    if rc != 0 or entry["ready"] != size:
        entry["output_tail"] = out[-4000:]
    prof = bench_e2e.read_profile(profile, t0, wall)
    if prof is not None:
        entry["profile"] = prof
    return entry


def forks_for(size, spec):
    out = []
    for item in spec:
        forks = size if item == "hosts" else min(int(item), size)
        if forks not in out:
            out.append(forks)
    return out


@contextlib.contextmanager
def signals_held():
    """Tear down without being interrupted half-way by a second SIGTERM (run.py sends one, then waits)."""
    sigs = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def measure_size(ws, size, args):
    runs = []
    stack = contextlib.ExitStack()
    try:
        t0 = time.monotonic()
        fleet = Fleet(ws, stack, size, args)
        setup_s = time.monotonic() - t0
        for forks in forks_for(size, args.forks):
            print(f"  {size} host(s), forks {forks}:", end=" ", flush=True)
            entry = one_run(ws, fleet, forks, args, len(runs))
            entry["fleet_setup_s"] = setup_s
            runs.append(entry)
            print(f"rc {entry['rc']}, {entry['wall_s']:.2f} s, CPU {entry['cpu_s']:.1f} s"
                  f" ({entry['cpu_per_host_s']:.2f} s per host), ready {entry['ready']}/{size},"
                  f" controller peak PSS {entry['memory']['controller_pss_kib'] / 1024:.0f} MiB", flush=True)
    finally:
        with signals_held():
            t1 = time.monotonic()
            stack.close()
            if runs:
                runs[-1]["fleet_teardown_s"] = time.monotonic() - t1
    return runs


def task_rows(entry, top=8):
    """The slowest tasks of a run (all hosts together: with the linear strategy a task ends when every host has run it)."""
    prof = entry.get("profile")
    if not prof:
        return []
    rows = sorted(prof["tasks"], key=lambda t: -t["seconds"])[:top]
    return [[t["task"][:90], f"{t['seconds']:.2f} s"] for t in rows]


def summarize(runs, args):
    f = benchlib.fmt
    one = {r["forks"]: r for r in runs if r["hosts"] == 1}
    base = (one.get(1) or {}).get("wall_s")
    rows, summary = [], []
    for r in runs:
        growth = benchlib.ratio(r["wall_s"], base)
        s = {"hosts": r["hosts"], "forks": r["forks"], "wall_s": r["wall_s"], "ratio_to_one_host": growth,
             "cpu_s": r["cpu_s"], "cpu_per_host_s": r["cpu_per_host_s"],
             "controller_cpu_per_host_s": r["controller_cpu_per_host_s"], "node_cpu_per_host_s": r["node_cpu_per_host_s"],
             "main_cpu_per_host_s": r["main_cpu_per_host_s"],
             "main_rss_mib": r["memory"]["main_rss_kib"] / 1024, "controller_pss_mib": r["memory"]["controller_pss_kib"] / 1024,
             "workers_peak": r["memory"]["workers"], "ready": r["ready"], "server_gone": r["server_gone"],
             "failed_hosts": len(r["failed_hosts"]), "rc": r["rc"]}
        summary.append(s)
        rows.append([r["hosts"], r["forks"], f"{r['wall_s']:.2f} s", f(growth, "x"), f"{r['cpu_s']:.1f} s",
                     f"{r['cpu_per_host_s']:.2f} s", f"{r['controller_cpu_per_host_s']:.2f} s",
                     f"{r['main_cpu_per_host_s']:.2f} s", f"{r['node_cpu_per_host_s']:.2f} s",
                     f"{s['main_rss_mib']:.0f} MiB", f"{s['controller_pss_mib']:.0f} MiB",
                     s["workers_peak"], f"{r['ready']}/{r['hosts']}", f"{r['server_gone']}/{r['hosts']}",
                     len(r["failed_hosts"]), r["rc"]])
    return rows, summary


def run(args):
    started, tree = benchlib.machine(), bench_e2e.working_tree()
    runs = []
    with benchlib.workspace("gpubench-fleet-") as ws:
        for size in args.sizes:
            runs += measure_size(ws, size, args)
    rows, summary = summarize(runs, args)
    benchlib.table(f"Fleet: ansible-playbook gpuops.gpu.predeploy over N simulated nodes ({args.gpus} x H200 each,"
                   f" one container with a server on its GPUs, release lag {args.lag_ms} ms), local connection, one run each",
                   ["hosts", "forks", "wall", "wall / 1 host", "CPU total", "CPU per host", "controller per host",
                    "of it main process", "modules per host", "main RSS peak", "controller PSS peak", "workers peak", "ready", "server gone",
                    "failed hosts", "rc"], rows)
    for r in runs:
        if r["failed_hosts"] or r["rc"] != 0:
            print(f"- {r['hosts']} hosts, forks {r['forks']}: rc {r['rc']}, failed/unreachable: {', '.join(r['failed_hosts'][:10])}")
    biggest = max(runs, key=lambda r: (r["hosts"], r["forks"])) if runs else None
    if biggest and biggest.get("profile"):
        benchlib.table(f"Slowest tasks, {biggest['hosts']} hosts, forks {biggest['forks']} (start-up"
                       f" {biggest['profile']['startup_s']:.2f} s, after the last task"
                       f" {biggest['profile']['after_last_task_s']:.2f} s)", ["task", "time (all hosts)"],
                       task_rows(biggest))
    target = next((s for s in summary if s["hosts"] == 32 and s["forks"] == 32), None)
    if target and target["ratio_to_one_host"] is not None:
        print(f"32 hosts / 1 host (forks 32): {target['ratio_to_one_host']:.2f}x (target <= 4)")
    result = {"name": "fleet", "smoke": args.smoke, "machine": started, "loadavg_at_end": os.getloadavg(),
              "params": {"sizes": args.sizes, "forks": args.forks, "gpus_per_host": args.gpus, "release_lag_ms": args.lag_ms,
                         "vmid_base": args.vmid_base, "worker_mib": WORKER_MIB, "timeout_s": args.timeout,
                         "profile_tasks": args.profile_tasks, "ansible_playbook": bench_e2e.ansible_playbook()},
              "working_tree": tree, "summary": summary, "runs": runs,
              "target": {"ratio_32_hosts_to_one_max": 4.0}}
    benchlib.write_json("fleet", result)
    return result


def sizes_arg(text):
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: comma list of host counts, e.g. 1,8,32,64") from None
    if not sizes or any(s < 1 or s > 100 for s in sizes):
        raise argparse.ArgumentTypeError(f"{text}: 1..100 hosts each (vmids vmid-base..vmid-base+99)")
    return sorted(set(sizes))


def forks_arg(text):
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items or any(x != "hosts" and not (x.isdigit() and int(x) > 0) for x in items):
        raise argparse.ArgumentTypeError(f"{text}: comma list of 'hosts' and numbers, e.g. hosts,8")
    return items


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help=f"quick: sizes {','.join(map(str, SMOKE_SIZES))}")
    ap.add_argument("--sizes", type=sizes_arg, help=f"host counts (default {','.join(map(str, DEFAULT_SIZES))})")
    ap.add_argument("--forks", type=forks_arg, default=["hosts", "8"],
                    help="forks settings per size: 'hosts' (forks = hosts) and numbers (default hosts,8;"
                         " one that equals another for a size runs once)")
    ap.add_argument("--gpus", type=int, default=2, help="GPUs per simulated host (default 2)")
    ap.add_argument("--lag-ms", type=int, default=1500, help="release lag of every host (default 1500)")
    ap.add_argument("--vmid-base", type=int, default=7300,
                    help="host i's container is vmid-base+i (default 7300; containers are machine-wide cgroups)")
    ap.add_argument("--timeout", type=float, help="stop a playbook run after S s (default 900; smoke 90)")
    ap.add_argument("--no-profile", dest="profile_tasks", action="store_false",
                    help="do not record the per-task times (a callback in the temp dir)")
    args = ap.parse_args(argv)
    args.sizes = args.sizes or list(SMOKE_SIZES if args.smoke else DEFAULT_SIZES)
    args.timeout = args.timeout or (90.0 if args.smoke else 900.0)
    if not 1 <= args.gpus <= 8:
        ap.error("--gpus: 1..8")
    if args.vmid_base < 100:
        ap.error("--vmid-base: a Proxmox VE vmid is 100 or more")
    benchlib.install_signal_handlers()
    try:
        run(args)
    except (KeyboardInterrupt, benchlib.Terminated) as e:
        print(f"\nstopped ({type(e).__name__} {e}): the playbook and every simulated host were torn down", file=sys.stderr)
        return 130 if isinstance(e, KeyboardInterrupt) else 143
    return 0


if __name__ == "__main__":
    sys.exit(main())
