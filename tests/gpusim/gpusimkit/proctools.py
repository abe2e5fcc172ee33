"""Process helpers shared by the driver daemon, workloads, the supervisor and SimHost.

Stdlib only.  Everything here identifies a process by (pid, starttime) so that a recycled pid is
never mistaken for the process we started.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import selectors
import signal
import socket
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

# tests/gpusim: the directory that holds the gpusimkit package.
KIT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
F_DUPFD_CLOEXEC = getattr(fcntl, "F_DUPFD_CLOEXEC", 1030)


class DriverError(RuntimeError):
    """The driver daemon refused a request or could not be reached."""


# --- /proc ----------------------------------------------------------------------------------------

def read_stat(pid) -> Optional[Tuple[str, int]]:
    """(state, starttime) of a process from /proc/<pid>/stat, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.ENOENT):
            return None
        raise
    # comm may contain spaces and ')': split after the LAST ')'.
    rest = data[data.rindex(b")") + 2:].split()
    return rest[0].decode(), int(rest[19])  # field 3 (state) and field 22 (starttime)


def tail(path: str, n: int = 2000) -> str:
    """The last ``n`` bytes of a file as text ('' when it cannot be read): a log's end for a message."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def starttime(pid="self") -> Optional[int]:
    st = read_stat(pid)
    return st[1] if st else None


def pidns_inode(pid="self") -> int:
    link = os.readlink(f"/proc/{pid}/ns/pid")  # 'pid:[4026531836]'
    return int(link[link.index("[") + 1:-1])


def nspid(pid="self") -> int:
    """The process's pid in its own (innermost) PID namespace."""
    with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return int(pid) if pid != "self" else os.getpid()


def alive(pid: int, start: Optional[int] = None) -> bool:
    """True iff /proc/<pid> exists, is not a zombie and (if given) has this starttime.

    Only meaningful where /proc shows the caller's PID namespace (the host, for SimHost)."""
    st = read_stat(pid)
    if st is None:
        return False
    state, s = st
    if state in ("Z", "X", "x"):
        return False
    return start is None or s == start


def proc_is_ours() -> bool:
    """Does /proc show our own PID namespace (false in a container that kept the host's /proc)?"""
    try:
        return int(os.readlink("/proc/self")) == os.getpid()
    except (OSError, ValueError):
        return False


def pid_running(pid: int) -> bool:
    """Is `pid` (in the caller's PID namespace) running?  Zombies count as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if proc_is_ours():
        return alive(pid)
    return True


def cmdline(pid) -> List[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


# --- prctl ----------------------------------------------------------------------------------------

def _prctl(option: int, arg) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def set_comm(name: str) -> None:
    """Set /proc/self/comm (15 bytes at most, as the kernel keeps)."""
    buf = ctypes.create_string_buffer(name.encode()[:15])
    _prctl(PR_SET_NAME, ctypes.cast(buf, ctypes.c_void_p))


def set_title(title: str) -> None:
    """Rename this process as it runs, as setproctitle does on Linux (py-setproctitle, what vLLM's
    ``set_process_title`` calls): the argv area (/proc/self/stat fields 48-49, arg_start..arg_end) is rewritten in
    place with the title, NUL-padded, so that /proc/<pid>/cmdline reads the title, and comm is set by
    prctl(PR_SET_NAME) (its first 15 bytes)."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # fields 48 and 49 (the list starts at field 3)
    data = title.encode()[:max(0, end - start - 1)]
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        mem.seek(start)
        mem.write(data + b"\0" * (end - start - len(data)))
    set_comm(title)


def set_child_subreaper() -> None:
    """Orphaned descendants are re-parented to us (and must be reaped by us)."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def reap_all() -> List[Tuple[int, int]]:
    """waitpid(-1, WNOHANG) until nothing is left to reap; returns [(pid, status)]."""
    out = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, status))


# --- the owned list -------------------------------------------------------------------------------

def owned_path(simdir: str) -> str:
    return os.path.join(simdir, "run", "owned")


def append_owned(simdir: str, pid: int, start: Optional[int]) -> None:
    """Record a process gpusim started (host pid + starttime). One short O_APPEND write: atomic."""
    if start is None:
        return
    try:
        fd = os.open(owned_path(simdir), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return  # e.g. a read-only view of DIR inside a container: the caller records it too
    try:
        os.write(fd, f"{pid} {start}\n".encode())
    finally:
        os.close(fd)


def read_owned(simdir: str) -> List[Tuple[int, int]]:
    out: List[Tuple[int, int]] = []
    seen = set()
    try:
        with open(owned_path(simdir), encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit():
                    continue
                item = (int(parts[0]), int(parts[1]))
                if item not in seen:
                    seen.add(item)
                    out.append(item)
    except FileNotFoundError:
        pass
    return out


# --- spawning -------------------------------------------------------------------------------------

def python_argv(module: str, args: Sequence[str], python: Optional[str] = None) -> List[str]:
    return [python or sys.executable or os.readlink("/proc/self/exe"), "-m", module, *args]


def kit_env(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """`env` (default os.environ) with tests/gpusim first on PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    pp = out.get("PYTHONPATH", "")
    parts = [p for p in pp.split(os.pathsep) if p]
    if KIT_ROOT not in parts:
        out["PYTHONPATH"] = os.pathsep.join([KIT_ROOT, *parts])
    return out


def spawn(argv: Sequence[str], env: Dict[str, str], fds: Sequence[int] = (), log_path: Optional[str] = None,
          cwd: Optional[str] = None, new_session: bool = True, cgroup: Optional[str] = None) -> int:
    """fork + exec `argv` with stdin from /dev/null, stdout/stderr appended to `log_path`, and
    `fds` given to the child as fds 3, 4, ... (like systemd socket activation).  `cgroup`: a
    cgroup2 directory the child joins before it execs (as systemd places a unit's processes).
    Returns the pid; the caller reaps it."""
    argv = list(argv)
    try:
        log_fd = os.open(log_path or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        log_fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    null_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    errr, errw = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # child: only async-signal-safe-ish work, then exec
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            try:
                signal.set_wakeup_fd(-1)
            except ValueError:  # not the main thread
                pass
            if new_session:
                os.setsid()
            if cgroup:
                try:
                    with open(os.path.join(cgroup, "cgroup.procs"), "w", encoding="utf-8") as f:
                        f.write("0")
                except OSError as e:
                    raise OSError(e.errno, f"cannot join cgroup {cgroup}: {e.strerror}") from None
            if cwd:
                os.chdir(cwd)
            # Move the fds out of the way first so that dup2 to 3.. cannot clobber one of them.
            moved = [fcntl.fcntl(fd, F_DUPFD_CLOEXEC, 1000) for fd in fds]
            os.dup2(null_fd, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            for i, fd in enumerate(moved):
                os.dup2(fd, 3 + i, inheritable=True)
            os.execve(argv[0], argv, env)
        except BaseException as e:  # noqa: BLE001 (report any failure to the parent)
            try:
                os.write(errw, f"{type(e).__name__}: {e}".encode())
            finally:
                os._exit(127)
    os.close(errw)
    os.close(log_fd)
    os.close(null_fd)
    try:
        err = b""
        while True:
            chunk = os.read(errr, 4096)
            if not chunk:
                break
            err += chunk
    finally:
        os.close(errr)
    if err:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        raise OSError(f"cannot start {argv[0]}: {err.decode(errors='replace')}")
    return pid


# --- readiness ------------------------------------------------------------------------------------

def read_line(fd: int, timeout: float) -> str:
    """Read one line from `fd` (a pipe) within `timeout` seconds; '' on EOF before a newline."""
    deadline = time.monotonic() + timeout
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no readiness message within {timeout:g} s")
            if not sel.select(left):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return buf.decode(errors="replace")
            buf += chunk
    return buf.split(b"\n", 1)[0].decode(errors="replace")


def write_line(fd: int, text: str) -> None:
    data = (text.rstrip("\n") + "\n").encode()
    while data:
        n = os.write(fd, data)
        data = data[n:]


# --- the driver daemon's client side --------------------------------------------------------------

def sock_path(simdir: str) -> str:
    return os.path.join(simdir, "run", "driver.sock")


def driver_request(simdir: str, line: str, fds: Sequence[int] = (), timeout: float = 10.0) -> str:
    """Send one request line to the driver daemon; returns the text after 'ok ' (or '')."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(timeout)
    try:
        try:
            s.connect(sock_path(simdir))
        except OSError as e:
            raise DriverError(f"driver daemon not reachable at {sock_path(simdir)}: {e}") from e
        data = (line.rstrip("\n") + "\n").encode()
        if fds:
            n = socket.send_fds(s, [data], list(fds))
            data = data[n:]
        if data:
            s.sendall(data)
        buf = b""
        while b"\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
    finally:
        s.close()
    reply = buf.split(b"\n", 1)[0].decode(errors="replace")
    if reply == "ok":
        return ""
    if reply.startswith("ok "):
        return reply[3:]
    if reply.startswith("error "):
        raise DriverError(reply[6:])
    raise DriverError(f"unexpected reply from the driver daemon: {reply!r}")


def spawn_via_driver(simdir: str, argv: Sequence[str], env: Dict[str, str], fds: Sequence[int] = (),
                     log_path: Optional[str] = None, cwd: Optional[str] = None,
                     cgroup: Optional[str] = None) -> int:
    """Have the driver daemon (a child subreaper) start `argv`, so that it and its orphans are
    reaped promptly.  `fds` become the child's 3, 4, ...; `cgroup`: the cgroup2 directory the
    child joins before it execs.  Returns the host pid."""
    req = {"argv": list(argv), "env": dict(env), "log": log_path, "cwd": cwd}
    if cgroup:
        req["cgroup"] = cgroup
    return int(driver_request(simdir, "spawn " + json.dumps(req, separators=(",", ":")), fds=fds))
