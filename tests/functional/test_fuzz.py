"""Property tests (hypothesis) over the arguments of the modules and the roles' variables.

The modules run in this process (modrun.run_module_in_process: patched arguments, SystemExit
caught, the JSON read from stdout) against one simulated host shared by the file, so that a few
hundred examples take seconds. The host has bystanders: a protected daemon, a process in another
container, a host job of ours that logs every signal it gets, an inference server tree and a
process that ignores SIGTERM. The properties:

- every input ends in success or a clean failure (never a traceback, MODULE FAILURE or an
  exception key); a refused input's message names one of the options given;
- nothing outside the scenario is signalled, and the scenario's GPU holders only by a gpu_release
  that is scoped to them and not in check mode (the fuzz runs gpu_release in check mode; one small
  property releases a fresh, tightly scoped holder for real);
- no run lasts longer than its bound (the wait's timeouts are generated small, or refused);
- intermittent NVML errors never make a busy GPU look free.

Then a few ansible-playbook runs of the roles with bad variables: a clean failure that names the
variable. Inputs that were found to crash or to signal are explicit tests (xfail until they were
fixed). Hypothesis is derandomized with no example database, and keeps its caches under
build/hypothesis, so a run is reproducible and writes nothing outside the checkout.
"""

import faulthandler
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from gpusimkit.pytest_plugin import GpusimFactory
from modrun import alive, controller_env, run_module_in_process

pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Hypothesis caches (its Unicode tables) go here, not to .hypothesis/ in the working directory.
set_hypothesis_home_dir(os.path.join(TOP, "build", "hypothesis"))


# A run's bound: this much for reading the host, plus what its options allow (bound()). Generous: the machine is
# shared, and the bounds are there to catch a run that waits for what its input said (1e18 s, a default of 300 s).
BASE_BOUND_S = 5.0
# proxmox_gpu_containers runs pct (pct exec into the container for each service).
PCT_BOUND_S = 20.0
# Every bound here is far below this: a run still going after it has its stack dumped (stderr).
HANG_S = 60


def fuzz(examples):
    """The settings of every property here: reproducible, nothing stored, no per-example deadline."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None, print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


def vmid_of_this_worker():
    """This file's container: 7250 (+1 per pytest-xdist worker; cgroups lxc/<vmid> are machine-wide)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    return 7250 + (int(worker) if worker.isdigit() else 0) % 50


# A host job that is not the simulator's: it holds GPU 2's device node, is registered with 512 MiB on
# GPU 2, and logs every catchable signal it gets instead of dying of it.
HOST_JOB = r"""
import signal, sys, time
log, node = sys.argv[1], sys.argv[2]
held = open(node, "rb")

def note(signum, frame):
    with open(log, "a") as f:
        f.write(f"{signum}\n")

for s in signal.valid_signals():
    if s not in (signal.SIGKILL, signal.SIGSTOP):
        try:
            signal.signal(s, note)
        except (OSError, ValueError):
            pass
print("ready", flush=True)
while True:
    time.sleep(3600)
"""


def intact(pid):
    """Alive, and not stopped (SIGSTOP leaves a process alive but frozen)."""
    if not alive(pid):
        return False
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        return f.read().rsplit(")", 1)[1].split()[0] not in ("T", "t")


class Scene:
    """The simulated host and everything on it that no example may signal."""

    def __init__(self, host, collection, vmid, job, job_log):
        self.host = host
        self.collection = collection
        self.vmid = vmid
        self.job = job
        self.job_log = job_log
        self.dev = os.path.join(host.dir, "dev", "nvidia*")
        self.daemon = host.hold(gpus=[0], mib=16, device_only=True, name="nvidia-persistenced")
        host.ct_create(vmid)
        host.ct_start(vmid)
        self.in_ct = host.hold(gpus=[1], mib=1024, ct=vmid, name="python3 -m vllm.entrypoints.openai.api_server")
        host.register(job.pid, {2: 512})
        # A long argument of a's: the exponential pattern "a?"*25 + "a"*25 backtracks on it.
        self.server = host.hold(gpus=[3, 4], mib=2048, tree=True, name="python3 -m sglang.launch_server --tag " + "a" * 40)
        self.stubborn = host.hold(gpus=[5], mib=512, ignore_term=True, name="python3 stubborn.py")
        # The server's workers: the processes the driver lists on GPUs 3 and 4.
        self.workers = sorted({p["pid"] for p in host.procs()[0] if p["gpu"] in (3, 4)} - {self.server})
        assert len(self.workers) == 2, host.procs()
        self.pids = {"daemon": self.daemon, "in_ct": self.in_ct, "job": job.pid, "server": self.server,
                     "stubborn": self.stubborn, **{f"worker{n}": w for n, w in enumerate(self.workers)}}
        facts, out = self.run("gpu_facts", {"device_files": [self.dev], "gpus": ["7"]})
        assert "ansible_facts" in facts, out
        gpu7 = facts["ansible_facts"]["gpu_devices"][0]
        self.tokens = {"@dev": self.dev, "@dev[0-3]": self.dev[:-1] + "[0-3]", "@dev?": self.dev[:-1] + "?",
                       "@dev[": self.dev[:-1] + "[", "@dev**": self.dev + "*", "@smi": os.path.join(host.dir, "bin", "nvidia-smi"),
                       "@pct": os.path.join(host.dir, "bin", "pct"), "@uuid7": gpu7["uuid"], "@uuid7-lower": gpu7["uuid"].lower(),
                       "@bus7": gpu7.get("pci_bus_id") or "0", "@vmid": vmid, "@vmid-text": str(vmid),
                       "@vmid-twice": f"{vmid},{vmid}", "@self": os.getpid(), "@parent": os.getppid(),
                       **{f"@pid:{k}": p for k, p in self.pids.items()}}
        self.victims = 0

    def resolve(self, value):
        """The generated value with its "@name" tokens replaced by this host's values."""
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, str) and value.startswith("@"):
            return self.tokens.get(value, value)
        return value

    def run(self, name, args, check_mode=False):
        return run_module_in_process(self.host, self.collection, name, args, check_mode=check_mode)

    def signals_logged(self):
        with open(self.job_log, encoding="utf-8") as f:
            return f.read().split()

    def assert_untouched(self, what):
        hurt = {k: p for k, p in self.pids.items() if not intact(p)}
        assert not hurt, f"{what}: signalled or gone: {hurt}"
        assert self.signals_logged() == [], f"{what}: the host job got signals {self.signals_logged()}"


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    factory = GpusimFactory()
    job = None
    try:
        host = factory()
        root = tmp_path_factory.mktemp("collections")
        (root / "ansible_collections" / "gpuops").mkdir(parents=True)
        os.symlink(TOP, root / "ansible_collections" / "gpuops" / "gpu")
        job_log = str(root / "host-job.log")
        open(job_log, "w", encoding="utf-8").close()
        job = subprocess.Popen([sys.executable, "-c", HOST_JOB, job_log, os.path.join(host.dir, "dev", "nvidia2")],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert job.stdout.readline().strip() == "ready"
        yield Scene(host, str(root), vmid_of_this_worker(), job, job_log)
    finally:
        if job is not None:
            job.kill()
            job.wait(timeout=10)
            job.stdout.close()
        problems = factory.finish()
    if problems:
        pytest.fail("gpusim teardown: " + "; ".join(problems), pytrace=False)


# --- generators -----------------------------------------------------------------------------
# Values that depend on the host (its directory, its GPU 7, its pids) are generated as "@name"
# tokens and resolved before each run (Scene.resolve).

NAN, INF = float("nan"), float("inf")
LONG = "x" * 10000
UNICODE_DIGITS = ["١٢", "１２", "²", "٣", "１", "௧௨"]
# Numbers that must be refused, or are small: never a valid long wait.
HOSTILE_NUMBERS = [NAN, INF, -INF, 1e18, -1e18, -0.0, 2 ** 63, -1, -1e-9, "1e18", "nan", "inf", "-inf", "Infinity", "0x10",
                   "1_0", "", " ", "10 s", "sNaN", *UNICODE_DIGITS, True, [], {}, [1], None]
# ansible-core 2.21.5 check_type_int raises OverflowError for infinities (see test_an_infinite_integer_option_fails_cleanly):
# kept out of the integer options here.
HOSTILE_INTEGERS = [NAN, 1e18, 2 ** 63, -2 ** 63, 10 ** 30, -1, 0, 1.5, "1.5", "1e3", "1e18", "nan", "sNaN", "0x10", "",
                    " 12 ", "abc", *UNICODE_DIGITS, True, [], {}, None]
BOOLS = st.sampled_from([True, False, "yes", "no", "maybe", 1, 0, 2, "", None])


def _number(value):
    """The seconds a run accepted for an option (0 when it would be refused or absent)."""
    try:
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return value if math.isfinite(value) and 0 <= value <= 86400 else 0.0


# For the options that make a run wait (timeout, delay, a real grace_period): AnsibleModule turns "١٢", "１２" and
# "1_0" into 12.0 and 10.0 (Python's float() reads them), and the module waits that long.
SMALL_OR_REFUSED = [v for v in HOSTILE_NUMBERS if _number(v) <= 3]


def small_seconds(high):
    return st.floats(min_value=0.0, max_value=high)


def seconds(high):
    """A time option: small, or hostile (refused, or small)."""
    return st.one_of(small_seconds(high), st.sampled_from(SMALL_OR_REFUSED))


def integers():
    return st.one_of(st.integers(min_value=-2 ** 70, max_value=2 ** 70), st.sampled_from(HOSTILE_INTEGERS))


NAMES = st.one_of(st.sampled_from(["root", "nobody", "", " ", "ßüñ", "用户", "0", "-1", "4294967295", "99999999999999999999",
                                   "a\x00b", LONG, "é" * 10000]), st.text(max_size=20))
REGEX = st.one_of(st.sampled_from([
    "(a+)+$", "(a|aa)*b", "((a*)*)*", "(x+x+)+y", "(.*)*", "(?:a{1,100}){1,100}", "(a?){30}a{30}",
    "a?" * 25 + "a" * 25,  # no nested repeat: only the time budget stops it (the server's command line has 40 a's)
    ".*.*.*.*=", "a" * 5000, "(" * 5000, "x" * 1000, "[", "(", "\\", "*", "(?P<x>a)(?P=x)", "(?<=a+)b",
    "x{99999}", "x{1,4294967296}", "(" * 300 + "a" + ")" * 300, "(?:" * 240 + "a+" + ")" * 240,
    "(" * 120 + "a" + ")+" * 120, "^python3", "sglang", "(?i)SGLANG", "\\d+", "(?s).", "\x00", "ä+", "[^\\W\\d_]+",
    "vllm|sglang", "", " ", None, 5, [], {"a": 1},
]), st.text(max_size=30))
REGEXES = st.one_of(st.lists(REGEX, max_size=3), st.sampled_from(["(a+)+$", None, 7]))
DEVICE_FILES = st.one_of(st.lists(st.one_of(st.sampled_from([
    "/dev/*", "/dev/null*", "relative", "/dev/nvidia[", "/dev/nvidia**", "/" + "a" * 5000, "/dev/nvidia*" * 500,
    "@dev", "@dev[0-3]", "@dev?", "@dev[", "@dev**", "", " ", "\x00", "/dev/nvidia\x00", "//dev//nvidia*", "/proc/*/fd/*",
    "/dev/../dev/nvidia*", "/dev/nvidia{0,1}", "/dev/nvidia*/../../*", "/**", "/", "~/x", "$HOME/*", None, 5,
]), st.text(max_size=20)), max_size=3), st.sampled_from(["/dev/*", None]))
GPUS = st.one_of(st.lists(st.one_of(st.sampled_from([
    "0", "0", "9999", "-1", "GPU-xyz", "00000000:ZZ:00.0", "7", " 7 ", "4095", "4096", "GPU-", "MIG-1", "", " ", "1,2", "0x1",
    "00000000:18:00.0", "@uuid7", "@uuid7-lower", "@bus7", LONG, 7, 7.0, -0.0, None, [], *UNICODE_DIGITS,
]), st.text(max_size=12)), max_size=6), st.sampled_from(["0", "7", None, 7]))
SIGNALS = st.one_of(st.sampled_from([
    "SIGFOO", "0", "-9", "KILL", 64, 99, 0, -15, 9.5, 2 ** 63, "SIGTERM", "term", "15", "SIGRTMIN", "SIGRTMIN+1", "١٥", "９",
    "SIG", "", " ", "SIGKILL\x00", "SIGSTOP", "CONT", "chld", "9" * 400, None, [],
]), st.text(max_size=12), st.integers(min_value=-100, max_value=300))
BACKEND = st.sampled_from(["auto", "nvml", "nvidia-smi", "cuda", "", " NVML", None, 3])
SMI_PATH = st.sampled_from(["nvidia-smi", "@smi", "/nonexistent/nvidia-smi", "relative/x", "", LONG, "/" + "a" * 5000,
                            "nvidia-smi\x00", "/bin/false", "/bin/true", "/dev/null", "/etc", "ñvidia", None])
QUERY_TIMEOUT = st.one_of(st.floats(min_value=1e-6, max_value=5.0), st.sampled_from(HOSTILE_NUMBERS + [301, 300]))
COMMON = {  # the options every module shares (the doc fragment gpuops.gpu.gpu)
    "gpus": GPUS, "backend": BACKEND, "nvidia_smi_path": SMI_PATH, "query_timeout": QUERY_TIMEOUT, "device_files": DEVICE_FILES,
    "allow_any_device_files": BOOLS, "include_device_holders": BOOLS, "protect": REGEXES, "redact": REGEXES, "cmdline": BOOLS,
}
IDLE = {"max_memory_used_mib": integers(), "max_utilization_pct": integers()}
PIDS = st.one_of(st.lists(st.one_of(st.sampled_from([
    0, -1, 1, 2, "@self", "@parent", 4194304, 4194305, 2 ** 31, 2 ** 63, -2 ** 63, "12", "١٢", "1.5", 1.5, "abc", None,
    "@pid:daemon", "@pid:in_ct", "@pid:job", "@pid:server", "@pid:stubborn", "@pid:worker0",
]), st.integers()), max_size=5), st.sampled_from(["@pid:server", None, "1"]))
CONTAINERS = st.one_of(st.lists(st.one_of(st.sampled_from([
    "@vmid", "@vmid-text", 0, 99, 100, 999999999, 1000000000, -1, 2 ** 63, "١٢٩", "abc", 1.5, None,
]), st.integers()), max_size=4), st.sampled_from(["129", None, 129]))


# Valid values of each option: an example takes a few of these and at most two hostile options.
VALID_COMMON = {
    "gpus": st.lists(st.sampled_from(["0", "3", "5", "6", "7", "@uuid7", "@bus7"]), max_size=3),
    "backend": st.sampled_from(["auto", "nvml", "nvidia-smi"]), "nvidia_smi_path": st.sampled_from(["@smi", "nvidia-smi"]),
    "query_timeout": st.floats(min_value=0.5, max_value=10.0), "device_files": st.sampled_from([["@dev"], ["@dev[0-3]"]]),
    "allow_any_device_files": st.booleans(), "include_device_holders": st.booleans(),
    "protect": st.lists(st.sampled_from(["stubborn", "^python3 -m vllm", "sglang"]), max_size=2),
    "redact": st.lists(st.sampled_from(["--tag \\S+", "a{3,}"]), max_size=2), "cmdline": st.booleans(),
}
VALID_IDLE = {"max_memory_used_mib": st.integers(min_value=0, max_value=100000), "max_utilization_pct": st.integers(0, 100)}
VALID_RELEASE = dict(
    VALID_COMMON, containers=st.just(["@vmid"]), users=st.sampled_from([["root"], ["0"], ["nobody"]]),
    match=st.sampled_from(["sglang", "vllm", "stubborn$", "^python3"]), exclude=st.sampled_from(["vllm", "sglang"]),
    pids=st.lists(st.sampled_from(["@pid:server", "@pid:in_ct", "@pid:stubborn", "@pid:worker0", "@pid:daemon"]), max_size=2),
    tree=st.booleans(), signal=st.sampled_from(["SIGTERM", "TERM", "15", "SIGINT", "KILL", 64]),
    grace_period=st.floats(min_value=0, max_value=86400), escalate=st.booleans(), kill_timeout=st.floats(min_value=0, max_value=86400),
    fail_on_survivors=st.booleans(), stop_units=st.booleans(), all=st.booleans(), expected_count=st.sampled_from([8, 0, 7]),
)
HOSTILE_RELEASE = dict(
    COMMON, containers=CONTAINERS, users=st.one_of(st.lists(NAMES, max_size=3), NAMES), match=REGEX, exclude=REGEX, pids=PIDS,
    tree=BOOLS, signal=SIGNALS, grace_period=st.one_of(st.floats(), st.sampled_from(HOSTILE_NUMBERS)), escalate=BOOLS,
    kill_timeout=st.one_of(st.floats(), st.sampled_from(HOSTILE_NUMBERS)), fail_on_survivors=BOOLS, stop_units=BOOLS, all=BOOLS,
    expected_count=integers(),
)
VALID_FACTS = dict(VALID_COMMON, **VALID_IDLE, gather=st.lists(st.sampled_from(["processes", "holders"]), unique=True),
                   missing=st.sampled_from(["fail", "ignore"]))
HOSTILE_FACTS = dict(COMMON, **IDLE, gather=st.one_of(st.lists(st.sampled_from(["processes", "holders", "memory", "", None]),
                                                               max_size=3), st.sampled_from(["processes", None])),
                     missing=st.sampled_from(["fail", "ignore", "FAIL", "", None]))
VALID_WAIT = dict(
    VALID_COMMON, **VALID_IDLE, expected_count=st.sampled_from([8, 0]), delay=small_seconds(0.3),
    sleep=st.one_of(st.floats(min_value=0.05, max_value=0.5), st.just(3600.0)), msg=st.sampled_from(["redeploy", "ünïcode"]),
    confirm_with_nvidia_smi=st.booleans(), progress_slice=st.floats(min_value=0.01, max_value=0.5),
)
HOSTILE_WAIT = dict(
    COMMON, **IDLE, expected_count=integers(), timeout=seconds(0.8), settle=seconds(0.5), delay=seconds(0.3),
    sleep=st.one_of(st.floats(min_value=0.05, max_value=0.5), st.sampled_from(HOSTILE_NUMBERS + [0, 1e-9, 3600, 86400])),
    msg=st.one_of(NAMES, st.sampled_from([None, 5, []])), confirm_with_nvidia_smi=BOOLS,
    progress_slice=st.one_of(st.floats(min_value=0.01, max_value=0.5), st.sampled_from(HOSTILE_NUMBERS)),
    # Only states that the validation refuses: one it lets through crashes (test_a_garbled_progress_state_fails_cleanly).
    progress_state=st.sampled_from([None, {}, {"wait": "x"}, {"wait": {}, "offset": NAN}, {"wait": {}, "offset": 1e18},
                                    {"wait": {}, "offset": -1}, {"offset": 1}, "x", []]),
)
VALID_PVC = {
    "containers": st.sampled_from([["@vmid"], [], "@vmid-text", "@vmid-twice"]), "services": st.sampled_from([[], ["sglang"], ["vllm@0"]]),
    "state": st.sampled_from(["present", "shutdown"]), "shutdown_timeout": st.integers(0, 86400), "force": st.booleans(),
    "pct": st.sampled_from(["pct", "@pct"]), "backend": VALID_COMMON["backend"], "nvidia_smi_path": VALID_COMMON["nvidia_smi_path"],
    "query_timeout": VALID_COMMON["query_timeout"],
}
HOSTILE_PVC = {
    "containers": st.one_of(st.lists(st.sampled_from(["@vmid", "@vmid-text", 0, 99, -1, 2 ** 63, 1e18, NAN, INF, "١٢٩", "abc",
                                                      "129,130", None, {"a": 1}, [], True, LONG]), max_size=4),
                            st.sampled_from(["@vmid-twice", "", None, "@vmid"])),
    "services": st.one_of(st.lists(st.one_of(st.sampled_from(["sglang", "sglang.service", "vllm@0.service", "a b", "../x", "-x",
                                                              "x" * 300, "", "ünit", "a;b", "$(id)", None, 5]),
                                             st.text(max_size=12)), max_size=3), st.sampled_from(["sglang,vllm", None])),
    "state": st.sampled_from(["present", "shutdown", "stopped", "", None]),
    "shutdown_timeout": integers(),
    "force": BOOLS,
    "pct": st.sampled_from(["pct", "@pct", "/nonexistent/pct", "", LONG, "pct\x00", "/bin/false", "/bin/true", "/dev/null", None]),
    "backend": BACKEND, "nvidia_smi_path": SMI_PATH, "query_timeout": QUERY_TIMEOUT,
}


@st.composite
def arguments(draw, valid, hostile, required=None):
    """A few valid options, then up to two hostile ones (which may replace a valid one)."""
    args = {name: draw(strategy) for name, strategy in (required or {}).items()}
    for name in draw(st.lists(st.sampled_from(sorted(valid)), unique=True, max_size=4)):
        args[name] = draw(valid[name])
    for name in draw(st.lists(st.sampled_from(sorted(hostile)), unique=True, max_size=2)):
        args[name] = draw(hostile[name])
        event(f"hostile {name}")
    return args


DEV = {"device_files": st.just(["@dev"])}
RELEASE_ARGS = arguments(VALID_RELEASE, HOSTILE_RELEASE, DEV)
FACTS_ARGS = arguments(VALID_FACTS, HOSTILE_FACTS, DEV)
# The wait's timeout is always given and small (the default is 300 s), and so is settle (its default, 1 s, is above
# the timeout), unless hostile ones replace them.
WAIT_ARGS = arguments(VALID_WAIT, HOSTILE_WAIT, dict(DEV, timeout=st.floats(min_value=0.2, max_value=0.8), settle=small_seconds(0.2)))
PVC_ARGS = arguments(VALID_PVC, HOSTILE_PVC)


def cleanly_done(res, out, args, situations=()):
    """Success, or a clean failure; a refused input names one of the options given. Returns the outcome."""
    assert "Traceback" not in out and "MODULE FAILURE" not in out, out[-3000:]
    assert "exception" not in res and "module_stderr" not in res, res
    if not res.get("failed"):
        return "ok"
    msg = res.get("msg")
    assert isinstance(msg, str) and msg.strip(), res
    if any(s in msg for s in situations) or res.get("error") in ("timeout", "backend", "gpu_lost"):
        return "failed: the host's answer"  # to valid input (a wait that timed out, a refused scope): not a refusal
    named = [o for o in args if re.search(rf"\b{re.escape(o)}\b", msg)]
    assert named, f"a failure that names none of the options {sorted(args)}: {msg[:500]}"
    return "refused, naming " + ", ".join(sorted(named)[:1])


def bound(args, base):
    """Seconds a run may take: base, plus the time budget of each regular expression option given."""
    return base + 2.5 * sum(1 for o in ("protect", "redact", "match", "exclude") if args.get(o))


def timed(scene, name, args, check_mode):
    """One in-process run and its wall time; a run that hangs has its stack dumped after HANG_S.
    FUZZ_TRACE=1 prints each run's arguments, time and message (stderr; pytest -s shows them)."""
    trace = os.environ.get("FUZZ_TRACE")
    if trace:
        print(f"\n{name} check_mode={check_mode} {args!r:.600}", file=sys.stderr, flush=True)
    start = time.monotonic()
    faulthandler.dump_traceback_later(HANG_S)
    try:
        res, out = scene.run(name, args, check_mode=check_mode)
    finally:
        faulthandler.cancel_dump_traceback_later()
    took = time.monotonic() - start
    if trace:
        print(f"  -> {took:.2f} s, {res.get('msg', '')!s:.300}", file=sys.stderr, flush=True)
    return res, out, took


# --- the modules, any input ---------------------------------------------------------------------

@fuzz(100)
@given(args=FACTS_ARGS, check_mode=st.booleans())
@example(args={"device_files": ["/dev/nvidia["], "redact": ["(a|aa)*b"]}, check_mode=False)
@example(args={"device_files": ["@dev"], "gpus": ["１２", "0", "0", "9999", "-1", "GPU-xyz", "00000000:ZZ:00.0"]}, check_mode=False)
@example(args={"device_files": ["/dev/null*"], "allow_any_device_files": True, "redact": ["a?" * 25 + "a" * 25]}, check_mode=True)
@example(args={"device_files": ["@dev"], "max_memory_used_mib": 2 ** 63, "max_utilization_pct": "١٢"}, check_mode=False)
def test_gpu_facts_any_input(scene, args, check_mode):
    args = scene.resolve(args)
    res, out, took = timed(scene, "gpu_facts", args, check_mode)
    event(cleanly_done(res, out, args))
    assert took < bound(args, BASE_BOUND_S), f"gpu_facts took {took:.1f} s"
    scene.assert_untouched("gpu_facts")


@fuzz(200)
@given(args=RELEASE_ARGS)
@example(args={"device_files": ["@dev"], "grace_period": 1e18, "pids": ["@pid:server"]})
@example(args={"device_files": ["@dev"], "grace_period": NAN, "kill_timeout": INF, "containers": ["@vmid"]})
@example(args={"device_files": ["@dev"], "signal": "SIGFOO", "match": "sglang"})
@example(args={"device_files": ["@dev"], "signal": 99, "match": "sglang"})
@example(args={"device_files": ["@dev"], "signal": 64, "match": "sglang", "tree": True})
@example(args={"device_files": ["@dev"], "pids": [2 ** 63, 0, -1]})
@example(args={"device_files": ["@dev"], "match": "a?" * 25 + "a" * 25})
@example(args={"device_files": ["@dev"], "match": "(a+)+$", "exclude": "(a|aa)*b"})
@example(args={"device_files": ["/dev/*"], "allow_any_device_files": True, "all": True})
@example(args={"device_files": ["@dev"], "users": ["a\x00b", "é" * 10000]})
@example(args={"device_files": ["@dev"], "containers": ["١٢٩"], "gpus": ["0", "0", "9999"]})
def test_gpu_release_any_input_in_check_mode(scene, args):
    args = scene.resolve(args)
    res, out, took = timed(scene, "gpu_release", args, True)
    event(cleanly_done(res, out, args, situations=("Nothing was signalled",)))
    assert took < bound(args, BASE_BOUND_S), f"gpu_release took {took:.1f} s"
    if not res.get("failed"):
        assert all(not x["signals"] for x in res["released"]), res["released"]
    scene.assert_untouched("gpu_release in check mode")


@fuzz(40)
@given(args=WAIT_ARGS, check_mode=st.booleans())
@example(args={"device_files": ["@dev"], "timeout": "1e18"}, check_mode=False)
@example(args={"device_files": ["@dev"], "timeout": 0.5, "settle": 0.1, "sleep": 3600}, check_mode=False)
@example(args={"device_files": ["@dev"], "gpus": ["7"], "timeout": 0.5, "settle": 0.1, "sleep": 86400}, check_mode=False)
@example(args={"device_files": ["@dev"], "timeout": 0.5, "settle": 0.1, "delay": NAN}, check_mode=False)
def test_gpu_wait_idle_any_input(scene, args, check_mode):
    args = scene.resolve(args)
    res, out, took = timed(scene, "gpu_wait_idle", args, check_mode)
    event(cleanly_done(res, out, args, situations=("timed out after", "nvidia-smi disagrees")))
    limit = BASE_BOUND_S + (0 if check_mode else _number(args.get("delay")) + _number(args.get("timeout")))
    assert took < bound(args, limit), f"gpu_wait_idle took {took:.1f} s (bound {limit:.1f} s)"
    scene.assert_untouched("gpu_wait_idle")


@fuzz(30)
@given(args=PVC_ARGS)
@example(args={"containers": ["١٢٩"]})
@example(args={"containers": ["@vmid"], "services": ["$(id)"]})
@example(args={"containers": ["@vmid"], "pct": "pct\x00"})
@example(args={"containers": ["@vmid"], "state": "shutdown", "shutdown_timeout": 2 ** 63})
@example(args={"containers": ["@vmid"], "state": "shutdown", "force": True})
def test_proxmox_gpu_containers_any_input_in_check_mode(scene, args):
    args = scene.resolve(args)
    res, out, took = timed(scene, "proxmox_gpu_containers", args, True)
    event(cleanly_done(res, out, args, situations=("Nothing was stopped",)))
    assert took < PCT_BOUND_S, f"proxmox_gpu_containers took {took:.1f} s"
    scene.assert_untouched("proxmox_gpu_containers in check mode")


# --- a real release, tightly scoped to a fresh holder -------------------------------------------

# Valid: short enough to run for real. At most two of grace_period, kill_timeout and signal are hostile.
REAL_VALID = {"signal": st.sampled_from(["SIGTERM", "INT", 9, "SIGUSR1", "hup", "SIGCONT"]), "escalate": st.booleans(),
              "tree": st.booleans()}
REAL_HOSTILE = {"grace_period": st.sampled_from(SMALL_OR_REFUSED), "kill_timeout": st.sampled_from(SMALL_OR_REFUSED),
                "signal": SIGNALS}
REAL_ARGS = arguments(REAL_VALID, REAL_HOSTILE, {"grace_period": small_seconds(1.0), "kill_timeout": small_seconds(1.0)})
# The history: grace_period 1e18 sent a signal and then crashed; nan skipped the grace period.
HISTORY = [1e18, "1e18", NAN, INF]


@fuzz(8)
@given(args=REAL_ARGS, ignore_term=st.booleans(), scope=st.sampled_from(["pids", "match", "both"]))
@example(args={"grace_period": 1e18, "kill_timeout": 1.0, "signal": "SIGTERM"}, ignore_term=True, scope="pids")
@example(args={"grace_period": "1e18", "kill_timeout": 1.0}, ignore_term=True, scope="match")
@example(args={"grace_period": NAN, "kill_timeout": 1.0, "escalate": True}, ignore_term=True, scope="pids")
@example(args={"grace_period": INF, "kill_timeout": 1.0}, ignore_term=False, scope="both")
@example(args={"grace_period": 0.5, "kill_timeout": NAN}, ignore_term=True, scope="pids")
def test_a_real_release_signals_only_the_scoped_holder(scene, args, ignore_term, scope):
    """A fresh holder on GPU 6 (named uniquely), released for real with args scoped to it."""
    host = scene.host
    scene.victims += 1
    tag = f"fuzz-victim-{scene.victims}"
    victim = host.hold(gpus=[6], mib=256, name=f"python3 {tag}", ignore_term=ignore_term)
    args = dict(args, device_files=[scene.dev], gpus=["6"])
    if scope in ("pids", "both"):
        args["pids"] = [victim]
    if scope in ("match", "both"):
        args["match"] = tag + "$"
    try:
        res, out, took = timed(scene, "gpu_release", args, False)
        cleanly_done(res, out, args, situations=("survived",))
        # Refused: failed before anything was signalled (no release, no survivor of one).
        refused = res.get("failed") and not (res.get("released") or res.get("survivors"))
        event("refused" if refused else "survived" if res.get("failed") else "released")
        if any(args["grace_period"] is v or args["grace_period"] == v for v in HISTORY):
            assert refused and "grace_period" in res["msg"], res
        if refused:
            assert intact(victim), f"refused ({res['msg'][:200]}) but the holder was signalled"
        else:
            assert {x["pid"] for x in res["released"]} <= {victim}, res["released"]
            limit = BASE_BOUND_S + _number(args["grace_period"]) + _number(args["kill_timeout"])
            assert took < limit, f"a release with {args} took {took:.1f} s"
            if not res.get("failed"):
                assert not alive(victim), res
        scene.assert_untouched("a scoped release")
    finally:
        if alive(victim):
            os.kill(victim, signal.SIGCONT)
            host.kill(victim)


# --- intermittent NVML errors ------------------------------------------------------------------

@fuzz(10)
@given(every=st.integers(min_value=1, max_value=6), name=st.sampled_from(["gpu_release", "gpu_wait_idle", "gpu_facts"]))
def test_intermittent_nvml_errors_never_make_a_busy_gpu_look_free(scene, every, name):
    """GPU 3 is held by a worker of the server; every n-th NVML call answers UNKNOWN."""
    args = {"device_files": [scene.dev], "gpus": ["3"], "query_timeout": 1.0}
    if name == "gpu_wait_idle":
        args.update(timeout=0.3, settle=0.1, sleep=0.05)
    if name == "gpu_release":
        args["match"] = "sglang"
    scene.host.fault(unknown_every=every)
    try:
        res, out, took = timed(scene, name, args, name == "gpu_release")
    finally:
        scene.host.fault(unknown_every=0)
    event(f"{name}: " + cleanly_done(res, out, args, situations=("timed out after", "could not be read", "Nothing was signalled")))
    assert took < BASE_BOUND_S + 2 * args["query_timeout"], f"{name} took {took:.1f} s"
    if not res.get("failed"):
        assert name != "gpu_wait_idle", f"the wait found a held GPU idle: {res.get('msg')}"
        if name == "gpu_facts":
            assert not res["ansible_facts"]["gpu_devices"][0]["idle"], res["ansible_facts"]["gpu_devices"][0]
        else:
            assert {x["pid"] for x in res["released"]} & set(scene.workers), res["released"]
    scene.assert_untouched("intermittent NVML errors")


# --- ansible-core's integer conversion ---------------------------------------------------------

INFINITE = [("gpu_facts", "max_memory_used_mib", INF), ("gpu_wait_idle", "expected_count", "inf"),
            ("gpu_release", "pids", [INF]), ("gpu_release", "containers", ["-inf"]),
            ("proxmox_gpu_containers", "shutdown_timeout", "Infinity")]


@pytest.mark.parametrize("name, option, value", INFINITE, ids=[f"{n}-{o}" for n, o, _v in INFINITE])
def test_an_infinite_integer_option_fails_cleanly(scene, name, option, value):
    res, out = scene.run(name, {"device_files": [scene.dev], option: value}, check_mode=True)
    cleanly_done(res, out, {option: value})
    assert res.get("failed")
    scene.assert_untouched(f"{name} {option}={value!r}")


# --- inputs that crash ------------------------------------------------------------------------

@pytest.mark.parametrize("state", [{"wait": {}}, {"wait": {"polls": "x"}}], ids=["no polls", "polls x"])
def test_a_garbled_progress_state_fails_cleanly(scene, state):
    args = {"device_files": [scene.dev], "timeout": 0.5, "settle": 0.1, "progress_state": state}
    res, out = scene.run("gpu_wait_idle", args)
    cleanly_done(res, out, args)
    assert res.get("failed") and "progress_state" in res["msg"], res


# --- the roles' variables -------------------------------------------------------------------

PLAY = """\
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: gpuops.gpu.{role}
"""


def run_role(scene, role, variables, check_mode=True):
    """ansible-playbook of one role on localhost with these extra variables (YAML: .nan stays a float)."""
    with tempfile.TemporaryDirectory(prefix="fuzz-role-") as work:
        play = os.path.join(work, "play.yml")
        with open(play, "w", encoding="utf-8") as f:
            f.write(PLAY.format(role=role))
        extra = os.path.join(work, "vars.yml")
        with open(extra, "w", encoding="utf-8") as f:
            yaml.safe_dump(dict(variables, gpuops_device_files=[scene.dev]), f)
        env = controller_env(scene.collection, work, base=scene.host.env(), ANSIBLE_REMOTE_TEMP=os.path.join(work, "remote-tmp"),
                             ANSIBLE_PYTHON_INTERPRETER=sys.executable)
        argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
                "-e", "@" + extra, play] + (["--check"] if check_mode else [])
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    return proc.returncode, proc.stdout + proc.stderr


ROLE_VALUES = {
    ("gpu_idle", "gpu_idle_timeout"): [NAN, INF, "soon", -1, 1e18, "١٢", [1], {"a": 1}],
    ("gpu_idle", "gpu_idle_gpus"): [["²"], ["GPU-zz"], [["0"]], ["00000000:ZZ:00.0"], [{"a": 1}], ["-1"]],
    ("proxmox_fence", "proxmox_fence_containers"): [[42], ["abc"], [2 ** 63], [-1], [[129]], [1.5]],
    ("proxmox_fence", "proxmox_fence_services"): [["a b"], ["../x"], ["x" * 300], ["ünit"], ["$(id)"], [["sglang"]]],
}
ROLE_CASES = st.sampled_from(sorted(ROLE_VALUES)).flatmap(lambda k: st.tuples(st.just(k), st.sampled_from(ROLE_VALUES[k])))


# Each ansible-playbook run takes 2-3 s: one example per variable, and two generated ones. In check mode, with the
# release scoped (gpu_idle), so that each bad value reaches the task that must refuse it.
@fuzz(2)
@given(case=ROLE_CASES)
@example(case=(("gpu_idle", "gpu_idle_timeout"), NAN))
@example(case=(("gpu_idle", "gpu_idle_gpus"), ["１"]))
@example(case=(("proxmox_fence", "proxmox_fence_containers"), [42]))
@example(case=(("proxmox_fence", "proxmox_fence_services"), ["a b"]))
def test_a_role_refuses_a_bad_variable_naming_it(scene, case):
    (role, variable), value = case
    variables = {"gpu_idle_release": True, "gpu_idle_release_pids": [scene.stubborn], "gpu_idle_timeout": 2} if role == "gpu_idle" else {}
    rc, out = run_role(scene, role, dict(variables, **{variable: value}))
    assert rc != 0, f"{role} accepted {variable}={value!r}: {out[-2000:]}"
    assert "Traceback" not in out and "MODULE FAILURE" not in out and '"exception":' not in out, out[-3000:]
    # The role's own argument spec names the variable; a value that passes it (a list of strings, a float) and that
    # the module refuses is named by the module's option the variable maps onto ("gpus: '²' is neither ...").
    option = variable[len(role) + 1:]
    named = variable if variable in out else option if re.search(rf"\b{option}\b", out) else None
    assert named, f"{role}: the failure for {variable}={value!r} names neither it nor {option}: {out[-2000:]}"
    event(f"{variable}: named {'the variable' if named == variable else 'the option'}")
    scene.assert_untouched(f"{role} {variable}={value!r}")


def test_gpu_idle_refuses_a_bad_timeout_before_it_releases(scene):
    victim = scene.host.hold(gpus=[6], mib=256, name="python3 fuzz-role-victim")
    try:
        rc, out = run_role(scene, "gpu_idle", {"gpu_idle_release": True, "gpu_idle_release_pids": [victim], "gpu_idle_gpus": ["6"],
                                               "gpu_idle_release_grace_period": 1, "gpu_idle_timeout": NAN}, check_mode=False)
        assert rc != 0 and "timeout" in out, out[-2000:]
        assert intact(victim), "the holder was signalled before the bad timeout was refused"
    finally:
        if alive(victim):
            scene.host.kill(victim)
        scene.assert_untouched("gpu_idle with gpu_idle_timeout=nan")
