# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""Pure parsers for /proc: process identity, status, and the Proxmox container a process lives in.

Command lines are redacted where they are read (read_process, through _redact).

The parsers read no files and nothing here imports AnsibleModule: the rules are testable with table-driven
unit tests on the text; read_process and container_user read /proc (and a container's /etc/passwd through
/proc/<pid>/root) and hand the text to them.
"""

from __future__ import annotations

import errno
import os
import re
from collections import namedtuple
from stat import S_ISCHR, S_ISDIR, S_ISREG

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors
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
    Raises _errors.UnreadableOutput (a ValueError) on a malformed line.
    """
    text = text.strip()
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren < 1 or close_paren < open_paren:
        raise _errors.UnreadableOutput("/proc/<pid>/stat", "no (comm) in the line", text)
    comm = text[open_paren + 1:close_paren]
    rest = text[close_paren + 1:].split()
    if len(rest) < 20:
        raise _errors.UnreadableOutput("/proc/<pid>/stat", f"only {len(rest) + 2} fields", text)
    numbers = [text[:open_paren].strip()] + [rest[i] for i in (1, 2, 3, 4, 19)]
    if not all(n.lstrip("-").isdigit() and n.isascii() for n in numbers):
        raise _errors.UnreadableOutput("/proc/<pid>/stat", "pid, ppid, pgrp, session, tty_nr or starttime is not a"
                                                           " number", text)
    pid, ppid, pgrp, session, tty_nr, starttime = (int(n) for n in numbers)
    return ProcStat(pid=pid, comm=comm, state=rest[0], ppid=ppid, pgrp=pgrp, session=session, tty_nr=tty_nr,
                    starttime=starttime)


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
    uid = (fields.get("Uid") or "").split()
    ppid = fields.get("PPid")
    state = fields.get("State")
    nspid = (fields.get("NSpid") or "").split()
    if not all(n.isdigit() and n.isascii() for n in (uid[:1] + ([ppid] if ppid else []) + nspid)):
        raise _errors.UnreadableOutput("/proc/<pid>/status", "Uid, PPid or NSpid is not a number", text)
    return {
        "name": fields.get("Name"),
        "state": state.split()[0] if state else None,
        "ppid": int(ppid) if ppid else None,
        "uid": int(uid[0]) if uid else None,
        "nspid": [int(p) for p in nspid],
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

# What a read of /proc fails with when the process is there but cannot be read: no descriptor free in this process
# (EMFILE) or on the host (ENFILE), no memory, no permission. None of them means "gone" (DESIGN 5a: "cannot tell").
CANNOT_TELL = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EACCES, errno.EPERM)


def _read(path: str, mode: str = "r", strict: bool = False):
    """The text (bytes with mode "rb") of ``path``; None when it is not there. ``strict``: a read that failed for
    a reason in CANNOT_TELL raises its OSError instead (the caller must not take it for "gone")."""
    try:
        with open(path, mode) as f:  # pylint: disable=unspecified-encoding
            return f.read()
    except OSError as exc:
        if strict and exc.errno in CANNOT_TELL:
            raise
        return None


def boot_id(proc: str = "/proc"):
    """This boot's id (the kernel's, the same in its containers), or None: CLOCK_MONOTONIC (time.monotonic)
    counts from this boot, so two readings of it compare only under the same boot id."""
    text = _read(f"{proc}/sys/kernel/random/boot_id")
    return text.strip() if text else None


def read_identity(pid: int, proc: str = "/proc", strict: bool = False):
    """(pid, starttime) of a live process, or None when it is gone or a zombie.

    A leader in state Z whose other threads still run is alive: only its main thread exited. ``strict``: a stat that
    cannot be read (CANNOT_TELL: EMFILE, EACCES, ...) raises its OSError instead of reading as gone.
    """
    st = read_stat(pid, proc, strict)
    if st is None:
        return None
    if st.state in ("Z", "X") and not _thread_fd_dirs(proc, str(pid)):
        return None
    return (st.pid, st.starttime)


def process_state(pid: int, proc: str = "/proc"):
    """The state letter of a process (R, S, D, Z, ...), or None when it is gone."""
    st = read_stat(pid, proc)
    return None if st is None else st.state


def read_stat(pid: int, proc: str = "/proc", strict: bool = False):
    """/proc/<pid>/stat parsed (parse_stat), or None when the process is gone or its stat cannot be read (``strict``:
    an OSError for a read that failed for a reason in CANNOT_TELL)."""
    text = _read(f"{proc}/{pid}/stat", strict=strict)
    if text is None:
        return None
    try:
        return parse_stat(text)
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


# --- users of a container ------------------------------------------------------------------------
# A process in an unprivileged container runs as a node uid that its user namespace maps (Proxmox VE's default:
# container uid 0..65535 = node uid 100000..165535, lxc.idmap). /proc/<pid>/uid_map, read from the node, lists the
# ranges as "<inside> <outside> <count>" with outside in the node's uids (user_namespaces(7)); the container's names
# are in its own /etc/passwd, which the node reaches through /proc/<pid>/root. The node's passwd names none of them.

PASSWD_MAX_BYTES = 1 << 20


def parse_id_map(text: str) -> list:
    """/proc/<pid>/uid_map (or gid_map) as [(inside, outside, count)]; malformed lines are left out."""
    out = []
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            out.append(tuple(int(p) for p in parts))
    return out


def id_inside(ranges: list, outside_id):
    """The id inside a user namespace of ``outside_id`` (the reader's), through its map: inside + (id - outside) for
    the range that holds it; None when no range does (the kernel shows it inside as the overflow id, 65534)."""
    if outside_id is None:
        return None
    for inside, outside, count in ranges:
        if outside <= outside_id < outside + count:
            return inside + outside_id - outside
    return None


def parse_passwd(text: str) -> dict:
    """{uid: name} of an /etc/passwd text; the first entry of a uid names it, as getpwuid(3) answers."""
    out = {}
    for line in (text or "").splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[0] and not fields[0].startswith(("#", "+", "-")) and fields[2].isdigit():
            out.setdefault(int(fields[2]), fields[0])
    return out


_CT_PASSWD = {}  # (st_dev, st_ino, st_mtime_ns, st_size) of a container's /etc/passwd -> {uid: name}


def _read_root_file(root: str, parts) -> tuple:
    """(identity, text) of a regular file under another root (/proc/<pid>/root), or (None, None).

    Each component is opened below the one before with O_NOFOLLOW: a container's symlink cannot point the node at
    its own files, and a FIFO or a device is not read (O_NONBLOCK, then a regular file only); at most
    PASSWD_MAX_BYTES."""
    fds = []
    try:
        fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        for name in parts[:-1]:
            fds.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fds[-1])
        fds.append(fd)
        st = os.fstat(fd)
        if not S_ISREG(st.st_mode):
            return None, None
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        if key in _CT_PASSWD:
            return key, None
        return key, os.read(fd, PASSWD_MAX_BYTES).decode("utf-8", "replace")
    except OSError:
        return None, None
    finally:
        for fd in fds:
            os.close(fd)


def container_user(pid: int, node_uid, proc: str = "/proc") -> tuple:
    """(uid in the container, its name in the container's /etc/passwd or None) of a process in a container.

    Without a uid_map (a kernel without user namespaces) the ids are the node's. The uid is None when the map does
    not hold the node's uid."""
    text = _read(f"{proc}/{pid}/uid_map")
    inside = node_uid if text is None else id_inside(parse_id_map(text), node_uid)
    if inside is None:
        return None, None
    key, passwd = _read_root_file(f"{proc}/{pid}/root", ("etc", "passwd"))
    if key is None:
        return inside, None
    if key not in _CT_PASSWD:
        _CT_PASSWD[key] = parse_passwd(passwd)
    return inside, _CT_PASSWD[key].get(inside)


def read_process(pid: int, proc: str = "/proc", cmdline=None):
    """Everything the collection reports about one process, or None when it does not exist here.

    Keys: pid, name, cmdline, user, uid, ppid, state, start_time (clock ticks since boot: with the
    pid, the process's identity), container ({kind, id, pid_in_container, uid_in_container} or None).
    ``uid`` is the node's (as seen from here); for a process in a container ``user`` is its name in the
    container's own /etc/passwd and ``uid_in_container`` its uid there (through the container's idmap: 1000 for
    node uid 101000), the number when the container's passwd has no name for it (container_user).
    ``cmdline(argv) -> text`` makes the ``cmdline`` value from the argv list; by default it is
    redacted and cut (_redact.redact_argv), so that no secret leaves this function.
    """
    st = read_stat(pid, proc)
    if st is None:
        return None
    status = parse_status(_read(f"{proc}/{pid}/status") or "")
    raw_cmdline = _read(f"{proc}/{pid}/cmdline", "rb") or b""
    cgroup_text = _read(f"{proc}/{pid}/cgroup") or ""
    vmid = container_from_cgroup(cgroup_text)
    container = None
    user = None
    if vmid is not None:
        nspid = status["nspid"]
        # NSpid lists the pid in each PID namespace from the reader's down to the process's own: from
        # the host, [host, container, (nested: a Docker inside the container), ...]. The pid in the
        # Proxmox container is the level below the host's, whatever is nested inside.
        inside, name = container_user(pid, status["uid"], proc)
        container = {"kind": "lxc", "id": vmid, "pid_in_container": nspid[1] if len(nspid) > 1 else None,
                     "uid_in_container": inside}
        # Never the node's name for a container's uid: another user there (101000 unnamed, or a node user of uid 1000).
        user = name or str(inside if inside is not None else status["uid"])
    return {
        "pid": st.pid,
        "name": st.comm,
        "cmdline": (cmdline or redact_argv)(split_cmdline(raw_cmdline)),
        "user": user if container else user_name(status["uid"]),
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


# --- device holders, by identity ----------------------------------------------------------------
# A file's identity, as the scan compares it: (st_mode, st_ino, rdev major, rdev minor, dev major,
# dev minor), the order in which statx(2) lays them out.


def device_identities(entries) -> dict:
    """The identity index of device files: {(dev major, dev minor, ino): path, (rdev major, rdev minor): path}.

    ``entries``: (path, identity) of each file the patterns match. A file is itself wherever it is bound
    or linked (device and inode); a character device is also every node of the same device number, as a
    container's own ``mknod`` of it (PVE's ``devN:``) is. Directories (``nvidia-caps/``) hold no device.
    The first path in sorted order names an identity.
    """
    index = {}
    for path, (mode, ino, rdev_major, rdev_minor, dev_major, dev_minor) in sorted(entries):
        if S_ISDIR(mode):
            continue
        index.setdefault((dev_major, dev_minor, ino), path)
        if S_ISCHR(mode):
            index.setdefault((rdev_major, rdev_minor), path)
    return index


def identity_match(index: dict, identity):
    """The device file (its path in ``index``) that an open file of this identity is, or None."""
    mode, ino, rdev_major, rdev_minor, dev_major, dev_minor = identity
    path = index.get((dev_major, dev_minor, ino))
    if path is None and S_ISCHR(mode):
        path = index.get((rdev_major, rdev_minor))
    return path


# statx(2) (linux/fcntl.h, linux/stat.h), as fuser (psmisc) calls it: AT_STATX_DONT_SYNC, so that a file
# on NFS or FUSE (lxcfs) answers from what the kernel has, without asking its server; the mask asks only
# for the type and the inode (the device numbers always come). struct statx: stx_mode (u16) at offset 28,
# stx_ino (u64) at 32, stx_rdev_major, stx_rdev_minor, stx_dev_major, stx_dev_minor (u32 each) at 128.
_AT_FDCWD = -100
_AT_NO_AUTOMOUNT = 0x800
_AT_STATX_DONT_SYNC = 0x4000
_STATX_TYPE_INO = 0x1 | 0x100
_STATX_FIELDS = "=28xH2xQ88x4I"
_IDENTITY_OF = []


def _statx_identity():
    """path -> identity through libc's statx, or None where there is none (glibc < 2.28, kernel < 4.11).
    The function fills one buffer: one thread at a time (the modules scan from their main thread)."""
    import ctypes
    import os
    import struct

    try:
        call = ctypes.CDLL(None, use_errno=True).statx
    except (OSError, AttributeError):
        return None
    # No argtypes: ctypes converts the ints and bytes itself, at half the cost of a checked call.
    buf = ctypes.create_string_buffer(256)
    fields = struct.Struct(_STATX_FIELDS).unpack_from
    flags = _AT_NO_AUTOMOUNT | _AT_STATX_DONT_SYNC
    fsencode = os.fsencode

    def identity(path):
        if call(_AT_FDCWD, path if isinstance(path, bytes) else fsencode(path), flags, _STATX_TYPE_INO, buf) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return fields(buf)

    try:
        identity("/")
    except OSError:  # ENOSYS
        return None
    return identity


def _os_stat_identity(path):
    import os

    st = os.stat(path)
    return (st.st_mode, st.st_ino, os.major(st.st_rdev), os.minor(st.st_rdev), os.major(st.st_dev),
            os.minor(st.st_dev))


def stat_identity():
    """The function path -> identity (following links, /proc/<pid>/fd/N to the open file): statx where
    libc has it, else os.stat. Chosen once per process."""
    if not _IDENTITY_OF:
        _IDENTITY_OF.append(_statx_identity() or _os_stat_identity)
    return _IDENTITY_OF[0]


def device_files(patterns, identity=None) -> dict:
    """The identity index (device_identities) of the files the glob ``patterns`` match now."""
    import glob

    identity = identity or stat_identity()
    entries = []
    for pattern in patterns:
        for path in glob.glob(pattern):
            try:
                entries.append((path, identity(path)))
            except OSError:
                continue
    return device_identities(entries)


# The pids whose file descriptors the last scan_fd_holders of this process could not read (EACCES or
# EPERM on /proc/<pid>/fd: another user's process, read by a user that is not root). See fd_scan_denied.
_LAST_SCAN_DENIED = []


def fd_scan_denied() -> list:
    """The pids (sorted) whose fd tables the last scan_fd_holders could not read: its holders are
    incomplete when this is not empty (holders_incomplete_warning says so)."""
    return list(_LAST_SCAN_DENIED)


def holders_incomplete_warning(denied, uid=None) -> str:
    """The warning for a scan that could not read the fds of ``denied`` pids ('' when none)."""
    if not denied:
        return ""
    who = "it does not run as root" if uid is None else f"it runs as {user_name(uid)} (uid {uid}), not as root"
    return (f"could not read the file descriptors (/proc/<pid>/fd) of {len(denied)} process(es): {who}, and only"
            " root reads other users' file descriptors, so holders are incomplete - a process that holds a GPU's"
            " device file may be missing from them. Run the task as root (become: true, or -b).")


def scan_fd_holders(patterns, proc: str = "/proc", exclude_pids=(), denied=None):
    """Which processes hold the device files that the glob ``patterns`` match: {pid: sorted paths}.

    By identity, as fuser does, not by the text of the fd's link: the files are stat'ed once, and
    each open file of each process (/proc/<pid>/fd/N, followed to the open file itself) is compared
    by device and inode, and for a character device by device number (device_identities). So a
    container's process that holds the node bound in from another path, or at another path (its
    link reads the path inside the container, ``/dev/nvidia0``, from the host), is found; the paths
    reported are the matched device files'. One statx per fd (stat_identity), no readlink: a socket
    or a pipe costs what reading its link would. A leader that has exited while its threads run is
    read through its threads.

    The pids whose fd table is refused (EACCES/EPERM: another user's, and this process is not root)
    are added to ``denied`` when it is a set, and kept for fd_scan_denied().
    """
    import os

    identity = stat_identity()
    index = device_files(patterns, identity)
    inodes = {key[2] for key in index if len(key) == 3}
    refused = set()
    found = {}
    _LAST_SCAN_DENIED[:] = []
    if not index:
        return found
    exclude = set(exclude_pids)
    try:
        entries = os.scandir(proc)
    except OSError:
        return found
    with entries:
        for entry in entries:
            name = entry.name
            if not name.isdigit() or int(name) in exclude:
                continue
            table = _fd_table(proc, name, refused)
            if table is None:
                continue
            prefix, fds = table
            for fd in fds:
                try:
                    ident = identity(prefix + fd)
                except OSError:
                    continue
                # Most open files are neither a device file's inode nor a character device.
                if ident[1] in inodes or S_ISCHR(ident[0]):
                    path = identity_match(index, ident)
                    if path is not None:
                        found.setdefault(int(name), set()).add(path)
    _LAST_SCAN_DENIED[:] = sorted(refused)
    if isinstance(denied, set):
        denied.update(refused)
    return {pid: sorted(paths) for pid, paths in found.items()}


def _fd_table(proc: str, name: str, refused: set):
    """(the fd directory of process ``name`` as bytes with its slash, the names of its fds), or None when it has
    none to read. A leader that has exited (state Z) while its other threads run has an empty fd/: the file table
    is still reachable through those threads (it is one table for all), the first one that lists any."""
    import os

    leader = os.fsencode(f"{proc}/{name}/fd")
    fds = _list_fds(leader, name, refused)
    if fds:
        return leader + b"/", fds
    for path in _thread_fd_dirs(proc, name) if fds is not None else ():
        raw = os.fsencode(path)
        fds = _list_fds(raw, name, refused)
        if fds:
            return raw + b"/", fds
    return None


def _list_fds(fd_dir: bytes, name: str, refused: set):
    """The fd names in ``fd_dir``, or None when it cannot be read (refused - EACCES/EPERM - adds the pid to ``refused``)."""
    import errno
    import os

    try:
        return os.listdir(fd_dir)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            refused.add(int(name))
        return None


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


def cgroup_frozen(pid: int, proc: str = "/proc", sys_cgroup: str = "/sys/fs/cgroup") -> bool:
    """Whether the cgroup of ``pid`` is frozen (``lxc-freeze``: a suspend-mode backup, vzdump's
    ``lxc-freeze``; not ``pct suspend``, a CRIU checkpoint that stops the container): cgroup2's cgroup.events
    ``frozen 1`` (an ancestor's freeze included), or the v1 freezer's FROZEN/FREEZING. A frozen process runs
    none of its signal handlers until it is thawed (cgroup2 lets a fatal signal end it; the v1 freezer not even
    that)."""
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:
        _hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if not path.startswith("/") or ".." in path.split("/"):
            continue
        if controllers == "":
            files = [f"{sys_cgroup}/unified{path}/cgroup.events", f"{sys_cgroup}{path}/cgroup.events"]
            want = ("frozen 1",)
        elif "freezer" in controllers.split(","):
            files = [f"{sys_cgroup}/freezer{path}/freezer.state"]
            want = ("FROZEN", "FREEZING")
        else:
            continue
        for name in files:
            try:
                with open(name, encoding="utf-8") as f:
                    text = f.read().splitlines()
            except OSError:
                continue
            if any(t.strip() in want for t in text):
                return True
            break
    return False


def cgroup_procs(path: str, sys_cgroup: str = "/sys/fs/cgroup") -> list:
    """The pids in cgroup ``path`` and in its init.scope (systemd's PID 1 there), cgroup2 (hybrid or not)."""
    out = []
    for base in (f"{sys_cgroup}/unified", sys_cgroup):
        for leaf in ("", "/init.scope"):
            try:
                with open(f"{base}{path}{leaf}/cgroup.procs", encoding="utf-8") as f:
                    out += [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
        if out:
            break
    return out
