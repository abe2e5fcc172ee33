# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations
import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._host import signals as _signals
from ansible_collections.gpuops.gpu.plugins.module_utils._host.procs import read_identity


@pytest.mark.parametrize("value, expected", [
    ("SIGTERM", 15), ("TERM", 15), ("sigint", 2), ("9", 9), (15, 15), (" SIGKILL ", 9), ("SIGUSR1", 10),
])
def test_signal_number(value, expected):
    assert _validate.signal_number(value) == expected


@pytest.mark.parametrize("value", ["SIGFOO", "", "0", "999", "-1", "TERM!"])
def test_signal_number_rejects(value):
    with pytest.raises(ValueError, match="signal"):
        _validate.signal_number(value)


@pytest.fixture
def child():
    """A process this test started itself; killed by pid afterwards."""
    procs = []

    def start(code="import time; time.sleep(60)"):
        p = subprocess.Popen([sys.executable, "-c", code])
        procs.append(p)
        deadline = time.monotonic() + 5
        while read_identity(p.pid) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_target_signals_and_waits(child):
    p = child()
    t = _signals.Target(p.pid, read_identity(p.pid)[1])
    assert t.open()
    assert t.send(signal.SIGTERM)
    assert _signals.wait_gone([t], 5) == []
    assert t.signals == ["SIGTERM"]
    assert p.wait(5) == -signal.SIGTERM


def test_recycled_pid_is_never_signalled(child):
    # The identity check, driven directly: a start time that is not this process's is what a
    # recycled pid looks like. Nothing may be signalled, and the process must live on.
    p = child()
    real_start = read_identity(p.pid)[1]
    t = _signals.Target(p.pid, real_start - 1)
    assert not t.open()
    assert t.recycled
    assert not t.send(signal.SIGKILL)
    time.sleep(0.05)
    assert p.poll() is None and read_identity(p.pid) == (p.pid, real_start)


def ignores(pid, signum):
    with open("/proc/%d/status" % pid, encoding="ascii") as f:
        mask = [line.split()[1] for line in f if line.startswith("SigIgn:")][0]
    return bool(int(mask, 16) & (1 << (signum - 1)))


def test_escalation_to_sigkill(child):
    p = child("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)")
    deadline = time.monotonic() + 10  # until it ignores SIGTERM (its SigIgn mask), however loaded the machine
    while not ignores(p.pid, signal.SIGTERM) and time.monotonic() < deadline:
        time.sleep(0.01)
    t = _signals.Target(p.pid, read_identity(p.pid)[1])
    assert t.open()
    t.send(signal.SIGTERM)
    assert _signals.wait_gone([t], 0.3) == [t]
    t.send(signal.SIGKILL)
    assert _signals.wait_gone([t], 5) == []
    assert t.signals == ["SIGTERM", "SIGKILL"]


def test_zombie_counts_as_gone(child):
    p = child()
    t = _signals.Target(p.pid, read_identity(p.pid)[1])
    assert t.open()
    os.kill(p.pid, signal.SIGKILL)  # our own child; not reaped yet: a zombie
    assert _signals.wait_gone([t], 5) == []
    assert not t.send(signal.SIGTERM)


def test_fallback_without_pidfd(child, monkeypatch):
    monkeypatch.setattr(_signals, "HAS_PIDFD", False)
    p = child()
    t = _signals.Target(p.pid, read_identity(p.pid)[1])
    assert t.open() and t.fd is None
    assert t.send(signal.SIGTERM)
    assert _signals.wait_gone([t], 5) == []


# --- a process this one may not signal: NotPermitted, naming root and become, never a traceback --------
def _in_child(fn, setup):
    """Run setup() then fn() in a forked child (no exec); return what fn returned, or the type and text of what it
    raised."""
    import pickle

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.close(r)
        try:
            setup(w)
            try:
                out = ("ok", fn())
            except Exception as exc:  # pylint: disable=broad-except
                out = (type(exc).__name__, getattr(exc, "msg", str(exc)), getattr(exc, "kind", None))
            os.write(w, pickle.dumps(out))
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


def _as_nobody(_w):
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)


def _in_child_as_nobody(fn):
    """fn() in a forked child that dropped to uid/gid 65534 when this runs as root (_in_child)."""
    return _in_child(fn, _as_nobody)


def test_a_process_of_another_user_fails_at_pin_naming_root_and_become(child):
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process that a dropped child may not signal")
    p = child()
    start = read_identity(p.pid)[1]
    info = {"pid": p.pid, "name": "python3", "container": {"id": 129}}
    out = _in_child_as_nobody(lambda: _signals.Target(p.pid, start, info).open())
    assert out[0] == "NotPermitted", out
    assert out[2] == "not_permitted"
    assert f"not permitted to signal pid {p.pid} (python3) in CT 129" in out[1]
    assert "not as root" in out[1] and "become: true" in out[1] and "-b" in out[1]
    out = _in_child_as_nobody(lambda: _signals.check_may_signal([info]))
    assert out[0] == "NotPermitted" and "become" in out[1], out
    assert p.poll() is None  # nothing was sent


def test_check_may_signal_passes_own_and_gone_processes(child):
    p = child()
    _signals.check_may_signal([{"pid": p.pid}, {"pid": 2 ** 22 + 1}])


@pytest.mark.parametrize("pidfd", [True, False])
def test_a_refused_signal_is_not_permitted(child, monkeypatch, pidfd):
    from ansible_collections.gpuops.gpu.plugins.module_utils import _errors

    if pidfd and not _signals.HAS_PIDFD:
        pytest.skip("no pidfd here")
    monkeypatch.setattr(_signals, "HAS_PIDFD", pidfd)
    p = child()
    t = _signals.Target(p.pid, read_identity(p.pid)[1], {"name": "worker"})
    assert t.open()

    def refuse(*_args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(signal, "pidfd_send_signal", refuse, raising=False)
    monkeypatch.setattr(os, "kill", refuse)
    with pytest.raises(_errors.NotPermitted, match=r"not permitted to signal pid \d+ \(worker\).*root.*become"):
        t.send(signal.SIGTERM)
    t2 = _signals.Target(p.pid, read_identity(p.pid)[1])
    with pytest.raises(_errors.GpuError, match="Operation not permitted"):
        t2.open()
    assert t2.fd is None
    t.close()


# --- EMFILE means "cannot tell", never "gone" (DESIGN 5a) ----------------------------------------------------------
def _use_up_descriptors(w):
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (w + 16, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    vars(_signals).get("_PIDFDS", {})["free"] = None  # the budget as this child sees it
    try:
        while True:
            os.open("/dev/null", os.O_RDONLY)
    except OSError:
        pass


def _with_descriptors_used_up(fn):
    """fn() in a forked child whose descriptors are all taken (RLIMIT_NOFILE lowered, then filled): a real EMFILE on
    every open (_in_child)."""
    return _in_child(fn, _use_up_descriptors)


def test_a_target_that_cannot_be_read_is_not_gone(child):
    p = child()
    start = read_identity(p.pid)[1]

    def pin_signal_wait():
        t = _signals.Target(p.pid, start)
        return t.open(), t.alive(), t.send(signal.SIGTERM), len(_signals.wait_gone([t], 0.05)), getattr(t, "unread", ""), t.signals

    status, out = _with_descriptors_used_up(pin_signal_wait)
    assert status == "ok", out
    pinned, alive, sent, left, unread, signals = out
    assert pinned and alive, "taken for gone while its /proc entry could not be read"
    assert not sent and signals == [], "signalled without being told apart from another process"
    assert left == 1 and "EMFILE" in unread, unread
    assert p.poll() is None


def test_pidfds_stay_within_the_budget_and_exits_free_them(child):
    procs = [child() for _n in range(6)]
    targets = [_signals.Target(p.pid, read_identity(p.pid)[1]) for p in procs]
    saved = dict(_signals._PIDFDS)
    _signals._PIDFDS["free"] = 2  # two pidfds at once: the others are watched through /proc
    try:
        assert all(t.open() for t in targets)
        assert sum(t.fd is not None for t in targets) == 2
        assert all(t.send(signal.SIGTERM) for t in targets)
        assert _signals.wait_gone(targets, 5) == []
        assert all(t.fd is None for t in targets) and _signals._PIDFDS["free"] == 2
    finally:
        for t in targets:
            t.close()
        _signals._PIDFDS.update(saved)
    assert all(p.wait(5) == -signal.SIGTERM for p in procs)
