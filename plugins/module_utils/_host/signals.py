# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""Signalling that never hits a recycled PID, and prompt waiting for exits.

A process is identified by (pid, start time): field 22 of /proc/<pid>/stat. Where Python and
the kernel allow it (Python >= 3.9, Linux >= 5.3) a pidfd is opened and the identity is checked
right after, so that every later signal goes to exactly that process whatever happens to the
pid number; waiting uses poll() on the pidfds, which wakes the moment a process exits.
Elsewhere os.kill is used, after re-checking the identity before each signal.
A process that this one may not signal (another user's, and this one is not root) is found when it
is pinned, by signal 0, before any signal is sent: _errors.NotPermitted, which names root and become.
No AnsibleModule here.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import time

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors
from ansible_collections.gpuops.gpu.plugins.module_utils._validate import signal_name
from ansible_collections.gpuops.gpu.plugins.module_utils._host.procs import read_identity, user_name

HAS_PIDFD = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")
POLL_FALLBACK_S = 0.01


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


class Target:
    """One process to stop, pinned by (pid, start time) and, where possible, a pidfd."""

    def __init__(self, pid: int, start_time: int, info=None):
        self.pid = pid
        self.start_time = start_time
        self.info = info or {}
        self.fd = None
        self.signals = []
        self.gone_at = None
        self.recycled = False

    def open(self) -> bool:
        """Pin the process. False when it is already gone or the pid now names another process.

        Raises _errors.NotPermitted (nothing sent) when this process may not signal it: not root."""
        if HAS_PIDFD:
            try:
                self.fd = os.pidfd_open(self.pid)
            except OSError as exc:
                if exc.errno == errno.ESRCH:
                    return False
                self.fd = None  # e.g. EINVAL on old kernels: fall back to identity checks
        # Check identity after opening: if it matches now, the pidfd refers to this very process.
        ident = read_identity(self.pid)
        if ident is None or ident[1] != self.start_time:
            self.recycled = ident is not None
            self.close()
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

    def alive(self) -> bool:
        if self.gone_at is not None:
            return False
        if self.fd is not None:
            ready, _w, _x = select.select([self.fd], [], [], 0)
            if not ready:
                return True
        else:
            ident = read_identity(self.pid)
            if ident is not None and ident[1] == self.start_time:
                return True
        self.gone_at = time.monotonic()
        return False

    def send(self, sig: int) -> bool:
        """Send ``sig`` to exactly this process. False when it is gone (nothing was signalled)."""
        if not self.alive():
            return False
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            else:
                ident = read_identity(self.pid)
                if ident is None or ident[1] != self.start_time:
                    self.gone_at = time.monotonic()
                    return False
                os.kill(self.pid, sig)
        except ProcessLookupError:
            self.gone_at = time.monotonic()
            return False
        except PermissionError as exc:  # open() checked; a process that changed its credentials since
            raise not_permitted(self.pid, self.info, exc) from None
        self.signals.append(signal_name(sig))
        return True

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def wait_gone(targets, timeout: float, now=time.monotonic) -> list:
    """Wait until every target has exited (zombies count as gone) or ``timeout`` passes.

    Returns the targets still alive. With pidfds this sleeps in poll() and wakes on each exit;
    without, it re-checks identities every 10 ms.
    """
    deadline = now() + max(0.0, timeout)
    while True:
        alive = [t for t in targets if t.alive()]
        remaining = deadline - now()
        if not alive or remaining <= 0:
            return alive
        fds = [t.fd for t in alive if t.fd is not None]
        if fds and len(fds) == len(alive):
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            poller.poll(max(1, int(remaining * 1000)))
        else:
            time.sleep(min(POLL_FALLBACK_S, remaining))
