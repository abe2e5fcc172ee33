# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _pct
from ansible_collections.gpuops.gpu.plugins.module_utils._errors import InvalidOption

FMT = "%-10s %-10s %-12s %-20s"  # pve-container src/PVE/CLI/pct.pm, `pct list`
HEADER = FMT % ("VMID", "Status", "Lock", "Name")

CONFIG_HEAD = """arch: amd64
cores: 8
hostname: gpu-ct
memory: 32768
net0: name=eth0,bridge=vmbr0,firewall=1,hwaddr=BC:24:11:AA:BB:CC,ip=dhcp,type=veth
ostype: debian
rootfs: local-lvm:vm-129-disk-0,size=32G
swap: 512
unprivileged: 1
"""
CONTROL_MOUNTS = """lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file 0 0
"""


@pytest.mark.parametrize("text, passthrough, minors, devices, nlines", [
    # PVE 8.1+ device passthrough, bare path and property string (path= first or not)
    ("dev0: /dev/nvidia0\ndev1: /dev/nvidiactl\n", True, [0], ["/dev/nvidia0", "/dev/nvidiactl"], 2),
    ("dev0: /dev/nvidia1,gid=44\ndev1: path=/dev/nvidia3,mode=0666\ndev2: mode=0666,path=/dev/nvidia-uvm\n",
     True, [1, 3], ["/dev/nvidia1", "/dev/nvidia3", "/dev/nvidia-uvm"], 3),
    # The classic recipe: every minor allowed, narrowed by the mount entries; control nodes are no GPU
    ("lxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c 509:* rwm\n"
     "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
     "lxc.mount.entry: /dev/nvidia5 dev/nvidia5 none bind,optional,create=file\n" + CONTROL_MOUNTS,
     True, [0, 5], ["/dev/nvidia0", "/dev/nvidia5", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                    "/dev/nvidia-modeset"], 7),
    # Every minor allowed and no GPU node named: every GPU of the node
    ("lxc.cgroup2.devices.allow: c 195:* rwm\n", True, None, [], 1),
    ("lxc.cgroup2.devices.allow: c 195:* rwm\n" + CONTROL_MOUNTS, True, None,
     ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"], 5),
    # Specific minors (cgroup v2 and v1); 255 (nvidiactl) and 254 (nvidia-modeset) are control minors
    ("lxc.cgroup2.devices.allow: c 195:2 rwm\nlxc.cgroup2.devices.allow: c 195:255 rwm\n", True, [2], [], 2),
    ("lxc.cgroup.devices.allow: c 195:4 rw\nlxc.cgroup.devices.allow: c 195:254 rwm\n", True, [4], [], 2),
    # Only control nodes: passthrough, no GPU
    ("lxc.cgroup2.devices.allow: c 195:255 rwm\n" + CONTROL_MOUNTS, True, [], [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"], 5),
    # Other devices are no NVIDIA passthrough (a DRI node, tun, a dynamic major alone)
    ("lxc.cgroup2.devices.allow: c 226:* rwm\nlxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir\n"
     "lxc.cgroup2.devices.allow: c 10:200 rwm\nlxc.cgroup2.devices.allow: c 509:* rwm\ndev0: /dev/dri/renderD128\n",
     False, [], [], 0),
    # Nothing at all
    ("", False, [], [], 0),
    # A snapshot section: its lines are not the container's
    ("parent: before-upgrade\ndev0: /dev/nvidia1\n[before-upgrade]\ndev0: /dev/nvidia7\n"
     "lxc.cgroup2.devices.allow: c 195:* rwm\n", True, [1], ["/dev/nvidia1"], 1),
    ("[snap]\nlxc.cgroup2.devices.allow: c 195:* rwm\n", False, [], [], 0),
    # Comments (the description) and odd lines are skipped
    ("#dev0: /dev/nvidia3\nnot a key value line\ndev0: /dev/nvidia2\n", True, [2], ["/dev/nvidia2"], 1),
])
def test_parse_config(text, passthrough, minors, devices, nlines):
    parsed = _pct.parse_config(CONFIG_HEAD + text)
    assert parsed["hostname"] == "gpu-ct"
    assert (parsed["passthrough"], parsed["minors"], parsed["devices"]) == (passthrough, minors, devices)
    assert len(parsed["lines"]) == nlines
    assert all(line.split(":", 1)[0] in text for line in parsed["lines"])


def test_parse_config_lines_are_as_printed():
    parsed = _pct.parse_config("dev1: path=/dev/nvidia3,mode=0666\nlxc.cgroup2.devices.allow: c 195:* rwm\n")
    assert parsed["lines"] == ["dev1: path=/dev/nvidia3,mode=0666", "lxc.cgroup2.devices.allow: c 195:* rwm"]
    assert parsed["minors"] == [3] and parsed["hostname"] is None


@pytest.mark.parametrize("rows, expected", [
    ([], {}),
    ([("129", "running", "", "gpu-ct")], {129: {"status": "running", "lock": "", "name": "gpu-ct"}}),
    ([("129", "running", "", "gpu-ct"), ("130", "stopped", "backup", "gpu-ct2")],
     {129: {"status": "running", "lock": "", "name": "gpu-ct"}, 130: {"status": "stopped", "lock": "backup", "name": "gpu-ct2"}}),
    ([("131", "stopped", "migrate", "")], {131: {"status": "stopped", "lock": "migrate", "name": ""}}),
    ([("132", "running", "", "")], {132: {"status": "running", "lock": "", "name": ""}}),
    ([("999999999", "running", "snapshot-delete", "a-very-long-container-name")],
     {999999999: {"status": "running", "lock": "snapshot-delete", "name": "a-very-long-container-name"}}),
])
def test_parse_list(rows, expected):
    # What pct prints: nothing at all without containers, else the header and one row each (trailing blanks).
    text = "".join(FMT % r + "\n" for r in rows)
    if rows:
        text = HEADER + "\n" + text
    assert _pct.parse_list(text) == expected


@pytest.mark.parametrize("text", ["VMID Status Lock Name\nabc running\n", "VMID Status\n129\n",
                                  "129 running backup name extra\n"])
def test_parse_list_refuses_what_it_cannot_read(text):
    with pytest.raises(ValueError, match="pct list"):
        _pct.parse_list(text)


@pytest.mark.parametrize("values, expected", [
    ([], []),
    (["sglang"], ["sglang"]),
    ("sglang.service,vllm@0.service", ["sglang.service", "vllm@0.service"]),
    (["a.service", "b:c", "x_y-z", "esc\\x2dd.mount", "a.service"], ["a.service", "b:c", "x_y-z", "esc\\x2dd.mount"]),
])
def test_validate_units(values, expected):
    assert _pct.validate_units(values) == expected


@pytest.mark.parametrize("bad", ["-sglang", "--now", "sg lang", "a;b", "$(reboot)", "", "x" * 256, "s\u00e9rvice",
                                 "a/b", 5])
def test_validate_units_names_the_bad_one(bad):
    with pytest.raises(InvalidOption) as info:
        _pct.validate_units(["ok.service", bad])
    assert str(info.value).startswith(f"services: {bad!r} is not a systemd unit name")
    assert info.value.details["option"] == "services"


@pytest.mark.parametrize("minors, gpu_minors, expected", [
    (None, {0: 0}, (None, [])),
    ([], {0: 0}, ([], [])),
    ([0, 5], {0: 0, 5: 5}, ([0, 5], [])),
    ([64, 65], {64: 0, 65: 1, 66: 2}, ([0, 1], [])),
    ([0, 7], {0: 0, 1: 1}, ([0], [7])),
    ([3], {}, ([], [3])),
])
def test_gpus_of(minors, gpu_minors, expected):
    assert _pct.gpus_of(minors, gpu_minors) == expected


@pytest.mark.parametrize("stdout, expected", [
    ("active\n", ("active", True)),
    ("activating\n", ("activating", True)),
    ("deactivating\n", ("deactivating", True)),
    ("reloading\n", ("reloading", True)),
    ("refreshing\n", ("refreshing", True)),
    ("inactive\n", ("inactive", False)),
    ("failed\n", ("failed", False)),
    ("maintenance\n", ("maintenance", False)),
    ("unknown\n", ("unknown", False)),
    ("", (None, False)),
    ("\n", (None, False)),
])
def test_parse_is_active(stdout, expected):
    assert _pct.parse_is_active(stdout) == expected


def test_parse_config_reads_the_equals_form_of_raw_lxc_keys():
    """pct.conf(5): a raw LXC key takes "key: value" or "key = value" (parse_pct_config accepts both)."""
    text = CONFIG_HEAD + ("lxc.cgroup2.devices.allow = c 195:1 rwm\n"
                          "lxc.mount.entry = /dev/nvidia1 dev/nvidia1 none bind,optional,create=file\n")
    cfg = _pct.parse_config(text)
    assert cfg["minors"] == [1] and cfg["devices"] == ["/dev/nvidia1"]
    assert cfg["lines"] == ["lxc.cgroup2.devices.allow: c 195:1 rwm",
                            "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file"]


def test_parse_config_stops_at_the_pending_section_of_a_raw_config_file():
    text = CONFIG_HEAD + "dev0: /dev/nvidia0\n\n[pve:pending]\ndelete: dev0\n\n[before-upgrade]\ndev0: /dev/nvidia3\n"
    assert _pct.parse_config(text)["minors"] == [0]


PENDING_CASES = [
    # (pct config --current, pct config (pending applied), expected change)
    ("same", "dev0: /dev/nvidia0\n", "dev0: /dev/nvidia0\n", None),
    ("pending delete: dev0", "dev0: /dev/nvidia0\ndev1: /dev/nvidiactl\n", "dev1: /dev/nvidiactl\n",
     {"removed": ["dev0: /dev/nvidia0"], "added": [], "minors": []}),
    ("pending dev0 on another GPU", "dev0: /dev/nvidia0\n", "dev0: /dev/nvidia1\n",
     {"removed": ["dev0: /dev/nvidia0"], "added": ["dev0: /dev/nvidia1"], "minors": [1]}),
    ("pending GPU added to a container without one", "", "dev0: /dev/nvidia2,mode=0666\n",
     {"removed": [], "added": ["dev0: /dev/nvidia2,mode=0666"], "minors": [2]}),
    ("pending change elsewhere", "dev0: /dev/nvidia0\n", "dev0: /dev/nvidia0\ncores: 16\n", None),
]


@pytest.mark.parametrize("name, current, pending, expected", PENDING_CASES, ids=[c[0] for c in PENDING_CASES])
def test_passthrough_changes(name, current, pending, expected):
    now = _pct.parse_config(CONFIG_HEAD + current)
    later = _pct.parse_config(CONFIG_HEAD + pending)
    assert _pct.passthrough_changes(now, later) == expected


# --- the node's files: /etc/pve/lxc/<vmid>.conf, .vmlist, the LXC monitors' sockets -------------------------------

# A file as pve-container's write_pct_config writes it: the description as "#" lines, the keys, the raw lxc.* entries,
# then [pve:pending] (pending values, "delete: a,b") and each snapshot.
FILE = """#GPU%20server
#line%3A two
arch: amd64
dev0: /dev/nvidia0
dev1: path=/dev/nvidia1,mode=0666
hostname: gpu-ct
lock: backup
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.mount.entry = /dev/nvidia2 dev/nvidia2 none bind,optional,create=file

[pve:pending]
dev1: /dev/nvidia3
hostname: renamed
lxc.mount.entry: /dev/nvidia4 dev/nvidia4 none bind,optional,create=file
delete: dev0,!lock;swap

[Before-Upgrade]
dev0: /dev/nvidia7
snaptime: 1700000000
"""


@pytest.mark.parametrize("text, keys, lxc, pending, delete, snapshots", [
    (FILE,
     {"arch": "amd64", "dev0": "/dev/nvidia0", "dev1": "path=/dev/nvidia1,mode=0666", "hostname": "gpu-ct", "lock": "backup"},
     [("lxc.cgroup2.devices.allow", "c 195:* rwm"), ("lxc.mount.entry", "/dev/nvidia2 dev/nvidia2 none bind,optional,create=file")],
     {"dev1": "/dev/nvidia3", "hostname": "renamed"}, ["dev0", "lock", "swap"],
     {"Before-Upgrade": {"dev0": "/dev/nvidia7", "snaptime": "1700000000"}}),
    # no sections at all; blank lines and a line that is nothing PVE knows are skipped
    ("\n\nhostname: a\n  \nnot a line\n", {"hostname": "a"}, [], {}, [], {}),
    # delete outside [pve:pending] is not a deletion (PVE: "only allowed in [pve:pending]")
    ("hostname: a\ndelete: hostname\n", {"hostname": "a"}, [], {}, [], {}),
    # [PVE:PENDING] in any case; a delete line with blanks only between the keys
    ("dev0: /dev/nvidia0\n[PVE:PENDING]\ndelete: dev0 dev1\n", {"dev0": "/dev/nvidia0"}, [], {}, ["dev0", "dev1"], {}),
    ("", {}, [], {}, [], {}),
])
def test_parse_conf_file(text, keys, lxc, pending, delete, snapshots):
    conf = _pct.parse_conf_file(text)
    assert (conf["keys"], conf["lxc"], conf["pending"], conf["delete"], conf["snapshots"]) == (keys, lxc, pending, delete, snapshots)


@pytest.mark.parametrize("current, printed", [
    # pct config --current 1: as it runs (sorted keys, no description, then the raw lxc entries in file order)
    (True, ["arch: amd64", "dev0: /dev/nvidia0", "dev1: path=/dev/nvidia1,mode=0666", "hostname: gpu-ct", "lock: backup",
            "lxc.cgroup2.devices.allow: c 195:* rwm",
            "lxc.mount.entry: /dev/nvidia2 dev/nvidia2 none bind,optional,create=file"]),
    # pct config: pending values applied, pending deletions removed; pending lxc entries never shown
    (False, ["arch: amd64", "dev1: /dev/nvidia3", "hostname: renamed",
             "lxc.cgroup2.devices.allow: c 195:* rwm",
             "lxc.mount.entry: /dev/nvidia2 dev/nvidia2 none bind,optional,create=file"]),
])
def test_config_view_is_what_pct_config_prints(current, printed):
    assert _pct.config_view(_pct.parse_conf_file(FILE), current).splitlines() == printed


def test_the_views_give_the_passthrough_as_it_runs_and_as_it_will():
    conf = _pct.parse_conf_file(FILE)
    now, then = (_pct.parse_config(_pct.config_view(conf, c)) for c in (True, False))
    assert (now["minors"], then["minors"]) == ([0, 1, 2], [2, 3])
    assert _pct.passthrough_changes(now, then) == {"removed": ["dev0: /dev/nvidia0", "dev1: path=/dev/nvidia1,mode=0666"],
                                                   "added": ["dev1: /dev/nvidia3"], "minors": [2, 3]}
    assert _pct.list_row(129, _pct.config_keys(conf, True), True) == {"status": "running", "lock": "backup", "name": "gpu-ct"}
    assert _pct.list_row(130, {}, False) == {"status": "stopped", "lock": "", "name": "CT130"}


# pmxcfs' .vmlist (pve-cluster src/pmxcfs/status.c cfs_create_vmlist_msg), byte for byte as it prints it
VMLIST = ('{\n"version": 7,\n"ids": {\n"129": { "node": "pve1", "type": "lxc", "version": 3 },\n'
          '"200": { "node": "pve1", "type": "qemu", "version": 5 },\n"130": { "node": "pve2", "type": "lxc", "version": 4 },\n'
          '"101": { "node": "pve1", "type": "lxc", "version": 6 }}\n\n}\n')


@pytest.mark.parametrize("text, node, expected", [
    (VMLIST, "pve1", [101, 129]),          # this node's containers only: not the VM, not another node's container
    (VMLIST, "pve2", [130]),
    (VMLIST, "pve3", []),
    ('{\n"version": 1\n\n}\n', "pve1", []),  # no guest in the cluster: no "ids" at all
])
def test_node_containers(text, node, expected):
    assert _pct.node_containers(text, node) == expected


@pytest.mark.parametrize("text", ["", "{", "[]", '{"version": 1, "ids": []}'])
def test_node_containers_refuses_what_is_not_a_vmlist(text):
    with pytest.raises(_errors.UnreadableOutput, match="/etc/pve/.vmlist: (not JSON|no JSON object with ids)"):
        _pct.node_containers(text, "pve1")


LONG = "/tmp/" + "x" * 100


@pytest.mark.parametrize("lxcpath, vmid, name", [
    ("/var/lib/lxc", 129, "@/var/lib/lxc/129/command"),       # PVE's (list_active_containers' pattern)
    # too long for sun_path: liblxc hashes "<lxcpath>/<name>" (FNV-1a 64)
    (LONG, 129, "@lxc/%016x/command" % _pct._fnv64a(f"{LONG}/129".encode())),
])
def test_command_socket(lxcpath, vmid, name):
    assert _pct.command_socket(lxcpath, vmid) == name


def test_fnv64a_is_fnv1a():
    # FNV-1a 64 test vectors (Fowler/Noll/Vo, http://www.isthe.com/chongo/src/fnv/test_fnv.c)
    assert (_pct._fnv64a(b""), _pct._fnv64a(b"a"), _pct._fnv64a(b"foobar")) == \
        (0xcbf29ce484222325, 0xaf63dc4c8601ec8c, 0x85944171f73967e8)


UNIX = """Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 27861 @/var/lib/lxc/129/command
0000000000000000: 00000002 00000000 00010000 0001 01 27862 @/var/lib/lxc/1290/command
0000000000000000: 00000003 00000000 00000000 0001 03 27863
0000000000000000: 00000002 00000000 00010000 0001 01 27864 /run/lxc/131/command
"""


def test_active_vmids():
    # 129 runs; 1290's socket is not 130's; 131's is not abstract; 132 has none
    assert _pct.active_vmids(UNIX, "/var/lib/lxc", [129, 130, 131, 132]) == {129}


HOOK = "lxc.hook.mount: /usr/share/lxc/hooks/nvidia\n"


@pytest.mark.parametrize("text, passthrough, minors, visible, unknown", [
    # The NVIDIA container toolkit's hook: NVIDIA_VISIBLE_DEVICES decides (lxc's hooks/nvidia; the toolkit's docs)
    (HOOK + "lxc.environment: NVIDIA_VISIBLE_DEVICES=0,1\nlxc.environment: NVIDIA_DRIVER_CAPABILITIES=compute,utility\n",
     True, [], [0, 1], []),
    ("lxc.hook.mount = /usr/share/lxc/hooks/nvidia\nlxc.environment = NVIDIA_VISIBLE_DEVICES=all\n", True, None, "all", []),
    (HOOK + "lxc.environment: NVIDIA_VISIBLE_DEVICES=GPU-fef8089b,3\n", True, [], ["GPU-fef8089b", 3], []),
    (HOOK + "lxc.environment: NVIDIA_VISIBLE_DEVICES=none\n", True, [], [], []),       # control nodes, no GPU
    (HOOK + "lxc.environment: NVIDIA_VISIBLE_DEVICES=void\n", False, [], None, []),    # the hook exits at once
    (HOOK + "lxc.environment: NVIDIA_VISIBLE_DEVICES=\n", False, [], None, []),
    # the last value counts; a legacy CUDA image (CUDA_VERSION, no NVIDIA_REQUIRE_CUDA) gets every GPU
    (HOOK + "lxc.environment: NVIDIA_VISIBLE_DEVICES=all\nlxc.environment: NVIDIA_VISIBLE_DEVICES=2\n", True, [], [2], []),
    (HOOK + "lxc.environment: CUDA_VERSION=12.4.1\n", True, None, "all", []),
    # with the hook's GPUs, the cgroup and mount lines still count
    (HOOK + "lxc.environment: NVIDIA_VISIBLE_DEVICES=1\ndev0: /dev/nvidia4\n", True, [4], [1], []),
    # the hook with no readable NVIDIA_VISIBLE_DEVICES, or used as another kind of hook: unknown
    (HOOK, None, [], None, ["lxc.hook.mount: /usr/share/lxc/hooks/nvidia"]),
    (HOOK + "lxc.environment: NVIDIA_VISIBLE_DEVICES\n", None, [], None, ["lxc.hook.mount: /usr/share/lxc/hooks/nvidia"]),
    ("lxc.hook.pre-start: /usr/share/lxc/hooks/nvidia\nlxc.environment: NVIDIA_VISIBLE_DEVICES=0\n", None, [], None,
     ["lxc.hook.pre-start: /usr/share/lxc/hooks/nvidia"]),
    # An environment without the hook passes nothing
    ("lxc.environment: NVIDIA_VISIBLE_DEVICES=all\n", False, [], None, []),
    # A bind of the node's whole /dev: every GPU, whatever else is there
    ("lxc.mount.entry: /dev dev none bind,optional,create=dir\n", True, None, None, []),
    ("lxc.mount.entry: /dev/ dev none rbind,create=dir 0 0\ndev0: /dev/nvidia2\n", True, None, None, []),
    ("lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir\n", False, [], None, []),
    # Hooks and files that cannot be read: unknown, beside what the other lines say
    ("lxc.hook.autodev: /var/lib/lxc/129/gpu.sh\n", None, [], None, ["lxc.hook.autodev: /var/lib/lxc/129/gpu.sh"]),
    ("lxc.include: /etc/pve/gpu.conf\ndev0: /dev/nvidia1\n", True, [1], None, ["lxc.include: /etc/pve/gpu.conf"]),
    ("lxc.mount.fstab: /etc/lxc/gpu.fstab\n", None, [], None, ["lxc.mount.fstab: /etc/lxc/gpu.fstab"]),
    # LXC's own configs, and the hooks that run after the container stops, pass nothing
    ("lxc.include: /usr/share/lxc/config/nesting.conf\nlxc.hook.post-stop: /usr/local/bin/cleanup\n"
     "lxc.hook.version: 1\n", False, [], None, []),
])
def test_parse_config_hooks_and_dev_binds(text, passthrough, minors, visible, unknown):
    parsed = _pct.parse_config(CONFIG_HEAD + text)
    assert (parsed["passthrough"], parsed["minors"], parsed["visible"], parsed["unknown"]) == \
        (passthrough, minors, visible, unknown)
    if visible is not None:  # the hook's lines are passthrough lines (a pending change to them is seen)
        assert HOOK.strip() in parsed["lines"] or parsed["lines"][0].startswith("lxc.hook.mount")


NODE = [{"index": i, "uuid": f"GPU-{i}aaaaaaa-{i}000-0000-0000-00000000000{i}", "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0"}
        for i in range(4)]


@pytest.mark.parametrize("ids, indexes, unmatched", [
    ("all", [0, 1, 2, 3], []),
    ([2, 0], [0, 2], []),
    (["GPU-1aaaaaaa-1000-0000-0000-000000000001"], [1], []),
    (["gpu-3AAAAAAA"], [3], []),                    # a unique prefix, any case
    (["0000:1a:00.0"], [2], []),                    # a PCI bus id, short form
    (["GPU-"], [], ["GPU-"]),                       # a prefix of every GPU: none
    ([7, "GPU-ffffffff"], [], [7, "GPU-ffffffff"]),
    (["MIG-5c2e5ac4-bd5b-5b7a-a6d6-4e2f1e8ca3b5"], [], ["MIG-5c2e5ac4-bd5b-5b7a-a6d6-4e2f1e8ca3b5"]),
    ([], [], []),
])
def test_visible_gpus(ids, indexes, unmatched):
    assert _pct.visible_gpus(ids, NODE) == (indexes, unmatched)
