# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os
import sys
import time

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils._host import calls
from ansible_collections.gpuops.gpu.plugins.module_utils._errors import QueryTimeout

# A program that starts a grandchild, writes its pid, and hangs: what a wedged nvidia-smi looks like.
HANG = ("import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "open(sys.argv[1], 'w').write(str(child.pid))\n"
        "time.sleep(60)\n")


def gone(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_run_in_group_returns_rc_and_output_in_the_c_locale(monkeypatch):
    """Every command speaks the C locale (calls.COMMAND_ENV, the one place that sets it), whatever the module's."""
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    rc, out, err = calls.run_in_group([sys.executable, "-c", "import os, sys; print(os.environ['LC_ALL']);"
                                      " sys.stderr.write('e'); sys.exit(3)"], 10, "probe")
    assert (rc, out, err) == (3, "C\n", "e")
    assert not calls._RUNNING


def test_a_missing_program_answers_127():
    rc, out, err = calls.run_in_group(["/nonexistent/nvidia-smi"], 5, "nvidia-smi")
    assert rc == 127 and out == "" and "nvidia-smi" in err


def test_on_timeout_the_whole_group_is_killed(tmp_path):
    pidfile = tmp_path / "grandchild"
    start = time.monotonic()
    with pytest.raises(QueryTimeout, match="^nvidia-smi --query-gpu did not answer within 1 s and was killed"):
        calls.run_in_group([sys.executable, "-c", HANG, str(pidfile)], 1.0, "nvidia-smi --query-gpu")
    assert time.monotonic() - start < 5
    grandchild = int(pidfile.read_text())
    for _attempt in range(100):
        if gone(grandchild):
            break
        time.sleep(0.02)
    assert gone(grandchild)
    assert not calls._RUNNING


def test_kill_running_stops_what_is_still_running(tmp_path):
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    calls._RUNNING.add(proc)
    calls._kill_running()
    assert proc.poll() is not None and not calls._RUNNING
    assert os.getpgid(os.getpid()) != proc.pid


# --- a pct exec watched while it runs: what hung, said at once -------------------------------------------------------
@pytest.mark.parametrize("frozen, attached, elapsed, done, says", [
    (False, False, 1.0, False, ""),                                   # pct still starting, within its limit
    (False, True, 40.0, False, ""),                                   # in the container, still within the stop's limit
    (True, True, 0.5, False, "CT 129 is frozen (a suspend-mode backup, or lxc-freeze): `pct exec 129 -- systemctl stop"
                             " sglang` cannot run in it and was killed after 0.5 s"),
    (False, False, 30.0, False, "the node's pct hung: `pct exec 129 -- systemctl stop sglang` had not reached CT 129"
                                " after 30 s (pct_timeout 30 s)"),
    (False, False, 12.0, True, "the node's pct hung"),                # the time is up before pct attached
    (False, True, 85.0, True, "CT 129's systemd did not finish `pct exec 129 -- systemctl stop sglang` within 85 s"),
])
def test_an_exec_watch_names_what_hangs(frozen, attached, elapsed, done, says):
    # Fakes of the container's freeze state and of the attach (the functional tests drive real ones: lxc-freeze, a
    # hanging pct, a stop that hangs in the container, tests/functional/test_proxmox_gpu_containers.py).
    watch = calls.ExecWatch(129, "pct exec 129 -- systemctl stop sglang", 30.0, frozen=lambda vmid: frozen,
                            attached=lambda pid, vmid: attached)
    said = watch(4242, elapsed, done)
    assert said.startswith(says) if says else said == ""


def test_a_watch_ends_a_command_at_once_with_its_sentence():
    seen = []

    def watch(pid, elapsed, done):
        seen.append((pid, done))
        return "it hung: said by the watch" if elapsed >= 0.4 else ""

    t0 = time.monotonic()
    with pytest.raises(QueryTimeout, match="^it hung: said by the watch$") as info:
        calls.run_in_group([sys.executable, "-c", "import time; time.sleep(60)"], 30, "sleeper", watch=watch)
    assert time.monotonic() - t0 < 10 and info.value.details["watched"] is True
    assert seen and not any(done for _pid, done in seen)
    assert calls.run_in_group([sys.executable, "-c", "print('ok')"], 30, "quick", watch=watch)[:2] == (0, "ok\n")


def _fail():
    raise KeyError("lost")


@pytest.mark.parametrize("func, timeout, outcome", [
    (lambda: 7, None, 7),
    (lambda: 7, 5.0, 7),
    (_fail, 5.0, KeyError),                                       # its error, raised in the caller
    (lambda: time.sleep(5), 0.05, "^nvml probe did not answer within 0.05 s"),   # abandoned: it holds nothing up
])
def test_background_is_the_one_call_with_a_time_limit(func, timeout, outcome):
    """calls.Background: the value, the error, or QueryTimeout naming the call."""
    job = calls.Background(func, what="nvml probe")
    if isinstance(outcome, str):
        start = time.monotonic()
        with pytest.raises(QueryTimeout, match=outcome) as exc:
            job.result(timeout)
        assert time.monotonic() - start < 2 and exc.value.details["call"] == "nvml probe"
    elif isinstance(outcome, type):
        with pytest.raises(outcome):
            job.result(timeout)
    else:
        assert job.result(timeout) == outcome


def test_run_all_keeps_the_order_and_raises_the_first_error():
    assert calls.run_all(lambda x: x * 2, [3, 1, 2], 2) == [6, 2, 4]
    assert calls.run_all(_fail, [], 8) == []
    with pytest.raises(KeyError):
        calls.run_all(lambda x: _fail() if x == 2 else x, [1, 2, 3], 2)
