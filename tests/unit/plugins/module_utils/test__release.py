# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The release sequence (_release.Release) with its I/O injected: a host written as a table.

A fake host is the one way to drive the sequence's branches (a newcomer that appears between two
looks, a recycled pid, a unit that fails to stop) deterministically; the functional tests run the
same sequence against real processes on the simulator.
"""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _release, _validate

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

    def ticks_per_s(self):
        return 100

    def sleep(self, s):
        self.clock += s

    def bins(self, name):
        return f"/usr/sbin/{name}"

    def run_command(self, argv, timeout, what):
        self.commands.append(argv)
        unit = argv[-1]
        for p in list(self.procs.values()):
            if p.get("unit") == unit:
                self.exit(p["pid"])
        return 0, "", ""


def params(**over):
    p = dict(gpus=None, containers=None, users=None, match=None, pids=None, exclude=None, tree=True, signal="SIGTERM",
             grace_period=1.0, escalate=True, kill_timeout=1.0, fail_on_survivors=True, stop_units=True, all=False,
             include_device_holders=True, protect=[], max_memory_used_mib=64)
    p.update(over)
    return p


def run(host, **over):
    p = params(**over)
    release = _release.Release(p, _validate.release(p), host)
    gpus = host.snapshot()
    before = [g for g in gpus if p["gpus"] is None or str(g["index"]) in p["gpus"]]
    problem = release.plan(gpus, before)
    assert problem == "", problem
    return release, release.run(SIGTERM, False)


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


def test_a_recycled_pid_is_never_signalled():
    host = FakeHost([proc(101)], {101: [0]})
    p = params(containers=[129])
    release = _release.Release(p, _validate.release(p), host)
    gpus = host.snapshot()
    assert release.plan(gpus, gpus) == ""
    host.procs[101] = proc(101, start=999)  # the pid now names another process
    res = release.run(SIGTERM, False)
    assert host.signalled == [] and "recycled" in res["skipped_processes"][-1]["reason"]


def test_check_mode_reports_the_targets_and_signals_nothing():
    host = FakeHost([proc(101, unit="vllm.service")], {101: [0]})
    p = params(containers=[129])
    release = _release.Release(p, _validate.release(p), host)
    gpus = host.snapshot()
    assert release.plan(gpus, gpus) == ""
    res = release.check_mode_result(True)
    assert [r["pid"] for r in res["released"]] == [101] and host.signalled == [] and host.commands == []
    assert "unit vllm.service in CT 129: stopped" in res["diff"]["after"]


@pytest.mark.parametrize("state, phrase", [("D", "stuck in the kernel"), ("S", "raise kill_timeout"),
                                           ("T", "raise kill_timeout")])
def test_survivors_are_described_by_their_state(state, phrase):
    msg = _release.survivor_message([dict(proc(101), state=state)], params(), SIGTERM)
    assert phrase in msg and ("reboot" in msg) is (state == "D")
