# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""gpu_wait_idle's run (_wait.Wait): check mode, the polls, the progress slice, the timeout, nvidia-smi's
confirmation (early, beside the settle window, and final), reset_leaked; and the timeout's diagnosis sentences.

The host is a fake (FakeHost, with _host.wait_io.WaitIO's methods): unit tests have no driver, no /proc of GPU holders and
no nvidia-smi, and a fake clock lets a 300 s wait run in no time. The real host runs in tests/functional
(test_wait_messages.py, test_ready.py, test_reset_leaked.py) against the simulator.
"""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _selection, _wait
from ansible_collections.gpuops.gpu.plugins.module_utils._holding import verdict
from ansible_collections.gpuops.gpu.plugins.module_utils._host.protocols import WaitHost


def gpu(index=0, used=0, procs=(), holders=(), in_container=False, **fields):
    """A GPU of a snapshot, judged by the holding rule (_holding.verdict) as _snapshot.build does."""
    g = {"index": index, "uuid": f"GPU-{index}", "minor_number": index, "pci_bus_id": f"00000000:1{index}:00.0",
         "memory": {"used": used, "total": 143771, "free": 143771 - used}, "utilization": {"gpu": 0},
         "health": {"status": "ok", "detail": None, "checks": []},
         "processes": [{"pid": p, "name": "python3", "visible": True, "used_mib": None} for p in procs],
         "holders": [{"pid": h, "name": "gpu-probe", "start_time": 7, "files": [f"/dev/nvidia{index}"], "protected": None,
                      "evidence": "device"} for h in holders]}
    g.update(fields)
    g["idle"], g["busy_reasons"], blockers, _lingering = verdict(g, 64, in_container=in_container)
    g["blockers"] = [b["pid"] for b in blockers]
    return g


def smi_row(index, used=0, pids=()):
    return {"uuid": f"GPU-{index}", "memory": {"used": used}, "processes": [{"pid": p} for p in pids]}


class Done:
    """A background call already made (FakeHost.background runs it at once, in this thread)."""

    def __init__(self, func, *args):
        try:
            self.value, self.error = func(*args), None
        except Exception as exc:  # pylint: disable=broad-except
            self.value, self.error = None, exc

    def result(self):
        if self.error:
            raise self.error
        return self.value


class FakeHost:
    """WaitIO's methods over a script: ``timeline(t, full) -> [gpu, ...]`` at the fake clock's time t."""

    def __init__(self, timeline, smi=None, smi_path="/usr/bin/nvidia-smi", node_holders=None, run=None):
        self.t = 0.0
        self.timeline = timeline
        self.smi = list(smi or [])          # nvidia-smi's answers ({"gpus": [...]} or an exception), in order
        self.path = smi_path
        self.holders = node_holders or {}   # {index: [{pid, name}]}: who holds each GPU's device node
        self.answer = run or (lambda argv: (0, "Disabled, Disabled", ""))
        self.slept, self.looks, self.commands, self.queries = [], [], [], 0

    def now(self):
        return self.t

    def set_deadline(self, deadline):
        pass  # the fake's calls end at once

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.t += seconds

    def snapshot(self, full, processes=True):
        self.looks.append((round(self.t, 3), full))
        return copy.deepcopy(self.timeline(self.t, full))

    def restrict(self, indexes):
        self.restricted_to = indexes

    @staticmethod
    def restricted():
        return False

    @staticmethod
    def alive(pid, start_time):
        return False

    @staticmethod
    def boot_id():
        return None

    def confirm_path(self):
        return self.path

    def smi_path(self):
        return self.path

    def smi_query(self, path):
        self.queries += 1
        answer = self.smi.pop(0) if self.smi else {"gpus": [smi_row(0)]}
        if isinstance(answer, dict):
            return answer
        raise answer  # pylint: disable=raising-bad-type  # an error the fake nvidia-smi gives (not a dict)

    def run(self, argv, what):
        self.commands.append(argv)
        return self.answer(argv)

    def device_holders(self):
        return {h["pid"]: [f"/dev/nvidia{index}"] for index, held in self.holders.items() for h in held}

    def read(self, pid):
        return next(({"pid": pid, "name": h["name"], "cmdline": h["name"]} for held in self.holders.values() for h in held
                     if h["pid"] == pid), None)

    @staticmethod
    def exe(_pid):
        return None

    @staticmethod
    def background(func, *args):
        return Done(func, *args)


def test_the_fake_is_a_wait_host():
    assert isinstance(FakeHost(lambda t, full: []), WaitHost)


PARAMS = {"timeout": 10.0, "delay": 0.0, "sleep": 0.5, "settle": 1.0, "msg": None, "confirm_with_nvidia_smi": None,
          "leak_after": 30.0, "reset_leaked": False, "progress_slice": None, "progress_state": None,
          "max_memory_used_mib": 64, "nvidia_smi_path": "nvidia-smi", "left_holders": [], "blocker_grace": 5.0}


def wait(timeline, check_mode=False, diff=False, host=None, **params):
    host = host or FakeHost(timeline)
    p = dict(PARAMS, **params)
    ok, result = _wait.Wait(p, host, _selection.parse(p.get("gpus")), check_mode=check_mode, diff=diff).run()
    return ok, result, host


def idle(t, full):
    return [gpu(0)]


def busy_until(t_free):
    return lambda t, full: [gpu(0, used=40960, procs=[77]) if t < t_free else gpu(0)]


# --- the polls: (id, timeline, params, ok, what the result says) -------------------------------------------
RUNS = [
    ("idle from the start, no release: ready in one look", idle, {}, True,
     {"ready": True, "elapsed": 0.0, "polls": 1, "settle_from": "idle", "msg": "1 GPU(s) idle after 0.00 s",
      "confirmation": {"0": {"used_mib": 0, "pids": []}}}),
    ("freed at 2 s: ready one settle after the last look at a holder (1.5 s)", busy_until(2.0), {}, True,
     {"ready": True, "elapsed": 2.5, "idle_gpus": [0], "settle_from": "wait"}),
    ("busy past the timeout: wait_timeout with the holder", busy_until(99.0), {"timeout": 3.0}, False,
     {"error": "wait_timeout", "elapsed": 3.0, "msg": "timed out after 3 s: GPU 0 is used by pid 77 (python3)",
      "blockers": {"0": [{"pid": 77, "name": "python3", "container": None, "visible": True, "files": None}]},
      "memory": {"0": None}, "idle_gpus": [], "confirmation": None}),
    ("the task's msg comes first", busy_until(99.0), {"timeout": 1.0, "msg": "the old server is up"}, False,
     {"error": "wait_timeout", "msg": "the old server is up: timed out after 1 s: GPU 0 is used by pid 77 (python3)"}),
    ("confirmation off: none asked", idle, {"confirm_with_nvidia_smi": False}, True,
     {"ready": True, "confirmation": None, "polls": 1}),
]


@pytest.mark.parametrize("name, timeline, params, ok, expect", RUNS, ids=[r[0] for r in RUNS])
def test_the_wait(name, timeline, params, ok, expect):
    got_ok, result, _host = wait(timeline, **params)
    assert got_ok is ok, result
    for key, value in expect.items():
        assert result[key] == value, (key, result[key])
    assert result["gpus_before"][0]["index"] == 0 and result["polls"] >= expect.get("polls", 2)
    assert ("ready" in result) is ok and result["changed"] is False


def test_delay_is_slept_before_the_first_look_and_not_counted():
    ok, result, host = wait(idle, delay=5.0)
    assert ok and host.slept[0] == 5.0 and host.looks[0][0] == 5.0
    assert result["elapsed"] == 0.0


def test_the_full_scan_runs_at_the_first_look_and_when_the_gpus_first_look_idle():
    _ok, _result, host = wait(busy_until(2.0))
    fulls = [t for t, full in host.looks if full]
    assert fulls[0] == 0.0 and 2.0 in fulls and len(fulls) == 2, host.looks


def test_a_lost_gpu_fails_at_once_with_its_kind_and_what_was_seen():
    lost = {"status": "lost", "detail": "fallen off the bus", "checks": []}
    ok, result, host = wait(lambda t, full: [gpu(0, health=lost) if t >= 1.0 else gpu(0, used=4096, procs=[5])])
    assert not ok and result["error"] == "gpu_lost" and "fallen off the bus while waiting" in result["msg"]
    assert result["polls"] >= 2 and "changed" not in result and host.t < 2.0


def test_a_disagreeing_first_look_is_not_idle_in_one_look():
    # NVML sees nothing at the first look, nvidia-smi still sees a pid: the settle window opens from that look
    # (not one look, settle_from "wait") and nvidia-smi is asked once more as it closes.
    host = FakeHost(idle, smi=[{"gpus": [smi_row(0, pids=[9])]}, {"gpus": [smi_row(0)]}])
    ok, result, _host = wait(idle, host=host)
    assert ok and result["settle_from"] == "wait" and result["elapsed"] == 1.0 and result["polls"] >= 2


# --- nvidia-smi's confirmation: asked as the settle window opens, the final word when the GPUs are settled ---
CONFIRMATIONS = [
    # (id, nvidia-smi's answers, ok, error, words of msg, queries)
    ("agrees at once", [{"gpus": [smi_row(0)]}], True, None, ["1 GPU(s) idle"], 1),
    ("early answer disagrees, asked again, agrees", [{"gpus": [smi_row(0, pids=[9])]}, {"gpus": [smi_row(0)]}],
     True, None, ["1 GPU(s) idle after 1.00 s"], 2),
    ("disagrees: a pid", [{"gpus": [smi_row(0, pids=[4242])]}] * 2, False, "confirmation_disagrees",
     ["NVML says the GPUs are idle but nvidia-smi disagrees: nvidia-smi shows GPU 0 used by pid(s) 4242"], 2),
    ("disagrees: memory", [{"gpus": [smi_row(0, used=2048)]}] * 2, False, "confirmation_disagrees",
     ["nvidia-smi shows GPU 0 with 2048 MiB used"], 2),
    ("does not show the GPU", [{"gpus": []}] * 2, False, "confirmation_disagrees",
     ["nvidia-smi does not show GPU 0 (GPU-0)"], 2),
    ("fails once, then answers", [_errors.BackendError("rc 255"), {"gpus": [smi_row(0)]}], True, None, ["idle"], 2),
    ("fails twice: backend, short", [_errors.BackendError("x" * 5000)] * 2, False, "backend",
     ["confirm_with_nvidia_smi: nvidia-smi failed twice on GPU(s) 0", "Retry, or set confirm_with_nvidia_smi=false"], 2),
]


@pytest.mark.parametrize("name, answers, ok, error, words, queries", CONFIRMATIONS, ids=[c[0] for c in CONFIRMATIONS])
def test_the_confirmation(name, answers, ok, error, words, queries):
    host = FakeHost(idle, smi=answers)
    got_ok, result, _host = wait(idle, host=host)
    assert got_ok is ok and result.get("error") == error, result
    for w in words:
        assert w in result["msg"], result["msg"]
    assert host.queries == queries and len(result["msg"]) < 500
    if error == "confirmation_disagrees":
        assert result["blockers"] == {} and result["confirmation"] is not None and result["idle_gpus"] == [0]


def test_a_confirmation_asked_for_with_no_nvidia_smi_fails_and_unset_trusts_nvml():
    ok, result, _host = wait(idle, host=FakeHost(idle, smi_path=None), confirm_with_nvidia_smi=True)
    assert not ok and result["msg"] == "confirm_with_nvidia_smi: nvidia-smi not found on the target"
    ok, result, _host = wait(idle, host=FakeHost(idle, smi_path=None))
    assert ok and result["confirmation"] is None


# --- the progress slice: pending with the state, the next slice carries on ----------------------------------
def test_a_slice_returns_pending_and_the_next_one_carries_on():
    timeline = busy_until(14.0)
    ok, first, host = wait(timeline, progress_slice=10.0, timeout=60.0)
    assert ok and first["pending"] is True and first["changed"] is False and "ready" not in first
    assert first["progress"].startswith("gpu_wait_idle: 0/1 GPUs idle; waiting on GPU 0 (40 GiB, pid 77 python3)")
    assert first["progress"].endswith(" - 10 s of 60 s") and first["elapsed"] == 10.0
    assert first["gpus_before"][0]["idle"] is False
    carried = {"wait": first["progress_state"]["wait"], "offset": 10.5}  # the controller's clock: a round trip
    later = FakeHost(lambda t, full: timeline(t + 10.5, full))
    ok, second, _host = wait(None, host=later, progress_slice=10.0, timeout=60.0, progress_state=carried)
    assert ok and second["ready"] is True and "gpus_before" not in second
    assert 14.0 < second["elapsed"] <= 15.0 and second["polls"] > first["polls"]


# --- check mode: one look --------------------------------------------------------------------------------------
@pytest.mark.parametrize("timeline, would_wait, msg", [
    (idle, False, "all selected GPUs are idle"),
    (busy_until(99.0), True, "GPU 0 is used by pid 77 (python3)"),
], ids=["idle", "busy"])
def test_check_mode_looks_once(timeline, would_wait, msg):
    ok, result, host = wait(timeline, check_mode=True)
    assert ok and result["would_wait"] is would_wait and result["msg"] == msg
    assert result["polls"] == 1 and host.slept == [] and result["confirmation"] is None and host.queries == 0
    assert "gpus_before" not in result and "resets" not in result  # one look: gpus, said once


# --- reset_leaked ----------------------------------------------------------------------------------------------
LEAK = 2048


def leaky(reset_at, **fields):
    """GPU 2 leaked LEAK MiB until the fake host's nvidia-smi -r (at the time in reset_at)."""
    def timeline(t, full):
        leaked = not reset_at or t < reset_at[0]
        return [gpu(2, used=LEAK if leaked else 0, **fields)]
    return timeline


RESETS = [
    # (id, GPU fields, holders of its node, nvidia-smi -r's rc, check mode, ok, action, words of the reason)
    ("reset, then ready", {}, [], 0, False, True, "done", ["memory leaked and nothing holds the GPU's device node"]),
    ("check mode: would", {}, [], 0, True, True, "would", ["nothing holds"]),
    ("persistence mode on: refused", {"persistence_mode": True}, [], 0, False, False, "refused",
     ["persistence mode is on for GPU 2", "nvidia-smi -pm 0 -i 2"]),
    ("a daemon holds the node: refused", {},
     [{"pid": 9, "name": "nvidia-persistenced"}], 0, False, False, "refused",
     ["pid 9 (nvidia-persistenced, an NVIDIA daemon: systemctl stop nvidia-persistenced) holds the device node of GPU 2"]),
    ("nvidia-smi -r fails: refused with its output", {}, [], 255, False, False, "refused",
     ["nvidia-smi -r -i 2 failed (exit 255): GPU 00000000:12:00.0 is currently in use by another process."]),
]


@pytest.mark.parametrize("name, fields, holders, rc, check_mode, ok, action, words", RESETS, ids=[c[0] for c in RESETS])
def test_reset_leaked(name, fields, holders, rc, check_mode, ok, action, words):
    reset_at = []
    out = "GPU 00000000:12:00.0 " + ("was successfully reset." if rc == 0 else "is currently in use by another process.")
    host = FakeHost(leaky(reset_at, **fields), smi=[{"gpus": [smi_row(2)]}] * 2, node_holders={2: holders})

    def run(argv):  # nvidia-smi: -r resets (when rc is 0), --query-gpu says no display
        if argv[1] != "-r":
            return 0, "Disabled, Disabled", ""
        if rc == 0:
            reset_at.append(host.t)
        return rc, out, ""

    host.answer = run
    got_ok, result, _host = wait(None, host=host, check_mode=check_mode, diff=True, reset_leaked=True, leak_after=2.0,
                                 timeout=8.0)
    assert got_ok is ok, result
    [entry] = result["resets"]
    assert (entry["index"], entry["action"], entry["used_mib"]) == (2, action, LEAK), entry
    for w in words:
        assert w in entry["reason"], entry["reason"]
    resets = [argv for argv in host.commands if argv[1] == "-r"]
    assert len(resets) == (0 if check_mode or action == "refused" and rc == 0 else 1)
    if action in ("done", "would"):
        assert result["changed"] is True
        assert result["diff"] == {"before": f"GPU 2: {LEAK} MiB leaked\n", "after": "GPU 2: reset\n"}
    else:
        assert result["changed"] is False and "diff" not in result
        assert result["error"] == "wait_timeout" and "reset_leaked: GPU 2 not reset: " + entry["reason"] in result["msg"]
    if action == "done":
        assert result["ready"] and reset_at and result["elapsed"] >= round(reset_at[0] + 1.0, 3)  # a settle window after it
    if check_mode:
        assert result["would_wait"] is True and 2.0 <= result["elapsed"] <= 3.0  # watched for leak_after, no longer


# --- the timeout's diagnosis: one sentence per cause, with its GPUs and MiB ---------------------------------
def with_trend(g, kind, **trend):
    return g, {str(g["index"]): dict(trend, kind=kind, used=g["memory"]["used"])}


def case(*pairs):
    gpus, memory = [], {}
    for g, m in pairs:
        gpus.append(g)
        memory.update(m)
    return gpus, memory


UNREAD = "the driver's process list could not be read (NVML error 999, Unknown Error)"

# (id, (gpus, memory), leak_after, the sentences, words that must not be there)
DIAGNOSES = [
    ("(a) a leak beside a device-node bystander: the leak, with its MiB; the bystander lingers",
     case(with_trend(gpu(2, used=LEAK, holders=[4242]), "leaked", still=31.0)), 30.0,
     ["GPU 2: memory leaked (2048 MiB on GPU 2, not freed for 31 s with no process holding it, leak_after 30 s): a"
      " leaked context; reset the GPU once nothing holds it (nvidia-smi -r -i 2)",
      "GPU 2: pid 4242 (gpu-probe) holds only the device node, with no context (lingering: not what keeps it busy;"
      " a reset waits until nothing holds the node)"],
     ["is used by", "device file held by"]),
    ("(a') the same, not yet leak_after old",
     case(with_trend(gpu(2, used=LEAK, holders=[4242]), "unchanged", still=3.0)), 30.0,
     ["GPU 2: 2048 MiB used and no process holds it: the driver is still freeing the memory of exited processes, or a"
      " context leaked (nvidia-smi -r -i 2 resets it once nothing holds it); unchanged for 3 s with no process (a leak"
      " once it stays so for leak_after, 30 s): raise timeout (gpu_idle_timeout) to give the driver time to free it",
      "GPU 2: pid 4242 (gpu-probe) holds only the device node"],
     ["is used by"]),
    ("(b) a release lag on 8 GPUs: one sentence, the 8 GPUs, the MiB, raise timeout",
     case(*[with_trend(gpu(i, used=40960), "unchanged", still=3.0) for i in range(8)]), 30.0,
     ["GPUs 0, 1, 2, 3, 4, 5, 6, 7: 40960 MiB used on each and no process holds them: the driver is still freeing the"
      " memory of exited processes, or a context leaked (nvidia-smi -r -i <index> resets a GPU once nothing holds it);"
      " unchanged for 3 s with no process (a leak once it stays so for leak_after, 30 s): raise timeout"
      " (gpu_idle_timeout) to give the driver time to free it"],
     ["GPU 0:", "GPU 7:"]),
    ("draining at different MiB: each figure, the slowest rate, raise timeout",
     case(with_trend(gpu(0, used=61440), "draining", rate=4096.0, left=15.0),
          with_trend(gpu(1, used=30720), "draining", rate=2048.0, left=15.0)), 30.0,
     ["GPUs 0, 1: memory still being freed (61440 MiB on GPU 0, 30720 MiB on GPU 1 in use, 2.0 GiB/s, about 15 s left"
      " at this rate) with no process holding them: raise timeout (gpu_idle_timeout)"], ["leak"]),
    ("a context holder beside a bystander: only the context is the user",
     case((gpu(1, used=4096, procs=[77], holders=[4242]), {"1": None})), 30.0,
     ["GPU 1 is used by pid 77 (python3)", "GPU 1: pid 4242 (gpu-probe) holds only the device node, with no context"
      " (lingering: not what keeps it busy)"], ["4242 (gpu-probe),", "reset"]),
    ("the same cause on two GPUs: named once", case(*[(gpu(i, processes_error=UNREAD), {}) for i in (0, 1)]), 30.0,
     [f"GPUs 0, 1: {UNREAD}"], ["GPU 0:", "GPU 1:"]),
    ("one process on two GPUs", case((gpu(0, used=900, procs=[77]), {}), (gpu(1, used=900, procs=[77]), {})), 30.0,
     ["GPUs 0, 1 are used by pid 77 (python3)"], []),
    ("from a container: unmoving memory is not called a leak, nor raise timeout",
     case(with_trend(gpu(4, used=1200, in_container=True), "leaked", still=40.0)), 30.0,
     ["GPU 4: 1200 MiB used by processes not visible from this PID namespace (another container or the host), or a"
      " leaked context; unchanged for 40 s with no process (a leak once it stays so for leak_after, 30 s)"],
     ["memory leaked", "raise timeout"]),
    ("all causes: holders first, then memory by kind", case(
        (gpu(5, used=900, procs=[8812]), {"5": None}),
        with_trend(gpu(0, used=8192), "draining", rate=1024.0, left=8.0),
        with_trend(gpu(1, used=1200), "unchanged", still=5.0),
        with_trend(gpu(2, used=300), "leaked", still=40.0)), 30.0,
     ["GPU 5 is used by pid 8812 (python3)", "GPU 0: memory still being freed (8192 MiB in use, 1.0 GiB/s, about 8 s",
      "GPU 1: 1200 MiB used and no process holds it", "GPU 2: memory leaked (300 MiB on GPU 2"], []),
]


@pytest.mark.parametrize("name, gpus_memory, leak_after, sentences, absent", DIAGNOSES, ids=[c[0] for c in DIAGNOSES])
def test_diagnosis(name, gpus_memory, leak_after, sentences, absent):
    gpus, memory = gpus_memory
    text = _wait.diagnosis(gpus, 64, memory, leak_after)
    parts = text.split("; ")
    at = -1
    for sentence in sentences:
        assert sentence in text, (sentence, text)
        found = text.index(sentence)
        assert found > at, ("out of order", sentence, text)
        at = found
    for word in absent:
        assert word not in text, (word, text)
    # one sentence per cause: no GPU is named at the start of two sentences of the same cause
    starts = [p.split(":")[0] for p in parts if p.startswith("GPU")]
    assert len(starts) == len(set(starts)) or "lingering" in text, text


def test_a_bystander_does_not_hide_the_leak_from_the_samples():
    """The samples count the processes that may hold a GPU's memory: a device-node bystander is not one of them, so
    memory_trend sees memory held with no process (the field case (a))."""
    state = _wait.new_state()
    snap = [gpu(2, used=LEAK, holders=[4242])]
    for t in (0.0, 0.5, 31.0):
        _wait.step(state, t, lambda full: copy.deepcopy(snap), lambda pid, st: True, 1.0, 15.0)
    assert all(point[2] == 0 for point in state["samples"]["2"]), state["samples"]
    assert _wait.trends(state, 31.0)["2"]["kind"] == "leaked"
    assert [h["pid"] for h in _wait.holders_of(snap[0])] == [4242] and _wait.memory_holders(snap[0]) == []


def test_every_failure_of_the_wait_has_an_error_kind():
    for cls, kind in ((_errors.WaitTimeout, "wait_timeout"), (_errors.ConfirmationDisagrees, "confirmation_disagrees")):
        assert issubclass(cls, _errors.GpuError) and cls("x").result() == {"msg": "x", "error": kind}


class BootedHost(FakeHost):
    """A fake host with a boot id, and a clock that began 100 s before the wait (the release ran then)."""

    def __init__(self, timeline, boot="boot-1"):
        super().__init__(timeline)
        self.t, self.boot = 100.0, boot

    def boot_id(self):
        return self.boot

    @staticmethod
    def alive(pid, start_time):
        return pid == 55  # the notebook kernel lives on


def draining_with_notebook(t, full):
    # The released server's memory is freed 0.5 s after the wait began; a notebook kernel (a device node, no
    # context, pid 55 start 7) is there all along: while the memory drains the list looks incomplete and it blocks.
    return [gpu(0, used=40960 if t < 100.5 else 0, holders=[55] if full else ())]


QUIET = {"clock": 99.0, "boot_id": "boot-1", "gpus": [0], "device_holders": [[55, 7]]}


@pytest.mark.parametrize("quiet, elapsed, settle_from", [
    pytest.param(QUIET, 0.5, "release", id="the release last saw a holder 1 s before: ready as the memory is freed"),
    pytest.param(None, 1.0, "wait", id="no quiet_since: one settle after the first look (the notebook, there all"
                                       " along, does not restart it)"),
    pytest.param(dict(QUIET, boot_id="boot-0"), 1.0, "wait", id="another boot: another clock, no credit"),
    pytest.param(dict(QUIET, clock=100.5), 1.0, "wait", id="from the future: no credit"),
    pytest.param(dict(QUIET, gpus=[1]), 1.0, "wait", id="the release did not watch GPU 0: no credit"),
    pytest.param(dict(QUIET, device_holders=[]), 1.0, "wait",
                 id="the notebook is new to the release: the first look restarts the clock"),
])
def test_quiet_since_hands_the_release_s_watch_to_the_settle_window(quiet, elapsed, settle_from):
    host = BootedHost(draining_with_notebook)
    ok, result, _host = wait(None, host=host, quiet_since=quiet)
    assert ok and result["ready"] and result["settle_from"] == settle_from
    assert result["elapsed"] == pytest.approx(elapsed, abs=0.06)


def test_a_context_at_the_first_look_restarts_the_clock_despite_quiet_since():
    host = BootedHost(lambda t, full: [gpu(0, used=40960, procs=[88]) if t < 100.2 else gpu(0)])
    ok, result, _host = wait(None, host=host, quiet_since=QUIET)
    assert ok and result["settle_from"] == "wait" and result["elapsed"] == pytest.approx(1.0)


# --- left_holders: a process the release left fails the wait after blocker_grace, not at the timeout ----------
LEFT = [{"pid": 872, "start_time": None, "reason": "in CT 130, not in containers (129)"}]


def other_tenant(t, full):
    g = gpu(0, used=2048, procs=[872])
    g["processes"][0]["container"] = {"kind": "lxc", "id": 130, "pid_in_container": 41}
    g["idle"], g["busy_reasons"], blockers, _lingering = verdict(g, 64)
    g["blockers"] = [b["pid"] for b in blockers]
    return [g]


@pytest.mark.parametrize("name, timeline, params, error, elapsed", [
    ("the other tenant's job: blocked after the grace", other_tenant, {"left_holders": LEFT}, "blocked", 5.0),
    ("a grace of 0: blocked at the first look", other_tenant, {"left_holders": LEFT, "blocker_grace": 0.0}, "blocked", 0.0),
    ("no left_holders: the timeout, as before", other_tenant, {"timeout": 8.0}, "wait_timeout", 8.0),
    ("another process with that pid (start time): the timeout", other_tenant,
     {"timeout": 8.0, "left_holders": [dict(LEFT[0], start_time=99)]}, "wait_timeout", 8.0),
    ("a grace at the timeout: the timeout", other_tenant, {"timeout": 5.0, "left_holders": LEFT}, "wait_timeout", 5.0),
])
def test_a_holder_the_release_left_fails_fast(name, timeline, params, error, elapsed):
    ok, result, _host = wait(timeline, **params)
    assert not ok and result["error"] == error and result["elapsed"] == elapsed, result["msg"]
    if error == "blocked":
        assert result["msg"] == (
            f"blocked after {elapsed:.1f} s of 10 s (still there after blocker_grace, {params.get('blocker_grace', 5.0):g} s):"
            " GPU 0 is used by pid 872 (python3) in CT 130, which the release before this wait left (in CT 130, not in"
            " containers (129)): nothing in this hook will stop it. See it: `ps -o pid,user,etime,args -p 872`. When it"
            " may be stopped: stop it in CT 130 (`pct exec 130 -- kill 41`); or leave GPU 0 out of the GPUs to wait"
            " for")
        assert result["left_blockers"] == [{"gpu": 0, "pid": 872, "reason": LEFT[0]["reason"]}]


def test_a_left_holder_that_ends_within_the_grace_is_waited_for():
    ok, result, _host = wait(lambda t, full: other_tenant(t, full) if t < 3.0 else [gpu(0)], left_holders=LEFT)
    assert ok and result["ready"] and result["elapsed"] >= 3.0


def test_the_progress_line_says_the_hook_will_not_stop_it():
    ok, result, _host = wait(other_tenant, left_holders=LEFT, blocker_grace=60.0, timeout=120.0, progress_slice=2.0)
    assert ok and result["pending"]
    assert "pid 872 python3, CT 130, left by the release: the hook will not stop it" in result["progress"], result["progress"]


class DeadlineHost(FakeHost):
    """A FakeHost that records the deadlines the wait sets for its calls (WaitIO.set_deadline)."""

    def __init__(self, timeline, **kwargs):
        super().__init__(timeline, **kwargs)
        self.deadlines = []

    def set_deadline(self, deadline):
        self.deadlines.append((round(self.t, 3), deadline))


def test_every_call_of_a_wait_ends_by_its_timeout_and_the_diagnosis_gets_one_query_more():
    host = DeadlineHost(busy_until(100.0))
    ok, res, _host = wait(None, host=host, timeout=4.0, query_timeout=10.0)
    assert not ok and res["error"] == "wait_timeout", res
    # At the start: the wait's timeout; once the time is up, one look more for the diagnosis: one query's limit.
    assert host.deadlines == [(0.0, 4.0), (4.0, 14.0)], host.deadlines


def test_a_slice_of_a_wait_ends_by_the_whole_waits_timeout():
    # A later progress slice (the action plugin's): 3 s of the 10 s already went by in the slices before it.
    host = DeadlineHost(busy_until(100.0))
    state = {"wait": _wait.new_state(), "offset": 3.0}
    wait(None, host=host, progress_state=state, progress_slice=1.0, query_timeout=10.0)
    assert host.deadlines[0] == (0.0, 7.0), host.deadlines


def test_no_second_nvidia_smi_try_past_the_timeout():
    from ansible_collections.gpuops.gpu.plugins.module_utils import _errors

    class Late(DeadlineHost):
        def smi_query(self, path):
            self.queries += 1
            self.t += 3.0  # hung until the call's limit: the time left of the wait's timeout
            raise _errors.QueryTimeout("nvidia-smi --query-gpu did not answer within 3 s and was killed")

    host = Late(idle)
    ok, res, _host = wait(None, host=host, timeout=3.0, confirm_with_nvidia_smi=True, query_timeout=10.0)
    assert not ok and host.queries == 1, (host.queries, res)
    assert res["msg"].startswith("confirm_with_nvidia_smi: nvidia-smi failed before the wait's timeout (3 s)"), res["msg"]
