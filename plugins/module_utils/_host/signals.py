# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""Signalling that never hits a recycled PID, and prompt waiting for exits.

A process is identified by (pid, start time): field 22 of /proc/<pid>/stat. Where Python and
the kernel allow it (Python >= 3.9, Linux >= 5.3) a pidfd is opened and the identity is checked
right after, so that every later signal goes to exactly that process whatever happens to the
pid number; waiting uses poll() on the pidfds (never select(): its FD_SETSIZE ends at descriptor 1023), which
wakes the moment a process exits. The pidfds held at once stay within a budget of the process's descriptors
(RLIMIT_NOFILE less a reserve): the targets beyond it are signalled through a pidfd opened for that signal and
watched through /proc. Elsewhere os.kill is used, after re-checking the identity before each signal. A /proc entry
that cannot be read (EMFILE, EACCES, ...) means "cannot tell": never "gone".
A process that this one may not signal (another user's, and this one is not root) is found when it
is pinned, by signal 0, before any signal is sent: _errors.NotPermitted, which names root and become.
No AnsibleModule here.
"""

from __future__ import annotations

import errno
import os
import resource
import select
import signal
import time

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors
from ansible_collections.gpuops.gpu.plugins.module_utils._validate import signal_name
from ansible_collections.gpuops.gpu.plugins.module_utils._host.procs import read_identity, user_name

HAS_PIDFD = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")
POLL_FALLBACK_S = 0.01
POLL_MAX_S = 0.25


def describe(pid: int, info=None) -> str:
    """'pid 8812 (python3) in CT 129', from what the snapshot knew of the process."""
    info = info or {}
    name = info.get("name")
    ct = info.get("container") or {}
    return f"pid {pid}" + (f" ({name})" if name else "") + (f" in CT {ct['id']}" if ct.get("id") is not None else "")


def not_permitted(pid: int, info=None, exc=None) -> _errors.NotPermitted:
    """The error for a signal the kernel refused (EPERM): it names root and become."""
    uid = os.geteuid()
    detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else ""
    return _errors.not_permitted("signal", describe(pid, info), uid=uid, user=user_name(uid), detail=detail)


def check_may_signal(procs) -> None:
    """Raise _errors.NotPermitted for the first of ``procs`` ({pid, ...} dicts) that this process may not
    signal (signal 0: the kernel's permission check, nothing is sent). A process that is gone passes."""
    for info in procs:
        try:
            os.kill(info["pid"], 0)
        except ProcessLookupError:
            continue
        except PermissionError as exc:
            raise not_permitted(info["pid"], info, exc) from None


def _cannot_tell(exc: OSError) -> str:
    return f"its /proc entry cannot be read ({errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror or exc})"


# The pidfds the targets hold at once: a release of thousands of targets must not take every descriptor of the
# process (under ``ulimit -n 1024`` the snapshot's reads would fail), so the targets beyond the budget are watched
# by (pid, start time) through /proc, and each takes a pidfd as one frees up (a target that exits closes its own).
RESERVED_FDS = 128   # at least this many descriptors stay free for the rest of the module (reads, pipes, NVML)
_PIDFDS = {"free": None}


def _take_pidfd_slot() -> bool:
    if _PIDFDS["free"] is None:
        try:
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            in_use = len(os.listdir("/proc/self/fd"))
        except (OSError, ValueError):
            soft, in_use = 1024, 1024  # cannot tell: no pidfd is held between calls (each is opened when used)
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
        _PIDFDS["free"] = max(0, soft - in_use - max(RESERVED_FDS, soft // 8))
    if _PIDFDS["free"] <= 0:
        return False
    _PIDFDS["free"] -= 1
    return True


def _give_pidfd_slot() -> None:
    if _PIDFDS["free"] is not None:
        _PIDFDS["free"] += 1


class Target:
    """One process to stop, identified by (pid, start time) and, while the budget of descriptors allows, pinned by a
    pidfd. A target without one is signalled through a pidfd opened for that signal (its identity checked after the
    open), or by os.kill after the check where no pidfd can be opened; a target whose /proc entry cannot be read
    (``unread``: EMFILE, EACCES, ...) is never taken for gone, and is not signalled while it cannot be told apart."""

    def __init__(self, pid: int, start_time: int, info=None):
        self.pid = pid
        self.start_time = start_time
        self.info = info or {}
        self.fd = None
        self.signals = []
        self.gone_at = None
        self.recycled = False
        self.unread = ""    # why its identity could not be read the last time (it is then counted alive)

    def _identity(self):
        """True: this very process is alive; False: gone (or the pid is another process's now); None: cannot tell."""
        try:
            ident = read_identity(self.pid, strict=True)
        except OSError as exc:
            self.unread = _cannot_tell(exc)
            return None
        self.unread = ""
        if ident is None or ident[1] != self.start_time:
            self.recycled = self.recycled or ident is not None
            return False
        return True

    def _pidfd(self):
        """A pidfd of the pid (not yet checked to be this process): None where none can be opened (no pidfds here,
        no descriptor free); ProcessLookupError when the pid is gone."""
        if not HAS_PIDFD:
            return None
        try:
            return os.pidfd_open(self.pid)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                raise ProcessLookupError(exc.errno, exc.strerror) from None
            return None  # EINVAL on old kernels, EMFILE/ENFILE: identity checks instead

    def open(self) -> bool:
        """Pin the process. False when it is already gone or the pid now names another process.

        Raises _errors.NotPermitted (nothing sent) when this process may not signal it: not root."""
        if not self.hold():
            if self.gone_at is not None or self.recycled:
                return False
            if self.fd is None and self._identity() is False:
                return False
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, 0)
            else:
                os.kill(self.pid, 0)
        except ProcessLookupError:
            pass  # exited meanwhile: alive() and send() will say so
        except PermissionError as exc:
            self.close()
            raise not_permitted(self.pid, self.info, exc) from None
        return True

    def hold(self) -> bool:
        """Take a pidfd of this process, when the budget of descriptors allows (True: held). A pidfd is checked
        right after it is opened: if the identity matches then, it refers to this very process."""
        if self.fd is not None:
            return True
        if self.gone_at is not None or not _take_pidfd_slot():
            return False
        try:
            fd = self._pidfd()
        except ProcessLookupError:
            fd = None
            self.gone_at = time.monotonic()
        if fd is None:
            _give_pidfd_slot()
            return False
        same = self._identity()
        if same is not True:
            os.close(fd)
            _give_pidfd_slot()
            if same is False:
                self.gone_at = time.monotonic()
            return False
        self.fd = fd
        return True

    def alive(self) -> bool:
        """Whether it still runs; a target that cannot be read counts as alive (``unread`` says why)."""
        if self.gone_at is not None:
            return False
        if self.fd is not None:
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            if not poller.poll(0):
                return True
        elif self._identity() is not False:
            return True
        self.gone_at = time.monotonic()
        self.close()  # its descriptor goes to a target that has none (wait_gone)
        return False

    def send(self, sig: int) -> bool:
        """Send ``sig`` to exactly this process. False when it is gone or cannot be read (nothing was signalled)."""
        if not self.alive():
            return False
        fd, own = self.fd, False
        try:
            if fd is None:
                fd, own = self._pidfd(), True
                same = self._identity()
                if not same:
                    if same is False:
                        self.gone_at = time.monotonic()
                    return False
            if fd is not None:
                signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            self.gone_at = time.monotonic()
            return False
        except PermissionError as exc:  # open() checked; a process that changed its credentials since
            raise not_permitted(self.pid, self.info, exc) from None
        finally:
            if own and fd is not None:
                os.close(fd)
        self.signals.append(signal_name(sig))
        return True

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            _give_pidfd_slot()


def _poll_interval(unpinned: int) -> float:
    """How long to sleep between looks at targets without a pidfd: 10 ms for a few, longer for thousands (each look
    reads their /proc entries)."""
    return min(POLL_MAX_S, max(POLL_FALLBACK_S, unpinned * 1e-4))


def wait_gone(targets, timeout: float, now=time.monotonic) -> list:
    """Wait until every target has exited (zombies count as gone) or ``timeout`` passes.

    Returns the targets still alive (or that cannot be read), in their order. With pidfds this sleeps in poll() - no
    limit on the descriptors' numbers, unlike select() - and wakes on each exit; a target that exits closes its
    pidfd and hands it on to one that had none; those without re-check their identities every 10 ms (longer for
    thousands).
    """
    deadline = now() + max(0.0, timeout)
    pending = [t for t in targets if t.alive()]
    poller, watched = select.poll(), {}
    while True:
        remaining = deadline - now()
        if not pending or remaining <= 0:
            return pending
        for t in pending:
            if t.fd is None and not t.hold() and _PIDFDS["free"] == 0:
                break
        for t in pending:
            if t.fd is not None and t.fd not in watched:
                watched[t.fd] = t
                poller.register(t.fd, select.POLLIN)
        unpinned = len(pending) - len(watched)
        wait = remaining if not unpinned else min(remaining, _poll_interval(unpinned))
        if watched:
            for fd, _event in poller.poll(max(1, int(wait * 1000))):
                poller.unregister(fd)
                watched.pop(fd).alive()  # readable: it exited (alive() notes when, and closes the pidfd)
        else:
            time.sleep(wait)
        pending = [t for t in pending if t.gone_at is None and (t.fd is not None or t.alive())]
