"""Bad input fails cleanly before anything is read or signalled, naming the option.

Each module runs with each bad value against a simulated host with a holder. The host answers
every NVML call only after a delay, so a module that read anything before failing would be
slow; the result must be a failure that names the option, with no traceback, and the holder
must still be alive.
"""

import os
import time

import pytest

from modrun import alive, run_module_text

MODULES = ("gpu_facts", "gpu_release", "gpu_wait_idle")
# What YAML gives for `grace_period: 1e18` (PyYAML reads it as a string), `nan`, `inf`.
COMMON = [
    ("query_timeout", "inf"), ("query_timeout", "nan"), ("query_timeout", 0), ("query_timeout", 301),
    ("gpus", ["²"]), ("gpus", ["١"]), ("gpus", ["0", "GPU-zz"]),
    ("protect", ["(a+)+b"]), ("redact", ["(a*)*"]), ("device_files", ["dev/nvidia*"]),
]
IDLE = [("max_memory_used_mib", -1), ("max_utilization_pct", 101)]
RELEASE = [
    ("grace_period", "1e18"), ("grace_period", "inf"), ("grace_period", "nan"), ("grace_period", -1),
    ("kill_timeout", "nan"), ("kill_timeout", "inf"), ("kill_timeout", "1e18"),
    ("match", "(a+)+b"), ("exclude", "(a|aa)+"), ("match", "("),
    ("pids", [0]), ("pids", [4194305]), ("signal", "²"), ("signal", "١٥"), ("containers", [42]),
]
WAIT = [
    ("timeout", "nan"), ("timeout", "inf"), ("timeout", "1e18"), ("settle", "nan"), ("delay", "nan"),
    ("delay", "inf"), ("sleep", "1e-9"), ("sleep", 0), ("expected_count", -1), ("expected_count", 2000),
]
CASES = ([(m, o, v) for m in MODULES for o, v in COMMON]
         + [(m, o, v) for m in ("gpu_facts", "gpu_wait_idle") for o, v in IDLE]
         + [("gpu_release", o, v) for o, v in RELEASE]
         + [("gpu_wait_idle", o, v) for o, v in WAIT])
# Every NVML call of the simulated library sleeps this long (nvidia-smi's calls too).
DELAY_MS = 4000


def assert_clean_failure(res, out, option):
    assert res.get("failed"), res
    assert option in res["msg"], res["msg"]
    assert "module_stderr" not in res and "exception" not in res, res
    assert "Traceback" not in out, out[-2000:]


@pytest.mark.parametrize("module, option, value", CASES, ids=[f"{m}-{o}={v!r}" for m, o, v in CASES])
def test_bad_input_fails_naming_the_option_and_signals_nothing(gpusim, collection, module, option, value):
    holder = gpusim.hold(gpus=[0], mib=1024, name="python3 -m sglang.launch_server")
    gpusim.fault(call_delay_ms=DELAY_MS)
    args = {"device_files": [os.path.join(gpusim.dir, "dev", "nvidia*")], option: value}
    if module == "gpu_wait_idle" and option != "timeout":
        args.setdefault("timeout", 2)
    start = time.monotonic()
    res, out = run_module_text(gpusim, collection, module, args)
    took = time.monotonic() - start
    assert_clean_failure(res, out, option)
    assert took < DELAY_MS / 1000.0, f"{module} took {took:.1f} s: it read the GPUs before failing"
    assert alive(holder)


# A long command line and a pattern that passes the static check but backtracks polynomially: the
# time budget stops the search and the task fails naming the option; nothing is signalled.
SLOW = ".*.*.*.*="
SLOW_CASES = [("gpu_release", "match"), ("gpu_release", "exclude"), ("gpu_release", "protect"),
              ("gpu_facts", "protect"), ("gpu_wait_idle", "protect"), ("gpu_facts", "redact")]


@pytest.mark.parametrize("module, option", SLOW_CASES, ids=[f"{m}-{o}" for m, o in SLOW_CASES])
def test_a_slow_regex_fails_naming_the_option(gpusim, collection, module, option):
    holder = gpusim.hold(gpus=[0], mib=1024, name="python3 " + "a" * 3000)
    value = [SLOW] if option in ("protect", "redact") else SLOW
    args = {"device_files": [os.path.join(gpusim.dir, "dev", "nvidia*")], "gpus": ["0"], option: value}
    if module == "gpu_wait_idle":
        args["timeout"] = 5
    start = time.monotonic()
    res, out = run_module_text(gpusim, collection, module, args)
    assert_clean_failure(res, out, option)
    assert res["error"] == "regex_too_slow" and "took more than" in res["msg"], res
    assert time.monotonic() - start < 10
    assert alive(holder)


def nvidia_smi_processes(host):
    """Processes running this simulator's nvidia-smi (its wrapper is a script: the path is in argv)."""
    needle = os.path.join(host.dir, "bin", "nvidia-smi").encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("module", MODULES)
def test_a_timed_out_nvidia_smi_leaves_no_process(gpusim, collection, module):
    holder = gpusim.hold(gpus=[0], mib=1024)
    gpusim.fault(call_delay_ms=3000)
    args = {"device_files": [os.path.join(gpusim.dir, "dev", "nvidia*")], "backend": "nvidia-smi",
            "nvidia_smi_path": os.path.join(gpusim.dir, "bin", "nvidia-smi"), "query_timeout": 1}
    if module == "gpu_wait_idle":
        args["timeout"] = 5
    res, out = run_module_text(gpusim, collection, module, args)
    assert res.get("failed") and res["error"] == "timeout", res
    assert "did not answer within 1 s and was killed" in res["msg"], res["msg"]
    assert "Traceback" not in out
    assert nvidia_smi_processes(gpusim) == []
    assert alive(holder)
