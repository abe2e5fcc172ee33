# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The scope gate (_scope.Scope) and the selection it drives (_release.choose), table-driven."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _release, _scope, _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._scope import DESCENDANT, HOLDER, NEWCOMER, ROOT, Scope


def proc(pid, name="python3", cmdline=None, user="root", uid=0, ct=None, ppid=1, gpus=(0,), evidence="context",
         ct_pid=5, unit=None, cgroup=None, ct_uid=None, **extra):
    out = {"pid": pid, "name": name, "cmdline": cmdline or name, "user": user, "uid": uid, "ppid": ppid,
           "start_time": pid * 10, "gpus": list(gpus), "evidence": evidence, "unit": unit,
           "container": dict({"kind": "lxc", "id": ct, "pid_in_container": ct_pid},
                             **({} if ct_uid is None else {"uid_in_container": ct_uid})) if ct else None,
           "cgroup": cgroup or (f"/lxc/{ct}/ns/user.slice" if ct else "/user.slice"), "session": pid, "tty_nr": 0,
           "ns_pid": ct_pid if ct else pid}
    out.update(extra)
    return out


def rx(pattern):
    return _validate.regex("match", pattern)


# (case, process, filters, scope options, phrase of the reason; '' = in the scope)
HOLDER_CASES = [
    ("a context on a selected GPU, no filter", proc(10), {}, {}, ""),
    ("a context on an unselected GPU only", proc(10, gpus=(7,)), {}, {}, "holds none of the selected GPUs"),
    ("in the named container", proc(10, ct=129), {"containers": [129]}, {}, ""),
    ("in another container", proc(10, ct=130), {"containers": [129]}, {}, "in CT 130, not in containers 129"),
    ("on the host, containers named", proc(10), {"containers": [129]}, {}, "not in a container"),
    ("user by name", proc(10, user="ml", uid=1000), {"users": ["ml"]}, {}, ""),
    ("user by uid", proc(10, user="ml", uid=1000), {"users": ["1000"]}, {}, ""),
    ("another user", proc(10, user="bob", uid=1001), {"users": ["ml"]}, {}, "user bob is not in users"),
    # In a container, its own names and uids (the container's passwd and idmap), never the node's (issue 29, item 8).
    ("a container's user by name", proc(10, user="alice", uid=101000, ct=129, ct_uid=1000), {"users": ["alice"]}, {}, ""),
    ("a container's user by its uid there", proc(10, user="alice", uid=101000, ct=129, ct_uid=1000), {"users": ["1000"]},
     {}, ""),
    ("a container's user by its node uid", proc(10, user="alice", uid=101000, ct=129, ct_uid=1000), {"users": ["101000"]},
     {}, "user alice (uid 1000 in CT 129, node uid 101000) is not in users"),
    ("a privileged container's uid that the node names otherwise", proc(10, user="alice", uid=1000, ct=129, ct_uid=1000),
     {"users": ["cloudsdk"]}, {}, "user alice (uid 1000 in CT 129, node uid 1000) is not in users"),
    ("match on the command line", proc(10, cmdline="python3 -m sglang.launch_server"), {"match": rx("sglang")}, {}, ""),
    ("match on vLLM's renamed worker's executable", proc(10, name="VLLM::EngineCore", cmdline="VLLM::EngineCore",
                                                         exe="/opt/vllm/bin/python3.12"), {"match": rx("vllm")}, {}, ""),
    ("match on the unit", proc(10, cmdline="python3 serve.py", unit="vllm.service"), {"match": rx("vllm")}, {}, ""),
    ("no match", proc(10, cmdline="python3 train.py"), {"match": rx("sglang")}, {}, "neither its command line"),
    ("in pids", proc(10), {"pids": {10, 11}}, {}, ""),
    ("not in pids", proc(12), {"pids": {10, 11}}, {}, "pid not in pids"),
    ("excluded", proc(10, cmdline="jupyter lab"), {"exclude": rx("jupyter")}, {}, "matches exclude"),
    ("host PID 1", proc(1), {}, {}, "protected: PID 1"),
    ("a container's init", proc(10, ct=129, ct_pid=1), {}, {}, "protected: the init (PID 1) of CT 129"),
    ("the module's ancestor", proc(10), {}, {"protected_pids": {10: "an ancestor of the module"}},
     "protected: an ancestor"),
    ("an NVIDIA daemon holding a device node", proc(10, name="nvidia-persistenced", evidence="device"), {}, {},
     "protected: NVIDIA daemon"),
    ("protect option", proc(10, cmdline="dcgm-exporter --x"), {}, {"protect": _validate.regexes("protect", ["dcgm"])}, "protected: protected by"),
    ("a device node, no context, list trusted", proc(10, evidence="device"), {}, {}, "lingering, not signalled"),
    ("a device node, no context, list untrusted", proc(10, evidence="device"), {}, {"untrusted": {0: "1024 MiB"}}, ""),
    ("a device node, no context, named in pids", proc(10, evidence="device"), {"pids": {10}}, {}, ""),
    ("control nodes only", proc(10, evidence="control"), {}, {}, "control nodes"),
    ("control nodes only, named", proc(10, evidence="control"), {"pids": {10}}, {}, ""),
    ("a driver pid not verified here", proc(10), {}, {"unverified": {10: "cannot be confirmed"}}, "cannot be confirmed"),
]


@pytest.mark.parametrize("name, p, filters, options, phrase", HOLDER_CASES, ids=[c[0] for c in HOLDER_CASES])
def test_holders(name, p, filters, options, phrase):
    scope = Scope({0, 1}, filters, **options)
    why = scope.judge(p, HOLDER)
    assert (phrase in why) if phrase else why == "", why


def test_match_sees_the_workload_root():
    scope = Scope({0}, {"match": rx("vllm")})
    worker = proc(11, name="VLLM::EngineCore", cmdline="VLLM::EngineCore")
    root = proc(10, cmdline="/usr/bin/python3 -m vllm.entrypoints.openai.api_server", evidence=None)
    assert scope.judge(worker, HOLDER) != ""
    assert scope.judge(worker, HOLDER, root=root) == ""


RELATION_CASES = [
    # (case, role, process, via is a target, holders below (pids; None: none), filters, phrase)
    ("a descendant of a target", DESCENDANT, proc(11, ppid=10, gpus=()), True, None, {}, ""),
    ("a descendant of nothing in the scope", DESCENDANT, proc(11, ppid=10, gpus=()), False, None, {}, "related to no target"),
    ("a descendant with a context on an unselected GPU only", DESCENDANT, proc(11, ppid=10, context_gpus=[7]), True,
     None, {}, "another job"),
    ("an excluded descendant", DESCENDANT, proc(11, cmdline="jupyter", ppid=10), True, None, {"exclude": rx("jupyter")},
     "matches exclude"),
    ("a descendant in another container", DESCENDANT, proc(11, ct=130), True, None, {"containers": [129]}, "in CT 130"),
    ("a root over targets only", ROOT, proc(9, gpus=()), True, [10], {}, ""),
    ("a launcher over a target and another job", ROOT, proc(9, gpus=()), True, [10, 12], {}, "also runs other GPU jobs"),
    ("a newcomer below a signalled target", NEWCOMER, proc(13, ppid=10), True, None, {}, ""),
    ("a newcomer below nothing signalled", NEWCOMER, proc(13, ppid=1), False, None, {}, "related to no target"),
    ("a newcomer that is a container's init", NEWCOMER, proc(13, ct=129, ct_pid=1), True, None, {}, "protected"),
]


@pytest.mark.parametrize("name, role, p, via_target, below, filters, phrase", RELATION_CASES,
                         ids=[c[0] for c in RELATION_CASES])
def test_relations(name, role, p, via_target, below, filters, phrase):
    scope = Scope({0}, filters)
    via = proc(10, ct=(p.get("container") or {}).get("id") if filters.get("containers") is None else 129)
    if via_target:
        assert scope.admit(via, HOLDER)
    holders_below = {(pid, pid * 10) for pid in below or ()}
    why = scope.judge(p, role, via=via, holders_below=holders_below)
    assert (phrase in why) if phrase else why == "", why


def test_a_process_is_a_target_or_skipped_never_both():
    scope = Scope({0}, {"pids": {10}})
    child = proc(11, ppid=10)
    scope.admit(child, HOLDER)                      # not in pids: skipped
    assert [s["pid"] for s in scope.skipped] == [11]
    assert scope.admit(proc(10), HOLDER)
    assert scope.admit(child, DESCENDANT, via=proc(10))   # the tree takes it: no longer skipped
    assert [t["pid"] for t in scope.targets] == [10, 11] and scope.skipped == []
    scope.refuse(child, "too late")                 # a target is never skipped afterwards
    assert scope.skipped == []


def test_at_the_signal_identity_place_and_protection_are_checked_again():
    scope = Scope({0})
    t = proc(10, ct=129)
    assert scope.admit(t, HOLDER)
    assert scope.still_in(t, dict(t)) == ""
    assert scope.still_in(t, None) == "gone"
    assert "recycled" in scope.still_in(t, dict(t, start_time=999))
    assert "another container" in scope.still_in(t, proc(10, ct=130))
    assert "protected" in scope.still_in(t, dict(t, container={"kind": "lxc", "id": 129, "pid_in_container": 1}))


# --- the selection: holders, workload roots, trees (_release.choose) -----------------------------------------
def launcher_host():
    """A launcher (9) in one cgroup with job A (10, GPU 0) and job B (12, GPU 7); A has a helper child (11)."""
    procs = {9: proc(9, gpus=(), ppid=1, evidence=None, name="launcher"),
             10: proc(10, ppid=9), 11: proc(11, ppid=10, gpus=(), evidence=None),
             12: proc(12, ppid=9, gpus=(7,))}
    children = {1: [9], 9: [10, 12], 10: [11]}
    contexts = {10: {0}, 12: {7}}
    holder_ids = {(10, 100), (12, 120)}
    return procs, children, contexts, holder_ids


ROOT_CASES = [
    # (case, selected GPUs, filters, candidates, targets expected)
    ("pids [A] on GPU 0: the launcher also runs B, so it stays, and B with it", {0}, {"pids": {10}}, [10], [10, 11]),
    ("GPU 0 and 7, both jobs: the launcher is the root of targets only", {0, 7}, {}, [10, 12], [9, 10, 11, 12]),
    ("GPU 0 only, no filter: B holds GPU 7 only", {0}, {}, [10], [10, 11]),
]


@pytest.mark.parametrize("name, selected, filters, cands, expected", ROOT_CASES, ids=[c[0] for c in ROOT_CASES])
def test_workload_roots_never_widen_the_scope(name, selected, filters, cands, expected):
    procs, children, contexts, holder_ids = launcher_host()
    scope = Scope(selected, filters)
    _release.choose(scope, [procs[c] for c in cands], contexts, holder_ids, True, procs.get, children)
    assert [t["pid"] for t in scope.targets] == expected
    targets = {t["pid"] for t in scope.targets}
    assert not targets & {s["pid"] for s in scope.skipped}
    if 9 not in expected and len(cands) == 1:
        assert 12 not in targets


def test_the_tree_takes_descendants_of_targets_but_not_excluded_or_protected_ones():
    api = proc(100, cmdline="python3 -m vllm.entrypoints.api_server", ct=129, evidence=None, gpus=())
    procs = {100: api, 101: proc(101, cmdline="vllm worker 0", ct=129, ppid=100),
             102: proc(102, cmdline="vllm worker 1", ct=129, ppid=100),
             103: proc(103, cmdline="jupyter kernel", ct=129, ppid=100, gpus=(), evidence=None),
             104: proc(104, name="nvidia-smi", ppid=101, ct=129, gpus=(), evidence=None),
             300: proc(300, ct=130)}
    children = {100: [101, 102, 103], 101: [104]}
    scope = Scope({0}, {"containers": [129], "exclude": _validate.regex("exclude", "jupyter")})
    _release.choose(scope, [procs[101], procs[102], procs[300]], {101: {0}, 102: {0}, 300: {0}},
                    {(101, 1010), (102, 1020), (300, 3000)}, True, procs.get, children)
    # 100 is not a root: 103 below it is no GPU holder, so every holder below it is a target; it joins.
    assert [t["pid"] for t in scope.targets] == [100, 101, 102]
    assert {p["pid"]: p["reason"] for p in scope.protected} == {104: "NVIDIA daemon (nvidia-smi)"}
    assert [(s["pid"], s["reason"].split(",")[0]) for s in scope.skipped] == [
        (103, "command line matches exclude 'jupyter'"), (300, "in CT 130")]


def test_the_regexes_see_the_raw_command_line_and_reports_keep_the_redacted_one():
    raw = {100: "vllm serve --api-key sk-tenant-a-0123456789", 101: "vllm serve --api-key sk-tenant-b-0123456789",
           102: "vllm serve --api-key sk-tenant-c-0123456789"}
    shown = [proc(pid, cmdline="vllm serve --api-key ****") for pid in (100, 101, 102)]
    filters = {"match": _validate.regex("match", "tenant-[ab]"), "exclude": _validate.regex("exclude", "tenant-b")}
    scope = Scope({0}, filters, protect=_validate.regexes("protect", ["tenant-c"]), text_of=lambda p: raw[p["pid"]])
    _release.choose(scope, shown, {}, set(), False)
    assert [t["pid"] for t in scope.targets] == [100]
    assert [s["pid"] for s in scope.skipped] == [101] and "matches exclude" in scope.skipped[0]["reason"]
    assert [p["pid"] for p in scope.protected] == [102]
    assert all(t["cmdline"] == "vllm serve --api-key ****" for t in scope.targets + scope.skipped + scope.protected)


def test_unverified_pids_only_outside_the_host_namespace():
    gpus = [{"index": 0, "minor_number": 0, "processes": [{"pid": 10, "visible": True}, {"pid": 11, "visible": True}],
             "holders": [{"pid": 10, "evidence": "context"}]}]
    assert _release.unverified(gpus, True) == {}
    out = _release.unverified(gpus, False)
    assert list(out) == [11] and "/dev/nvidia0" in out[11] and out[11].endswith("on the host (the Proxmox node) to release it")


def test_a_unit_running_another_gpu_job_is_not_stopped():
    scope = Scope({0})
    a = proc(10, unit="jobs.service", ct=129)
    scope.admit(a, HOLDER)
    entry = {"unit": "jobs.service", "container": 129, "pids": [10]}
    assert _release.unit_problem(entry, [a], scope) == ""
    b = proc(12, unit="jobs.service", ct=129, gpus=(7,))
    assert "outside the scope (pid 12)" in _release.unit_problem(entry, [a, b], scope)


def test_identity_is_pid_and_start_time():
    assert _scope.identity(proc(10)) == (10, 100)


# --- MPS: the server carries its clients' contexts; the control daemon is never a workload's root ----------
def mps_host():
    """The control daemon (40, a session leader) started the server (50, GPUs 0 and 1); clients 60 (GPU 0) and
    70 (GPU 1) connect to it; all in one cgroup."""
    server_of = {"gpus": [0, 1], "clients": [{"pid": 60, "start_time": 600, "gpus": [0], "visible": True},
                                             {"pid": 70, "start_time": 700, "gpus": [1], "visible": True}]}
    procs = {40: proc(40, name="nvidia-cuda-mps", cmdline="nvidia-cuda-mps-control -d", gpus=(), evidence=None),
             50: proc(50, name="nvidia-cuda-mps", cmdline="nvidia-cuda-mps-server", ppid=40, gpus=(0, 1),
                      mps_server=server_of, session=40),
             60: proc(60, gpus=(0,)), 70: proc(70, gpus=(1,))}
    children = {40: [50]}
    contexts = {50: {0, 1}, 60: {0}, 70: {1}}
    return procs, children, contexts, {(50, 500), (60, 600), (70, 700)}


MPS_CASES = [
    # (case, selected, filters, candidates, targets, why the server stays: '' = it is a target)
    ("GPU 0: the server also carries 70 on GPU 1", {0}, {}, [50, 60], [60], "pid 70 on GPU 1 (on the node, not selected)"),
    ("GPU 0, the server named in pids", {0}, {"pids": {50, 60}}, [50, 60], [60], "pid 70 on GPU 1 (on the node, not selected)"),
    ("GPUs 0 and 1, every client released", {0, 1}, {}, [50, 60, 70], [50, 60, 70], ""),
    ("GPUs 0 and 1, match takes 60 only", {0, 1}, {"match": rx("^python3$|nvidia-cuda-mps-server")}, [50, 60], [60],
     "pid 70 on GPU 1 (on the node, outside the scope of this release)"),
]


@pytest.mark.parametrize("name, selected, filters, cands, expected, kept", MPS_CASES, ids=[c[0] for c in MPS_CASES])
def test_an_mps_server_goes_only_with_every_client_it_carries(name, selected, filters, cands, expected, kept):
    procs, children, contexts, holder_ids = mps_host()
    scope = Scope(selected, filters)
    # The server first, as the driver lists it (lower pid): the gate judges it after its clients all the same.
    _release.choose(scope, [procs[c] for c in cands], contexts, holder_ids, True, procs.get, children)
    assert [t["pid"] for t in scope.targets] == expected
    assert 40 not in {t["pid"] for t in scope.targets}   # the control daemon is never the root of a workload
    skipped = {s["pid"]: s["reason"] for s in scope.skipped}
    if kept:
        assert skipped[50].startswith("an MPS server") and kept in skipped[50], skipped
    else:
        assert 50 not in skipped


def test_the_mps_control_daemon_is_protected_and_a_server_read_from_proc_is_still_known():
    procs, _children, _contexts, _ids = mps_host()
    scope = Scope({0}, mps={(50, 500): procs[50]["mps_server"]})
    assert scope.protection(procs[40]) == "NVIDIA daemon (nvidia-cuda-mps-control)"
    target = dict(procs[60])
    assert scope.admit(target, HOLDER)
    from_proc = {k: v for k, v in procs[50].items() if k != "mps_server"}  # as /proc gives it: no driver entry
    assert "an MPS server" in scope.judge(from_proc, DESCENDANT, via=target)
