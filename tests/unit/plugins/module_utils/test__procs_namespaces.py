# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""_procs.read_process over /proc trees written as the kernel writes them: the pid in the Proxmox
container is the level of NSpid below the host, whatever PID namespaces are nested inside."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _procs


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
    pytest.param([5000, 42], "/lxc/129/ns/system.slice/vllm.service", {"kind": "lxc", "id": 129, "pid_in_container": 42},
                 id="a process of CT 129"),
    pytest.param([5000, 42, 1], "/lxc/129/ns/system.slice/docker-abc.scope", {"kind": "lxc", "id": 129,
                                                                              "pid_in_container": 42},
                 id="Docker inside CT 129: the container's pid, not the innermost"),
    pytest.param([5000, 42, 7, 1], "/lxc/129/ns/x", {"kind": "lxc", "id": 129, "pid_in_container": 42},
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
