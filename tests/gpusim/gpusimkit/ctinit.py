"""PID 1 of a simulated Proxmox VE container, and the launcher that creates it.

Run by ``container.start`` as a fresh interpreter (``python -I -S ctinit.py ...``), never imported
by the package: it needs nothing but the standard library.

The launcher (the process ``container.start`` runs):

1. joins the cgroup2 directory ``<mount>/lxc/<vmid>/ns`` (so that everything below inherits it),
2. ``unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS)``, makes every mount private and sets the
   hostname,
3. forks: the child is PID 1 of the new PID namespace; the launcher writes ``pid <hostpid>`` on
   the readiness pipe and exits (the init is daemonized: new session, stdio to console.log).

The init mounts a fresh ``/proc`` (so that the container sees only its own processes), names
itself ``init``, writes ``ready`` and then only reaps.  On SIGTERM or SIGPWR (``lxc-stop``'s halt
signal) it sends SIGTERM to every process of the container (``kill(-1)`` from PID 1), sends it
again to processes that appear later, reaps, and exits once no live process is left besides
itself.  A process that ignores SIGTERM therefore keeps the container up until someone SIGKILLs
the init (the kernel then kills the whole PID namespace).

Errors before ``ready`` are written as ``error <message>`` on the readiness pipe.
"""

import argparse
import ctypes
import errno
import os
import signal
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWPID = 0x20000000
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_NAME = 15

HALT_SIGNALS = (signal.SIGTERM, signal.SIGPWR)
WAIT_SIGNALS = (signal.SIGTERM, signal.SIGPWR, signal.SIGCHLD, signal.SIGINT, signal.SIGHUP,
                signal.SIGUSR1, signal.SIGUSR2)


def log(msg):
    sys.stdout.write("%s ctinit[%d]: %s\n" % ("%.3f" % time.time(), os.getpid(), msg))
    sys.stdout.flush()


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _oserror(what):
    e = ctypes.get_errno()
    return "%s failed: %s (%s)" % (what, os.strerror(e), errno.errorcode.get(e, e))


def _say(fd, line):
    data = (line.rstrip("\n") + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _live_pids():
    """(pid, starttime) of every live process this /proc shows (the container's own)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rindex(b")") + 2:].split()
        if rest[0] in (b"Z", b"X", b"x"):
            continue
        out.append((int(name), int(rest[19])))
    return out


def _reap():
    while True:
        try:
            pid = os.waitpid(-1, os.WNOHANG)[0]
        except ChildProcessError:
            return
        if pid == 0:
            return


def run_init(vmid):
    """The init's main loop; never returns."""
    signalled = set()
    stopping = False
    while True:
        timeout = 0.1 if stopping else 5.0
        info = signal.sigtimedwait(WAIT_SIGNALS, timeout)
        if info is not None and info.si_signo in HALT_SIGNALS and not stopping:
            stopping = True
            log("CT %s: %s received, sending SIGTERM to all processes"
                % (vmid, signal.Signals(info.si_signo).name))
            signalled.update(p for p in _live_pids() if p[0] != 1)
            try:
                os.kill(-1, signal.SIGTERM)
            except ProcessLookupError:
                pass
        _reap()
        if stopping:
            live = [p for p in _live_pids() if p[0] != 1]
            if not live:
                log("CT %s: no process left, halting" % vmid)
                sys.stdout.flush()
                os._exit(0)
            for p in live:
                if p not in signalled:
                    signalled.add(p)
                    try:
                        os.kill(p[0], signal.SIGTERM)
                    except ProcessLookupError:
                        pass


def main(argv):
    ap = argparse.ArgumentParser(prog="ctinit")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--vmid", required=True)
    ap.add_argument("--hostname", required=True)
    ap.add_argument("--cgroup", required=True, help="cgroup2 directory to join (lxc/<vmid>/ns)")
    ap.add_argument("--ready-fd", type=int, required=True)
    args = ap.parse_args(argv)
    ready = args.ready_fd

    def fail(msg):
        try:
            _say(ready, "error " + msg)
        finally:
            os._exit(1)

    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]

    # 1. the cgroup: everything forked from here on inherits it.
    try:
        with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError as e:
        fail("cannot join cgroup %s: %s (moving a process into a cgroup2 directory needs root)"
             % (args.cgroup, e.strerror))

    # 2. the namespaces.
    if libc.unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS) != 0:
        fail(_oserror("unshare(CLONE_NEWPID|CLONE_NEWNS|CLONE_NEWUTS)")
             + ": cannot create PID, mount and UTS namespaces (needs CAP_SYS_ADMIN)")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        fail(_oserror("mount --make-rprivate /") + ": cannot make the container's mounts private")
    name = args.hostname.encode()
    if libc.sethostname(name, len(name)) != 0:
        fail(_oserror("sethostname(%s)" % args.hostname))

    # 3. fork: the child is PID 1 of the new PID namespace.
    try:
        pid = os.fork()
    except OSError as e:
        fail("fork into the new PID namespace failed: %s" % e.strerror)
    if pid:
        _say(ready, "pid %d" % pid)
        os._exit(0)

    # --- PID 1 ---------------------------------------------------------------------------------
    if os.getpid() != 1:
        fail("the init is pid %d in its namespace, not 1" % os.getpid())
    if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        fail(_oserror("mount -t proc proc /proc") + ": cannot mount a /proc for the container")
    try:
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(b"init"), 0, 0, 0)
    except Exception:  # noqa: BLE001 (cosmetic)
        pass
    os.chdir("/")
    # PID 1 of a namespace gets only the signals it has a handler for: install no-op handlers,
    # block them and take them with sigtimedwait (no race between a check and a wait).
    for sig in WAIT_SIGNALS:
        signal.signal(sig, lambda *_: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, WAIT_SIGNALS)
    log("CT %s: init started (hostname %s)" % (args.vmid, args.hostname))
    _say(ready, "ready")
    os.close(ready)
    run_init(args.vmid)


if __name__ == "__main__":
    main(sys.argv[1:])
