"""The fault matrix (issue 14 item 2): every fault a GPU host shows, each row checked the same way.

One test per row, the collection's modules run as Ansible runs them (modrun: a fresh interpreter and
an args file) against the simulated host. Every row asserts

- the outcome: success, or a failure whose message has the expected key words;
- every process outside the scope alive (the bystanders: a job on another GPU, nvidia-persistenced
  holding every GPU node, an exporter holding the control nodes; or another container);
- nothing left behind: after each module run no new process of this row's outside the simulated
  machine (a child the module left), and after the row's teardown no process of the row at all (each
  carries the row's marker in its environment) and no container cgroup lxc/<vmid> of the row;
- the time of each module run bounded (a safety net: its own time limit + 15 s, not a benchmark).

The session fixture prints the table at the end and writes build/fault-matrix.json; with
GPUOPS_WRITE_DOCS=1 it also renders docs/reliability.md (tools/reliability_doc.py).

vmids 7100-7199 only (containers are cgroups under lxc/, shared by the whole machine): row N uses
7100 + 4 * (N - 1) and the next three.
"""

import contextlib
import datetime
import fcntl
import functools
import importlib.util
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
import test_holding_model as holding
import test_predeploy as predeploy
from gpusimkit import alive as alive_since, cmdline, ct_cgroups_left, read_stat
from gpusimkit import starttime as start_of
from modrun import alive, run_module_text

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT_JSON = os.path.join(TOP, "build", "fault-matrix.json")
DOC = os.path.join(TOP, "docs", "reliability.md")
RENDERER = os.path.join(TOP, "tools", "reliability_doc.py")
MARK = "GPUOPS_FAULT_MATRIX_ROW"
SLACK_S = 15.0  # the bound on a module run: its own time limit + this
GRACE = 1.0
VMID_BASE = 7100
NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"
TMP_PATH = re.compile(r"/tmp/\S*/(?=\S)")  # a test's temporary directory, left out of the table


# --- the report ------------------------------------------------------------------------------------

def renderer():
    """tools/reliability_doc.py as a module (one table, for the terminal and the doc)."""
    spec = importlib.util.spec_from_file_location("reliability_doc", RENDERER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def matrix_report(request):
    rows = []
    yield rows
    if not rows:
        return
    os.makedirs(os.path.dirname(REPORT_JSON), exist_ok=True)
    # Under pytest-xdist every worker has its own session: the workers of one run merge their rows.
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex
    with open(REPORT_JSON + ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(REPORT_JSON, encoding="utf-8") as f:
                previous = json.load(f)
        except (OSError, ValueError):
            previous = {}
        if previous.get("run") == run:
            mine = {r["row"] for r in rows}
            rows.extend(r for r in previous.get("rows") or [] if r["row"] not in mine)
        rows.sort(key=lambda r: r["row"])
        data = {
            "run": run,
            "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"uname": " ".join(part for part in platform.uname() if part), "cpus": os.cpu_count(), "python": platform.python_version()},
            "command": ".venv/bin/python -m pytest tests/functional/test_fault_matrix.py",
            "rows": rows,
        }
        tmp = REPORT_JSON + f".{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, REPORT_JSON)
        doc = renderer()
        lines = ["", "fault matrix (" + REPORT_JSON + "):", *doc.table(rows)]
        if os.environ.get("GPUOPS_WRITE_DOCS") == "1":
            with open(DOC, "w", encoding="utf-8") as f:
                f.write(doc.render(data))
            lines.append("wrote " + DOC)
    write_summary(request, lines)


def write_summary(request, lines):
    """Print ``lines`` on pytest's terminal at the end of the run, past output capture."""
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            for line in lines:
                reporter.write_line(line)


def has_marker(pid, token):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MARK}={token}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def marked(token):
    """The live processes whose environment carries this row's marker (every one the row started,
    directly or through the simulator or a module), but this test process."""
    return {int(e) for e in os.listdir("/proc")
            if e.isdigit() and int(e) != os.getpid() and has_marker(e, token) and alive(int(e))}


def kill_marked(pid, token):
    """SIGKILL ``pid`` only while it is a process of this row: pinned by a pidfd, then its marker checked."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if has_marker(pid, token):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def describe_pid(pid):
    return f"pid {pid} ({' '.join(cmdline(pid))[:120]})"


class Row:
    """What one row records, and the checks every row makes."""

    def __init__(self, number, fault, does, token):
        self.number = number
        self.fault = fault
        self.does = does
        self.token = token
        self.vmids = [VMID_BASE + 4 * (number - 1) + i for i in range(4)]
        self.bystanders = []
        self.outcomes = []
        self.known = set()
        self.error = None
        self.seconds = None
        self.bystanders_alive = None
        self.left_behind = []
        self.known_bug = None

    # the scenario
    def bystander(self, pid, what):
        """A process outside the row's scope: it must be alive at the end of the row."""
        self.bystanders.append((pid, start_of(pid), what))
        return pid

    def standard_bystanders(self, host, gpu=7, ct=None):
        """A job with a context on ``gpu`` (CUDA: it holds every node it can see), nvidia-persistenced
        holding every GPU node (a protected daemon) and an exporter holding the control nodes."""
        self.bystander(host.hold(gpus=[gpu], mib=512, ct=ct, name="python3 other-job.py"), f"a job on GPU {gpu}")
        self.bystander(host.hold(gpus="all", mib=0, ct=ct, device_only=True, name="nvidia-persistenced"),
                       "nvidia-persistenced (every GPU node)")
        self.bystander(host.hold(gpus=None, ct=ct, control_only=True, name="dcgm-exporter"),
                       "an exporter (control nodes)")

    # module runs
    def run(self, host, collection, module, args, limit_s=10.0, tag="", check_child=True, **kwargs):
        """One module run (modrun); asserts it took less than ``limit_s`` + SLACK_S, printed no traceback
        and left no process behind it."""
        before = marked(self.token)
        t0 = time.monotonic()
        res, out = run_module_text(host, collection, module, args, tag=tag, **kwargs)
        took = time.monotonic() - t0
        assert took < limit_s + SLACK_S, f"{module} took {took:.1f} s (limit {limit_s} s + {SLACK_S} s)"
        assert "Traceback" not in out, out[-3000:]
        if check_child:
            self.no_child_left(host, before, module)
        return res

    def no_child_left(self, host, before, what):
        """No new process of this row's outside the simulated machine (a child the module left)."""
        deadline = time.monotonic() + 2.0
        while True:
            new = [p for p in marked(self.token) - before - self.known if not host.owns(p)]
            if not new or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.left_behind += [f"{describe_pid(p)} after {what}" for p in new]
        assert not new, f"{what} left processes behind: {[describe_pid(p) for p in new]}"

    def ok(self, res, note=""):
        """The module succeeded."""
        self.outcome(res, note)
        assert not res.get("failed"), res.get("msg")
        return res

    def failed(self, res, *words, note=""):
        """The module failed, and its message has every one of ``words``."""
        self.outcome(res, note)
        assert res.get("failed"), f"expected a failure, got {json.dumps(res)[:2000]}"
        msg = res.get("msg") or ""
        missing = [w for w in words if w not in msg]
        assert not missing, f"{missing} not in the message: {msg}"
        return res

    def outcome(self, res, note):
        msg = TMP_PATH.sub("", res.get("msg") or "")
        text = "failed: " + shorten(msg) if res.get("failed") else "ok"
        self.outcomes.append(text + (f" ({note})" if note else ""))

    # the end of a row
    def finish(self, seconds):
        self.seconds = round(seconds, 1)
        dead = [(pid, what) for pid, start, what in self.bystanders if not alive_since(pid, start)]
        self.bystanders_alive = f"{len(self.bystanders) - len(dead)}/{len(self.bystanders)}"
        return dead

    def record(self):
        if self.error is None:
            check = "pass"
        elif self.error.startswith("skipped: "):
            check = shorten(self.error)
        elif self.error.startswith("xfail: "):
            check = "xfail: a known bug (below)"
        else:
            check = "FAIL: " + self.error
        if self.left_behind and not check.startswith("FAIL"):
            check = "FAIL: left processes behind"
        return {"row": self.number, "fault": self.fault, "does": self.does,
                "outcome": "; ".join(self.outcomes) or "-", "check": check, "seconds": self.seconds,
                "bystanders_alive": self.bystanders_alive, "left_behind": list(self.left_behind), "known_bug": self.known_bug,
                "error": self.error}


def shorten(text, n=150):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + "..."


def matrix(number, fault, does):
    """A row of the matrix: records the outcome, the time and the bystanders of the test it wraps."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            row = kwargs["row"]
            t0 = time.monotonic()
            try:
                fn(*args, **kwargs)
            except pytest.skip.Exception as exc:
                row.error = f"skipped: {exc}"
                row.finish(time.monotonic() - t0)
                raise
            except BaseException as exc:
                xfail = [m for m in getattr(wrapper, "pytestmark", []) if m.name == "xfail"]
                row.error = ("xfail: " if xfail else "") + shorten(f"{type(exc).__name__}: {exc}", 300)
                row.known_bug = xfail[0].kwargs.get("reason") if xfail else None
                row.finish(time.monotonic() - t0)
                raise
            dead = row.finish(time.monotonic() - t0)
            if dead:
                row.error = f"bystanders dead: {dead}"
                raise AssertionError(f"processes outside the scope died: {dead}")
        wrapper.matrix_row = (number, fault, does)
        return wrapper
    return decorate


@pytest.fixture(autouse=True)
def row(request, matrix_report):
    """Set up first and torn down last (autouse): the marker is in the environment of everything the
    row starts (the simulated host included), and the leftover check runs after the host is down."""
    number, fault, does = request.function.matrix_row
    token = f"{number}-{uuid.uuid4().hex[:12]}"
    saved = os.environ.get(MARK)
    os.environ[MARK] = token
    rec = Row(number, fault, does, token)
    try:
        yield rec
    finally:
        if saved is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = saved
        problems = leftovers(rec)
        rec.left_behind += problems
        matrix_report.append(rec.record())
    if problems:
        pytest.fail(f"row {number} left behind: {problems}", pytrace=False)


def leftovers(rec):
    """After the teardown: every process of the row is gone (the ones still there are killed, by pid and
    start time: the row started them) and its containers' cgroups are removed."""
    deadline = time.monotonic() + 5.0
    left = marked(rec.token)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked(rec.token)
    problems = [describe_pid(p) for p in sorted(left)]
    for pid in left:
        kill_marked(pid, rec.token)
    problems += [f"cgroup {d}" for v in rec.vmids for d in ct_cgroups_left(v)]
    return problems


# --- helpers ---------------------------------------------------------------------------------------

def devices(host):
    return [host.dir + "/dev/nvidia*"]


def signals_of(res):
    return {r["pid"]: r["signals"] for r in res["released"]}


def container(host, vmid, gpus="all", systemd=False):
    host.ct_create(vmid, gpus=gpus, systemd=systemd)
    host.ct_start(vmid)
    return vmid


def own_process(script, *args):
    """A process this test starts itself (own session); it prints 'ready' once set up."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def end(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()


# --- the rows --------------------------------------------------------------------------------------

@matrix(1, "SIGTERM ignored", "gpu_release: SIGTERM, waits grace_period (1 s), then SIGKILL")
def test_01_sigterm_ignored(row, gpusim, collection):
    row.standard_bystanders(gpusim)
    stubborn = gpusim.hold(gpus=[0], mib=4096, ignore_term=True)
    res = row.ok(row.run(gpusim, collection, "gpu_release", {"gpus": ["0"], "grace_period": GRACE, "device_files": devices(gpusim)}),
                 "SIGTERM, SIGKILL")
    assert signals_of(res)[stubborn] == ["SIGTERM", "SIGKILL"], res["released"]
    (entry,) = [r for r in res["released"] if r["pid"] == stubborn]
    assert GRACE <= entry["seconds"] < GRACE + 5, entry
    assert res["survivors"] == [] and holding.gone(stubborn)


@matrix(2, "slow exit", "gpu_release: SIGTERM; the holder exits 0.5 s later, within grace_period (2 s): no SIGKILL")
def test_02_slow_exit(row, gpusim, collection):
    row.standard_bystanders(gpusim)
    slow = gpusim.hold(gpus=[1], mib=4096, exit_delay=0.5)
    res = row.ok(row.run(gpusim, collection, "gpu_release", {"gpus": ["1"], "grace_period": 2, "device_files": devices(gpusim)}),
                 "SIGTERM only")
    assert signals_of(res)[slow] == ["SIGTERM"], res["released"]
    (entry,) = [r for r in res["released"] if r["pid"] == slow]
    assert 0.4 <= entry["seconds"] < 2, entry
    assert holding.gone(slow)


@matrix(3, "respawn by a supervisor", "gpu_release stop_units: true stops the unit (pct exec systemctl stop); "
        "stop_units: false signals, reports the respawn with advice, never signals it, and fails")
def test_03_respawn_by_a_supervisor(row, gpusim, collection):
    vmid = container(gpusim, row.vmids[0], systemd=True)
    row.standard_bystanders(gpusim)
    first = gpusim.hold(gpus=[0, 1], mib=4096, ct=vmid, service="sglang", respawn=True, restart_delay=0.3)
    args = {"containers": [vmid], "grace_period": GRACE, "device_files": devices(gpusim)}
    res = row.ok(row.run(gpusim, collection, "gpu_release", args), "stop_units: true, unit stopped")
    (unit,) = res["stopped_units"]
    assert (unit["unit"], unit["container"], unit["rc"]) == ("sglang.service", vmid, 0), unit
    assert unit["command"][-6:] == ["exec", str(vmid), "--", "systemctl", "stop", "sglang.service"], unit
    assert res["respawned"] == [] and holding.gone(first)
    time.sleep(0.8)  # longer than the restart delay: a supervisor that could restart it would have
    assert holding.services_pids(gpusim, "sglang", vmid) is None

    second = gpusim.hold(gpus=[2], mib=4096, ct=vmid, service="vllm", respawn=True, restart_delay=0.2)
    args = dict(args, stop_units=False)
    res = row.run(gpusim, collection, "gpu_release", args)
    if not res.get("failed") and not res["respawned"]:  # restarted after the module's last look: look again
        deadline = time.monotonic() + 10
        while holding.services_pids(gpusim, "vllm", vmid) in (None, second) and time.monotonic() < deadline:
            time.sleep(0.1)
        res = row.run(gpusim, collection, "gpu_release", args)
    row.failed(res, "hold the selected GPUs again", "not signalled", note="stop_units: false, respawn reported")
    assert res["stopped_units"] == [] and res["respawned"], res
    (again,) = res["respawned"]
    assert again["in_scope"] is True and holding.alive(again["pid"]), again  # reported, never signalled
    advice = again["advice"]
    assert f"vllm.service in CT {vmid}" in advice and "supervisor restarted it" in advice and "stop_units" in advice, advice
    assert gpusim.systemctl("stop", "vllm", ct=vmid).returncode == 0


@matrix(4, "a child forked in a SIGTERM handler", "gpu_release: the child that appears during the release "
        "(same session, holding the node) gets SIGKILL; a setsid child forked earlier (fork_child) is a holder too")
def test_04_child_forked_in_a_sigterm_handler(row, gpusim, collection):
    row.standard_bystanders(gpusim)
    proc = own_process(holding.FORK_ON_TERM, gpusim.dir + "/dev/nvidia4")
    try:
        gpusim.register(proc.pid, {4: 1024})
        forker = gpusim.hold(gpus=[4], mib=1024, fork_child=True)
        res = row.ok(row.run(gpusim, collection, "gpu_release", {"gpus": ["4"], "grace_period": GRACE, "device_files": devices(gpusim)}))
        released = signals_of(res)
        assert proc.pid in released and forker in released, res["released"]
        forked = [r for r in res["released"] if "appeared during the release" in (r.get("why") or "")]
        assert forked, [(r["pid"], r.get("why"), r["signals"]) for r in res["released"]]
        assert all(r["signals"] in (["SIGKILL"], []) for r in forked), forked
        assert res["respawned"] == [] and res["survivors"] == []
        others = [r for r in res["released"] if r["pid"] not in (proc.pid, forker) and r not in forked]
        assert others, "the fork_child's setsid child was not released"
        assert all(holding.gone(r["pid"]) for r in res["released"])
        facts = row.run(gpusim, collection, "gpu_facts", {"gpus": ["4"], "device_files": devices(gpusim)})
        g4 = facts["ansible_facts"]["gpu_devices"][0]
        assert not {pid for pids in g4["holders"].values() for pid in pids} & set(released), g4["holders"]
    finally:
        end(proc)


@matrix(5, "leaked memory (used, no process)", "gpu_release has nothing to signal; gpu_wait_idle times out naming the leak")
def test_05_leaked_memory(row, gpusim, collection):
    row.standard_bystanders(gpusim)
    gpusim.fault(leak={2: 1200})
    res = row.ok(row.run(gpusim, collection, "gpu_release", {"gpus": ["2"], "grace_period": GRACE, "device_files": devices(gpusim)}),
                 "release: nothing to signal")
    assert not res["changed"] and res["released"] == [] and res["survivors"] == [], res
    res = row.run(gpusim, collection, "gpu_wait_idle", {"gpus": ["2"], "timeout": 3, "settle": 0.5, "device_files": devices(gpusim)},
                  limit_s=3)
    row.failed(res, "timed out after 3 s", "GPU 2: 1200 MiB used and no process holds it", "a context leaked",
               "nvidia-smi -r -i 2")


@matrix(6, "GPU lost mid-wait", "gpu_wait_idle fails as soon as the GPU is lost (GpuLost, Xid 79), not at the timeout")
def test_06_gpu_lost_mid_wait(row, gpusim, collection):
    row.standard_bystanders(gpusim)
    gpusim.hold(gpus=[3], mib=4096)
    gpusim.fault(lose_gpu=3, after=1.0)
    res = row.run(gpusim, collection, "gpu_wait_idle", {"gpus": ["0", "3"], "timeout": 5, "device_files": devices(gpusim)}, limit_s=5)
    row.failed(res, "GPU 3 (00000000:5D:00.0) has fallen off the bus", "Xid 79", "reboot")
    assert res.get("error") == "gpu_lost" or "gpu_lost" in json.dumps(res), res
    assert res.get("elapsed", 0) < 4, res.get("elapsed")


@matrix(7, "an unselected GPU lost", "gpu_wait_idle on GPUs 0 and 3 succeeds while GPU 6 is lost")
def test_07_unselected_gpu_lost(row, gpusim, collection):
    row.standard_bystanders(gpusim)
    gpusim.fault(lose_gpu=6)
    args = {"gpus": ["0", "3"], "timeout": 5, "settle": 0.3, "device_files": devices(gpusim)}
    res = row.ok(row.run(gpusim, collection, "gpu_wait_idle", args, limit_s=5))
    assert res["idle_gpus"] == [0, 3], res


def init_failure_row(row, host, collection, words):
    """The driver cannot be initialised: gpu_facts and gpu_release fail naming it, nothing is signalled."""
    row.standard_bystanders(host)
    holder = row.bystander(host.hold(gpus=[0], mib=4096), "the holder of GPU 0 (a failed release signals nothing)")
    res = row.run(host, collection, "gpu_facts", {"backend": "nvml", "device_files": devices(host)})
    row.failed(res, *words, note="gpu_facts")
    res = row.run(host, collection, "gpu_release", {"gpus": ["0"], "grace_period": GRACE, "device_files": devices(host)})
    row.failed(res, *words, note="gpu_release")
    assert alive(holder)


@matrix(8, "driver not loaded", "gpu_facts and gpu_release fail naming the cause and what to do; nothing is signalled")
def test_08_driver_not_loaded(row, gpusim, collection):
    gpusim.fault(init_error="driver_not_loaded")
    init_failure_row(row, gpusim, collection, ["NVIDIA kernel driver is not loaded", "modprobe nvidia"])


@matrix(9, "driver/library version mismatch", "gpu_facts and gpu_release fail: reboot (or reload the modules); nothing is signalled")
def test_09_driver_library_mismatch(row, gpusim, collection):
    gpusim.fault(init_error="version_mismatch")
    init_failure_row(row, gpusim, collection, ["version mismatch", "Reboot the host"])


@matrix(10, "fewer GPUs than expected", "gpu_release and gpu_wait_idle with expected_count 8 on a 7-GPU host fail at once; nothing is signalled")
def test_10_fewer_gpus_than_expected(row, gpusim_factory, collection):
    host = gpusim_factory(gpus=7)
    row.standard_bystanders(host, gpu=6)
    holder = row.bystander(host.hold(gpus=[0], mib=4096), "the holder of GPU 0 (a failed release signals nothing)")
    res = row.run(host, collection, "gpu_release", {"expected_count": 8, "grace_period": GRACE, "device_files": devices(host)})
    row.failed(res, "expected 8 GPUs, the driver shows 7", "Xid 79", "Nothing was signalled", note="gpu_release")
    res = row.run(host, collection, "gpu_wait_idle", {"expected_count": 8, "timeout": 5, "device_files": devices(host)}, limit_s=5)
    row.failed(res, "expected 8 GPUs, the driver shows 7", note="gpu_wait_idle")
    assert res.get("elapsed", 0) < 3 and alive(holder)


class Flapping:
    """The process query of one GPU fails (UNKNOWN on every call, longer than the module's retries)
    for ``on_s``, then answers for ``off_s``, and so on: a driver error that comes and goes."""

    def __init__(self, host, gpu, on_s=0.3, off_s=0.3):
        self.host, self.gpu, self.on_s, self.off_s = host, gpu, on_s, off_s
        self.stop = threading.Event()
        self.flips = 0
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        while not self.stop.is_set():
            self.host.fault(unknown={self.gpu: ["processes"]})
            self.flips += 1
            if self.stop.wait(self.on_s):
                break
            self.host.fault(clear=True)
            self.stop.wait(self.off_s)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)
        self.host.fault(clear=True)


@matrix(11, "intermittent NVML errors in the process query", "retried (3 tries); a query that still fails keeps the GPU "
        "busy: gpu_wait_idle never calls a held GPU free, gpu_release signals nothing rather than report it free")
def test_11_intermittent_nvml_errors(row, gpusim, collection):
    row.standard_bystanders(gpusim)
    # A holder with a context and no memory: only the driver's process list shows it.
    quiet = gpusim.hold(gpus=[5], mib=0, name="python3 quiet.py")
    args = {"gpus": ["5"], "include_device_holders": False, "device_files": devices(gpusim)}
    # The process query fails on every call: the release refuses, the wait times out.
    gpusim.fault(unknown={5: ["processes"]})
    res = row.run(gpusim, collection, "gpu_release", dict(args, grace_period=GRACE))
    row.failed(res, "process list could not be read", "GPU 5", "Unknown Error", "Nothing was signalled", note="query always fails")
    assert res["unreadable_gpus"] == [5] and alive(quiet)
    # It fails and answers in turns: no poll of the wait may find the GPU free.
    with Flapping(gpusim, 5) as flaps:
        res = row.run(gpusim, collection, "gpu_wait_idle", dict(args, timeout=3, settle=0.2, sleep=0.1), limit_s=3)
    assert flaps.flips >= 3, flaps.flips
    row.failed(res, "timed out after 3 s", "GPU 5", note="query fails now and then")
    assert alive(quiet)
    # The same for releases: each either refuses (nothing signalled) or finds the holder and releases it,
    # never "nothing to release" while it holds the GPU. Whether a run's first look falls in a failing phase
    # is a coin toss (more so on a loaded machine): up to 12 runs, so that 12 refusals in a row (1 in 4096)
    # say the release never gets through.
    refused = 0
    with Flapping(gpusim, 5):
        for attempt in range(12):
            res = row.run(gpusim, collection, "gpu_release", dict(args, grace_period=GRACE), tag=f"-{attempt}")
            if not res.get("failed"):
                break
            assert "Nothing was signalled" in res["msg"] and alive(quiet), res["msg"]
            refused += 1
            time.sleep(0.15)
    assert not res.get("failed") and quiet in signals_of(res), f"{refused} releases refused, none released: {res.get('msg')}"
    row.outcome(res, f"releases while it fails now and then: {refused} refused, then released")
    assert holding.gone(quiet)
    # Every 5th NVML device call fails (UNKNOWN): the retries carry the queries; the holder is found and
    # released, and the idle GPUs pass the wait.
    quiet = gpusim.hold(gpus=[5], mib=0, name="python3 quiet.py")
    gpusim.fault(clear=True, unknown_every=5)
    res = row.run(gpusim, collection, "gpu_wait_idle", dict(args, timeout=3, settle=0.2), limit_s=3)
    row.failed(res, "timed out after 3 s", f"GPU 5 is used by pid {quiet}", note="unknown_every 5, wait")
    res = row.ok(row.run(gpusim, collection, "gpu_release", dict(args, grace_period=GRACE)), "unknown_every 5, release")
    assert quiet in signals_of(res) and holding.gone(quiet)
    # (nvidia-smi is not asked: the simulator's call counter restarts in every process, so its second try
    # fails where the first did, which a real intermittent error would not)
    res = row.ok(row.run(gpusim, collection, "gpu_wait_idle", dict(args, gpus=["4", "5"], timeout=5, settle=0.3,
                                                                   confirm_with_nvidia_smi=False), limit_s=5),
                 "unknown_every 5, idle GPUs")
    assert res["idle_gpus"] == [4, 5]


HUNG_SMI = """#!/bin/sh
# An nvidia-smi behind a wrapper: the wrapper and the real one (hung in the driver) both record their pid.
echo $$ >> {pids}
{real} "$@" &
echo $! >> {pids}
wait
"""


@matrix(12, "a hung nvidia-smi", "gpu_facts (backend nvidia-smi) fails after query_timeout (1 s) and kills the "
        "command's process group (the wrapper and the nvidia-smi it started)")
def test_12_hung_nvidia_smi(row, gpusim, collection, tmp_path):
    row.standard_bystanders(gpusim)
    pids = tmp_path / "smi.pids"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(HUNG_SMI.format(pids=pids, real=gpusim.path("bin", "nvidia-smi")))
    smi.chmod(0o755)
    gpusim.fault(call_delay_ms=4000)  # every NVML call takes 4 s: the real nvidia-smi hangs in it
    res = row.run(gpusim, collection, "gpu_facts", {"backend": "nvidia-smi", "nvidia_smi_path": str(smi), "query_timeout": 1,
                                                    "device_files": devices(gpusim)}, limit_s=1)
    row.failed(res, "did not answer within 1 s and was killed", "Xid")
    started = [int(x) for x in pids.read_text().split()]
    assert len(started) >= 2, started
    assert not any(alive(p) for p in started), [describe_pid(p) for p in started if alive(p)]


@matrix(13, "a hung NVML call", "gpu_wait_idle (NVML init hangs) and gpu_release (the device queries hang) fail after "
        "query_timeout (1 s); nothing is signalled")
def test_13_hung_nvml_call(row, gpusim, collection):
    row.standard_bystanders(gpusim)
    holder = row.bystander(gpusim.hold(gpus=[0], mib=4096), "the holder of GPU 0 (a failed release signals nothing)")
    args = {"backend": "nvml", "query_timeout": 1, "device_files": devices(gpusim)}
    gpusim.fault(call_delay_ms=5000)  # every call, nvmlInit included, takes 5 s
    res = row.run(gpusim, collection, "gpu_wait_idle", dict(args, timeout=5), limit_s=5)
    row.failed(res, "NVML initialisation did not answer within 1 s", "raise query_timeout", note="gpu_wait_idle")
    gpusim.fault(call_delay_ms=400)  # init answers; the query's calls add up past the limit
    res = row.run(gpusim, collection, "gpu_release", dict(args, grace_period=GRACE), limit_s=5)
    row.failed(res, "NVML query did not answer within 1 s", note="gpu_release")
    assert alive(holder)


@matrix(14, "a protected daemon holding a device file", "nvidia-persistenced (every GPU node) is never signalled "
        "and does not keep the GPUs busy")
def test_14_protected_daemon(row, gpusim, collection):
    daemon = row.bystander(gpusim.hold(gpus="all", mib=0, device_only=True, name="nvidia-persistenced"), "nvidia-persistenced")
    row.bystander(gpusim.hold(gpus=[7], mib=512, name="python3 other-job.py"), "a job on GPU 7")
    job = gpusim.hold(gpus=[0], mib=2048)
    res = row.ok(row.run(gpusim, collection, "gpu_release", {"gpus": ["0"], "grace_period": GRACE, "device_files": devices(gpusim)}),
                 "release")
    assert job in signals_of(res) and daemon not in signals_of(res), res["released"]
    (entry,) = [p for p in res["protected"] if p["pid"] == daemon]
    assert entry["reason"] == "NVIDIA daemon (nvidia-persistenced)", entry
    args = {"gpus": ["0", "1"], "timeout": 5, "settle": 0.3, "device_files": devices(gpusim)}
    res = row.ok(row.run(gpusim, collection, "gpu_wait_idle", args, limit_s=5), "wait")
    assert res["idle_gpus"] == [0, 1]


@matrix(15, "a holder in another container", "gpu_release containers: [A]: the holder in CT B is not signalled, "
        "reported in skipped_processes")
def test_15_holder_in_another_container(row, gpusim, collection):
    ct_a, ct_b = container(gpusim, row.vmids[0]), container(gpusim, row.vmids[1])
    row.standard_bystanders(gpusim)
    inside = gpusim.hold(gpus=[0], mib=4096, ct=ct_a)
    other = row.bystander(gpusim.hold(gpus=[1], mib=4096, ct=ct_b), f"the holder of GPU 1 in CT {ct_b}")
    res = row.ok(row.run(gpusim, collection, "gpu_release", {"containers": [ct_a], "grace_period": GRACE, "device_files": devices(gpusim)}))
    assert list(signals_of(res)) == [inside], res["released"]
    (skip,) = [s for s in res["skipped_processes"] if s["pid"] == other]
    assert skip["container"]["id"] == ct_b and skip["reason"], skip
    assert holding.gone(inside)


@matrix(16, "a zombie holder; a holder whose main thread exited", "gpu_release: a zombie is gone (nothing to signal, no "
        "wait for it); a process whose leader thread exited but whose threads run is found and released")
def test_16_zombie_and_exited_main_thread(row, gpusim, collection):
    row.standard_bystanders(gpusim)
    zombie = own_process("import sys, time; held = open(sys.argv[1]); print('ready', flush=True); time.sleep(120)",
                         gpusim.dir + "/dev/nvidia6")
    leader = own_process(holding.ZOMBIE_LEADER, gpusim.dir + "/dev/nvidia5")
    try:
        gpusim.register(zombie.pid, {6: 2048})
        gpusim.register(leader.pid, {5: 1024})
        os.kill(zombie.pid, signal.SIGKILL)  # our own child, not reaped: a zombie
        deadline = time.monotonic() + 5
        while read_stat(zombie.pid)[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert read_stat(zombie.pid)[0] == "Z"
        res = row.ok(row.run(gpusim, collection, "gpu_release", {"gpus": ["6"], "grace_period": GRACE, "device_files": devices(gpusim)}),
                     "zombie: nothing to signal")
        assert zombie.pid not in signals_of(res) and res["survivors"] == [], res
        args = {"gpus": ["6"], "timeout": 5, "settle": 0.3, "device_files": devices(gpusim)}
        res = row.ok(row.run(gpusim, collection, "gpu_wait_idle", args, limit_s=5), "zombie: GPU idle")
        res = row.ok(row.run(gpusim, collection, "gpu_release", {"gpus": ["5"], "grace_period": GRACE, "device_files": devices(gpusim)}),
                     "exited main thread: released")
        assert leader.pid in signals_of(res), res["released"]
        leader.wait(timeout=10)
    finally:
        end(zombie)
        end(leader)


RECYCLE = r"""
# Runs gpu_release with one pause between discovery and the first signal: there the holder exits, and
# its pid is handed to a new process (the kernel's next pid set through /proc/sys/kernel/ns_last_pid).
import os, runpy, signal, subprocess, sys, time
from ansible_collections.gpuops.gpu.plugins.module_utils import _release
victim, out, argsfile = int(sys.argv[1]), sys.argv[2], sys.argv[-1]
module = sys.argv[sys.argv.index("-m") + 1]  # the module modrun names
original = _release.scope_problem

def starttime(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None

def recycle(targets, *args):
    (target,) = [t for t in targets if t["pid"] == victim]
    if starttime(victim) == target["start_time"]:
        os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while starttime(victim) is not None and time.monotonic() < deadline:
        time.sleep(0.01)   # reaped by the simulator's daemon (a subreaper)
    for attempt in range(500):
        with open("/proc/sys/kernel/ns_last_pid", "w", encoding="utf-8") as f:
            f.write(str(victim - 1))
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if proc.pid == victim:
            break
        proc.kill()
        proc.wait()
    with open(out, "w", encoding="utf-8") as f:
        f.write(f"{proc.pid} {starttime(proc.pid)} {target['start_time']} {attempt}")
    return original(targets, *args)

_release.scope_problem = recycle
sys.argv = [sys.argv[0], argsfile]
runpy.run_module(module, run_name="__main__")
"""


@matrix(17, "a pid reused between discovery and signal", "gpu_release pins each target by (pid, start time) and a pidfd: "
        "the new process with the old pid is not signalled, reported as recycled")
def test_17_pid_reused_between_discovery_and_signal(row, gpusim, collection, tmp_path):
    if not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip(f"{NS_LAST_PID} is not writable here: no way to hand a pid to a new process on purpose")
    row.standard_bystanders(gpusim)
    victim = gpusim.hold(gpus=[3], mib=4096)
    out = tmp_path / "recycled"
    prefix = [sys.executable, "-c", RECYCLE, str(victim), str(out), "--"]
    res = row.run(gpusim, collection, "gpu_release", {"gpus": ["3"], "grace_period": GRACE, "device_files": devices(gpusim)},
                  prefix=prefix, check_child=False)
    pid, start, old_start, attempts = (int(x) for x in out.read_text().split())
    row.known.add(pid)
    try:
        assert pid == victim and start != old_start, (pid, victim, start, old_start)
        row.ok(res, f"the recycled pid not signalled; pid reused after {attempts + 1} tries")
        assert victim not in signals_of(res), res["released"]
        (skip,) = [s for s in res["skipped_processes"] if s["pid"] == victim]
        assert "recycled" in skip["reason"], skip
        assert alive_since(pid, start), "the process that got the pid was signalled"
        row.no_child_left(gpusim, set(), "gpu_release")
    finally:
        kill_marked(pid, row.token)  # the process the wrapper above started


@matrix(18, "two releases at once", "two gpu_release runs on the same scope at the same time: both succeed, each "
        "process signalled once by each or reported gone, no survivor")
def test_18_two_releases_at_once(row, gpusim, collection):
    row.standard_bystanders(gpusim)
    workers = [gpusim.hold(gpus=[i], mib=1024) for i in range(6)]
    # The second waits for the first's release locks (lock_timeout), then finds what it left.
    args = {"gpus": [str(i) for i in range(6)], "grace_period": 2, "device_files": devices(gpusim), "lock_timeout": 60}
    results = [None, None]

    def one(n):
        try:
            results[n] = row.run(gpusim, collection, "gpu_release", args, tag=f"-{n}", check_child=False)
        except AssertionError as exc:  # raised again below, in the test's thread
            results[n] = exc

    before = marked(row.token)
    threads = [threading.Thread(target=one, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    row.no_child_left(gpusim, before, "two gpu_release runs")
    for res in results:
        if not isinstance(res, dict):
            raise AssertionError(f"a release did not answer: {res}")
        row.ok(res)
        assert res["survivors"] == [], res["survivors"]
        assert all(r["signals"] in (["SIGTERM"], []) for r in res["released"]), res["released"]
    released = {r["pid"] for res in results for r in res["released"]}
    assert set(workers) <= released, (workers, released)
    assert not any(alive(w) for w in workers)


@matrix(19, "a container that will not shut down", "proxmox_gpu_containers state=shutdown fails with the advice "
        "(force: true, shutdown_timeout); with force: true it stops the container")
def test_19_container_that_will_not_shut_down(row, gpusim, collection):
    # systemd as PID 1 waits 90 s for a process that ignores SIGTERM (busybox's init would SIGKILL it after 1 s)
    ct, other = container(gpusim, row.vmids[0], gpus="0-3", systemd=True), container(gpusim, row.vmids[1], gpus="4-7")
    row.standard_bystanders(gpusim)
    row.bystander(gpusim.hold(gpus=[4], mib=2048, ct=other), f"a job in CT {other}")
    stubborn = gpusim.hold(gpus=[0], mib=2048, ct=ct, ignore_term=True)
    args = {"containers": [ct], "state": "shutdown", "shutdown_timeout": 1, "pct": gpusim.path("bin", "pct")}
    res = row.run(gpusim, collection, "proxmox_gpu_containers", args, limit_s=1)
    row.failed(res, f"CT {ct} did not shut down", "container did not stop", "force: true", "shutdown_timeout", note="no force")
    assert alive(stubborn) and res["shut_down"] == []
    res = row.ok(row.run(gpusim, collection, "proxmox_gpu_containers", dict(args, force=True), limit_s=1), "force: true")
    assert res["shut_down"] == [ct] and holding.gone(stubborn)
    assert res["changed"]


@matrix(20, "a node that cannot be reached", "ansible-playbook gpuops.gpu.predeploy: the GPU host whose proxmox_node "
        "is unreachable (ssh to a closed loopback port) fails at once, with the reason, nothing fenced or waited for")
def test_20_node_that_cannot_be_reached(row, gpusim, collection, tmp_path):
    row.standard_bystanders(gpusim)
    server = row.bystander(gpusim.hold(gpus="0-6", mib=4096, tree=True), "the server nobody could fence")
    inv = predeploy.inventory(gpusim, {"gpu-ct": {"proxmox_node": "pve-down", "proxmox_vmid": row.vmids[0]}},
                              extra_nodes={"pve-down": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1",
                                                        "ansible_port": 9, "ansible_ssh_common_args": "-o ConnectTimeout=3"}})
    before = marked(row.token)
    rc, out, took = predeploy.playbook(gpusim, collection, tmp_path, inv, "--limit", "gpu-ct", "-e", "gpu_idle_timeout=300")
    row.no_child_left(gpusim, before, "ansible-playbook")
    assert took < 60, f"it took {took:.0f} s: it waited for a server that nobody stopped"
    # the node's connection fails inside the one task of the host: a failure with its reason (rc 2), recorded
    assert rc == 2 and predeploy.recap(out, "gpu-ct")["failed"] == 1, out[-3000:]
    fatal = [line for line in out.splitlines() if line.startswith("fatal: ")]
    assert len(fatal) == 1 and "pve-down could not be reached" in fatal[0], out[-3000:]
    row.outcomes.append(f"failed (rc {rc}, the fence's node unreachable): " + shorten(fatal[0]))
    assert alive(server)


SLEEPERS = r"""
import os, signal, sys
pids = [os.posix_spawn("/bin/sleep", ["sleep", "600"], os.environ) for _ in range(int(sys.argv[1]))]
print("ready", flush=True)
print(" ".join(map(str, pids)), flush=True)
while True:  # their parent reaps them as they exit; in a session of its own (own_process)
    try:
        os.wait()
    except ChildProcessError:
        signal.pause()
"""
# A wrapper that sets the module's RLIMIT_NOFILE (soft and hard; 0: 65536, or the hard limit where this may not raise
# it), as a login shell's `ulimit -n` would, and execs the interpreter.
NOFILE = ("import os, resource, sys; n = int(sys.argv[1]); hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
          "try:\n resource.setrlimit(resource.RLIMIT_NOFILE, (n or 65536, n or 65536))\n"
          "except (ValueError, OSError):\n resource.setrlimit(resource.RLIMIT_NOFILE, (n or hard, hard))\n"
          "os.execv(sys.argv[2], sys.argv[2:])")


@contextlib.contextmanager
def sleepers(row, host, count, gpu=0):
    """``count`` sleeping processes, each with a context of 1 MiB on ``gpu`` (registered at once); their parent (which
    reaps them) and any of them still there are ended after."""
    proc = own_process(SLEEPERS, str(count))
    pids = [int(p) for p in proc.stdout.readline().split()]
    try:
        assert len(pids) == count
        host.register(pids, {gpu: 1})
        yield pids
    finally:
        for pid in pids:
            kill_marked(pid, row.token)
        end(proc)


# More holders than ulimit -n 1024 has descriptors: a pidfd for each would fail (EMFILE), so a few hundred are past
# the budget (1024 less the reserve), watched by (pid, start time). 2,000 until 2026-12 cost make test twice the time
# for the same two paths (within the budget, past it).
HOLDERS = 1200


@matrix(21, f"{HOLDERS:,} holders (ulimit -n 1024, and 65536)", "gpu_wait_idle names a few and counts the rest; "
        "gpu_release signals each one (pidfds watched with poll() within the descriptors' budget, the rest by (pid, "
        "start time)): JSON, no traceback, nothing unread taken for gone")
def test_21_more_holders_than_descriptors(row, gpusim, collection, tmp_path):
    row.standard_bystanders(gpusim)
    for nofile in (1024, 0):
        with sleepers(row, gpusim, HOLDERS) as pids:
            if nofile:
                wait_args = {"gpus": ["0"], "timeout": 1, "sleep": 0.5, "device_files": devices(gpusim)}
                res = row.run(gpusim, collection, "gpu_wait_idle", wait_args, limit_s=20)
                row.failed(res, "timed out", f"and {HOLDERS - 8} more (detail: full names them)",
                           note=f"the wait, {HOLDERS:,} holders")
                assert len(res["msg"]) < 2000, len(res["msg"])
            whole = str(tmp_path / f"release-{nofile}.json")
            args = {"gpus": ["0"], "grace_period": GRACE, "device_files": devices(gpusim), "detail_file": whole}
            res = row.run(gpusim, collection, "gpu_release", args, limit_s=40,
                          prefix=[sys.executable, "-c", NOFILE, str(nofile)])
            row.ok(res, f"ulimit -n {nofile or 65536}: {len(pids)} released")
            assert len(json.dumps(res)) < 200_000 and res["detail"]["more"].get("released"), res["detail"]
            with open(whole, encoding="utf-8") as f:
                res = json.load(f)  # the whole record
            still = {p for p in pids if alive(p)}
            released = {r["pid"] for r in res["released"]}
            assert not still & released, f"released, yet alive: {sorted(still & released)[:10]}"
            survivors = {r["pid"] for r in res["survivors"]}
            assert still <= survivors, f"alive, and not named: {sorted(still - survivors)[:10]}"
            assert set(pids) <= released | survivors, sorted(set(pids) - released - survivors)[:10]


@matrix(22, "a hung nvidia-smi in a wait's confirmation", "gpu_wait_idle (timeout 3 s, query_timeout 10 s) ends by its "
        "timeout plus one query's limit: each call gets min(query_timeout, the time left), no second try past the "
        "timeout; the message names nvidia-smi")
def test_22_hung_nvidia_smi_in_a_wait(row, gpusim, collection, tmp_path):
    row.standard_bystanders(gpusim)
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexec sleep 3600\n")  # hung in the driver, from its first call
    smi.chmod(0o755)
    timeout, query_timeout = 3, 10
    t0 = time.monotonic()
    args = {"gpus": ["0"], "timeout": timeout, "query_timeout": query_timeout, "confirm_with_nvidia_smi": True,
            "nvidia_smi_path": str(smi), "device_files": devices(gpusim)}
    res = row.run(gpusim, collection, "gpu_wait_idle", args, limit_s=timeout + query_timeout)
    took = time.monotonic() - t0
    row.failed(res, "confirm_with_nvidia_smi: nvidia-smi failed before the wait's timeout (3 s)", "did not answer within",
               note=f"ended after {took:.1f} s")
    # The wait's timeout plus one query's limit, and slack for a loaded machine (it used to take 2 x 10 + 1 s)
    assert took < timeout + query_timeout + 5, took
