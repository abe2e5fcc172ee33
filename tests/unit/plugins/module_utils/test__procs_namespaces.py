# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""_procs.read_process over /proc trees written as the kernel writes them: the pid in the Proxmox
container is the level of NSpid below the host, whatever PID namespaces are nested inside."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs


def fake_proc(tmp_path, pid, nspid, cgroup):
    d = tmp_path / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} (python3) S 900 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 4242 0 0\n")
    (d / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\nNSpid:\t" + "\t".join(map(str, nspid)) + "\n")
    (d / "cgroup").write_text(f"0::{cgroup}\n")
    (d / "cmdline").write_bytes(b"python3\0serve.py\0")
    return str(tmp_path)


@pytest.mark.parametrize("nspid, cgroup, expected", [
    pytest.param([5000], "/user.slice", None, id="a host process"),
    pytest.param([5000, 42], "/lxc/129/ns/system.slice/vllm.service", {"kind": "lxc", "id": 129, "pid_in_container": 42, "uid_in_container": 0},
                 id="a process of CT 129"),
    pytest.param([5000, 42, 1], "/lxc/129/ns/system.slice/docker-abc.scope", {"kind": "lxc", "id": 129,
                                                                              "pid_in_container": 42, "uid_in_container": 0},
                 id="Docker inside CT 129: the container's pid, not the innermost"),
    pytest.param([5000, 42, 7, 1], "/lxc/129/ns/x", {"kind": "lxc", "id": 129, "pid_in_container": 42, "uid_in_container": 0},
                 id="four levels"),
])
def test_pid_in_container_is_the_level_below_the_host(tmp_path, nspid, cgroup, expected):
    proc = fake_proc(tmp_path, 5000, nspid, cgroup)
    info = _procs.read_process(5000, proc=proc)
    assert info["container"] == expected
    assert info["ns_pid"] == nspid[-1] and info["pgrp"] == 5000


def test_the_initial_pid_namespace_is_told_by_its_fixed_inode(tmp_path):
    (tmp_path / "self" / "ns").mkdir(parents=True)
    (tmp_path / "self" / "ns" / "pid").write_text("")
    assert _procs.in_initial_pid_namespace(str(tmp_path)) is False
    assert _procs.in_initial_pid_namespace(str(tmp_path / "missing")) is None


# --- the users of a container: its idmap and its own /etc/passwd (issue 29, item 8) -------------------------------

@pytest.mark.parametrize("text, node_uid, expected", [
    pytest.param("         0     100000      65536\n", 101000, 1000, id="PVE's default map"),
    pytest.param("         0     100000      65536\n", 100000, 0, id="the container's root"),
    pytest.param("         0     100000      65536\n", 1000, None, id="a node uid outside the map"),
    pytest.param("0 100000 1000\n1000 1000 1\n1001 101001 64535\n", 1000, 1000, id="a custom map passing uid 1000 through"),
    pytest.param("0 100000 1000\n1000 1000 1\n1001 101001 64535\n", 101001, 1001, id="a custom map, the range after"),
    pytest.param("0 0 4294967295\n", 1000, 1000, id="no user namespace (a privileged container)"),
    pytest.param("garbage\n0 100000\n", 101000, None, id="malformed lines are left out"),
])
def test_a_node_uid_is_mapped_into_the_container(text, node_uid, expected):
    assert _procs.id_inside(_procs.parse_id_map(text), node_uid) == expected


@pytest.mark.parametrize("text, expected", [
    pytest.param("root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n", {0: "root", 1000: "alice"},
                 id="names by uid"),
    pytest.param("alice:x:1000:1000::/:/bin/sh\nalias:x:1000:1000::/:/bin/sh\n", {1000: "alice"}, id="the first entry wins"),
    pytest.param("# comment\n+nis::::::\nbad\nx:x:notanumber:0::/:\n\n", {}, id="comments, NIS lines, malformed"),
])
def test_a_container_passwd_is_read_as_getpwuid_reads_one(text, expected):
    assert _procs.parse_passwd(text) == expected


def contained(tmp_path, uid_map, passwd, node_uid=101000):
    proc = fake_proc(tmp_path, 5000, [5000, 42], "/lxc/129/ns")
    d = tmp_path / "5000"
    (d / "status").write_text(f"Name:\tpython3\nUid:\t{node_uid}\t{node_uid}\t{node_uid}\t{node_uid}\nNSpid:\t5000\t42\n")
    if uid_map is not None:
        (d / "uid_map").write_text(uid_map)
    (d / "root" / "etc").mkdir(parents=True)
    if passwd is not None:
        (d / "root" / "etc" / "passwd").write_text(passwd)
    return proc


def test_a_container_process_is_named_by_the_container_passwd_and_keeps_its_node_uid(tmp_path):
    proc = contained(tmp_path, "0 100000 65536\n", "root:x:0:0::/:/bin/sh\nalice:x:1000:1000::/:/bin/sh\n")
    info = _procs.read_process(5000, proc=proc)
    assert (info["user"], info["uid"], info["container"]["uid_in_container"]) == ("alice", 101000, 1000)


def test_a_container_uid_without_a_name_there_is_its_number_in_the_container_not_the_node_name(tmp_path):
    proc = contained(tmp_path, "0 100000 65536\n", "root:x:0:0::/:/bin/sh\n", node_uid=100000 + 1)
    info = _procs.read_process(5000, proc=proc)
    assert (info["user"], info["uid"], info["container"]["uid_in_container"]) == ("1", 100001, 1)


def test_a_container_passwd_that_is_a_symlink_or_a_fifo_is_not_read(tmp_path):
    import os

    proc = contained(tmp_path, "0 100000 65536\n", None)
    target = tmp_path / "node-passwd"
    target.write_text("nodeuser:x:1000:1000::/:/bin/sh\n")
    os.symlink(str(target), str(tmp_path / "5000" / "root" / "etc" / "passwd"))
    assert _procs.read_process(5000, proc=proc)["user"] == "1000"
    os.unlink(str(tmp_path / "5000" / "root" / "etc" / "passwd"))
    os.mkfifo(str(tmp_path / "5000" / "root" / "etc" / "passwd"))
    assert _procs.read_process(5000, proc=proc)["user"] == "1000"  # and it did not block on the FIFO
