"""End to end: what a user runs before a redeploy, side by side, each on a fresh simulated node.

The seed scenario (shared/seeds/): a Proxmox VE node `pve` with 8 x H200, CT 129 (hostname gpu-ct,
all 8 GPUs passed through) running an inference server - an API process and 8 workers holding
130,048 MiB each - and a driver that frees a process's memory 1.5 s after it exits. Three
bystanders must survive: a non-GPU `python3` in CT 129, one in CT 130 (a second container, no
GPUs; "sglang" in its command line) and one on the node (also "sglang" in its command line).
Variants: `hand` (the server started by hand) and `service` (the systemd service `sglang` under a
supervisor that respawns it, as `make demo` runs it).

Two more dimensions, one table each (ratios to (b) of the same table):
- GPU bystanders (--bystanders nvml,cuda): besides the three plain ones, two GPU processes that must
  survive unsignalled, one in CT 129 outside the server's tree (a notebook kernel), one on the node:
  `nvml` NVML clients (nvidiactl and nvidia-uvm open, no GPU node, no context), `cuda` processes
  that initialised CUDA and hold no context (every /dev/nvidiaN they see, nvidiactl, nvidia-uvm);
- connection (--connections local,ssh): `ssh` runs every method over SSH with pipelining, as root, to
  a throwaway sshd on 127.0.0.x (tests/gpusim/gpusimkit/sshd.py), a control master per run.

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
      one play on pve (service too: gpu_release stops the unit of the holders, stop_units);
- d   `ansible-playbook gpuops.gpu.predeploy -i inventory.yml`, the README inventory
      which names no service (gpu_release stops the unit of the GPU holders);
- d0  (service only) the same with `proxmox_fence_services: [sglang]` on the node;
- e   d with `--limit gpu-ct`.

Recorded per run: wall time of the command, CPU time split into the controller's and the node's
(local: getrusage(RUSAGE_CHILDREN) delta less the modules' CPU, which the inventory's interpreter
wrapper logs; ssh: the command's getrusage delta plus the ssh control master's CPU from /proc for the
controller, the sshd's own and its reaped sessions' CPU from /proc/<sshd>/stat for the node), exit
status, ready when it returned (all 8 GPUs <= 64 MiB, read by the harness from the simulator),
server gone (API + workers, by pid and start time), bystanders alive, both containers running.
Nothing asserts on time.

    .venv/bin/python benchmarks/bench_e2e.py [--smoke] [--reps N] [--methods a,b,c] [--variants hand,service]
                                             [--connections local,ssh] [--bystanders nvml,cuda]
                                             [--profile-tasks] [--timeout S]

Methods that fail are recorded (rc, ready no); one that does not return within --timeout is
stopped with its process group and not repeated. SIGTERM/SIGINT tear everything down.
"""

import argparse
import contextlib
import json
import os
import random
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import time

import benchlib

VMID = 129  # the seeds' container (--vmid); the second container is --other-vmid (default VMID + 1)
GPUS = 8
WORKER_MIB = 130048  # an SGLang worker with --mem-fraction-static 0.9 on an H200 (as make demo)
LAG_MS = 1500
THRESHOLD_MIB = 64  # the collection's default max_memory_used_mib; the hand-written loop uses the same
SERVER_NAME = "python3 -m sglang.launch_server --tp 8"
SERVICE = "sglang"
# A bystander: a non-GPU python3 that sleeps, and records every catchable signal that would end it
# (in the file named by its first argument) before it dies of it as it would have without the record.
BYSTANDER_CODE = ("import os, signal, sys, time; "
                  "h = lambda n, _f: (open(sys.argv[1], 'a').write(f'{n}\\n'), signal.signal(n, signal.SIG_DFL),"
                  " os.kill(os.getpid(), n)); "
                  "[signal.signal(s, h) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,"
                  " signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGPIPE)]; "
                  "time.sleep(3600)")

# GPU bystanders (--bystanders), two of each kind besides the three plain ones, started by the simulator
# (gpusimkit.workload): `nvml` an NVML client (nvidiactl and nvidia-uvm open, no GPU node, no context:
# --control-only), `cuda` a process that initialised CUDA and holds no context (every GPU node it can
# see, nvidiactl and nvidia-uvm; no memory: --gpus none). One in CT <vmid> outside the server's tree (a
# notebook kernel), one on the node (CT <other vmid> has no GPUs: no node to open there). Each notes
# every signal it receives (GPUSIM_LOG_SIGNALS) and then does what it would have done without the note.
NOTEBOOK = "python3 -m ipykernel_launcher -f /root/.local/share/jupyter/runtime/kernel-1.json"
BYSTANDER_KINDS = {
    "nvml": {"text": "NVML clients (nvidiactl + nvidia-uvm open, no GPU node, no context)",
             "hold": {"gpus": "none", "mib": 0, "control_only": True},
             "where": (("NVML client in CT {vmid} (notebook kernel)", "ct", NOTEBOOK),
                       ("NVML client on the node (dcgm-exporter)", "node", "dcgm-exporter"))},
    "cuda": {"text": "CUDA initialised, no context (every /dev/nvidiaN + nvidiactl + nvidia-uvm open, no memory)",
             "hold": {"gpus": "none", "mib": 0},
             "where": (("CUDA process without a context in CT {vmid} (notebook kernel)", "ct", NOTEBOOK),
                       ("CUDA process without a context on the node (sglang.check_env)", "node",
                        "python3 -m sglang.check_env"))},
}
CONNECTIONS = {
    "local": "local connection",
    "ssh": "SSH with pipelining, as root, to an sshd on 127.0.0.x",
}

METHODS = {
    "a": "seeds: shell script (kill -9 python3 in CT {vmid}, fuser -k, sleep 2, check, sleep 3, check)",
    "a0": "seeds verbatim: no service stop",
    "b": "hand-written playbook: stop, until/retries 150/delay 2 over nvidia-smi",
    "c": "gpu_release (containers: [{vmid}]) + gpu_wait_idle (expected_count: 8)",
    "d": "ansible-playbook gpuops.gpu.predeploy",
    "d0": "predeploy, proxmox_fence_services: [sglang]",
    "e": "predeploy --limit gpu-ct",
}
SERVICE_ONLY = ("a0", "d0")
VARIANTS = ("hand", "service")
SMOKE_METHODS = ("b", "c", "d")
LATENCY_METHODS = ("b", "c", "d")

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
      register: release

    - name: Wait until all {gpus} GPUs are free
      gpuops.gpu.gpu_wait_idle:
        expected_count: {gpus}
        device_files: "{{{{ gpuops_device_files }}}}"
        quiet_since: "{{{{ release.quiet_since }}}}"
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
import random
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
        self._current = {"task": task.get_name(), "role": role, "action": task.action, "start": time.monotonic()}

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


@contextlib.contextmanager
def log_signals_to(path):
    """GPUSIM_LOG_SIGNALS=path for the workloads started meanwhile (SimHost.hold builds their environment
    from os.environ): each notes every signal it receives, then does what it would have done."""
    before = os.environ.get("GPUSIM_LOG_SIGNALS")
    os.environ["GPUSIM_LOG_SIGNALS"] = path
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("GPUSIM_LOG_SIGNALS", None)
        else:
            os.environ["GPUSIM_LOG_SIGNALS"] = before


def setup(host, variant, vmids, rundir, exit_delay=None, kind=None):
    """CT <vmid> with the server, CT <other vmid>, three plain bystanders and two GPU bystanders of `kind`
    (BYSTANDER_KINDS; None: none); returns what the checks need.

    exit_delay: the server (API and workers) exits that many seconds after SIGTERM (default: at once)."""
    from gpusimkit import nspid, starttime  # pylint: disable=import-outside-toplevel,import-error

    vmid, other = vmids
    host.ct_create(vmid, hostname="gpu-ct", systemd=True)
    host.ct_start(vmid)
    host.ct_create(other, hostname=f"ct{other}", gpus=None)
    host.ct_start(other)
    kwargs = {"respawn": True, "service": SERVICE} if variant == "service" else {}
    if exit_delay is not None:
        kwargs["exit_delay"] = exit_delay
    api = host.hold(gpus="0-7", mib=WORKER_MIB, ct=vmid, tree=True, name=SERVER_NAME, **kwargs)
    gpu_procs = host.procs()[0]
    workers = sorted({p["pid"] for p in gpu_procs})
    server = {pid: starttime(pid) for pid in [api] + workers}
    py3 = python3()
    env = host.env()
    logs = {}

    def argv(name, *extra):
        logs[name] = os.path.join(rundir, f"signals-{len(logs)}.log")
        return [py3, "-c", BYSTANDER_CODE, logs[name], *extra]

    names = (f"python3 in CT {vmid}", f"python3 in CT {other} (sglang.bench_serving)",
             "python3 on the node (sglang-metrics)")
    bystanders = {
        names[0]: host.spawn(argv(names[0]), env, ct=vmid),
        names[1]: host.spawn(argv(names[1], "sglang.bench_serving"), env, ct=other),
        names[2]: host.spawn(argv(names[2], "sglang-metrics"), env),
    }
    gpu_names = []
    for label, where, cmdline in (BYSTANDER_KINDS[kind]["where"] if kind else ()):
        name = label.format(vmid=vmid)
        logs[name] = os.path.join(rundir, f"signals-{len(logs)}.log")
        with log_signals_to(logs[name]):
            bystanders[name] = host.hold(ct=vmid if where == "ct" else None, name=cmdline,
                                         **BYSTANDER_KINDS[kind]["hold"])
        gpu_names.append(name)
    by = {name: (pid, starttime(pid)) for name, pid in bystanders.items()}
    nspids = {nspid(pid) for pid in server}
    # the GPU contexts of the server: their exits (the driver's procs file) date the release exactly
    contexts = sorted({(p["pid"], p["starttime"]) for p in gpu_procs if p["used_mib"] > 0})
    return {"vmid": vmid, "other_vmid": other, "api": api, "workers": workers, "server": server,
            "server_nspids": nspids, "bystanders": by, "bystander_logs": logs, "contexts": contexts,
            "exit_delay_s": exit_delay, "gpu_bystanders": gpu_names, "bystander_kind": kind}


def pkill_is_scoped(host, env, scene):
    """`pct exec <vmid> -- pgrep -f sglang` sees exactly the server (container pids), not the bystanders
    elsewhere that have "sglang" in their command lines: pkill -f is then confined to the container."""
    proc = subprocess.run(["pct", "exec", str(scene["vmid"]), "--", "pgrep", "-f", "sglang"], env=env,
                          capture_output=True, text=True, check=False, timeout=30)
    seen = {int(x) for x in proc.stdout.split() if x.isdigit()}
    return proc.returncode == 0 and seen == scene["server_nspids"], sorted(seen)


def service_active(host, vmid):
    """`pct exec <vmid> -- systemctl is-active sglang` (the unit's files name pids of the container's namespace)."""
    proc = subprocess.run(["pct", "exec", str(vmid), "--", "systemctl", "is-active", SERVICE], env=host.env(),
                          capture_output=True, text=True, check=False, timeout=60)
    return proc.returncode == 0


def signals_received(path):
    """The signals a bystander noted: a number a line (BYSTANDER_CODE), or `<pid> <starttime> <SIGNAME>`
    (the simulator's workloads, GPUSIM_LOG_SIGNALS)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        words = line.split()
        if len(words) == 1 and words[0].isdigit():
            out.append(int(words[0]))
        elif words and words[-1].startswith("SIG"):
            try:
                out.append(int(signal.Signals[words[-1]]))
            except KeyError:
                out.append(int(words[-1][3:]) if words[-1][3:].isdigit() else 0)
    return out


def observe(host, scene):
    """The state right after the command returned, read by the harness from the simulator."""
    from gpusimkit import alive  # pylint: disable=import-outside-toplevel,import-error

    status = host.status()
    used = [g["memory_used_mib"] for g in status["gpus"]]
    holders = sorted({p["pid"] for p in status["processes"] if p["alive"]})
    left = [pid for pid, start in scene["server"].items() if alive(pid, start)]
    dead = [name for name, (pid, start) in scene["bystanders"].items() if not alive(pid, start)]
    signals = {name: signals_received(path) for name, path in scene["bystander_logs"].items()}
    running = {str(v): host.ct_status(v) == "running" for v in (scene["vmid"], scene["other_vmid"])}
    outside = sorted(set(dead) | {name for name, sigs in signals.items() if sigs}) + \
        [f"CT {v} stopped" for v, up in running.items() if not up]
    return {
        "ready": len(used) == GPUS and all(u <= THRESHOLD_MIB for u in used),
        "used_mib": used,
        "server_gone": not left,
        "server_left": left,
        "gpu_holders_alive": holders,  # a respawned server shows up here
        "respawned": bool(holders) and not left,
        "bystanders_alive": not dead,
        "bystanders_dead": dead,
        "bystander_signals": {name: sigs for name, sigs in signals.items() if sigs},
        # the GPU bystanders of --bystanders: alive and never signalled
        "gpu_bystanders_ok": not any(name in dead or signals.get(name) for name in scene["gpu_bystanders"]),
        # outside the scope (the server's processes): a bystander signalled or dead, a container stopped
        "signalled_outside": outside,
        "containers_running": running,
        # the container's systemctl (service variant): still active means it restarts the server
        "service_active": (service_active(host, scene["vmid"]) if any(s["name"] == SERVICE for s in status["services"])
                           else None),
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
    out = benchlib.modrun.controller_env(ws.colroot, ws.dir, base=env, ANSIBLE_CONFIG=cfg, ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False",
                                         ANSIBLE_LOCAL_TEMP=ws.path("ansible-local"), ANSIBLE_REMOTE_TEMP=ws.path("ansible-remote"),
                                         PYTHONDONTWRITEBYTECODE="1")
    for name in ("ANSIBLE_CALLBACKS_ENABLED", "ANSIBLE_CALLBACK_WHITELIST", "ANSIBLE_STDOUT_CALLBACK"):
        out.pop(name, None)
    if profile:
        out["ANSIBLE_CALLBACK_PLUGINS"] = ws.path("callback_plugins")
        out["ANSIBLE_CALLBACKS_ENABLED"] = "e2e_profile"
    return out


def ansible_playbook():
    path = os.path.join(benchlib.ROOT, ".venv", "bin", "ansible-playbook")
    return path if os.path.exists(path) else os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


def inventory_text(host, services, vmid, python, connection_vars=None):
    """make demo's inventory (the README's, local connection), with proxmox_fence_services set to
    `services` on pve (None: not set at all) and ansible_python_interpreter `python`; connection_vars
    (the ssh connection's) replace the local connection for every host."""
    # PyYAML: ansible-core's dependency; demo: tests/gpusim/demo.py (tests/gpusim is on sys.path)
    import yaml  # pylint: disable=import-outside-toplevel
    from demo import INVENTORY  # pylint: disable=import-outside-toplevel,import-error

    inv = yaml.safe_load(INVENTORY.format(python=python, simdir=host.dir, vmid=vmid))
    if connection_vars:
        inv["all"]["vars"].update(connection_vars)
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


def prepare(method, variant, host, rundir, scoped, scene, python, conn=None):
    """(the command line of a method, the file its stdin reads or None), and the files it needs in rundir
    (python: the inventory's interpreter; conn: the ssh connection's {"vars", "sshd"}, None: local)."""
    service = variant == "service"
    vmid = scene["vmid"]
    stop = f"pct exec {vmid} -- systemctl stop {SERVICE}"
    if method in ("a", "a0"):
        devdir = host.path("dev")
        if os.path.realpath(devdir).startswith("/dev") or not os.path.realpath(devdir).startswith(
                os.path.realpath(host.dir) + os.sep):
            raise RuntimeError(f"refusing fuser -k outside the simulated host: {devdir}")
        script = SEED_SCRIPT.format(stop=stop + "\n" if service and method == "a" else "", vmid=vmid,
                                    devglob=shlex.quote(devdir) + "/nvidia*")
        if conn is None:
            return ["bash", write(os.path.join(rundir, "seed.sh"), script)], None
        # over ssh, as the seeds run it: the node's software (the simulator's tools) first on its PATH
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(node_env(host).items()))
        return conn["sshd"].ssh_argv("bash", "-s"), write(os.path.join(rundir, "seed.sh"), exports + script)
    # The README inventory names no service (gpu_release stops the unit of each GPU holder); d0 names it.
    services = [SERVICE] if method == "d0" else None
    inventory = write(os.path.join(rundir, "inventory.yml"),
                      inventory_text(host, services, vmid, python, conn and conn["vars"]))
    argv = [ansible_playbook(), "-i", inventory]
    if method == "b":
        kill = stop if service else (f"pct exec {vmid} -- pkill -f sglang" if scoped else
                                     # not confined to the container: the pids the harness knows
                                     "kill " + " ".join(str(p) for p in sorted(scene["server"])))
        return argv + [write(os.path.join(rundir, "stop_and_wait.yml"),
                             PLAYBOOK_B.format(vmid=vmid, stop=shlex.quote(kill), threshold=THRESHOLD_MIB))], None
    if method == "c":
        stop_task = "\n"  # the service variant too: gpu_release stops the holders' unit itself (stop_units)
        return argv + [write(os.path.join(rundir, "release_and_wait.yml"),
                             PLAYBOOK_C.format(vmid=vmid, gpus=GPUS, stop_task=stop_task))], None
    argv.insert(1, "gpuops.gpu.predeploy")
    return argv + (["--limit", "gpu-ct"] if method == "e" else []), None


def node_env(host):
    """What the node's software needs in a session over SSH (on a real node it is installed system-wide):
    the simulator's tools first on PATH, its NVML library, its directory."""
    env = dict(host.env_vars(), PYTHONDONTWRITEBYTECODE="1")
    env["PATH"] = os.pathsep.join([host.path("bin"), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin",
                                   "/sbin", "/bin"])
    return env


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


def run_command(argv, env, cwd, timeout, log_path, during=None, stdin_path=None):
    """Run argv in its own session; returns (rc or "timeout", wall s, CPU s of it and its children, start).

    during: a context manager factory called with the command's pid, entered while it runs.
    stdin_path: a file for its stdin (default /dev/null)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(log_path, "wb") as log, open(stdin_path or os.devnull, "rb") as stdin:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=log,  # pylint: disable=consider-using-with
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with during(proc.pid) if during else contextlib.nullcontext():
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


def read_profile(path, t0, wall):
    """The --profile-tasks callback's file, relative to the command's start t0."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        prof = json.load(f)
    first = prof["tasks"][0]["start"] if prof["tasks"] else prof["end"]
    return {"startup_s": first - t0, "callback_loaded_s": prof["loaded"] - t0,
            "tasks": [{"task": t["task"], "role": t["role"], "action": t.get("action"), "seconds": t["seconds"]}
                      for t in prof["tasks"]],
            "after_last_task_s": t0 + wall - prof["end"]}


def run_one(ws, args, item, index, part="e2e", sshd=None):
    """One method on a fresh simulated host; never raises for the method's own failure.

    item: (rep, variant, method, connection, bystander kind, exit delay); the exit delay: the server takes
    that long to exit after SIGTERM (the latency part's random phase). sshd: the throwaway sshd (ssh)."""
    rep, variant, method, connection, kind, exit_delay = item
    rundir = ws.path(f"{part}-{index:03d}-{connection}-{kind}-{variant}-{method}")
    os.makedirs(rundir)
    entry = {"variant": variant, "method": method, "rep": rep, "order": index, "connection": connection,
             "bystanders": kind}
    with benchlib.sim_host(gpus=GPUS, release_lag_ms=LAG_MS) as host:
        scene = setup(host, variant, (args.vmid, args.other_vmid), rundir, exit_delay, kind)
        if exit_delay is not None:
            entry["server_exit_delay_s"] = exit_delay
        env = ansible_env(ws, dict(host.env(), PYTHONDONTWRITEBYTECODE="1"), args.profile_tasks)
        scoped = None
        if method == "b" and variant == "hand":
            scoped, seen = pkill_is_scoped(host, env, scene)
            entry["pkill_scope"] = {"confined_to_ct": scoped, "pgrep_in_ct": seen,
                                    "server_nspids": sorted(scene["server_nspids"])}
        # the inventory's interpreter: Python, with each module's CPU time recorded (the split below); over
        # SSH it also sets the node's environment (the session's is sshd's, not the controller's)
        conn = None
        if connection == "ssh":
            tag = f"r{index}"  # a control master of this run's own: every run connects afresh
            conn = {"sshd": sshd, "tag": tag, "vars": sshd.vars(pipelining=True, tag=tag)}
            env.update(ANSIBLE_PIPELINING="True", ANSIBLE_HOST_KEY_CHECKING="False")
        python = benchlib.interpreter_wrapper(os.path.join(rundir, "python"), "pve and gpu-ct",
                                              env_vars=node_env(host) if conn else None)
        argv, stdin_path = prepare(method, variant, host, rundir, scoped, scene, python, conn)
        profile = os.path.join(rundir, "profile.json")
        env["GPUOPS_E2E_PROFILE"] = profile
        log = os.path.join(rundir, "output.log")
        if conn:
            sshd.wait_sessions_ended()
            node_before = sshd.cpu_of_sessions()
        pct_before = len(host.pct_calls())
        with benchlib.ExitWatcher(host, scene["contexts"]) as exits:
            rc, wall, cpu, t0 = run_command(argv, env, rundir, args.timeout, log, stdin_path=stdin_path)
        # the pct processes the method started (the simulator's pct counts its invocations)
        entry.update({"rc": rc, "wall_s": wall, "pct_calls": len(host.pct_calls()) - pct_before})
        modules_cpu, runs = benchlib.wrapper_cpu(python + ".cpu")
        if conn:
            # the controller: ansible-playbook, its workers, the ssh clients (the command's children) and the
            # control master (a daemon: read from /proc just before it is closed); the node: everything that
            # ran under sshd (its session processes, the shells, the modules and what they ran)
            master_cpu = sshd.close_masters(conn["tag"])
            ended = sshd.wait_sessions_ended()
            node_cpu = sshd.cpu_of_sessions() - node_before
            entry.update({"cpu_s": cpu + master_cpu + node_cpu, "controller_cpu_s": cpu + master_cpu,
                          "ssh_master_cpu_s": master_cpu, "node_cpu_s": node_cpu, "modules_cpu_s": modules_cpu,
                          "module_runs": runs, "node_cpu_complete": ended})
        elif method in ("a", "a0"):  # no controller: the script runs on the node
            entry.update({"cpu_s": cpu, "node_cpu_s": cpu, "controller_cpu_s": None, "module_runs": 0})
        else:  # the modules and what they ran (nvidia-smi, pct); the rest is ansible-playbook and its workers
            entry.update({"cpu_s": cpu, "node_cpu_s": modules_cpu, "modules_cpu_s": modules_cpu,
                          "controller_cpu_s": max(0.0, cpu - modules_cpu), "module_runs": runs})
        entry.update(observe(host, scene))
        freed = exits.freed_at(LAG_MS / 1000.0)
        entry["memory_freed_after_start_s"] = None if freed is None else freed - t0
        # detection latency: from the moment the last GPU's memory is freed to the command's exit
        entry["latency_s"] = None if freed is None else t0 + wall - freed
        out = tail(log, 200000)
        entry["recap"] = {m[0]: {"ok": int(m[1]), "changed": int(m[2]), "failed": int(m[4])}
                          for m in RECAP_RE.findall(out)}
        if method in ("a", "a0"):
            entry["seed_counts"] = [int(x) for x in out.split() if x.isdigit()][-2:]
        if rc != 0 or not entry["ready"]:
            entry["output_tail"] = out[-3000:]
        entry["profile"] = read_profile(profile, t0, wall)
        if entry["profile"] is None:
            del entry["profile"]
        if method in IDLE_METHODS and args.idle_run and conn is None and rc == 0:
            entry["idle"] = idle_run(host, argv, env, rundir, args, python)
    return entry


IDLE_METHODS = ("d",)


def idle_run(host, argv, env, rundir, args, python):
    """The same command again on the same node, right after it: nothing left to release (the second run of
    `make demo`). Its wall, controller CPU and pct processes, and its wall's ratio to the first run's."""
    modules_before, _runs = benchlib.wrapper_cpu(python + ".cpu")
    pct_before = len(host.pct_calls())
    rc, wall, cpu, _t0 = run_command(argv, env, rundir, args.timeout, os.path.join(rundir, "output-idle.log"))
    modules_cpu, _runs = benchlib.wrapper_cpu(python + ".cpu")
    modules_cpu -= modules_before
    status = host.status()
    return {"rc": rc, "wall_s": wall, "controller_cpu_s": max(0.0, cpu - modules_cpu), "node_cpu_s": modules_cpu,
            "pct_calls": len(host.pct_calls()) - pct_before,
            "ready": all(g["memory_used_mib"] <= THRESHOLD_MIB for g in status["gpus"])}


# --- the run and the tables -----------------------------------------------------------------------

# The scenario has one GPU node: the controller's CPU per host is that of the whole run (bench_fleet.py
# measures how it grows with many hosts).
HOSTS = 1


def combinations(args):
    """[(connection, bystander kind)] of this run, in the order of the options."""
    return [(c, k) for c in args.connections for k in args.bystanders]


def plan(args):
    """[(rep, variant, method, connection, kind, None)], round-robin: every method once per repetition,
    connection and bystander kind, the order rotated."""
    out = []
    for rep in range(args.reps):
        for connection, kind in combinations(args):
            for variant in args.variants:
                methods = [m for m in args.methods if variant == "service" or m not in SERVICE_ONLY]
                shift = rep % len(methods) if methods else 0
                out += [(rep, variant, m, connection, kind, None) for m in methods[shift:] + methods[:shift]]
    return out


def latency_plan(args):
    """[(rep, "hand", method, connection, kind, server exit delay)]: the hand variant, the first connection
    and bystander kind, round-robin, one random delay per repetition (the same for every method of it)."""
    rng = random.Random(args.seed)
    out = []
    methods = list(args.latency_methods)
    connection, kind = combinations(args)[0]
    for rep in range(args.latency_reps):
        delay = round(rng.uniform(0.0, args.shutdown_max), 3)
        shift = rep % len(methods)
        out += [(rep, "hand", m, connection, kind, delay) for m in methods[shift:] + methods[:shift]]
    return out


def method_text(method, args):
    return METHODS[method].format(vmid=args.vmid)


def combination_text(connection, kind):
    return f"{CONNECTIONS[connection]}; GPU bystanders: {kind} ({BYSTANDER_KINDS[kind]['text']})"


def of(runs, connection, kind, variant=None):
    """The runs of one connection and bystander kind (and variant)."""
    return [r for r in runs if r.get("connection", "local") == connection and r.get("bystanders") == kind
            and (variant is None or r["variant"] == variant)]


def cpu_cell(value):
    return "-" if value is None else f"{value:.2f} s"


def count_cell(count, n):
    return f"{count}/{n}"


def stats(runs, key):
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "mean": None, "n": 0}
    return {"median": benchlib.median(values), "min": min(values), "max": max(values), "mean": benchlib.mean(values),
            "n": len(values)}


def cpu_median(rs, key):
    return benchlib.median([r[key] for r in rs if r.get(key) is not None])


def method_summary(rs, base, key="wall_s"):
    """The figures of one method's runs; base: (b)'s runs of the same table (the ratios are to them)."""
    base_median = benchlib.median([r[key] for r in base if r.get(key) is not None])
    ctl = cpu_median(rs, "controller_cpu_s")
    s = {"n": len(rs), "wall": stats(rs, "wall_s"), "latency": stats(rs, "latency_s"),
         "cpu_median_s": benchlib.median([r["cpu_s"] for r in rs]),
         "controller_cpu_median_s": ctl,
         "controller_cpu_per_host_s": None if ctl is None else ctl / HOSTS,
         "node_cpu_median_s": cpu_median(rs, "node_cpu_s"),
         "modules_cpu_median_s": cpu_median(rs, "modules_cpu_s"),
         "ssh_master_cpu_median_s": cpu_median(rs, "ssh_master_cpu_s"),
         "ready": sum(r["ready"] for r in rs), "server_gone": sum(r["server_gone"] for r in rs),
         "bystanders_alive": sum(r["bystanders_alive"] for r in rs), "respawned": sum(r["respawned"] for r in rs),
         "gpu_bystanders_ok": sum(1 for r in rs if r.get("gpu_bystanders_ok", True)),
         "signalled_outside": sum(1 for r in rs if r["signalled_outside"]),
         "rc": sorted({str(r["rc"]) for r in rs}),
         "pct_calls_median": cpu_median(rs, "pct_calls"),
         "pct_calls": sorted({r["pct_calls"] for r in rs if r.get("pct_calls") is not None})}
    idle = [dict(r["idle"], first_wall_s=r["wall_s"]) for r in rs if r.get("idle")]
    if idle:
        s["idle"] = {"n": len(idle), "wall": stats(idle, "wall_s"), "controller_cpu_median_s": cpu_median(idle, "controller_cpu_s"),
                     "pct_calls_median": cpu_median(idle, "pct_calls"), "ready": sum(1 for r in idle if r["ready"]),
                     "ratio_to_first": benchlib.median([r["wall_s"] / r["first_wall_s"] for r in idle])}
    # kept under the names of the earlier JSON too
    s.update(wall_median_s=s["wall"]["median"], wall_min_s=s["wall"]["min"], wall_max_s=s["wall"]["max"])
    s["ratio_to_b"] = benchlib.ratio(s["latency" if key == "latency_s" else "wall"]["median"], base_median)
    base_ctl = cpu_median(base, "controller_cpu_s")
    s["controller_cpu_per_host_ratio_to_b"] = benchlib.ratio(ctl, base_ctl)
    return s


def range_cell(st):
    if st["median"] is None:
        return "-"
    return f"{st['median']:.2f} s ({st['min']:.2f}-{st['max']:.2f})"


def outcome_cells(s, kind):
    n = s["n"]
    return [count_cell(s["ready"], n),
            count_cell(s["server_gone"], n) + (f" (respawned {s['respawned']})" if s["respawned"] else ""),
            count_cell(s["bystanders_alive"], n), count_cell(s["gpu_bystanders_ok"], n) if kind else "-",
            count_cell(s["signalled_outside"], n), ",".join(s["rc"])]


def cpu_cells(s):
    f = benchlib.fmt
    return [cpu_cell(s["controller_cpu_per_host_s"]), f(s["controller_cpu_per_host_ratio_to_b"], "x"),
            cpu_cell(s["node_cpu_median_s"]), pct_cell(s)]


def pct_cell(s):
    """The pct processes a run of the method started: the median, and the range where runs differ."""
    values = s.get("pct_calls") or []
    if not values:
        return "-"
    return f"{s['pct_calls_median']:g}" + (f" ({values[0]}-{values[-1]})" if len(values) > 1 else "")


def summarize(runs, methods, args, kind):
    """Rows and summaries of one table: the runs of one connection, bystander kind and variant."""
    f = benchlib.fmt
    rows, summary = [], {}
    base = [r for r in runs if r["method"] == "b"]
    for m in methods:
        rs = [r for r in runs if r["method"] == m]
        if not rs:
            continue
        s = summary[m] = method_summary(rs, base)
        rows.append([f"({m}) {method_text(m, args)}", range_cell(s["wall"]), f(s["ratio_to_b"], "x")]
                    + cpu_cells(s) + outcome_cells(s, kind))
    return rows, summary


def summarize_latency(runs, args, kind):
    f = benchlib.fmt
    rows, summary = [], {}
    base = [r for r in runs if r["method"] == "b"]
    for m in args.latency_methods:
        rs = [r for r in runs if r["method"] == m]
        if not rs:
            continue
        s = summary[m] = method_summary(rs, base, key="latency_s")
        rows.append([f"({m}) {method_text(m, args)}", range_cell(s["latency"]),
                     "-" if s["latency"]["mean"] is None else f"{s['latency']['mean']:.2f} s",
                     f(s["ratio_to_b"], "x"), range_cell(s["wall"])] + cpu_cells(s) + outcome_cells(s, kind))
    return rows, summary


CPU_HEADERS = ["CPU controller per host", "its ratio to (b)", "CPU node", "pct processes"]
HEADERS_TAIL = ["ready", "server gone", "bystanders alive", "GPU bystanders alive, unsignalled",
                "signalled outside the scope", "rc"]


def notes(runs, args):
    out = []
    order = {m: i for i, m in enumerate(METHODS)}
    for r in sorted(runs, key=lambda r: (order[r["method"]], r["rep"])):
        what = []
        if r["bystanders_dead"]:
            what.append("killed bystander(s): " + ", ".join(r["bystanders_dead"]))
        for name, sigs in (r.get("bystander_signals") or {}).items():
            what.append(f"{name} received signal(s) {', '.join(signal_name(s) for s in sigs)}")
        if r["service_active"]:
            what.append(f"service {SERVICE} still active")
        if r["respawned"]:
            what.append(f"server respawned ({len(r['gpu_holders_alive'])} GPU holders alive)")
        if not all(r["containers_running"].values()):
            what.append("container(s) stopped: " + ", ".join(v for v, up in r["containers_running"].items() if not up))
        if r.get("seed_counts"):
            what.append(f"the seed's counts said {r['seed_counts']}")
        if r.get("pkill_scope") and not r["pkill_scope"]["confined_to_ct"]:
            what.append(f"pkill -f not confined to CT {args.vmid}: killed by pid instead")
        if r.get("node_cpu_complete") is False:
            what.append("an SSH session had not ended 10 s after the run: its CPU is not in CPU node")
        if r["rc"] == "timeout":
            what.append(f"no result within --timeout, stopped after {r['wall_s']:.0f} s")
        elif r["rc"] != 0:
            msg = [ln.strip() for ln in (r.get("output_tail") or "").splitlines()
                   if ln.lstrip().startswith("fatal:") or "FAILED!" in ln]
            what.append(f"failed (rc {r['rc']})" + (": " + msg[-1][:300] if msg else ""))
        if what:
            out.append(f"- ({r['method']}) rep {r['rep'] + 1}: " + "; ".join(what))
    return out


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def profile_rows(rs):
    """[task, role, median s, runs] of runs that have a profile: start-up, each task, the exit."""
    rs = [r for r in rs if r.get("profile")]
    if not rs:
        return []
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
             statistics.median(r["profile"]["startup_s"] for r in rs), len(rs)]]
    for key in names:
        rows.append([key[1], key[0], statistics.median(per[key]), len(per[key])])
    rows.append(["(after the last task: stats, exit)", "-",
                 statistics.median(r["profile"]["after_last_task_s"] for r in rs), len(rs)])
    return rows


def profile_table(runs, title, method):
    rs = [r for r in runs if r["method"] == method and r.get("profile")]
    rows = profile_rows(rs)
    if not rows:
        return
    benchlib.table(f"Per-task time, ({method}) {title}, median of {len(rs)} run(s)", ["task", "role", "median", "runs"],
                   [[name, role, f"{sec:.3f} s", n] for name, role, sec, n in rows])


def working_tree():
    """What was measured: the commit and the files changed in the working tree."""
    def git(*argv):
        proc = subprocess.run(["git", *argv], cwd=benchlib.ROOT, capture_output=True, text=True, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else None
    return {"head": git("rev-parse", "HEAD"), "changed": (git("status", "--porcelain") or "").splitlines()}


def execute(ws, args, plan_items, part, sshd=None):
    """Run (rep, variant, method, connection, kind, exit delay) items; a method that timed out is not run
    again (in that connection, bystander kind and variant)."""
    runs, skipped, timed_out = [], [], set()
    total = len(plan_items)
    for index, item in enumerate(plan_items):
        rep, variant, method, connection, kind, delay = item
        label = f"  {part} {index + 1}/{total} rep {rep + 1} {connection:<5} {kind:<4} {variant:<7} ({method})"
        print(label + (f" server exits {delay:.2f} s after SIGTERM" if delay is not None else ""), end=" ", flush=True)
        if (variant, method, connection, kind) in timed_out:  # a hang costs --timeout once, not once per repetition
            skipped.append({"variant": variant, "method": method, "rep": rep, "connection": connection,
                            "bystanders": kind})
            print("skipped: it timed out in an earlier repetition", flush=True)
            continue
        entry = run_one(ws, args, item, index, part=part, sshd=sshd)
        runs.append(entry)
        if entry["rc"] == "timeout":
            timed_out.add((variant, method, connection, kind))
        latency = entry.get("latency_s")
        print(f"rc {entry['rc']}, {entry['wall_s']:.2f} s"
              + (f", {latency:.2f} s after the memory was freed" if latency is not None else "")
              + f", ready {benchlib.fmt(entry['ready'])}", flush=True)
    return runs, skipped


def variant_text(variant):
    return "supervised service sglang, respawn" if variant == "service" else "hand-started server"


def print_e2e(runs, skipped, args):
    """The tables of every connection, bystander kind and variant; returns {connection: {kind: {variant: {method: summary}}}}."""
    summary = {}
    for connection, kind in combinations(args):
        for variant in args.variants:
            rs = of(runs, connection, kind, variant)
            rows, table_summary = summarize(rs, args.methods, args, kind)
            summary.setdefault(connection, {}).setdefault(kind, {})[variant] = table_summary
            if not rows:
                continue
            title = (f"End to end, {combination_text(connection, kind)}; variant {variant} ({variant_text(variant)}),"
                     f" {args.reps} repetition(s), a fresh simulated node per run (8 x H200, release lag {LAG_MS} ms)")
            benchlib.table(title, ["method", "wall median (min-max)", "ratio to (b)"] + CPU_HEADERS + HEADERS_TAIL, rows)
            for line in notes(rs, args):
                print(line)
            gone = [x for x in skipped if (x["variant"], x["connection"], x["bystanders"]) == (variant, connection, kind)]
            for method in sorted({x["method"] for x in gone}):
                print(f"- ({method}) {sum(1 for x in gone if x['method'] == method)}"
                      f" repetition(s) skipped: it timed out after {args.timeout:g} s")
            if args.profile_tasks:
                for method in args.methods:
                    if method not in ("a", "a0"):
                        profile_table(rs, f"{connection}, {kind}, {variant}", method)
    print_side_by_side(summary, args)
    print_idle(summary, args)
    return summary


def idle_rows(summary, args):
    """[label, first run, idle run, ratio, controller CPU of the idle run, pct processes of each] per table of (d)."""
    rows = []
    for connection, kind in combinations(args):
        for variant in args.variants:
            s = summary.get(connection, {}).get(kind, {}).get(variant, {}).get("d")
            if not s or not s.get("idle"):
                continue
            i = s["idle"]
            rows.append([f"{connection}, {kind}, {variant}", range_cell(s["wall"]), range_cell(i["wall"]),
                         benchlib.fmt(i["ratio_to_first"], "x"), cpu_cell(i["controller_cpu_median_s"]),
                         pct_cell(s), f"{i['pct_calls_median']:g}", count_cell(i["ready"], i["n"])])
    return rows


def print_idle(summary, args):
    rows = idle_rows(summary, args)
    if rows:
        benchlib.table("The idle-node run: (d) again on the same node right after it (nothing to release, the second run"
                       " of make demo); ratio: its wall to the first run's (target <= 0.5x)",
                       ["table", "(d) first run", "idle run", "ratio to the first", "idle run: CPU controller",
                        "pct processes, first run", "pct processes, idle run", "idle run ready"], rows)


def run_hosts(ws, args):
    """Controller CPU per host of (b), (c) and (d) over 1, 8, 32 ... simulated nodes at once (bench_fleet.Fleet:
    each node its own simulator and container, 2 x H200, a server in each; local connection, forks = hosts).
    The payload of each module is built once per run whatever the hosts: its cost per host falls with them."""
    import bench_fleet  # pylint: disable=import-outside-toplevel

    fargs = argparse.Namespace(gpus=2, lag_ms=LAG_MS, vmid_base=args.vmid_base_hosts, timeout=args.timeout * 3,
                               profile_tasks=False)
    runs = []
    for size in args.hosts:
        stack = contextlib.ExitStack()
        try:
            fleet = bench_fleet.Fleet(ws, stack, size, fargs)
            for rep in range(args.hosts_reps):
                methods = list(HOSTS_METHODS)
                shift = rep % len(methods)
                for method in methods[shift:] + methods[:shift]:
                    print(f"  hosts {size} rep {rep + 1} ({method})", end=" ", flush=True)
                    entry = bench_fleet.one_run(ws, fleet, size, fargs, len(runs), method=method)
                    entry["rep"] = rep
                    entry.pop("memory", None)
                    runs.append(entry)
                    print(f"rc {entry['rc']}, {entry['wall_s']:.2f} s, controller CPU per host"
                          f" {entry['controller_cpu_per_host_s']:.2f} s, pct {entry['pct_calls']},"
                          f" ready {entry['ready']}/{size}", flush=True)
        finally:
            with bench_fleet.signals_held():
                stack.close()
    summary = {}
    for size in args.hosts:
        base = benchlib.median([r["controller_cpu_per_host_s"] for r in runs if r["hosts"] == size and r["method"] == "b"])
        for method in HOSTS_METHODS:
            rs = [r for r in runs if r["hosts"] == size and r["method"] == method]
            if not rs:
                continue
            ctl = benchlib.median([r["controller_cpu_per_host_s"] for r in rs])
            summary.setdefault(str(size), {})[method] = {
                "n": len(rs), "controller_cpu_per_host_s": ctl, "ratio_to_b": benchlib.ratio(ctl, base),
                "wall_median_s": benchlib.median([r["wall_s"] for r in rs]),
                "pct_calls_per_host": benchlib.median([r["pct_calls"] / size for r in rs]),
                "ready": sum(r["ready"] for r in rs), "hosts_total": size * len(rs),
                "rc": sorted({str(r["rc"]) for r in rs})}
    rows = []
    for size, by in summary.items():
        for method, s in by.items():
            rows.append([size, f"({method}) {method_text(method, args)}", f"{s['controller_cpu_per_host_s']:.2f} s",
                         benchlib.fmt(s["ratio_to_b"], "x"), f"{s['wall_median_s']:.2f} s", f"{s['pct_calls_per_host']:g}",
                         count_cell(s["ready"], s["hosts_total"]), ",".join(s["rc"])])
    if rows:
        benchlib.table(f"Controller CPU per host at {', '.join(str(h) for h in args.hosts)} hosts at once (a simulated node"
                       f" each, 2 x H200, a server in each; local connection, forks = hosts), median of {args.hosts_reps}",
                       ["hosts", "method", "CPU controller per host", "ratio to (b)", "wall", "pct processes per host",
                        "ready", "rc"], rows)
    for r in runs:
        if r["rc"] != 0 or r["ready"] != r["hosts"]:
            print(f"- ({r['method']}) {r['hosts']} hosts rep {r['rep'] + 1}: rc {r['rc']}, ready {r['ready']}/{r['hosts']},"
                  f" failed hosts {', '.join(r['failed_hosts'][:5])}")
    return {"summary": summary, "runs": [{k: v for k, v in r.items() if k not in ("per_host", "output_tail")}
                                         for r in runs]}


HOSTS_METHODS = ("b", "c", "d")


def side_by_side_rows(summary, args):
    """[(variant, method) label, then per (connection, kind): wall (ratio), controller CPU per host (ratio)]."""
    f = benchlib.fmt
    rows = []
    for variant in args.variants:
        for m in METHODS:
            cells, seen = [], False
            for connection, kind in combinations(args):
                s = summary.get(connection, {}).get(kind, {}).get(variant, {}).get(m)
                seen = seen or s is not None
                if s is None:
                    cells += ["-", "-", "-"]
                    continue
                ok = s["ready"] == s["n"] and s["bystanders_alive"] == s["n"] and not s["signalled_outside"]
                cells += [f"{range_cell(s['wall']).split(' (')[0]} ({f(s['ratio_to_b'], 'x')})" + ("" if ok else " !"),
                          f"{cpu_cell(s['controller_cpu_per_host_s'])} ({f(s['controller_cpu_per_host_ratio_to_b'], 'x')})",
                          pct_cell(s)]
            if seen:
                rows.append([f"{variant} ({m})"] + cells)
    return rows


def print_side_by_side(summary, args):
    rows = side_by_side_rows(summary, args)
    if not rows:
        return
    headers = ["variant (method)"]
    for connection, kind in combinations(args):
        headers += [f"{connection}, {kind}: wall median (ratio to b)", f"{connection}, {kind}: CPU controller per host (ratio)",
                    f"{connection}, {kind}: pct processes"]
    benchlib.table(f"Side by side, {args.reps} repetition(s): medians, ratios to (b) of the same connection, bystander"
                   " kind and variant (! = a run not ready, a bystander dead or signalled: see the notes above)",
                   headers, rows)


def print_latency(runs, skipped, args):
    connection, kind = combinations(args)[0]
    rows, summary = summarize_latency(runs, args, kind)
    if not rows:
        return summary
    benchlib.table(f"Detection latency: from the moment the last GPU's memory is freed to the command's exit,"
                   f" {combination_text(connection, kind)};"
                   f" hand variant, {args.latency_reps} repetition(s), the server exiting a random 0..{args.shutdown_max:g} s"
                   f" after SIGTERM (release lag {LAG_MS} ms)",
                   ["method", "latency median (min-max)", "latency mean", "ratio to (b)", "wall median (min-max)"]
                   + CPU_HEADERS + HEADERS_TAIL, rows)
    for line in notes(runs, args):
        print(line)
    for method in sorted({x["method"] for x in skipped}):
        print(f"- ({method}) {sum(1 for x in skipped if x['method'] == method)} repetition(s) skipped:"
              f" it timed out after {args.timeout:g} s")
    return summary


def profiles_of(runs, args, connection, kind):
    """Per-task medians ([task, role, seconds, runs]) of each Ansible method that ran with --profile-tasks."""
    return {v: {m: profile_rows([r for r in of(runs, connection, kind, v) if r["method"] == m])
                for m in args.methods if m not in ("a", "a0")} for v in args.variants}


def run(args):
    tree, started = working_tree(), benchlib.machine()
    first = combinations(args)[0]
    with contextlib.ExitStack() as stack:
        ws = stack.enter_context(benchlib.workspace("gpubench-e2e-"))
        sshd = None
        if "ssh" in args.connections and (args.reps or args.latency_reps):
            from gpusimkit import throwaway_sshd  # pylint: disable=import-outside-toplevel,import-error
            sshd = stack.enter_context(throwaway_sshd())
            print(f"sshd: {sshd.address}:{sshd.port} (root, key {os.path.basename(sshd.key)} in {sshd.root})", flush=True)
        runs, skipped = execute(ws, args, plan(args), "e2e", sshd)
        summary_by = print_e2e(runs, skipped, args) if runs else {}
        latency_runs, latency_skipped = execute(ws, args, latency_plan(args), "latency", sshd)
        latency = print_latency(latency_runs, latency_skipped, args) if latency_runs else {}
        hosts = run_hosts(ws, args) if args.hosts and args.hosts_reps else {}
    result = {"name": "e2e", "smoke": args.smoke, "machine": started, "loadavg_at_end": os.getloadavg(),
              "params": {"reps": args.reps, "variants": args.variants, "methods": args.methods, "gpus": GPUS,
                         "worker_mib": WORKER_MIB, "release_lag_ms": LAG_MS, "threshold_mib": THRESHOLD_MIB,
                         "timeout_s": args.timeout, "profile_tasks": args.profile_tasks, "vmid": args.vmid,
                         "other_vmid": args.other_vmid, "ansible_playbook": ansible_playbook(),
                         "methods_text": {m: method_text(m, args) for m in METHODS},
                         "connections": args.connections, "bystanders": args.bystanders,
                         "connections_text": {c: CONNECTIONS[c] for c in args.connections},
                         "bystanders_text": {k: BYSTANDER_KINDS[k]["text"] for k in args.bystanders},
                         "hosts": HOSTS,
                         "latency_reps": args.latency_reps, "latency_methods": args.latency_methods,
                         "latency_connection": first[0], "latency_bystanders": first[1],
                         "shutdown_max_s": args.shutdown_max, "seed": args.seed},
              "working_tree": tree,
              # the first connection and bystander kind, in the shape of the earlier JSON: {variant: {method: ...}}
              "summary": summary_by.get(first[0], {}).get(first[1], {}),
              # every table: {connection: {bystander kind: {variant: {method: ...}}}}
              "summary_by": summary_by, "runs": runs, "skipped": skipped,
              "profiles": profiles_of(runs, args, *first),
              "profiles_by": {c: {k: profiles_of(runs, args, c, k) for k in args.bystanders} for c in args.connections},
              "latency": {"summary": latency, "runs": latency_runs, "skipped": latency_skipped},
              "hosts_part": dict(hosts, sizes=args.hosts, reps=args.hosts_reps)}
    benchlib.write_json("e2e", result)
    return result


def csv_list(text, choices, what):
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in choices]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"{what}: {', '.join(bad) or '(none)'} not in {', '.join(choices)}")
    return items


def vmid_arg(text):
    value = int(text)
    if not 100 <= value <= 999999999:
        raise argparse.ArgumentTypeError(f"{text}: a Proxmox VE vmid is 100..999999999")
    return value


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help=f"quick: 1 repetition, both variants, methods {','.join(SMOKE_METHODS)}, the local connection"
                         " and nvml bystanders only; 1 latency repetition")
    ap.add_argument("--reps", type=int, help="repetitions of the end-to-end part (default 5; smoke 1; 0: skip it)")
    ap.add_argument("--methods", type=lambda t: csv_list(t, tuple(METHODS), "--methods"),
                    help=f"comma list of {','.join(METHODS)} (default all; a0 and d0 run in the service variant only)")
    ap.add_argument("--variants", type=lambda t: csv_list(t, VARIANTS, "--variants"), help="hand,service (default both)")
    ap.add_argument("--connections", type=lambda t: csv_list(t, tuple(CONNECTIONS), "--connections"),
                    help="local,ssh (default both; smoke: local): ssh runs every method over SSH with pipelining, as"
                         " root, to a throwaway sshd on 127.0.0.x (gpusimkit.sshd; needs root and openssh-server)")
    ap.add_argument("--bystanders", type=lambda t: csv_list(t, tuple(BYSTANDER_KINDS), "--bystanders"),
                    help="nvml,cuda (default both; smoke: nvml): the kind of the two GPU bystanders (in CT --vmid and"
                         " on the node) besides the three plain python3 ones; one table per connection and kind")
    ap.add_argument("--latency-reps", type=int,
                    help="repetitions of the detection-latency part (default 10; smoke 1; 0: skip it)")
    ap.add_argument("--latency-methods", type=lambda t: csv_list(t, LATENCY_METHODS, "--latency-methods"),
                    help=f"comma list of {','.join(LATENCY_METHODS)} (default all three; the ratios are to b)")
    ap.add_argument("--shutdown-max", type=float, default=2.0,
                    help="latency part: the server exits a random 0..S s after SIGTERM (default 2, the hand-written"
                         " loop's delay: a random phase of its polls)")
    ap.add_argument("--seed", type=int, default=1, help="random seed of the latency part's exit delays (default 1)")
    ap.add_argument("--vmid", type=vmid_arg, default=VMID,
                    help=f"the server's container (default {VMID}, the seeds'); containers are machine-wide cgroups"
                         " (lxc/<vmid>): pick one no one else uses")
    ap.add_argument("--other-vmid", type=vmid_arg, help="the second container, without GPUs (default --vmid + 1)")
    ap.add_argument("--timeout", type=float,
                    help="stop a method's command after S seconds, recorded as rc 'timeout', and skip its later"
                         " repetitions (default 120; smoke 30). A method that works returns in a few seconds; one"
                         " that never sees the GPUs free would wait 300 s (its own timeout)")
    ap.add_argument("--profile-tasks", action="store_true",
                    help="record each Ansible task's time (a callback in the temp dir) and print a per-task table")
    ap.add_argument("--hosts", type=lambda t: [int(x) for x in t.split(",") if x.strip()],
                    help="the controller-CPU part: (b), (c), (d) over that many simulated nodes at once (default 1,8,32;"
                         " smoke: none; '' or 0 reps: skip it)")
    ap.add_argument("--hosts-reps", type=int, default=1, help="repetitions of the controller-CPU part (default 1)")
    ap.add_argument("--vmid-base-hosts", type=vmid_arg, default=7300,
                    help="the controller-CPU part's containers: CT N, N+1, ... (default 7300, bench_fleet's)")
    ap.add_argument("--no-idle-run", dest="idle_run", action="store_false",
                    help="do not run (d) a second time on the same node (the idle-node run)")
    args = ap.parse_args(argv)
    args.hosts = args.hosts if args.hosts is not None else ([] if args.smoke else [1, 8, 32])
    args.reps = args.reps if args.reps is not None else (1 if args.smoke else 5)
    args.latency_reps = args.latency_reps if args.latency_reps is not None else (1 if args.smoke else 10)
    args.timeout = args.timeout or (30.0 if args.smoke else 120.0)
    args.methods = args.methods or list(SMOKE_METHODS if args.smoke else METHODS)
    args.latency_methods = args.latency_methods or list(LATENCY_METHODS)
    args.variants = args.variants or list(VARIANTS)
    args.connections = args.connections or (["local"] if args.smoke else list(CONNECTIONS))
    args.bystanders = args.bystanders or (["nvml"] if args.smoke else list(BYSTANDER_KINDS))
    args.other_vmid = args.other_vmid or args.vmid + 1
    if args.other_vmid == args.vmid:
        ap.error("--other-vmid must differ from --vmid")
    if args.reps < 0 or args.latency_reps < 0 or args.shutdown_max < 0:
        ap.error("--reps, --latency-reps and --shutdown-max must be >= 0")
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
