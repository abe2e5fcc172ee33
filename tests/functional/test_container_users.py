"""Users in containers are the containers' own (issue 29, item 8), on real LXC containers.

CT A is unprivileged, as Proxmox VE makes it (``lxc.idmap = u 0 100000 65536``): its alice (uid 1000 in its own
/etc/passwd) runs as node uid 101000, its root as node uid 100000. CT B is privileged (no idmap): its alice (uid
1000 there too) runs as node uid 1000, which the node's passwd may name another user (``cloudsdk`` on this
machine). Before, the modules named every process by the node's passwd: A's alice was ``101000``, B's was the
node's user of uid 1000, and ``users: [alice]`` selected neither.

Numbers in ``users`` are uids where the process lives: for a process in a container its uid in the container
(1000), never the node's (101000).
"""

import pwd

import pytest
from modrun import alive, run_module

CT_A = 7481  # unprivileged
CT_B = 7482  # privileged
ALICE = 1000


@pytest.fixture
def node(gpusim):
    gpusim.ct_create(CT_A, unprivileged=True, users={"alice": ALICE})
    gpusim.ct_create(CT_B, users={"alice": ALICE})
    gpusim.ct_start(CT_A)
    gpusim.ct_start(CT_B)
    jobs = {
        "a_alice": gpusim.hold(gpus=[0], mib=4096, ct=CT_A, uid=ALICE),
        "a_root": gpusim.hold(gpus=[1], mib=2048, ct=CT_A),
        "b_alice": gpusim.hold(gpus=[2], mib=1024, ct=CT_B, uid=ALICE),
    }
    return gpusim, jobs


def release(host, collection, check_mode=True, **args):
    res = run_module(host, collection, "gpu_release",
                     dict({"device_files": [host.dir + "/dev/nvidia*"], "grace_period": 5}, **args), check_mode=check_mode)
    assert not res.get("failed"), res.get("msg")
    return res


def pids(entries):
    return sorted(p["pid"] for p in entries)


def test_facts_name_a_container_process_by_the_container_passwd_and_keep_the_node_uid(node, collection):
    host, jobs = node
    res = run_module(host, collection, "gpu_facts", {"device_files": [host.dir + "/dev/nvidia*"]})
    assert not res.get("failed"), res.get("msg")
    seen = {p["pid"]: p for g in res["ansible_facts"]["gpu_devices"][:3] for p in g["processes"]}
    a_alice, a_root, b_alice = (seen[jobs[k]] for k in ("a_alice", "a_root", "b_alice"))
    assert (a_alice["user"], a_alice["uid"], a_alice["container"].get("uid_in_container")) == ("alice", 101000, ALICE)
    assert (a_root["user"], a_root["uid"], a_root["container"].get("uid_in_container")) == ("root", 100000, 0)
    assert (b_alice["user"], b_alice["uid"], b_alice["container"].get("uid_in_container")) == ("alice", ALICE, ALICE)


def test_users_alice_stops_alice_in_the_unprivileged_container_and_leaves_its_root(node, collection):
    host, jobs = node
    res = release(host, collection, check_mode=False, gpus=["0", "1"], containers=[CT_A], users=["alice"])
    assert pids(res["released"]) == [jobs["a_alice"]]
    assert res["released"][0]["user"] == "alice"
    (skipped,) = [p for p in res["skipped_processes"] if p["pid"] == jobs["a_root"]]
    assert skipped["reason"] == f"user root (uid 0 in CT {CT_A}, node uid 100000) is not in users", skipped
    assert not alive(jobs["a_alice"]) and alive(jobs["a_root"]) and alive(jobs["b_alice"])


def test_a_number_in_users_is_the_uid_in_the_container_not_the_node_uid(node, collection):
    host, jobs = node
    res = release(host, collection, gpus=["0", "1"], containers=[CT_A], users=[str(ALICE)])
    assert pids(res["released"]) == [jobs["a_alice"]]
    res = release(host, collection, gpus=["0", "1"], containers=[CT_A], users=[str(100000 + ALICE)])
    assert res["released"] == []
    assert jobs["a_alice"] in pids(res["skipped_processes"])


def test_a_node_user_of_the_same_uid_does_not_select_a_container_process(node, collection):
    host, jobs = node
    try:
        node_name = pwd.getpwuid(ALICE).pw_name
    except KeyError:
        node_name = None
    if node_name not in (None, "alice"):
        # B's alice is node uid 1000, which the node calls node_name: that is another user.
        res = release(host, collection, gpus=["2"], containers=[CT_B], users=[node_name])
        assert res["released"] == []
    res = release(host, collection, gpus=["2"], containers=[CT_B], users=["alice"])
    assert pids(res["released"]) == [jobs["b_alice"]]
    assert res["released"][0]["user"] == "alice"
