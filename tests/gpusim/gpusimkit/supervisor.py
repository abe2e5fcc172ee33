"""The host's services: a respawning supervisor (a systemd service stand-in: systemd does not run as
this machine's PID 1) and the host's ``systemctl`` stand-in.  Services in containers are real systemd
units of the container (gpusimkit/container.py, SimHost.hold(service=..., ct=...)).

    python -m gpusimkit.supervisor --dir DIR --service NAME [--scope host]
        [--restart-delay S] [--stop-timeout S] [--ready-fd N]

Service files live in DIR/services/host/:

- ``<name>.json``: ``{"workload": [workload args...], "restart": true, "restart_delay": 0.5,
  "stop_timeout": 10, "python": "/path/to/python"}`` (written by SimHost.hold)
- ``<name>.pid``: the supervisor's pid as seen from its own PID namespace
- ``<name>.mainpid``: ``<host pid> <pid in the supervisor's namespace>`` of the running workload
- ``<name>.stopped``: present once the service was stopped (it is then not restarted)

The supervisor sits in ``<base>/init.scope`` (systemd's own cgroup; ``<base>`` is the host's
``gpusim-<id>``, see gpusimkit/cgroups.py) and runs the
workload as a child in its own session and process group, in the unit's cgroup
``<base>/system.slice/<name>.service`` (created at start, removed when the supervisor exits;
a respawned workload lands in the same one).  When the child dies it SIGKILLs what is left in
the unit's cgroup (and the process group), and unless the service was stopped (or ``restart`` is
false) starts it again after the restart delay.  On SIGTERM it stops as systemd's
KillMode=control-group does: writes ``.stopped``, SIGTERM to every process of the unit's cgroup
(and the child's process group), waits up to the stop timeout for the cgroup to empty, then
SIGKILL to all of them, and exits.  Without a cgroup (a machine where gpusim could not create
one) only the process group is signalled.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import selectors
import signal
import sys
import time
from typing import Dict, List, Optional, Tuple

from . import cgroups, proctools

log = logging.getLogger("gpusim.supervisor")

DEFAULT_RESTART_DELAY = 0.5
DEFAULT_STOP_TIMEOUT = 10.0
READY_TIMEOUT_S = 30.0


def scope_from_env() -> str:
    """Always ``host``: a container's systemctl is systemd's own."""
    return "host"


def service_dir(simdir: str, scope: str) -> str:
    return os.path.join(simdir, "services", str(scope))


def service_files(simdir: str, scope: str, name: str) -> Dict[str, str]:
    base = os.path.join(service_dir(simdir, scope), name)
    return {k: f"{base}.{k}" for k in ("json", "pid", "mainpid", "stopped")}


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path, encoding="utf-8") as f:
            words = f.read().split()
        return int(words[0]) if words else None
    except (OSError, ValueError):
        return None


class Supervisor:
    def __init__(self, simdir: str, scope: str, name: str, restart_delay: Optional[float],
                 stop_timeout: Optional[float], ready_fd: Optional[int]):
        self.simdir = simdir
        self.scope = scope
        self.name = name
        self.files = service_files(simdir, scope, name)
        with open(self.files["json"], encoding="utf-8") as f:
            self.conf = json.load(f)
        self.restart = bool(self.conf.get("restart", True))
        self.restart_delay = float(restart_delay if restart_delay is not None
                                   else self.conf.get("restart_delay", DEFAULT_RESTART_DELAY))
        self.stop_timeout = float(stop_timeout if stop_timeout is not None
                                  else self.conf.get("stop_timeout", DEFAULT_STOP_TIMEOUT))
        self.ready_fd = ready_fd
        self.stopping = False
        self.child: Optional[int] = None
        self.sel = selectors.DefaultSelector()
        self._sig_r = -1
        self.unit_cgroup: Optional[str] = None

    # --- plumbing ---------------------------------------------------------------------------
    def _install_signals(self) -> None:
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, lambda *_: None)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self._sig_r = r
        self.sel.register(r, selectors.EVENT_READ, "signal")

    def _drain_signals(self) -> None:
        try:
            data = os.read(self._sig_r, 512)
        except BlockingIOError:
            return
        if signal.SIGCHLD in data:
            proctools.reap_all()
        if signal.SIGTERM in data or signal.SIGINT in data:
            if not self.stopping:
                log.info("%s: SIGTERM: stopping", self.name)
            self.stopping = True

    def _wait(self, fd: Optional[int], timeout: Optional[float]) -> bool:
        """Wait until `fd` is readable (True), the timeout passes or a stop is asked (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if fd is not None:
            self.sel.register(fd, selectors.EVENT_READ, "fd")
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                for key, _mask in self.sel.select(left):
                    if key.data == "signal":
                        self._drain_signals()
                    elif key.data == "fd":
                        return True
                if self.stopping or (deadline is not None and time.monotonic() >= deadline):
                    return False
        finally:
            if fd is not None:
                self.sel.unregister(fd)

    def _report(self, text: str) -> None:
        if self.ready_fd is not None:
            try:
                proctools.write_line(self.ready_fd, text)
                os.close(self.ready_fd)
            except OSError:
                pass
            self.ready_fd = None

    def _killpg(self, pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _kill_unit(self, sig: int) -> None:
        """``sig`` to every process of the unit: its cgroup (KillMode=control-group) and the
        child's process group."""
        if self.child is not None:
            self._killpg(self.child, sig)
        if self.unit_cgroup:
            if sig == signal.SIGKILL:
                cgroups.kill(self.unit_cgroup)
            else:
                cgroups.signal_all(self.unit_cgroup, sig)

    def _unit_empty(self) -> bool:
        return not self.unit_cgroup or not cgroups.populated(self.unit_cgroup)

    def _wait_unit_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._unit_empty():
            if time.monotonic() >= deadline:
                return False
            proctools.reap_all()
            self._wait(None, min(0.02, max(0.0, deadline - time.monotonic())))
        return True

    def setup_cgroups(self) -> None:
        """Join <base>/init.scope and create the unit's cgroup (nothing without a base)."""
        base = cgroups.scope_base(self.simdir, self.scope)
        if base is None:
            return
        try:
            mgr = cgroups.manager_path(base)
            os.makedirs(mgr, exist_ok=True)
            cgroups.join(mgr)
            unit = cgroups.service_path(base, self.name)
            os.makedirs(unit, exist_ok=True)
        except OSError as e:
            log.info("%s: no cgroup for the unit: %s", self.name, e)
            return
        left = cgroups.procs(unit, recursive=True)
        if left:  # as systemd: "Found left-over process ... in control group while starting unit"
            log.info("%s: left-over processes in %s: %s", self.name, unit, left)
        self.unit_cgroup = unit

    def remove_unit_cgroup(self) -> None:
        if self.unit_cgroup and self._unit_empty():
            try:
                cgroups.remove_tree(self.unit_cgroup, timeout=2.0)
            except OSError as e:
                log.info("%s: cannot remove %s: %s", self.name, self.unit_cgroup, e)

    # --- the service ------------------------------------------------------------------------
    def start_child(self) -> Tuple[int, bool]:
        """Start the workload; returns its pidfd and whether it became ready."""
        python = self.conf.get("python") or sys.executable
        args = [str(a) for a in self.conf["workload"]] + ["--ready-fd", "3"]
        r, w = os.pipe2(os.O_CLOEXEC)
        env = proctools.kit_env()
        try:
            pid = proctools.spawn(proctools.python_argv("gpusimkit.workload", args, python), env, [w],
                                  os.path.join(self.simdir, "run", "workloads.log"), new_session=True,
                                  cgroup=self.unit_cgroup)
        finally:
            os.close(w)
        self.child = pid
        pidfd = os.pidfd_open(pid)
        try:
            line = ""
            if self._wait(r, READY_TIMEOUT_S):
                line = proctools.read_line(r, 1.0)
        finally:
            os.close(r)
        if line.strip().isdigit():
            hostpid = int(line)
            _write(self.files["mainpid"], f"{hostpid} {pid}\n")
            proctools.append_owned(self.simdir, hostpid, proctools.starttime(pid) if proctools.proc_is_ours() else None)
            log.info("%s: started pid %d (host pid %d)", self.name, pid, hostpid)
            self._report(str(hostpid))
            return pidfd, True
        log.info("%s: start failed: %s", self.name, line or "no readiness message")
        self._report(line if line.startswith("error") else f"error {line or 'the workload did not become ready'}")
        return pidfd, False

    def stop_child(self, pidfd: Optional[int]) -> None:
        """systemd's stop with KillMode=control-group: SIGTERM to every process of the unit,
        up to the stop timeout for them to go, then SIGKILL to what is left."""
        if self.child is None and self._unit_empty():
            return
        self._kill_unit(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        if pidfd is not None:
            while time.monotonic() < deadline:
                if self._wait(pidfd, deadline - time.monotonic()):
                    break
        self._wait_unit_empty(max(0.0, deadline - time.monotonic()))
        self._kill_unit(signal.SIGKILL)
        if pidfd is not None:
            self._wait(pidfd, 5.0)
        self._wait_unit_empty(5.0)
        proctools.reap_all()
        self.child = None

    def run(self) -> int:
        os.makedirs(service_dir(self.simdir, self.scope), exist_ok=True)
        self._install_signals()
        proctools.set_child_subreaper()
        self.setup_cgroups()
        _write(self.files["pid"], f"{os.getpid()}\n")
        _unlink(self.files["stopped"])
        try:
            hostpid = int(proctools.driver_request(self.simdir, "whoami"))
            proctools.append_owned(self.simdir, hostpid, proctools.starttime())
        except (proctools.DriverError, ValueError):
            pass
        pidfd = None
        rc = 0
        try:
            first = True
            while not self.stopping:
                pidfd, ready = self.start_child()
                if first and not ready:
                    rc = 1  # the first start failed: give up, as a failed `systemctl start` does
                    break
                first = False
                # Wait for the child to die (or for a stop).
                while not self.stopping:
                    if self._wait(pidfd, None):
                        break
                if self.stopping:
                    break
                log.info("%s: pid %d exited", self.name, self.child)
                self._kill_unit(signal.SIGKILL)  # leftovers of the unit (its cgroup, the process group)
                self._wait_unit_empty(5.0)
                proctools.reap_all()
                os.close(pidfd)
                pidfd = None
                self.child = None
                _unlink(self.files["mainpid"])
                if not self.restart or os.path.exists(self.files["stopped"]):
                    break
                self._wait(None, self.restart_delay)
        finally:
            if self.stopping:
                _write(self.files["stopped"], "")
            self.stop_child(pidfd)
            if pidfd is not None:
                os.close(pidfd)
            self.remove_unit_cgroup()
            _unlink(self.files["mainpid"])
            _unlink(self.files["pid"])
            self._report("error the service stopped before it was ready")
            log.info("%s: stopped", self.name)
        return rc


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="gpusimkit.supervisor", description="a respawning service supervisor")
    ap.add_argument("--dir", default=os.environ.get("GPUSIM_DIR"), help="the scenario directory")
    ap.add_argument("--service", required=True, help="service name")
    ap.add_argument("--scope", default="host", choices=["host"], help="host (the only scope)")
    ap.add_argument("--restart-delay", type=float, default=None, help=f"seconds (default {DEFAULT_RESTART_DELAY})")
    ap.add_argument("--stop-timeout", type=float, default=None, help=f"seconds (default {DEFAULT_STOP_TIMEOUT:g})")
    ap.add_argument("--ready-fd", type=int, default=None)
    args = ap.parse_args(argv)
    if not args.dir:
        ap.error("--dir is required (or $GPUSIM_DIR)")
    simdir = os.path.abspath(args.dir)
    logging.basicConfig(filename=os.path.join(simdir, "run", "supervisor.log"), level=logging.INFO,
                        format="%(asctime)s.%(msecs)03d [%(process)d] %(message)s", datefmt="%H:%M:%S")
    sup = Supervisor(simdir, args.scope or scope_from_env(), args.service, args.restart_delay, args.stop_timeout,
                     args.ready_fd)
    return sup.run()


# --- systemctl --------------------------------------------------------------------------------------

def _unit(arg: str) -> str:
    return arg[:-len(".service")] if arg.endswith(".service") else arg


def _supervisor_pid(files: Dict[str, str], name: str) -> Optional[int]:
    pid = _read_int(files["pid"])
    if pid is None or not proctools.pid_running(pid):
        return None
    if proctools.proc_is_ours():
        cmd = proctools.cmdline(pid)
        if "gpusimkit.supervisor" not in cmd or name not in cmd:
            return None
    return pid


def _start_supervisor(simdir: str, scope: str, name: str) -> str:
    """Start the supervisor detached; returns its readiness line."""
    files = service_files(simdir, scope, name)
    with open(files["json"], encoding="utf-8") as f:
        conf = json.load(f)
    python = conf.get("python") or sys.executable
    sargs = ["--dir", simdir, "--service", name, "--scope", scope, "--ready-fd", "3"]
    argv = proctools.python_argv("gpusimkit.supervisor", sargs, python)
    env = proctools.kit_env()
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        # Through the driver daemon: it reaps the supervisor when it exits.
        proctools.spawn_via_driver(simdir, argv, env, [w], os.path.join(simdir, "run", "supervisor.out"))
    finally:
        os.close(w)
    try:
        return proctools.read_line(r, READY_TIMEOUT_S + 5)
    finally:
        os.close(r)


def unit_cgroup(simdir: str, scope: str, name: str) -> Optional[str]:
    """<base>/system.slice/<name>.service of the scope (None without a cgroup)."""
    base = cgroups.scope_base(simdir, scope)
    return cgroups.service_path(base, name) if base else None


def _stop(simdir: str, scope: str, name: str, files: Dict[str, str]) -> None:
    _write(files["stopped"], "")
    try:
        with open(files["json"], encoding="utf-8") as f:
            timeout = float(json.load(f).get("stop_timeout", DEFAULT_STOP_TIMEOUT))
    except (OSError, ValueError):
        timeout = DEFAULT_STOP_TIMEOUT
    pid = _supervisor_pid(files, name)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout + 5
        while proctools.pid_running(pid):
            if time.monotonic() > deadline:  # like systemd after TimeoutStopSec: SIGKILL
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                deadline = float("inf")
            time.sleep(0.01)
    # Whatever is still in the unit's cgroup (its supervisor was killed, say) goes too, as
    # systemd stops a unit by its cgroup: SIGTERM, the stop timeout, SIGKILL.
    unit = unit_cgroup(simdir, scope, name)
    if unit and os.path.isdir(unit):
        if cgroups.populated(unit):
            cgroups.signal_all(unit, signal.SIGTERM)
            if not cgroups.wait_empty(unit, timeout):
                cgroups.kill(unit)
                cgroups.wait_empty(unit, 5.0)
        try:
            cgroups.remove_tree(unit, timeout=2.0)
        except OSError:
            pass


def _status_text(name: str, files: Dict[str, str], active: bool, cgroup: Optional[str] = None) -> str:
    out = [f"\u25cf {name}.service - gpusim simulated service {name}",
           f"     Loaded: loaded (/etc/systemd/system/{name}.service; enabled; preset: enabled)"]
    if active:
        try:
            since = datetime.datetime.fromtimestamp(os.stat(files["pid"]).st_mtime).strftime("%a %Y-%m-%d %H:%M:%S")
        except OSError:
            since = "?"
        out.append(f"     Active: active (running) since {since}")
        try:
            with open(files["mainpid"], encoding="utf-8") as f:
                words = f.read().split()
            main_pid = int(words[1])
            comm = ""
            if proctools.proc_is_ours():
                try:
                    with open(f"/proc/{main_pid}/comm", encoding="utf-8") as f:
                        comm = f" ({f.read().strip()})"
                except OSError:
                    pass
            out.append(f"   Main PID: {main_pid}{comm}")
        except (OSError, ValueError, IndexError):
            pass
        if cgroup:
            out.append(f"     CGroup: {cgroup}")
    else:
        out.append("     Active: inactive (dead)")
    return "\n".join(out)


def systemctl_main(argv: List[str], simdir: str) -> int:
    """systemctl stop|start|restart|is-active|status UNIT... over DIR/services/<scope>/."""
    scope = scope_from_env()
    words = [a for a in argv if not a.startswith("-")]
    if not words:
        print("systemctl (gpusim): usage: systemctl stop|start|restart|is-active|status UNIT...", file=sys.stderr)
        return 1
    verb, units = words[0], [_unit(u) for u in words[1:]]
    if verb not in ("stop", "start", "restart", "is-active", "status"):
        print(f"Unknown command verb '{verb}'.", file=sys.stderr)
        return 1
    if not units:
        print("Too few arguments.", file=sys.stderr)
        return 1
    quiet = "-q" in argv or "--quiet" in argv
    rc = 0
    for name in units:
        files = service_files(simdir, scope, name)
        known = os.path.exists(files["json"])
        running = known and _supervisor_pid(files, name) is not None
        active = running and not os.path.exists(files["stopped"])
        if verb == "is-active":
            if not quiet:
                print("active" if active else "inactive")
            rc = max(rc, 0 if active else 3)
        elif verb == "status":
            if not known:
                print(f"Unit {name}.service could not be found.", file=sys.stderr)
                rc = max(rc, 4)
                continue
            unit = unit_cgroup(simdir, scope, name)
            shown = None
            if unit and os.path.isdir(unit):
                try:
                    shown = cgroups.rel(unit)
                except cgroups.CgroupError:
                    shown = None
            print(_status_text(name, files, active, shown))
            rc = max(rc, 0 if active else 3)
        elif not known:
            what = "stop" if verb == "stop" else verb
            why = "not loaded" if verb == "stop" else "not found"
            print(f"Failed to {what} {name}.service: Unit {name}.service {why}.", file=sys.stderr)
            rc = max(rc, 5)
        else:
            if verb in ("stop", "restart"):
                _stop(simdir, scope, name, files)
            if verb in ("start", "restart") and _supervisor_pid(files, name) is None:
                _unlink(files["stopped"])
                line = _start_supervisor(simdir, scope, name)
                if not line.strip().isdigit():
                    print(f"Job for {name}.service failed: {line}", file=sys.stderr)
                    rc = max(rc, 1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
