# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One release at a time per container and per GPU: lock files under ``/run`` held by the module run.

Two pre-deploy runs at once on one container (two AWX jobs, a hook run twice) must not both release it: the
second would report the first's stopped unit and released pids as its own, or signal the server the first is
about to start. A release takes the lock of each container it is narrowed to (``ct-<vmid>.lock``, exclusive) and
of each GPU it selected (``gpu-<index>.lock``): shared when it is narrowed to containers (two containers' releases
on a GPU they share run side by side: neither reaches the other's processes), exclusive when it may reach any
process of the node on that GPU - so two releases of the node on other GPUs (two inventory hosts of one machine)
run side by side too. The containers' locks come first, then the GPUs', each in order: no two releases wait on
each other in a circle. ``flock(2)`` locks go with the process: a module killed mid-run leaves no stale lock.

The holder writes who it is into each exclusive lock file (pid, what, since), so that the one that waits can say
"another release of CT 129 is running (pid 4242, proxmox_gpu_containers, for 35 s)". The directory is
``/run/gpuops.gpu`` (tmpfs: gone at reboot), or ``GPUOPS_LOCK_DIR`` (the simulator points each simulated node at
its own).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors

LOCK_DIR_ENV = "GPUOPS_LOCK_DIR"
LOCK_DIR = "/run/gpuops.gpu"
POLL_S = 0.1
_HELD = []  # the Locks this process holds: let go when the module run ends (release_all)
_WARNED = set()  # the lock directories a warning of this module run named already (one line per run, not per Locks)


def release_all() -> None:
    """Let go of every lock this process took: the module run is over (its failure boundary calls this, so that a
    module run inside a long-lived Python - a test runner - holds none after it)."""
    while _HELD:
        _HELD.pop().release()
    _WARNED.clear()


class Locked(_errors.GpuError):
    """Another release holds a lock this one needs, for longer than ``lock_timeout``."""

    kind = "locked"


def lock_dir() -> str:
    return os.environ.get(LOCK_DIR_ENV) or LOCK_DIR


def plan(containers, gpus=(), gpus_exclusive=None) -> list:
    """[(file name, exclusive, what it guards)] in the order they are taken: each container's (exclusive), then
    each selected GPU's - shared when the release is narrowed to containers, else exclusive (``gpus_exclusive``
    says it where the containers' locks are held already: the fence takes them before it reads the services)."""
    vmids = sorted({int(v) for v in containers or ()})
    exclusive = not vmids if gpus_exclusive is None else gpus_exclusive
    out = [(f"ct-{v}.lock", True, f"CT {v}") for v in vmids]
    out += [(f"gpu-{i}.lock", exclusive, f"GPU {i}") for i in sorted({int(g) for g in gpus or ()})]
    return out


def holder_text(record: dict, now: float) -> str:
    """'pid 4242, proxmox_gpu_containers, for 35 s' from a lock file's record (what can be told)."""
    parts = []
    if record.get("pid"):
        parts.append(f"pid {record['pid']}")
    if record.get("module"):
        parts.append(str(record["module"]))
    if isinstance(record.get("since"), (int, float)):
        parts.append(f"for {max(0.0, now - record['since']):.0f} s")
    return ", ".join(parts) or "its holder did not say who it is"


def waited_text(waited: dict) -> str:
    """'waited 3.1 s for another run's fence of CT 129 (pid 4242, proxmox_gpu_containers), which ran first: ...' - what
    a run that waited for a lock says (``waited``: Locks.waited), so that what it found left is not read as all there
    was."""
    kind = {"proxmox_gpu_containers": "fence", "gpu_release": "release"}.get(waited.get("module"), "release")
    who = ", ".join(str(x) for x in (f"pid {waited['pid']}" if waited.get("pid") else None, waited.get("module")) if x)
    return (f"waited {waited.get('seconds', 0):g} s for another run's {kind} of {waited.get('for')}"
            + (f" ({who})" if who else "") + ", which ran first: what it stopped and released is in its own result;"
            " this run found what it left")


def busy_text(what: str, record: dict, now: float, waited: float) -> str:
    who = holder_text(record, now)
    pid = record.get("pid")
    see = f" (see it: ps -o pid,etime,args -p {pid})" if pid else ""
    return (f"another release of {what} is running ({who}); waited {waited:g} s (lock_timeout). Run again when it"
            f" has finished{see}, or raise lock_timeout. Nothing was signalled.")


class Locks:
    """The locks of one release run, taken by ``acquire()`` and let go by ``release()`` (or the process's end)."""

    def __init__(self, module_name: str, containers, timeout: float, warn, clock=time.time, sleep=time.sleep, gpus=(),
                 gpus_exclusive=None):
        self.module_name = module_name
        self.plan = plan(containers, gpus, gpus_exclusive)
        self.timeout = timeout
        self.warn = warn
        self.clock = clock
        self.sleep = sleep
        self.files = []
        self.waited = {}  # when it waited for another run: {seconds, for, pid, module, text} (waited_text)

    def acquire(self) -> dict:
        """Take every lock of the plan, waiting up to ``timeout`` seconds in all; raise Locked naming the holder.
        When it waited for one (what the caller read before is stale: another release ran meanwhile): ``waited``, a
        warning saying so (waited_text), and that record returned; else {} (false).

        Where the directory cannot be made (not root, a read-only /run), the release runs unlocked, with a warning."""
        where = lock_dir()
        try:
            os.makedirs(where, mode=0o700, exist_ok=True)
        except OSError as exc:
            self.warn(f"no lock against another release at once: cannot create {where} ({exc.strerror})")
            return {}
        start = self.clock()
        waited = None  # the holder's record, when one was waited for
        _HELD.append(self)
        unopened = []  # (what, why): one warning for them all (without root, every lock file fails alike)
        for name, exclusive, what in self.plan:
            path = os.path.join(where, name)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                unopened.append((what, exc.strerror or str(exc)))
                continue
            self.files.append(fd)
            mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
            while True:
                try:
                    fcntl.flock(fd, mode)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                now = self.clock()
                if now - start >= self.timeout:
                    record = self._record(where, name, exclusive)
                    self.release()
                    raise Locked(busy_text(what if record.get("what") is None else record["what"], record, now,
                                           self.timeout), lock=os.path.join(where, name), holder=record or None)
                if waited is None:
                    record = self._record(where, name, exclusive)
                    waited = dict(record, what=record.get("what") or what)
                self.sleep(min(POLL_S, max(0.0, self.timeout - (now - start))))
            if exclusive:
                self._write(fd, what)
        if unopened and where not in _WARNED:  # (the fence takes its containers' locks, then its GPUs')
            _WARNED.add(where)
            whys = sorted({why for _what, why in unopened})
            self.warn(f"no lock against another release at once: cannot open the lock files of "
                      f"{', '.join(what for what, _why in unopened)} in {where} ({'; '.join(whys)})")
        if waited is not None:
            self.waited = {"seconds": round(self.clock() - start, 1), "for": waited.get("what") or what,
                           "pid": waited.get("pid"), "module": waited.get("module")}
            self.waited["text"] = waited_text(self.waited)
            self.warn(self.waited["text"])
        return self.waited

    def _record(self, where: str, name: str, exclusive: bool) -> dict:
        """Who holds the lock that could not be taken: the record in its file, by a living holder; for a GPU's lock
        taken exclusive, which releases of containers may hold shared, else the first container lock file with a
        living holder."""
        names = [name]
        if name.startswith("gpu-") and exclusive:
            try:
                names += sorted(n for n in os.listdir(where) if n.startswith("ct-") and n.endswith(".lock"))
            except OSError:
                pass
        for n in names:
            try:
                with open(os.path.join(where, n), encoding="utf-8") as f:
                    record = json.loads(f.read() or "{}")
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and _alive(record.get("pid"), record.get("start_time")):
                return record
        return {}

    def _write(self, fd: int, what: str) -> None:
        record = {"pid": os.getpid(), "start_time": _start_time(os.getpid()), "module": self.module_name, "what": what,
                  "since": round(self.clock(), 3)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)

    def release(self) -> None:
        for fd in self.files:
            try:
                os.close(fd)  # closing the last descriptor lets the flock go
            except OSError:
                pass
        self.files = []

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False


def _start_time(pid: int):
    """A process's start time (clock ticks since boot, /proc/<pid>/stat field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid, start_time=None) -> bool:
    """Whether the process that wrote a record still runs: its pid, with the same start time (a pid reused by
    another process is not it)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    now = _start_time(pid)
    return now is not None and (start_time is None or now == start_time)
