# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The release locks (_lock): which locks a release takes, and real flock(2) contention in a temporary directory
(two Locks in one process conflict as two processes do: a flock belongs to the open file description). The clock
is a fake, so that a wait of seconds runs in none."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils._host import lock as _lock


@pytest.mark.parametrize("containers, gpus, exclusive, expected", [
    (None, [1, 0], None, [("gpu-0.lock", True, "GPU 0"), ("gpu-1.lock", True, "GPU 1")]),
    ([], [3], None, [("gpu-3.lock", True, "GPU 3")]),
    ([130, 129, 129], [2], None, [("ct-129.lock", True, "CT 129"), ("ct-130.lock", True, "CT 130"),
                                  ("gpu-2.lock", False, "GPU 2")]),
    ([], [2], False, [("gpu-2.lock", False, "GPU 2")]),   # the fence: its containers' locks taken before
])
def test_the_plan(containers, gpus, exclusive, expected):
    assert _lock.plan(containers, gpus, exclusive) == expected


@pytest.mark.parametrize("record, text", [
    ({"pid": 4242, "module": "proxmox_gpu_containers", "since": 65.0}, "pid 4242, proxmox_gpu_containers, for 35 s"),
    ({"pid": 4242}, "pid 4242"),
    ({}, "its holder did not say who it is"),
])
def test_holder_text(record, text):
    assert _lock.holder_text(record, 100.0) == text


class Clock:
    def __init__(self):
        self.t = 1000.0
        self.slept = []

    def now(self):
        return self.t

    def sleep(self, s):
        self.slept.append(s)
        self.t += s
        if getattr(self, "on_sleep", None):
            self.on_sleep()


@pytest.fixture
def lockdir(tmp_path, monkeypatch):
    monkeypatch.setenv(_lock.LOCK_DIR_ENV, str(tmp_path / "run"))
    return tmp_path / "run"


def locks(containers, timeout, clock, warnings=None, gpus=(0, 1)):
    return _lock.Locks("gpu_release", containers, timeout, (warnings if warnings is not None else []).append,
                       clock=clock.now, sleep=clock.sleep, gpus=gpus)


@pytest.mark.parametrize("first, second, gpus2, conflict, what", [
    ([129], [129], (0, 1), True, "CT 129"),    # the same container
    ([129], [130], (0, 1), False, None),       # other containers, on shared GPUs: side by side
    ([129], None, (0, 1), True, "CT 129"),     # a release of the node's GPUs waits for a container's on them
    ([129], None, (2, 3), False, None),        # not on other GPUs
    (None, [129], (0, 1), True, "GPU 0"),      # and a container's for the node's
    (None, None, (1,), True, "GPU 1"),
    (None, None, (2, 3), False, None),         # two inventory hosts of one machine, on other GPUs
])
def test_who_waits_for_whom(lockdir, first, second, gpus2, conflict, what):
    clock = Clock()
    held = locks(first, 0, clock)
    held.acquire()
    try:
        other = locks(second, 2.0, clock, gpus=gpus2)
        if not conflict:
            other.acquire()
            other.release()
            assert clock.slept == []
            return
        with pytest.raises(_lock.Locked) as exc:
            other.acquire()
        assert exc.value.kind == "locked" and sum(clock.slept) == pytest.approx(2.0)
        assert exc.value.msg.startswith(f"another release of {what} is running (pid {os.getpid()}, gpu_release, for 2 s);")
        assert "waited 2 s (lock_timeout)" in exc.value.msg and "Nothing was signalled" in exc.value.msg
        assert f"ps -o pid,etime,args -p {os.getpid()}" in exc.value.msg
        assert other.files == []  # what it had taken is let go
    finally:
        held.release()
    again = locks(second, 0, clock, gpus=gpus2)
    again.acquire()  # free once the first is done
    again.release()


def test_the_holder_writes_who_it_is(lockdir):
    clock = Clock()
    with locks([129], 0, clock):
        with open(lockdir / "ct-129.lock", encoding="utf-8") as f:
            assert json.load(f) == {"pid": os.getpid(), "start_time": _lock._start_time(os.getpid()),
                                    "module": "gpu_release", "what": "CT 129", "since": 1000.0}


def test_no_lock_directory_is_a_warning_not_a_failure(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(_lock.LOCK_DIR_ENV, str(tmp_path / "file" / "run"))
    warnings = []
    with locks([129], 0, Clock(), warnings) as held:
        assert held.files == []
    assert len(warnings) == 1 and warnings[0].startswith("no lock against another release at once: cannot create")


def test_lock_files_that_cannot_be_opened_are_one_warning(lockdir):
    # Without root (no become) every lock file of /run/gpuops.gpu fails alike (EACCES) and nine warnings came before
    # the real error (issue 33, item 6). As root here, each lock file's name is a directory (EISDIR): each fails too.
    names = [name for name, _x, _w in _lock.plan([129], range(8))]
    for name in names:
        (lockdir / name).mkdir(parents=True)
    warnings = []
    with locks([129], 0, Clock(), warnings, gpus=range(8)) as held:
        assert held.files == []
    assert len(warnings) == 1, warnings
    assert warnings[0] == (f"no lock against another release at once: cannot open the lock files of CT 129, GPU 0, GPU 1,"
                           f" GPU 2, GPU 3, GPU 4, GPU 5, GPU 6, GPU 7 in {lockdir} (Is a directory)")
    # the fence's GPU locks after its containers': the same directory is not named again in this run
    locks([], 0, Clock(), warnings, gpus=range(8)).acquire()
    assert len(warnings) == 1, warnings
    _lock.release_all()  # the next module run says it again
    locks([], 0, Clock(), warnings, gpus=range(8)).acquire()
    assert len(warnings) == 2
    _lock.release_all()


def test_acquire_says_whether_it_waited(lockdir):
    # The caller reads the GPUs again after a wait: what it read before is another release's leftover.
    clock = Clock()
    free = locks([129], 0, clock)
    assert free.acquire() == {}  # free: taken at once
    free.release()
    held = locks([129], 0, clock)
    held.acquire()
    clock.on_sleep = held.release  # the other run finishes while this one waits
    warnings = []
    other = locks([129], 5.0, clock, warnings)
    waited = other.acquire()
    assert waited and clock.slept and waited == other.waited
    # It says so: how long, for what, whose run (the holder's record: this process, as the first Locks wrote it).
    assert waited["for"] == "CT 129" and waited["pid"] == os.getpid() and waited["seconds"] >= 0, waited
    assert warnings == [waited["text"]] == [_lock.waited_text(waited)]
    assert warnings[0].startswith(f"waited {waited['seconds']:g} s for another run's ")
    assert f"of CT 129 (pid {os.getpid()}" in warnings[0] and "this run found what it left" in warnings[0]
    other.release()


@pytest.mark.parametrize("waited, text", [
    ({"seconds": 3.1, "for": "CT 129", "pid": 4242, "module": "proxmox_gpu_containers"},
     "waited 3.1 s for another run's fence of CT 129 (pid 4242, proxmox_gpu_containers), which ran first"),
    ({"seconds": 0.4, "for": "GPU 3", "pid": 17, "module": "gpu_release"},
     "waited 0.4 s for another run's release of GPU 3 (pid 17, gpu_release), which ran first"),
    ({"seconds": 2, "for": "CT 7", "pid": None, "module": None}, "waited 2 s for another run's release of CT 7, which"),
])
def test_the_wait_for_another_run_is_said(waited, text):
    assert _lock.waited_text(waited).startswith(text)


def test_a_record_of_a_pid_now_reused_names_no_holder(lockdir):
    # The record's pid runs, but with another start time: another process got the pid; the lock's holder is gone.
    assert _lock._alive(os.getpid(), _lock._start_time(os.getpid()))
    assert not _lock._alive(os.getpid(), -1)


def test_release_all_lets_go_of_what_the_run_took(lockdir):
    clock = Clock()
    locks([129], 0, clock).acquire()
    _lock.release_all()
    again = locks([129], 0, clock)
    assert not again.acquire()
    _lock.release_all()
