"""Helpers shared by the benchmarks: paths, the simulated host, module runs, idle processes, tables.

Every benchmark compares the collection with the way users do the same thing today, from ONE
run, side by side, and reports ratios. Nothing here asserts on time: a benchmark fails only
when it crashes.
"""

import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KIT = os.path.join(ROOT, "tests", "gpusim")
RESULTS = os.path.join(HERE, "results")
MODULES = "ansible_collections.gpuops.gpu.plugins.modules."

if KIT not in sys.path:
    sys.path.insert(0, KIT)
# Never write byte code into the checkout (the collection is imported through a symlink to it);
# ansible-core's own byte code in the virtual environment is used as usual.
sys.dont_write_bytecode = True
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"


class Terminated(Exception):
    """SIGTERM/SIGHUP arrived: unwind so that every `finally` cleans up."""


def _on_signal(signum, frame):  # pylint: disable=unused-argument
    raise Terminated(f"signal {signum}")


def install_signal_handlers():
    """Turn SIGTERM and SIGHUP into an exception, so that cleanup runs (run.py's timeout sends SIGTERM)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)


class Workspace:
    """A private temp dir with the collection laid out as <tmp>/ansible_collections/gpuops/gpu.

    The layout is a symlink to this checkout, so the benchmarks always measure the code as it
    is (no stale copy in build/); no byte code is written (PYTHONDONTWRITEBYTECODE), so nothing
    lands in the checkout.
    """

    def __init__(self, prefix="gpubench-"):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.colroot = os.path.join(self.dir, "collections")
        os.makedirs(os.path.join(self.colroot, "ansible_collections", "gpuops"))
        os.symlink(ROOT, os.path.join(self.colroot, "ansible_collections", "gpuops", "gpu"))
        self._count = 0

    def activate(self):
        """Make the collection importable in this process."""
        if self.colroot not in sys.path:
            sys.path.insert(0, self.colroot)

    def env(self, base=None):
        """``base`` (default os.environ) with the collection and the simulator kit on PYTHONPATH."""
        out = dict(os.environ if base is None else base)
        parts = [self.colroot, KIT] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
        out["PYTHONPATH"] = os.pathsep.join(parts)
        out["PYTHONDONTWRITEBYTECODE"] = "1"
        return out

    def path(self, name):
        return os.path.join(self.dir, name)

    def run_module(self, module, args, env, timeout=600):
        """Run a module as Ansible runs it on a target: ``python -m <module> <args file>``.

        Returns (result dict, wall seconds, CPU seconds of the module and its children, rc, start time on
        the time.monotonic() clock).
        """
        self._count += 1
        argsfile = self.path(f"args-{self._count}.json")
        with open(argsfile, "w", encoding="utf-8") as f:
            json.dump({"ANSIBLE_MODULE_ARGS": args}, f)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", MODULES + module, argsfile], env=env, capture_output=True,
                              text=True, check=False, timeout=timeout)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        try:
            result = json.loads(proc.stdout)
        except ValueError:
            raise RuntimeError(f"{module}: no JSON result (rc {proc.returncode}): {proc.stdout[-2000:]}"
                               f" {proc.stderr[-2000:]}") from None
        return result, wall, cpu, proc.returncode, t0

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def workspace(prefix="gpubench-"):
    ws = Workspace(prefix)
    try:
        yield ws
    finally:
        ws.cleanup()


@contextlib.contextmanager
def sim_host(**kwargs):
    """A simulated GPU host in a fresh short temp dir (unix socket path limit); always torn down."""
    from gpusimkit.host import SimHost  # pylint: disable=import-outside-toplevel

    base = tempfile.mkdtemp(prefix="gpub-")
    host = SimHost.up(os.path.join(base, "h"), **kwargs)
    try:
        yield host
    finally:
        report = host.down()
        shutil.rmtree(base, ignore_errors=True)
        if report.get("errors"):
            print(f"warning: gpusim down: {report['errors']}", file=sys.stderr)


def device_glob(host):
    return host.path("dev", "nvidia*")


class IdleProcesses:
    """N real idle processes (``sleep 600``) that this benchmark started and alone signals."""

    def __init__(self):
        self.procs = []

    def start(self, count):
        for _index in range(count):
            self.procs.append(subprocess.Popen(  # pylint: disable=consider-using-with
                ["sleep", "600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return self

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs = []


@contextlib.contextmanager
def idle_processes(count):
    idle = IdleProcesses()
    try:
        yield idle.start(count)
    finally:
        idle.stop()


def process_count():
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


def median(values):
    return statistics.median(values) if values else None


def mean(values):
    return statistics.mean(values) if values else None


def ratio(ours, theirs):
    if ours is None or not theirs:
        return None
    return ours / theirs


def fmt(value, unit=""):
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if unit == "x":
            return f"{value:.2f}x" if value >= 0.1 else f"{value:.3f}x"
        if unit == "ms":
            return f"{value * 1000:.1f} ms"
        if unit == "s":
            return f"{value:.3f} s"
        if unit == "%":
            return f"{value:.2f} %"
        return f"{value:.3f}"
    return f"{value}{unit}"


def table(title, headers, rows):
    """Print a plain-text table (also valid Markdown)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print(f"\n{title}")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
    sys.stdout.flush()


def machine():
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "processes_at_start": process_count(),
            "loadavg": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z")}


def write_json(name, data):
    """results/<name>.json for a full run; results/smoke/<name>.json for a smoke run (never clobbers a full one)."""
    folder = os.path.join(RESULTS, "smoke") if data.get("smoke") else RESULTS
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True, default=str)
    print(f"\nresults: {os.path.relpath(path, ROOT)}")
    return path
