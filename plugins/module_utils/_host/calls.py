# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The real host's calls: time-limited calls (Background) and commands (in a process group of their own, in
COMMAND_ENV; a ``pct exec`` watched for what hangs: ExecWatch), calls in the background, a monotonic clock. No
AnsibleModule."""

from __future__ import annotations

import signal
import threading
import time

from ansible_collections.gpuops.gpu.plugins.module_utils._errors import QueryTimeout


class Interrupted(Exception):
    """A call_interrupted call that its timer stopped."""


def _on_alarm(_signum, _frame):
    raise Interrupted()


def call_interrupted(fn, text, budget: float):
    """``fn(text)``, interrupted (Interrupted) after ``budget`` s where a timer can be used (the main thread, no timer
    already running): a call that Python checks for signals in (re, while it backtracks), where a thread could not
    stop it. Returns (value, seconds)."""
    start = time.monotonic()
    use_timer = (threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
                 and signal.getitimer(signal.ITIMER_REAL)[0] == 0)
    if not use_timer:
        value = fn(text)
        return value, time.monotonic() - start
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, budget)
        try:
            value = fn(text)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
    return value, time.monotonic() - start


# The commands run_in_group has started and not yet reaped: killed at exit, so that a command
# still running in another thread when the module fails (two nvidia-smi queries run at once)
# does not outlive the module either.
_RUNNING = set()
_RUNNING_LOCK = threading.Lock()
_AT_EXIT = {"registered": False}


def _kill_group(proc) -> None:
    import os
    import signal
    import subprocess

    try:
        os.killpg(proc.pid, signal.SIGKILL)  # our own child's group: not reaped yet, so the ids are still ours
    except OSError:
        pass
    try:
        proc.communicate(timeout=2.0)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        pass  # stuck in the kernel (state D), or reaped meanwhile by its own thread


def _kill_running() -> None:
    with _RUNNING_LOCK:
        running = list(_RUNNING)
        _RUNNING.clear()
    for proc in running:
        if proc.poll() is None:
            _kill_group(proc)


# The environment of every command the modules run (nvidia-smi, dmesg, pct, systemctl): its output is parsed,
# so it speaks the C locale. Set here only.
COMMAND_ENV = {"LC_ALL": "C"}


def run_in_group(argv, timeout: float, what: str, watch=None):
    """Run ``argv`` (a list, no shell, COMMAND_ENV) for at most ``timeout`` s; returns (rc, stdout, stderr).

    The program runs in a session and process group of its own, so that on timeout the whole
    group (the program and anything it started) is killed with SIGKILL and reaped: a hung
    nvidia-smi never outlives the module. Then QueryTimeout names ``what``. A program that cannot
    be started answers (127, "", the reason), as a shell would.

    ``watch(pid, elapsed, done) -> sentence`` (ExecWatch) is asked every WATCH_S s while the program runs, and once
    more when the time is up (``done``): a sentence ends the call at once (the group killed), in a QueryTimeout whose
    message it is (details ``watched``): what hung, said while the program still runs.
    """
    import atexit
    import os
    import subprocess

    env = dict(os.environ, **COMMAND_ENV)
    with _RUNNING_LOCK:
        if not _AT_EXIT["registered"]:
            atexit.register(_kill_running)
            _AT_EXIT["registered"] = True
        try:
            # Not module.run_command: it cannot put the program in a group of its own, nor kill it on timeout.
            proc = subprocess.Popen(  # pylint: disable=ansible-bad-function
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                start_new_session=True)
        except OSError as exc:
            return 127, "", f"{argv[0]}: {exc.strerror or exc}"
        _RUNNING.add(proc)
    started = time.monotonic()
    try:
        while True:
            left = timeout - (time.monotonic() - started)
            try:
                out, err = proc.communicate(timeout=max(0.0, min(left, WATCH_S)) if watch else timeout)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                said = watch(proc.pid, elapsed, elapsed >= timeout) if watch else ""
                if not said and elapsed < timeout:
                    continue
                _kill_group(proc)
                raise QueryTimeout(said or (
                    f"{what} did not answer within {timeout:g} s and was killed: the driver may be hung (check dmesg for"
                    " Xid errors and `nvidia-smi` on the host); raise query_timeout if the host is merely slow."),
                    timeout=timeout, call=what, watched=bool(said)) from None
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


WATCH_S = 0.5   # how often a watched command's watch is asked


class ExecWatch:
    """What hangs while ``pct exec <vmid> -- <command>`` runs (run_in_group's ``watch``): the container frozen (said
    at once: nothing runs in it until it is thawed), the node's pct (the command has not reached the container after
    ``pct_limit`` s: pct loads the PVE libraries and reads /etc/pve before it attaches), or, when the time is up with
    the command running in the container, the container's systemd. ``text`` is the command line, as it is said."""

    def __init__(self, vmid: int, text: str, pct_limit: float, frozen=None, attached=None):
        self.vmid = int(vmid)
        self.text = text
        self.pct_limit = pct_limit
        self.frozen = frozen or container_frozen
        self.attached = attached or attached_in_container

    def __call__(self, pid: int, elapsed: float, done: bool) -> str:
        vmid, text = self.vmid, self.text
        if self.frozen(vmid):
            return (f"CT {vmid} is frozen (a suspend-mode backup, or lxc-freeze): `{text}` cannot run in it and was killed"
                    f" after {elapsed:.1f} s. Wait for the backup to finish or thaw it (lxc-unfreeze -n {vmid}), then run"
                    " again")
        if (done or elapsed >= self.pct_limit) and not self.attached(pid, vmid):
            return (f"the node's pct hung: `{text}` had not reached CT {vmid} after {elapsed:.0f} s (pct_timeout"
                    f" {self.pct_limit:g} s) and was killed. pct loads the PVE libraries and reads /etc/pve before it"
                    " attaches: look at the cluster filesystem (systemctl status pve-cluster) and the node's load")
        if done:
            return (f"CT {vmid}'s systemd did not finish `{text}` within {elapsed:.0f} s (the command ran in the container,"
                    f" which is not frozen) and it was killed: look at the unit there (pct enter {vmid}; systemctl"
                    " status; journalctl -e)")
        return ""


def container_frozen(vmid: int) -> bool:
    """Whether CT ``vmid``'s cgroup is frozen (lxc-freeze: cgroup2's cgroup.events, or the v1 freezer), as a process
    of its payload sees it; False when none runs there."""
    from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs  # not on the controller's path

    pids = _procs.cgroup_procs(f"/lxc/{int(vmid)}/ns")
    return bool(pids) and _procs.cgroup_frozen(pids[0])


def attached_in_container(pid: int, vmid: int) -> bool:
    """Whether a process of session ``pid`` (a command this module started: run_in_group's own session) runs in CT
    ``vmid`` (lxc-attach puts what pct exec runs in lxc/<vmid>/ns/.lxc, in the caller's session)."""
    from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs  # not on the controller's path

    for path in (f"/lxc/{int(vmid)}/ns/.lxc", f"/lxc/{int(vmid)}/ns", f"/lxc/{int(vmid)}"):
        for member in _procs.cgroup_procs(path):
            st = _procs.read_stat(member)
            if st is not None and st.session == pid:
                return True
    return False


class Background:
    """One call in a daemon thread of its own: the one way the modules run something beside the main line, or under
    a time limit. ``result(timeout=None)`` waits for it and gives its value or raises its error; past ``timeout``
    s it raises QueryTimeout naming ``what`` (the thread is abandoned: it never holds the module's exit)."""

    def __init__(self, func, *args, what: str = None):
        self.what = what or getattr(func, "__name__", "call")
        self._out = {}
        self._thread = threading.Thread(target=self._run, args=(func,) + args, name=f"gpuops:{self.what}", daemon=True)
        self._thread.start()

    def _run(self, func, *args):
        try:
            self._out["value"] = func(*args)
        except BaseException as exc:  # handed to the caller of result()  # pylint: disable=broad-except
            self._out["error"] = exc

    def result(self, timeout: float = None):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise QueryTimeout(
                f"{self.what} did not answer within {timeout:g} s: the driver may be hung (check dmesg for Xid"
                " errors and `nvidia-smi` on the host); raise query_timeout if the host is merely slow.",
                timeout=timeout, call=self.what)
        if "error" in self._out:
            raise self._out["error"]
        return self._out.get("value")


def run_all(func, items: list, workers: int) -> list:
    """``[func(item) for item in items]``, at most ``workers`` at a time in threads of their own; the first error is
    raised once all have ended."""
    from concurrent.futures import ThreadPoolExecutor

    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(func, items))
