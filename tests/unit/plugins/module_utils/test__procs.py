# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils._procs import (
    container_from_cgroup,
    is_kernel_thread,
    parse_stat,
    parse_status,
    split_cmdline,
)

# 52 fields as the kernel writes them; starttime (field 22) is 4242.
_TAIL = "S 100 200 300 0 -1 4194560 10 0 0 0 1 2 0 0 20 0 1 0 4242 1000 200 18446744073709551615"

STAT_CASES = [
    ("plain", "1234 (python3) " + _TAIL, (1234, "python3", "S", 100, 4242)),
    ("spaces and parens in comm", "6279 (a) b (c) " + _TAIL, (6279, "a) b (c", "S", 100, 4242)),
    ("comm is a closing paren", "7 ()) " + _TAIL, (7, ")", "S", 100, 4242)),
    ("zombie", "9 (x) Z" + _TAIL[1:], (9, "x", "Z", 100, 4242)),
    ("trailing newline", "10 (sglang::worker) " + _TAIL + "\n", (10, "sglang::worker", "S", 100, 4242)),
]


@pytest.mark.parametrize("name, text, expected", STAT_CASES, ids=[c[0] for c in STAT_CASES])
def test_parse_stat(name, text, expected):
    st = parse_stat(text)
    assert (st.pid, st.comm, st.state, st.ppid, st.starttime) == expected


@pytest.mark.parametrize("text", ["", "1234", "1234 (x) S 1 2", "(x) " + _TAIL, "abc (x) " + _TAIL])
def test_parse_stat_rejects_malformed(text):
    with pytest.raises(ValueError):
        parse_stat(text)


STATUS_HOST = "Name:\tpython3\nState:\tS (sleeping)\nPPid:\t1\nUid:\t1000\t1000\t1000\t1000\nNSpid:\t8812\n"
STATUS_CT = "Name:\tpython3\nState:\tZ (zombie)\nPPid:\t77\nUid:\t0\t0\t0\t0\nNSpid:\t8812\t45\n"
STATUS_OLD = "Name:\tinit\nState:\tS (sleeping)\nPPid:\t0\nUid:\t0\t0\t0\t0\n"

STATUS_CASES = [
    ("host", STATUS_HOST, {"name": "python3", "state": "S", "ppid": 1, "uid": 1000, "nspid": [8812]}),
    ("container", STATUS_CT, {"name": "python3", "state": "Z", "ppid": 77, "uid": 0, "nspid": [8812, 45]}),
    ("no NSpid (kernel < 4.1)", STATUS_OLD, {"name": "init", "state": "S", "ppid": 0, "uid": 0, "nspid": []}),
    ("empty", "", {"name": None, "state": None, "ppid": None, "uid": None, "nspid": []}),
]


@pytest.mark.parametrize("name, text, expected", STATUS_CASES, ids=[c[0] for c in STATUS_CASES])
def test_parse_status(name, text, expected):
    assert parse_status(text) == expected


CGROUP_CASES = [
    ("pve7+ systemd ct", "0::/lxc/129/ns/init.scope\n", 129),
    ("pve7+ service", "0::/lxc/129/ns/system.slice/sglang.service\n", 129),
    ("pve7+ no systemd", "0::/lxc/1082/ns\n", 1082),
    ("hybrid v1 lines", "9:name=systemd:/\n4:memory:/lxc/130/ns\n0::/lxc/130/ns\n", 130),
    ("plain lxc payload", "0::/lxc.payload.131/init.scope\n", 131),
    ("lxc monitor is not the payload", "0::/lxc.monitor/129\n", None),
    ("plain lxc monitor", "0::/lxc.monitor.129\n", None),
    ("host process", "0::/user.slice/user-0.slice/session-1.scope\n", None),
    ("host root", "0::/\n", None),
    ("name that merely contains lxc", "0::/system.slice/lxcfs.service\n", None),
    ("docker", "0::/system.slice/docker-abc.scope\n", None),
    ("empty", "", None),
]


@pytest.mark.parametrize("name, text, expected", CGROUP_CASES, ids=[c[0] for c in CGROUP_CASES])
def test_container_from_cgroup(name, text, expected):
    assert container_from_cgroup(text) == expected


KTHREAD_CASES = [
    ("kthreadd", "2 (kthreadd) S 0 0 0 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 0", b"", True),
    ("kworker", "15 (kworker/0:1) I 2 0 0 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 9 0 0 0", b"", True),
    ("init", "1 (systemd) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 3 0 0 0", b"/sbin/init\0", False),
    ("user process", "900 (python3) S 1 900 900 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0 0", b"python3\0x.py\0", False),
    ("zombie user process has empty cmdline", "901 (python3) Z 900 900 900 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0 0", b"", False),
]


@pytest.mark.parametrize("name, stat, cmdline, expected", KTHREAD_CASES, ids=[c[0] for c in KTHREAD_CASES])
def test_is_kernel_thread(name, stat, cmdline, expected):
    assert is_kernel_thread(parse_stat(stat), cmdline) is expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b"", []),
        (b"python3\0-m\0sglang.launch_server\0", ["python3", "-m", "sglang.launch_server"]),
        (b"no-terminator", ["no-terminator"]),
        (b"bad\xffbyte\0", ["bad\ufffdbyte"]),
    ],
)
def test_split_cmdline(raw, expected):
    assert split_cmdline(raw) == expected


@pytest.mark.parametrize("environ, systemd, expected", [
    (b"PATH=/usr/bin\0container=lxc\0", "", True),
    (b"container=lxc", "", True),
    (b"PATH=/usr/bin\0HOME=/root\0", "", False),
    (b"container=\0", "", False),
    (b"", "lxc", True),
    (b"", "", False),
])
def test_container_marker(environ, systemd, expected):
    from ansible_collections.gpuops.gpu.plugins.module_utils._procs import container_marker

    assert container_marker(environ, systemd) is expected


@pytest.mark.parametrize("path, unit", [
    ("/lxc/129/ns/system.slice/sglang.service", "sglang.service"),
    ("/system.slice/vllm.service", "vllm.service"),
    ("/system.slice/vllm.service/payload", "vllm.service"),
    ("/gpusim-ab12/user.slice/user-0.slice/session-1.scope", None),
    ("/lxc/129/ns/.lxc", None),
    ("/lxc/129/ns", None),
    ("/init.scope", None),
    ("/system.slice/docker-0123abcd.scope", "docker-0123abcd.scope"),
    ("/", None),
    (None, None),
])
def test_unit_from_cgroup(path, unit):
    from ansible_collections.gpuops.gpu.plugins.module_utils._procs import unit_from_cgroup

    assert unit_from_cgroup(path) == unit
