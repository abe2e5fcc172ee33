"""cgroup2 helpers and the simulator's cgroup layout (stdlib only, Python 3.9+).

The layout (paths relative to the cgroup2 mount, as ``/proc/<pid>/cgroup`` shows them on its
``0::`` line):

host (``gpusim up`` creates ``gpusim-<id>`` and its children; ``down`` removes them):

    /gpusim-<id>/init.scope                                the supervisors (systemd's own place)
    /gpusim-<id>/system.slice/<name>.service               a service's processes (the supervisor makes it)
    /gpusim-<id>/user.slice/user-0.slice/session-1.scope   every other process gpusim starts on the host

container <vmid> (LXC makes them, pve-container's layout; ``gpusim down`` removes what is left):

    /lxc/<vmid>/ns                                         the init of a busybox container
    /lxc/<vmid>/ns/init.scope                              systemd, PID 1 of a systemd container
    /lxc/<vmid>/ns/.lxc                                    commands run by lxc-attach (pct exec, spawn)
    /lxc/<vmid>/ns/system.slice/<name>.service             a unit of a systemd container
    /lxc.monitor/<vmid>                                    lxc-start's monitor process

``<id>`` is derived from the scenario directory (12 hex digits of a SHA-256), so concurrent
scenarios never share one; ``DIR/run/cgroup`` records its path and inode, and only a directory
whose inode matches the record is ever treated as this scenario's.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import time
from typing import Dict, List, Optional

RECORD = os.path.join("run", "cgroup")
SESSION = os.path.join("user.slice", "user-0.slice", "session-1.scope")
MANAGER = "init.scope"
ATTACH = ".lxc"


class CgroupError(RuntimeError):
    """A cgroup2 operation failed."""


# --- plain cgroup2 operations ---------------------------------------------------------------------

def mount() -> str:
    """The machine's cgroup2 mount point (from /proc/self/mountinfo)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                left, _sep, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return left.split()[4].replace("\\040", " ")
    except OSError as e:
        raise CgroupError(f"cannot read /proc/self/mountinfo: {e.strerror}") from e
    raise CgroupError("cgroup2 is not mounted (no cgroup2 entry in /proc/self/mountinfo)")


def hierarchies() -> List[str]:
    """Mount points of every cgroup hierarchy of the machine: the cgroup2 one and, on a hybrid or
    legacy machine, each v1 hierarchy (LXC makes a container's cgroups in each)."""
    out: List[str] = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                left, _sep, right = line.partition(" - ")
                if right.split(" ", 1)[0] in ("cgroup", "cgroup2"):
                    mp = left.split()[4].replace("\\040", " ")
                    if mp not in out:
                        out.append(mp)
    except OSError:
        pass
    return out


def rel(path: str) -> str:
    """``path`` as /proc/<pid>/cgroup shows it (relative to the cgroup2 mount, leading '/')."""
    r = os.path.relpath(path, mount())
    return "/" if r == "." else "/" + r


def ino(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def procs(path: str, recursive: bool = False) -> List[int]:
    """Pids in ``path``'s cgroup.procs (and its descendants' when ``recursive``), as the caller's
    PID namespace numbers them."""
    out: List[int] = []
    dirs = [path]
    if recursive:
        dirs = [d for d, _subdirs, _files in os.walk(path)]
    for d in dirs:
        try:
            with open(os.path.join(d, "cgroup.procs"), encoding="utf-8") as f:
                out += [int(x) for x in f.read().split() if int(x) > 0]
        except (OSError, ValueError):
            continue
    return out


def populated(path: str) -> bool:
    """Does the cgroup or a descendant hold a live process (cgroup.events ``populated``)?"""
    try:
        with open(os.path.join(path, "cgroup.events"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("populated "):
                    return line.split()[1] != "0"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    return bool(procs(path, recursive=True))


def join(path: str, pid: int = 0) -> None:
    """Move ``pid`` (0: the calling process) into the cgroup ``path``."""
    with open(os.path.join(path, "cgroup.procs"), "w", encoding="utf-8") as f:
        f.write(str(pid))


def signal_all(path: str, sig: int) -> List[int]:
    """Send ``sig`` to every process of the cgroup and its descendants (systemd's
    KillMode=control-group).  Returns the pids signalled."""
    done = []
    for pid in procs(path, recursive=True):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            done.append(pid)
    return done


def kill(path: str) -> None:
    """SIGKILL every process of the cgroup and its descendants (cgroup.kill, else one by one)."""
    if not os.path.isdir(path):
        return
    try:
        with open(os.path.join(path, "cgroup.kill"), "w", encoding="utf-8") as f:
            f.write("1")
        return
    except OSError:
        pass
    signal_all(path, signal.SIGKILL)  # kernels before 5.14


def wait_empty(path: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while populated(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _rmdir_retry(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def remove_tree(path: str, timeout: float = 5.0) -> None:
    """rmdir ``path`` and every cgroup below it, deepest first (they must hold no process)."""
    if not os.path.isdir(path):
        return
    for d, _subdirs, _files in sorted(os.walk(path), key=lambda t: -t[0].count(os.sep)):
        _rmdir_retry(d, timeout)


def clear_tree(path: str, grace: float = 3.0, timeout: float = 5.0) -> None:
    """Empty the cgroup ``path`` (wait ``grace`` s, then SIGKILL what is left) and remove it and
    its descendants.  Only for directories this scenario created."""
    if not os.path.isdir(path):
        return
    if not wait_empty(path, grace):
        kill(path)
        if not wait_empty(path, timeout):
            raise CgroupError(f"cgroup {path} still has processes after SIGKILL: {procs(path, recursive=True)}")
    remove_tree(path, timeout)


# --- the scenario's host cgroup -----------------------------------------------------------------

def host_name(simdir: str) -> str:
    return "gpusim-" + hashlib.sha256(os.path.realpath(simdir).encode()).hexdigest()[:12]


def read_record(simdir: str) -> Dict[str, str]:
    return read_record_file(os.path.join(simdir, RECORD))


def read_record_file(path: str) -> Dict[str, str]:
    """A cgroup record (``<key> <value>`` lines: the cgroup's path and inode), {} when there is none."""
    out: Dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                k, _sep, v = line.rstrip("\n").partition(" ")
                if k:
                    out[k] = v
    except OSError:
        pass
    return out


def host_base(simdir: str) -> Optional[str]:
    """``<mount>/gpusim-<id>`` when ``up`` created it for this scenario (the record's inode
    matches), else None (no cgroup: processes stay in their parent's cgroup)."""
    rec = read_record(simdir)
    path = rec.get("path")
    if not path or not rec.get("ino", "").isdigit():
        return None
    return path if ino(path) == int(rec["ino"]) else None


def make_host(simdir: str) -> Optional[str]:
    """Create this scenario's host cgroup tree and its record; None when the machine has no
    writable cgroup2 hierarchy (not root, no cgroup2): gpusim then runs without cgroups."""
    try:
        base = os.path.join(mount(), host_name(simdir))
    except CgroupError:
        return None
    if os.path.isdir(base):
        # A stale one of this very directory (a crashed run): remove it when it is empty.
        if populated(base):
            raise CgroupError(f"cgroup {base} already exists and has processes in it: "
                              f"another simulated host in {simdir}?")
        remove_tree(base)
    try:
        os.mkdir(base)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT):
            return None
        raise CgroupError(f"cannot create cgroup {base}: {e.strerror}") from e
    tmp = os.path.join(simdir, RECORD + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"path {base}\nino {ino(base)}\n")
    os.replace(tmp, os.path.join(simdir, RECORD))
    for sub in (MANAGER, "system.slice", SESSION):
        os.makedirs(os.path.join(base, sub), exist_ok=True)
    return base


def remove_host(simdir: str) -> List[str]:
    """Kill what is left in this scenario's host cgroup tree and remove it.  Returns problems."""
    base = host_base(simdir)
    if base is None:
        return []
    try:
        clear_tree(base, grace=0.0)
    except (OSError, CgroupError) as e:
        return [f"cannot remove cgroup {base}: {e}"]
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(simdir, RECORD))
    return []


# --- per scope (host or a container's vmid) -------------------------------------------------------

def scope_base(simdir: str, scope: str) -> Optional[str]:
    """The cgroup that stands for the root of the machine in ``scope`` (only ``host``: the host's
    ``gpusim-<id>``; a container's services are systemd units of the container), None when there is none."""
    if scope == "host":
        return host_base(simdir)
    return None


def service_path(base: str, name: str) -> str:
    return os.path.join(base, "system.slice", f"{name}.service")


def manager_path(base: str) -> str:
    return os.path.join(base, MANAGER)


def session_path(simdir: str) -> Optional[str]:
    """Where host-side processes that are not services go (None: no host cgroup)."""
    base = host_base(simdir)
    return os.path.join(base, SESSION) if base else None


def of_pid(pid="self") -> Optional[str]:
    """The ``0::`` path of /proc/<pid>/cgroup (None if unreadable)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].rstrip("\n")
    except OSError:
        pass
    return None
