"""A simulated GPU workload: a real process that holds simulated GPU memory and device files.

    python -m gpusimkit.workload --dir DIR --gpus 0,1 --mib 40960 [--type C|G|M|CG]
        [--name NAME] [--ignore-term] [--exit-delay S] [--tree] [--device-only]
        [--only-own-devices] [--control-only] [--fork-child] [--mps-control]
        [--record-signals FILE | --log-signals FILE] [--worker-name NAME] [--worker-setsid]
        [--ready-fd N | --ready-file PATH]

Like a CUDA process, it opens DIR/dev/nvidia<minor> of every GPU it can see (on the host: every
GPU of the scenario; in a container, ``$GPUSIM_VMID``: the GPUs of the container's config, its
``lxc.mount.entry``/``devN`` lines), plus those of its own GPUs, plus nvidiactl and nvidia-uvm,
and keeps them open; it registers its memory (its contexts) with the driver daemon (``alloc``)
only on its own GPUs (``--gpus``); it reports readiness by writing its host pid (as the daemon
sees it) and a newline to the ready fd or file (``error <message>`` if it could not start), and
then waits for signals.

--only-own-devices: open only the nodes of its own GPUs (the simulator's behaviour before it
modelled CUDA opening every visible node).

--tree: an inference-server tree: this process (the API parent) opens only nvidiactl and holds
no memory; it starts one worker per GPU (a workload with that one GPU's memory, opening the
nodes as above), and reports readiness once all workers are ready.  Killing only the parent
leaves the workers holding; SIGTERM to the parent is forwarded to the workers and the parent exits.

--device-only: hold device files but no memory (nvidiactl plus exactly the nodes of --gpus, no
nvidia-uvm), like nvidia-persistenced (``--gpus none --device-only --name nvidia-persistenced``).

--control-only: an NVML client such as a monitoring agent: only nvidiactl and nvidia-uvm, no
GPU node, no memory, nothing registered with the driver (--gpus and --mib are ignored).

--mps-control: an MPS control daemon (``nvidia-cuda-mps-control -d``; give it that --name): it holds no
device file and no memory and runs in a session of its own (it daemonizes), and it starts one MPS server
as its child: a workload named ``nvidia-cuda-mps-server`` with a compute context (``C``) and --mib on each
of --gpus (the server creates its context on every device it serves; its clients are other workloads,
``--type CM``, on the GPUs they use).  Ready once the server is.  SIGTERM ends the daemon alone (assumed;
``echo quit | nvidia-cuda-mps-control`` is the documented way to stop MPS).  The server does not exit by
itself when its last client goes, as a real one does: a test that needs it gone kills it.

--fork-child: once ready, fork one child that leaves the process group (setsid) and keeps the
inherited device files open, holding no context (a daemonized helper, a forked data loader):
only a kill of the whole cgroup reaches it.

--record-signals FILE: a bystander that notes what it is sent: every catchable signal (all but
SIGKILL and SIGSTOP, which cannot be caught, and SIGCHLD, which its own children's exits raise) is
caught, appended to FILE as a line ``<host pid> <starttime> <SIGNAME>`` (one write, O_APPEND) and
otherwise ignored: the process keeps running.  Whether it got SIGKILL shows in its absence (check
that the pid is alive with the same starttime).  Inherited by a tree's workers and a forked child.

--log-signals FILE: the same line for every catchable signal, and then the process does what it
would have done without the option (SIGTERM ends it, --ignore-term ignores it, a tree forwards
it): for processes whose fate a test decides afterwards (a target, a respawned service).

Both default to the environment (``GPUSIM_RECORD_SIGNALS``, ``GPUSIM_LOG_SIGNALS``), so that a
workload started through ``SimHost.hold`` or a supervisor (whose arguments the caller does not
write) can be given them.

--worker-name NAME (or ``GPUSIM_WORKER_NAME``): with --tree, the workers' command line (--name of
each worker) instead of the parent's: an engine that renames itself, like vLLM's
``VLLM::EngineCore`` under ``python3 -m vllm.entrypoints.openai.api_server``.

--title TITLE: once started, the process renames itself as setproctitle does on Linux - its argv area rewritten in
place (NUL-padded), so /proc/<pid>/cmdline reads TITLE, and comm set by prctl(PR_SET_NAME) - the way vLLM names its
engine and workers (``VLLM::EngineCore``, ``VLLM::Worker_TP0``; tests/gpusim/README.md, "Renamed processes").
--worker-title TITLE (or ``GPUSIM_WORKER_TITLE``): with --tree, each worker's --title, ``{i}`` replaced by its index.

--worker-setsid (or ``GPUSIM_WORKER_SETSID=1``): with --tree, each worker starts in a session of
its own (setsid), out of the parent's process group.

--name NAME: the process's command line becomes NAME (via a re-exec of the interpreter that reads
the program from a pipe): argv is ``[NAME]`` for one word, ``[word0, "-", word1, ...]`` for more
(e.g. ``python3 - -m vllm.entrypoints.openai.api_server``: the "-" is what lets Python take the
program from the pipe); comm is the basename of the first word (15 bytes at most).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import sys
import time
from typing import Dict, List, Optional, Tuple, Union

from . import proctools
from . import scenario as scn

BOOTSTRAP = """\
import json, os, sys
sys.path.insert(0, {kit!r})
argv = json.loads(os.environ.pop("GPUSIM_WORKLOAD_ARGV"))
if os.environ.pop("GPUSIM_UNSET_PYTHONHOME", None):
    os.environ.pop("PYTHONHOME", None)
from gpusimkit.workload import main
sys.exit(main(argv, named=True))
"""
READY_TIMEOUT_S = 30.0
MPS_SERVER = "nvidia-cuda-mps-server"


def parse_args(argv: List[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpusimkit.workload", description="a simulated GPU workload")
    ap.add_argument("--dir", default=os.environ.get("GPUSIM_DIR"), help="the scenario directory (default $GPUSIM_DIR)")
    ap.add_argument("--gpus", default="none", help="GPU indexes: 0,1 or 0-3 or all or none (default none)")
    ap.add_argument("--mib", type=int, default=1024, help="MiB held on each GPU (-1: not available)")
    ap.add_argument("--type", default="C", help="context types: any of C, G, M (default C)")
    ap.add_argument("--name", help="argv[0] and comm of the process")
    ap.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM")
    ap.add_argument("--exit-delay", type=float, help="exit this many seconds after SIGTERM")
    ap.add_argument("--tree", action="store_true", help="API parent + one worker per GPU")
    ap.add_argument("--device-only", action="store_true", help="hold device files, no memory")
    ap.add_argument("--only-own-devices", action="store_true",
                    help="open only the device nodes of its own GPUs (not every visible one)")
    ap.add_argument("--control-only", action="store_true",
                    help="hold only nvidiactl and nvidia-uvm, no memory, register nothing")
    ap.add_argument("--fork-child", action="store_true",
                    help="fork a child that leaves the process group and keeps the device files")
    ap.add_argument("--mps-control", action="store_true",
                    help="an MPS control daemon that starts one nvidia-cuda-mps-server child on --gpus")
    ap.add_argument("--record-signals", default=os.environ.get("GPUSIM_RECORD_SIGNALS") or None,
                    help="catch every catchable signal, note it in this file and keep running")
    ap.add_argument("--log-signals", default=os.environ.get("GPUSIM_LOG_SIGNALS") or None,
                    help="note every catchable signal in this file, then act on it as usual")
    ap.add_argument("--worker-name", default=os.environ.get("GPUSIM_WORKER_NAME") or None,
                    help="with --tree: the workers' name")
    ap.add_argument("--title", help="rename itself once started, as setproctitle does (argv rewritten, comm set)")
    ap.add_argument("--worker-title", default=os.environ.get("GPUSIM_WORKER_TITLE") or None,
                    help="with --tree: each worker's --title ({i}: its index, as in VLLM::Worker_TP{i})")
    ap.add_argument("--worker-setsid", action="store_true", default=os.environ.get("GPUSIM_WORKER_SETSID") == "1",
                    help="with --tree: each worker in a session of its own")
    ap.add_argument("--ready-fd", type=int, help="write the host pid here once ready")
    ap.add_argument("--ready-file", help="write the host pid to this file once ready")
    args = ap.parse_args(argv)
    if not args.dir:
        ap.error("--dir is required (or $GPUSIM_DIR)")
    return args


Target = Union[int, Tuple[int, int, int]]  # a GPU index, or (gpu, gi, ci): a MIG device


def gpu_of(target: Target) -> int:
    return target if isinstance(target, int) else target[0]


def target_text(target: Target) -> str:
    return str(target) if isinstance(target, int) else "/".join(str(x) for x in target)


def parse_targets(text: str, sc: scn.Scenario) -> List[Target]:
    """--gpus: GPU indexes (0,1 or 0-3 or all), MIG UUIDs (MIG-...) and <gpu>/<gi>/<ci> MIG devices, comma separated
    (README "MIG"); raises ScenarioError naming the bad field."""
    text = str(text).strip()
    if text == "none":
        return []
    parts = [p.strip() for p in text.split(",")]
    if not any(p.startswith("MIG-") or "/" in p for p in parts):
        return list(scn.parse_gpu_list(text, sc.gpu_count))
    out: List[Target] = []
    for part in parts:
        if part.startswith("MIG-"):
            found = [(g.index, d.gi, d.ci) for g in sc.gpus if g.mig_current for d in g.mig_devices
                     if d.uuid.lower() == part.lower()]
            if not found:
                raise scn.ScenarioError(f"invalid gpus={text!r}: no MIG device {part} on this host")
            out.append(found[0])
        elif "/" in part:
            m = re.fullmatch(r"(\d+)/(\d+)/(\d+)", part)
            if not m:
                raise scn.ScenarioError(f"invalid gpus={text!r}: a MIG device is <gpu>/<gi>/<ci>, like 0/1/0")
            g, gi, ci = (int(x) for x in m.groups())
            if g >= sc.gpu_count or not sc.gpus[g].mig_current or sc.gpus[g].mig_device((gi, ci)) is None:
                raise scn.ScenarioError(f"invalid gpus={text!r}: no MIG device {part} on this host")
            out.append((g, gi, ci))
        else:
            out.extend(scn.parse_gpu_list(part, sc.gpu_count))
    if len(set(out)) != len(out):
        raise scn.ScenarioError(f"invalid gpus={text!r}: duplicate GPU or MIG device")
    return out


def validate(args: argparse.Namespace, sc: scn.Scenario) -> List[Target]:
    """The GPU indexes and MIG devices; raises ScenarioError naming the bad field."""
    gpus = parse_targets(args.gpus, sc)
    if not (args.device_only or args.control_only):
        whole_mig = [g for g in gpus if isinstance(g, int) and sc.gpus[g].mig_current]
        if whole_mig:
            raise scn.ScenarioError(f"invalid gpus={args.gpus!r}: GPU {whole_mig[0]} is in MIG mode: a context is on one of"
                                    " its MIG devices (a MIG UUID or <gpu>/<gi>/<ci>)")
    t = args.type
    if not t or any(c not in "CGM" for c in t) or len(set(t)) != len(t):
        raise scn.ScenarioError(f"invalid type={t!r}: must be any of C, G, M, e.g. C or CG")
    if args.mib < -1:
        raise scn.ScenarioError(f"invalid mib={args.mib!r}: must be >= 0 (or -1: not available)")
    if args.exit_delay is not None and args.exit_delay < 0:
        raise scn.ScenarioError(f"invalid exit_delay={args.exit_delay!r}: must be >= 0")
    if args.tree and args.device_only:
        raise scn.ScenarioError("invalid tree=True: cannot be combined with device_only")
    if args.control_only and (args.tree or args.device_only):
        raise scn.ScenarioError("invalid control_only=True: cannot be combined with tree or device_only")
    if args.fork_child and (args.tree or args.control_only):
        raise scn.ScenarioError("invalid fork_child=True: cannot be combined with tree or control_only")
    if args.mps_control and (args.tree or args.device_only or args.control_only or args.fork_child):
        raise scn.ScenarioError("invalid mps_control=True: cannot be combined with tree, device_only, control_only or fork_child")
    if args.mps_control and not gpus:
        raise scn.ScenarioError("invalid gpus='none': an MPS control daemon's server needs at least one GPU")
    if args.tree and not gpus:
        raise scn.ScenarioError("invalid gpus='none': a tree needs at least one GPU")
    if args.record_signals and args.log_signals:
        raise scn.ScenarioError("invalid record_signals: cannot be combined with log_signals")
    for field in ("name", "worker_name", "title", "worker_title"):
        value = getattr(args, field)
        if value is not None and (not value.strip() or "\0" in value or "\n" in value):
            raise scn.ScenarioError(f"invalid {field}={value!r}: must be a non-empty single line")
    if args.name is not None and (not args.name.strip() or "\0" in args.name or "\n" in args.name):
        raise scn.ScenarioError(f"invalid name={args.name!r}: must be a non-empty single line")
    return gpus


def _python() -> str:
    return os.environ.get("GPUSIM_WORKLOAD_PYTHON") or sys.executable or os.readlink("/proc/self/exe")


def reexec_named(name: str, argv: List[str]) -> None:
    """exec the interpreter again with argv == [name], the program coming from a pipe on stdin."""
    python = _python()
    r, w = os.pipe()
    os.write(w, BOOTSTRAP.format(kit=proctools.KIT_ROOT).encode())
    os.close(w)
    os.dup2(r, 0)
    os.close(r)
    env = dict(os.environ, GPUSIM_WORKLOAD_ARGV=json.dumps(argv), GPUSIM_WORKLOAD_PYTHON=python)
    if "PYTHONHOME" not in env:
        # With argv[0] not naming the interpreter, Python cannot find its own prefix from it.
        env["PYTHONHOME"] = os.pathsep.join([sys.base_prefix, sys.base_exec_prefix])
        env["GPUSIM_UNSET_PYTHONHOME"] = "1"
    words = _name_words(name)
    # Python reads the program from stdin when argv is [argv0] or [argv0, "-", args...].
    os.execve(python, [words[0], "-", *words[1:]] if len(words) > 1 else words, env)


def _name_words(name: str) -> List[str]:
    try:
        words = shlex.split(name)
    except ValueError:
        words = name.split()
    return words or [name]


class Workload:
    def __init__(self, args: argparse.Namespace, simdir: str, gpus: List[Target], sc: scn.Scenario):
        self.args = args
        self.simdir = simdir
        self.gpus = gpus
        self.sc = sc
        self.fds: List[int] = []
        self.workers: Dict[int, int] = {}  # pid (our namespace) -> host pid
        self.hostpid = 0
        self._term_at: Optional[float] = None

    # --- device files -----------------------------------------------------------------------
    def visible_minors(self) -> List[int]:
        """Minors of the GPU nodes this process can see: in a container ($GPUSIM_VMID) those of
        the container's config, on the host every GPU of the scenario."""
        present = {g.minor for g in self.sc.gpus}
        vmid = os.environ.get("GPUSIM_VMID")
        if not vmid:
            return sorted(present)
        from . import container  # noqa: PLC0415
        try:
            minors = container.config_gpu_minors(self.simdir, vmid)
        except Exception:  # noqa: BLE001 (no config to read: only its own nodes)
            return []
        # bind,optional: a node the host lacks is simply not there.
        return sorted(m for m in minors if m in present)

    def device_names(self) -> List[str]:
        a = self.args
        if a.control_only:
            return ["nvidiactl", "nvidia-uvm"]
        if a.mps_control:
            return []
        if a.tree:
            return ["nvidiactl"]
        own = sorted({self.sc.gpus[gpu_of(g)].minor for g in self.gpus})
        # a MIG device's process opens the capability nodes of its GPU instance and compute instance
        # (README "MIG": /dev/nvidia-caps/nvidia-cap<N>)
        caps = []
        for t in self.gpus:
            if not isinstance(t, int):
                minor = self.sc.gpus[t[0]].minor
                caps += [f"nvidia-caps/nvidia-cap{scn.mig_cap_minor(minor, t[1])}",
                         f"nvidia-caps/nvidia-cap{scn.mig_cap_minor(minor, t[1], t[2])}"]
        if a.device_only:
            return [f"nvidia{m}" for m in own] + caps + ["nvidiactl"]
        minors = own if a.only_own_devices else sorted(set(own) | set(self.visible_minors()))
        return [f"nvidia{m}" for m in minors] + caps + ["nvidiactl", "nvidia-uvm"]

    def open_devices(self) -> None:
        dev = os.path.join(self.simdir, "dev")
        for n in self.device_names():
            self.fds.append(os.open(os.path.join(dev, n), os.O_RDWR | os.O_CLOEXEC))

    # --- registration -----------------------------------------------------------------------
    def register(self) -> int:
        a = self.args
        if self.gpus and not (a.tree or a.device_only or a.control_only or a.mps_control):
            spec = ",".join(f"{target_text(g)}:{self.args.mib}" for g in self.gpus)
            return int(proctools.driver_request(self.simdir, f"alloc {self.args.type} {spec}"))
        return int(proctools.driver_request(self.simdir, "whoami"))

    # --- tree -------------------------------------------------------------------------------
    def worker_specs(self) -> List[Dict[str, str]]:
        """[{gpus, type, name}] of the children: a tree's one worker per GPU; an MPS control daemon's one server."""
        if self.args.mps_control:
            return [{"gpus": ",".join(target_text(g) for g in self.gpus), "type": "C", "name": MPS_SERVER}]
        title = self.args.worker_title
        return [{"gpus": target_text(g), "type": self.args.type, "name": self.args.worker_name or self.args.name,
                 "title": title.replace("{i}", str(i)) if title else None} for i, g in enumerate(self.gpus)]

    def start_workers(self) -> None:
        env = proctools.kit_env()
        for key in ("GPUSIM_WORKLOAD_ARGV", "GPUSIM_WORKER_NAME", "GPUSIM_WORKER_SETSID", "GPUSIM_WORKER_TITLE"):
            env.pop(key, None)
        logpath = os.path.join(self.simdir, "run", "workloads.log")
        pending = []
        for spec in self.worker_specs():
            wargs = [f"--dir={self.simdir}", f"--gpus={spec['gpus']}", f"--mib={self.args.mib}", f"--type={spec['type']}",
                     "--ready-fd=3"]
            name = spec["name"]
            if name:
                wargs.append(f"--name={name}")
            if spec.get("title"):
                wargs.append(f"--title={spec['title']}")
            if self.args.record_signals:
                wargs.append(f"--record-signals={self.args.record_signals}")
            if self.args.log_signals:
                wargs.append(f"--log-signals={self.args.log_signals}")
            if self.args.ignore_term:
                wargs.append("--ignore-term")
            if self.args.exit_delay is not None:
                wargs.append(f"--exit-delay={self.args.exit_delay!r}")
            if self.args.only_own_devices:
                wargs.append("--only-own-devices")
            r, w = os.pipe2(os.O_CLOEXEC)
            try:
                # Same session and process group as the parent (a supervisor's killpg reaches all),
                # unless --worker-setsid.
                pid = proctools.spawn(proctools.python_argv("gpusimkit.workload", wargs, _python()), env, [w],
                                      logpath, new_session=self.args.worker_setsid)
            finally:
                os.close(w)
            pending.append((pid, r))
        errors = []
        for pid, r in pending:
            try:
                line = proctools.read_line(r, READY_TIMEOUT_S)
            except TimeoutError as e:
                line = f"error {e}"
            finally:
                os.close(r)
            if line.strip().isdigit():
                self.workers[pid] = int(line)
            else:
                errors.append(f"worker {pid}: {line or 'exited before it was ready'}")
        if errors:
            for pid in pending:
                self._kill(pid[0], signal.SIGKILL)
            raise RuntimeError("; ".join(errors))

    def _kill(self, pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    # --- signals ----------------------------------------------------------------------------
    def on_term(self, _signum, _frame) -> None:
        for pid in list(self.workers):
            self._kill(pid, signal.SIGTERM)
        if self.args.exit_delay:
            if self._term_at is None:
                self._term_at = time.monotonic()
                signal.setitimer(signal.ITIMER_REAL, self.args.exit_delay)
            return
        os._exit(0)

    def on_alarm(self, _signum, _frame) -> None:
        os._exit(0)

    def on_child(self, _signum, _frame) -> None:
        for pid, _status in proctools.reap_all():
            self.workers.pop(pid, None)

    def install_signals(self) -> None:
        if self.args.ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif self.args.tree or self.args.exit_delay is not None:
            signal.signal(signal.SIGTERM, self.on_term)
            signal.signal(signal.SIGALRM, self.on_alarm)
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if self.args.tree or self.args.fork_child or self.args.mps_control:
            signal.signal(signal.SIGCHLD, self.on_child)
        if self.args.record_signals or self.args.log_signals:
            self.install_recorder()

    def install_recorder(self) -> None:
        """--record-signals / --log-signals: a handler on every catchable signal that notes it
        (and, for --log-signals, then does what the disposition installed above would do)."""
        path = self.args.record_signals or self.args.log_signals
        keep_running = bool(self.args.record_signals)
        skip = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}
        if self.args.exit_delay and not keep_running:
            skip.add(signal.SIGALRM)  # its own timer (--exit-delay), not a signal it was sent
        for sig in sorted(signal.valid_signals() - skip):
            try:
                before = signal.getsignal(sig)
                signal.signal(sig, _Recorder(self, path, None if keep_running else before))
            except (OSError, ValueError, RuntimeError):
                pass  # (the C library's own real-time signals)

    def note_signal(self, path: str, signum: int) -> None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"SIG{signum}"
        line = f"{self.hostpid or '?'} {proctools.starttime() or '?'} {name}\n".encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def run(self) -> None:
        if self.args.title:
            proctools.set_title(self.args.title)
        self.install_signals()
        self.open_devices()
        if self.args.mps_control:
            try:
                os.setsid()  # -d: the daemon leaves the caller's session
            except OSError:
                pass  # already a session leader
        if self.args.tree or self.args.mps_control:
            self.start_workers()
        self.hostpid = self.register()
        proctools.append_owned(self.simdir, self.hostpid, proctools.starttime())
        if self.args.fork_child:
            self.fork_child()

    def fork_child(self) -> None:
        """A child that leaves the process group and keeps the inherited device files open; it
        records itself in DIR/run/owned and holds no context.  Returns once it is set up."""
        r, w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                os.setsid()
                hostpid = int(proctools.driver_request(self.simdir, "whoami"))
                self.hostpid = hostpid  # (what --record-signals notes in the child)
                proctools.append_owned(self.simdir, hostpid, proctools.starttime())
                proctools.write_line(w, str(hostpid))
                os.close(w)
                while True:
                    signal.pause()
            except BaseException as e:  # noqa: BLE001
                try:
                    proctools.write_line(w, f"error {e}")
                finally:
                    os._exit(1)
        os.close(w)
        try:
            line = proctools.read_line(r, READY_TIMEOUT_S)
        finally:
            os.close(r)
        if not line.strip().isdigit():
            self._kill(pid, signal.SIGKILL)
            raise RuntimeError(f"forked child {pid}: {line or 'exited before it was ready'}")
        self.workers[pid] = int(line)


# Signals whose default action is to do nothing (signal(7)).
_DEFAULT_IGNORED = {signal.SIGCHLD, signal.SIGURG, signal.SIGWINCH, signal.SIGCONT}


class _Recorder:
    """A signal handler that notes the signal, then (``then`` not None) acts as ``then`` would."""

    def __init__(self, workload: "Workload", path: str, then):
        self.workload, self.path, self.then = workload, path, then

    def __call__(self, signum, frame) -> None:
        try:
            self.workload.note_signal(self.path, signum)
        except OSError:
            pass
        then = self.then
        if then is None or then == signal.SIG_IGN:
            return
        if callable(then):
            then(signum, frame)
        elif signum not in _DEFAULT_IGNORED:  # SIG_DFL: die of it, as without the handler
            signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
            os.kill(os.getpid(), signum)


def report(args: argparse.Namespace, text: str) -> None:
    if args.ready_fd is not None:
        try:
            proctools.write_line(args.ready_fd, text)
        except OSError:
            pass
        try:
            os.close(args.ready_fd)
        except OSError:
            pass
        args.ready_fd = None
    if args.ready_file:
        tmp = f"{args.ready_file}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, args.ready_file)
        args.ready_file = None


def main(argv: Optional[List[str]] = None, named: bool = False) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.name and not named:
        reexec_named(args.name, argv)  # does not return
    if args.name:
        first = _name_words(args.name)[0]
        try:
            proctools.set_comm(os.path.basename(first) or first)
        except OSError:
            pass
    # stdin: /dev/null (it was the bootstrap pipe after a re-exec).
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    simdir = os.path.abspath(args.dir)
    try:
        sc = scn.load(simdir)
        gpus = validate(args, sc)
        w = Workload(args, simdir, gpus, sc)
        w.run()
    except Exception as e:  # noqa: BLE001 (any failure before readiness goes to the caller)
        report(args, f"error {e}")
        print(f"gpusimkit.workload: {e}", file=sys.stderr)
        return 1
    report(args, str(w.hostpid))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
