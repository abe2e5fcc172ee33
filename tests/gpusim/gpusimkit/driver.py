"""The simulated driver: registers GPU contexts, watches their processes exit, writes DIR/procs.

    python -m gpusimkit.driver --dir DIR

The only writer of ``DIR/procs``.  Protocol and file format: ../README.md ("The driver daemon").
It is also a child subreaper and the spawner of host-side gpusim processes (``spawn``), so that
every workload, and every orphan of one, is reaped the moment it exits.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import selectors
import signal
import socket
import struct
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from . import proctools

log = logging.getLogger("gpusim.driver")

MAX_LINE = 1 << 20
TYPES_RE = re.compile(r"[CGM]{1,3}")
# While an exited process waits for its release lag, re-read the scenario this often: the lag may
# change at run time.
LAG_POLL_S = 0.05


def _split_key(key: Any) -> Tuple[int, Optional[Tuple[int, int]]]:
    """An allocation's key: a GPU index, or (gpu, gi, ci) for a MIG device -> (gpu, None or (gi, ci))."""
    return (key, None) if isinstance(key, int) else (key[0], (key[1], key[2]))


def _gpu_key(key: Any) -> Tuple[int, int, int]:
    g, inst = _split_key(key)
    return (g, -1, -1) if inst is None else (g, inst[0], inst[1])


@dataclasses.dataclass
class Entry:
    pid: int
    start: int
    pidns: int
    nspid: int
    gpus: Dict[Any, Tuple[str, int]]  # by GPU index, or (gpu, gi, ci) for a MIG device
    pidfd: Optional[int] = None
    exit_ns: Optional[int] = None


class _Conn:
    def __init__(self, sock: socket.socket, peer_pid: int):
        self.sock = sock
        self.peer_pid = peer_pid
        self.buf = b""
        self.fds: List[int] = []


class RequestError(Exception):
    pass


class Driver:
    def __init__(self, simdir: str):
        self.simdir = os.path.abspath(simdir)
        self.run_dir = os.path.join(self.simdir, "run")
        self.entries: Dict[Tuple[int, int], Entry] = {}
        self.sel = selectors.DefaultSelector()
        self.stopping = False
        self._scn_sig = None
        self._scn: Dict[str, str] = {}
        self._written: Optional[str] = None
        self._mtime_ns = 0
        self.children: Dict[int, str] = {}

    # --- scenario ---------------------------------------------------------------------------
    def _scenario(self) -> Dict[str, str]:
        path = os.path.join(self.simdir, "scenario")
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return self._scn
        sig = (st.st_mtime_ns, st.st_ino, st.st_size)
        if sig != self._scn_sig:
            out = {}
            with open(path, encoding="utf-8") as f:
                for line in f:
                    line = line.rstrip("\n")
                    if not line or line.startswith("#"):
                        continue
                    k, _sep, v = line.partition(" ")
                    out[k] = v
            self._scn, self._scn_sig = out, sig
        return self._scn

    def _int_setting(self, key: str, default: int) -> int:
        try:
            return int(self._scenario().get(key, default))
        except ValueError:
            return default

    def lag_ns(self) -> int:
        """How long an exited process's line is kept: the release lag, plus the drain (nvml.c
        dead_counted_mib releases its memory linearly over drain_ms after the lag)."""
        return (max(0, self._int_setting("release_lag_ms", 0)) + max(0, self._int_setting("drain_ms", 0))) * 1_000_000

    def gpu_count(self) -> int:
        return self._int_setting("gpu_count", 0)

    # --- procs ------------------------------------------------------------------------------
    def render(self) -> str:
        out = []
        for key in sorted(self.entries):
            e = self.entries[key]
            for key in sorted(e.gpus, key=_gpu_key):
                types, mib = e.gpus[key]
                g, inst = _split_key(key)
                mig = "" if inst is None else f" {inst[0]} {inst[1]}"  # a MIG device: <gi> <ci> (README "MIG")
                out.append(f"proc {e.pid} {e.start} {g} {types} {mib} {e.pidns} {e.nspid}{mig}")
            if e.exit_ns is not None:
                out.append(f"exit {e.pid} {e.start} {e.exit_ns}")
        return "".join(line + "\n" for line in out)

    def write_procs(self) -> None:
        text = self.render()
        if text == self._written:
            return
        path = os.path.join(self.simdir, "procs")
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            # Readers cache (st_mtim, st_ino, st_size).  File timestamps are coarse (a tick) on
            # older kernels and a freed inode number comes back soon, so two versions written
            # within one tick could look the same: keep the mtime strictly increasing.
            st = os.fstat(f.fileno())
            if st.st_mtime_ns <= self._mtime_ns:
                os.utime(f.fileno(), ns=(st.st_atime_ns, self._mtime_ns + 1))
                self._mtime_ns += 1
            else:
                self._mtime_ns = st.st_mtime_ns
        os.replace(tmp, path)
        self._written = text

    # --- registration -----------------------------------------------------------------------
    def _parse_spec(self, types: str, spec: str) -> Tuple[str, Dict[Any, int]]:
        if not TYPES_RE.fullmatch(types) or len(set(types)) != len(types):
            raise RequestError(f"invalid types={types!r}: must be any of C, G, M, e.g. C or CG")
        types = "".join(c for c in "CGM" if c in types)
        count = self.gpu_count()
        gpus: Dict[Any, int] = {}
        for part in spec.split(","):
            m = re.fullmatch(r"(\d+)(?:/(\d+)/(\d+))?:(-?\d+)", part)
            if not m:
                raise RequestError(f"invalid allocation {part!r}: must be <gpu>:<mib> or <gpu>/<gi>/<ci>:<mib>")
            g, mib = int(m.group(1)), int(m.group(4))
            if g >= count:
                raise RequestError(f"invalid gpu={g}: the host has {count} GPUs")
            if mib < -1:
                raise RequestError(f"invalid mib={mib}: must be >= 0 (or -1: not available)")
            key: Any = g if m.group(2) is None else (g, int(m.group(2)), int(m.group(3)))
            if key in gpus:
                raise RequestError(f"invalid allocation: gpu {part.split(':')[0]} given twice")
            gpus[key] = mib
        return types, gpus

    def register(self, pid: int, types: str, spec: str) -> int:
        types, gpus = self._parse_spec(types, spec)
        st = proctools.read_stat(pid)
        if st is None:
            raise RequestError(f"no such process: {pid}")
        key = (pid, st[1])
        e = self.entries.get(key)
        if e is None:
            e = self._new_entry(pid, st[1])
            self.entries[key] = e
        for g, mib in gpus.items():
            e.gpus[g] = (types, mib)
        log.info("alloc pid=%d start=%d types=%s %s", pid, st[1], types, spec)
        return pid

    def _new_entry(self, pid: int, start: int) -> Entry:
        pidfd = None
        exit_ns = None
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            exit_ns = time.monotonic_ns()
        if pidfd is not None:
            st = proctools.read_stat(pid)
            if st is None or st[1] != start:  # it exited (and the pid was maybe reused) meanwhile
                os.close(pidfd)
                pidfd, exit_ns = None, time.monotonic_ns()
        try:
            ns = proctools.pidns_inode(pid)
            inner = proctools.nspid(pid)
        except (OSError, ValueError):  # a zombie has no namespaces any more
            ns, inner = 0, pid
        e = Entry(pid=pid, start=start, pidns=ns, nspid=inner, gpus={}, pidfd=pidfd, exit_ns=exit_ns)
        if pidfd is not None:
            self.sel.register(pidfd, selectors.EVENT_READ, ("pidfd", e))
        return e

    def _exited(self, e: Entry) -> None:
        e.exit_ns = time.monotonic_ns()
        self._close_pidfd(e)
        log.info("exit pid=%d start=%d at %d", e.pid, e.start, e.exit_ns)

    def _close_pidfd(self, e: Entry) -> None:
        if e.pidfd is not None:
            self.sel.unregister(e.pidfd)
            os.close(e.pidfd)
            e.pidfd = None

    def free(self, pid: int, which: Optional[List[int]]) -> None:
        for key in [k for k, e in self.entries.items() if e.pid == pid and e.exit_ns is None]:
            e = self.entries[key]
            for g in list(e.gpus):
                if which is None or _split_key(g)[0] in which:
                    del e.gpus[g]
            if not e.gpus:
                self._close_pidfd(e)
                del self.entries[key]
        log.info("free pid=%d gpus=%s", pid, "all" if which is None else which)

    def expire(self) -> Optional[float]:
        """Drop exited processes whose lag has passed; returns seconds until the next one is due."""
        if not any(e.exit_ns is not None for e in self.entries.values()):
            return None
        lag = self.lag_ns()
        now = time.monotonic_ns()
        nxt = None
        for key in list(self.entries):
            e = self.entries[key]
            if e.exit_ns is None:
                continue
            due = e.exit_ns + lag
            if now >= due:
                del self.entries[key]
                log.info("released pid=%d start=%d", e.pid, e.start)
            else:
                left = (due - now) / 1e9
                nxt = left if nxt is None else min(nxt, left)
        return None if nxt is None else min(nxt, LAG_POLL_S)

    # --- requests ---------------------------------------------------------------------------
    def handle(self, conn: _Conn, line: str) -> str:
        words = line.split(" ", 1)
        op, rest = words[0], (words[1] if len(words) > 1 else "")
        args = rest.split()
        if op == "ping":
            return "ok"
        if op == "whoami":
            return f"ok {conn.peer_pid}"
        if op == "alloc":
            if len(args) != 2:
                raise RequestError("usage: alloc <types> <gpu>:<mib>[,<gpu>:<mib>...]")
            return f"ok {self.register(conn.peer_pid, args[0], args[1])}"
        if op == "alloc-pid":
            pids = args[0].split(",") if args else []
            if len(args) != 3 or not all(p.isdigit() for p in pids):
                raise RequestError("usage: alloc-pid <pid>[,<pid>...] <types> <gpu>:<mib>[,...]")
            return "ok " + ",".join(str(self.register(int(p), args[1], args[2])) for p in pids)
        if op == "free":
            which = None
            if args:
                try:
                    which = [int(x) for x in args[0].split(",")]
                except ValueError:
                    raise RequestError(f"invalid gpus={args[0]!r}: must be indexes like 0,1") from None
            self.free(conn.peer_pid, which)
            return "ok"
        if op == "spawn":
            return f"ok {self.spawn(conn, rest)}"
        raise RequestError(f"unknown request {op!r}")

    def spawn(self, conn: _Conn, text: str) -> int:
        fds, conn.fds = conn.fds, []
        try:
            try:
                req = json.loads(text)
                argv = [str(a) for a in req["argv"]]
                env = {str(k): str(v) for k, v in req.get("env", {}).items()}
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise RequestError(f"invalid spawn request: {e}") from None
            if not argv:
                raise RequestError("invalid spawn request: empty argv")
            logpath = req.get("log") or os.path.join(self.run_dir, "workloads.log")
            try:
                pid = proctools.spawn(argv, env, fds, logpath, req.get("cwd"), cgroup=req.get("cgroup"))
            except OSError as e:
                raise RequestError(str(e)) from None
        finally:
            for fd in fds:
                os.close(fd)
        self.children[pid] = " ".join(argv[1:3])
        proctools.append_owned(self.simdir, pid, proctools.starttime(pid))
        log.info("spawned pid=%d: %s", pid, " ".join(argv))
        return pid

    def _accept(self, lsock: socket.socket) -> None:
        while True:
            try:
                sock, _addr = lsock.accept()
            except BlockingIOError:
                return
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid, _uid, _gid = struct.unpack("3i", creds)
            sock.setblocking(False)
            self.sel.register(sock, selectors.EVENT_READ, ("conn", _Conn(sock, pid)))

    def _close_conn(self, conn: _Conn) -> None:
        self.sel.unregister(conn.sock)
        conn.sock.close()
        for fd in conn.fds:
            os.close(fd)
        conn.fds = []

    def _readable(self, conn: _Conn) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn.sock, 65536, 16)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        for fd in fds:
            os.set_inheritable(fd, False)
        conn.fds.extend(fds)
        if not data:
            self._close_conn(conn)
            return
        conn.buf += data
        while b"\n" in conn.buf:
            raw, conn.buf = conn.buf.split(b"\n", 1)
            line = raw.decode(errors="replace").strip()
            try:
                reply = self.handle(conn, line)
            except RequestError as e:
                reply = f"error {e}"
                log.info("request %r refused: %s", line[:200], e)
            self.write_procs()  # a registration is in procs before its caller hears "ok"
            try:
                conn.sock.setblocking(True)
                conn.sock.sendall((reply + "\n").encode())
                conn.sock.setblocking(False)
            except OSError:
                self._close_conn(conn)
                return
        if len(conn.buf) > MAX_LINE:
            self._close_conn(conn)

    def _signals(self, rfd: int) -> None:
        try:
            data = os.read(rfd, 512)
        except BlockingIOError:
            return
        for signum in data:
            if signum in (signal.SIGTERM, signal.SIGINT):
                self.stopping = True
            elif signum == signal.SIGCHLD:
                for pid, status in proctools.reap_all():
                    what = self.children.pop(pid, "orphan")
                    log.info("reaped pid=%d (%s) status=%d", pid, what, status)

    # --- main loop --------------------------------------------------------------------------
    def run(self) -> int:
        os.makedirs(self.run_dir, exist_ok=True)
        proctools.set_child_subreaper()
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, lambda *_: None)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.sel.register(rfd, selectors.EVENT_READ, ("signal", None))

        path = proctools.sock_path(self.simdir)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        lsock.bind(path)
        os.chmod(path, 0o666)  # processes in containers connect too
        lsock.listen(128)
        lsock.setblocking(False)
        self.sel.register(lsock, selectors.EVENT_READ, ("listen", None))

        self.write_procs()
        pidfile = os.path.join(self.run_dir, "driver.pid")
        with open(pidfile + ".tmp", "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(pidfile + ".tmp", pidfile)
        proctools.append_owned(self.simdir, os.getpid(), proctools.starttime())
        log.info("driver up: pid=%d dir=%s", os.getpid(), self.simdir)

        try:
            while not self.stopping:
                timeout = self.expire()
                self.write_procs()
                for key, _mask in self.sel.select(timeout):
                    kind, obj = key.data
                    if kind == "pidfd":
                        self._exited(obj)
                    elif kind == "conn":
                        self._readable(obj)
                    elif kind == "listen":
                        self._accept(key.fileobj)
                    elif kind == "signal":
                        self._signals(key.fd)
                self.expire()
                self.write_procs()
        finally:
            for fn in (path, pidfile):
                try:
                    os.unlink(fn)
                except FileNotFoundError:
                    pass
            lsock.close()
            log.info("driver stopped")
        return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="gpusim-driver", description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="the scenario directory")
    args = ap.parse_args(argv)
    simdir = os.path.abspath(args.dir)
    os.makedirs(os.path.join(simdir, "run"), exist_ok=True)
    logging.basicConfig(filename=os.path.join(simdir, "run", "driver.log"), level=logging.INFO,
                        format="%(asctime)s.%(msecs)03d %(message)s", datefmt="%H:%M:%S")
    return Driver(simdir).run()


if __name__ == "__main__":
    sys.exit(main())
