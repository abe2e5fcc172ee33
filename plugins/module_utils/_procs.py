# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""Pure parsers for /proc: process identity, status, and the Proxmox container a process lives in.

Command lines are redacted where they are read (read_process, through _redact).

Nothing here reads files or imports AnsibleModule: callers pass the text they read, so every
rule is testable with table-driven unit tests.
"""

from __future__ import annotations

import re
from collections import namedtuple

from ansible_collections.gpuops.gpu.plugins.module_utils._redact import redact_argv

ProcStat = namedtuple("ProcStat", ["pid", "comm", "state", "ppid", "pgrp", "session", "tty_nr", "starttime"])

# Proxmox VE >= 6.2 puts a container's payload under /lxc/<vmid>/ns/...; plain LXC 4+ uses
# lxc.payload.<name>. The monitor (lxc.monitor/<vmid>, lxc.monitor.<name>) is not the payload.
_LXC_CGROUP = re.compile(r"(?:^|/)lxc(?:/|\.payload\.)(\d+)(?:/|$)")


def parse_stat(text: str) -> ProcStat:
    """Parse /proc/<pid>/stat.

    ``comm`` (field 2) is in parentheses, is at most 15 characters long and may itself contain
    spaces and ')', so the line is split at the LAST ')'. After that split the remaining tokens
    start at field 3 (state); field 22 (starttime, clock ticks since boot) is then rest[19].
    Raises ValueError on a malformed line.
    """
    text = text.strip()
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren < 1 or close_paren < open_paren:
        raise ValueError(f"malformed /proc/<pid>/stat line: {text[:80]!r}")
    pid = int(text[:open_paren].strip())
    comm = text[open_paren + 1:close_paren]
    rest = text[close_paren + 1:].split()
    if len(rest) < 20:
        raise ValueError(f"malformed /proc/<pid>/stat line (only {len(rest) + 2} fields): {text[:80]!r}")
    return ProcStat(
        pid=pid,
        comm=comm,
        state=rest[0],
        ppid=int(rest[1]),
        pgrp=int(rest[2]),
        session=int(rest[3]),
        tty_nr=int(rest[4]),
        starttime=int(rest[19]),
    )


def parse_status(text: str) -> dict:
    """Parse /proc/<pid>/status into a dict of the fields this collection uses.

    Returns ``name``, ``state`` (the letter), ``ppid``, ``uid`` (real uid) and ``nspid`` (the
    list of pids from the outermost PID namespace visible to the reader to the process's own).
    Missing fields are None (``nspid``: [] on kernels before 4.1).
    """
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.strip()
    uid = fields.get("Uid")
    ppid = fields.get("PPid")
    state = fields.get("State")
    nspid = fields.get("NSpid")
    return {
        "name": fields.get("Name"),
        "state": state.split()[0] if state else None,
        "ppid": int(ppid) if ppid else None,
        "uid": int(uid.split()[0]) if uid else None,
        "nspid": [int(p) for p in nspid.split()] if nspid else [],
    }


def container_from_cgroup(text: str):
    """The Proxmox/LXC container id that a /proc/<pid>/cgroup text places the process in.

    Works for cgroup v2 (``0::/lxc/129/ns/init.scope``), v1 and hybrid (one line per hierarchy,
    ``4:memory:/lxc/129/ns``) and plain LXC (``0::/lxc.payload.129``). Returns the vmid as an
    int, or None for a process that is not in a container (the LXC monitor included).
    """
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        match = _LXC_CGROUP.search(parts[2])
        if match:
            return int(match.group(1))
    return None


def cgroup_path(text: str):
    """The cgroup v2 path of a /proc/<pid>/cgroup text (the ``0::`` line), else the first path."""
    first = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            return parts[2]
        if first is None:
            first = parts[2]
    return first


def container_marker(init_environ: bytes, systemd_container) -> bool:
    """Whether PID 1's environment (``container=lxc``, as LXC and PVE set it) or systemd's
    /run/systemd/container say that this is a container."""
    if systemd_container:
        return True
    return any(item.startswith(b"container=") and len(item) > len(b"container=")
               for item in (init_environ or b"").split(b"\0"))


def in_container(proc: str = "/proc") -> bool:
    """Whether this process runs inside a container (see container_marker); False when unreadable."""
    return container_marker(_read(f"{proc}/1/environ", "rb") or b"",
                            (_read("/run/systemd/container") or "").strip())


def unit_from_cgroup(path):
    """The systemd unit a cgroup v2 path places a process in, or None for a session or none.

    ``/lxc/129/ns/system.slice/sglang.service`` (a unit inside a container, PVE's layout) and
    ``/system.slice/vllm.service`` give the ``.service``; a sub-cgroup of a unit (``Delegate=``)
    gives its unit; login sessions (``session-4.scope``), ``init.scope`` and the container's
    own ``ns``/``.lxc`` leaves give None.
    """
    for part in reversed((path or "").split("/")):
        if part.endswith(".service"):
            return part
        if part.endswith(".scope") and not part.startswith("session-") and part != "init.scope":
            return part
        if part.endswith(".slice") or part == "ns" or part.startswith("lxc"):
            return None
    return None


def read_exe(pid: int, proc: str = "/proc"):
    """The executable of a process (readlink /proc/<pid>/exe), or None; read only where a rule needs it."""
    import os

    try:
        target = os.readlink(f"{proc}/{pid}/exe")
    except OSError:
        return None
    return target[:-len(" (deleted)")] if target.endswith(" (deleted)") else target


def is_kernel_thread(stat: ProcStat, cmdline: bytes) -> bool:
    """Kernel threads have an empty cmdline and are children of kthreadd (pid 2), or are pid 2."""
    return stat.pid == 2 or (stat.ppid in (0, 2) and not cmdline and stat.pid != 1)


def split_cmdline(raw: bytes) -> list:
    """/proc/<pid>/cmdline (NUL-separated, usually NUL-terminated) as a list of strings."""
    if not raw:
        return []
    return [part.decode("utf-8", "replace") for part in raw.rstrip(b"\0").split(b"\0")]


# --- reading /proc (thin I/O over the parsers above) ---------------------------------------

def _read(path: str, mode: str = "r"):
    try:
        with open(path, mode) as f:  # pylint: disable=unspecified-encoding
            return f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    except OSError:
        return None


def read_identity(pid: int, proc: str = "/proc"):
    """(pid, starttime) of a live process, or None when it is gone or a zombie.

    A leader in state Z whose other threads still run is alive: only its main thread exited.
    """
    text = _read(f"{proc}/{pid}/stat")
    if text is None:
        return None
    try:
        st = parse_stat(text)
    except ValueError:
        return None
    if st.state in ("Z", "X") and not _thread_fd_dirs(proc, str(pid)):
        return None
    return (st.pid, st.starttime)


def process_state(pid: int, proc: str = "/proc"):
    """The state letter of a process (R, S, D, Z, ...), or None when it is gone."""
    text = _read(f"{proc}/{pid}/stat")
    try:
        return parse_stat(text).state if text else None
    except ValueError:
        return None


_USERS = {}


def user_name(uid):
    if uid is None:
        return None
    if uid not in _USERS:
        try:
            import pwd
            _USERS[uid] = pwd.getpwuid(uid).pw_name
        except (KeyError, ImportError):
            _USERS[uid] = str(uid)
    return _USERS[uid]


def read_process(pid: int, proc: str = "/proc", cmdline=None):
    """Everything the collection reports about one process, or None when it does not exist here.

    Keys: pid, name, cmdline, user, uid, ppid, state, start_time (clock ticks since boot: with the
    pid, the process's identity), container ({kind, id, pid_in_container} or None).
    ``cmdline(argv) -> text`` makes the ``cmdline`` value from the argv list; by default it is
    redacted and cut (_redact.redact_argv), so that no secret leaves this function.
    """
    stat_text = _read(f"{proc}/{pid}/stat")
    if stat_text is None:
        return None
    try:
        st = parse_stat(stat_text)
    except ValueError:
        return None
    status = parse_status(_read(f"{proc}/{pid}/status") or "")
    raw_cmdline = _read(f"{proc}/{pid}/cmdline", "rb") or b""
    cgroup_text = _read(f"{proc}/{pid}/cgroup") or ""
    vmid = container_from_cgroup(cgroup_text)
    container = None
    if vmid is not None:
        nspid = status["nspid"]
        # NSpid lists the pid in each PID namespace from the reader's down to the process's own: from
        # the host, [host, container, (nested: a Docker inside the container), ...]. The pid in the
        # Proxmox container is the level below the host's, whatever is nested inside.
        container = {"kind": "lxc", "id": vmid, "pid_in_container": nspid[1] if len(nspid) > 1 else None}
    return {
        "pid": st.pid,
        "name": st.comm,
        "cmdline": (cmdline or redact_argv)(split_cmdline(raw_cmdline)),
        "user": user_name(status["uid"]),
        "uid": status["uid"],
        "ppid": st.ppid,
        "state": st.state,
        "start_time": st.starttime,
        "container": container,
        "unit": unit_from_cgroup(cgroup_path(cgroup_text)),
        "kernel_thread": is_kernel_thread(st, raw_cmdline),
        # Internal (never reported): what the workload-root walk of gpu_release compares.
        "session": st.session,
        "pgrp": st.pgrp,
        "tty_nr": st.tty_nr,
        "cgroup": cgroup_path(cgroup_text),
        "ns_pid": status["nspid"][-1] if status["nspid"] else st.pid,
    }


def device_file_index(path: str):
    """GPU index owned by a device file name: nvidiaN -> N (minor number); None = all GPUs."""
    m = re.search(r"nvidia(\d+)$", path)
    return int(m.group(1)) if m else None


def _literal_prefix(pattern: str) -> str:
    cut = len(pattern)
    for ch in "*?[":
        pos = pattern.find(ch)
        if pos != -1:
            cut = min(cut, pos)
    return pattern[:cut]


def scan_fd_holders(patterns, proc: str = "/proc", exclude_pids=()):
    """Which processes hold files matching the glob ``patterns`` open: {pid: sorted paths}.

    Walks /proc/<pid>/fd once and reads each link (what fuser does with a stat per fd, minus
    the cwd/exe/root/maps look-ups that device files never need). A cheap prefix test runs
    before the glob match.
    """
    import fnmatch
    import os

    prefixes = tuple(_literal_prefix(p) for p in patterns)
    exclude = set(exclude_pids)
    found = {}
    readlink = os.readlink
    try:
        entries = os.scandir(proc)
    except OSError:
        return found
    with entries:
        for entry in entries:
            name = entry.name
            if not name.isdigit():
                continue
            pid = int(name)
            if pid in exclude:
                continue
            fd_dir = f"{proc}/{name}/fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError:
                continue
            # A leader that has exited (state Z) while its other threads run has an empty fd/:
            # the file table is still reachable through those threads (it is one table for all).
            tables = [(fd_dir, fds)] if fds else [(d, None) for d in _thread_fd_dirs(proc, name)]
            for fd_dir, fds in tables:
                if fds is None:
                    try:
                        fds = os.listdir(fd_dir)
                    except OSError:
                        continue
                for fd in fds:
                    try:
                        target = readlink(f"{fd_dir}/{fd}")
                    except OSError:
                        continue
                    if not target.startswith(prefixes):
                        continue
                    if any(fnmatch.fnmatchcase(target, p) for p in patterns):
                        found.setdefault(pid, set()).add(target)
                if fds:
                    break
    return {pid: sorted(paths) for pid, paths in found.items()}


def _thread_fd_dirs(proc: str, name: str) -> list:
    """The fd/ of every thread but the leader, when the process has other threads."""
    import os

    try:
        tids = [t for t in os.listdir(f"{proc}/{name}/task") if t != name]
    except OSError:
        return []
    return [f"{proc}/{name}/task/{t}/fd" for t in tids]


def children_map(proc: str = "/proc") -> dict:
    """{ppid: [child pids]} for every process on the host (one stat read per process)."""
    import os

    out = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        text = _read(f"{proc}/{name}/stat")
        if text is None:
            continue
        try:
            st = parse_stat(text)
        except ValueError:
            continue
        out.setdefault(st.ppid, []).append(st.pid)
    return out


def ancestors(pid: int, proc: str = "/proc") -> list:
    """The chain of parent pids of ``pid`` up to (excluding) 0: the SSH session, Ansible, ..."""
    chain = []
    seen = set()
    while pid > 0 and pid not in seen:
        seen.add(pid)
        text = _read(f"{proc}/{pid}/stat")
        if text is None:
            break
        try:
            pid = parse_stat(text).ppid
        except ValueError:
            break
        if pid > 0:
            chain.append(pid)
    return chain


# The inode number of the initial PID namespace is fixed by the kernel (PROC_PID_INIT_INO,
# include/linux/proc_ns.h): a process whose /proc/self/ns/pid has it sees host pids.
PROC_PID_INIT_INO = 0xEFFFFFFC


def in_initial_pid_namespace(proc: str = "/proc"):
    """True in the host's PID namespace, False in another one, None when it cannot be told."""
    import os

    try:
        return os.stat(f"{proc}/self/ns/pid").st_ino == PROC_PID_INIT_INO
    except OSError:
        return None
