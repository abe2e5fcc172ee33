# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations
import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _wait
from ansible_collections.gpuops.gpu.plugins.module_utils._holding import verdict


def make_gpu(used=0, procs=(), holders=(), status="ok"):
    gpu = {"index": 0, "memory": {"used": used}, "utilization": {"gpu": 0}, "health": {"status": status, "detail": "x"},
           "processes": [{"pid": p, "name": "python3", "visible": True} for p in procs],
           "holders": [{"pid": h, "name": "python3", "start_time": 1, "files": ["/dev/nvidia0"], "protected": None,
                        "evidence": "device"} for h in holders]}
    gpu["idle"], gpu["busy_reasons"], blockers, _lingering = verdict(gpu, 64)
    gpu["blockers"] = [b["pid"] for b in blockers]
    return gpu


def run(timeline, settle=1.0, sleep=0.5, until=10.0, alive=lambda pid, st: False, full_every=15.0):
    """Drive step() over a scripted host: timeline(t, full) -> GPU dict. Returns (done_at, state, scans)."""
    state = _wait.new_state()
    scans = []
    t = 0.0
    while t <= until:
        def snap(full, t=t):
            scans.append((t, full))
            return [timeline(t, full)]
        done, _gpus = _wait.step(state, t, snap, alive, settle, full_every)
        if done:
            return round(t, 3), state, scans
        t = round(t + sleep, 3)
    return None, state, scans


def test_an_idle_node_answers_in_one_look():
    # Nothing on the GPU at the first (full) look and no release in progress: no settle window of its own.
    done_at, state, scans = run(lambda t, full: make_gpu())
    assert done_at == 0.0 and state["idle_at_first_look"]
    assert scans == [(0.0, True)]


def test_a_device_node_bystander_does_not_open_the_window():
    # A process with /dev/nvidia0 open, no context, the GPU idle (a monitor, a persistence daemon): no holder by
    # the holding model, so the node is still idle in one look - the window is not paid for what is always there.
    done_at, state, _scans = run(lambda t, full: make_gpu(holders=[7]))
    assert done_at == 0.0 and state["idle_at_first_look"]


@pytest.mark.parametrize("first_look", [
    pytest.param(make_gpu(used=20480, holders=[7]), id="a device-node holder with no context"),
    pytest.param(make_gpu(used=20480), id="memory in use, no process"),
    pytest.param(make_gpu(used=20480, procs=[8812]), id="a context"),
])
def test_anything_at_the_first_look_opens_the_settle_window(first_look):
    done_at, state, scans = run(lambda t, full: first_look if t == 0.0 else make_gpu())
    assert done_at == 1.0 and not state["idle_at_first_look"]
    # One full scan, the first look's, which opened the settle window; the window's polls are cheap and it
    # returns as the window closes (the idle look at 0.5 is scanned in full once).
    assert scans[0] == (0.0, True) and scans[-1] == (1.0, False)


def test_a_credited_release_keeps_its_window_even_on_an_idle_first_look():
    state = _wait.new_state()
    state.update(credited=True, last_holder_at=-0.2)  # the release last saw a holder 0.2 s before this wait
    done, _gpus = _wait.step(state, 0.0, lambda full: [make_gpu()], lambda pid, st: False, 1.0, 15.0)
    assert not done and not state.get("idle_at_first_look") and _wait.settle_origin(state) == "release"


def test_returns_when_memory_is_freed_after_the_lag_not_before():
    # the holder exits at t=1.0; the driver frees its memory 1.5 s later (t=2.5); settle 1.0 < lag
    def host(t, full):
        if t < 1.0:
            return make_gpu(used=40960, procs=[8812])
        return make_gpu(used=40960 if t < 2.5 else 0)
    done_at, state, _scans = run(host)
    assert done_at == 2.5
    assert state["samples"]["0"] == [[0.0, 40960, 1], [1.0, 40960, 0], [2.5, 0, 0]]


def test_a_respawn_within_settle_restarts_the_clock():
    def host(t, full):
        if t < 1.0 or 1.5 <= t < 2.0:      # gone at 1.0, restarted by a supervisor at 1.5, gone again at 2.0
            return make_gpu(used=1000, procs=[100 if t < 1.0 else 200])
        return make_gpu()
    done_at, _state, _scans = run(host, settle=1.0)
    assert done_at == 2.5  # last seen at 1.5 (the respawned pid 200), settled 1.0 s later


def test_respawning_forever_never_returns():
    done_at, _state, _scans = run(lambda t, full: make_gpu() if int(t * 2) % 2 else make_gpu(used=1000, procs=[int(t * 10)]), until=6)
    assert done_at is None


def test_device_file_holder_is_followed_between_full_scans():
    gone_at = 2.0
    clock = {"t": 0.0}

    def host(t, full):
        clock["t"] = t
        # a device-file holder keeps the GPU busy while its memory is not accounted for by a context
        return make_gpu(used=500 if t < gone_at else 0, holders=[77] if full and t < gone_at else [])

    done_at, _state, scans = run(host, alive=lambda pid, st: clock["t"] < gone_at)
    assert done_at == 2.5  # seen alive (cheaply) until 1.5, gone at 2.0, settled at 2.5
    assert scans[0] == (0.0, True)


def test_a_holder_found_by_the_idle_scan_restarts_the_clock():
    def host(t, full):
        # a context at the first look (the window opens), then memory held from 0.5 to 1.6 by a process only
        # the full scan sees (a device node, the list incomplete)
        if t == 0.0:
            return make_gpu(used=500, procs=[9])
        busy = 0.5 < t < 1.6
        return make_gpu(used=500 if busy else 0, holders=[55] if full and busy else [])
    done_at, state, scans = run(host, sleep=0.5, settle=1.0)
    # idle at 0 (scanned), busy at 0.5 (not idle: no new scan needed), idle again at 2.0: scanned again
    assert (2.0, True) in scans and done_at == 2.0

    def host_with_holder_at_idle(t, full):
        # a context at the first look; idle by the cheap polls at 0.5, but the idle scan finds a blocker: the
        # clock restarts from there
        if t == 0.0:
            return make_gpu(used=500, procs=[9])
        return make_gpu(used=500 if full and 0.4 < t < 0.6 else 0, holders=[55] if full and 0.4 < t < 0.6 else [])
    done_at, _state, scans = run(host_with_holder_at_idle, sleep=0.5, settle=1.0, full_every=0.5)
    assert done_at == 1.5


def test_lost_gpu_fails_at_once():
    with pytest.raises(_errors.GpuLost, match="fallen off the bus"):
        run(lambda t, full: make_gpu(status="lost" if t >= 1.0 else "ok", used=10, procs=[1]))


def test_diagnosis_and_progress_line():
    gpus = [dict(make_gpu(used=1200), index=2), dict(make_gpu(used=41984, procs=[8812]), index=5), dict(make_gpu(), index=6)]
    gpus[1]["processes"][0]["container"] = {"kind": "lxc", "id": 129}
    assert _wait.diagnosis(gpus, 64) == ("GPU 2: 1200 MiB used by processes not visible from this PID namespace (another"
                                         " container or the host), or a leaked context; GPU 5 is used by pid 8812"
                                         " (python3) in CT 129")
    line = _wait.progress_line(gpus, 12.2, 300)
    assert line == ("gpu_wait_idle: 1/3 GPUs idle; waiting on GPU 2 (1200 MiB), GPU 5 (41 GiB, pid 8812 python3, CT 129)"
                    " - 12 s of 300 s")
    assert _wait.blockers(gpus)["5"][0]["pid"] == 8812


def _gpu_state(idle, holders=()):
    procs = [{"pid": p} for p in holders]
    return {"index": 0, "idle": idle, "blockers": list(holders), "processes": procs, "holders": []}


@pytest.mark.parametrize("last_holder_at, known, gpu, now, expect", [
    pytest.param(0.0, {}, _gpu_state(False, [8812]), 1.0, 0.5, id="a holder: the interval"),
    pytest.param(0.0, {"77": [77, 1]}, _gpu_state(False), 1.0, 0.5, id="a device-file holder followed: the interval"),
    pytest.param(0.0, {}, _gpu_state(False), 1.2, 0.05, id="memory being freed: fast"),
    pytest.param(0.0, {}, _gpu_state(False), 6.0, 0.5, id="still used 5 s after the last holder: a leak, the interval"),
    pytest.param(0.0, {}, _gpu_state(True), 0.8, 0.2, id="idle: look again when settle closes"),
    pytest.param(0.0, {}, _gpu_state(True), 2.0, 0.5, id="idle and settled: the interval"),
    pytest.param(0.0, {}, _gpu_state(False), 9.95, 0.05, id="never past the timeout"),
])
def test_next_sleep(last_holder_at, known, gpu, now, expect):
    state = dict(_wait.new_state(), last_holder_at=last_holder_at, known_holders=known)
    timeout = 10.0 if now > 9 else 300.0
    assert _wait.next_sleep(state, now, [gpu], 0.5, 1.0, timeout) == pytest.approx(expect)


@pytest.mark.parametrize("gpu_idle, alive, kept", [
    pytest.param(False, True, True, id="memory still being freed: the device-node holder still blocks"),
    pytest.param(True, True, False, id="memory back: the no-context holder lingers, the wait does not follow it"),
    pytest.param(False, False, False, id="the holder exited"),
])
def test_a_device_node_holder_is_judged_again_at_every_poll(gpu_idle, alive, kept):
    # The stall (issue 20): a no-context holder found while the released server's memory was being
    # freed was followed by liveness alone until the next full scan, up to 15 s after the memory was back.
    state = _wait.new_state()
    notebook = {"pid": 77, "start_time": 1, "files": ["/dev/nvidia0"]}
    busy = {"index": 0, "idle": False, "blockers": [77], "processes": [], "holders": [notebook]}
    _wait.step(state, 0.0, lambda full: [busy], lambda pid, st: True, 1.0, 15.0)
    assert state["known_holders"] == {"77": [77, 1, [0]]}
    poll = {"index": 0, "idle": gpu_idle, "blockers": [], "processes": [], "holders": []}
    _wait.step(state, 0.2, lambda full: [poll], lambda pid, st: alive, 1.0, 15.0)
    assert bool(state["known_holders"]) is kept


@pytest.mark.parametrize("appears_at, leaves_at, done_at", [
    pytest.param(0.0, None, 2.0, id="there from the first look while the memory drains: the clock runs from the first look"),
    pytest.param(1.5, None, 2.5, id="appears at 1.5: the clock restarts there"),
    pytest.param(0.0, 2.0, 2.5, id="was blocking and leaves at 2.0: counted from its last look alive (1.5)"),
])
def test_a_device_node_holder_restarts_the_clock_when_it_comes_or_goes_not_while_it_stays(appears_at, leaves_at, done_at):
    # A CUDA process with no context (a notebook kernel) beside a released server whose memory the driver frees
    # until 2.0: the GPU is busy (the list looks incomplete), so it blocks; but had it owned the memory, the memory
    # would not have been freed while it lives - only its coming and going restart the settle clock.
    now = {"t": 0.0}

    def present(t):
        return t >= appears_at and (leaves_at is None or t < leaves_at)

    def host(t, full):
        now["t"] = t
        return make_gpu(used=40960 if t < 2.0 else 0, holders=[77] if full and present(t) else [])

    got, _state, _scans = run(host, alive=lambda pid, st: present(now["t"]), full_every=0.5)
    assert got == done_at
