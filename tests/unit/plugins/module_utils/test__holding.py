# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The holding model, table-driven: evidence x driver-list completeness x selection."""

from __future__ import annotations
import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils._holding import (
    CONTEXT,
    CONTROL,
    DEVICE,
    evidence_on,
    is_mps_server,
    list_incomplete,
    mps_server_problem,
    mps_servers,
    node_of,
    placement,
    release_candidates,
    stop_advice,
    verdict,
)


@pytest.mark.parametrize("path, node", [
    ("/dev/nvidia0", ("gpu", 0)), ("/dev/nvidia17", ("gpu", 17)), ("/tmp/gpusim-x/dev/nvidia3", ("gpu", 3)),
    ("/dev/nvidiactl", ("control", None)), ("/dev/nvidia-uvm", ("control", None)),
    ("/dev/nvidia-uvm-tools", ("control", None)), ("/dev/nvidia-modeset", ("control", None)),
    ("/dev/nvidia-caps/nvidia-cap1", ("control", None)),
])
def test_node_of(path, node):
    assert node_of(path) == node


@pytest.mark.parametrize("files, minors, expected", [
    (["/dev/nvidia0", "/dev/nvidiactl"], {0: 0, 1: 1}, {"gpus": [0], "unplaced": False}),
    ([f"/dev/nvidia{i}" for i in range(8)], {i: i for i in range(8)}, {"gpus": list(range(8)), "unplaced": False}),
    (["/dev/nvidiactl", "/dev/nvidia-uvm"], {0: 0}, {"gpus": [], "unplaced": False}),
    (["/dev/nvidia1"], None, {"gpus": [], "unplaced": True}),       # no minor numbers: cannot place
    (["/dev/nvidia9"], {0: 0, 1: 1}, {"gpus": [], "unplaced": True}),  # a minor no GPU has
    (["/dev/nvidia4"], {4: 0}, {"gpus": [0], "unplaced": False}),   # minor numbers need not be indexes
])
def test_placement(files, minors, expected):
    assert placement(files, minors) == expected


@pytest.mark.parametrize("gpu, pid, contexts, placed, evidence", [
    (0, 7, {7}, {"gpus": [0], "unplaced": False}, CONTEXT),
    (0, 7, set(), {"gpus": [0, 1], "unplaced": False}, DEVICE),
    (2, 7, set(), {"gpus": [0, 1], "unplaced": False}, CONTROL),
    (2, 7, set(), {"gpus": [], "unplaced": True}, DEVICE),
    (2, 7, set(), {"gpus": [], "unplaced": False}, CONTROL),
])
def test_evidence_on(gpu, pid, contexts, placed, evidence):
    assert evidence_on(gpu, pid, contexts, placed) == evidence


def gpu(index=0, used=0, procs=(), holders=(), error=None, health="ok"):
    return {"index": index, "health": {"status": health, "detail": "x"}, "memory": {"used": used},
            "utilization": {"gpu": 0}, "processes_error": error,
            "processes": [{"pid": pid, "name": "python3", "used_mib": mib, "visible": True} for pid, mib in procs],
            "holders": [{"pid": pid, "name": "python3", "files": [f"/dev/nvidia{index}"], "protected": prot,
                         "evidence": ev} for pid, ev, prot in holders]}


# (name, gpu, idle, blockers, lingering)
VERDICT_CASES = [
    ("nothing", gpu(), True, [], []),
    ("a context", gpu(used=4096, procs=[(10, 4096)]), False, [10], []),
    ("context without memory figure", gpu(used=4096, procs=[(10, None)]), False, [10], []),
    ("device holder, list complete, memory at baseline", gpu(holders=[(11, DEVICE, None)]), True, [], [11]),
    ("device holder, list complete, memory of the listed context",
     gpu(used=4096, procs=[(10, 4096)], holders=[(11, DEVICE, None)]), False, [10], [11]),
    ("device holder, memory beyond the listed contexts", gpu(used=8192, procs=[(10, 4096)], holders=[(11, DEVICE, None)]),
     False, [10, 11], []),
    ("device holder, memory and no context", gpu(used=2048, holders=[(11, DEVICE, None)]), False, [11], []),
    ("device holder, list unreadable", gpu(error="processes could not be read: Unknown Error, 3 tries",
                                           holders=[(11, DEVICE, None)]), False, [11], []),
    ("protected device holder, list unreadable", gpu(error="processes could not be read: x",
                                                     holders=[(11, DEVICE, "NVIDIA daemon")]), False, [], []),
    ("control holder, memory in use", gpu(used=2048, holders=[(12, CONTROL, None)]), False, [], []),
    ("control holder, list unreadable", gpu(error="processes could not be read: x", holders=[(12, CONTROL, None)]),
     False, [], []),
    ("control holder only", gpu(holders=[(12, CONTROL, None)]), True, [], []),
    ("lost GPU", gpu(health="lost"), False, [], []),
]


@pytest.mark.parametrize("name, g, idle, blockers, lingering", VERDICT_CASES, ids=[c[0] for c in VERDICT_CASES])
def test_verdict(name, g, idle, blockers, lingering):
    got_idle, reasons, got_blockers, got_lingering = verdict(g, 64)
    assert got_idle is idle, reasons
    assert bool(reasons) is (not idle)
    assert sorted(b["pid"] for b in got_blockers) == blockers
    assert sorted(h["pid"] for h in got_lingering) == lingering


def test_verdict_without_device_holders_ignores_them():
    g = gpu(used=2048, holders=[(11, DEVICE, None)])
    idle, _reasons, blockers, lingering = verdict(g, 64, include_device_holders=False)
    assert not idle and blockers == [] and lingering == []


@pytest.mark.parametrize("g, why", [
    (gpu(), ""),
    (gpu(used=64, procs=[]), ""),
    (gpu(used=4096, procs=[(10, 4096)]), ""),
    (gpu(used=4200, procs=[(10, 4096)]), "104 MiB in use that the listed processes do not account for"),
    (gpu(error="processes could not be read: x"), "processes could not be read: x"),
    (gpu(used=None), ""),
])
def test_list_incomplete(g, why):
    assert list_incomplete(g, 64) == why


# A host with three GPUs. Job A: context on GPU 2, holds every node (as CUDA does). Job B:
# context on GPU 0, holds nodes 0 and 1. pid 40: holds node 1, no context anywhere. pid 50: control
# nodes only (a monitor). pid 60: context on GPU 0 but not visible from here.
def host():
    every = [(30, DEVICE, None), (50, CONTROL, None)]
    g0 = gpu(0, used=8192, procs=[(20, 4096), (60, 4096)], holders=[(30, DEVICE, None), (50, CONTROL, None)])
    g0["processes"][1]["visible"] = False
    g1 = gpu(1, used=0, holders=[(20, DEVICE, None), (40, DEVICE, None)] + every)
    g2 = gpu(2, used=4096, procs=[(30, 4096)], holders=[(20, DEVICE, None), (50, CONTROL, None)])
    g2["holders"].insert(0, {"pid": 30, "name": "python3", "files": ["/dev/nvidia2"], "protected": None, "evidence": CONTEXT})
    return [g0, g1, g2]


# (name, selected GPUs, include_device_holders, pids, targets {pid: evidence}, skipped pids)
RELEASE_CASES = [
    ("all GPUs", {0, 1, 2}, True, (), {20: CONTEXT, 30: CONTEXT, 40: DEVICE}, [50, 60]),
    ("GPU 0: job A spared (its context is on GPU 2)", {0}, True, (), {20: CONTEXT}, [30, 50, 60]),
    ("GPU 1: job B spared (context on 0), job A spared (context on 2), pid 40 taken", {1}, True, (),
     {40: DEVICE}, [20, 30, 50]),
    ("GPUs 0 and 1", {0, 1}, True, (), {20: CONTEXT, 40: DEVICE}, [30, 50, 60]),
    ("GPU 2", {2}, True, (), {30: CONTEXT}, [20, 50]),
    ("device holders not wanted", {0, 1, 2}, False, (), {20: CONTEXT, 30: CONTEXT}, [60]),
    ("the monitor named in pids", {0, 1, 2}, True, (50,), {20: CONTEXT, 30: CONTEXT, 40: DEVICE, 50: CONTROL}, [60]),
    ("the monitor named, one GPU", {1}, True, (50,), {40: DEVICE, 50: CONTROL}, [20, 30]),
]


@pytest.mark.parametrize("name, selected, devices, pids, targets, skipped", RELEASE_CASES, ids=[c[0] for c in RELEASE_CASES])
def test_release_candidates(name, selected, devices, pids, targets, skipped):
    found, left = release_candidates(host(), selected, devices, pids)
    assert {c["pid"]: c["evidence"] for c in found} == targets
    assert sorted(s["pid"] for s in left) == skipped
    for c in found:
        assert set(c["gpus"]) <= selected
        if c["evidence"] == CONTROL:
            assert "named in pids" in c["why"]
    reasons = {s["pid"]: s["reason"] for s in left}
    if 30 in reasons and 30 not in targets:
        assert "only on GPU(s) 2" in reasons[30]
    if 50 in reasons:
        assert "Name it in pids" in reasons[50]
    if 60 in reasons:
        assert "does not exist from this PID namespace" in reasons[60]


# --- the workload's root ------------------------------------------------------------------

def proc_table(*rows):
    """rows: (pid, ppid, name, cgroup, session, tty_nr, ns_pid)"""
    return {r[0]: {"pid": r[0], "ppid": r[1], "name": r[2], "cgroup": r[3], "session": r[4], "tty_nr": r[5],
                   "ns_pid": r[6]} for r in rows}


SCOPE = "/user.slice/user-0.slice/session-4.scope"
UNIT = "/lxc/129/ns/system.slice/sglang.service"
# (name, table, holder pid, protected pids, expected ancestors)
WALK_CASES = [
    ("hand-started in a login shell: API joins, the shell does not",
     proc_table((1, 0, "systemd", "/init.scope", 1, 0, 1), (100, 1, "bash", SCOPE, 100, 34816, 100),
                (200, 100, "python3", SCOPE, 100, 34816, 200), (300, 200, "python3", SCOPE, 100, 34816, 300)),
     300, (), [200]),
    ("daemonized with setsid: the session leader is the root and joins",
     proc_table((1, 0, "systemd", "/init.scope", 1, 0, 1), (50, 1, "gpusim-driver", SCOPE, 50, 0, 50),
                (200, 50, "python3", SCOPE, 200, 0, 200), (300, 200, "python3", SCOPE, 200, 0, 300)),
     300, (), [200]),
    ("a systemd unit in a container: stops at the container's init (PID 1 of its namespace)",
     proc_table((7000, 1, "lxc-start", "/lxc.monitor/129", 7000, 0, 7000),
                (7001, 7000, "systemd", "/lxc/129/ns/init.scope", 7001, 0, 1),
                (7100, 7001, "python3", UNIT, 7100, 0, 80), (7200, 7100, "python3", UNIT, 7100, 0, 81)),
     7200, (), [7100]),
    ("another cgroup above: stop", proc_table((100, 1, "python3", "/a", 100, 0, 100), (200, 100, "python3", "/b", 100, 0, 200)),
     200, (), []),
    ("a supervisor above: stop", proc_table((100, 1, "supervisord", SCOPE, 100, 0, 100),
                                            (200, 100, "python3", SCOPE, 100, 0, 200)), 200, (), []),
    ("the module's ancestor above: stop", proc_table((100, 1, "python3", SCOPE, 100, 0, 100),
                                                     (200, 100, "python3", SCOPE, 100, 0, 200)), 200, (100,), []),
    ("parent gone", proc_table((200, 999, "python3", SCOPE, 200, 0, 200)), 200, (), []),
]


@pytest.mark.parametrize("name, table, holder, stop, expected", WALK_CASES, ids=[c[0] for c in WALK_CASES])
def test_workload_ancestors(name, table, holder, stop, expected):
    from ansible_collections.gpuops.gpu.plugins.module_utils._holding import workload_ancestors

    got = workload_ancestors(table[holder], table.get, lambda p: "protected" if p["pid"] in stop else "")
    assert [a["pid"] for a, _why in got] == expected
    for _a, why in got:
        assert "same cgroup" in why


@pytest.mark.parametrize("pattern, ok", [
    ("/dev/nvidia*", True), ("/dev/nvidia3", True), ("/dev/nvidia[0-3]", True), ("/tmp/gpusim-x/dev/nvidia*", True),
    ("/dev/nvidia-caps/*", True), ("/dev/nvidiactl", True),
    ("/dev/null*", False), ("/dev/*", False), ("/dev/pts/*", False), ("dev/nvidia*", False), ("/dev/*/nvidia0", False),
    ("/dev/../dev/nvidia*", False), ("/*", False), ("/dev/", False), ("/dev/nv*", False),
])
def test_device_pattern_problem(pattern, ok):
    from ansible_collections.gpuops.gpu.plugins.module_utils._holding import device_pattern_problem

    assert (device_pattern_problem(pattern) == "") is ok


@pytest.mark.parametrize("in_container, phrase", [
    (False, "no process holds it: the driver is still freeing the memory of exited processes, or a context leaked"
            " (nvidia-smi -r -i 3 resets it once nothing holds it)"),
    (True, "not visible from this PID namespace (another container or the host)"),
    (None, "not visible from this PID namespace"),
])
def test_memory_without_a_process_says_what_is_true_where_the_module_runs(in_container, phrase):
    idle, reasons, _blockers, _lingering = verdict(gpu(index=3, used=1200), 64, in_container=in_container)
    assert not idle and len(reasons) == 1 and phrase in reasons[0] and reasons[0].startswith("1200 MiB used")


@pytest.mark.parametrize("name, g, contexts, blockers, lingering", [
    ("a CUDA job listed on GPU 7 only, unaccounted memory on GPU 2: the memory, not the job",
     gpu(index=2, used=1200, holders=[(11, DEVICE, None)]), {11: {7}}, [], [11]),
    ("listed on GPU 2 too (more memory than its context): a blocker",
     gpu(index=2, used=2400, procs=[(11, 1200)], holders=[(12, DEVICE, None)]), {11: {2}, 12: {2, 7}}, [11, 12], []),
    ("listed nowhere: the device holder may be the memory's owner",
     gpu(index=2, used=1200, holders=[(11, DEVICE, None)]), {}, [11], []),
    ("this GPU's list unreadable: it may have a context here", gpu(index=2, used=1200, holders=[(11, DEVICE, None)],
                                                                   error="Unknown Error"), {11: {7}}, [11], []),
])
def test_verdict_device_holder_listed_elsewhere(name, g, contexts, blockers, lingering):
    idle, reasons, got_blockers, got_lingering = verdict(g, 64, in_container=False, contexts=contexts)
    assert not idle
    assert ([b["pid"] for b in got_blockers], [h["pid"] for h in got_lingering]) == (blockers, lingering), name
    if not blockers:
        assert any("no process holds it" in r for r in reasons), reasons


# --- MPS -----------------------------------------------------------------------------------------

def _p(pid, name, cmdline, kind="compute", visible=True):
    return {"pid": pid, "name": name, "cmdline": cmdline, "type": kind, "start_time": pid * 10, "visible": visible}


SERVER = _p(50, "nvidia-cuda-mps", "nvidia-cuda-mps-server")
CLIENT_A = _p(60, "python3", "python3 a.py", "compute+mps")
CLIENT_B = _p(70, "python3", "python3 b.py", "compute+mps")


@pytest.mark.parametrize("proc, server", [
    (SERVER, True),
    (_p(1, "nvidia-cuda-mps", "/usr/bin/nvidia-cuda-mps-server"), True),
    (_p(1, "nvidia-cuda-mps", None), True),                       # cmdline not known: comm, on a context holder
    (_p(1, "nvidia-cuda-mps", "nvidia-cuda-mps-control -d"), False),
    (_p(1, "python3", "python3 nvidia-cuda-mps-server"), False),  # an argument, not argv[0]
    (_p(1, "nvidia-cuda-mps", "nvidia-cuda-mps-server", "compute+mps"), False),  # an MPS client is a client
    (CLIENT_A, False),
])
def test_is_mps_server(proc, server):
    assert is_mps_server(proc) is server


def test_mps_servers_carry_the_clients_listed_on_the_gpus_they_serve():
    in_130 = {"kind": "lxc", "id": 130, "pid_in_container": 7}
    gpus = [{"index": 0, "processes": [SERVER, CLIENT_A]}, {"index": 1, "processes": [SERVER, dict(CLIENT_B, container=in_130)]},
            {"index": 2, "processes": [_p(80, "python3", "python3 c.py", "compute+mps")]}]
    assert mps_servers(gpus) == {50: {"gpus": [0, 1], "container": None, "clients": [
        {"pid": 60, "start_time": 600, "gpus": [0], "visible": True, "container": None},
        {"pid": 70, "start_time": 700, "gpus": [1], "visible": True, "container": in_130}]}}


def _server(*clients, gpus=(0, 1)):
    """An mps_servers() entry: clients (pid, GPUs, visible[, the CT it lives in])."""
    return {"gpus": list(gpus), "container": None, "clients": [
        {"pid": c[0], "start_time": c[0] * 10, "gpus": list(c[1]), "visible": c[2],
         "container": {"kind": "lxc", "id": c[3]} if len(c) > 3 else None} for c in clients]}


@pytest.mark.parametrize("server, selected, targets, kept_for", [
    # A client on a GPU that is not selected: the server stays.
    (_server((60, [0], True), (70, [1], True)), {0}, {60}, ["pid 70 on GPU 1 (on the node, not selected)"]),
    # Another container's client: named with its container.
    (_server((60, [0], True, 129), (70, [1], True, 130)), {0}, {60}, ["pid 70 on GPU 1 (in CT 130, not selected)"]),
    # A client on a selected GPU that the scope does not take (another container, a filter).
    (_server((60, [0], True), (61, [0], True)), {0}, {60}, ["pid 61 on GPU 0 (on the node, outside the scope of this"
                                                            " release)"]),
    # A client this PID namespace cannot see.
    (_server((60, [0], None), (62, [0], False)), {0}, {60}, ["pid 62 on GPU 0 (not visible from here)"]),
    # Every client is a target: it may go with them.
    (_server((60, [0], True), (70, [1], True)), {0, 1}, {60, 70}, []),
    # No client listed, and it serves a GPU outside the release: clients there may not be listed.
    (_server(), {0}, set(), ["also serves GPU 1, not selected, and no MPS client is listed"]),
    # No client listed, every GPU it serves is released.
    (_server(), {0, 1}, set(), []),
])
def test_mps_server_problem(server, selected, targets, kept_for):
    reason = mps_server_problem(server, selected, lambda key: key[0] in targets and key[1] == key[0] * 10)
    if not kept_for:
        assert reason == ""
        return
    for text in kept_for:
        assert text in reason, reason
    assert "echo quit | nvidia-cuda-mps-control" in reason and "exits by itself" in reason
    assert "when all its clients are done" in reason and "kill" not in reason.replace("Never kill the server", "")


def test_a_busy_reason_names_the_mps_server_and_its_clients():
    server = dict(SERVER, used_mib=28, mps_server=_server((70, [1], True)))
    _idle, reasons, blockers, _l = verdict({"index": 0, "processes": [server], "memory": {"used": 28}}, 64)
    assert [b["pid"] for b in blockers] == [50]
    assert "an MPS server (nvidia-cuda-mps-server) on GPUs 0, 1: it carries client pid 70 on GPU 1 (on the node)" \
        in reasons[0]
    assert "echo quit | nvidia-cuda-mps-control" in reasons[0]


@pytest.mark.parametrize("proc, advice, never", [
    # An MPS server carrying another container's client: its clients, and the control daemon's way; never a kill.
    (dict(SERVER, mps_server=_server((70, [1], True, 130))),
     ["pid 70 on GPU 1 (in CT 130)", "when all its clients are done", "`echo quit | nvidia-cuda-mps-control` on the node"],
     "`kill"),
    # ... one that runs in a container: the control daemon's way there.
    (dict(SERVER, container={"kind": "lxc", "id": 129},
          mps_server=dict(_server((70, [1], True, 130)), container={"kind": "lxc", "id": 129})),
     ["`pct exec 129 -- sh -c 'echo quit | nvidia-cuda-mps-control'`"], "`kill"),
    # A process in a container: inside it, by its pid there.
    (dict(CLIENT_A, container={"kind": "lxc", "id": 130, "pid_in_container": 7}), ["`pct exec 130 -- kill 7`"], "node"),
    # A process on the node itself: on the node, never "fence its container".
    (CLIENT_A, ["runs on the node itself, in no container", "`kill 60`"], "fence"),
    (dict(CLIENT_A, unit="train.service"), ["`systemctl stop train.service`"], "fence"),
])
def test_stop_advice_fits_the_holder(proc, advice, never):
    text = stop_advice(proc)
    for part in advice:
        assert part in text, text
    assert never not in text, text
