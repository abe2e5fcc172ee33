# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import re
import signal
import threading
import time

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _validate, _wait
from ansible_collections.gpuops.gpu.plugins.module_utils._errors import GpuError, InvalidOption, RegexTooSlow
from ansible_collections.gpuops.gpu.plugins.module_utils._validate import signal_number

NAN = float("nan")
INF = float("inf")


def snapshot_params(**over):
    p = dict(gpus=[], backend="auto", nvidia_smi_path="nvidia-smi", query_timeout=10.0, device_files=["/dev/nvidia*"],
             include_device_holders=True, protect=[], redact=[], cmdline=True, max_memory_used_mib=64,
             max_utilization_pct=None)
    p.update(over)
    return p


def release_params(**over):
    p = dict(snapshot_params(), containers=None, users=None, match=None, pids=None, exclude=None, tree=True,
             signal="SIGTERM", grace_period=10.0, escalate=True, kill_timeout=10.0, fail_on_survivors=True,
             lock_timeout=0.0)
    p.update(over)
    return p


def release(**over):
    """_validate.release of release_params(**over), with the gpus option as _validate.snapshot parses it."""
    p = release_params(**over)
    return _validate.release(p, _validate.snapshot(p))


def wait_params(**over):
    p = dict(snapshot_params(), expected_count=None, timeout=300.0, delay=0.0, sleep=0.5, settle=1.0, msg=None,
             confirm_with_nvidia_smi=None, progress_slice=None, progress_state=None)
    p.update(over)
    return p


# (option, value): each must fail naming the option.
BAD_SNAPSHOT = [
    ("query_timeout", 0.0), ("query_timeout", -1.0), ("query_timeout", NAN), ("query_timeout", INF),
    ("query_timeout", 300.5), ("query_timeout", 1e18),
    ("gpus", ["²"]), ("gpus", ["١"]), ("gpus", ["0", "x"]), ("gpus", ["99999"]), ("gpus", ["9" * 5000]),
    ("gpus", ["GPU-zz"]), ("gpus", ["-1"]),
    ("nvidia_smi_path", ""), ("nvidia_smi_path", "nvidia\0smi"),
    ("device_files", ["dev/nvidia*"]), ("device_files", ["/dev/nv\0"]),
    ("protect", ["("]), ("protect", ["(a+)+b"]), ("protect", ["(a*)*"]), ("protect", ["(a|aa)+"]),
    ("protect", ["x" * 1001]), ("protect", [""]),
    ("redact", ["[unclosed"]), ("redact", ["(.*)*x"]),
    ("max_memory_used_mib", -1), ("max_memory_used_mib", 2 ** 40), ("max_memory_used_mib", 10 ** 400),
    ("max_utilization_pct", -1), ("max_utilization_pct", 101),
]


@pytest.mark.parametrize("option, value", BAD_SNAPSHOT, ids=[f"{o}={v!r}"[:60] for o, v in BAD_SNAPSHOT])
def test_bad_snapshot_options(option, value):
    with pytest.raises(InvalidOption) as info:
        _validate.snapshot(snapshot_params(**{option: value}))
    assert info.value.msg.startswith(option), info.value.msg
    assert info.value.details["option"] == option
    assert isinstance(info.value, ValueError) and isinstance(info.value, GpuError)


GOOD_SNAPSHOT = [
    ("query_timeout", 0.001), ("query_timeout", 300.0), ("query_timeout", 300),
    ("gpus", ["0", "4095", "GPU-8f0e1234-aaaa", "00000000:3B:00.0", "3b:00.0", " 7 "]),
    ("protect", ["jupyter", r"train\.py", "(sglang|vllm)", r"a+b+", r"(ab)+", "[a-z]+-server"]),
    ("redact", [r"--license (\S+)"]), ("max_memory_used_mib", 0), ("max_memory_used_mib", 16 * 1024 * 1024),
    ("max_utilization_pct", 0), ("max_utilization_pct", 100), ("max_utilization_pct", None),
]


@pytest.mark.parametrize("option, value", GOOD_SNAPSHOT, ids=[f"{o}={v!r}"[:60] for o, v in GOOD_SNAPSHOT])
def test_good_snapshot_options(option, value):
    _validate.snapshot(snapshot_params(**{option: value}))


BAD_RELEASE = [
    ("grace_period", 1e18), ("grace_period", INF), ("grace_period", NAN), ("grace_period", -1.0),
    ("grace_period", 86400.5), ("kill_timeout", NAN), ("kill_timeout", INF), ("kill_timeout", -0.1),
    ("kill_timeout", 1e18), ("lock_timeout", -1.0), ("lock_timeout", NAN), ("lock_timeout", 86401.0),
    ("pids", [0]), ("pids", [-5]), ("pids", [2 ** 63]), ("pids", [4194305]),
    ("containers", [42]), ("containers", [10 ** 12]), ("containers", ["١٢٩"]), ("containers", [True]),
    ("match", "(a+)+b"), ("match", "("), ("exclude", "(x*)*"), ("exclude", "(a|ab)*c"),
]


@pytest.mark.parametrize("option, value", BAD_RELEASE, ids=[f"{o}={v!r}"[:60] for o, v in BAD_RELEASE])
def test_bad_release_options(option, value):
    with pytest.raises(InvalidOption) as info:
        release(**{option: value})
    assert info.value.msg.startswith(option), info.value.msg


def test_release_messages_keep_their_wording():
    with pytest.raises(InvalidOption, match=r"^grace_period must be >= 0, got -1$"):
        release(grace_period=-1.0)
    with pytest.raises(InvalidOption, match=r"^grace_period must be at most 86400 s, got 1e\+18$"):
        release(grace_period=1e18)
    with pytest.raises(InvalidOption, match=r"^kill_timeout must be a finite number, got nan$"):
        release(kill_timeout=NAN)


def test_good_release_edges():
    filters = release(grace_period=0.0, kill_timeout=86400.0, pids=[1, 4194304],
                      containers=[100, 999999999], match="sglang|vllm", exclude="jupyter")
    assert filters["containers"] == [100, 999999999] and filters["pids"] == {1, 4194304}
    assert filters["match"].search("python3 -m vllm") and filters["match"].pattern == "sglang|vllm"
    assert filters["exclude"].search("jupyter lab")
    assert release()["match"] is None


BAD_WAIT = [
    ("timeout", NAN), ("timeout", INF), ("timeout", -1.0), ("timeout", 86401.0), ("timeout", 1e18),
    ("delay", NAN), ("delay", INF), ("delay", -1.0), ("delay", 1e18),
    ("sleep", 1e-9), ("sleep", 0.0), ("sleep", 0.049), ("sleep", NAN), ("sleep", INF), ("sleep", -1.0),
    ("settle", NAN), ("settle", INF), ("settle", -1.0), ("settle", 301.0),
    ("expected_count", -1), ("expected_count", 1025), ("expected_count", 10 ** 30),
    ("progress_slice", 0.0), ("progress_slice", NAN), ("progress_state", {"wait": {}, "offset": NAN}),
    ("progress_state", {"offset": 1.0}), ("progress_state", {"wait": {}}), ("progress_state", {"wait": {"polls": "x"}}),
    ("progress_state", {"wait": dict(_wait.new_state(), polls=True)}),
    ("progress_state", {"wait": dict(_wait.new_state(), last_holder_at="soon")}),
]


@pytest.mark.parametrize("option, value", BAD_WAIT, ids=[f"{o}={v!r}"[:60] for o, v in BAD_WAIT])
def test_bad_wait_options(option, value):
    with pytest.raises(InvalidOption) as info:
        _validate.wait(wait_params(**{option: value}))
    assert info.value.msg.startswith(option), info.value.msg


def test_settle_above_timeout_keeps_its_wording():
    with pytest.raises(InvalidOption, match=r"^settle \(10 s\) must not be above timeout \(5 s\)$"):
        _validate.wait(wait_params(settle=10.0, timeout=5.0))


GOOD_WAIT = [
    {"timeout": 0.0, "settle": 0.0}, {"timeout": 86400.0, "settle": 86400.0}, {"sleep": 0.05}, {"sleep": 86400.0},
    {"delay": 86400.0}, {"expected_count": 0}, {"expected_count": 1024}, {"progress_slice": 10.0},
    {"progress_state": {"wait": _wait.new_state(), "offset": 12.5}},
    {"progress_state": {"wait": dict(_wait.new_state(), polls=3, last_holder_at=1.5, last_full_scan_at=0.0, first=False)}},
]


@pytest.mark.parametrize("over", GOOD_WAIT, ids=[repr(o)[:60] for o in GOOD_WAIT])
def test_good_wait_options(over):
    _validate.wait(wait_params(**over))


NUMBER_CASES = [
    ("12", 12.0), (" 1.5 ", 1.5), ("1e3", 1000.0), (".5", 0.5), (3, 3.0),
]


@pytest.mark.parametrize("value, expected", NUMBER_CASES)
def test_number_accepts_ascii_text(value, expected):
    assert _validate.number("timeout", value) == expected


@pytest.mark.parametrize("value", ["١٢", "²", "nan", "inf", "soon", "", None, True, 10 ** 400, "1e400", [1]])
def test_number_refuses(value):
    with pytest.raises(InvalidOption, match="^timeout"):
        _validate.number("timeout", value)


@pytest.mark.parametrize("text, expected", [("12", True), ("²", False), ("١٢", False), ("", False), ("-1", False)])
def test_is_ascii_digits(text, expected):
    assert _validate.is_ascii_digits(text) is expected


@pytest.mark.parametrize("value", ["²", "١٥", "9" * 5000, "0", "-1", "999"])
def test_signal_numbers_are_ascii(value):
    with pytest.raises(ValueError, match="^signal"):
        signal_number(value)


def test_signal_numbers_still_work():
    assert signal_number("15") == 15 and signal_number("TERM") == 15 and signal_number(9) == 9


NESTED = [
    ("(a+)+b", True), ("(a*)*", True), ("(a|aa)+", True), ("(a+){2,}", True), ("((a+)b)*", True),
    ("(?:x+y?)+", True), ("(\\w+\\s?)+$", True), ("x(?=(a+)+)", True),
    ("a+b+", False), ("(ab)+", False), ("(a|b)+", False), ("(sglang|vllm)", False), ("(a+)?", False),
    (".*vllm.*", False), ("(a{3})+", False), ("[a-z]+(-[0-9])?", False),
]


@pytest.mark.parametrize("pattern, nested", NESTED)
def test_nested_quantifier(pattern, nested):
    if nested:
        with pytest.raises(InvalidOption, match="^match: .* repeats a group"):
            _validate.regex("match", pattern)
    else:
        assert _validate.regex("match", pattern).pattern == pattern


def test_regex_sees_at_most_the_first_4096_characters():
    rx = _validate.regex("match", "needle")
    assert rx.search("x" * 4000 + "needle")
    assert not rx.search("x" * 4096 + "needle")
    assert [m.group() for m in rx.finditer("needle needle")] == ["needle", "needle"]


def test_a_slow_search_is_interrupted_and_names_the_option():
    # Polynomial backtracking that the static check lets through: the time budget stops it.
    rx = _validate.regex("exclude", ".*.*.*.*=")
    before = signal.getsignal(signal.SIGALRM)
    start = time.monotonic()
    with pytest.raises(RegexTooSlow, match="^exclude: .* took more than"):
        rx.search("a" * 4096)
    assert time.monotonic() - start < _validate.SEARCH_BUDGET_S + 1.0
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # the timer is off again
    assert signal.getsignal(signal.SIGALRM) == before  # and the handler is the one before


def test_all_searches_of_an_option_share_a_budget(monkeypatch):
    monkeypatch.setattr(_validate, "OPTION_BUDGET_S", 0.0)
    rx = _validate.regex("protect", "a")
    with pytest.raises(RegexTooSlow, match="^protect: .* in all"):
        rx.search("b" * 4096)


def test_outside_the_main_thread_the_time_is_measured(monkeypatch):
    monkeypatch.setattr(_validate, "SEARCH_BUDGET_S", 0.0)
    rx = _validate.regex("match", "a")
    box = {}

    def run():
        try:
            rx.search("b" * 100)
        except RegexTooSlow as exc:
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert "error" in box


def test_regex_object_is_what_the_policy_needs():
    rx = _validate.regex("match", "vllm")
    compiled = re.compile("vllm")
    assert rx.pattern == compiled.pattern and bool(rx.search("vllm serve")) == bool(compiled.search("vllm serve"))


# --- containers: one form (gpu_release, proxmox_gpu_containers) ---------------------------------------------
@pytest.mark.parametrize("values, expected", [
    ([], []),
    (None, []),
    ([129, "130", " 131 "], [129, 130, 131]),
    ("129,130", [129, 130]),
    (["129, 130", 129, 100, 999999999], [129, 130, 100, 999999999]),
    (129, [129]),
])
def test_vmids_one_form_for_every_module(values, expected):
    assert _validate.vmids(values) == expected


@pytest.mark.parametrize("values, bad", [
    (["abc"], "'abc'"),
    ([99], "99"),
    ([1000000000], "1000000000"),
    (["129,x"], "'x'"),
    (["129,,130"], "''"),
    ([True], "True"),
    ([-129], "-129"),
    (["1e3"], "'1e3'"),
    (["\u0661\u0662\u0663"], "'\u0661\u0662\u0663'"),
    ([129.0], "129.0"),
    (["129; rm -rf /"], "'129; rm -rf /'"),
])
def test_vmids_names_the_bad_value(values, bad):
    with pytest.raises(InvalidOption) as info:
        _validate.vmids(values)
    assert str(info.value).startswith(f"containers: {bad} is not a Proxmox VE container id")
    assert "100..999999999" in str(info.value) and info.value.details["option"] == "containers"
    assert isinstance(info.value, ValueError)
