"""End to end: what a user runs before a redeploy, side by side, each on a fresh simulated node.

The seed scenario (shared/seeds/): a Proxmox VE node `pve` with 8 x H200, CT 129 (hostname gpu-ct,
all 8 GPUs passed through) running an inference server - an API process and 8 workers holding
130,048 MiB each - and a driver that frees a process's memory 1.5 s after it exits. Three
bystanders must survive: a non-GPU `python3` in CT 129, one in CT 130 (a second container, no
GPUs; "sglang" in its command line) and one on the node (also "sglang" in its command line).
Variants: `hand` (the server started by hand) and `service` (the systemd service `sglang` under a
supervisor that respawns it, as `make demo` runs it).

Methods (every run on a fresh host; round-robin, the order rotated per repetition):

- a   the seeds' commands as a shell script: `pct exec 129 -- bash -c "ps aux | grep python3 |
      grep -v grep | awk '{print $2}' | xargs -r kill -9"`, `fuser -k <simdir>/dev/nvidia*`,
      `sleep 2`, `nvidia-smi | grep 0MiB | wc -l`, `sleep 3`, the count again; the service variant
      runs `pct exec 129 -- systemctl stop sglang` first (the seeds do not: that is `a0`);
- a0  (service only) the seeds' commands exactly, without stopping the service;
- b   a hand-written playbook: a shell task that stops the server (`pct exec 129 -- pkill -f
      sglang`, scoped to the container's PID namespace - checked before each run; service:
      `pct exec 129 -- systemctl stop sglang`), then `nvidia-smi --query-gpu=memory.used` with
      `until: all <= 64`, `retries: 150`, `delay: 2`;
- c   gpuops.gpu.gpu_release (containers: [129]) + gpuops.gpu.gpu_wait_idle (expected_count: 8) in
      one play on pve (service: after a command task that stops the service, as in b);
- d   `ansible-playbook gpuops.gpu.predeploy -i inventory.yml`, the README inventory
      (service: `proxmox_fence_services: [sglang]`);
- d0  (service only) the same with `proxmox_fence_services: []`;
- e   d with `--limit gpu-ct`.

Recorded per run: wall time of the command, CPU time of it and everything it ran
(getrusage(RUSAGE_CHILDREN) delta; local connection, so controller and target alike), exit
status, ready when it returned (all 8 GPUs <= 64 MiB, read by the harness from the simulator),
server gone (API + workers, by pid and start time), bystanders alive, both containers running.
Nothing asserts on time.

    .venv/bin/python benchmarks/bench_e2e.py [--smoke] [--reps N] [--methods a,b,c] [--variants hand,service]
                                             [--profile-tasks] [--timeout S]

Methods that fail are recorded (rc, ready no); one that does not return within --timeout is
stopped with its process group and not repeated. SIGTERM/SIGINT tear everything down.
"""

import argparse
import json
import os
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import time

import benchlib

VMID = 129
OTHER_VMID = 130
GPUS = 8
WORKER_MIB = 130048  # an SGLang worker with --mem-fraction-static 0.9 on an H200 (as make demo)
LAG_MS = 1500
THRESHOLD_MIB = 64  # the collection's default max_memory_used_mib; the hand-written loop uses the same
SERVER_NAME = "python3 -m sglang.launch_server --tp 8"
SERVICE = "sglang"
SLEEP_CODE = "import time; time.sleep(3600)"

METHODS = {
    "a": "seeds: shell script (kill -9 python3 in CT 129, fuser -k, sleep 2, check, sleep 3, check)",
    "a0": "seeds verbatim: no service stop",
    "b": "hand-written playbook: stop, until/retries 150/delay 2 over nvidia-smi",
    "c": "gpu_release (containers: [129]) + gpu_wait_idle (expected_count: 8)",
    "d": "ansible-playbook gpuops.gpu.predeploy",
    "d0": "predeploy, proxmox_fence_services: []",
    "e": "predeploy --limit gpu-ct",
}
SERVICE_ONLY = ("a0", "d0")
VARIANTS = ("hand", "service")
SMOKE_METHODS = ("b", "c", "d")

PLAYBOOK_B = """\
# What users write today: stop the server, then poll nvidia-smi until every GPU is free.
- name: Stop the inference server in CT {vmid} and wait until the GPUs are free
  hosts: pve
  gather_facts: false
  tasks:
    - name: Stop the server
      ansible.builtin.shell: {stop}
      changed_when: true

    - name: Wait until every GPU is free
      ansible.builtin.command: nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits
      register: smi
      until: smi.rc == 0 and (smi.stdout_lines | map('int') | select('gt', {threshold}) | list | length == 0)
      retries: 150
      delay: 2
      changed_when: false
"""

PLAYBOOK_C = """\
# The collection's modules in one play on the node (README, "The modules in one play").
- name: Release the GPU processes of CT {vmid} and wait until the GPUs are free
  hosts: pve
  gather_facts: false
  tasks:{stop_task}
    - name: Stop exactly the processes of CT {vmid} that hold GPUs
      gpuops.gpu.gpu_release:
        containers: [{vmid}]
        device_files: "{{{{ gpuops_device_files }}}}"

    - name: Wait until all {gpus} GPUs are free
      gpuops.gpu.gpu_wait_idle:
        expected_count: {gpus}
        device_files: "{{{{ gpuops_device_files }}}}"
"""

STOP_TASK_C = """
    - name: Stop the service that would restart the server
      ansible.builtin.command: pct exec {vmid} -- systemctl stop {service}
      changed_when: true
"""

SEED_SCRIPT = """\
# The manual procedure of shared/seeds/, on the simulated node (the seeds run it over ssh).
{stop}pct exec {vmid} -- bash -c "ps aux | grep python3 | grep -v grep | awk '{{print \\$2}}' | xargs -r kill -9"
fuser -k {devglob} 2>/dev/null; sleep 2; nvidia-smi | grep "0MiB" | wc -l
sleep 3 && nvidia-smi | grep "0MiB" | wc -l
"""

# Per-task times, for --profile-tasks (ansible.posix.profile_tasks is not installed here):
# an aggregate callback that writes every task's start and duration to $GPUOPS_E2E_PROFILE.
PROFILE_CALLBACK = '''\
import json
import os
import time

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "e2e_profile"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._loaded = time.monotonic()
        self._rows = []
        self._current = None

    def _close(self):
        if self._current is not None:
            self._current["seconds"] = time.monotonic() - self._current["start"]
            self._rows.append(self._current)
            self._current = None

    def v2_playbook_on_play_start(self, play):
        self._close()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._close()
        role = task._role.get_name() if getattr(task, "_role", None) else None
        self._current = {"task": task.get_name(), "role": role, "start": time.monotonic()}

    v2_playbook_on_handler_task_start = v2_playbook_on_task_start

    def v2_playbook_on_stats(self, stats):
        self._close()
        with open(os.environ["GPUOPS_E2E_PROFILE"], "w", encoding="utf-8") as f:
            json.dump({"loaded": self._loaded, "end": time.monotonic(), "tasks": self._rows}, f)
'''


# --- the scenario -----------------------------------------------------------------------------

def python3():
    """An interpreter whose command line says python3, as the container's Python does."""
    candidate = os.path.join(os.path.dirname(sys.executable), "python3")
    return candidate if os.path.exists(candidate) else sys.executable


def setup(host, variant):
    """CT 129 with the server, CT 130, three bystanders; returns what the checks need."""
    from gpusimkit import cgroups, container, proctools  # pylint: disable=import-outside-toplevel,import-error

    host.ct_create(VMID, hostname="gpu-ct")
    host.ct_start(VMID)
    host.ct_create(OTHER_VMID, hostname="ct130", gpus=None)
    host.ct_start(OTHER_VMID)
    kwargs = {"respawn": True, "service": SERVICE} if variant == "service" else {}
    api = host.hold(gpus="0-7", mib=WORKER_MIB, ct=VMID, tree=True, name=SERVER_NAME, **kwargs)
    workers = sorted({p["pid"] for p in host.procs()[0]})
    server = {pid: proctools.starttime(pid) for pid in [api] + workers}
    py3 = python3()
    env = host.env()
    bystanders = {
        f"python3 in CT {VMID}": container.spawn(host.dir, VMID, [py3, "-c", SLEEP_CODE], env),
        f"python3 in CT {OTHER_VMID} (sglang.bench_serving)":
            container.spawn(host.dir, OTHER_VMID, [py3, "-c", SLEEP_CODE, "sglang.bench_serving"], env),
        "python3 on the node (sglang-metrics)":
            proctools.spawn_via_driver(host.dir, [py3, "-c", SLEEP_CODE, "sglang-metrics"], env,
                                       cgroup=cgroups.session_path(host.dir)),
    }
    by = {name: (pid, proctools.starttime(pid)) for name, pid in bystanders.items()}
    nspids = {proctools.nspid(pid) for pid in server}
    return {"api": api, "workers": workers, "server": server, "server_nspids": nspids, "bystanders": by}


def pkill_is_scoped(host, env, scene):
    """`pct exec 129 -- pgrep -f sglang` sees exactly the server (container pids), not the bystanders
    elsewhere that have "sglang" in their command lines: pkill -f is then confined to CT 129."""
    proc = subprocess.run(["pct", "exec", str(VMID), "--", "pgrep", "-f", "sglang"], env=env, capture_output=True,
                          text=True, check=False, timeout=30)
    seen = {int(x) for x in proc.stdout.split() if x.isdigit()}
    return proc.returncode == 0 and seen == scene["server_nspids"], sorted(seen)


def service_active(host):
    """`pct exec 129 -- systemctl is-active sglang` (the unit's files name pids of the container's namespace)."""
    proc = subprocess.run(["pct", "exec", str(VMID), "--", "systemctl", "is-active", SERVICE], env=host.env(),
                          capture_output=True, text=True, check=False, timeout=60)
    return proc.returncode == 0


def observe(host, scene):
    """The state right after the command returned, read by the harness from the simulator."""
    from gpusimkit import container, proctools  # pylint: disable=import-outside-toplevel,import-error

    status = host.status()
    used = [g["memory_used_mib"] for g in status["gpus"]]
    holders = sorted({p["pid"] for p in status["processes"] if p["alive"]})
    left = [pid for pid, start in scene["server"].items() if proctools.alive(pid, start)]
    dead = [name for name, (pid, start) in scene["bystanders"].items() if not proctools.alive(pid, start)]
    return {
        "ready": len(used) == GPUS and all(u <= THRESHOLD_MIB for u in used),
        "used_mib": used,
        "server_gone": not left,
        "server_left": left,
        "gpu_holders_alive": holders,  # a respawned server shows up here
        "respawned": bool(holders) and not left,
        "bystanders_alive": not dead,
        "bystanders_dead": dead,
        "containers_running": {str(v): container.status(host.dir, v) == "running" for v in (VMID, OTHER_VMID)},
        # the container's systemctl (service variant): still active means it restarts the server
        "service_active": (service_active(host) if any(s["name"] == SERVICE for s in status["services"]) else None),
    }


# --- the methods --------------------------------------------------------------------------------

def ansible_env(ws, env, profile):
    """One environment for every Ansible method: the working tree's collection, Ansible's files in the
    temp dir (no ~/.ansible, no retry files), an ansible.cfg of ours (no other one is read)."""
    cfg = ws.path("ansible.cfg")
    if not os.path.exists(cfg):
        with open(cfg, "w", encoding="utf-8") as f:
            f.write("[defaults]\nretry_files_enabled = False\nnocolor = True\nstdout_callback = default\n")
        os.makedirs(ws.path("callback_plugins"))
        with open(ws.path("callback_plugins/e2e_profile.py"), "w", encoding="utf-8") as f:
            f.write(PROFILE_CALLBACK)
    out = dict(env, ANSIBLE_CONFIG=cfg, ANSIBLE_HOME=ws.path("ansible-home"), ANSIBLE_COLLECTIONS_PATH=ws.colroot,
               ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False", ANSIBLE_LOCAL_TEMP=ws.path("ansible-local"),
               ANSIBLE_REMOTE_TEMP=ws.path("ansible-remote"), ANSIBLE_RETRY_FILES_ENABLED="False",
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", PYTHONDONTWRITEBYTECODE="1")
    for name in ("ANSIBLE_CALLBACKS_ENABLED", "ANSIBLE_CALLBACK_WHITELIST", "ANSIBLE_STDOUT_CALLBACK"):
        out.pop(name, None)
    if profile:
        out["ANSIBLE_CALLBACK_PLUGINS"] = ws.path("callback_plugins")
        out["ANSIBLE_CALLBACKS_ENABLED"] = "e2e_profile"
    return out


def ansible_playbook():
    path = os.path.join(benchlib.ROOT, ".venv", "bin", "ansible-playbook")
    return path if os.path.exists(path) else os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


def inventory_text(host, services):
    """make demo's inventory (the README's, local connection), with proxmox_fence_services set to
    `services` on pve (None: not set at all)."""
    # PyYAML: ansible-core's dependency; demo: tests/gpusim/demo.py (tests/gpusim is on sys.path)
    import yaml  # pylint: disable=import-outside-toplevel
    from demo import INVENTORY  # pylint: disable=import-outside-toplevel,import-error

    inv = yaml.safe_load(INVENTORY.format(python=sys.executable, simdir=host.dir, vmid=VMID))
    nodes = inv["all"]["children"]["proxmox_nodes"]["hosts"]
    pve = dict(nodes.get("pve") or {})
    pve.pop("proxmox_fence_services", None)
    if services is not None:
        pve["proxmox_fence_services"] = services
    nodes["pve"] = pve or None
    return "# make demo's inventory (tests/gpusim/demo.py), the README's topology\n" + yaml.safe_dump(inv, sort_keys=False)


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def prepare(method, variant, host, rundir, scoped, scene):
    """The command line of a method, and the files it needs in rundir."""
    service = variant == "service"
    stop = f"pct exec {VMID} -- systemctl stop {SERVICE}"
    if method in ("a", "a0"):
        devdir = host.path("dev")
        if os.path.realpath(devdir).startswith("/dev") or not os.path.realpath(devdir).startswith(
                os.path.realpath(host.dir) + os.sep):
            raise RuntimeError(f"refusing fuser -k outside the simulated host: {devdir}")
        script = SEED_SCRIPT.format(stop=stop + "\n" if service and method == "a" else "", vmid=VMID,
                                    devglob=shlex.quote(devdir) + "/nvidia*")
        return ["bash", write(os.path.join(rundir, "seed.sh"), script)]
    services = [SERVICE] if service and method in ("d", "e") else ([] if method == "d0" else None)
    inventory = write(os.path.join(rundir, "inventory.yml"), inventory_text(host, services))
    argv = [ansible_playbook(), "-i", inventory]
    if method == "b":
        kill = stop if service else (f"pct exec {VMID} -- pkill -f sglang" if scoped else
                                     # not confined to the container: the pids the harness knows
                                     "kill " + " ".join(str(p) for p in sorted(scene["server"])))
        return argv + [write(os.path.join(rundir, "stop_and_wait.yml"),
                             PLAYBOOK_B.format(vmid=VMID, stop=shlex.quote(kill), threshold=THRESHOLD_MIB))]
    if method == "c":
        stop_task = STOP_TASK_C.format(vmid=VMID, service=SERVICE) if service else "\n"
        return argv + [write(os.path.join(rundir, "release_and_wait.yml"),
                             PLAYBOOK_C.format(vmid=VMID, gpus=GPUS, stop_task=stop_task))]
    argv.insert(1, "gpuops.gpu.predeploy")
    return argv + (["--limit", "gpu-ct"] if method == "e" else [])


def stop_group(proc):
    """Our command, and what it started in its process group (its own session), by its pid."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_command(argv, env, cwd, timeout, log_path):
    """Run argv in its own session; returns (rc or "timeout", wall s, CPU s of it and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,  # pylint: disable=consider-using-with
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
            stop_group(proc)
        except BaseException:
            stop_group(proc)
            raise
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return rc, wall, cpu, t0


def tail(path, n=4000):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


RECAP_RE = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", re.M)


def run_one(ws, args, variant, method, rep, index):
    """One method on a fresh simulated host; never raises for the method's own failure."""
    rundir = ws.path(f"run-{index:03d}-{variant}-{method}")
    os.makedirs(rundir)
    entry = {"variant": variant, "method": method, "rep": rep, "order": index}
    with benchlib.sim_host(gpus=GPUS, release_lag_ms=LAG_MS) as host:
        scene = setup(host, variant)
        env = ansible_env(ws, dict(host.env(), PYTHONDONTWRITEBYTECODE="1"), args.profile_tasks)
        scoped = None
        if method == "b" and variant == "hand":
            scoped, seen = pkill_is_scoped(host, env, scene)
            entry["pkill_scope"] = {"confined_to_ct": scoped, "pgrep_in_ct": seen,
                                    "server_nspids": sorted(scene["server_nspids"])}
        argv = prepare(method, variant, host, rundir, scoped, scene)
        profile = os.path.join(rundir, "profile.json")
        env["GPUOPS_E2E_PROFILE"] = profile
        log = os.path.join(rundir, "output.log")
        rc, wall, cpu, t0 = run_command(argv, env, rundir, args.timeout, log)
        entry.update({"rc": rc, "wall_s": wall, "cpu_s": cpu})
        entry.update(observe(host, scene))
        out = tail(log, 200000)
        entry["recap"] = {m[0]: {"ok": int(m[1]), "changed": int(m[2]), "failed": int(m[4])}
                          for m in RECAP_RE.findall(out)}
        if method in ("a", "a0"):
            entry["seed_counts"] = [int(x) for x in out.split() if x.isdigit()][-2:]
        if rc != 0 or not entry["ready"]:
            entry["output_tail"] = out[-3000:]
        if os.path.exists(profile):
            with open(profile, encoding="utf-8") as f:
                prof = json.load(f)
            first = prof["tasks"][0]["start"] if prof["tasks"] else prof["end"]
            entry["profile"] = {"startup_s": first - t0, "callback_loaded_s": prof["loaded"] - t0,
                                "tasks": [{"task": t["task"], "role": t["role"], "seconds": t["seconds"]}
                                          for t in prof["tasks"]],
                                "after_last_task_s": t0 + wall - prof["end"]}
    return entry


# --- the run and the tables -----------------------------------------------------------------------

def plan(args):
    """[(rep, variant, method)], round-robin: every method once per repetition, the order rotated."""
    out = []
    for rep in range(args.reps):
        for variant in args.variants:
            methods = [m for m in args.methods if variant == "service" or m not in SERVICE_ONLY]
            shift = rep % len(methods) if methods else 0
            out += [(rep, variant, m) for m in methods[shift:] + methods[:shift]]
    return out


def summarize(runs, variant, methods):
    f = benchlib.fmt
    rows, summary = [], {}
    base = [r["wall_s"] for r in runs if r["variant"] == variant and r["method"] == "b"]
    base_median = benchlib.median(base)
    for m in methods:
        rs = [r for r in runs if r["variant"] == variant and r["method"] == m]
        if not rs:
            continue
        walls = [r["wall_s"] for r in rs]
        med = benchlib.median(walls)
        s = {"n": len(rs), "wall_median_s": med, "wall_min_s": min(walls), "wall_max_s": max(walls),
             "ratio_to_b": benchlib.ratio(med, base_median), "cpu_median_s": benchlib.median([r["cpu_s"] for r in rs]),
             "ready": sum(r["ready"] for r in rs), "server_gone": sum(r["server_gone"] for r in rs),
             "bystanders_alive": sum(r["bystanders_alive"] for r in rs), "respawned": sum(r["respawned"] for r in rs),
             "rc": sorted({str(r["rc"]) for r in rs})}
        summary[m] = s
        n = len(rs)
        rows.append([f"({m}) {METHODS[m]}", f"{med:.2f} s ({min(walls):.2f}-{max(walls):.2f})",
                     f(s["ratio_to_b"], "x"), f"{s['cpu_median_s']:.2f} s", f"{s['ready']}/{n}",
                     f"{s['server_gone']}/{n}" + (f" (respawned {s['respawned']})" if s["respawned"] else ""),
                     f"{s['bystanders_alive']}/{n}", ",".join(s["rc"])])
    return rows, summary


def notes(runs, variant):
    out = []
    order = {m: i for i, m in enumerate(METHODS)}
    for r in sorted(runs, key=lambda r: (order[r["method"]], r["rep"])):
        if r["variant"] != variant:
            continue
        what = []
        if r["bystanders_dead"]:
            what.append("killed bystander(s): " + ", ".join(r["bystanders_dead"]))
        if r["service_active"]:
            what.append(f"service {SERVICE} still active")
        if r["respawned"]:
            what.append(f"server respawned ({len(r['gpu_holders_alive'])} GPU holders alive)")
        if not all(r["containers_running"].values()):
            what.append("container(s) stopped: " + ", ".join(v for v, up in r["containers_running"].items() if not up))
        if r.get("seed_counts"):
            what.append(f"the seed's counts said {r['seed_counts']}")
        if r.get("pkill_scope") and not r["pkill_scope"]["confined_to_ct"]:
            what.append("pkill -f not confined to CT 129: killed by pid instead")
        if r["rc"] == "timeout":
            what.append(f"no result within --timeout, stopped after {r['wall_s']:.0f} s")
        elif r["rc"] != 0:
            msg = [ln.strip() for ln in (r.get("output_tail") or "").splitlines()
                   if ln.lstrip().startswith("fatal:") or "FAILED!" in ln]
            what.append(f"failed (rc {r['rc']})" + (": " + msg[-1][:300] if msg else ""))
        if what:
            out.append(f"- ({r['method']}) rep {r['rep'] + 1}: " + "; ".join(what))
    return out


def profile_table(runs, variant, method):
    rs = [r for r in runs if r["variant"] == variant and r["method"] == method and r.get("profile")]
    if not rs:
        return
    names, per = [], {}
    for r in rs:
        for t in r["profile"]["tasks"]:
            name = t["task"].split(" : ", 1)[1] if t["role"] and " : " in t["task"] else t["task"]
            key = (t["role"] or "-", name if len(name) <= 80 else name[:77] + "...")
            if key not in per:
                names.append(key)
                per[key] = []
            per[key].append(t["seconds"])
    rows = [["(start-up: interpreter, imports, inventory, playbook)", "-",
             f"{statistics.median(r['profile']['startup_s'] for r in rs):.3f} s", ""]]
    for key in names:
        rows.append([key[1], key[0], f"{statistics.median(per[key]):.3f} s", len(per[key])])
    rows.append(["(after the last task: stats, exit)", "-",
                 f"{statistics.median(r['profile']['after_last_task_s'] for r in rs):.3f} s", ""])
    benchlib.table(f"Per-task time, ({method}) {variant}, median of {len(rs)} run(s)", ["task", "role", "median", "runs"],
                   rows)


def working_tree():
    """What was measured: the commit and the files changed in the working tree."""
    def git(*argv):
        proc = subprocess.run(["git", *argv], cwd=benchlib.ROOT, capture_output=True, text=True, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else None
    return {"head": git("rev-parse", "HEAD"), "changed": (git("status", "--porcelain") or "").splitlines()}


def run(args):
    runs = []
    tree, started = working_tree(), benchlib.machine()
    timed_out, skipped = set(), []
    with benchlib.workspace("gpubench-e2e-") as ws:
        for index, (rep, variant, method) in enumerate(plan(args)):
            print(f"  rep {rep + 1}/{args.reps} {variant:<7} ({method})", end=" ", flush=True)
            if (variant, method) in timed_out:  # a hang costs --timeout once, not once per repetition
                skipped.append({"variant": variant, "method": method, "rep": rep})
                print("skipped: it timed out in an earlier repetition", flush=True)
                continue
            entry = run_one(ws, args, variant, method, rep, index)
            runs.append(entry)
            if entry["rc"] == "timeout":
                timed_out.add((variant, method))
            print(f"rc {entry['rc']}, {entry['wall_s']:.2f} s, ready {benchlib.fmt(entry['ready'])}", flush=True)
    summary = {}
    for variant in args.variants:
        rows, summary[variant] = summarize(runs, variant, args.methods)
        if not rows:
            continue
        title = (f"End to end, variant {variant} ({'supervised service sglang, respawn' if variant == 'service' else 'hand-started server'}),"
                 f" {args.reps} repetition(s), a fresh simulated node per run (8 x H200, release lag {LAG_MS} ms)")
        benchlib.table(title, ["method", "wall median (min-max)", "ratio to (b)", "CPU", "ready", "server gone",
                               "bystanders alive", "rc"], rows)
        for line in notes(runs, variant):
            print(line)
        for method in sorted({x["method"] for x in skipped if x["variant"] == variant}):
            print(f"- ({method}) {sum(1 for x in skipped if x['variant'] == variant and x['method'] == method)}"
                  f" repetition(s) skipped: it timed out after {args.timeout:g} s")
        if args.profile_tasks:
            for method in args.methods:
                if method not in ("a", "a0"):
                    profile_table(runs, variant, method)
    result = {"name": "e2e", "smoke": args.smoke, "machine": started, "loadavg_at_end": os.getloadavg(),
              "params": {"reps": args.reps, "variants": args.variants, "methods": args.methods, "gpus": GPUS,
                         "worker_mib": WORKER_MIB, "release_lag_ms": LAG_MS, "threshold_mib": THRESHOLD_MIB,
                         "timeout_s": args.timeout, "profile_tasks": args.profile_tasks,
                         "ansible_playbook": ansible_playbook(), "methods_text": METHODS},
              "working_tree": tree, "summary": summary, "runs": runs, "skipped": skipped}
    benchlib.write_json("e2e", result)
    return result


def csv_list(text, choices, what):
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in choices]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"{what}: {', '.join(bad) or '(none)'} not in {', '.join(choices)}")
    return items


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help=f"quick: 1 repetition, both variants, methods {','.join(SMOKE_METHODS)}")
    ap.add_argument("--reps", type=int, help="repetitions (default 5; smoke 1)")
    ap.add_argument("--methods", type=lambda t: csv_list(t, tuple(METHODS), "--methods"),
                    help=f"comma list of {','.join(METHODS)} (default all; a0 and d0 run in the service variant only)")
    ap.add_argument("--variants", type=lambda t: csv_list(t, VARIANTS, "--variants"), help="hand,service (default both)")
    ap.add_argument("--timeout", type=float,
                    help="stop a method's command after S seconds, recorded as rc 'timeout', and skip its later"
                         " repetitions (default 120; smoke 30). A method that works returns in a few seconds; one"
                         " that never sees the GPUs free would wait 300 s (its own timeout)")
    ap.add_argument("--profile-tasks", action="store_true",
                    help="record each Ansible task's time (a callback in the temp dir) and print a per-task table")
    args = ap.parse_args(argv)
    args.reps = args.reps or (1 if args.smoke else 5)
    args.timeout = args.timeout or (30.0 if args.smoke else 120.0)
    args.methods = args.methods or list(SMOKE_METHODS if args.smoke else METHODS)
    args.variants = args.variants or list(VARIANTS)
    benchlib.install_signal_handlers()
    try:
        run(args)
    except (KeyboardInterrupt, benchlib.Terminated) as e:
        print(f"\nstopped ({type(e).__name__} {e}): the running command, the simulated host and its processes"
              " were torn down", file=sys.stderr)
        return 130 if isinstance(e, KeyboardInterrupt) else 143
    return 0


if __name__ == "__main__":
    sys.exit(main())
