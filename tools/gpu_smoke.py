#!/usr/bin/env python
# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Smoke test of the modules on a real NVIDIA GPU host (or on the simulator): where do they differ?

    python tools/gpu_smoke.py [--json OUT] [--mib N] [--gpu I] [--simulator]

1. runs gpu_facts with backend nvml and with backend nvidia-smi (as Ansible runs a module: a fresh
   interpreter and an args file, through a temp ansible_collections/gpuops/gpu symlink to this
   checkout) and compares both, field by field, with
   ``nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used --format=csv,noheader,nounits``;
2. starts a workload that holds N MiB on GPU I (PyTorch when ``torch.cuda`` is available in the
   workload's interpreter, else cuInit/cuCtxCreate/cuMemAlloc from libcuda.so.1 through ctypes) in a
   child process, and checks that gpu_facts (both backends) sees its pid there with >= N MiB and as a
   holder of the GPU's device file;
3. runs gpu_release with ``pids: [that pid]`` (and ``tree: false``), then gpu_wait_idle on that GPU;
   an NVML poller (a child process, every 10 ms) records when the memory is free again; it reports
   signal -> process gone, signal -> memory free (NVML), and the module's detection latency
   (gpu_wait_idle's return minus the moment NVML showed the memory free);
   it also records which NVIDIA device nodes the workload holds (/proc/<pid>/fd) and on which GPUs
   NVML lists its context: the device-node rule of the holding model (CUDA opens the node of every
   GPU it can see), checked on every host this runs on;
4. prints a table and writes JSON (--json). It signals only the processes it started itself (the
   workload, through gpu_release and by pid in a ``finally``; its NVML poller).

With --simulator (or when GPUSIM_DIR is set) it starts its own simulated host instead (tests/gpusim:
8 x H200, release lag 1.5 s, in a temp dir), holds memory with a simulated workload, passes the
simulator's device files to the modules and tears the host down at the end.

Exit status: 0 all checks passed, 1 a check failed, 2 it could not run (no GPU, bad arguments).
Nothing here asserts on timing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KIT = os.path.join(ROOT, "tests", "gpusim")
FUNCTIONAL = os.path.join(ROOT, "tests", "functional")  # modrun: how a module is run
CSV_FIELDS = ("index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used")
BACKENDS = ("nvml", "nvidia-smi")
# The NVML poller holds the GPU's device files on a real host (every NVML client does): it is
# protected by this marker in its command line, so that gpu_wait_idle does not wait for it.
POLLER_MARK = "gpu-smoke-nvml-poller"
WORKLOAD_MARK = "gpu-smoke-workload"
POLL_INTERVAL_S = 0.01
SIM_GPUS = 8
SIM_MODEL = "NVIDIA H200"
SIM_RELEASE_LAG_MS = 1500
EVENT_LABELS = {"workload_ready": "workload ready", "gpu_release_start": "gpu_release start", "signal": "signal",
                "exit": "process gone", "gpu_release_end": "gpu_release end", "gpu_wait_idle_start": "gpu_wait_idle start",
                "memory_free": "memory free", "gpu_wait_idle_end": "gpu_wait_idle end"}

# Samples the GPU's used memory (NVML v2 "used", MiB, as gpu_facts reads it) every INTERVAL s and
# prints each change with its time.monotonic() (the same clock in every process of the machine).
# Stops when its stdin closes.
POLLER = r"""
import select, sys, time
import pynvml
uuid, interval = sys.argv[1], float(sys.argv[2])
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
try:
    pynvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2)
    version = pynvml.nvmlMemory_v2
except pynvml.NVMLError:
    version = None
state = {"polls": 0, "last": None}
def sample():
    used = pynvml.nvmlDeviceGetMemoryInfo(handle, version).used // 1048576
    now = time.monotonic()
    state["polls"] += 1
    if used != state["last"]:
        print("S", repr(now), used, flush=True)
        state["last"] = used
sample()
print("READY", flush=True)
while not select.select([sys.stdin], [], [], interval)[0]:
    sample()
print("END", state["polls"], flush=True)
"""

# Holds MIB MiB on the GPU that CUDA_VISIBLE_DEVICES names, then sleeps (at most LIFE s; it also
# dies with its parent). Prints "READY <method>" once the memory is allocated.
WORKLOAD = r"""
import ctypes, sys, time
mib, life = int(sys.argv[1]), float(sys.argv[2])
try:
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: never outlive the smoke test
except (OSError, AttributeError):
    pass
method, note, keep = None, "", []
try:
    import torch
    if torch.cuda.is_available():
        keep.append(torch.empty(mib * 1048576, dtype=torch.uint8, device="cuda:0"))
        torch.cuda.synchronize()
        method = "torch " + torch.__version__
    else:
        note = "torch imports but torch.cuda is not available"
except ImportError:
    note = "no torch"
if method is None:
    cuda = ctypes.CDLL("libcuda.so.1")
    def check(rc, what):
        if rc != 0:
            name = ctypes.c_char_p()
            cuda.cuGetErrorName(rc, ctypes.byref(name))
            sys.exit(f"{what} failed: CUDA error {rc} {(name.value or b'').decode()}")
    check(cuda.cuInit(0), "cuInit(0)")
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    if hasattr(cuda, "cuCtxCreate_v2"):
        check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate_v2")
    else:
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), mib * 1048576), f"cuMemAlloc_v2({mib} MiB)")
    method = "libcuda.so.1 (ctypes)" + (f"; {note}" if note else "")
print("READY", method, flush=True)
time.sleep(life)
"""


class Terminated(Exception):
    """SIGTERM/SIGHUP/SIGINT arrived: unwind so that every `finally` cleans up."""


class CannotRun(Exception):
    """The smoke test cannot run here (exit status 2)."""


def _on_signal(signum, frame):  # pylint: disable=unused-argument
    raise Terminated(f"signal {signum}")


def now():
    return time.monotonic()


def rnd(value, digits=3):
    return None if value is None else round(value, digits)


# --- running things ---------------------------------------------------------------------------

class Runner:
    """Runs the modules of this checkout, nvidia-smi and the helper processes in one environment."""

    def __init__(self, workdir, base_env, device_files):
        self.workdir = workdir
        self.colroot = os.path.join(workdir, "collections")
        os.makedirs(os.path.join(self.colroot, "ansible_collections", "gpuops"))
        os.symlink(ROOT, os.path.join(self.colroot, "ansible_collections", "gpuops", "gpu"))
        env = dict(base_env)
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([self.colroot] + parts)
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # the collection is imported through a symlink to the checkout
        self.env = env
        self.device_files = device_files
        self.count = 0

    def module(self, name, args, timeout=600):
        """(result, start, end) of one module run on the time.monotonic() clock."""
        self.count += 1
        payload = dict(args)
        if self.device_files:
            payload["device_files"] = list(self.device_files)
        if FUNCTIONAL not in sys.path:
            sys.path.insert(0, FUNCTIONAL)
        import modrun  # pylint: disable=import-outside-toplevel,import-error
        argv = modrun.module_argv(name, payload, self.workdir, tag=f"-{self.count}")
        start = now()
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)
        end = now()
        try:
            result = modrun.module_result(name, proc)
        except AssertionError:
            result = {"failed": True, "msg": f"{name} printed no JSON (rc {proc.returncode}):"
                                             f" {proc.stdout[-1500:]} {proc.stderr[-1500:]}"}
        return result, start, end

    def smi_csv(self):
        """Rows of nvidia-smi --query-gpu=CSV_FIELDS, as dicts of strings."""
        argv = ["nvidia-smi", "--query-gpu=" + ",".join(CSV_FIELDS), "--format=csv,noheader,nounits"]
        proc = subprocess.run(argv, env=dict(self.env, LC_ALL="C"), capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise CannotRun(f"{' '.join(argv)}: exit {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-500:]}")
        rows = []
        for line in proc.stdout.splitlines():
            if not line.strip():
                continue
            cells = [c.strip() for c in line.split(", ")]
            # Only the name may contain ", ": it sits between uuid and pci.bus_id.
            rows.append({"index": cells[0], "uuid": cells[1], "name": ", ".join(cells[2:-3]),
                         "pci.bus_id": cells[-3], "memory.total": cells[-2], "memory.used": cells[-1]})
        return rows


class LineReader(threading.Thread):
    """Reads a child's stdout lines in the background: (time.monotonic(), line)."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream = stream
        self.lines = []
        self.changed = threading.Condition()

    def run(self):
        for line in self.stream:
            with self.changed:
                self.lines.append((now(), line.rstrip("\n")))
                self.changed.notify_all()
        with self.changed:
            self.lines.append((now(), None))  # EOF
            self.changed.notify_all()

    def wait_for(self, prefix, timeout):
        """The first line starting with ``prefix``; None at EOF or after ``timeout``."""
        deadline = now() + timeout
        with self.changed:
            while True:
                for stamp, line in self.lines:
                    if line is None:
                        return None
                    if line.startswith(prefix):
                        return stamp, line
                left = deadline - now()
                if left <= 0:
                    return None
                self.changed.wait(left)


class Poller:
    """The NVML poller child: used MiB of one GPU, every POLL_INTERVAL_S, with timestamps."""

    def __init__(self, env, uuid):
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-c", POLLER, uuid, str(POLL_INTERVAL_S), POLLER_MARK], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.reader = LineReader(self.proc.stdout)
        self.reader.start()
        if self.reader.wait_for("READY", 60) is None:
            self.stop()
            raise CannotRun("the NVML poller did not start (pynvml cannot read this GPU?)")
        self.polls = None

    def samples(self):
        """[(t, used MiB)] - one per change."""
        out = []
        for line in [entry[1] for entry in list(self.reader.lines)]:
            if line and line.startswith("S "):
                fields = line.split()
                out.append((float(fields[1]), int(fields[2])))
        return out

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=5)
        end = [entry[1] for entry in self.reader.lines if entry[1] and entry[1].startswith("END ")]
        if end:
            self.polls = int(end[-1].split()[1])


class ExitWatcher(threading.Thread):
    """Records the moment a process exits (pidfd where the kernel allows, else /proc every 2 ms)."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.exited_at = None
        self.how = "pidfd"
        self.stat = self._stat()
        self.fd = None
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.how = "/proc poll (2 ms)"

    def _stat(self):
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
            return rest[0].decode(), int(rest[19])
        except (OSError, IndexError, ValueError):
            return None

    def _alive(self):
        stat = self._stat()
        return stat is not None and stat[0] not in ("Z", "X") and (self.stat is None or stat[1] == self.stat[1])

    def run(self):
        if self.fd is not None:
            import select  # pylint: disable=import-outside-toplevel
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            poller.poll()
            self.exited_at = now()
            os.close(self.fd)
            return
        while self._alive():
            time.sleep(0.002)
        self.exited_at = now()


# --- the hosts --------------------------------------------------------------------------------

class RealHost:
    """This machine's NVIDIA GPUs; the workload is a CUDA process this script starts."""

    mode = "gpu"

    def __init__(self, workload_python):
        self.workload_python = workload_python
        self.proc = None
        self.stderr_path = None
        self.dir = None

    def env(self):
        return dict(os.environ)

    @staticmethod
    def device_files():
        return None  # the modules' default, /dev/nvidia*

    @staticmethod
    def check():
        if not shutil.which("nvidia-smi"):
            raise CannotRun("no nvidia-smi on PATH: this is not an NVIDIA GPU host (use --simulator)")
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0 or "GPU " not in proc.stdout:
            raise CannotRun(f"nvidia-smi -L found no GPU (exit {proc.returncode}): {(proc.stdout + proc.stderr).strip()[-500:]}")

    def start_workload(self, gpu, mib, workdir):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu["uuid"], CUDA_DEVICE_ORDER="PCI_BUS_ID")
        self.stderr_path = os.path.join(workdir, "workload.stderr")
        with open(self.stderr_path, "w", encoding="utf-8") as err:
            self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                [self.workload_python, "-c", WORKLOAD, str(mib), "1800", WORKLOAD_MARK], env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True)
        reader = LineReader(self.proc.stdout)
        reader.start()
        ready = reader.wait_for("READY", 300)
        if ready is None:
            self.stop_workload()
            with open(self.stderr_path, encoding="utf-8") as f:
                detail = f.read().strip()[-1500:]
            raise RuntimeError(f"the CUDA workload did not allocate {mib} MiB (exit {self.proc.returncode}): {detail}")
        return self.proc.pid, ready[1].split(" ", 1)[1]

    def workload_alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop_workload(self):
        """SIGKILL the workload by pid if it is still alive, and reap it."""
        if self.proc is None:
            return False
        killed = False
        if self.proc.poll() is None:
            self.proc.kill()  # Popen signals only its own, unreaped child
            killed = True
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        return killed

    def describe(self, snap):
        driver = snap.get("gpu_driver") or {}
        names = sorted({g.get("name") for g in snap.get("gpu_devices") or []})
        return f"{snap.get('gpu_count')} x {', '.join(map(str, names))}, driver {driver.get('driver_version')}"

    def down(self):
        return None


class SimulatedHost(RealHost):
    """A simulated host of its own (tests/gpusim), torn down at the end."""

    mode = "simulator"

    def __init__(self):  # pylint: disable=super-init-not-called
        if KIT not in sys.path:
            sys.path.insert(0, KIT)
        from gpusimkit import SimHost  # pylint: disable=import-outside-toplevel,import-error
        self.base = tempfile.mkdtemp(prefix="gpusmoke-")  # short: the daemon's socket path limit
        try:
            self.host = SimHost.up(os.path.join(self.base, "h"), gpus=SIM_GPUS, model=SIM_MODEL,
                                   release_lag_ms=SIM_RELEASE_LAG_MS)
        except BaseException:
            shutil.rmtree(self.base, ignore_errors=True)
            raise
        self.dir = self.host.dir
        self.pid = None

    def env(self):
        return self.host.env()

    def device_files(self):
        return [self.host.path("dev", "nvidia*")]

    def check(self):
        return None

    def start_workload(self, gpu, mib, workdir):
        self.pid = self.host.hold([gpu["index"]], mib=mib)
        return self.pid, "gpusim hold (simulated workload)"

    def workload_alive(self):
        if self.pid is None:
            return False
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
        except OSError:
            return False

    def stop_workload(self):
        if self.pid is None or not self.workload_alive():
            return False
        self.host.kill(self.pid)  # refuses any pid the simulator did not start
        return True

    def describe(self, snap):
        return f"simulator {self.dir}, {super().describe(snap)}, release lag {SIM_RELEASE_LAG_MS / 1000:g} s"

    def down(self):
        report = self.host.down()
        shutil.rmtree(self.base, ignore_errors=True)
        return report


# --- the checks ---------------------------------------------------------------------------------

def fact_value(gpu, field):
    memory = gpu.get("memory") or {}
    return {"index": gpu.get("index"), "uuid": gpu.get("uuid"), "name": gpu.get("name"),
            "pci.bus_id": gpu.get("pci_bus_id"), "memory.total": memory.get("total"),
            "memory.used": memory.get("used")}[field]


def csv_value(field, text):
    if field in ("index", "memory.total", "memory.used"):
        try:
            return int(text)
        except ValueError:
            return text  # [N/A] and the like: compared as text, so they differ from a number
    return text


def verdict(field, fact, csv, tolerance):
    """('equal'|'differs', note)."""
    if fact == csv:
        return "equal", ""
    if field == "memory.used" and isinstance(fact, int) and isinstance(csv, int) and abs(fact - csv) <= tolerance:
        return "equal", f"{fact - csv:+d} MiB, tolerance {tolerance}"
    return "differs", ""


def compare(facts, csv_rows, tolerance):
    """One row per (GPU, field): the nvidia-smi CSV value and each backend's value and verdict."""
    rows = []
    by_index = {}
    for backend in BACKENDS:
        for gpu in facts[backend].get("gpu_devices") or []:
            by_index.setdefault(gpu["index"], {})[backend] = gpu
    for csv_row in csv_rows:
        index = csv_value("index", csv_row["index"])
        for field in CSV_FIELDS:
            csv = csv_value(field, csv_row[field])
            row = {"gpu": index, "field": field, "nvidia_smi_csv": csv, "equal": True}
            for backend in BACKENDS:
                gpu = by_index.get(index, {}).get(backend)
                fact = None if gpu is None else fact_value(gpu, field)
                state, note = verdict(field, fact, csv, tolerance) if gpu is not None else ("differs", "GPU missing")
                row[backend] = {"value": fact, "verdict": state, "note": note}
                row["equal"] = row["equal"] and state == "equal"
            rows.append(row)
    seen = {int(r["index"]) for r in csv_rows if r["index"].isdigit()}
    for index in sorted(set(by_index) - seen):
        rows.append({"gpu": index, "field": "index", "nvidia_smi_csv": None, "equal": False,
                     **{b: {"value": index if b in by_index[index] else None, "verdict": "differs",
                            "note": "not in nvidia-smi's list"} for b in BACKENDS}})
    return rows


def workload_seen(result, gpu_index, minor, pid, mib):
    """What one gpu_facts run says about the workload on its GPU."""
    out = {"failed": bool(result.get("failed")), "pid_reported": False, "used_mib": None, "memory_ok": False,
           "holder": False, "files": [], "busy_reasons": []}
    if result.get("failed"):
        out["msg"] = result.get("msg")
        return out
    gpus = [g for g in result["ansible_facts"]["gpu_devices"] if g["index"] == gpu_index]
    if not gpus:
        out["msg"] = f"GPU {gpu_index} is not in the facts"
        return out
    gpu = gpus[0]
    out["busy_reasons"] = gpu.get("busy_reasons") or []
    out["idle"] = gpu.get("idle")
    procs = [p for p in gpu.get("processes") or [] if p.get("pid") == pid]
    if procs:
        out["pid_reported"] = True
        out["used_mib"] = procs[0].get("used_mib")
        out["memory_ok"] = isinstance(out["used_mib"], int) and out["used_mib"] >= mib
    # The results' form: a GPU's holders are pids by evidence, each holder's details once in gpu_holder_processes.
    held = any(pid in (pids or []) for pids in (gpu.get("holders") or {}).values())
    details = (result["ansible_facts"].get("gpu_holder_processes") or {}).get(str(pid)) or {}
    files = sorted(os.path.join(folder, name) for folder, names in (details.get("files") or {}).items()
                   for name in names or []) if held else []
    out["files"] = files
    device = f"nvidia{minor}" if minor is not None else None
    out["holder"] = bool(device and any(os.path.basename(f) == device for f in files))
    return out


def node_rule(pid, facts_result, gpu_index, runner):
    """What the workload shows of the device-node rule: its nodes, its context GPUs, and whether it
    holds the node of GPUs it has no context on (CUDA opening every GPU it can see).

    The nodes come from the collection's own scan (_procs.scan_fd_holders, threads' tables
    included) and are placed on GPUs by its holding model (_holding.node_of).
    """
    if runner.colroot not in sys.path:
        sys.path.insert(0, runner.colroot)
    # pylint: disable-next=import-outside-toplevel,import-error
    from ansible_collections.gpuops.gpu.plugins.module_utils import _holding
    from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs

    gpus = [] if facts_result.get("failed") else facts_result["ansible_facts"]["gpu_devices"]
    minors = {g["minor_number"]: g["index"] for g in gpus if g.get("minor_number") is not None}
    nodes = _procs.scan_fd_holders(runner.device_files or ["/dev/nvidia*"]).get(pid, [])
    placed = [_holding.node_of(n) for n in nodes]
    node_gpus = sorted({minors[minor] for kind, minor in placed if kind == "gpu" and minor in minors})
    context_gpus = sorted(g["index"] for g in gpus if any(p.get("pid") == pid for p in g.get("processes") or []))
    return {"nodes": nodes, "node_gpus": node_gpus, "context_gpus": context_gpus, "selected_gpu": gpu_index,
            "nodes_without_context": sorted(set(node_gpus) - set(context_gpus)),
            "opens_every_gpu": bool(gpus) and node_gpus == sorted(g["index"] for g in gpus)}


def first_at_or_below(samples, since, threshold):
    for stamp, used in samples:
        if stamp >= since and used <= threshold:
            return stamp, used
    return None, None


# --- the run ---------------------------------------------------------------------------------------

def run(args, host, report):  # pylint: disable=too-many-locals,too-many-statements,too-many-branches
    problems = report["problems"]
    workdir = tempfile.mkdtemp(prefix="gpusmoke-run-")
    runner = Runner(workdir, host.env(), host.device_files())
    poller = None
    protect = [POLLER_MARK]
    try:
        # 1. both backends against nvidia-smi --query-gpu (facts, CSV, facts: the CSV read sits between)
        facts = {}
        facts["nvml"], t_a, t_b = runner.module("gpu_facts", {"backend": "nvml", "protect": protect})
        csv_rows = runner.smi_csv()
        facts["nvidia-smi"], t_c, t_d = runner.module("gpu_facts", {"backend": "nvidia-smi", "protect": protect})
        for backend in BACKENDS:
            if facts[backend].get("failed"):
                raise CannotRun(f"gpu_facts backend={backend} failed: {facts[backend].get('msg')}")
        snap = facts["nvml"]["ansible_facts"]
        report["host"] = {"description": host.describe(snap), "driver": snap["gpu_driver"],
                          "gpu_count": snap["gpu_count"], "gpus": [g["name"] for g in snap["gpu_devices"]]}
        rows = compare({b: facts[b]["ansible_facts"] for b in BACKENDS}, csv_rows, args.mem_tolerance)
        report["compare"] = {"rows": rows, "all_equal": all(r["equal"] for r in rows) and bool(rows),
                             "memory_used_tolerance_mib": args.mem_tolerance,
                             "module_seconds": {"nvml": rnd(t_b - t_a), "nvidia-smi": rnd(t_d - t_c)}}
        if not report["compare"]["all_equal"]:
            problems.append("gpu_facts and nvidia-smi --query-gpu differ: " + ", ".join(
                f"GPU {r['gpu']} {r['field']}" for r in rows if not r["equal"]))

        targets = [g for g in snap["gpu_devices"] if g["index"] == args.gpu]
        if not targets:
            raise CannotRun(f"--gpu {args.gpu}: this host has GPUs {[g['index'] for g in snap['gpu_devices']]}")
        gpu = targets[0]
        if not gpu["idle"]:
            raise CannotRun(f"GPU {args.gpu} is busy ({'; '.join(gpu['busy_reasons'])}): the smoke test needs an idle"
                            " GPU; choose one with --gpu")
        free = (gpu.get("memory") or {}).get("free")
        if free is not None and args.mib > free - 1024:
            raise CannotRun(f"--mib {args.mib}: GPU {args.gpu} has {free} MiB free (keep 1 GiB for the CUDA context)")

        # 2. the workload, seen by both backends
        poller = Poller(runner.env, gpu["uuid"])  # its first sample, the idle baseline, is in before READY
        pid, method = host.start_workload(gpu, args.mib, workdir)
        t_ready = now()
        work = {"pid": pid, "method": method, "mib": args.mib, "gpu": args.gpu, "uuid": gpu["uuid"],
                "minor_number": gpu.get("minor_number"), "seen": {}}
        report["workload"] = work
        # The device-node rule of the holding model (docs/holding-model.md): which NVIDIA nodes the
        # CUDA process holds, and on which GPUs the driver lists its context.
        everywhere = runner.module("gpu_facts", {"backend": "nvml", "protect": protect})[0]
        work["device_nodes"] = node_rule(pid, everywhere, args.gpu, runner)
        for backend in BACKENDS:
            result = runner.module("gpu_facts", {"backend": backend, "gpus": [str(args.gpu)], "protect": protect})[0]
            work["seen"][backend] = workload_seen(result, args.gpu, gpu.get("minor_number"), pid, args.mib)
            seen = work["seen"][backend]
            for key, what in (("pid_reported", "its pid"), ("memory_ok", f">= {args.mib} MiB"),
                              ("holder", "it holding the GPU's device file")):
                if not seen[key]:
                    problems.append(f"gpu_facts backend={backend} does not show {what} on GPU {args.gpu}"
                                    + (f": {seen.get('msg')}" if seen.get("msg") else ""))

        # 3. release it, wait for the GPU, time both
        samples_before = poller.samples()
        baseline = samples_before[0][1] if samples_before else None
        watcher = ExitWatcher(pid)
        watcher.start()
        release, t_rel0, t_rel1 = runner.module("gpu_release", {
            "gpus": [str(args.gpu)], "pids": [pid], "tree": False, "protect": protect})
        mine = [r for r in release.get("released") or [] if r.get("pid") == pid]
        entry = mine[0] if mine else {}
        watcher.join(timeout=60 if mine else 1)  # gpu_release returns once it is gone: this is at once
        rel = {"failed": bool(release.get("failed")), "msg": release.get("msg"), "released": bool(mine),
               "signals": entry.get("signals"), "seconds": entry.get("seconds"), "elapsed": release.get("elapsed"),
               "wall_s": rnd(t_rel1 - t_rel0), "survivors": [s.get("pid") for s in release.get("survivors") or []],
               "others_signalled": [r.get("pid") for r in release.get("released") or [] if r.get("pid") != pid]}
        report["release"] = rel
        if rel["failed"] or not rel["released"] or not rel["signals"]:
            problems.append(f"gpu_release did not release pid {pid}: {release.get('msg') or release}")
        if rel["others_signalled"]:
            problems.append(f"gpu_release signalled other processes: {rel['others_signalled']}")
        if watcher.exited_at is None and host.workload_alive():
            problems.append(f"the workload (pid {pid}) is still alive after gpu_release; gpu_wait_idle not run")
            return

        wait, t_wait0, t_wait1 = runner.module("gpu_wait_idle", {
            "gpus": [str(args.gpu)], "protect": protect, "timeout": args.timeout, "sleep": args.sleep,
            "settle": args.settle})
        time.sleep(0.05)
        poller.stop()
        samples = poller.samples()

        t_exit = watcher.exited_at
        # When the signal went: the process's exit (seen here) minus gpu_release's signal -> gone time.
        if t_exit is not None and isinstance(rel["seconds"], (int, float)):
            t_signal, how = t_exit - rel["seconds"], f"process exit ({watcher.how}) minus released[].seconds"
        else:
            t_signal, how = t_rel0, "gpu_release start (no exit time; an upper bound on the delays)"
        threshold = None if baseline is None else baseline + args.mem_tolerance
        t_free, used_free = first_at_or_below(samples, t_signal, threshold) if threshold is not None else (None, None)
        if t_free is None:
            problems.append(f"NVML never showed GPU {args.gpu}'s memory free (<= {threshold} MiB) after the signal")
        wait_idle = {"failed": bool(wait.get("failed")), "msg": wait.get("msg"), "elapsed": wait.get("elapsed"),
                     "polls": wait.get("polls"), "idle_gpus": wait.get("idle_gpus"), "wall_s": rnd(t_wait1 - t_wait0),
                     "confirmation": wait.get("confirmation"), "samples": wait.get("samples"),
                     "sleep": args.sleep, "settle": args.settle}
        report["wait_idle"] = wait_idle
        if wait_idle["failed"] or args.gpu not in (wait.get("idle_gpus") or []):
            problems.append(f"gpu_wait_idle did not see GPU {args.gpu} idle: {wait.get('msg')}")

        def since_signal(stamp):
            return None if stamp is None else rnd(stamp - t_signal)

        report["timing"] = {
            "signal_time_from": how,
            "nvml_poll_interval_s": POLL_INTERVAL_S,
            "nvml_polls": poller.polls,
            "baseline_used_mib": baseline,
            "free_threshold_mib": threshold,
            "free_used_mib": used_free,
            "signal_to_exit_s": rel["seconds"],
            "signal_to_free_s": since_signal(t_free),
            "exit_to_free_s": None if (t_free is None or t_exit is None) else rnd(t_free - t_exit),
            "detection_latency_s": None if t_free is None else rnd(t_wait1 - t_free),
            "wait_idle_started_after_free_s": None if t_free is None else rnd(t_wait0 - t_free),
            "events_s_from_signal": {
                "workload_ready": since_signal(t_ready), "gpu_release_start": since_signal(t_rel0),
                "signal": 0.0, "exit": since_signal(t_exit), "gpu_release_end": since_signal(t_rel1),
                "gpu_wait_idle_start": since_signal(t_wait0), "memory_free": since_signal(t_free),
                "gpu_wait_idle_end": since_signal(t_wait1)},
            "nvml_samples_s_from_signal": [[rnd(stamp - t_signal), used] for stamp, used in samples],
        }
    finally:
        if poller is not None:
            poller.stop()
        if report.get("workload"):
            report["workload"]["killed_in_cleanup"] = host.stop_workload()
        shutil.rmtree(workdir, ignore_errors=True)


# --- output --------------------------------------------------------------------------------------

def table(headers, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(headers, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def fmt_s(value):
    return "-" if value is None else f"{value:.3f} s"


def cell(entry):
    if entry["verdict"] == "equal":
        return "equal" + (f" ({entry['note']})" if entry["note"] else "")
    return f"DIFFERS: {entry['value']}" + (f" ({entry['note']})" if entry["note"] else "")


def render(report):  # pylint: disable=too-many-locals
    out = [f"gpu_smoke ({report['mode']}): {report.get('host', {}).get('description', '?')}"]
    comp = report.get("compare")
    if comp:
        out.append("")
        out.append(f"1. gpu_facts vs nvidia-smi --query-gpu={','.join(CSV_FIELDS)} (memory.used: equal within"
                   f" {comp['memory_used_tolerance_mib']} MiB - the reads are moments apart)")
        out.append(table(["GPU", "field", "nvidia-smi --query-gpu", "gpu_facts backend=nvml", "gpu_facts backend=nvidia-smi"],
                         [[r["gpu"], r["field"], r["nvidia_smi_csv"], cell(r["nvml"]), cell(r["nvidia-smi"])]
                          for r in comp["rows"]]))
        out.append(f"   all fields equal: {'yes' if comp['all_equal'] else 'NO'}")
    work = report.get("workload")
    if work:
        out.append("")
        out.append(f"2. workload pid {work['pid']} ({work['method']}): {work['mib']} MiB on GPU {work['gpu']} ({work['uuid']})")
        rows = []
        labels = (("pid_reported", f"pid {work['pid']} reported on GPU {work['gpu']}"),
                  ("used_mib", f"its memory (>= {work['mib']} MiB)"),
                  ("holder", f"holds nvidia{work['minor_number']}"))
        for key, label in labels:
            row = [label]
            for backend in BACKENDS:
                seen = work["seen"].get(backend) or {}
                if key == "used_mib":
                    value = f"{seen.get('used_mib')} MiB " + ("ok" if seen.get("memory_ok") else "NOT OK")
                else:
                    value = "yes" if seen.get(key) else "NO"
                    if key == "holder" and seen.get("files"):
                        value += " (" + ", ".join(os.path.basename(f) for f in seen["files"]) + ")"
                row.append(value)
            rows.append(row)
        out.append(table(["check", "gpu_facts backend=nvml", "gpu_facts backend=nvidia-smi"], rows))
        rule = work.get("device_nodes")
        if rule:
            out.append(f"   device nodes it holds: {', '.join(os.path.basename(n) for n in rule['nodes']) or 'none'};"
                       f" NVML lists its context on GPU(s) {', '.join(map(str, rule['context_gpus'])) or 'none'};"
                       f" nodes of GPUs without its context: {', '.join(map(str, rule['nodes_without_context'])) or 'none'}"
                       f" ({'it opens every GPU' if rule['opens_every_gpu'] else 'not every GPU'})")
    rel, wait, timing = report.get("release"), report.get("wait_idle"), report.get("timing")
    if rel:
        out.append("")
        out.append(f"3. gpu_release pids=[{work['pid']}]: {'released' if rel['released'] else 'NOT released'},"
                   f" signals {rel['signals']}" + ("" if not wait else (
                       f"; gpu_wait_idle (sleep {wait['sleep']:g} s, settle {wait['settle']:g} s):"
                       f" {'idle' if not wait['failed'] else 'FAILED'} after {wait['polls']} polls")))
    if rel and wait and timing:
        rows = [
            ["signal -> process gone (gpu_release released[].seconds)", fmt_s(timing["signal_to_exit_s"])],
            [f"signal -> memory free (NVML, polled every {POLL_INTERVAL_S * 1000:g} ms)", fmt_s(timing["signal_to_free_s"])],
            ["process gone -> memory free", fmt_s(timing["exit_to_free_s"])],
            ["memory free -> gpu_wait_idle returned (detection latency)", fmt_s(timing["detection_latency_s"])],
            ["gpu_release: module elapsed / process wall", f"{fmt_s(rel['elapsed'])} / {fmt_s(rel['wall_s'])}"],
            ["gpu_wait_idle: module elapsed / process wall", f"{fmt_s(wait['elapsed'])} / {fmt_s(wait['wall_s'])}"],
        ]
        out.append(table(["measure", "value"], rows))
        events = timing["events_s_from_signal"]
        out.append("   timeline, s from the signal: " + ", ".join(
            f"{EVENT_LABELS.get(name, name)} {value:+.3f}" for name, value in sorted(
                ((k, v) for k, v in events.items() if v is not None), key=lambda kv: kv[1])))
        out.append(f"   signal time: {timing['signal_time_from']}; memory free: used <= {timing['free_threshold_mib']} MiB"
                   f" (idle baseline {timing['baseline_used_mib']} MiB + {report['settings']['mem_tolerance_mib']} MiB)")
    out.append("")
    if report["problems"]:
        out.append("PROBLEMS:")
        out += [f"  - {p}" for p in report["problems"]]
    out.append(f"result: {'ok' if report['ok'] else 'FAILED'}")
    return "\n".join(out)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", metavar="OUT", help="write the report as JSON to OUT")
    parser.add_argument("--mib", type=int, default=1024, help="MiB the workload holds (default 1024; on an H200 try 102400)")
    parser.add_argument("--gpu", type=int, default=0, help="index of the GPU to use (default 0); it must be idle")
    parser.add_argument("--simulator", action="store_true",
                        help="run against a simulated host of its own (also when GPUSIM_DIR is set)")
    parser.add_argument("--workload-python", default=sys.executable,
                        help="interpreter of the CUDA workload (one with torch, if you want PyTorch); default: this one")
    parser.add_argument("--mem-tolerance", type=int, default=16,
                        help="MiB memory.used may differ between two reads (default 16)")
    parser.add_argument("--sleep", type=float, default=0.5, help="gpu_wait_idle sleep (default 0.5, the module's)")
    parser.add_argument("--settle", type=float, default=1.0, help="gpu_wait_idle settle (default 1.0, the module's)")
    parser.add_argument("--timeout", type=float, default=300.0, help="gpu_wait_idle timeout (default 300)")
    args = parser.parse_args(argv)
    if args.mib <= 0:
        parser.error("--mib must be > 0")
    if args.mem_tolerance < 0:
        parser.error("--mem-tolerance must be >= 0")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    simulator = args.simulator or bool(os.environ.get("GPUSIM_DIR"))
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _on_signal)
    report = {"mode": "simulator" if simulator else "gpu", "ok": False, "problems": [],
              "settings": {"mib": args.mib, "gpu": args.gpu, "mem_tolerance_mib": args.mem_tolerance,
                           "wait_idle_sleep": args.sleep, "wait_idle_settle": args.settle,
                           "wait_idle_timeout": args.timeout, "python": sys.executable,
                           "workload_python": None if simulator else args.workload_python}}
    if simulator:
        report["settings"]["simulator"] = {"gpus": SIM_GPUS, "model": SIM_MODEL, "release_lag_ms": SIM_RELEASE_LAG_MS}
    status = 1
    host = None
    started = now()
    try:
        host = SimulatedHost() if simulator else RealHost(args.workload_python)
        if simulator:
            report["settings"]["simulator"]["dir"] = host.dir
        host.check()
        run(args, host, report)
        report["ok"] = not report["problems"]
        status = 0 if report["ok"] else 1
    except CannotRun as exc:
        report["problems"].append(f"cannot run: {exc}")
        status = 2
    except (Terminated, RuntimeError, OSError, subprocess.SubprocessError, KeyError, ValueError) as exc:
        report["problems"].append(f"{type(exc).__name__}: {exc}")
        status = 1
    finally:
        if host is not None:
            down = host.down()
            if down and down.get("errors"):
                report["problems"].append(f"simulator teardown: {down['errors']}")
                report["ok"] = False
                status = status or 1
        report["seconds"] = rnd(now() - started)
        print(render(report), flush=True)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=2, sort_keys=True)
                f.write("\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
