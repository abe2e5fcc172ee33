"""Device holders by identity, not by name (_procs.scan_fd_holders): a process in a container that
holds a GPU's node bound in from another host path, at another path inside the container, is found
and released; as fuser does, a character device is also every node of its device number.

From the host, /proc/<pid>/fd/N of a container's process reads the path inside the container
(``/dev/nvidia0``, ``/dev/gpu-a``), never the simulator's ``DIR/dev/nvidia0`` that device_files names:
a match by the link's text misses every one of these holders.
"""

import os
import stat
import subprocess
import sys
import time

import pytest
from modrun import alive, gone, run_module

# vmids of this file's own (pytest-xdist runs tests in parallel; cgroups under lxc/ are machine-wide).
VMID = 5321


def procs(collection):
    """The collection's _procs, imported in this process (the scan as the modules run it)."""
    if collection not in sys.path:
        sys.path.insert(0, collection)
    from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs  # noqa: PLC0415

    return _procs


def fd_links(pid):
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
    return out


def hold_in_container(host, vmid, paths):
    """A process in the container that holds ``paths`` (paths inside it) open, from fd 3 on."""
    redirs = " ".join(f"{3 + i}<{p}" for i, p in enumerate(paths))
    pid = host.spawn(["/bin/sh", "-c", f"exec {redirs} && exec sleep 600"], ct=vmid)
    assert pid, "the holder exited at once"
    deadline = time.monotonic() + 10
    while len([fd for fd in fd_links(pid) if fd >= 3]) < len(paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


def test_a_container_node_bound_from_another_path_is_found_and_released(gpusim, collection, tmp_path):
    host = gpusim
    dev = host.path("dev")
    # GPU 0's node under another host path (a hard link: the same file), bound into the container at
    # another path (/dev/gpu-a), next to what the container's config passes through itself (the
    # simulator binds DIR/dev/nvidiaN in as /dev/nvidiaN).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.link(os.path.join(dev, "nvidia0"), elsewhere / "gpu0")
    host.ct_create(VMID, hostname="bound", gpus="0-1")
    with open(host.ct_config_path(VMID), "a", encoding="utf-8") as f:
        f.write(f"lxc.mount.entry: {elsewhere / 'gpu0'} dev/gpu-a none bind,create=file\n")
    host.ct_start(VMID)
    a = hold_in_container(host, VMID, ["/dev/gpu-a", "/dev/nvidiactl"])
    b = hold_in_container(host, VMID, ["/dev/nvidia1"])
    bystander = hold_in_container(host, VMID, ["/dev/null"])

    # What the host reads in their fd links: paths inside the container, none under DIR/dev.
    assert {fd_links(a)[3], fd_links(a)[4]} == {"/dev/gpu-a", "/dev/nvidiactl"}, fd_links(a)
    assert fd_links(b)[3] == "/dev/nvidia1", fd_links(b)

    holders = procs(collection).scan_fd_holders([dev + "/nvidia*"])
    assert holders.get(a) == [f"{dev}/nvidia0", f"{dev}/nvidiactl"], holders.get(a)
    assert holders.get(b) == [f"{dev}/nvidia1"], holders.get(b)
    assert bystander not in holders

    facts = run_module(host, collection, "gpu_facts", {"device_files": [dev + "/nvidia*"]})
    assert not facts.get("failed"), facts
    gpus = {g["index"]: g for g in facts["ansible_facts"]["gpu_devices"]}
    details = facts["ansible_facts"]["gpu_holder_processes"]  # each holder once; a GPU's holders name pids by evidence
    by_pid = {pid: evidence for evidence, pids in gpus[0]["holders"].items() for pid in pids}
    assert a in by_pid and details[str(a)]["files"] == {dev: ["nvidia0", "nvidiactl"]}, details.get(str(a))
    # a device holder with no context, the list complete: it keeps nothing busy (lingering)
    assert details[str(a)]["container"]["id"] == VMID and by_pid[a] == "lingering", (by_pid, details[str(a)])
    assert b in {pid for pids in gpus[1]["holders"].values() for pid in pids}
    assert b not in by_pid or by_pid[b] == "control"

    # Device holders with no context linger (not signalled) unless named in pids; gpu_release stops a
    # named one only when it holds a selected GPU: it must see them as holders too.
    args = {"containers": [VMID], "pids": [a, b, bystander], "device_files": [dev + "/nvidia*"], "grace_period": 5}
    res = run_module(host, collection, "gpu_release", args)
    assert not res.get("failed"), res
    assert sorted(r["pid"] for r in res["released"]) == sorted([a, b]), res
    assert gone(a) and gone(b)
    assert alive(bystander), "a process that holds no GPU node was signalled"


def test_a_character_device_is_every_node_of_its_device_number(collection, tmp_path):
    """A container's own node of the device (PVE's devN: is a mknod inside the container, another
    inode): matched by st_rdev. /dev/null stands for the GPU's node here: nvidia9 is a second node of
    it, held by nobody under that name."""
    nullst = os.stat("/dev/null")
    node = tmp_path / "nvidia9"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, nullst.st_rdev)
    except PermissionError:
        pytest.fail("mknod needs root (CAP_MKNOD), as the rest of the simulator does", pytrace=False)
    child = subprocess.Popen([sys.executable, "-c", "import time; f = open('/dev/null'); time.sleep(60)"],
                             stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while "/dev/null" not in fd_links(child.pid).values() and time.monotonic() < deadline:
            time.sleep(0.05)
        holders = procs(collection).scan_fd_holders([str(tmp_path / "nvidia*")])
        assert holders.get(child.pid) == [str(node)], holders.get(child.pid)
    finally:
        child.kill()
        child.wait()
