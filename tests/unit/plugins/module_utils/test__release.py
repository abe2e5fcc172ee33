# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The release sequence (_release: Plan, Stop, Watch, release) with its I/O injected: a host written as a table.

A fake host is the one way to drive the sequence's branches (a newcomer that appears between two
looks, a recycled pid, a unit that fails to stop) deterministically; the functional tests run the
same sequence against real processes on the simulator.
"""

from __future__ import annotations

import types

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _bound, _errors, _release, _selection, _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs
from ansible_collections.gpuops.gpu.plugins.module_utils._host.protocols import ReleaseHost

SIGTERM, SIGKILL = 15, 9


def proc(pid, ppid=1, ct=129, unit=None, start=None, session=None, pgrp=None, name="python3", ct_pid=None):
    return {"pid": pid, "name": name, "cmdline": name, "user": "root", "uid": 0, "ppid": ppid,
            "start_time": start if start is not None else pid * 10, "unit": unit,
            "container": {"kind": "lxc", "id": ct, "pid_in_container": ct_pid or pid % 100 + 2} if ct else None,
            "cgroup": f"/lxc/{ct}/ns/x" if ct else "/x", "session": session or pid, "pgrp": pgrp or pid, "tty_nr": 0,
            "ns_pid": pid}


class FakeTarget:
    def __init__(self, host, info):
        self.host, self.info, self.pid = host, info, info["pid"]
        self.signals, self.gone_at, self.recycled = [], None, False

    def alive(self):
        return self.pid in self.host.procs and self.host.procs[self.pid]["start_time"] == self.info["start_time"]

    def send(self, sig):
        if not self.alive():
            return False
        self.signals.append({SIGTERM: "SIGTERM", SIGKILL: "SIGKILL", 18: "SIGCONT"}[sig])
        self.host.signalled.append((self.pid, sig))
        if sig in self.host.dies_on.get(self.pid, (SIGTERM, SIGKILL)):
            self.host.exit(self.pid)
            self.gone_at = self.host.now()
        return True

    def close(self):
        pass


class FakeHost:
    """Processes, GPUs (contexts by pid), children, and events that happen after the n-th snapshot."""

    def __init__(self, procs, contexts, events=None, dies_on=None):
        self.procs = {p["pid"]: p for p in procs}
        self.contexts = contexts            # pid -> [GPU indexes]
        self.events = events or {}          # snapshot number -> [process dicts that appear]
        self.dies_on = dies_on or {}
        self.signalled, self.snapshots, self.commands, self.clock = [], 0, [], 0.0
        self.warnings = []

    def exit(self, pid):
        self.procs.pop(pid, None)
        self.contexts.pop(pid, None)

    # --- the io interface ---
    def snapshot(self, holders=True):
        for p in self.events.pop(self.snapshots, []):
            self.procs[p["pid"]] = p
            self.contexts[p["pid"]] = p.pop("gpus_ctx")
        self.snapshots += 1
        gpus = []
        for i in range(8):
            ps = [dict(self.procs[pid], used_mib=1024, visible=True) for pid, g in self.contexts.items() if i in g]
            gpus.append({"index": i, "minor_number": i, "memory": {"used": 1024 * len(ps)}, "processes": ps,
                         "holders": [dict(p, evidence="context", files=[f"/dev/nvidia{i}"]) for p in ps]})
        return gpus

    def read(self, pid):
        return dict(self.procs[pid]) if pid in self.procs else None

    def text(self, p):
        return p.get("cmdline") or ""

    def exe(self, pid):
        return None

    def children(self):
        out = {}
        for p in self.procs.values():
            out.setdefault(p["ppid"], []).append(p["pid"])
        return out

    def me(self):
        return 4000, [3999]

    def host_namespace(self):
        return True

    def pin(self, info):
        target = FakeTarget(self, info)
        target.recycled = info["pid"] in self.procs and not target.alive()
        return target, target.alive()

    def check_may_signal(self, procs):
        pass  # root on this host (the functional tests run without root over SSH)

    def wait_gone(self, targets, timeout):
        return [t for t in targets if t.alive()]

    def state(self, pid):
        return "S" if pid in self.procs else None

    def now(self):
        self.clock += 0.01
        return self.clock

    def ticks_now(self):
        return 5000

    def boot_id(self):
        return "boot-1"

    def ticks_per_s(self):
        return 100

    def sleep(self, s):
        self.clock += s

    def bins(self, name):
        return f"/usr/sbin/{name}"

    def frozen(self, _pid):
        return False

    def exec_watch(self, _vmid, _limit):
        return None

    def cgroup_procs(self, path):
        """The processes of the payload cgroup ``path`` (the fake's processes sit one level below it)."""
        return [pid for pid, p in self.procs.items() if (p.get("cgroup") or "").startswith(path + "/")]

    def warn(self, text):
        self.warnings.append(text)

    def run_command(self, argv, timeout, what):
        self.commands.append(argv)
        unit = argv[-1]
        for p in list(self.procs.values()):
            if p.get("unit") == unit:
                self.exit(p["pid"])
        return 0, "", ""


def test_the_fake_is_a_release_host():
    assert isinstance(FakeHost([], {}), ReleaseHost)


def params(**over):
    p = dict(gpus=None, containers=None, users=None, match=None, pids=None, exclude=None, tree=True, signal="SIGTERM",
             grace_period=1.0, escalate=True, kill_timeout=1.0, fail_on_survivors=True, stop_units=True, all=False,
             pct="pct", lock_timeout=0.0, include_device_holders=True, protect=[], max_memory_used_mib=64)
    p.update(over)
    return p


def plan(host, p, gpus=None, before=None):
    gpus = host.snapshot() if gpus is None else gpus
    return _release.Plan(p, _validate.release(p, _selection.parse(p["gpus"])), host, gpus, gpus if before is None else before)


def release_after(plan_, host):
    """The steps after the plan: (what the test reads of the release - its failure, warnings, t0 -, the result)."""
    t0 = host.clock + 0.01  # the stop's first io.now() (the fake's clock ticks 0.01 a call)
    res, failure, warnings = _release.release(plan_, host, SIGTERM)
    return types.SimpleNamespace(failure=failure, warnings=plan_.warnings + warnings, t0=t0), res


def run(host, **over):
    p = params(**over)
    gpus = host.snapshot()
    plan_ = plan(host, p, gpus, [g for g in gpus if p["gpus"] is None or str(g["index"]) in p["gpus"]])
    assert plan_.problem == "", plan_.problem
    return release_after(plan_, host)


def test_a_server_and_its_api_process_are_released_and_the_neighbour_is_not():
    host = FakeHost([proc(100, ppid=1, session=100), proc(101, ppid=100, session=100), proc(102, ppid=100, session=100),
                     proc(200, ct=130)], {101: [0], 102: [1], 200: [7]})
    release, res = run(host, containers=[129])
    assert sorted(r["pid"] for r in res["released"]) == [100, 101, 102]
    assert 200 in host.procs and all(pid != 200 for pid, _s in host.signalled)
    assert release.failure == "" and res["respawned"] == []


def test_a_child_forked_during_the_release_below_a_target_gets_sigkill():
    # Snapshot 1 is the first look after the signals: a child of the (still alive) worker appears.
    host = FakeHost([proc(100, session=100), proc(101, ppid=100, session=100)], {101: [0]},
                    dies_on={100: (SIGKILL,), 101: (SIGTERM, SIGKILL)})
    host.events[1] = [dict(proc(150, ppid=100, session=100, pgrp=100, start=5001), gpus_ctx=[0])]
    release, res = run(host, containers=[129])
    forked = [r for r in res["released"] if r["pid"] == 150]
    assert forked and forked[0]["signals"] == ["SIGKILL"] and "appeared during the release" in forked[0]["why"]
    assert res["respawned"] == []


def test_an_orphan_of_a_target_is_known_by_its_session_and_process_group():
    host = FakeHost([proc(101, session=101, pgrp=101)], {101: [0]})
    host.events[1] = [dict(proc(150, ppid=1, session=101, pgrp=101, start=5001), gpus_ctx=[0])]
    _release_, res = run(host, containers=[129])
    assert 150 in {r["pid"] for r in res["released"]} and res["respawned"] == []


@pytest.mark.parametrize("newcomer, supervisor, in_scope", [
    pytest.param(proc(150, ppid=4012, ct=129, session=150, start=5001), "systemd (pid 4012, PID 1 of CT 129", True,
                 id="restarted with a new session below the container's init"),
    pytest.param(proc(150, ppid=90, ct=129, session=90, start=5001), "sh (pid 90", True,
                 id="restarted by a shell loop"),
    pytest.param(proc(150, ppid=1, ct=130, session=150, start=5001), None, False,
                 id="a job another container started meanwhile"),
])
def test_every_other_newcomer_is_reported_and_never_signalled(newcomer, supervisor, in_scope):
    procs = [proc(101, session=101), proc(90, ppid=1, ct=129, name="sh", session=90)]
    if newcomer["ppid"] == 4012:
        procs.append(proc(4012, ppid=4000, ct=129, ct_pid=1, name="systemd"))
    host = FakeHost(procs, {101: [0]})
    host.events[1] = [dict(newcomer, gpus_ctx=[0])]
    release, res = run(host, containers=[129], tree=False)
    (entry,) = res["respawned"]
    assert entry["pid"] == 150 and entry["in_scope"] is in_scope
    assert (entry["supervisor"] or "").startswith(supervisor or "") and "not signalled" in entry["advice"] or in_scope
    assert all(pid != 150 for pid, _s in host.signalled)
    assert bool(release.failure) is in_scope


def test_a_unit_is_stopped_through_systemd_before_the_signals():
    host = FakeHost([proc(101, unit="sglang.service")], {101: [0]})
    release, res = run(host, containers=[129])
    assert host.commands == [["/usr/sbin/pct", "exec", "129", "--", "systemctl", "stop", "sglang.service"]]
    assert [u["rc"] for u in res["stopped_units"]] == [0] and host.signalled == []


@pytest.mark.parametrize("ct, said, unsaid", [
    (129, "or name it in proxmox_fence_services", "on the node"),
    (None, "(on the node: systemctl stop sglang.service)", "proxmox_fence_services"),  # the node's own unit
])
def test_respawn_advice_fits_where_the_unit_runs(ct, said, unsaid):
    text = _release.respawn_advice(proc(150, ct=ct, unit="sglang.service"), 1.0, unit_stopped=False)
    assert said in text and unsaid not in text, text


@pytest.mark.parametrize("stopped, planned", [
    ([], ["sglang.service"]),
    ([(129, "sglang")], []),            # the fence stopped it (or, in check mode, would): named as systemctl takes it
    ([(129, "sglang.service")], []),
    ([(130, "sglang")], ["sglang.service"]),  # another container's unit of that name
])
def test_a_unit_the_fence_stopped_is_not_planned_again(stopped, planned):
    host = FakeHost([proc(101, unit="sglang.service")], {101: [0]})
    p = params(containers=[129], units_stopped=stopped)
    release = plan(host, p)
    assert release.problem == ""
    assert [u["unit"] for u in release.check_mode_result(False)["stopped_units"]] == planned


def test_a_recycled_pid_is_never_signalled():
    host = FakeHost([proc(101)], {101: [0]})
    p = params(containers=[129])
    release = plan(host, p)
    assert release.problem == ""
    host.procs[101] = proc(101, start=999)  # the pid now names another process
    release, res = release_after(release, host)
    assert host.signalled == [] and "recycled" in res["skipped_processes"][-1]["reason"]


def test_check_mode_reports_the_targets_and_signals_nothing():
    host = FakeHost([proc(101, unit="vllm.service")], {101: [0]})
    p = params(containers=[129])
    release = plan(host, p)
    assert release.problem == ""
    res = release.check_mode_result(True)
    assert [r["pid"] for r in res["released"]] == [101] and host.signalled == [] and host.commands == []
    assert "unit vllm.service in CT 129: stopped" in res["diff"]["after"]


def diff_gpu(index, used, blockers, idle=None, reasons=()):
    procs = [{"pid": pid, "name": "python3", "container": {"kind": "lxc", "id": 129}} for pid in blockers]
    return {"index": index, "memory": {"used": used}, "processes": procs, "holders": [], "blockers": list(blockers),
            "idle": not blockers and not reasons if idle is None else idle, "busy_reasons": list(reasons)}


@pytest.mark.parametrize("gpu, without, limit, memory, line", [
    (diff_gpu(0, 2048, [11, 12]), (), 8, True, "GPU 0: 2048 MiB used, pid 11 (python3) in CT 129, pid 12 (python3) in CT 129"),
    (diff_gpu(0, 0, []), (), 8, True, "GPU 0: 0 MiB used, idle"),
    # bounded: at most ``limit`` named, the rest counted (None with detail: full - all of them)
    (diff_gpu(3, 9, range(100, 112)), (), 2, True,
     "GPU 3: 9 MiB used, pid 100 (python3) in CT 129, pid 101 (python3) in CT 129, and 10 more (detail: full names them)"),
    (diff_gpu(3, 9, range(100, 112)), (), None, False, "GPU 3: " + ", ".join(f"pid {p} (python3) in CT 129" for p in range(100, 112))),
    # check mode's after: the targets gone, what the release leaves
    (diff_gpu(1, 4096, [11, 12]), {11, 12}, 8, False, "GPU 1: released"),
    (diff_gpu(1, 4096, [11, 12]), {11}, 8, False, "GPU 1: pid 12 (python3) in CT 129"),
    (diff_gpu(2, 30000, [], reasons=["30000 MiB used with no process: " + "x" * 500]), (), 8, True,
     "GPU 2: 30000 MiB used, busy: 30000 MiB used with no process: " + "x" * 168 + " [... 332 more characters cut]"),
], ids=["held", "idle", "capped", "full", "check-released", "check-left", "reason-cut"])
def test_a_diff_says_each_gpu_in_one_bounded_line(gpu, without, limit, memory, line):
    assert _release.gpu_line(gpu, without, limit, memory) == line


def test_a_diff_lists_the_units_bounded_then_the_gpus():
    units = [{"unit": f"s{i}.service", "container": 129, "state_after": "stopped"} for i in range(10)]
    before = [diff_gpu(0, 2048, [11])]
    diff = _release.release_diff(units, before, None, [{"pid": 11}], limit=8)
    assert diff["before"].splitlines()[0] == "unit s0.service in CT 129: active"
    assert diff["after"].splitlines()[7:] == ["unit s7.service in CT 129: stopped", "+2 more unit(s)", "GPU 0: released"]
    real = _release.release_diff(units[:1], before, [diff_gpu(0, 0, [])], limit=8)
    assert real["after"] == "unit s0.service in CT 129: stopped\nGPU 0: 0 MiB used, idle\n"
    assert {"before_header", "after_header"} <= set(real)


@pytest.mark.parametrize("state, phrase", [("D", "stuck in the kernel"), ("S", "raise kill_timeout"),
                                           ("T", "raise kill_timeout")])
def test_survivors_are_described_by_their_state(state, phrase):
    msg = _release.survivor_message([dict(proc(101), state=state)], params(), SIGTERM)
    assert phrase in msg and ("reboot" in msg) is (state == "D")


# --- issue 20, item 5: the operator cases -------------------------------------------------------------------
class SlowHost(FakeHost):
    """A FakeHost whose processes take time to exit: ``exit_after`` {pid: {signal: seconds}} (absent: never);
    ``states`` {pid: state letter}; ``frozen_pids``: in a frozen cgroup; ``freeze_on_signal``: frozen when a
    signal reaches it (a backup that freezes the container meanwhile). wait_gone follows the clock."""

    def __init__(self, procs, contexts, exit_after=None, states=None, frozen_pids=(), freeze_on_signal=()):
        super().__init__(procs, contexts, dies_on={p["pid"]: () for p in procs})
        self.exit_after = exit_after or {}
        self.states = dict(states or {})
        self.frozen_pids = set(frozen_pids)
        self.freeze_on_signal = set(freeze_on_signal)
        self.deadlines = {}

    def deliver(self, pid, sig):
        """A stopped process keeps its signals pending until SIGCONT (SIGKILL excepted), as the kernel does."""
        if pid in self.freeze_on_signal:
            self.frozen_pids.add(pid)
        pending = self.__dict__.setdefault("pending", {}).setdefault(pid, [])
        if sig == 18 and self.states.get(pid) == "T":
            self.states[pid] = "S"
            for held in pending:
                self.deliver(pid, held)
            pending.clear()
            return
        if self.states.get(pid) == "T" and sig != SIGKILL:
            pending.append(sig)
            return
        after = self.exit_after.get(pid, {}).get(sig)
        if after is not None:
            self.deadlines[pid] = min(self.deadlines.get(pid, float("inf")), self.clock + after)

    def pin(self, info):
        target, ok = super().pin(info)
        host, send = self, target.send

        def send_and_deliver(sig):
            sent = send(sig)
            if sent:
                host.deliver(target.pid, sig)
            return sent
        target.send = send_and_deliver
        return target, ok

    def wait_gone(self, targets, timeout):
        end = self.clock + timeout
        for t in targets:
            if self.deadlines.get(t.pid, float("inf")) <= end:
                self.exit(t.pid)
        alive = [t for t in targets if t.alive()]
        # the wait ends when the last one exits, or at its end
        self.clock = end if alive else max([self.clock] + [self.deadlines.get(t.pid, self.clock) for t in targets])
        return alive

    def state(self, pid):
        return self.states.get(pid, "S") if pid in self.procs else None

    def frozen(self, pid):
        return pid in self.frozen_pids


def module_default(option):
    from ansible_collections.gpuops.gpu.plugins.modules import gpu_release
    return gpu_release.ARGUMENT_SPEC[option]["default"]


def warnings_of(release):
    return " ".join(release.warnings)


def test_match_sees_the_workload_root_also_without_tree():
    # vLLM's renamed engine: only the API server above it says vllm; tree: false signals the engine alone.
    api = dict(proc(100, session=100), cmdline="python3 -m vllm.entrypoints.openai.api_server")
    engine = dict(proc(101, ppid=100, session=100, name="VLLM::EngineCore"), cmdline="VLLM::EngineCore")
    for match in ("vllm", "sglang|vllm"):
        host = FakeHost([dict(api), dict(engine)], {101: [0]})
        release, res = run(host, match=match, tree=False)
        assert [r["pid"] for r in res["released"]] == [101] and 100 in host.procs


def test_a_scope_that_selects_nothing_names_the_holders_it_left():
    host = FakeHost([dict(proc(101), cmdline="python3 -m vllm.entrypoints.openai.api_server"), proc(102)],
                    {101: [0], 102: [3]})
    release, res = run(host, match="sglang")
    assert res["released"] == [] and host.signalled == []
    said = [w for w in release.warnings
            if w.startswith("the scope selects none of the processes that hold the selected GPUs: ")]
    assert len(said) == 1, release.warnings
    # each holder it missed, on its GPUs, with why (what match saw)
    assert "pid 101 (python3) in CT 129 on GPU 0: neither its command line, executable nor unit matches 'sglang' (it saw" \
        " 'python3 -m vllm.entrypoints.openai.api_server'" in said[0]
    assert "pid 102 (python3) in CT 129 on GPU 3: " in said[0]


@pytest.mark.parametrize("match, released, said", [
    # vLLM's engine and workers renamed by setproctitle, their API server gone: match is case-sensitive
    ("vllm", [], "'VLLM::Worker_TP0' matches it only ignoring case - match is case-sensitive; (?i)vllm matches both"),
    ("(?i)sglang|vllm", [101, 102], None),
    ("VLLM::", [101, 102], None),
])
def test_a_match_that_misses_renamed_workers_says_why(match, released, said):
    host = FakeHost([dict(proc(101, name="VLLM::Worker_TP"), cmdline="VLLM::Worker_TP0"),
                     dict(proc(102, name="VLLM::Worker_TP"), cmdline="VLLM::Worker_TP1")], {101: [0], 102: [1]})
    release, res = run(host, match=match, tree=False)
    assert sorted(r["pid"] for r in res["released"]) == released
    if said:
        (warning,) = [w for w in release.warnings if "the scope selects none" in w]
        assert said in warning, warning
        assert "pid 102 (VLLM::Worker_TP) in CT 129 on GPU 1" in warning, warning


@pytest.mark.parametrize("name, procs, contexts, over, looks", [
    # nothing holds a GPU (an idle node): one look after, no watch
    ("idle node", [], {}, {}, 1),
    # every holder left by the gate (another tenant's job): nothing of ours can respawn
    ("nothing selected", [dict(proc(101), cmdline="python3 -m vllm")], {101: [0]}, {"match": "sglang"}, 1),
    # a target was signalled: the watch looks until NEWCOMER_WATCH_S has passed (polls every RESPAWN_POLL_S)
    ("a target", [proc(101)], {101: [0]}, {}, 1 + int(_release.NEWCOMER_WATCH_S / _release.RESPAWN_POLL_S)),
])
def test_a_release_that_signals_nothing_looks_once_and_does_not_watch(name, procs, contexts, over, looks):
    host = FakeHost(procs, contexts)
    before = host.snapshots
    _release_obj, res = run(host, **over)
    after = host.snapshots - before - 1  # the plan's own look
    assert res["gpus"] is not None, "a release always ends with a look after"
    assert after == looks, (name, after)


def test_a_stopped_holder_gets_sigcont_after_sigterm_and_exits_without_the_grace_period():
    host = SlowHost([proc(101)], {101: [0]}, exit_after={101: {SIGTERM: 0.2, SIGKILL: 0.0}}, states={101: "T"})
    release, res = run(host, containers=[129], grace_period=30.0)
    assert host.signalled == [(101, SIGTERM), (101, 18)]
    (entry,) = res["released"]
    assert entry["signals"] == ["SIGTERM", "SIGCONT"] and res["survivors"] == []
    assert host.clock < 30


def test_the_default_kill_timeout_covers_a_40_s_teardown():
    # A server that ignores SIGTERM and needs 40 s after SIGKILL to free its pinned memory (sglang#32829).
    kill_timeout = module_default("kill_timeout")
    assert kill_timeout >= 40
    host = SlowHost([proc(101)], {101: [0]}, exit_after={101: {SIGKILL: 40.0}})
    release, res = run(host, containers=[129], grace_period=1.0, kill_timeout=kill_timeout)
    assert [r["pid"] for r in res["released"]] == [101] and res["survivors"] == [] and release.failure == ""


SURVIVORS = [
    # (case, state, escalate, why_alive, phrases, absent)
    ("D after SIGKILL", "D", True, None, ["survived SIGKILL", "(state D) is stuck in the kernel", "Xid",
                                          "45 s (kill_timeout) after SIGKILL"], ["raise grace_period"]),
    ("S after SIGKILL", "S", True, None, ["(state S) is still exiting", "raise kill_timeout (and grace_period)"],
     ["stuck", "reboot"]),
    ("S without escalate", "S", False, None, ["survived SIGTERM", "10 s (grace_period) after SIGTERM",
                                              "raise grace_period, or set escalate: true"], ["kill_timeout", "reboot"]),
    ("T without escalate", "T", False, None, ["(state T) is stopped", "it was sent SIGCONT", "raise grace_period"],
     ["stuck", "still exiting"]),
    ("nested PID 1", "S", False, "PID 1 of a nested PID namespace: it ignores SIGTERM unless it handles it",
     ["PID 1 of a nested PID namespace: it ignores SIGTERM unless it handles it", "or set escalate: true"], []),
    ("frozen, v1 freezer (state D)", "D", True, _release.frozen_text(proc(101)),
     ["CT 129 is frozen", "lxc-unfreeze -n 129", "survived SIGKILL"], ["stuck in the kernel", "Xid"]),
]


@pytest.mark.parametrize("name, state, escalate, why, phrases, absent", SURVIVORS, ids=[c[0] for c in SURVIVORS])
def test_survivor_messages(name, state, escalate, why, phrases, absent):
    survivor = dict(proc(101), state=state, **({"why_alive": why} if why else {}))
    msg = _release.survivor_message([survivor], params(escalate=escalate, grace_period=10.0, kill_timeout=45.0), SIGTERM)
    assert all(p in msg for p in phrases), msg
    assert not any(a in msg for a in absent), msg


@pytest.mark.parametrize("escalate", [True, False])
def test_pid_1_of_a_nested_pid_namespace_is_named(escalate):
    # SIGTERM is dropped by the kernel (no handler, PID 1 of its namespace); SIGKILL from the host is not.
    host = SlowHost([dict(proc(101), ns_pid=1)], {101: [0]}, exit_after={101: {SIGKILL: 0.0}})
    release, res = run(host, containers=[129], escalate=escalate)
    text = release.failure if not escalate else warnings_of(release)
    assert "PID 1 of a nested PID namespace: it ignores SIGTERM unless it handles it" in text, text
    if escalate:
        assert res["released"][0]["signals"] == ["SIGTERM", "SIGKILL"] and "killed with SIGKILL" in text
    else:
        assert [s["pid"] for s in res["survivors"]] == [101]


def test_a_container_init_is_not_taken_for_a_nested_namespace():
    assert _release.nested_init(dict(proc(101), ns_pid=1))
    assert not _release.nested_init(dict(proc(101, ct_pid=1), ns_pid=1))   # a Proxmox container's init
    assert not _release.nested_init(dict(proc(1), ns_pid=1))
    assert not _release.nested_init(proc(101))


def test_a_holder_frozen_by_the_signal_that_needed_sigkill_is_named():
    # frozen after the last look before the signals (a suspend-mode backup that started just then)
    host = SlowHost([proc(101)], {101: [0]}, exit_after={101: {SIGKILL: 0.0}}, freeze_on_signal={101})
    release, res = run(host, containers=[129])
    assert "CT 129 is frozen" in warnings_of(release) and res["released"][0]["signals"] == ["SIGTERM", "SIGKILL"]


# --- issue 29, item 2: a frozen container, a unit that could not be stopped ----------------------------------
@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check mode"])
def test_a_frozen_container_is_refused_before_anything_is_stopped_or_signalled(check_mode):
    host = SlowHost([proc(101, unit="sglang.service"), proc(102, ppid=101)], {101: [0], 102: [1]}, frozen_pids={101, 102})
    p = params(containers=[129])
    with pytest.raises(_release.ReleaseFailed) as exc:
        _release.run_release(p, _validate.release(p, _selection.parse(p["gpus"])), host, SIGTERM, check_mode=check_mode)
    assert exc.value.kind == "container_frozen"
    assert exc.value.msg.startswith("CT 129 is frozen (a suspend-mode backup, or lxc-freeze; its GPU holders: pid 101, 102):"
                                    " wait for the backup to finish, or thaw it with `lxc-unfreeze -n 129`, then run again."), exc.value.msg
    assert exc.value.msg.endswith("Nothing was signalled."), exc.value.msg
    assert host.signalled == [] and host.commands == []
    assert exc.value.partial["frozen"] == [{"container": 129, "pids": [101, 102]}] and not exc.value.partial["changed"]


@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check mode"])
def test_the_outcome_counts_each_list_whole(check_mode):
    """counts: what each list has before a summary caps it (the fence carries it in its release's outcome)."""
    host = SlowHost([proc(100 + i) for i in range(30)] + [proc(200, ct=130)], {**{100 + i: [i % 8] for i in range(30)}, 200: [7]},
                    exit_after={100 + i: {SIGTERM: 0.0} for i in range(30)})
    p = params(containers=[129], diff=True)
    res = _release.run_release(p, _validate.release(p, _selection.parse(p["gpus"])), host, SIGTERM, check_mode=check_mode, diff=True)
    assert res["counts"] == {k: len(res[k]) for k in _release.COUNTED}
    assert res["counts"]["released"] == 30 and res["counts"]["skipped_processes"] == 1
    # a summary caps the lists, never the counts
    assert _bound.bound(res)["counts"]["released"] == 30
    assert ("gpus_before" in res) is not check_mode  # check mode: one look, in gpus
    assert len(res["diff"]["before"].splitlines()) == 8  # one line per GPU


def test_a_container_frozen_after_the_plan_is_not_signalled_and_the_release_fails():
    host = SlowHost([proc(101)], {101: [0]}, exit_after={101: {SIGTERM: 0.0}})
    p = params(containers=[129])
    release = plan(host, p)
    assert release.problem == ""
    host.frozen_pids.add(101)
    release, res = release_after(release, host)
    assert host.signalled == [] and res["released"] == [] and res["frozen"] == [{"container": 129, "pids": [101]}]
    assert release.failure.startswith("CT 129 is frozen") and "Nothing was signalled" in release.failure


def test_a_frozen_host_cgroup_is_refused_too():
    host = SlowHost([proc(101, ct=None)], {101: [0]}, frozen_pids={101})
    p = params(pids=[101])
    release = plan(host, p)
    problem = release.problem
    assert problem.startswith("the cgroup of pid 101 on the host is frozen (systemctl freeze, cgroup.freeze)"), problem
    assert release.kind == "container_frozen" and host.signalled == []


def timeout_run(argv, timeout, what):
    raise _errors.QueryTimeout(f"{what} did not answer within {timeout:g} s and was killed: the driver may be hung"
                               " (check dmesg for Xid errors); raise query_timeout if the host is merely slow.")


def _cannot_start(argv, timeout, what):
    raise OSError(2, "No such file")


STOP_UNIT = [
    # (case, run_command, pct, vmid, rc, phrases in error ('' = none), absent)
    ("stopped", lambda argv, t, w: (0, "", ""), "/usr/sbin/pct", 129, 0, [], []),
    ("systemctl failed", lambda argv, t, w: (5, "", "Unit sglang.service not loaded.\n"), "/usr/sbin/pct", 129, 5,
     ["stopping sglang.service in CT 129 failed (rc 5): Unit sglang.service not loaded."], []),
    ("the container did not answer", timeout_run, "/usr/sbin/pct", 129, None,
     ["stopping sglang.service in CT 129 did not finish within 12 s: CT 129 did not answer",
      "pct exec 129 -- systemctl stop sglang.service was killed", "the unit was not stopped", "frozen"],
     ["driver", "query_timeout", "Xid"]),
    ("no pct here", lambda argv, t, w: (0, "", ""), None, 129, None, ["cannot stop sglang.service in CT 129: no pct"], []),
    ("a program that cannot start", _cannot_start,
     "/usr/sbin/pct", 129, None, ["stopping sglang.service in CT 129 failed"], []),
    ("a host unit", lambda argv, t, w: (0, "", ""), None, None, 0, [], []),
]


@pytest.mark.parametrize("name, runner, pct, vmid, rc, phrases, absent", STOP_UNIT, ids=[c[0] for c in STOP_UNIT])
def test_stop_unit(name, runner, pct, vmid, rc, phrases, absent):
    calls = []

    def run_command(argv, timeout, what):
        calls.append((argv, timeout))
        return runner(argv, timeout, what)
    out = _release.stop_unit(run_command, pct, vmid, "sglang.service", 12.0, systemctl="/bin/systemctl")
    assert out["rc"] == rc and out["unit"] == "sglang.service" and out["container"] == vmid
    assert (out["error"] == "") is (not phrases), out
    assert all(p in out["error"] for p in phrases) and not any(a in out["error"] for a in absent), out["error"]
    if vmid is None:
        assert out["command"] == ["/bin/systemctl", "stop", "sglang.service"]
    elif pct:
        assert out["command"] == [pct, "exec", "129", "--", "systemctl", "stop", "sglang.service"]
        assert calls == [(out["command"], 12.0)]
    else:
        assert calls == []


@pytest.mark.parametrize("runner, said", [
    (timeout_run, "stopping sglang.service in CT 129 did not finish within 12 s: CT 129 did not answer"),
    (lambda argv, t, w: (1, "", "Job for sglang.service canceled.\n"),
     "stopping sglang.service in CT 129 failed (rc 1): Job for sglang.service canceled"),
], ids=["timeout", "systemctl failed"])
def test_a_unit_that_could_not_be_stopped_fails_the_release_and_its_processes_are_signalled(runner, said):
    # Its supervisor (systemd's Restart=) can start the work again: signalled, but never a success.
    host = FakeHost([proc(101, unit="sglang.service")], {101: [0]})
    host.run_command = runner
    release, res = run(host, containers=[129], grace_period=1.0, kill_timeout=1.0)
    assert res["stopped_units"] == [] and [r["pid"] for r in res["released"]] == [101]
    assert host.signalled == [(101, SIGTERM)]
    (entry,) = res["unstopped_units"]
    assert (entry["unit"], entry["container"]) == ("sglang.service", 129) and entry["error"].startswith(said), entry
    text = release.failure
    assert text.startswith(f"1 unit(s) could not be stopped ({said}"), text
    assert "its processes" not in text and "the GPUs are not proved free" in text, text
    assert "pct exec 129 -- systemctl stop sglang.service" in text and "driver" not in text, text


FROZEN = [
    # (case, /proc/<pid>/cgroup, {file under the cgroup root: text}, frozen)
    ("cgroup2, frozen by an ancestor", "0::/lxc/129/ns/system.slice/x.service\n",
     {"lxc/129/ns/system.slice/x.service/cgroup.events": "populated 1\nfrozen 1\n"}, True),
    ("cgroup2, thawed", "0::/lxc/129/ns\n", {"lxc/129/ns/cgroup.events": "populated 1\nfrozen 0\n"}, False),
    ("hybrid: cgroup2 under unified", "6:freezer:/lxc/129/ns\n0::/lxc/129/ns\n",
     {"unified/lxc/129/ns/cgroup.events": "frozen 1\n", "freezer/lxc/129/ns/freezer.state": "THAWED\n"}, True),
    ("v1 freezer, frozen", "6:freezer:/lxc/129/ns\n", {"freezer/lxc/129/ns/freezer.state": "FROZEN\n"}, True),
    ("v1 freezer, thawed", "6:freezer:/lxc/129/ns\n", {"freezer/lxc/129/ns/freezer.state": "THAWED\n"}, False),
    ("gone", None, {}, False),
]


@pytest.mark.parametrize("name, cgroup, files, frozen", FROZEN, ids=[c[0] for c in FROZEN])
def test_cgroup_frozen(tmp_path, name, cgroup, files, frozen):
    if cgroup is not None:
        (tmp_path / "proc" / "42").mkdir(parents=True)
        (tmp_path / "proc" / "42" / "cgroup").write_text(cgroup)
    for rel, text in files.items():
        path = tmp_path / "sys" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert _procs.cgroup_frozen(42, proc=str(tmp_path / "proc"), sys_cgroup=str(tmp_path / "sys")) is frozen


def test_quiet_since_is_when_the_last_target_went_and_the_watch_saw_no_holder():
    # gpu_wait_idle's settle window counts from it (quiet_since): the release watched the GPUs since then.
    host = FakeHost([proc(100, session=100), proc(101, ppid=100, session=100)], {101: [0, 1]})
    release, res = run(host, containers=[129])
    gone = [r["seconds"] for r in res["released"]]
    assert len(gone) == 2 and None not in gone
    quiet = res["quiet_since"]
    assert quiet["clock"] == pytest.approx(release.t0 + max(gone), abs=1e-3)
    assert quiet["clock"] < host.clock  # the watch went on after it
    assert quiet["boot_id"] == "boot-1" and quiet["gpus"] == list(range(8)) and quiet["device_holders"] == []


@pytest.mark.parametrize("arrives, quiet", [
    pytest.param(dict(proc(300, ct=130, start=5003), gpus_ctx=[2]), False,
                 id="a context of another container in the watch: no quiet time to hand over"),
    pytest.param(None, True, id="nothing new: quiet"),
])
def test_a_holder_seen_by_the_watch_leaves_no_quiet_time(arrives, quiet):
    host = FakeHost([proc(100, session=100)], {100: [0]})
    if arrives:
        host.events[2] = [arrives]
    _release_, res = run(host, containers=[129])
    assert (res["quiet_since"] is not None) is quiet


def test_check_mode_hands_over_no_quiet_time():
    host = FakeHost([proc(100, session=100)], {100: [0]})
    p = params(containers=[129])
    release = plan(host, p)
    assert release.problem == ""
    assert release.check_mode_result(False)["quiet_since"] is None and host.signalled == []


class InitHost(FakeHost):
    """A FakeHost whose containers have an init (``init`` {vmid: pid}): ``events_on_signal`` replaces it when a
    target is signalled - {vmid: new init pid (restarted) or None (stopped)}."""

    def __init__(self, procs, contexts, init, on_signal=None, **kw):
        super().__init__(procs, contexts, **kw)
        self.init = dict(init)
        self.on_signal = dict(on_signal or {})

    def pin(self, info):
        target, ok = super().pin(info)
        host, send = self, target.send

        def send_and_change(sig):
            for ct, new in host.on_signal.items():
                host.exit(host.init[ct])
                if new is not None:
                    host.procs[new] = proc(new, ct=ct, ct_pid=1, start=9000, name="systemd")
                host.init[ct] = new
            host.on_signal = {}
            return send(sig)
        target.send = send_and_change
        return target, ok


@pytest.mark.parametrize("new, failed, said", [
    ("same", False, None),
    (None, False, "CT 129 was stopped while the release ran (its init, pid 4012, is gone)"),
    (4700, True, "CT 129 was restarted while the release ran (its init, pid 4012, is gone; pid 4700 is its init now)"),
], ids=["unchanged", "stopped", "restarted"])
def test_a_container_stopped_or_restarted_during_the_release_is_named(new, failed, said):
    init = proc(4012, ct=129, ct_pid=1, name="systemd")
    host = InitHost([init, proc(101, ppid=4012)], {101: [0]}, {129: 4012},
                    on_signal={} if new == "same" else {129: new})
    release, res = run(host, containers=[129])
    assert [r["pid"] for r in res["released"]] == [101]
    changed = res["containers_changed"]
    if said is None:
        assert changed == [] and release.failure == "" and not release.warnings
        return
    (entry,) = changed
    assert entry["container"] == 129 and entry["init"] == {"pid": 4012, "start_time": 40120}
    assert entry["what"] == ("restarted" if failed else "stopped")
    assert (said in release.failure) is failed and (said in warnings_of(release)) is not failed


CONTAINER_INIT = [
    # (case, target's cgroup, its ancestors {pid: proc}, the payload cgroup's pids, the init found)
    ("a unit's process: up its ancestors", "/lxc/129/ns/system.slice/x.service",
     {50: proc(50, ppid=1, ct=129, ct_pid=1, name="systemd")}, {}, (50, 500)),
    ("pct exec's process: in the payload cgroup", "/lxc/129/ns",
     {60: proc(60, ct=None), 70: proc(70, ct=129, ct_pid=1, name="init")}, {"/lxc/129/ns": [70]}, (70, 700)),
    ("plain LXC's payload", "/lxc.payload.129/x",
     {60: proc(60, ct=None), 70: proc(70, ct=129, ct_pid=1)}, {"/lxc.payload.129": [70]}, (70, 700)),
    ("no init to be found", "/lxc/129/ns", {60: proc(60, ct=None)}, {}, None),
]


@pytest.mark.parametrize("name, cgroup, procs, payload, init", CONTAINER_INIT, ids=[c[0] for c in CONTAINER_INIT])
def test_container_init(name, cgroup, procs, payload, init):
    target = dict(proc(101, ppid=min(procs), ct=129), cgroup=cgroup)
    assert _release.container_init(target, procs.get, lambda path: payload.get(path, [])) == init
