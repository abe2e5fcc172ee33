# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils._host.procs import (
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
    from ansible_collections.gpuops.gpu.plugins.module_utils._host.procs import container_marker

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
    from ansible_collections.gpuops.gpu.plugins.module_utils._host.procs import unit_from_cgroup

    assert unit_from_cgroup(path) == unit


# --- device holders by identity (scan_fd_holders) ----------------------------------------------------
# An identity is (st_mode, st_ino, rdev major, rdev minor, dev major, dev minor).
CHR = 0o020666
REG = 0o100666
DIR = 0o040755


def test_device_identities_index_inode_and_the_device_number_of_character_devices():
    from ansible_collections.gpuops.gpu.plugins.module_utils._host.procs import device_identities

    index = device_identities([
        ("/dev/nvidia1", (CHR, 12, 195, 1, 0, 5)),
        ("/dev/nvidia0", (CHR, 11, 195, 0, 0, 5)),
        ("/dev/nvidia-caps", (DIR, 13, 0, 0, 0, 5)),
        ("/tmp/sim/dev/nvidia2", (REG, 900, 0, 0, 254, 1)),
    ])
    assert index == {
        (0, 5, 11): "/dev/nvidia0", (195, 0): "/dev/nvidia0",
        (0, 5, 12): "/dev/nvidia1", (195, 1): "/dev/nvidia1",
        (254, 1, 900): "/tmp/sim/dev/nvidia2",  # a plain file: by inode only, never by its (0, 0)
    }


def test_device_identities_name_an_identity_by_its_first_path():
    from ansible_collections.gpuops.gpu.plugins.module_utils._host.procs import device_identities

    index = device_identities([("/dev/nvidia0", (CHR, 11, 195, 0, 0, 5)), ("/dev/char/195:0", (CHR, 11, 195, 0, 0, 5))])
    assert set(index.values()) == {"/dev/char/195:0"}


@pytest.mark.parametrize("name, identity, expected", [
    ("the node itself (bound or hard-linked anywhere)", (CHR, 11, 195, 0, 0, 5), "/dev/nvidia0"),
    ("a container's own mknod of it (PVE devN:): another inode, same device number", (CHR, 4, 195, 0, 0, 77),
     "/dev/nvidia0"),
    ("another GPU's node", (CHR, 5, 195, 3, 0, 77), None),
    ("a plain file that happens to carry the device's numbers", (REG, 6, 195, 0, 0, 77), None),
    ("the simulator's plain file, bound into a container", (REG, 900, 0, 0, 254, 1), "/tmp/sim/dev/nvidia2"),
    ("another file on the same file system", (REG, 901, 0, 0, 254, 1), None),
    ("the same inode number on another file system", (REG, 900, 0, 0, 254, 2), None),
    ("/dev/null", (CHR, 7, 1, 3, 0, 5), None),
])
def test_identity_match(name, identity, expected):
    from ansible_collections.gpuops.gpu.plugins.module_utils._host.procs import device_identities, identity_match

    index = device_identities([("/dev/nvidia0", (CHR, 11, 195, 0, 0, 5)),
                               ("/tmp/sim/dev/nvidia2", (REG, 900, 0, 0, 254, 1))])
    assert identity_match(index, identity) == expected, name


def test_stat_identity_agrees_with_os_stat(tmp_path):
    """statx (through libc) and the os.stat fallback read the same identity, links followed."""
    import os

    from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs

    target = tmp_path / "nvidia0"
    target.write_text("")
    (tmp_path / "link").symlink_to(target)
    statx = _procs._statx_identity()
    for path in (str(target), str(tmp_path / "link"), "/dev/null", os.fsencode(str(target))):
        st = os.stat(path)
        want = (st.st_mode, st.st_ino, os.major(st.st_rdev), os.minor(st.st_rdev), os.major(st.st_dev),
                os.minor(st.st_dev))
        assert _procs._os_stat_identity(path) == want
        assert _procs.stat_identity()(path) == want
        if statx is not None:
            assert statx(path) == want
    with pytest.raises(OSError):
        _procs.stat_identity()(str(tmp_path / "missing"))


def _fake_proc(tmp_path):
    """A /proc tree whose fd entries are symlinks (the identity follows them, as it follows the magic links)."""
    sim = tmp_path / "sim" / "dev"
    sim.mkdir(parents=True)
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (sim / name).write_text("")
    (sim / "nvidia-caps").mkdir()
    other = tmp_path / "elsewhere"
    other.mkdir()
    import os

    os.link(sim / "nvidia1", other / "gpu1")  # the node under another name (a bind from another path)
    (other / "nvidia0").write_text("")  # a different file with the device's name
    proc = tmp_path / "proc"
    tables = {
        "100/fd": {"3": other / "gpu1", "4": sim / "nvidiactl", "5": "socket:[1234]"},
        "101/fd": {"0": other / "nvidia0", "1": "/dev/null"},
        "102/fd": {},  # an exited leader: its threads hold the table
        "102/task/103/fd": {"7": sim / "nvidia0"},
        "104/fd": {"9": sim / "nvidia-caps"},  # a directory holds no device
        "105/fd": {"2": sim / "nvidia0"},
    }
    for table, links in tables.items():
        (proc / table).mkdir(parents=True)
        for fd, target in links.items():
            (proc / table / fd).symlink_to(target)
    return proc, str(sim / "nvidia*")


def test_scan_fd_holders_compares_identity_not_the_link_text(tmp_path):
    from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs

    proc, pattern = _fake_proc(tmp_path)
    sim = str(tmp_path / "sim" / "dev")
    holders = _procs.scan_fd_holders([pattern], proc=str(proc), exclude_pids=(105,))
    assert holders == {
        100: [f"{sim}/nvidia1", f"{sim}/nvidiactl"],  # reported by the device files' own paths
        102: [f"{sim}/nvidia0"],
    }
    assert _procs.fd_scan_denied() == []


def test_scan_fd_holders_records_the_fd_tables_it_may_not_read(tmp_path, monkeypatch):
    import errno
    import os

    from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs

    proc, pattern = _fake_proc(tmp_path)
    listdir = os.listdir

    def refusing(path):
        if os.fsdecode(path).endswith(("/100/fd", "/102/task/103/fd")):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return listdir(path)

    monkeypatch.setattr(os, "listdir", refusing)
    denied = set()
    holders = _procs.scan_fd_holders([pattern], proc=str(proc), denied=denied)
    assert sorted(holders) == [105]
    assert denied == {100, 102}
    assert _procs.fd_scan_denied() == [100, 102]
    # The next scan starts afresh.
    monkeypatch.setattr(os, "listdir", listdir)
    _procs.scan_fd_holders([pattern], proc=str(proc))
    assert _procs.fd_scan_denied() == []


def test_scan_fd_holders_without_device_files_reads_nothing(tmp_path):
    from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs

    proc, _pattern = _fake_proc(tmp_path)
    assert _procs.scan_fd_holders([str(tmp_path / "none" / "nvidia*")], proc=str(proc)) == {}


def test_scan_fd_holders_finds_this_process_through_a_hard_link(tmp_path):
    """On the live /proc: this test's own fd on a hard link of the device file, under another name."""
    import os

    from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs

    (tmp_path / "dev").mkdir()
    node = tmp_path / "dev" / "nvidia0"
    node.write_text("")
    os.link(node, tmp_path / "renamed")
    fd = os.open(tmp_path / "renamed", os.O_RDONLY)
    try:
        holders = _procs.scan_fd_holders([str(tmp_path / "dev" / "nvidia*")])
    finally:
        os.close(fd)
    assert holders.get(os.getpid()) == [str(node)]


def test_holders_incomplete_warning():
    from ansible_collections.gpuops.gpu.plugins.module_utils._host.procs import holders_incomplete_warning

    assert holders_incomplete_warning([]) == ""
    text = holders_incomplete_warning([7, 8, 9], uid=65534)
    assert "(/proc/<pid>/fd) of 3 process(es): it runs as " in text and "(uid 65534), not as root" in text
    assert "holders are incomplete" in text and "become: true" in text
    assert "it does not run as root" in holders_incomplete_warning([7])
