# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fence (_fence.Fence) against a fake node.

A fake, because a unit test has no Proxmox VE node: the node's ``pct`` answers from a table (outputs in
pve-container's formats, as tests/gpusim's pct prints them), the GPUs are a list and the release is a
recorder. The real pct shim, containers and release run in tests/functional/test_proxmox_gpu_containers.py.
"""

from __future__ import annotations

import threading

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _fence

LIST = """VMID       Status     Lock         Name
129        running                 gpu-a
130        running                 gpu-b
131        stopped                 gpu-c
132        running                 plain
"""
CONFIGS = {
    129: "hostname: gpu-a\ndev0: /dev/nvidia7\ndev1: /dev/nvidia6\n",
    130: "hostname: gpu-b\nlxc.cgroup2.devices.allow: c 195:5 rwm\n"
         "lxc.mount.entry: /dev/nvidia5 dev/nvidia5 none bind,optional,create=file\n",
    131: "hostname: gpu-c\ndev0: /dev/nvidia4\n",
    132: "hostname: plain\n",
}
# GPU i has minor 7 - i
GPUS = [{"index": i, "uuid": f"GPU-{i}", "minor_number": 7 - i} for i in range(8)]


class FakeNode:
    def __init__(self, frozen=(), active=(), stop_rc=0, release_failure=None, gpus=GPUS):
        self.calls = []
        self.lock = threading.Lock()
        self.frozen = set(frozen)
        self.active = set(active)         # (vmid, unit) that systemctl says are active
        self.stop_rc = stop_rc
        self.release_failure = release_failure
        self._gpus = gpus
        self.released = []
        self.locked = []                  # the vmids of each take_locks call
        self.warnings = []
        self.t = 0.0

    def take_locks(self, vmids):
        self.locked.append(list(vmids))

    def now(self):
        return self.t

    def warn(self, msg):
        self.warnings.append(msg)

    def pct(self, argv, timeout, what):
        with self.lock:
            self.calls.append(tuple(argv))
        if argv[0] == "list":
            return 0, LIST, ""
        vmid = int(argv[1])
        if argv[0] == "config":
            return 0, CONFIGS[vmid], ""
        if argv[0] == "exec":
            if vmid in self.frozen:
                self.t += timeout
                raise _errors.QueryTimeout(what)
            unit = argv[-1]
            if argv[-2] == "is-active":
                return (0, "active\n", "") if (vmid, unit) in self.active else (3, "inactive\n", "")
            return self.stop_rc, "", "Failed to stop unit" if self.stop_rc else ""
        if argv[0] == "shutdown":
            return 0, "", ""
        raise AssertionError(argv)

    def gpus(self):
        return self._gpus

    def release(self, vmids, draining=(), gpus=None):
        self.released.append(list(vmids))
        self.draining = list(draining)
        self.release_gpus = gpus
        if self.release_failure:
            return {"released": []}, self.release_failure
        return {"changed": True, "released": [{"pid": 4242}]}, None


def fence(node, check_mode=False, diff=False, **params):
    p = dict(containers=[], units=[], state="present", force=False, include_stopped=False, shutdown_timeout=60,
             pct_timeout=30.0, stop_timeout=65.0)
    p.update(params)
    return _fence.Fence(p, node, check_mode=check_mode, diff=diff)


@pytest.mark.parametrize("params, containers, running, gpus, configs_read", [
    # Only running containers' configs are read (twice: --current and with the pending changes)
    ({}, [129, 130], [129, 130], [0, 1, 2], {129, 130, 132}),
    # include_stopped: the stopped one's config too (once)
    ({"include_stopped": True}, [129, 130, 131], [129, 130], [0, 1, 2], {129, 130, 131, 132}),
    # Named: whatever their status; none running - the GPUs of their configs
    ({"containers": [131]}, [131], [], [3], {131}),
    ({"containers": [130, 131]}, [130, 131], [130], [2], {130, 131}),
    ({"containers": [132]}, [132], [132], [], {132}),
])
def test_discovery(params, containers, running, gpus, configs_read):
    node = FakeNode()
    res = fence(node, **params).run()
    assert [c["vmid"] for c in res["containers"]] == containers
    assert res["running"] == running and res["gpus"] == gpus
    assert {int(c[1]) for c in node.calls if c[0] == "config"} == configs_read
    current = [int(c[1]) for c in node.calls if c[0] == "config" and "--current" in c]
    # A named container's two configs are read beside pct list, before its status is known; the stopped one's
    # --current is then not used.
    named = set(params.get("containers") or ())
    assert sorted(current) == sorted(v for v in configs_read if v != 131 or v in named)
    assert res["skipped_containers"] == [{"vmid": 131, "reason": "stopped"}] * (131 in containers)
    assert not res["changed"] and "release" not in res and node.released == []


def test_an_unknown_container_fails_before_anything_runs():
    node = FakeNode(active={(129, "sglang")})
    with pytest.raises(_fence.FenceFailed) as exc:
        fence(node, containers=[129, 999], units=["sglang"], state="released").run()
    assert exc.value.kind == "no_such_container"
    assert "no container 999 on this node (pct list shows 129, 130, 131, 132)" in exc.value.msg
    # Only reads ran (pct list, and the named containers' configs beside it): nothing was stopped or released.
    assert ("list",) in node.calls and {c[0] for c in node.calls} == {"list", "config"} and node.released == []


@pytest.mark.parametrize("state, check_mode, released, shut_down, stops", [
    ("released", False, [[129, 130]], [], 1),
    ("released", True, [[129, 130]], [], 0),      # check mode: the release reports what it would do
    ("present", False, [], [], 1),
    ("shutdown", False, [], [129, 130], 1),
    ("shutdown", True, [], [129, 130], 0),
])
def test_states(state, check_mode, released, shut_down, stops):
    node = FakeNode(active={(129, "sglang")})
    res = fence(node, check_mode=check_mode, containers=[129, 130], units=["sglang"], state=state).run()
    assert node.released == released
    assert node.locked == ([] if check_mode else [[129, 130]])  # the release locks: before anything is stopped
    if released:
        # The release selects the GPUs it fences (the containers' union), not every GPU of the node.
        assert node.release_gpus == res["gpus"] == [0, 1, 2]
    assert res["shut_down"] == shut_down
    assert [(s["vmid"], s["unit"]) for s in res["services_stopped"]] == [(129, "sglang")]
    assert len([c for c in node.calls if c[-2:] == ("stop", "sglang")]) == stops
    assert len([c for c in node.calls if c[0] == "shutdown"]) == (0 if check_mode else len(shut_down))
    assert res["changed"] is True
    assert ("release" in res) is (state == "released")


def test_no_running_container_never_releases():
    """An empty scope would be every process of the node: the release is not called at all."""
    node = FakeNode()
    res = fence(node, containers=[131], state="released").run()
    assert node.released == [] and "release" not in res and res["gpus"] == [3]


def test_a_frozen_container_fails_before_anything_is_stopped():
    node = FakeNode(frozen={130}, active={(129, "sglang")})
    f = fence(node, containers=[129, 130], units=["sglang"], state="released", pct_timeout=5.0)
    with pytest.raises(_fence.FenceFailed) as exc:
        f.run()
    assert exc.value.kind == "container_timeout"
    assert exc.value.msg.startswith("CT 130 did not answer: systemctl is-active sglang had not returned after 5 s")
    assert "Nothing was stopped" in exc.value.msg
    assert not [c for c in node.calls if "stop" in c] and node.released == []
    assert f.finish()["services_stopped"] == []


@pytest.mark.parametrize("stop_rc, kind, said", [
    (1, "service_stop_failed", "stopping sglang in CT 129 failed (rc 1): Failed to stop unit. The unit may still"),
    (None, "container_timeout", "stopping sglang in CT 129 did not finish within 65 s: CT 129 did not answer"),
])
def test_a_service_that_does_not_stop_fails_and_is_not_reported_stopped(stop_rc, kind, said):
    node = FakeNode(active={(129, "sglang")}, stop_rc=stop_rc or 0)
    if stop_rc is None:
        real = node.pct

        def pct(argv, timeout, what):
            if argv[-2:] == ["stop", "sglang"]:
                node.t += timeout
                raise _errors.QueryTimeout(what)
            return real(argv, timeout, what)
        node.pct = pct
    f = fence(node, containers=[129], units=["sglang"], state="released")
    with pytest.raises(_fence.FenceFailed) as exc:
        f.run()
    assert exc.value.kind == kind and exc.value.msg.startswith(said), exc.value.msg
    assert node.released == []
    stopped = f.finish()["services_stopped"]
    assert stopped == ([] if stop_rc is None else [dict(vmid=129, unit="sglang", rc=1, seconds=0.0, state_before="active")])


def test_a_failed_release_keeps_its_partial_result():
    failure = _errors.GpuError("2 process(es) survived SIGKILL")
    node = FakeNode(release_failure=failure)
    f = fence(node, containers=[129], state="released")
    with pytest.raises(_errors.GpuError) as exc:
        f.run()
    assert exc.value is failure and f.finish()["release"] == {"released": []}


def test_discovery_has_one_time_limit():
    """Every pct call of the discovery gets what is left of pct_timeout, not pct_timeout each."""
    node = FakeNode()
    seen = []
    real = node.pct

    def pct(argv, timeout, what):
        seen.append(timeout)
        node.t += 4.0
        return real(argv, timeout, what)
    node.pct = pct
    with pytest.raises(_fence.FenceFailed) as exc:
        fence(node, pct_timeout=10.0).run()
    assert exc.value.kind == "container_timeout" and "pct_timeout (10 s, the limit of the whole discovery)" in exc.value.msg
    assert seen[0] == 10.0 and all(t < 10.0 for t in seen[1:])


def test_pending_passthrough_changes_are_a_warning():
    node = FakeNode()
    real = node.pct

    def pct(argv, timeout, what):
        if argv[:2] == ["config", "129"] and "--current" not in argv:
            return 0, "hostname: gpu-a\ndev0: /dev/nvidia7\n", ""   # dev1 deleted, pending
        return real(argv, timeout, what)
    node.pct = pct
    res = fence(node, containers=[129]).run()
    assert res["pending_passthrough"] == [{"vmid": 129, "removed": ["dev1: /dev/nvidia6"], "added": [], "minors": [7]}]
    assert res["containers"][0]["gpus"] == [0, 1]   # what it has now
    assert len(node.warnings) == 1 and "CT 129 has pending changes" in node.warnings[0]


def test_diff_says_which_services_stop_and_which_containers_shut_down():
    node = FakeNode(active={(129, "sglang")})
    res = fence(node, diff=True, containers=[129, 131], units=["sglang"], state="shutdown").run()
    assert res["diff"]["before"] == {"129": {"status": "running", "services": {"sglang": "active"}},
                                     "131": {"status": "stopped", "services": {}}}
    assert res["diff"]["after"]["129"] == {"status": "stopped", "services": {"sglang": "inactive"}}


def raw_gpu(index, used, contexts):
    return {"index": index, "minor_number": 7 - index, "uuid": f"GPU-{index}", "memory": {"used": used},
            "processes": [{"pid": pid, "types": ["compute"], "used_mib": mib} for pid, mib in contexts],
            "processes_error": None}


@pytest.mark.parametrize("looked, stopped, expected", [
    # GPU 0's list accounts for its memory, GPU 1's does not (a hidden holder), GPU 2 is idle
    ([raw_gpu(0, 40960, [(812, 40960)]), raw_gpu(1, 2048, []), raw_gpu(2, 0, [])], [{"rc": 0}], [0, 2]),
    # nothing was stopped: nothing is draining
    ([raw_gpu(0, 40960, [(812, 40960)])], [], []),
    ([raw_gpu(0, 40960, [(812, 40960)])], [{"rc": None}], []),
    # no look (the driver could not be read)
    (None, [{"rc": 0}], []),
])
def test_draining_gpus(looked, stopped, expected):
    assert _fence.draining_gpus(looked, stopped) == expected


def test_the_release_after_a_service_stop_knows_which_gpus_are_draining():
    """The services held GPUs 0 and 1 with contexts that account for their memory: right after the stop the
    memory is still in use with no process; the release is told so (it must not signal a device holder with
    no context for it)."""
    looked = [raw_gpu(i, 40960, [(900 + i, 40960)]) for i in range(2)] + [raw_gpu(2, 4096, [])]
    node = FakeNode(active={(129, "sglang")}, gpus=[dict(g, minor_number=7 - g["index"]) for g in looked])
    fence(node, containers=[129], units=["sglang"], state="released").run()
    assert node.released == [[129]] and node.draining == [0, 1]
    node = FakeNode(gpus=looked)   # no service stopped: nothing draining
    fence(node, containers=[129], state="released").run()
    assert node.draining == []


TOOLKIT_LIST = """VMID       Status     Lock         Name
140        running                 hook
141        running                 own-hook
142        running                 own-idle
143        stopped                 own-stopped
"""
TOOLKIT_CONFIGS = {
    140: "hostname: hook\nlxc.hook.mount: /usr/share/lxc/hooks/nvidia\nlxc.environment: NVIDIA_VISIBLE_DEVICES=GPU-5,1\n",
    141: "hostname: own-hook\nlxc.hook.mount: /opt/gpu-hook\n",
    142: "hostname: own-idle\nlxc.hook.mount: /opt/gpu-hook\n",
    143: "hostname: own-stopped\nlxc.hook.mount: /opt/gpu-hook\n",
}


class ToolkitNode(FakeNode):
    """A node whose containers get GPUs through the toolkit's hook or a hook of their own; ``holding``: what the
    processes of each container hold ({vmid: GPU indexes})."""

    def __init__(self, holding, **kw):
        super().__init__(**kw)
        self.holding = holding
        self.held_calls = 0

    def pct(self, argv, timeout, what):
        if argv[0] == "list":
            return 0, TOOLKIT_LIST, ""
        if argv[0] == "config":
            return 0, TOOLKIT_CONFIGS[int(argv[1])], ""
        return super().pct(argv, timeout, what)

    def held(self):
        self.held_calls += 1
        return {vmid: set(gpus) for vmid, gpus in self.holding.items()}


@pytest.mark.parametrize("params, holding, rows, gpus", [
    # Node-level: the hook's GPUs by UUID and index; an unreadable hook counts when its processes hold a GPU
    ({}, {141: [6], 142: []}, {140: (True, [1, 5], [2, 6]), 141: (None, [6], [1])}, [1, 5, 6]),
    ({}, {}, {140: (True, [1, 5], [2, 6])}, [1, 5]),
    # Named: reported whatever they hold; a stopped one's GPUs cannot be told
    ({"containers": [142]}, {}, {142: (None, [], [])}, []),
    ({"containers": [141, 143]}, {141: [0, 1]}, {141: (None, [0, 1], [6, 7]), 143: (None, None, [])}, [0, 1]),
])
def test_toolkit_hook_and_unreadable_passthrough(params, holding, rows, gpus):
    node = ToolkitNode(holding)
    res = fence(node, **params).run()
    got = {c["vmid"]: (c["passthrough"], c["gpus"], c["minors"]) for c in res["containers"]}
    assert got == rows and res["gpus"] == gpus
    for vmid in rows:
        if vmid != 140:
            assert any(m.startswith(f"CT {vmid}: lxc.hook.mount: /opt/gpu-hook may pass NVIDIA devices") for m in node.warnings)
    assert node.held_calls == 1


def test_a_toolkit_uuid_no_gpu_has_is_null_with_a_warning():
    node = ToolkitNode({}, gpus=[g for g in GPUS if g["index"] != 5])
    res = fence(node, containers=[140]).run()
    assert res["containers"][0]["gpus"] is None and res["gpus"] is None
    assert any("no GPU of this node matches GPU-5" in m for m in node.warnings), node.warnings
