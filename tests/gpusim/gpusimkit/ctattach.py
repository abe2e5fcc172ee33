"""Run a command inside a running simulated container (``lxc-attach``'s job).

Run by ``container.exec_argv`` / ``container.spawn`` as a fresh interpreter
(``python -I -S ctattach.py ...``), stdlib only.  Its environment is the command's environment.

1. opens the init's ``/proc/<hostpid>/ns/{uts,mnt,pid}`` and then checks that the init is still
   the one recorded (pid + starttime), so the namespaces cannot belong to a recycled pid,
2. joins the container's UTS, mount and PID namespaces (``setns``), returns to the same working
   directory,
3. forks: the child (a process of the container's PID namespace) joins the cgroup2 directory
   ``--cgroup`` (``lxc/<vmid>/ns/.lxc``, the leaf liblxc's ``cgroup_attach_leaf`` moves an
   attached process into) and execs the command.  The helper itself stays in its caller's cgroup,
   as lxc-attach moves only the attached process.

Without ``--detach`` the helper stays as the command's parent (as ``lxc-attach`` does), forwards
SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 to it and exits with its exit status (128 + N when killed by
signal N).  With ``--detach`` it forks twice inside the namespace (the command gets its own
session and is re-parented to the container's init, which reaps it; a process whose parent is
outside the namespace would otherwise be re-parented to the host's init), writes
``pid <hostpid>`` on ``--status-fd`` (``pid -1`` if the command already exited) and exits.
A command that cannot be executed exits 127 (not found) or 126, as ``lxc-attach``.
Errors before the command runs: a message on stderr and exit 255 (or ``error <message>`` on
``--status-fd``).
"""

import argparse
import ctypes
import errno
import os
import signal
import sys

FORWARD = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _starttime(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None, None
    rest = data[data.rindex(b")") + 2:].split()
    return rest[0].decode(), int(rest[19])


def join_cgroup(path, vmid, say):
    """In the forked child: move itself into the cgroup (exit 255 when it cannot)."""
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write("0")
    except OSError as e:
        sys.stderr.write("ctattach: CT %s: cannot join cgroup %s: %s\n" % (vmid, path, e.strerror))
        sys.stderr.flush()
        say("error cannot join cgroup %s: %s" % (path, e.strerror))
        os._exit(255)


def run_command(cmd, vmid, say):
    """In the forked child: exec the command (never returns)."""
    # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across exec.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvpe(cmd[0], cmd, os.environ)
    except OSError as e:
        sys.stderr.write('lxc-attach: %s: attach.c: lxc_attach_run_command: Failed to exec "%s": %s\n'
                         % (vmid, cmd[0], e.strerror))
        sys.stderr.flush()
        say('error Failed to exec "%s": %s' % (cmd[0], e.strerror))
        os._exit(127 if e.errno == errno.ENOENT else 126)


def _read(procfd, path):
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=procfd)
    try:
        return os.read(fd, 65536).decode(errors="replace")
    finally:
        os.close(fd)


def _nspid_line(procfd, pid):
    try:
        for line in _read(procfd, "%d/status" % pid).splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def _host_pid(procfd, init_pid, pidns, nspid):
    """The host pid of the container process whose pid in the container is `nspid` (looked up
    in the host's /proc, opened as `procfd` before joining the container's mount namespace)."""
    try:
        candidates = [int(x) for x in _read(procfd, "%d/task/%d/children" % (init_pid, init_pid)).split()]
    except (OSError, ValueError):
        candidates = []
    if not candidates:  # no CONFIG_PROC_CHILDREN: every process
        candidates = [int(n) for n in os.listdir(procfd) if n.isdigit()]
    for c in candidates:
        ns = _nspid_line(procfd, c)
        if len(ns) >= 2 and ns[-1] == nspid:
            try:
                if os.readlink("%d/ns/pid" % c, dir_fd=procfd) == pidns:
                    return c
            except OSError:
                continue
    return None


def detach(cmd, vmid, init_pid, procfd, pidns, cgroup, say, fail):
    """Double fork inside the container's PID namespace, so that the command is re-parented to
    the container's init (a process whose parent outside the namespace dies would be re-parented
    to the host's init instead), then report its host pid.  Never returns."""
    r, w = os.pipe()
    try:
        a = os.fork()
    except OSError as e:
        fail("fork into the container's PID namespace failed: %s" % e.strerror)
    if a == 0:
        os.close(r)
        os.setsid()
        join_cgroup(cgroup, vmid, say)
        try:
            b = os.fork()
        except OSError as e:
            say("error fork failed: %s" % e.strerror)
            os._exit(1)
        if b:
            os.write(w, ("%d\n" % b).encode())
            os._exit(0)
        os.close(w)
        run_command(cmd, vmid, say)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 64)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(a, 0)  # after this, the command's parent is the container's init
    if data.strip().isdigit():
        host = _host_pid(procfd, init_pid, pidns, int(data))
        say("pid %d" % host if host else "pid -1")
    os._exit(0)


def main(argv):
    ap = argparse.ArgumentParser(prog="ctattach")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--vmid", required=True)
    ap.add_argument("--init-pid", type=int, required=True)
    ap.add_argument("--init-starttime", type=int, required=True)
    ap.add_argument("--cgroup", required=True)
    ap.add_argument("--detach", action="store_true")
    ap.add_argument("--status-fd", type=int, default=-1)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.command
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    status_fd = args.status_fd

    def say(line):
        if status_fd >= 0:
            try:
                os.write(status_fd, (line + "\n").encode())
            except OSError:
                pass

    def fail(msg):
        sys.stderr.write("ctattach: CT %s: %s\n" % (args.vmid, msg))
        sys.stderr.flush()
        say("error " + msg)
        os._exit(255)

    if not cmd:
        fail("missing command")
    if status_fd >= 0:
        os.set_inheritable(status_fd, False)

    pid = args.init_pid
    fds = []
    try:
        for ns in ("uts", "mnt", "pid"):
            fds.append((ns, os.open("/proc/%d/ns/%s" % (pid, ns), os.O_RDONLY | os.O_CLOEXEC)))
    except OSError:
        fail("container '%s' not running!" % args.vmid)
    state, start = _starttime(pid)
    if start != args.init_starttime or state in ("Z", "X", "x"):
        fail("container '%s' not running!" % args.vmid)
    try:
        pidns = os.readlink("/proc/%d/ns/pid" % pid)
        procfd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the host's /proc
    except OSError:
        fail("container '%s' not running!" % args.vmid)

    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    if not os.path.isdir(args.cgroup):
        fail("cannot join cgroup %s: no such cgroup" % args.cgroup)

    libc = ctypes.CDLL(None, use_errno=True)
    for ns, fd in fds:
        if libc.setns(fd, 0) != 0:
            e = ctypes.get_errno()
            fail("setns(%s namespace of pid %d) failed: %s (%s)"
                 % (ns, pid, os.strerror(e), errno.errorcode.get(e, e)))
        os.close(fd)
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir("/")

    if args.detach:
        detach(cmd, args.vmid, pid, procfd, pidns, args.cgroup, say, fail)

    try:
        child = os.fork()
    except OSError as e:
        fail("fork into the container's PID namespace failed: %s" % e.strerror)
    if child == 0:
        join_cgroup(args.cgroup, args.vmid, say)
        run_command(cmd, args.vmid, say)

    say("pid %d" % child)
    if status_fd >= 0:
        os.close(status_fd)

    def forward(sig, _frame):
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            pass

    for sig in FORWARD:
        signal.signal(sig, forward)
    # Terminal-generated SIGINT/SIGQUIT reach the command directly (same process group).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    while True:
        try:
            status = os.waitpid(child, 0)[1]
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main(sys.argv[1:])
