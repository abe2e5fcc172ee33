"""Machine-wide reservation of container ids.

A container's cgroup is ``/lxc/<vmid>`` (pve-container's layout), one per machine: two simulators
(two test runs, two sessions) must never start the same vmid.  ``reserve`` writes
``/run/gpusim/vmids/<vmid>`` (``/tmp/gpusim-vmids`` where /run is not writable):

    owner <real path of the scenario directory>
    holder <pid> <starttime>      the scenario's driver daemon, else the process that reserved it

under one machine-wide flock.  A reservation is stale (and taken over) when its scenario has no
config for the vmid any more, or when its holder is gone and no process is in ``lxc/<vmid>``.  A vmid
reserved by a live simulator of another process is waited for (``VMID_WAIT_S``), then refused with a
message naming it; one reserved by another simulated host of this same process is refused at once.

Stdlib only.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import time
from typing import Dict, Iterator, List, Optional

from . import proctools

VMID_WAIT_S = float(os.environ.get("GPUSIM_VMID_WAIT_S", "600"))


def base_dir() -> str:
    for d in ("/run/gpusim/vmids", "/tmp/gpusim-vmids"):
        try:
            os.makedirs(d, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
        except OSError:
            continue
    raise OSError("cannot create /run/gpusim/vmids nor /tmp/gpusim-vmids")


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    with open(os.path.join(base_dir(), ".lock"), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _path(vmid: int) -> str:
    return os.path.join(base_dir(), str(int(vmid)))


def _read(vmid: int) -> Dict[str, str]:
    out: Dict[str, str] = {}
    try:
        with open(_path(vmid), encoding="utf-8") as f:
            for line in f:
                k, _sep, v = line.rstrip("\n").partition(" ")
                out[k] = v
    except OSError:
        pass
    return out


def owner(vmid: int) -> Optional[str]:
    return _read(vmid).get("owner") or None


def _starttime(pid: int) -> Optional[int]:
    st = proctools.read_stat(pid)
    return None if st is None or st[0] in ("Z", "X", "x") else st[1]


def _holder(simdir: str) -> str:
    """The scenario's driver daemon when it runs, else this process."""
    try:
        with open(os.path.join(simdir, "run", "driver.pid"), encoding="utf-8") as f:
            pid = int(f.read().split()[0])
        st = _starttime(pid)
        if st is not None:
            return f"{pid} {st}"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.getpid()} {_starttime(os.getpid())}"


def _populated(vmid: int) -> bool:
    from . import cgroups  # noqa: PLC0415
    for root in cgroups.hierarchies():
        if cgroups.procs(os.path.join(root, "lxc", str(vmid)), recursive=True):
            return True
    return False


def _ours(rec: Dict[str, str]) -> bool:
    """Is the holder this process or a child of it (another simulated host of this very process,
    whose reservation waiting cannot outlive)?"""
    words = rec.get("holder", "").split()
    if len(words) != 2 or not words[0].isdigit():
        return False
    pid = int(words[0])
    if pid == os.getpid():
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2:].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def _stale(rec: Dict[str, str], vmid: int) -> bool:
    own = rec.get("owner", "")
    # The scenario's PVE config of the container: DIR/etc/pve/nodes/<node>/lxc/<vmid>.conf (gpusimkit.container
    # config_path), or DIR/ct/<vmid>/config (a link to it; where earlier simulators kept it: a simulator of another
    # checkout on this machine may hold a vmid with that layout, and its reservation is live).
    if not own or not (os.path.isfile(os.path.join(own, "ct", str(vmid), "config")) or glob.glob(
            os.path.join(glob.escape(own), "etc", "pve", "nodes", "*", "lxc", f"{vmid}.conf"))):
        return True
    words = rec.get("holder", "").split()
    holder_alive = len(words) == 2 and words[0].isdigit() and words[1].isdigit() \
        and _starttime(int(words[0])) == int(words[1])
    return not holder_alive and not _populated(vmid)


def reserve(simdir: str, vmid: int, wait: Optional[float] = None) -> None:
    """Reserve ``vmid`` for the scenario in ``simdir`` (no-op when it is already its own)."""
    me = os.path.realpath(simdir)
    deadline = time.monotonic() + (VMID_WAIT_S if wait is None else wait)
    while True:
        with machine_lock():
            rec = _read(vmid)
            if not rec or rec.get("owner") == me or _stale(rec, vmid):
                tmp = f"{_path(vmid)}.tmp.{os.getpid()}"
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(f"owner {me}\nholder {_holder(me)}\n")
                os.replace(tmp, _path(vmid))
                return
        if _ours(rec) or time.monotonic() >= deadline:
            from .container import ContainerError  # noqa: PLC0415
            waited = "" if _ours(rec) else f"; waited {VMID_WAIT_S if wait is None else wait:g} s"
            raise ContainerError(f"vmid {vmid} is in use by another simulator on this machine ({rec.get('owner')}): "
                                 f"the cgroup /lxc/{vmid} is one per machine{waited}")
        time.sleep(0.2)


def release(simdir: str, vmid: int) -> None:
    me = os.path.realpath(simdir)
    with machine_lock():
        if _read(vmid).get("owner") == me:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_path(vmid))


def reserved_by(simdir: str) -> List[int]:
    me = os.path.realpath(simdir)
    try:
        names = os.listdir(base_dir())
    except OSError:
        return []
    return sorted(int(n) for n in names if re.fullmatch(r"\d+", n) and _read(int(n)).get("owner") == me)
