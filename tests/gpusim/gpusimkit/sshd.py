"""A throwaway sshd on a loopback address, for Ansible runs over real SSH against the simulator.

    from gpusimkit.sshd import throwaway_sshd

    with throwaway_sshd() as s:                  # root logs in with a throwaway key
        inventory_vars = s.vars(pipelining=True)
    with throwaway_sshd(plain_user=True) as s:   # a throwaway non-root user with passwordless sudo
        inventory_vars = dict(s.vars(pipelining=True), ansible_become=True)

It starts Debian's openssh-server (``.ci/sshd_prereqs.sh`` installs it and sudo when missing) as a
child of the caller, in the foreground (``-D``), listening on a free port of a random 127.0.0.x
(2..251; loopback only), with its own config, host key, authorized key and log in a temp dir; and
with ``plain_user``, a user with a unique name (``gpuops<hex>``), its home in that dir, and a file in
/etc/sudoers.d. On the way out, also after an error or a signal that unwinds the stack, it removes
everything it created: it closes the SSH control masters whose sockets are in its dir, stops the
daemon and every process below it (its sessions, and for the plain user every process of that
uid; by pid, never by name), deletes the user and the sudoers file, and removes the dir. A cleanup
that leaves something behind raises ``SshdError`` naming it. Needs root (sshd's privilege
separation; useradd).

The daemon's CPU accounting: the daemon reaps its per-connection children, so ``cpu_of_sessions()``
(its own utime + stime plus cutime + cstime, from /proc/<pid>/stat) grows by the CPU of every
session that has ended: sshd's session processes, the shells and the module processes under them.
``wait_sessions_ended()`` waits until no session is left (close the clients' control masters first).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import pwd
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, List, Optional

SSHD = "/usr/sbin/sshd"
SBIN = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
SHARED_PYTHONS = ["/usr/bin/python3", "/usr/local/bin/python3"]
# Ansible's default ssh_args are "-C -o ControlMaster=auto -o ControlPersist=60s"; the control path is ours.
COMMON_ARGS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class SshdError(RuntimeError):
    """The sshd could not be set up (a tool missing, not root), or its cleanup left something behind."""


def tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))
    if not path:
        raise SshdError(f"{name} not found: run .ci/sshd_prereqs.sh (make simtests does) to install openssh-server"
                        " and sudo")
    return path


def run(argv: List[str], **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("timeout", 60)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if proc.returncode != 0:
        raise SshdError(f"{' '.join(map(shlex.quote, argv))}: rc {proc.returncode}: {proc.stdout}{proc.stderr}")
    return proc


def world_runnable(path: str) -> bool:
    """Whether a user who is not the owner may run ``path``: o+x on it and on every directory above it."""
    path = os.path.realpath(path)
    try:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(path)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == "/":
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


def shared_python() -> str:
    """A Python 3.9+ that any user may run: the caller's, or the system's."""
    for candidate in [sys.executable] + SHARED_PYTHONS:
        if candidate and world_runnable(candidate):
            version = run([candidate, "-c", "import sys; print(sys.version_info >= (3, 9))"]).stdout.strip()
            if version == "True":
                return candidate
    raise SshdError("no Python 3.9+ that a non-root user may run (looked at the controller's and "
                    + ", ".join(SHARED_PYTHONS) + "): install Debian's python3")


def free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def wait_listening(address: str, port: int, proc: subprocess.Popen, log: pathlib.Path, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SshdError(f"sshd exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise SshdError(f"sshd did not listen on {address}:{port} within {timeout} s")


def uid_pids(uid: int) -> List[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid == uid:
                    pids.append(int(name))
    return pids


def _stat_fields(pid: int) -> Optional[List[str]]:
    """/proc/<pid>/stat after the command name (field 3, the state, is index 0)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def starttime(pid: int) -> Optional[int]:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def process_cpu(pid: int, children: bool = True) -> Optional[float]:
    """CPU seconds of a live process (utime + stime), plus (children) those of its reaped children."""
    fields = _stat_fields(pid)
    if not fields:
        return None
    ticks = int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if children else 0)
    return ticks / CLK_TCK


def descendants(root: int) -> Dict[int, Optional[int]]:
    """{pid: starttime} of every live process below ``root`` (by parent pid, at one moment)."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields:
                parent[int(name)] = int(fields[1])
    out, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        for child, ppid in parent.items():
            if ppid == pid and child not in out:
                out[child] = starttime(child)
                frontier.append(child)
    return out


class Sshd:
    """A throwaway sshd: its address, port, the login user and key, and (plain_user) the user's home and sudo."""

    def __init__(self, root: str, plain_user: bool = False):
        self.root = root
        self.plain_user = plain_user
        self.address = f"127.0.0.{2 + secrets.randbelow(250)}"
        self.port: Optional[int] = None
        self.user = "gpuops" + secrets.token_hex(4) if plain_user else "root"
        self.uid: Optional[int] = None  # the plain user's (None for root)
        self.home = os.path.join(root, "home") if plain_user else None
        self.key = os.path.join(root, "id_ed25519")
        self.sudoers = f"/etc/sudoers.d/{self.user}" if plain_user else None
        # plain_user: an interpreter that user may run, and a dir for pure-Python modules it lacks (pynvml)
        self.python: Optional[str] = None
        self.pylib = os.path.join(root, "pylib")
        self.proc: Optional[subprocess.Popen] = None
        self.log: Optional[pathlib.Path] = None
        self._added = False

    # --- what a client needs ---------------------------------------------------------------------------
    def control_path(self, tag: str = "cp") -> str:
        """A control path in this sshd's dir (closed at the end); one tag per set of runs that may share a master."""
        return os.path.join(self.root, f"{tag}-%C")

    def ssh_args(self, tag: str = "cp") -> str:
        """ansible_ssh_args: Ansible's defaults (-C, a control master persisting 60 s), the control path here."""
        return f"-C -o ControlMaster=auto -o ControlPersist=60s -o ControlPath={self.control_path(tag)}"

    def vars(self, pipelining: bool, tag: str = "cp") -> Dict[str, object]:
        """Inventory variables that reach the node over this sshd as its login user (root, or the plain user)."""
        return {
            "ansible_connection": "ssh", "ansible_host": self.address, "ansible_port": self.port,
            "ansible_user": self.user, "ansible_ssh_private_key_file": self.key, "ansible_pipelining": pipelining,
            "ansible_ssh_common_args": COMMON_ARGS, "ansible_ssh_args": self.ssh_args(tag),
        }

    def ssh_argv(self, *command: str) -> List[str]:
        """A plain `ssh` command line to this sshd (no control master)."""
        return ["ssh", *shlex.split(COMMON_ARGS), "-o", "BatchMode=yes", "-i", self.key, "-p", str(self.port),
                f"{self.user}@{self.address}", *command]

    def leftovers(self) -> List[str]:
        """Files the runs left in the plain user's remote tmp (Ansible removes its own)."""
        if not self.home:
            return []
        tmp = os.path.join(self.home, ".ansible", "tmp")
        return sorted(os.listdir(tmp)) if os.path.isdir(tmp) else []

    # --- measuring -------------------------------------------------------------------------------------
    def masters(self, tag: Optional[str] = "cp") -> List[str]:
        """The control sockets of ``tag`` (None: every socket in the dir) that exist now."""
        out = []
        for name in os.listdir(self.root):
            path = os.path.join(self.root, name)
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(path).st_mode) and (tag is None or name.startswith(tag + "-")):
                    out.append(path)
        return sorted(out)

    def master_pid(self, socket_path: str) -> Optional[int]:
        proc = subprocess.run(["ssh", "-O", "check", "-o", f"ControlPath={socket_path}", "x"], capture_output=True,
                              text=True, timeout=10, check=False)
        m = re.search(r"pid=(\d+)", proc.stdout + proc.stderr)
        return int(m.group(1)) if m else None

    def close_masters(self, tag: str = "cp") -> float:
        """Close the control masters of ``tag``; returns the CPU seconds they had used (read just before)."""
        cpu = 0.0
        for path in self.masters(tag):
            pid = self.master_pid(path)
            if pid is not None:
                cpu += process_cpu(pid) or 0.0
            with contextlib.suppress(Exception):
                subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={path}", "x"], capture_output=True,
                               timeout=10, check=False)
            if pid is not None:  # the master is not our child: wait until it is gone
                deadline = time.monotonic() + 5
                while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                    time.sleep(0.01)
        return cpu

    def cpu_of_sessions(self) -> float:
        """The daemon's CPU plus that of its reaped sessions (everything that ran under it), seconds."""
        return (process_cpu(self.proc.pid) or 0.0) if self.proc else 0.0

    def wait_sessions_ended(self, timeout: float = 10.0) -> bool:
        """Wait until the daemon has no child left (every session ended and reaped)."""
        deadline = time.monotonic() + timeout
        while self.proc and descendants(self.proc.pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    # --- the life cycle ---------------------------------------------------------------------------------
    def start(self) -> "Sshd":
        for name in ("sshd", "ssh", "ssh-keygen") + (("sudo", "visudo", "useradd", "userdel") if self.plain_user else ()):
            tool(name)
        if self.plain_user:
            self._add_user()
        run([tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-C", self.user, "-f", self.key])
        run([tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(self.root, "ssh_host_ed25519_key")])
        shutil.copy(self.key + ".pub", os.path.join(self.root, "authorized_keys"))
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        self.port = free_port(self.address)
        config = os.path.join(self.root, "sshd_config")
        with open(config, "w", encoding="utf-8") as f:
            f.write(f"""ListenAddress {self.address}:{self.port}
HostKey {self.root}/ssh_host_ed25519_key
PidFile {self.root}/sshd.pid
AuthorizedKeysFile {self.root}/authorized_keys
AllowUsers {self.user}
PermitRootLogin {'no' if self.plain_user else 'prohibit-password'}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 64:30:128
MaxSessions 64
Subsystem sftp internal-sftp
LogLevel VERBOSE
""")
        run([SSHD, "-t", "-f", config])
        self.log = pathlib.Path(self.root, "sshd.log")
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", config], stdin=subprocess.DEVNULL,  # pylint: disable=consider-using-with
                                         stdout=logf, stderr=logf, start_new_session=True)
        wait_listening(self.address, self.port, self.proc, self.log)
        return self

    def _add_user(self) -> None:
        self.python = shared_python()
        os.makedirs(self.pylib)
        spec = importlib.util.find_spec("pynvml")
        if spec and spec.origin:
            shutil.copy(spec.origin, self.pylib)
        run([tool("useradd"), "--home-dir", self.home, "--create-home", "--shell", "/bin/sh", "--user-group",
             "--password", "*", self.user])
        self._added = True
        self.uid = pwd.getpwnam(self.user).pw_uid
        sudoers_tmp = os.path.join(self.root, "sudoers")
        with open(sudoers_tmp, "w", encoding="utf-8") as f:
            f.write(f"{self.user} ALL=(ALL:ALL) NOPASSWD: ALL\n")
        os.chmod(sudoers_tmp, 0o440)
        run([tool("visudo"), "-c", "-q", "-f", sudoers_tmp])
        shutil.copy(sudoers_tmp, self.sudoers)

    def close(self) -> List[str]:
        """Remove everything start() created; returns what is left behind (empty: nothing)."""
        for path in self.masters(None):  # every control socket in the dir, whatever its tag
            with contextlib.suppress(Exception):
                subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={path}", "x"], capture_output=True,
                               timeout=10, check=False)
        sessions = descendants(self.proc.pid) if self.proc is not None and self.proc.poll() is None else {}
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # The daemon's sessions (they outlive it) and, for the plain user, every process of that uid: by pid,
        # each checked against its start time (a pid reused since is left alone).
        for sig in (signal.SIGTERM, signal.SIGKILL):
            targets = {pid: st for pid, st in sessions.items() if st is not None and starttime(pid) == st}
            if self.uid is not None:
                targets.update({pid: starttime(pid) for pid in uid_pids(self.uid)})
            for pid in targets:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(starttime(p) == st for p, st in targets.items() if st is not None):
                time.sleep(0.05)
        if self.sudoers:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.sudoers)
        if self._added:
            subprocess.run([tool("userdel"), self.user], capture_output=True, timeout=30, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        problems = []
        left = [pid for pid, st in sessions.items() if st is not None and starttime(pid) == st]
        if left:
            problems.append(f"sshd sessions left: {left}")
        if self.uid is not None and uid_pids(self.uid):
            problems.append(f"processes of {self.user} left: {uid_pids(self.uid)}")
        if self.plain_user:
            with contextlib.suppress(KeyError):
                pwd.getpwnam(self.user)
                problems.append(f"user {self.user} left")
        if self.sudoers and os.path.exists(self.sudoers):
            problems.append(f"{self.sudoers} left")
        if os.path.exists(self.root):
            problems.append(f"{self.root} left")
        return problems


@contextlib.contextmanager
def throwaway_sshd(plain_user: bool = False) -> Iterator[Sshd]:
    """An sshd on a free 127.0.0.x port (see the module's docstring); everything it created is removed on exit."""
    if os.geteuid() != 0:
        raise SshdError("a throwaway sshd needs root (sshd's privilege separation"
                        + (", useradd and a sudoers file)" if plain_user else ")"))
    root = tempfile.mkdtemp(prefix="gpuops-sshd-")
    os.chmod(root, 0o755)  # a plain user reaches its home and the interpreter below it
    s = Sshd(root, plain_user=plain_user)
    try:
        yield s.start()
    finally:
        problems = s.close()
        if problems:
            raise SshdError("sshd teardown: " + "; ".join(problems))
