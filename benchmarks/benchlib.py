"""Helpers shared by the benchmarks: paths, the simulated host, module runs, idle processes, tables.

Every benchmark compares the collection with the way users do the same thing today, from ONE
run, side by side, and reports ratios. Nothing here asserts on time: a benchmark fails only
when it crashes.
"""

import argparse
import contextlib
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KIT = os.path.join(ROOT, "tests", "gpusim")
FUNCTIONAL = os.path.join(ROOT, "tests", "functional")  # modrun: how a module and a playbook are run
RESULTS = os.path.join(HERE, "results")

for _path in (KIT, FUNCTIONAL):
    if _path not in sys.path:
        sys.path.insert(0, _path)
# Never write byte code into the checkout (the collection is imported through a symlink to it);
# ansible-core's own byte code in the virtual environment is used as usual.
sys.dont_write_bytecode = True
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
import modrun  # noqa: E402  pylint: disable=wrong-import-position,import-error


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
        argv = modrun.module_argv(module, args, self.dir, tag=f"-{self._count}")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=timeout)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return modrun.module_result(module, proc), wall, cpu, proc.returncode, t0

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
    from gpusimkit import SimHost  # pylint: disable=import-outside-toplevel

    base = tempfile.mkdtemp(prefix="gpub-")
    try:
        host = SimHost.up(os.path.join(base, "h"), **kwargs)  # on a failure (or SIGTERM) up() tears itself down
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    try:
        yield host
    finally:
        report = host.down()
        shutil.rmtree(base, ignore_errors=True)
        if report.get("errors"):
            print(f"warning: gpusim down: {report['errors']}", file=sys.stderr)


class ExitWatcher:
    """Collects the exit times of GPU contexts from a simulated host's driver (its `procs` file).

    The driver lists an exited context, with its exit time (CLOCK_MONOTONIC, the clock of
    time.monotonic()), until its release lag has passed, then drops it: so the file is read every
    `interval` seconds while a command runs, and the moment the last GPU's memory is freed is
    exact: the last exit plus the lag (as bench_wait.py reads it)."""

    def __init__(self, host, keys, interval=0.05):
        self.host, self.keys, self.interval = host, set(keys), interval
        self.exits = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _poll(self):
        for key, exit_ns in self.host.procs()[1].items():
            if key in self.keys:
                self.exits.setdefault(key, exit_ns)

    def _run(self):
        while not self._stop.wait(self.interval):
            self._poll()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._poll()

    def freed_at(self, lag_s):
        """The last exit + lag on the time.monotonic() clock, or None while a context has not exited."""
        if not self.keys or any(key not in self.exits for key in self.keys):
            return None
        return max(self.exits[key] for key in self.keys) / 1e9 + lag_s


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


def sizes_arg(text):
    """argparse type: a number of processes, or a comma list of them (ascending, deduplicated)."""
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: a number or a comma list, e.g. 500,2000,5000") from None
    if not sizes or sizes[0] < 0:
        raise argparse.ArgumentTypeError(f"{text}: numbers >= 0")
    return sizes


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


def _first_line_with(path, prefix):
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def machine():
    """The machine and the moment: what docs/performance.md names (tools/performance_doc.py)."""
    mem_kib = _first_line_with("/proc/meminfo", "MemTotal")
    return {"cpus": os.cpu_count(), "cpu_model": _first_line_with("/proc/cpuinfo", "model name") or platform.processor(),
            "memory_gib": round(int(mem_kib.split()[0]) / 1048576, 1) if mem_kib else None,
            "kernel": platform.release(), "python": sys.version.split()[0], "processes_at_start": process_count(),
            "loadavg": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def command_line():
    """How this benchmark was started, relative to the checkout (for the JSON and the docs)."""
    argv = list(sys.argv)
    if argv and os.path.isabs(argv[0]) and argv[0].startswith(ROOT + os.sep):
        argv[0] = os.path.relpath(argv[0], ROOT)
    exe = os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT + os.sep) else sys.executable
    return " ".join(shlex.quote(a) for a in [exe] + argv)


# A per-host interpreter (ansible_python_interpreter) for the local connection: the simulated host's
# environment, then Python; the module's CPU time (and that of what it ran: nvidia-smi, pct) is
# appended to a log by the shell's `times`, so that a run's CPU splits into the modules' ("the
# target") and the rest (ansible-playbook, its workers, the local connection's shell commands).
INTERPRETER = """\
#!/bin/sh
# ansible_python_interpreter of {what}: {purpose}
{exports}{python} "$@"
rc=$?
times >>{cpu_log}
exit $rc
"""


def interpreter_wrapper(path, what, env_vars=None, cpu_log=None, python=None):
    """Write the wrapper above to ``path`` (mode 755) and return it; ``cpu_log`` defaults to ``path``.cpu."""
    env_vars = env_vars or {}
    exports = "".join(f"{k}={shlex.quote(v)}; export {k}\n" for k, v in sorted(env_vars.items()))
    purpose = ("this simulated host's PATH, LD_LIBRARY_PATH and GPUSIM_DIR, then Python" if env_vars
               else "Python, the module's CPU time recorded")
    with open(path, "w", encoding="utf-8") as f:
        f.write(INTERPRETER.format(what=what, purpose=purpose, exports=exports,
                                   python=shlex.quote(python or sys.executable),
                                   cpu_log=shlex.quote(cpu_log or path + ".cpu")))
    os.chmod(path, 0o755)
    return path


def _seconds(text):
    """`times` writes 0m0.120000s: minutes and seconds."""
    minutes, _sep, secs = text.rstrip("s").partition("m")
    return int(minutes) * 60 + float(secs)


def wrapper_cpu(path):
    """(CPU seconds of the modules run through an interpreter_wrapper, module runs) from its log.

    `times` prints two lines: the shell's own user/system times, then its children's (the module
    and everything it waited for); only the second counts."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln.split() for ln in f if ln.strip()]
    except OSError:
        return 0.0, 0
    total, runs = 0.0, 0
    for index in range(1, len(lines), 2):
        if len(lines[index]) == 2:
            total += _seconds(lines[index][0]) + _seconds(lines[index][1])
            runs += 1
    return total, runs


def write_json(name, data):
    """results/<name>.json for a full run; results/smoke/<name>.json for a smoke run (never clobbers a full one)."""
    data.setdefault("command", command_line())
    folder = os.path.join(RESULTS, "smoke") if data.get("smoke") else RESULTS
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True, default=str)
    print(f"\nresults: {os.path.relpath(path, ROOT)}")
    return path
