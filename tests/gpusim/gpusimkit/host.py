"""SimHost: the one Python API over a simulated GPU host (the CLI, the pytest fixture and the
benchmarks all use it).

    host = SimHost.up("/tmp/sim", gpus=8)
    env = host.env()                      # os.environ + PATH, LD_LIBRARY_PATH, GPUSIM_DIR
    pid = host.hold("0,1", 40960)         # a workload holding 40 GiB on GPUs 0 and 1
    host.fault(lose_gpu=3, after=2.0)
    host.down()

Every process gpusim starts is recorded in DIR/run/owned as ``<host pid> <starttime>``; down()
signals only those, and only while the starttime still matches.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import cgroups, profiles, proctools
from . import scenario as scn
from .scenario import ScenarioError

# Unix socket paths are limited to 108 bytes (sun_path), NUL included.
MAX_SOCK_PATH = 107
CREATED_MARKER = ".gpusim-created"
LAYOUT = ("lib", "bin", "ctbin", "dev", "proc", "run", "ct", "lxc", "etc", "services", "scenario", "scenario.json", "scenario.lock",
          "procs", "kmsg", CREATED_MARKER)
# The simulated kernel log (README "Health"): /dev/kmsg records, Xid lines appended by fault(xid=...).
KMSG = "kmsg"
# The driver's MIG capabilities (README "MIG"): the node's /proc/driver/nvidia/capabilities, read by the modules through
# GPUOPS_NVIDIA_CAPS.
MIG_CAPS_PROC = ("proc", "driver", "nvidia", "capabilities")
ENV_FILE = "env.json"
# Xid: the text the driver logs after the code (NVIDIA's Xid catalog; "GPU has fallen off the bus" as in
# NVIDIA/open-gpu-kernel-modules#1151's logs). Other codes are logged with a generic text.
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_00000000.",
    43: "Ch 00000010",
    45: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper Error: row remapping failed.",
    74: "NVLINK: fatal error detected on link 3",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP!",
    120: "GSP task exception",
}
HEALTH_FIELDS = ("remap_corrected", "remap_uncorrected", "remap_pending", "remap_failure", "retired_pending",
                 "ecc_mode", "ecc_volatile_corrected", "ecc_volatile_uncorrected", "fabric_state", "fabric_status",
                 "clock_reasons", "inforom_corrupt")
INIT_ERROR_NAMES = {"none": 0, "ok": 0, "driver_not_loaded": 9, "version_mismatch": 18, "no_permission": 4}
SERVICE_RE = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
READY_TIMEOUT_S = 30.0

WRAPPER = """\
#!{python}
# Installed by `gpusim up`: {what} of the simulated host in {simdir}.
import sys
sys.path.insert(0, {kit!r})
from {module} import {func} as _main
sys.exit(_main(sys.argv[1:], {simdir!r}))
"""
WRAPPERS = (
    ("bin", "nvidia-smi", "gpusimkit.smi", "main", "nvidia-smi"),
    ("bin", "pct", "gpusimkit.pct", "main", "pct"),
    ("bin", "systemctl", "gpusimkit.supervisor", "systemctl_main", "the host's systemctl stand-in (host scope)"),
    ("ctbin", "nvidia-smi", "gpusimkit.smi", "main", "nvidia-smi as installed in a container (first on PATH there)"),
)
UNIT = """\
# Written by gpusim (SimHost.hold): the workload {name} as a systemd unit of the container.
[Unit]
Description=gpusim workload {name}

[Service]
Type=simple
ExecStart={execstart}
{environment}
Restart={restart}
RestartSec={restart_sec}
TimeoutStopSec={stop_sec}
KillMode=control-group
StandardOutput=append:{log}
StandardError=append:{log}

[Install]
WantedBy=multi-user.target
"""


def _unit_quote(arg: str) -> str:
    """One ExecStart=/Environment= word as systemd.service(5) reads it (C escapes, % specifiers, $)."""
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$") + '"'


class SimError(RuntimeError):
    """The simulated host could not do what was asked."""


def _gpu_text(gpus: Union[str, int, Iterable[int], None]) -> str:
    if gpus is None:
        return "none"
    if isinstance(gpus, bool):
        raise ScenarioError(f"invalid gpus={gpus!r}: must be indexes like 0,1 or all or none")
    if isinstance(gpus, int):
        return str(gpus)
    if isinstance(gpus, str):
        return gpus.strip()
    if isinstance(gpus, tuple) and len(gpus) == 3 and all(isinstance(x, int) for x in gpus):
        gpus = [gpus]  # one MIG device as (gpu, gi, ci)
    out = []
    for g in gpus:
        if isinstance(g, tuple):  # a MIG device (gpu, gi, ci)
            out.append("/".join(str(int(x)) for x in g))
        elif isinstance(g, str) and g.startswith("MIG-"):
            out.append(g)
        else:
            out.append(str(int(g)))
    return ",".join(out)


def _as_int(value: Any, field: str) -> int:
    if isinstance(value, bool):
        raise ScenarioError(f"invalid {field}={value!r}: must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ScenarioError(f"invalid {field}={value!r}: must be an integer") from None


def _mounts_under(path: str) -> List[str]:
    """Mount points at or below `path` in our mount namespace."""
    path = os.path.realpath(path)
    out = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                mp = line.split()[4].encode().decode("unicode_escape")
                if mp == path or mp.startswith(path + "/"):
                    out.append(mp)
    except OSError:
        pass
    return out


def _ppid(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _kill(pid: int, start: int, sig: int) -> bool:
    """Signal `pid` only if it is still the process with this starttime."""
    if not proctools.alive(pid, start):
        return False
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


class SimHost:
    def __init__(self, simdir: str):
        self.dir = os.path.abspath(simdir)
        self._daemon: Optional[subprocess.Popen] = None

    # --- paths ------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    @property
    def created(self) -> bool:
        return os.path.exists(self.path(CREATED_MARKER))

    def daemon_pid(self) -> Optional[int]:
        try:
            with open(self.path("run", "driver.pid"), encoding="utf-8") as f:
                return int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def is_up(self) -> bool:
        try:
            proctools.driver_request(self.dir, "ping", timeout=2.0)
            return True
        except proctools.DriverError:
            return False

    # --- up ---------------------------------------------------------------------------------
    @classmethod
    def up(cls, dir: str, gpus: Optional[int] = None, model: Optional[str] = None,  # noqa: A002 (the CLI's --dir)
           memory_mib: Optional[int] = None, release_lag_ms: int = 0, pid_mode: str = "translate",
           hidden_symbols: Sequence[str] = (), driver: str = profiles.DEFAULT_PROFILE) -> "SimHost":
        """Start a host of driver profile ``driver`` (gpusimkit/profiles.py; default r580, 8 x H200).
        ``gpus``, ``model`` and ``memory_mib`` default to the profile's; ``hidden_symbols`` are
        hidden in addition to the profile's."""
        simdir = os.path.abspath(dir)
        sock = os.path.join(simdir, "run", "driver.sock")
        if len(sock.encode()) > MAX_SOCK_PATH:
            raise ScenarioError(f"invalid dir={simdir!r}: too long for a unix socket path ({sock})")
        if isinstance(hidden_symbols, str):
            hidden_symbols = [s for s in hidden_symbols.split(",") if s.strip()]
        sc = scn.profile_scenario(driver, None if gpus is None else _as_int(gpus, "gpus"), model,
                                  None if memory_mib is None else _as_int(memory_mib, "memory_mib"), seed=simdir,
                                  hidden_symbols=[s.strip() for s in hidden_symbols])
        sc.release_lag_ms = _as_int(release_lag_ms, "release_lag_ms")
        sc.pid_mode = pid_mode
        sc.validate()
        cls.check_hidden(sc.hidden_symbols)

        host = cls(simdir)
        if os.path.exists(simdir):
            if not os.path.isdir(simdir):
                raise ScenarioError(f"invalid dir={simdir!r}: exists and is not a directory")
            if host.is_up():
                raise SimError(f"a simulated host is already up in {simdir} (gpusim down --dir {simdir})")
            created = False
        else:
            os.makedirs(simdir)
            created = True
        try:
            if created:
                with open(host.path(CREATED_MARKER), "w", encoding="utf-8") as f:
                    f.write("created by gpusim up; removed by gpusim down\n")
            for d in ("lib", "bin", "ctbin", "dev", "run", "ct", "lxc", "services"):
                os.makedirs(host.path(d), exist_ok=True)
            with open(host.path(KMSG), "a", encoding="utf-8"):
                pass  # the simulated kernel log: empty until a fault logs an Xid
            scn.save(simdir, sc)
            from . import container  # noqa: PLC0415
            container.make_pve(simdir)  # the node's /etc/pve: .vmlist, nodes/<node>/lxc (README "The node's files")
            try:
                cgroups.make_host(simdir)
            except cgroups.CgroupError as e:
                raise SimError(str(e)) from None
            host._make_devices(sc)
            host._install_library(sc.hidden_symbols)
            host._make_wrappers()
            host._start_daemon()
            # What points programs at this host (env_vars), for harnesses that cannot call Python: the integration
            # targets and molecule read it (DIR/env.json).
            with open(os.path.join(simdir, ENV_FILE), "w", encoding="utf-8") as f:
                json.dump(host.env_vars(), f, indent=1, sort_keys=True)
        except BaseException:
            host.down()
            raise
        return host

    def _make_devices(self, sc: scn.Scenario) -> None:
        for name in [f"nvidia{g.minor}" for g in sc.gpus] + ["nvidiactl", "nvidia-uvm"]:
            p = self.path("dev", name)
            with open(p, "a", encoding="utf-8"):
                pass
            os.chmod(p, 0o666)
        self._make_mig_nodes(sc)

    def _make_mig_nodes(self, sc: scn.Scenario) -> None:
        """DIR/dev/nvidia-caps/nvidia-cap<N> of every MIG device, and DIR/proc/driver/nvidia/capabilities/gpu<minor>/
        mig/gi<g>/access and .../ci<c>/access ("DeviceFileMinor: N"), as the driver makes them (README "MIG"); the
        capabilities of instances no longer there are removed."""
        caps = self.path("dev", "nvidia-caps")
        tree = self.path(*MIG_CAPS_PROC)
        shutil.rmtree(tree, ignore_errors=True)
        keep = set()
        for g in sc.gpus:
            if not g.mig_current:
                continue
            for d in g.mig_devices:
                for ci, rel in ((None, f"gpu{g.minor}/mig/gi{d.gi}/access"), (d.ci, f"gpu{g.minor}/mig/gi{d.gi}/ci{d.ci}/access")):
                    minor = scn.mig_cap_minor(g.minor, d.gi, ci)
                    keep.add(f"nvidia-cap{minor}")
                    path = os.path.join(tree, rel)
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
        if keep:
            os.makedirs(caps, exist_ok=True)
        for name in sorted(keep):
            p = os.path.join(caps, name)
            with open(p, "a", encoding="utf-8"):
                pass
            os.chmod(p, 0o444)  # DeviceFileMode 292 = 0444
        if os.path.isdir(caps):
            for name in os.listdir(caps):
                if name not in keep:
                    os.unlink(os.path.join(caps, name))

    def set_mig(self, gpu: int, profiles: Optional[Sequence[str]] = None, current: Optional[int] = None,
                pending: Optional[int] = None) -> List[Dict[str, Any]]:
        """MIG on GPU ``gpu`` (README "MIG"): ``profiles`` (``["3g.71gb", "1g.18gb"]``: one GPU instance with one
        compute instance each) turns MIG mode on (current and pending 1, unless given) with those MIG devices;
        ``profiles=[]`` leaves MIG on with no MIG device; ``current``/``pending`` alone set the modes (a pending change
        waits for a GPU reset). Returns the GPU's MIG devices: [{uuid, gi, ci, profile, memory_mib, gi_cap, ci_cap}]."""
        with scn.edit(self.dir) as sc:
            g = sc.gpus[self._gpu_index(gpu, sc.gpu_count, "gpu")]
            if profiles is not None:
                g.mig_current = 1 if current is None else int(current)
                g.mig_pending = g.mig_current if pending is None else int(pending)
                g.mig_devices = scn.mig_layout(g, list(profiles), seed=self.dir)
            else:
                if current is not None:
                    g.mig_current = int(current)
                if pending is not None:
                    g.mig_pending = int(pending)
                if not g.mig_current:
                    g.mig_devices = []
        self._make_mig_nodes(sc)
        return self.mig_devices(g.index)

    def mig_devices(self, gpu: int) -> List[Dict[str, Any]]:
        """The MIG devices of GPU ``gpu`` as set_mig returns them (empty when MIG is off)."""
        sc = self.scenario()
        g = sc.gpus[self._gpu_index(gpu, sc.gpu_count, "gpu")]
        if not g.mig_current:
            return []
        return [{"uuid": d.uuid, "gpu": g.index, "gi": d.gi, "ci": d.ci, "profile": d.profile, "memory_mib": d.memory_mib,
                 "gi_cap": scn.mig_cap_minor(g.minor, d.gi), "ci_cap": scn.mig_cap_minor(g.minor, d.gi, d.ci)}
                for d in g.mig_devices]

    def _install_library(self, hidden: Sequence[str]) -> None:
        from . import build  # noqa: PLC0415 (written by another piece; imported when needed)
        build.ensure_built()
        build.install_library(self.dir, tuple(hidden))

    @staticmethod
    def check_hidden(hidden: Sequence[str]) -> None:
        """ScenarioError unless every name is a symbol the library exports."""
        if not hidden:
            return
        from . import build  # noqa: PLC0415
        exported = set(build.exported_symbols())
        bad = [h for h in hidden if h not in exported]
        if bad:
            raise ScenarioError(f"invalid hidden_symbols={','.join(bad)!r}: not exported by the simulated "
                                f"libnvidia-ml.so.1 (e.g. nvmlDeviceGetComputeRunningProcesses_v3)")

    def _make_wrappers(self) -> None:
        python = sys.executable or os.readlink("/proc/self/exe")
        for sub, name, module, func, what in WRAPPERS:
            p = self.path(sub, name)
            with open(p, "w", encoding="utf-8") as f:
                f.write(WRAPPER.format(python=python, what=what, simdir=self.dir, kit=proctools.KIT_ROOT,
                                       module=module, func=func))
            os.chmod(p, 0o755)

    def _start_daemon(self) -> None:
        logpath = self.path("run", "driver.log")
        with open(logpath, "ab") as logf:
            self._daemon = subprocess.Popen(  # noqa: S603 (our own interpreter and module)
                proctools.python_argv("gpusimkit.driver", ["--dir", self.dir]), env=proctools.kit_env(),
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True, close_fds=True,
                cwd="/")
        deadline = time.monotonic() + 15
        while True:
            if self._daemon.poll() is not None:
                raise SimError(f"the driver daemon exited with {self._daemon.returncode}: {self._tail(logpath)}")
            if os.path.exists(self.path("run", "driver.pid")) and self.is_up():
                return
            if time.monotonic() > deadline:
                raise SimError(f"the driver daemon did not answer ping within 15 s: {self._tail(logpath)}")
            time.sleep(0.01)

    @staticmethod
    def _tail(path: str, n: int = 2000) -> str:
        return proctools.tail(path, n)

    # --- environment ------------------------------------------------------------------------
    def env_vars(self) -> Dict[str, str]:
        """Only the variables that point programs at this host."""
        path = os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        parts = [p for p in path.split(os.pathsep) if p and p != self.path("bin")]
        return {
            "PATH": os.pathsep.join([self.path("bin"), *parts]),
            "LD_LIBRARY_PATH": self.path("lib"),
            "GPUSIM_DIR": self.dir,
            # The modules read Xid events from this file, never from the real kernel log (README "Health").
            "GPUOPS_KERNEL_LOG": self.path(KMSG),
            # Each simulated node has its own /run for the release locks (plugins/module_utils/_host/lock.py).
            "GPUOPS_LOCK_DIR": self.path("run", "gpuops.gpu"),
            # The node's /etc/pve (pmxcfs) and LXC's lxcpath (the monitors' command sockets): the fence reads them
            # (plugins/module_utils/_fence.py, README "The node's files").
            "GPUOPS_PVE_DIR": self.path("etc", "pve"),
            "GPUOPS_LXC_PATH": os.path.join(os.path.realpath(self.dir), "lxc"),
            # /proc/driver/nvidia/capabilities: which MIG device a /dev/nvidia-caps/nvidia-cap<N> stands for (README "MIG").
            "GPUOPS_NVIDIA_CAPS": self.path(*MIG_CAPS_PROC),
        }

    def env(self) -> Dict[str, str]:
        """A complete environment: os.environ with PATH (DIR/bin first), LD_LIBRARY_PATH=DIR/lib
        and GPUSIM_DIR=DIR."""
        return {**os.environ, **self.env_vars()}

    # --- workloads --------------------------------------------------------------------------
    def scenario(self) -> scn.Scenario:
        return scn.load(self.dir)

    def ct_create(self, vmid: int, hostname: Optional[str] = None, gpus="all", systemd: bool = False,
                  devices_style: str = "lxc", unprivileged: bool = False, users: Optional[Dict[str, int]] = None) -> None:
        """Create Proxmox container ``vmid`` (a real LXC container, gpusimkit.container) with the GPUs
        passed through; ``systemd``: a Debian 12 rootfs with systemd as PID 1 (services started in it
        with hold(service=...) are systemd units), else busybox.  unprivileged: its uids mapped as PVE maps
        them (container uid 0 -> node uid 100000); users: {name: uid} of the container's own /etc/passwd."""
        from . import container  # noqa: PLC0415
        container.create(self.dir, int(vmid), hostname, gpus, devices_style=devices_style, systemd=systemd,
                         unprivileged=unprivileged, users=users)

    def ct_start(self, vmid: int) -> None:
        from . import container  # noqa: PLC0415
        container.start(self.dir, int(vmid))

    def ct_status(self, vmid: int) -> str:
        """"running" or "stopped" (lxc-info -s), as ``pct status`` says it."""
        from . import container  # noqa: PLC0415
        return container.status(self.dir, int(vmid))

    def ct_config_path(self, vmid: int) -> str:
        """The container's Proxmox config file (/etc/pve/lxc/<vmid>.conf of the node): a test appends lines to it."""
        from . import container  # noqa: PLC0415
        return container.config_path(self.dir, int(vmid))

    def ct_freeze(self, vmid: int, freeze: bool = True) -> None:
        """lxc-freeze (freeze=False: lxc-unfreeze) the running container: every process in it stops being scheduled."""
        from . import container  # noqa: PLC0415
        tool = "lxc-freeze" if freeze else "lxc-unfreeze"
        r = subprocess.run(container.lxc_argv(self.dir, tool, int(vmid)), capture_output=True, text=True, timeout=30,
                           check=False)
        if r.returncode != 0:
            raise SimError(f"{tool} {vmid} exited {r.returncode}: {(r.stderr or r.stdout).strip()}")

    def spawn(self, argv: Sequence[str], env: Optional[Dict[str, str]] = None,
              ct: Optional[Union[int, str]] = None) -> Optional[int]:
        """Start any command (argv[0] a path: it is exec'd as it is), detached, where the host's processes run: on
        the host, in the session scope (started by the driver daemon, in owned(): kill() and down() end it; env None:
        env()), or in the container ``ct`` (lxc-attach, the container's init adopts it; stdout/stderr to its console
        log; env None: the container's default; not in owned(): the container's stop ends it).  Returns its host
        pid (None: it exited at once, in a container)."""
        if ct is not None:
            from . import container  # noqa: PLC0415
            return container.spawn(self.dir, int(ct), list(argv), env)
        return proctools.spawn_via_driver(self.dir, list(argv), self.env() if env is None else env,
                                          cgroup=cgroups.session_path(self.dir))

    def workload_command(self, wargs: Sequence[str]) -> Tuple[List[str], Dict[str, str]]:
        """(argv, env) of a simulated workload (``python -m gpusimkit.workload`` with ``wargs``: --dir=, --gpus=,
        --mib=, --ready-file=, ... as README "Workloads") for a test that starts it itself (under unshare, in a
        shell loop): env is env() with the kit importable.  gpusim did not start it: the test ends it."""
        return proctools.python_argv("gpusimkit.workload", list(wargs)), proctools.kit_env(self.env())

    def owned(self) -> List[Tuple[int, int]]:
        """(pid, starttime) of every process gpusim started for this host (DIR/run/owned), alive or not."""
        return proctools.read_owned(self.dir)

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` is the simulated machine's: gpusim started it, or it runs in the host's cgroup tree
        (gpusim-<id>) or in a container's (lxc/<vmid>)."""
        if any(p == pid for p, _start in self.owned()):
            return True
        path = cgroups.of_pid(pid) or ""
        base = cgroups.host_base(self.dir)
        return path.startswith("/lxc/") or (base is not None and path.startswith(cgroups.rel(base)))

    def set_gpu(self, index: int, /, **fields: Any) -> None:
        """Set fields of GPU ``index`` in the scenario (its attributes as scenario() shows them: minor, util_gpu,
        persistence, display_active, fabric_state, ...): set_gpus({index: fields})."""
        self.set_gpus({index: fields})

    def set_gpus(self, changes: Dict[int, Dict[str, Any]]) -> None:
        """Set fields of several GPUs, {index: {field: value}}, in one validated, locked write (what must change
        together: swapping minor numbers, which must stay unique); ScenarioError for an unknown GPU or field, or a
        value the scenario refuses, and then nothing is written.  Programs read it at their next call."""
        with scn.edit(self.dir) as sc:
            for index, fields in changes.items():
                if not 0 <= int(index) < len(sc.gpus):
                    raise ScenarioError(f"gpu: {index!r}: no such GPU (0-{len(sc.gpus) - 1})")
                gpu = sc.gpus[int(index)]
                for key, value in fields.items():
                    if key == "index" or not hasattr(gpu, key):
                        raise ScenarioError(f"gpu.{index}.{key}: not a GPU field")
                    setattr(gpu, key, value)

    def pct_calls(self) -> List[List[str]]:
        """The simulated node's pct invocations so far, oldest first: [pid, argument, ...] each."""
        from . import pct  # noqa: PLC0415
        return pct.calls(self.dir)

    def hold(self, gpus: Union[str, int, Iterable[int], None], mib: int = 1024, ct: Optional[Union[int, str]] = None,
             tree: bool = False, ignore_term: bool = False, exit_delay: Optional[float] = None,
             respawn: bool = False, service: Optional[str] = None, name: Optional[str] = None,
             type: str = "C", device_only: bool = False,  # noqa: A002 (the CLI's --type)
             restart_delay: Optional[float] = None, stop_timeout: Optional[float] = None,
             only_own_devices: bool = False, control_only: bool = False, fork_child: bool = False,
             mps_control: bool = False, uid: Optional[int] = None) -> int:
        """Start a workload; returns its host pid once it holds its memory and device files.

        gpus: GPU indexes (0, [0, 1], "0-3", "all", None), or MIG devices: a MIG UUID ("MIG-..."), a (gpu, gi, ci)
        tuple, or a list mixing them (README "MIG": its context is on that MIG device, and it holds the device's
        /dev/nvidia-caps nodes).

        Like CUDA, it opens the device node of every GPU it can see (the host's GPUs; in a
        container the config's), its context and memory only on ``gpus``; only_own_devices: only
        the nodes of ``gpus``.  control_only: an NVML client (nvidiactl, nvidia-uvm; no memory,
        nothing registered; gpus and mib ignored).  fork_child: it forks a child that leaves its
        process group and keeps the device files.  mps_control: an MPS control daemon whose child is an
        MPS server with a context on ``gpus`` (see mps_daemon).
        respawn/service: run it under a supervisor (service NAME; respawned unless stopped when
        respawn is true), in the cgroup <base>/system.slice/NAME.service; the pid returned is the
        first workload's.  ct: start it inside that container (through gpusimkit.container.spawn,
        cgroup lxc/<vmid>/ns/.lxc); on the host, a plain workload runs in
        gpusim-<id>/user.slice/user-0.slice/session-1.scope.  uid: with ct, run it as that uid of the
        container (lxc-attach -u; in an unprivileged container, node uid 100000 + uid)."""
        from . import workload  # noqa: PLC0415

        # --opt=value: a value that starts with "-" is not taken for an option.
        wargs = [f"--dir={self.dir}", f"--gpus={_gpu_text(gpus)}", f"--mib={_as_int(mib, 'mib')}", f"--type={type}"]
        if name is not None:
            wargs.append(f"--name={name}")
        if ignore_term:
            wargs.append("--ignore-term")
        if exit_delay is not None:
            try:
                wargs.append(f"--exit-delay={float(exit_delay)!r}")
            except (TypeError, ValueError):
                raise ScenarioError(f"invalid exit_delay={exit_delay!r}: must be a number of seconds") from None
        if tree:
            wargs.append("--tree")
        if device_only:
            wargs.append("--device-only")
        if only_own_devices:
            wargs.append("--only-own-devices")
        if control_only:
            wargs.append("--control-only")
        if fork_child:
            wargs.append("--fork-child")
        if mps_control:
            wargs.append("--mps-control")
        workload.validate(workload.parse_args(wargs), self.scenario())
        vmid = None if ct is None else str(_as_int(ct, "ct"))
        env = proctools.kit_env(self.env())
        if vmid is not None:
            env["GPUSIM_VMID"] = vmid
            from . import container  # noqa: PLC0415
            kit = container.container_kit(self.dir, vmid, uid)
            if kit is not None:  # the checkout is out of the container's reach: a copy of the simulator it can reach
                env["PYTHONPATH"] = os.pathsep.join(
                    [kit] + [p for p in env["PYTHONPATH"].split(os.pathsep) if p and p != proctools.KIT_ROOT])

        cgroup = None
        if respawn or service is not None:
            if service is None:
                raise ScenarioError("invalid service=None: respawn needs a service name")
            service = service[:-len(".service")] if service.endswith(".service") else service
            if not SERVICE_RE.fullmatch(service):
                raise ScenarioError(f"invalid service={service!r}: letters, digits, _ . @ - (64 at most)")
            if vmid is not None:
                return self._ct_service(vmid, service, wargs, env, respawn, restart_delay, stop_timeout)
            argv = self._service_argv("host", service, wargs, respawn, restart_delay, stop_timeout)
            # (the supervisor moves itself to <base>/init.scope and its workload to the unit's cgroup)
        else:
            python = None
            if vmid is not None:
                try:
                    python = container.container_python(self.dir, vmid, uid)
                except container.ContainerError as e:
                    raise SimError(f"the workload did not start: {e}") from None
            argv = proctools.python_argv("gpusimkit.workload", wargs, python)
            if vmid is None:
                cgroup = cgroups.session_path(self.dir)
        if uid is not None and (vmid is None or respawn or service is not None):
            raise ScenarioError("uid= is for a plain workload in a container (ct=...)")
        return self._start_ready(argv, env, vmid, cgroup, uid)

    def mps_daemon(self, gpus: Union[str, int, Iterable[int], None], mib: int = 28,
                   ct: Optional[Union[int, str]] = None) -> Tuple[int, int]:
        """An MPS control daemon (``nvidia-cuda-mps-control -d``, in a session of its own, no device file) and
        the MPS server it started as its child (``nvidia-cuda-mps-server``, a compute context of ``mib`` on
        each of ``gpus``): (control pid, server pid), host pids.  Its clients are workloads of type ``CM``
        on the GPUs they use (hold(gpus=[0], type="CM")): the driver lists them in both the compute and the
        MPS list, as nvidia-smi's ``M+C`` shows (tests/gpusim/README.md, "MPS")."""
        control = self.hold(gpus, mib=mib, ct=ct, name="nvidia-cuda-mps-control -d", mps_control=True)
        for pid, start in proctools.read_owned(self.dir):
            if pid != control and proctools.alive(pid, start) and _ppid(pid) == control:
                return control, pid
        raise SimError(f"the MPS control daemon (pid {control}) has no server child")

    def _service_argv(self, scope: str, service: str, wargs: List[str], respawn: bool,
                      restart_delay: Optional[float], stop_timeout: Optional[float]) -> List[str]:
        from . import supervisor  # noqa: PLC0415

        files = supervisor.service_files(self.dir, scope, service)
        try:
            with open(files["pid"], encoding="utf-8") as f:
                pid = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pid = None
        if pid is not None and scope == "host" and "gpusimkit.supervisor" in proctools.cmdline(pid) \
                and proctools.alive(pid):
            raise SimError(f"service {service} is already running (scope {scope}, supervisor pid {pid})")
        conf = {
            "workload": wargs,
            "restart": bool(respawn),
            "restart_delay": supervisor.DEFAULT_RESTART_DELAY if restart_delay is None else float(restart_delay),
            "stop_timeout": supervisor.DEFAULT_STOP_TIMEOUT if stop_timeout is None else float(stop_timeout),
            "python": sys.executable,
        }
        os.makedirs(supervisor.service_dir(self.dir, scope), exist_ok=True)
        tmp = files["json"] + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(conf, f, indent=1)
        os.replace(tmp, files["json"])
        for k in ("stopped", "mainpid"):
            try:
                os.unlink(files[k])
            except FileNotFoundError:
                pass
        return proctools.python_argv("gpusimkit.supervisor", ["--dir", self.dir, "--service", service,
                                                              "--scope", scope])

    def _ready_file(self) -> str:
        d = self.path("run", "ready")
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, f"{os.getpid()}-{time.monotonic_ns()}")

    def _wait_ready_file(self, path: str, what: str, timeout: float = READY_TIMEOUT_S, log: Optional[str] = None) -> int:
        """The host pid a workload wrote to its ready file (it writes it through a rename)."""
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            try:
                with open(path, encoding="utf-8") as f:
                    line = f.read().strip()
                break
            except FileNotFoundError:
                time.sleep(0.005)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        if not line.isdigit():
            why = line[6:] if line.startswith("error ") else (line or f"no readiness message within {timeout:g} s")
            raise SimError(f"the workload did not start ({what}): {why} (log: {log or self.path('run', 'workloads.log')})")
        pid = int(line)
        proctools.append_owned(self.dir, pid, proctools.starttime(pid))
        return pid

    def _start_ready(self, argv: List[str], env: Dict[str, str], vmid: Optional[str],
                     cgroup: Optional[str] = None, uid: Optional[int] = None) -> int:
        if vmid is not None:
            # In the container: lxc-attach starts it detached (the container's init adopts it); it
            # writes its host pid (as the driver daemon sees it) to a ready file in DIR, bound in.
            from . import container  # noqa: PLC0415
            ready = self._ready_file()
            log = self.path("run", "workloads.log")
            if uid is not None or container.idmap_lines(self.dir, vmid):
                # Another node user (100000 + uid in an unprivileged container, or uid): a ready directory and a log
                # open to everyone.
                shared = self.path("run", "ready-any")
                os.makedirs(shared, exist_ok=True)
                os.chmod(shared, 0o1777)
                ready = os.path.join(shared, os.path.basename(ready))
                log = os.path.join(shared, "workloads.log")
                with open(log, "a", encoding="utf-8"):
                    os.chmod(log, 0o666)
            try:
                container.spawn(self.dir, vmid, argv + [f"--ready-file={ready}"], env, log=log, uid=uid)
            except container.ContainerError as e:
                raise SimError(f"the workload did not start: {e}") from None
            try:
                return self._wait_ready_file(ready, f"CT {vmid}", log=log)
            except SimError as e:
                cause = container.unreachable_cause(self.dir, vmid, [argv[0]] + env.get("PYTHONPATH", "").split(
                    os.pathsep), uid)
                if cause:
                    raise SimError(f"{e}: {cause}") from None
                raise
        r, w = os.pipe2(os.O_CLOEXEC)
        started = None
        try:
            started = proctools.spawn_via_driver(self.dir, argv + ["--ready-fd", "3"], env, [w], cgroup=cgroup)
        finally:
            os.close(w)
        try:
            try:
                line = proctools.read_line(r, READY_TIMEOUT_S)
            except TimeoutError as e:
                line = f"error {e}"
        finally:
            os.close(r)
        if not line.strip().isdigit():
            if started is not None:
                st = proctools.starttime(started)
                if st is not None:
                    _kill(started, st, signal.SIGKILL)
            why = line[6:] if line.startswith("error ") else (line or "it exited before it was ready")
            raise SimError(f"the workload did not start: {why} (log: {self.path('run', 'workloads.log')})")
        pid = int(line)
        proctools.append_owned(self.dir, pid, proctools.starttime(pid))
        return pid

    def _ct_service(self, vmid: str, service: str, wargs: List[str], env: Dict[str, str], respawn: bool,
                    restart_delay: Optional[float], stop_timeout: Optional[float]) -> int:
        """The workload as the systemd unit ``service``.service of a systemd container (Restart=always
        with respawn, else no); started with `systemctl start`; returns the first workload's host pid."""
        from . import container, supervisor  # noqa: PLC0415
        try:
            if container.kind(self.dir, vmid) != "systemd":
                raise SimError(f"CT {vmid} has no systemd: a service in a container is a systemd unit; create the "
                               f"container with systemd=True (gpusim ct create --systemd)")
            ready = self._ready_file()
            python = os.path.realpath(sys.executable)
            execstart = " ".join(_unit_quote(a) for a in [python, "-m", "gpusimkit.workload", *wargs,
                                                          f"--ready-file={ready}"])
            # The simulator's variables (GPUSIM_*: the scenario, the workload's options such as
            # GPUSIM_RECORD_SIGNALS) reach the unit's processes, as they reach a workload started by lxc-attach.
            envs = {k: v for k, v in env.items() if k.startswith("GPUSIM_") or k in ("PYTHONPATH", "LD_LIBRARY_PATH")}
            envs["GPUSIM_VMID"] = str(vmid)
            unit = UNIT.format(
                name=service, execstart=execstart,
                environment="\n".join(f"Environment={_unit_quote(f'{k}={v}')}" for k, v in sorted(envs.items())),
                restart="always" if respawn else "no",
                restart_sec=supervisor.DEFAULT_RESTART_DELAY if restart_delay is None else float(restart_delay),
                stop_sec=supervisor.DEFAULT_STOP_TIMEOUT if stop_timeout is None else float(stop_timeout),
                log=self.path("run", "workloads.log"))
            path = f"/etc/systemd/system/{service}.service"
            r = container.run(self.dir, vmid, ["/bin/sh", "-c", f"cat > {path}.tmp && mv {path}.tmp {path} && "
                                               f"systemctl daemon-reload && systemctl start {service}.service"],
                              env={"PATH": container.DEFAULT_PATH}, input=unit)
            if r.returncode != 0:
                raise SimError(f"the workload did not start: systemctl start {service} in CT {vmid} exited "
                               f"{r.returncode}: {(r.stderr or r.stdout).strip()}")
        except container.ContainerError as e:
            raise SimError(f"the workload did not start: {e}") from None
        return self._wait_ready_file(ready, f"{service}.service in CT {vmid}")

    def kill(self, pid: int, sig: int = signal.SIGKILL, wait: Optional[bool] = None, timeout: float = 10.0) -> bool:
        """Signal a process gpusim started (refused for any other pid).  wait (default: for
        SIGKILL) waits until it has exited and the driver daemon has recorded the exit.  Returns
        whether it is gone."""
        match = [s for p, s in proctools.read_owned(self.dir) if p == pid and proctools.alive(p, s)]
        if not match:
            if any(p == pid for p, _st in proctools.read_owned(self.dir)):
                return True  # ours, already gone
            raise SimError(f"pid {pid} was not started by this simulated host")
        _kill(pid, match[0], sig)
        if not (sig == signal.SIGKILL if wait is None else wait):
            return not proctools.alive(pid, match[0])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proctools.alive(pid, match[0]):
                procs, exits = self.procs()
                if not any(p["pid"] == pid and p["starttime"] == match[0] for p in procs) \
                        or (pid, match[0]) in exits:
                    # Also reaped (its parent, the daemon or a supervisor, does it at once), so
                    # that kill(pid, 0) fails as on a real host; bounded, for a parent that
                    # does not reap.
                    reap_deadline = min(deadline, time.monotonic() + 1.0)
                    while proctools.read_stat(pid) is not None and proctools.starttime(pid) == match[0] \
                            and time.monotonic() < reap_deadline:
                        time.sleep(0.002)
                    return True
            time.sleep(0.002)
        return False

    def systemctl(self, *args: str, ct: Optional[Union[int, str]] = None) -> subprocess.CompletedProcess:
        """systemctl of the host (the stand-in DIR/bin/systemctl) or, with ct=, of that container
        (its own systemctl, run by lxc-attach as `pct exec <ct> -- systemctl ...` does)."""
        if ct is not None:
            from . import container  # noqa: PLC0415
            return container.run(self.dir, int(ct), ["systemctl", *args], env=self.env(), timeout=120)
        env = self.env()
        env.pop("GPUSIM_VMID", None)
        return subprocess.run([self.path("bin", "systemctl"), *args], env=env, capture_output=True, text=True,
                              check=False, timeout=60)

    def service_mainpid(self, name: str, ct: Optional[Union[int, str]] = None) -> Optional[int]:
        """The host pid of a running service's main process (None when it is not running): in a
        container, systemd's MainPID (`systemctl show`) seen from the host; on the host, the supervisor's."""
        name = name[:-len(".service")] if name.endswith(".service") else name
        if ct is None:
            try:
                with open(self.path("services", "host", f"{name}.mainpid"), encoding="utf-8") as f:
                    return int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                return None
        from . import container  # noqa: PLC0415
        ip = container.init_pid(self.dir, int(ct))
        if not ip:
            return None
        r = self.systemctl("show", "-p", "MainPID", "--value", f"{name}.service", ct=ct)
        text = r.stdout.strip()
        if r.returncode != 0 or not text.isdigit() or int(text) == 0:
            return None
        return container.host_pid(ip[0], int(text))

    def register(self, pid: Union[int, Sequence[int]], gpus: Dict[int, int], types: str = "C") -> int:
        """alloc-pid: register an existing process (any host pid) as holding gpus {index: mib}; a list of pids: each
        of them alike, in one request (procs rewritten once: thousands of holders at once)."""
        spec = ",".join(f"{int(g)}:{int(m)}" for g, m in sorted(gpus.items()))
        pids = [pid] if isinstance(pid, int) else list(pid)
        reply = proctools.driver_request(self.dir, f"alloc-pid {','.join(str(int(p)) for p in pids)} {types} {spec}")
        return int(reply.split(",")[0])

    # --- faults -----------------------------------------------------------------------------
    def fault(self, init_error: Union[str, int, None] = None, lose_gpu: Union[int, Iterable[int], None] = None,
              after: Optional[float] = None, not_supported: Union[Dict[int, Iterable[str]], str, Iterable[str], None] = None,
              unknown_every: Optional[int] = None, call_delay_ms: Optional[int] = None,
              leak: Union[Dict[int, int], str, Iterable[str], None] = None, pid_mode: Optional[str] = None,
              release_lag_ms: Optional[int] = None, hide: Union[str, Iterable[str], None] = None,
              unknown: Union[Dict[int, Iterable[str]], str, Iterable[str], None] = None,
              health: Union[Dict[int, Dict[str, Any]], str, Iterable[str], None] = None,
              xid: Union[Dict[int, Any], str, Iterable[str], None] = None, drain_ms: Optional[int] = None,
              clear: bool = False) -> None:
        """Change the scenario while programs run.

        clear resets every fault (init error, lost GPUs, NOT_SUPPORTED fields, unknown_every,
        call delay, leaked memory, hidden symbols) before the other arguments apply; pid_mode and
        release_lag_ms are settings and are kept, and what the driver profile implies (its hidden
        symbols and NOT_SUPPORTED fields) is what clear goes back to.  lose_gpu: now, or `after`
        seconds from now.  not_supported: {gpu: [fields]} or "I:field,field" (added to the GPU's
        list).  unknown: the same shape; those fields' queries answer NVML_ERROR_UNKNOWN (999) on every
        call (an intermittent driver error that outlasts the retries).  leak: {gpu: mib} or "I:MIB".  hide: the exact set of hidden symbols besides the
        profile's (the library in DIR/lib is reinstalled; programs started afterwards see it).
        health: {gpu: {field: value}} or "I:field=value,field=value" with the fields of HEALTH_FIELDS
        (fabric_state also by name: not_supported, not_started, in_progress, completed); clear puts
        them back to a healthy GPU's.  xid: {gpu: code or [codes]} or "I:79": Xid lines appended to
        the simulated kernel log DIR/kmsg (lose_gpu logs an Xid 79 too); the log is history, clear
        keeps it.  drain_ms: from now on, the memory of an exited process is released linearly over
        this long after the release lag (a setting, kept by clear)."""
        if after is not None and lose_gpu is None:
            raise ScenarioError("invalid after: needs lose_gpu")
        xid_lines: List[Tuple[Any, int, int]] = []
        with scn.edit(self.dir) as sc:
            old_hidden = list(sc.hidden_symbols)
            count = sc.gpu_count
            if clear:
                sc.init_error = 0
                sc.unknown_every = 0
                sc.call_delay_ms = 0
                sc.hidden_symbols = scn.profile_hidden(sc)
                for g in sc.gpus:
                    g.lost_at_ns = -1
                    g.not_supported = scn.profile_not_supported(sc)
                    g.unknown = []
                    g.leaked_mib = 0
                    healthy = scn.Gpu(index=g.index)
                    for name in HEALTH_FIELDS:
                        setattr(g, name, getattr(healthy, name))
                    g.fabric_state = scn.profile_of(sc).fabric_state
            if init_error is not None:
                if isinstance(init_error, str) and not init_error.strip().lstrip("-").isdigit():
                    if init_error not in INIT_ERROR_NAMES:
                        raise ScenarioError(f"invalid init_error={init_error!r}: must be one of "
                                            + ", ".join(k for k in INIT_ERROR_NAMES if k != "ok"))
                    sc.init_error = INIT_ERROR_NAMES[init_error]
                else:
                    sc.init_error = _as_int(init_error, "init_error")
            if lose_gpu is not None:
                idx = [lose_gpu] if isinstance(lose_gpu, (int, str)) else list(lose_gpu)
                when = time.monotonic_ns()
                if after is not None:
                    try:
                        delay = float(after)
                    except (TypeError, ValueError):
                        raise ScenarioError(f"invalid after={after!r}: must be seconds") from None
                    if delay < 0:
                        raise ScenarioError(f"invalid after={after!r}: must be >= 0")
                    when += int(delay * 1e9)
                for i in idx:
                    sc.gpus[self._gpu_index(i, count, "lose_gpu")].lost_at_ns = when
                    xid_lines.append((sc.gpus[self._gpu_index(i, count, "lose_gpu")], 79, when))
            for i, fields in self._pairs(not_supported, "not_supported", count, lambda v: [
                    f.strip() for f in (v.split(",") if isinstance(v, str) else v) if f.strip()]):
                g = sc.gpus[i]
                g.not_supported = sorted(set(g.not_supported) | set(fields))
            for i, fields in self._pairs(unknown, "unknown", count, lambda v: [
                    f.strip() for f in (v.split(",") if isinstance(v, str) else v) if f.strip()]):
                g = sc.gpus[i]
                g.unknown = sorted(set(g.unknown) | set(fields))
            for i, mib in self._pairs(leak, "leak", count, lambda v: _as_int(v, "leak")):
                sc.gpus[i].leaked_mib = mib
            for i, fields in self._pairs(health, "health", count, self._health_fields):
                for name, v in fields.items():
                    setattr(sc.gpus[i], name, v)
            for i, codes in self._pairs(xid, "xid", count, lambda v: [
                    _as_int(c, "xid") for c in (v if isinstance(v, (list, tuple)) else str(v).split(","))]):
                for code in codes:
                    if not 1 <= code <= 999:
                        raise ScenarioError(f"invalid xid={code!r}: must be an Xid code 1..999")
                    xid_lines.append((sc.gpus[i], code, time.monotonic_ns()))
            if drain_ms is not None:
                sc.drain_ms = _as_int(drain_ms, "drain_ms")
            if unknown_every is not None:
                sc.unknown_every = _as_int(unknown_every, "unknown_every")
            if call_delay_ms is not None:
                sc.call_delay_ms = _as_int(call_delay_ms, "call_delay_ms")
            if pid_mode is not None:
                sc.pid_mode = pid_mode
            if release_lag_ms is not None:
                sc.release_lag_ms = _as_int(release_lag_ms, "release_lag_ms")
            if hide is not None:
                sc.hidden_symbols = scn.profile_hidden(sc, hide.split(",") if isinstance(hide, str) else hide)
            new_hidden = list(sc.hidden_symbols)
            sc.validate()
            if new_hidden != old_hidden:
                self.check_hidden(new_hidden)
        if new_hidden != old_hidden:
            self._install_library(new_hidden)
        if xid_lines:
            self._log_xids(xid_lines)

    @staticmethod
    def _health_fields(value) -> Dict[str, int]:
        """{"remap_pending": 1} or "remap_pending=1,fabric_state=in_progress" -> {field: int}."""
        if isinstance(value, dict):
            items = list(value.items())
        else:
            items = []
            for part in str(value).split(","):
                k, sep, v = part.partition("=")
                if not sep:
                    raise ScenarioError(f"invalid health={value!r}: must look like GPU:field=value,field=value")
                items.append((k.strip(), v.strip()))
        out = {}
        for k, v in items:
            if k not in HEALTH_FIELDS:
                raise ScenarioError(f"invalid health field {k!r}: known: {', '.join(HEALTH_FIELDS)}")
            if k == "fabric_state" and isinstance(v, str) and v in scn.FABRIC_STATES:
                v = scn.FABRIC_STATES[v]
            out[k] = int(v, 0) if isinstance(v, str) and k == "clock_reasons" else _as_int(v, k)
        return out

    def _log_xids(self, lines: List[Tuple[Any, int, int]]) -> None:
        """Append Xid records to DIR/kmsg in /dev/kmsg's format ("prio,seq,usec,-;message")."""
        path = self.path(KMSG)
        try:
            with open(path, encoding="utf-8") as f:
                seq = sum(1 for _line in f)
        except FileNotFoundError:
            seq = 0
        with open(path, "a", encoding="utf-8") as f:
            for g, code, when_ns in lines:
                dom, bus, dev = g.pci_bus_id.split(":")[0], g.pci_bus_id.split(":")[1], g.pci_bus_id.split(":")[2][:2]
                text = XID_TEXT.get(code, "Xid event")
                f.write(f"3,{seq},{when_ns // 1000},-;NVRM: Xid (PCI:{int(dom, 16):04x}:{bus.lower()}:{dev.lower()}):"
                        f" {code}, pid='<unknown>', name=<unknown>, {text}\n")
                seq += 1

    @staticmethod
    def _gpu_index(value: Any, count: int, field: str) -> int:
        i = _as_int(value, field)
        if not 0 <= i < count:
            raise ScenarioError(f"invalid {field}={value!r}: GPU index out of range, the host has {count} GPUs")
        return i

    def _pairs(self, value, field: str, count: int, conv) -> List[Tuple[int, Any]]:
        """{gpu: v} or "I:v" or ["I:v", ...] -> [(gpu, conv(v))]."""
        if value is None:
            return []
        if isinstance(value, dict):
            items = list(value.items())
        else:
            items = []
            for text in [value] if isinstance(value, str) else list(value):
                k, sep, v = str(text).partition(":")
                if not sep or not v:
                    raise ScenarioError(f"invalid {field}={text!r}: must look like GPU:VALUE, e.g. 0:"
                                        + ("fan,power" if field in ("not_supported", "unknown") else "1024"))
                items.append((k, v))
        return [(self._gpu_index(k, count, field), conv(v)) for k, v in items]

    # --- state ------------------------------------------------------------------------------
    def procs(self) -> Tuple[List[Dict[str, int]], Dict[Tuple[int, int], int]]:
        """The daemon's DIR/procs: ([proc line dicts], {(pid, starttime): exit_ns})."""
        procs: List[Dict[str, Any]] = []
        exits: Dict[Tuple[int, int], int] = {}
        try:
            with open(self.path("procs"), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            w = line.split()
            if len(w) in (8, 10) and w[0] == "proc":
                procs.append({"pid": int(w[1]), "starttime": int(w[2]), "gpu": int(w[3]), "types": w[4],
                              "used_mib": int(w[5]), "pidns": int(w[6]), "nspid": int(w[7])})
                if len(w) == 10:  # a MIG device's context (README "MIG")
                    procs[-1].update(gi=int(w[8]), ci=int(w[9]))
            elif len(w) == 4 and w[0] == "exit":
                exits[(int(w[1]), int(w[2]))] = int(w[3])
        return procs, exits

    def status(self) -> Dict[str, Any]:
        """GPUs (used memory as the library computes it for a host caller), processes, containers,
        services and the daemon."""
        sc = self.scenario()
        procs, exits = self.procs()
        now = time.monotonic_ns()
        lag = sc.release_lag_ms * 1_000_000
        used = {g.index: g.base_used_mib + g.leaked_mib for g in sc.gpus}
        pids: Dict[int, List[int]] = {g.index: [] for g in sc.gpus}
        for p in procs:
            key = (p["pid"], p["starttime"])
            p["alive"] = proctools.alive(p["pid"], p["starttime"])
            p["exit_ns"] = exits.get(key)
            counted = p["alive"] or p["exit_ns"] is None or now < p["exit_ns"] + lag
            mib = max(0, p["used_mib"])
            drain = sc.drain_ms * 1_000_000
            if not counted and drain > 0 and now < p["exit_ns"] + lag + drain:
                # released linearly over drain_ms after the lag (nvml.c dead_counted_mib)
                counted = True
                mib = int(mib * (p["exit_ns"] + lag + drain - now) / drain + 0.5)
            p["counted"] = counted
            if counted and p["gpu"] in used:
                used[p["gpu"]] += mib
            if p["alive"] and p["gpu"] in pids:
                pids[p["gpu"]].append(p["pid"])
        gpus = []
        for g in sc.gpus:
            u = used[g.index]
            gpus.append({
                "index": g.index, "name": g.name, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id, "minor": g.minor,
                "memory_total_mib": g.memory_total_mib, "memory_reserved_mib": g.memory_reserved_mib,
                "memory_used_mib": u, "memory_free_mib": max(0, g.memory_total_mib - g.memory_reserved_mib - u),
                "lost": g.lost_at_ns >= 0 and now >= g.lost_at_ns, "lost_at_ns": g.lost_at_ns,
                "not_supported": list(g.not_supported), "unknown": list(g.unknown), "leaked_mib": g.leaked_mib, "pids": sorted(pids[g.index]),
            })
        dpid = self.daemon_pid()
        return {
            "dir": self.dir,
            "daemon": {"pid": dpid, "running": self.is_up()},
            "scenario": {"driver_profile": sc.driver_profile, "driver_version": sc.driver_version,
                         "nvml_version": sc.nvml_version, "cuda_version": sc.cuda_version,
                         "process_v3_entry_bytes": sc.process_v3_entry_bytes,
                         "init_error": sc.init_error, "pid_mode": sc.pid_mode, "release_lag_ms": sc.release_lag_ms,
                         "drain_ms": sc.drain_ms,
                         "unknown_every": sc.unknown_every, "call_delay_ms": sc.call_delay_ms,
                         "hidden_symbols": list(sc.hidden_symbols),
                         "profile_hidden_symbols": scn.profile_hidden(sc)},
            "gpus": gpus,
            "processes": procs,
            "containers": self._containers(),
            "services": self._services(),
            "cgroup": self._cgroup(),
        }

    def _cgroup(self) -> Optional[Dict[str, str]]:
        """The host's cgroup tree (None: gpusim runs without cgroups on this machine)."""
        base = cgroups.host_base(self.dir)
        if base is None:
            return None
        try:
            return {"path": base, "base": cgroups.rel(base),
                    "session": cgroups.rel(os.path.join(base, cgroups.SESSION)),
                    "system_slice": cgroups.rel(os.path.join(base, "system.slice")),
                    "manager": cgroups.rel(cgroups.manager_path(base))}
        except cgroups.CgroupError:
            return None

    def _containers(self) -> List[Dict[str, Any]]:
        out = []
        try:
            from . import container  # noqa: PLC0415 (written by another piece)
            vmids = container.list(self.dir)
        except ImportError:
            return out
        for vmid in vmids:
            hostname = None
            try:
                keys, _raw = container.read_config(self.dir, vmid)
                hostname = keys.get("hostname")
            except Exception:  # noqa: BLE001 (status must not fail on one bad config)
                pass
            ip = container.init_pid(self.dir, vmid)
            out.append({"vmid": vmid, "hostname": hostname, "init_pid": ip[0] if ip else None,
                        "running": ip is not None, "kind": container.kind(self.dir, vmid),
                        "lxcpath": container.lxcpath(self.dir)})
        return out

    def _services(self) -> List[Dict[str, Any]]:
        out = []
        sdir = self.path("services")
        for scope in sorted(os.listdir(sdir)) if os.path.isdir(sdir) else []:
            for fn in sorted(os.listdir(os.path.join(sdir, scope))):
                if not fn.endswith(".json"):
                    continue
                base = os.path.join(sdir, scope, fn[:-5])
                item: Dict[str, Any] = {"scope": scope, "name": fn[:-5], "stopped": os.path.exists(base + ".stopped")}
                for k in ("pid", "mainpid"):
                    try:
                        with open(f"{base}.{k}", encoding="utf-8") as f:
                            item[k] = int(f.read().split()[0])
                    except (OSError, ValueError, IndexError):
                        item[k] = None
                out.append(item)
        return out

    # --- down -------------------------------------------------------------------------------
    def down(self, timeout: float = 10.0) -> Dict[str, Any]:
        """Stop containers, kill every process gpusim started (supervisors first), stop the
        daemon, remove DIR if `up` created it (else the files `up` made).  Returns
        {"killed": [pids], "left": [pids still alive], "errors": [...]}."""
        report: Dict[str, Any] = {"killed": [], "left": [], "errors": []}
        if not os.path.isdir(self.dir):
            return report
        ctdir = self.path("ct")
        from . import vmids  # noqa: PLC0415
        if (os.path.isdir(ctdir) and os.listdir(ctdir)) or vmids.reserved_by(self.dir):
            try:
                from . import container  # noqa: PLC0415 (written by another piece)
                report["errors"] += [f"stopping containers: {p}" for p in container.stop_all(self.dir) or []]
            except Exception as e:  # noqa: BLE001 (go on: the processes must still die)
                report["errors"].append(f"stopping containers: {type(e).__name__}: {e}")

        dpid = self.daemon_pid()
        owned = proctools.read_owned(self.dir)
        daemon = [(p, s) for p, s in owned if p == dpid]
        deadline = time.monotonic() + timeout
        while True:
            owned = proctools.read_owned(self.dir)  # a respawn may have added one meanwhile
            live = [(p, s) for p, s in owned if p != dpid and proctools.alive(p, s)]
            if not live or time.monotonic() > deadline:
                break
            sups = [(p, s) for p, s in live if "gpusimkit.supervisor" in proctools.cmdline(p)]
            for p, s in sups + [x for x in live if x not in sups]:
                if _kill(p, s, signal.SIGKILL) and p not in report["killed"]:
                    report["killed"].append(p)
            self._wait_gone(live, min(5.0, max(0.1, deadline - time.monotonic())))
        # Whatever else is in the scenario's host cgroup (a forked child that escaped the list)
        # is a descendant of a process gpusim started: it goes too.
        base = cgroups.host_base(self.dir)
        if base is not None:
            cgroups.kill(base)
            if not cgroups.wait_empty(base, 5.0):
                report["errors"].append(f"cgroup {base} still has processes: {cgroups.procs(base, recursive=True)}")

        # The daemon last: it reaps what was killed above.
        if self._daemon is not None and self._daemon.poll() is None:
            self._daemon.send_signal(signal.SIGTERM)
            try:
                self._daemon.wait(5)
            except subprocess.TimeoutExpired:
                self._daemon.kill()
                self._daemon.wait(5)
        else:
            for p, s in daemon:
                _kill(p, s, signal.SIGTERM)
            if not self._wait_gone(daemon, 5.0):
                for p, s in daemon:
                    _kill(p, s, signal.SIGKILL)
                self._wait_gone(daemon, 2.0)
        self._daemon = None

        report["left"] = [p for p, s in proctools.read_owned(self.dir) if proctools.alive(p, s)]
        if report["left"]:
            report["errors"].append(f"processes still alive: {report['left']}; {self.dir} kept")
            return report
        cg_problems = cgroups.remove_host(self.dir)
        if cg_problems:
            report["errors"] += cg_problems
            return report
        mounts = _mounts_under(self.dir)
        if mounts:
            report["errors"].append(f"mounts left under {self.dir}: {mounts}; not removed")
            return report
        if self.created:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            for name in LAYOUT:
                p = self.path(name)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p, ignore_errors=True)
                elif os.path.lexists(p):
                    os.unlink(p)
        if os.path.exists(self.path("run")) or (self.created and os.path.exists(self.dir)):
            report["errors"].append(f"could not remove {self.dir}")
        return report

    @staticmethod
    def _wait_gone(items: List[Tuple[int, int]], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while any(proctools.alive(p, s) for p, s in items):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True
