# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fence (_fence.Fence) against a fake node.

A fake, because a unit test has no Proxmox VE node: the node's files (its containers, which run, their config
files in pve-container's format) and its ``pct`` answer from tables, the GPUs are a list and the release is a
recorder (FakeNode.run_release, given to the Fence as its release). NodeIO's reading of the files is tested at the
end, against real files and real sockets. The real pct shim, containers and release run in
tests/functional/test_proxmox_gpu_containers.py.
"""

from __future__ import annotations

import os
import socket
import threading
import types

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _fence, _pct, _release, _selection
from ansible_collections.gpuops.gpu.plugins.module_utils._host.calls import Background, run_all
from ansible_collections.gpuops.gpu.plugins.module_utils._host.node_io import NodeIO
from ansible_collections.gpuops.gpu.plugins.module_utils._host.protocols import NodeHost
from ansible_collections.gpuops.gpu.plugins.modules import proxmox_gpu_containers

# The node's containers as its files say them: which run (their LXC monitors' sockets), and each one's config file
# (/etc/pve/lxc/<vmid>.conf).
RUNNING = {129, 130, 132}
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
    """A node (_host.protocols.NodeHost) from tables; its release is a recorder (``run_release``)."""

    release_io = None  # the release's host: run_release below never reaches it
    background = staticmethod(Background)
    run_all = staticmethod(run_all)

    def __init__(self, frozen=(), active=(), stop_rc=0, release_failure=None, gpus=GPUS, configs=None):
        self.calls = []                   # the pct calls
        self.reads = []                   # the node's files read: "node", then each vmid whose config was read
        self.configs = dict(CONFIGS if configs is None else configs)
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

    def exec_watch(self, _vmid, _limit):
        return None

    def warn(self, msg):
        self.warnings.append(msg)

    def node(self):
        self.reads.append("node")
        return sorted(self.configs), set(RUNNING)

    def config(self, vmid):
        self.reads.append(vmid)
        return self.configs.get(vmid)

    def where(self):
        return "/etc/pve"

    def pct_calls(self):
        return len(self.calls)

    def pct(self, argv, timeout, what):
        with self.lock:
            self.calls.append(tuple(argv))
        vmid = int(argv[1])
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

    def look(self):
        """A full snapshot's GPUs as the kernel shows the containers' processes: on each GPU a process of every
        container that keeps it busy (``busy`` {vmid: GPU indexes}: a context there, a blocker), a holder of its
        /dev/nvidiaN of every container that holds it (``holds``), and the holders of MIG devices' capability nodes
        (``held_migs`` {vmid, None for the node: MIG UUIDs})."""
        self.looks = getattr(self, "looks", 0) + 1
        gpus = {}

        def gpu(i):
            return gpus.setdefault(i, {"index": i, "processes": [], "holders": [], "blockers": []})
        for vmid, held in getattr(self, "busy", {}).items():
            for i in held:
                gpu(i)["processes"].append({"pid": 1000 + vmid, "container": {"kind": "lxc", "id": vmid}})
                gpu(i)["blockers"].append(1000 + vmid)
        for vmid, held in getattr(self, "holds", {}).items():
            for i in held:
                gpu(i)["holders"].append({"pid": 2000 + vmid, "evidence": "device", "container": {"kind": "lxc", "id": vmid}})
        for vmid, uuids in getattr(self, "held_migs", {}).items():
            gpu(0)["holders"].append({"pid": 3000 + (vmid or 0), "evidence": "control", "mig_devices": sorted(uuids),
                                      "container": None if vmid is None else {"kind": "lxc", "id": vmid}})
        return [gpus[i] for i in sorted(gpus)]

    def gpu_locks(self, _containers, _gpus):
        return False

    def run_release(self, p, filters, io, first_signal, check_mode, diff, lock):
        """_release.run_release's place: records the options the fence built."""
        assert getattr(io, "_io", io) is self.release_io and lock == self.gpu_locks and first_signal == 15
        self.released.append(list(filters["containers"]))
        self.units_stopped = list(p["units_stopped"])
        self.draining = list(p["draining_gpus"])
        self.release_gpus = filters["gpus"].indexes()
        if self.release_failure:
            raise self.release_failure
        return {"changed": True, "released": [{"pid": 4242}]}


def test_the_fake_is_a_node_host():
    assert isinstance(FakeNode(), NodeHost)


# The module's options the fence's release starts from (_fence.validate keeps them as params["release"]).
RELEASE_BASE = dict(gpus=[], grace_period=10.0, kill_timeout=5.0, lock_timeout=0.0, include_device_holders=True)


def fence(node, check_mode=False, diff=False, **params):
    p = dict(containers=[], units=[], state="present", force=False, include_stopped=False, shutdown_timeout=60,
             pct_timeout=30.0, stop_timeout=65.0, release=RELEASE_BASE, filters={"gpus": _selection.Selection()})
    p.update(params)
    return _fence.Fence(p, node, check_mode=check_mode, diff=diff, first_signal=15,
                        release=getattr(node, "run_release", None))


@pytest.mark.parametrize("params, containers, running, gpus, configs_read", [
    # Only running containers' configs are read (once: the file has the current and the pending values)
    ({}, [129, 130], [129, 130], [0, 1, 2], [129, 130, 132]),
    # include_stopped: the stopped one's config too
    ({"include_stopped": True}, [129, 130, 131], [129, 130], [0, 1, 2], [129, 130, 131, 132]),
    # Named: whatever their status; none running - the GPUs of their configs
    ({"containers": [131]}, [131], [], [3], [131]),
    ({"containers": [130, 131]}, [130, 131], [130], [2], [130, 131]),
    ({"containers": [132]}, [132], [132], [], [132]),
])
def test_discovery(params, containers, running, gpus, configs_read):
    node = FakeNode()
    res = fence(node, **params).run()
    assert [c["vmid"] for c in res["containers"]] == containers
    assert res["running"] == running and res["gpus"] == gpus
    # The node's files, not pct: no pct ran at all, and the result says so.
    assert node.reads == ["node"] + configs_read and node.calls == [] and res["pct_calls"] == 0
    assert res["skipped_containers"] == [{"vmid": 131, "reason": "stopped"}] * (131 in containers)
    assert not res["changed"] and "release" not in res and node.released == []


def test_an_unknown_container_fails_before_anything_runs():
    node = FakeNode(active={(129, "sglang")})
    with pytest.raises(_fence.FenceFailed) as exc:
        fence(node, containers=[129, 999], units=["sglang"], state="released").run()
    assert exc.value.kind == "no_such_container"
    assert "no container 999 on this node (its containers: 129, 130, 131, 132)" in exc.value.msg
    # Only the node's list was read: no pct ran, nothing was stopped or released.
    assert node.reads == ["node"] and node.calls == [] and node.released == []


def test_a_named_container_whose_config_is_gone_fails():
    node = FakeNode()
    node.configs[129] = None      # listed in .vmlist, its file gone (destroyed meanwhile)
    with pytest.raises(_fence.FenceFailed) as exc:
        fence(node, containers=[129], state="released").run()
    assert exc.value.kind == "no_such_container" and "CT 129's config is gone" in exc.value.msg
    assert fence(FakeNode(configs={**CONFIGS, 129: None})).run()["running"] == [130]  # unnamed: left out


@pytest.mark.parametrize("gpus, selected", [([], [0, 1, 2]), (["01"], [1])])
def test_the_options_are_checked_once_into_the_values_the_release_takes(gpus, selected):
    """Issue 35, item 2: the module's containers and gpus are checked once (_fence.validate: the release's filters),
    and the release is handed those values - the running containers, and the gpus option parsed (V(01) is GPU 1),
    else the containers' GPUs - not the options to check and read again."""
    spec = proxmox_gpu_containers.ARGUMENT_SPEC
    p = dict({k: v.get("default") for k, v in spec.items()}, containers="129,130", gpus=gpus, state="released")
    params = _fence.validate(p)
    assert params["containers"] == params["filters"]["containers"] == [129, 130]
    node = FakeNode()
    _fence.Fence(params, node, first_signal=15, release=node.run_release).run()
    assert node.released == [[129, 130]] and node.release_gpus == selected


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
    assert res["pct_calls"] == len(node.calls) > 0   # is-active in each container, and the stops
    assert res["changed"] is True
    assert ("release" in res) is (state == "released")
    if released:
        # The units it stopped (check mode: would stop) are not the release's to stop again (issue 33, item 6: the
        # check-mode summary named sglang and then sglang.service).
        assert node.units_stopped == [(129, "sglang")]


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
    failure = _release.ReleaseFailed("release_incomplete", "2 process(es) survived SIGKILL", {"released": []})
    node = FakeNode(release_failure=failure)
    f = fence(node, containers=[129], state="released")
    with pytest.raises(_release.ReleaseFailed) as exc:
        f.run()
    assert exc.value is failure and f.finish()["release"] == {"released": []}


def test_discovery_has_one_time_limit():
    """Reading the node's files (pmxcfs) gets pct_timeout: a read that hangs (pmxcfs stuck) fails the fence in time."""
    node = FakeNode()
    release = threading.Event()

    def hung():
        release.wait(10)
        return [], set()
    node.node = hung
    try:
        with pytest.raises(_fence.FenceFailed) as exc:
            fence(node, pct_timeout=0.2).run()
    finally:
        release.set()
    assert exc.value.kind == "container_timeout"
    assert "did not finish within pct_timeout (0.2 s): the cluster filesystem (pmxcfs) hangs" in exc.value.msg


@pytest.mark.parametrize("file, removed, added, minors", [
    # dev1 deleted, pending (pct set --delete dev1 on a running container)
    ("[pve:pending]\ndelete: dev1\n", ["dev1: /dev/nvidia6"], [], [7]),
    # dev0 changed to another GPU, pending; a forced deletion (!) of a key that is not there
    ("[pve:pending]\ndev0: /dev/nvidia3\ndelete: !swap\n", ["dev0: /dev/nvidia7"], ["dev0: /dev/nvidia3"], [3, 6]),
    # a snapshot section is not the config: no pending change
    ("[before-upgrade]\ndev0: /dev/nvidia0\nhostname: gpu-a\n", None, None, None),
])
def test_pending_passthrough_changes_are_a_warning(file, removed, added, minors):
    node = FakeNode(configs={**CONFIGS, 129: CONFIGS[129] + "\n" + file})
    res = fence(node, containers=[129]).run()
    if removed is None:
        assert res["pending_passthrough"] == [] and node.warnings == []
    else:
        assert res["pending_passthrough"] == [{"vmid": 129, "removed": removed, "added": added, "minors": minors}]
        assert len(node.warnings) == 1 and "CT 129 has pending changes" in node.warnings[0]
    assert res["containers"][0]["gpus"] == [0, 1]   # what it has now
    # a stopped container gets its pending changes at its start: they are its GPUs
    node = FakeNode(configs={**CONFIGS, 131: CONFIGS[131] + "\n[pve:pending]\ndev0: /dev/nvidia2\n"})
    assert fence(node, containers=[131]).run()["containers"][0]["gpus"] == [5]


def test_diff_says_which_services_stop_and_which_containers_shut_down():
    node = FakeNode(active={(129, "sglang")})
    res = fence(node, diff=True, containers=[129, 131], units=["sglang"], state="shutdown").run()
    assert [d["before_header"] for d in res["diff"]] == ["containers"]  # no release: its GPUs are not in it
    assert res["diff"][0]["before"] == {"129": {"status": "running", "services": {"sglang": "active"}},
                                        "131": {"status": "stopped", "services": {}}}
    assert res["diff"][0]["after"]["129"] == {"status": "stopped", "services": {"sglang": "inactive"}}


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


TOOLKIT_RUNNING = {140, 141, 142}  # 143 is stopped
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
        super().__init__(configs=TOOLKIT_CONFIGS, **kw)
        self.busy = holding

    def node(self):
        self.reads.append("node")
        return sorted(self.configs), set(TOOLKIT_RUNNING)


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
    assert node.looks == 1


def test_a_toolkit_uuid_no_gpu_has_is_null_with_a_warning():
    node = ToolkitNode({}, gpus=[g for g in GPUS if g["index"] != 5])
    res = fence(node, containers=[140]).run()
    assert res["containers"][0]["gpus"] is None and res["gpus"] is None
    assert any("no GPU of this node matches GPU-5" in m for m in node.warnings), node.warnings


# --- the kernel's word: what a running container's processes hold -----------------------------------------------

@pytest.mark.parametrize("params, holds, gpus, beyond, fenced, said", [
    # CT 129's config passes GPUs 0-1; edited while it ran, its processes still hold GPU 2 (and 5): fenced too
    ({"containers": [129]}, {129: [0, 1, 2]}, {129: [0, 1, 2]}, {129: [2]}, [0, 1, 2],
     "CT 129's processes hold GPU 2, which its config /etc/pve/lxc/129.conf does not pass"),
    ({"containers": [129]}, {129: [5], 130: [4]}, {129: [0, 1, 5]}, {129: [5]}, [0, 1, 5], "hold GPU 5, which"),
    # what it holds is within its config: no warning
    ({"containers": [129]}, {129: [0]}, {129: [0, 1]}, {129: []}, [0, 1], None),
    # node-level: a running container whose config passes nothing any more, while its processes hold GPU 3
    ({}, {132: [3]}, {129: [0, 1], 130: [2], 132: [3]}, {129: [], 130: [], 132: [3]}, [0, 1, 2, 3],
     "CT 132's processes hold GPU 3, which its config /etc/pve/lxc/132.conf does not pass"),
    # ... and one that passes and holds nothing is not fenced
    ({}, {}, {129: [0, 1], 130: [2]}, {129: [], 130: []}, [0, 1, 2], None),
    # ... also when no container's config passes a GPU (the kernel is asked whenever one runs)
    ({"only": [132]}, {132: [3]}, {132: [3]}, {132: [3]}, [3], "CT 132's processes hold GPU 3, which its config"),
])
def test_a_running_container_holds_what_its_processes_hold(params, holds, gpus, beyond, fenced, said):
    params = dict(params)
    only = params.pop("only", None)
    node = FakeNode(configs=None if only is None else {v: CONFIGS[v] for v in only})
    node.holds = holds
    res = fence(node, state="released", **params).run()
    rows = {c["vmid"]: c for c in res["containers"]}
    assert {v: c["gpus"] for v, c in rows.items()} == gpus
    assert {v: c["gpus_beyond_config"] for v, c in rows.items()} == beyond
    # The release and the wait after it cover the union
    assert res["gpus"] == res["wait_gpus"] == node.release_gpus == fenced
    assert {v: c["wait_gpus"] for v, c in rows.items()} == gpus
    kernel = [m for m in node.warnings if "which its config" in m]
    assert (said is None and not kernel) or (said and any(said in m for m in kernel)), node.warnings


def mig_gpu(index, uuids):
    """A GPU (minor 7 - index) in MIG mode with one MIG device per UUID (capability nodes 10 * index + 2k, + 1)."""
    devs = [{"uuid": u, "device_nodes": [f"/dev/nvidia-caps/nvidia-cap{10 * index + 2 * k + 3}",
                                         f"/dev/nvidia-caps/nvidia-cap{10 * index + 2 * k + 4}"]}
            for k, u in enumerate(uuids)]
    return {"index": index, "uuid": f"GPU-{index}", "minor_number": 7 - index, "mig_mode": True, "mig_mode_pending": True,
            "mig_devices": devs}


CAPS_DIR = "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir\n"
MIG_CONFIGS = {150: "hostname: caps-dir\ndev0: /dev/nvidia7\n" + CAPS_DIR,
               151: "hostname: caps-dev\ndev0: /dev/nvidia7\ndev1: /dev/nvidia-caps\n",
               152: "hostname: caps-lines\ndev0: /dev/nvidia7\ndev1: /dev/nvidia-caps/nvidia-cap3\n"
                    "dev2: /dev/nvidia-caps/nvidia-cap4\n",
               153: "hostname: whole-dev\nlxc.mount.entry: /dev dev none bind,optional,create=dir\n"}


@pytest.mark.parametrize("vmid, held, mig, said", [
    # the whole /dev/nvidia-caps (a bind, a devN of the directory, a bind of /dev): the MIG devices its processes are on
    (150, {150: {"MIG-b"}, None: {"MIG-a"}}, ["MIG-b"], None),
    (151, {151: {"MIG-c"}}, ["MIG-c"], None),
    (153, {153: {"MIG-b"}}, ["MIG-b"], None),
    # none yet: those no other process holds, with a warning that it cannot tell (never the neighbour's)
    (150, {None: {"MIG-a"}, 160: {"MIG-c"}}, ["MIG-b"], "CT 150's config passes the whole /dev/nvidia-caps: which MIG"
     " devices of GPU 0 are its cannot be told: its processes hold none now; the wait covers those no other process"
     " holds: MIG-b"),
    (150, {}, ["MIG-a", "MIG-b", "MIG-c"], "the wait covers those no other process holds: MIG-a, MIG-b, MIG-c"),
    # capability node lines: those, and the ones its processes are on beyond them (edited while it runs)
    (152, {}, ["MIG-a"], None),
    (152, {152: {"MIG-a", "MIG-c"}}, ["MIG-a", "MIG-c"], "CT 152's processes are on MIG device MIG-c (a context, or"
     " its capability nodes open), which its config /etc/pve/lxc/152.conf does not name"),
])
def test_a_running_containers_mig_devices_are_what_its_processes_are_on(vmid, held, mig, said):
    node = FakeNode(configs=MIG_CONFIGS, gpus=[mig_gpu(0, ["MIG-a", "MIG-b", "MIG-c"])])
    node.node = lambda: (sorted(MIG_CONFIGS), set(MIG_CONFIGS))
    node.held_migs = held
    res = fence(node, containers=[vmid]).run()
    (row,) = res["containers"]
    assert row["mig_devices"] == mig and row["wait_mig_devices"] == {"0": mig}, row
    warned = [m for m in node.warnings if "MIG device" in m]
    assert (said is None and not warned) or (said and any(said in m for m in warned)), node.warnings


@pytest.mark.parametrize("containers, warned", [([129], [0]), ([131], []), ([], [0])])
def test_a_pending_mig_mode_change_in_the_fences_scope_is_a_warning(containers, warned):
    """GPU 0 (CT 129's) and GPU 3 (CT 131's, stopped) turn MIG on at their next reset."""
    gpus = [dict(g, mig_mode=False, mig_mode_pending=g["index"] in (0, 3)) for g in GPUS]
    node = FakeNode(gpus=gpus)
    fence(node, containers=containers + [130] * bool(containers)).run()
    said = [m for m in node.warnings if "MIG mode change is pending" in m]
    assert [int(m.split(":")[0].split()[1]) for m in said] == warned, node.warnings
    assert all("nvidia-smi -r -i" in m for m in said)


# --- NodeIO: the node's files and the kernel, for real ------------------------------------------------------------

def node_io(pve_dir, lxc_path="/nonexistent/lxc"):
    release_io = types.SimpleNamespace(warn=lambda msg: None, now=lambda: 0.0)
    return NodeIO("/usr/sbin/pct", None, release_io, pve_dir=str(pve_dir), lxc_path=str(lxc_path))


def pve(tmp_path, vmlist, node="pve1", configs=None):
    """A /etc/pve as pmxcfs shows it: .vmlist, nodes/<node>/lxc/<vmid>.conf and the links local and lxc."""
    d = tmp_path / "pve"
    (d / "nodes" / node / "lxc").mkdir(parents=True)
    os.symlink(f"nodes/{node}", d / "local")
    os.symlink(f"nodes/{node}/lxc", d / "lxc")
    if vmlist is not None:
        (d / ".vmlist").write_text(vmlist, encoding="utf-8")
    for vmid, text in (configs or {}).items():
        (d / "nodes" / node / "lxc" / f"{vmid}.conf").write_text(text, encoding="utf-8")
    return d


VMLIST = ('{\n"version": 4,\n"ids": {\n"129": { "node": "pve1", "type": "lxc", "version": 2 },\n'
          '"130": { "node": "pve2", "type": "lxc", "version": 3 },\n"131": { "node": "pve1", "type": "lxc", "version": 4 }}\n\n}\n')


def test_node_io_reads_the_node_and_which_containers_run(tmp_path):
    """This node's containers from .vmlist (the node named by pmxcfs' "local" link), their configs, and which run: the
    one whose LXC monitor's command socket is bound (a real abstract socket here, as lxc-start binds it)."""
    lxc_path = tmp_path / "lxc"
    io = node_io(pve(tmp_path, VMLIST, configs={129: "hostname: a\n"}), lxc_path)
    monitor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        monitor.bind("\0" + _pct.command_socket(str(lxc_path), 129)[1:])
        monitor.listen(1)
        assert io.node() == ([129, 131], {129})
    finally:
        monitor.close()
    assert io.node() == ([129, 131], set())
    assert io.config(129) == "hostname: a\n" and io.config(131) is None   # listed, its file gone
    assert io.pct_calls() == 0


@pytest.mark.parametrize("vmlist, said", [
    (None, "pve/.vmlist (No such file or directory): {d} is not mounted - the Proxmox VE cluster filesystem (pmxcfs)"
           " is down"),
    ("{", "pve/.vmlist: not JSON ("),
])
def test_node_io_without_pmxcfs_is_a_clear_error(tmp_path, vmlist, said):
    d = pve(tmp_path, vmlist)
    with pytest.raises(_fence.FenceFailed) as exc:
        node_io(d).node()
    assert exc.value.kind == "pve_unavailable" and said.format(d=d) in exc.value.msg, exc.value.msg
    assert "Nothing was stopped" in exc.value.msg


def test_the_fence_on_a_node_without_pmxcfs_fails_before_anything_runs(tmp_path):
    """/etc/pve is an empty directory while pmxcfs is down: the fence says so, it never guesses 'no containers'."""
    empty = tmp_path / "etc-pve"
    empty.mkdir()
    io = node_io(empty)
    with pytest.raises(_fence.FenceFailed) as exc:
        fence(io).discovery.containers()
    assert exc.value.kind == "pve_unavailable" and "pmxcfs" in exc.value.msg


# --- configs that pass every GPU --------------------------------------------------------------------------------
# Helper scripts (tests/field/pct/phoenix-hypervisor-drdevstral-lines.conf) write a devN line for every /dev/nvidia*
# node into every GPU container: such a config says nothing of which GPUs its work uses.
EVERY_DEV = "".join(f"dev{i}: /dev/nvidia{i}\n" for i in range(8)) + (
    "dev8: /dev/nvidiactl\ndev9: /dev/nvidia-uvm\ndev10: /dev/nvidia-caps/nvidia-cap1\n")
EVERY_CGROUP = "lxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c 509:* rwm\n"
SHARED = {160: "hostname: ct-a\n" + EVERY_DEV, 161: "hostname: ct-b\n" + EVERY_DEV, 162: "hostname: plain\n",
          163: "hostname: one\ndev0: /dev/nvidia0\n", 164: "hostname: ct-c\n" + EVERY_CGROUP}


class SharedNode(FakeNode):
    """A node with containers whose configs pass every GPU; ``busy``: what each container's processes keep busy."""

    def __init__(self, running, busy, configs=None, **kw):
        super().__init__(configs={**SHARED, **(configs or {})}, **kw)
        self.running = set(running)
        self.busy = busy

    def node(self):
        self.reads.append("node")
        return sorted(self.configs), set(self.running)


@pytest.mark.parametrize("running, busy, containers, wait, gpus_from, said", [
    # A's config passes all 8, its server holds 0-3, B's job 4-7 (B's config passes all 8 too): the wait covers 0-3
    ([160, 161], {160: [0, 1, 2, 3], 161: [4, 5, 6, 7]}, [160], {160: [0, 1, 2, 3]}, {160: "processes"},
     "CT 160's config passes every GPU of the node, and CT 161 pass GPUs too: fenced by what its processes hold: GPU 0,"
     " 1, 2, 3"),
    # A holds nothing: the GPUs no other container's processes hold
    ([160, 161], {161: [4, 5, 6, 7]}, [160], {160: [0, 1, 2, 3]}, {160: "unheld"}, "its processes hold no GPU: the wait"
     " covers the GPUs no other container's processes hold: GPU 0, 1, 2, 3"),
    # A holds nothing and B every GPU: the config's (the wait names B's holders)
    ([160, 161], {161: list(range(8))}, [160], {160: list(range(8))}, {160: "config"}, "other containers' processes"
     " hold every one"),
    # The other container passes one GPU (minor 0: GPU 7) by name
    ([160, 163], {160: [0, 1], 163: [7]}, [160], {160: [0, 1]}, {160: "processes"}, "CT 163 pass GPUs too"),
    # c 195:* with no node named (every GPU, gpus null)
    ([164, 161], {164: [2], 161: [4]}, [164], {164: [2]}, {164: "processes"}, "CT 164's config passes every GPU"),
    # Alone among GPU containers (the other passes nothing, or is stopped): its config is its GPUs
    ([160, 162], {160: [0, 1, 2, 3]}, [160], {160: list(range(8))}, {160: "config"}, None),
    ([160], {160: [0, 1, 2, 3]}, [160], {160: list(range(8))}, {160: "config"}, None),
    # The node-level fence: each by what its processes hold
    ([160, 161], {160: [0, 1, 2, 3], 161: [4, 5]}, [], {160: [0, 1, 2, 3], 161: [4, 5]},
     {160: "processes", 161: "processes"}, "CT 161's config passes every GPU of the node, and CT 160 pass GPUs too"),
])
def test_a_config_that_passes_every_gpu_is_fenced_by_what_its_processes_hold(running, busy, containers, wait, gpus_from,
                                                                             said):
    node = SharedNode(running, busy)
    res = fence(node, containers=containers, state="released").run()
    rows = {c["vmid"]: c for c in res["containers"] if c["running"]}
    assert {v: c["wait_gpus"] for v, c in rows.items()} == wait
    assert {v: c["gpus_from"] for v, c in rows.items()} == gpus_from
    assert res["wait_gpus"] == sorted({i for g in wait.values() for i in (g or range(8))})
    # The release is not narrowed: it stops the container's processes on every GPU its config passes.
    every = None if 164 in rows else list(range(8))   # c 195:*: every GPU, gpus null
    assert node.release_gpus == res["gpus"] == every and node.released == [sorted(rows)]
    if said is None:
        assert not [m for m in node.warnings if "passes every GPU" in m] and getattr(node, "looks", 0) <= 1
    else:
        assert any(said in m for m in node.warnings), node.warnings
        assert node.looks == 1
    if containers and len(running) > 1:
        assert [r for r in node.reads if r != "node"][0] == containers[0]  # the other running configs read after


def test_what_the_release_saw_counts_too():
    """A process of the container that the discovery did not see (it started on GPU 5 since) is in the release's look:
    the wait covers its GPU too."""
    node = SharedNode([160, 161], {160: [0], 161: [4]})
    gpu5 = {"index": 5, "minor_number": 2, "memory": {"used": 1024}, "blockers": [77],
            "processes": [{"pid": 77, "used_mib": 1024, "container": {"kind": "lxc", "id": 160}}], "holders": {}}
    node.run_release = lambda *_args, **_kw: {"changed": True, "released": [], "gpus_before": [gpu5],
                                              "holder_processes": {}}
    res = fence(node, containers=[160], state="released").run()
    assert res["containers"][0]["wait_gpus"] == [0, 5] and res["wait_gpus"] == [0, 5]
