"""Simulated Proxmox VE containers made of real Linux namespaces and a real cgroup2 path.

A container is ``DIR/ct/<vmid>/``:

- ``config``      PVE's ``pct config`` shape (sorted keys, then the raw ``lxc.*`` lines);
- ``init.pid``    ``<hostpid> <starttime>`` of its init (written by ``start``);
- ``cgroup``      what ``start`` created: ``path``, ``ino`` (inode of ``lxc/<vmid>``) and
                  ``created_lxc`` (whether it also created ``lxc/``);
- ``console.log`` the init's stdout/stderr and the stdio of detached commands;
- ``lock``        flock for start/stop/cleanup.

A running container is an init process (``ctinit.py``) that is PID 1 of its own PID, mount and
UTS namespaces, with a private ``/proc`` and the configured hostname, sitting in
``<cgroup2 mount>/lxc/<vmid>/ns``, so that ``/proc/<pid>/cgroup`` of every container process
reads ``0::/lxc/<vmid>/ns...`` on the host, as on PVE 7 and later.  Commands are run inside with
``ctattach.py`` (setns + fork, as ``lxc-attach``) and land in ``lxc/<vmid>/ns/.lxc`` (liblxc's
attach leaf); services in ``lxc/<vmid>/ns/system.slice/<name>.service`` (gpusimkit/cgroups.py).

Stdlib only, Python 3.9+.  Processes are identified by (pid, starttime); only processes this
module started (or that sit in a cgroup directory it created) are ever signalled.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from . import cgroups
from . import scenario as _scenario

HERE = os.path.dirname(os.path.abspath(__file__))
CTINIT = os.path.join(HERE, "ctinit.py")
CTATTACH = os.path.join(HERE, "ctattach.py")

VMID_MIN = 100
VMID_MAX = 999999999
DEVICES_STYLES = ("lxc", "dev", "none")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
START_TIMEOUT = 15.0
XATTR_CREATED = "trusted.gpusim.created"


class ContainerError(RuntimeError):
    """A container operation failed; the message is what pct prints."""


class NoSuchContainer(ContainerError):
    """The vmid has no config in this scenario."""


# --- small helpers --------------------------------------------------------------------------------

def parse_vmid(vmid: Union[int, str]) -> int:
    """PVE's pve-vmid format: an integer 100..999999999 (no sign, no leading zero)."""
    text = str(vmid).strip() if not isinstance(vmid, bool) else ""
    if not re.fullmatch(r"[1-9][0-9]{2,8}", text):
        raise ContainerError(f"invalid vmid={vmid!r}: must be an integer {VMID_MIN}..{VMID_MAX}")
    return int(text)


def nodename() -> str:
    return socket.gethostname().split(".")[0]


def ct_dir(simdir: str, vmid: Union[int, str]) -> str:
    return os.path.join(simdir, "ct", str(parse_vmid(vmid)))


def config_path(simdir: str, vmid: Union[int, str]) -> str:
    return os.path.join(ct_dir(simdir, vmid), "config")


def exists(simdir: str, vmid: Union[int, str]) -> bool:
    return os.path.isfile(config_path(simdir, vmid))


def _require(simdir: str, vmid: Union[int, str]) -> int:
    v = parse_vmid(vmid)
    if not exists(simdir, v):
        raise NoSuchContainer(f"Configuration file 'nodes/{nodename()}/lxc/{v}.conf' does not exist")
    return v


def _read_stat(pid: int) -> Optional[Tuple[str, int]]:
    """(state, starttime) from /proc/<pid>/stat, or None (split after the LAST ')')."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rindex(b")") + 2:].split()
    return rest[0].decode(), int(rest[19])


def _alive(pid: int, start: int) -> bool:
    st = _read_stat(pid)
    return st is not None and st[1] == start and st[0] not in ("Z", "X", "x")


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.contextmanager
def _locked(simdir: str, vmid: int) -> Iterator[None]:
    d = ct_dir(simdir, vmid)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "lock"), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


# --- cgroup2 --------------------------------------------------------------------------------------

def cgroup2_mount() -> str:
    """The machine's cgroup2 mount point (cgroups.mount), as a ContainerError when there is none."""
    try:
        return cgroups.mount()
    except cgroups.CgroupError as e:
        raise ContainerError(f"{e}: containers need a cgroup2 hierarchy to place their processes in"
                             " lxc/<vmid>/ns") from e


def cgroup_dirs(vmid: Union[int, str]) -> Tuple[str, str, str]:
    """(<mount>/lxc, <mount>/lxc/<vmid>, <mount>/lxc/<vmid>/ns)."""
    lxc = os.path.join(cgroup2_mount(), "lxc")
    base = os.path.join(lxc, str(parse_vmid(vmid)))
    return lxc, base, os.path.join(base, "ns")


def cgroup_path(vmid: Union[int, str]) -> str:
    """The path the container's init shows in /proc/<pid>/cgroup: /lxc/<vmid>/ns (its other
    processes are below it: ns/.lxc, ns/init.scope, ns/system.slice/<name>.service)."""
    return f"/lxc/{parse_vmid(vmid)}/ns"


def attach_cgroup(vmid: Union[int, str]) -> str:
    """<mount>/lxc/<vmid>/ns/.lxc: where commands run by pct exec / spawn land (lxc-attach
    moves the attached process into the leaf ``.lxc`` of the container's cgroup)."""
    return os.path.join(cgroup_dirs(vmid)[2], cgroups.ATTACH)


def _read_record(simdir: str, vmid: int) -> Dict[str, str]:
    return cgroups.read_record_file(os.path.join(ct_dir(simdir, vmid), "cgroup"))


def _ino(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _is_ours(simdir: str, vmid: int) -> bool:
    """Does <mount>/lxc/<vmid> exist and is it the directory this scenario created?"""
    rec = _read_record(simdir, vmid)
    if not rec.get("ino", "").isdigit():
        return False
    base = cgroup_dirs(vmid)[1]
    return rec.get("path") == base and _ino(base) == int(rec["ino"])


def _remove_cgroup(simdir: str, vmid: int) -> None:
    """Remove lxc/<vmid>/ns, lxc/<vmid> (and lxc/ when empty and made by gpusim), if ours.

    Processes still in it (e.g. an attach helper) get SIGKILL after a grace period."""
    rec = _read_record(simdir, vmid)
    if not rec:
        return
    lxc, base, _ns = cgroup_dirs(vmid)
    if _is_ours(simdir, vmid):
        # lxc/<vmid> and everything below it (ns, ns/.lxc, ns/init.scope, ns/system.slice/...):
        # populated counts descendants, cgroup.kill reaches them, rmdir goes deepest first.
        try:
            cgroups.clear_tree(base, grace=3.0, timeout=5.0)
        except cgroups.CgroupError as e:
            raise ContainerError(str(e)) from None
    _remove_lxc_dir(lxc, rec.get("created_lxc") == "1")
    _unlink(os.path.join(ct_dir(simdir, vmid), "cgroup"))


def _remove_lxc_dir(lxc: str, created_by_us: bool) -> None:
    marked = False
    try:
        marked = os.getxattr(lxc, XATTR_CREATED) == b"1"
    except OSError:
        pass
    if created_by_us or marked:
        with contextlib.suppress(OSError):  # not empty (another container), gone, busy
            os.rmdir(lxc)


def _make_cgroup(simdir: str, vmid: int) -> str:
    """Create lxc/<vmid>/ns; refuse when lxc/<vmid> exists and is not ours.  Returns the ns path."""
    lxc, base, ns = cgroup_dirs(vmid)
    for _attempt in range(20):
        created_lxc = False
        try:
            os.mkdir(lxc)
            created_lxc = True
            with contextlib.suppress(OSError):
                os.setxattr(lxc, XATTR_CREATED, b"1")
        except FileExistsError:
            pass
        except OSError as e:
            raise ContainerError(f"cannot create cgroup {lxc}: {e.strerror} (creating cgroup2 "
                                 "directories needs root and a writable cgroup2 mount)") from e
        try:
            os.mkdir(base)
        except FileNotFoundError:
            continue  # lxc/ was removed by another scenario in between: again
        except FileExistsError:
            raise ContainerError(
                f"cgroup {base} already exists and does not belong to this scenario "
                f"({simdir}): is a container with vmid {vmid} running in another scenario or on "
                f"this host? Use another vmid.") from None
        except OSError as e:
            raise ContainerError(f"cannot create cgroup {base}: {e.strerror}") from e
        _atomic_write(os.path.join(ct_dir(simdir, vmid), "cgroup"),
                      f"path {base}\nino {_ino(base)}\ncreated_lxc {1 if created_lxc else 0}\n")
        try:
            os.mkdir(ns)
            os.mkdir(os.path.join(ns, cgroups.ATTACH))
        except OSError as e:
            _remove_cgroup(simdir, vmid)
            raise ContainerError(f"cannot create cgroup {ns}: {e.strerror}") from e
        return ns
    raise ContainerError(f"cannot create cgroup {base}: {lxc} keeps disappearing")


# --- config ---------------------------------------------------------------------------------------

def _hwaddr(vmid: int) -> str:
    d = hashlib.sha256(f"gpusim-ct-{vmid}".encode()).digest()
    return "BC:24:11:%02X:%02X:%02X" % (d[0], d[1], d[2])


def _check_hostname(name: str) -> None:
    label = r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
    if not re.fullmatch(rf"{label}(\.{label})*", name) or len(name) > 253:
        raise ContainerError(f"invalid hostname={name!r}: must be a DNS name (letters, digits, '-', '.')")


def _gpu_minors(simdir: str, gpus) -> List[int]:
    if gpus is None or (isinstance(gpus, str) and gpus.strip() in ("", "none")) or (
            isinstance(gpus, (builtins.list, tuple)) and not gpus):
        return []
    try:
        sc = _scenario.load(simdir)
    except FileNotFoundError:
        raise ContainerError(f"invalid gpus={gpus!r}: no scenario in {simdir} (run gpusim up first)") from None
    if isinstance(gpus, (builtins.list, tuple)):
        gpus = ",".join(str(int(g)) for g in gpus)
    try:
        idx = _scenario.parse_gpu_list(str(gpus), sc.gpu_count)
    except _scenario.ScenarioError as e:
        raise ContainerError(str(e)) from None
    return [sc.gpus[i].minor for i in idx]


def render_config(vmid: int, hostname: str, minors: Sequence[int], devices_style: str) -> str:
    keys = {
        "arch": "amd64",
        "cores": "8",
        "hostname": hostname,
        "memory": "32768",
        "net0": f"name=eth0,bridge=vmbr0,firewall=1,hwaddr={_hwaddr(vmid)},ip=dhcp,type=veth",
        "ostype": "debian",
        "rootfs": f"local-lvm:vm-{vmid}-disk-0,size=32G",
        "swap": "512",
        "unprivileged": "1",
    }
    raw: List[Tuple[str, str]] = []
    paths = [f"/dev/nvidia{m}" for m in minors]
    if minors:
        paths += ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    if devices_style == "lxc" and minors:
        raw.append(("lxc.cgroup2.devices.allow", "c 195:* rwm"))
        raw.append(("lxc.cgroup2.devices.allow", "c 509:* rwm"))
        for p in paths:
            raw.append(("lxc.mount.entry", f"{p} {p[1:]} none bind,optional,create=file"))
    elif devices_style == "dev":
        for i, p in enumerate(paths):
            keys[f"dev{i}"] = p
    lines = [f"{k}: {keys[k]}" for k in sorted(keys)]
    lines += [f"{k}: {v}" for k, v in raw]
    return "\n".join(lines) + "\n"


NODE_RE = re.compile(r"^/dev/nvidia(\d+)$")


def config_gpu_minors(simdir: str, vmid: Union[int, str]) -> List[int]:
    """Minors of the /dev/nvidia<N> nodes the container's config passes through: the sources of
    its ``lxc.mount.entry`` lines and its ``devN:`` entries (sorted, unique)."""
    keys, raw = read_config(simdir, vmid)
    paths = [v.split()[0] for k, v in raw if k == "lxc.mount.entry" and v.split()]
    paths += [v.split(",")[0].strip() for k, v in keys.items() if re.fullmatch(r"dev\d+", k)]
    return sorted({int(m.group(1)) for m in (NODE_RE.match(p) for p in paths) if m})


def read_config(simdir: str, vmid: Union[int, str]) -> Tuple[Dict[str, str], List[Tuple[str, str]]]:
    """(normal keys, raw lxc.* entries in file order) of a container's config."""
    v = _require(simdir, vmid)
    keys: Dict[str, str] = {}
    raw: List[Tuple[str, str]] = []
    with open(config_path(simdir, v), encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = re.match(r"^(\S+?):\s*(.*)$", line)
            if not m:
                continue
            k, val = m.group(1), m.group(2)
            if k.startswith("lxc."):
                raw.append((k, val))
            else:
                keys[k] = val
    return keys, raw


def create(simdir: str, vmid: Union[int, str], hostname: Optional[str] = None, gpus="all",
           devices_style: str = "lxc") -> None:
    """Write DIR/ct/<vmid>/config (PVE's `pct config` shape) with the NVIDIA passthrough lines.

    gpus: "all", "0,1", "0-3", a list of indexes, or None/"none"/[] (no GPU lines, as
    devices_style="none").  devices_style: "lxc" (lxc.cgroup2.devices.allow + lxc.mount.entry),
    "dev" (devN: /dev/nvidiaN ...) or "none"."""
    v = parse_vmid(vmid)
    if devices_style not in DEVICES_STYLES:
        raise ContainerError(f"invalid devices_style={devices_style!r}: must be one of {', '.join(DEVICES_STYLES)}")
    name = hostname if hostname is not None else f"CT{v}"
    _check_hostname(name)
    minors = [] if devices_style == "none" else _gpu_minors(simdir, gpus)
    d = ct_dir(simdir, v)
    os.makedirs(os.path.join(simdir, "ct"), exist_ok=True)
    try:
        os.mkdir(d)
    except FileExistsError:
        if exists(simdir, v):
            raise ContainerError(f"CT {v} already exists ({config_path(simdir, v)})") from None
    text = render_config(v, name, minors, devices_style)
    # O_EXCL: two concurrent creates of the same vmid cannot both succeed.
    try:
        fd = os.open(config_path(simdir, v), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise ContainerError(f"CT {v} already exists ({config_path(simdir, v)})") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


# --- state ----------------------------------------------------------------------------------------

def init_pid(simdir: str, vmid: Union[int, str]) -> Optional[Tuple[int, int]]:
    """(hostpid, starttime) of the running container's init, or None when it is stopped."""
    try:
        with open(os.path.join(ct_dir(simdir, vmid), "init.pid"), encoding="utf-8") as f:
            parts = f.read().split()
        pid, start = int(parts[0]), int(parts[1])
    except (OSError, ValueError, IndexError):
        return None
    return (pid, start) if _alive(pid, start) else None


def status(simdir: str, vmid: Union[int, str]) -> str:
    """'running' iff the init recorded in init.pid is alive with the same starttime."""
    v = _require(simdir, vmid)
    return "running" if init_pid(simdir, v) else "stopped"


def list(simdir: str) -> List[int]:  # noqa: A001 (the API name)
    """The vmids of this scenario's containers, sorted."""
    try:
        names = os.listdir(os.path.join(simdir, "ct"))
    except FileNotFoundError:
        return []
    out = [int(n) for n in names if re.fullmatch(r"[1-9][0-9]{2,8}", n)
           and os.path.isfile(os.path.join(simdir, "ct", n, "config"))]
    return sorted(out)


def uptime(simdir: str, vmid: Union[int, str]) -> int:
    """Seconds since the init started (0 when stopped)."""
    ip = init_pid(simdir, vmid)
    if not ip:
        return 0
    try:
        with open("/proc/uptime", encoding="utf-8") as f:
            up = float(f.read().split()[0])
        return max(0, int(up - ip[1] / os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError):
        return 0


# --- start ----------------------------------------------------------------------------------------

def _read_lines(fd: int, timeout: float) -> List[str]:
    """Lines from a pipe until EOF (every writer closed it) or timeout."""
    deadline = time.monotonic() + timeout
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if not sel.select(left):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
    return buf.decode(errors="replace").splitlines()


def _python() -> str:
    return sys.executable or os.readlink("/proc/self/exe")


def _record_owned(simdir: str, pid: int, start: int) -> None:
    """Tell `gpusim down` about the init (DIR/run/owned), when that machinery is there."""
    try:
        from . import proctools  # noqa: PLC0415 (optional: written by another piece)
        proctools.append_owned(simdir, pid, start)
    except Exception:  # noqa: BLE001
        pass


def start(simdir: str, vmid: Union[int, str]) -> None:
    """Start the container: its init in new PID/mount/UTS namespaces, in cgroup lxc/<vmid>/ns."""
    v = _require(simdir, vmid)
    keys = read_config(simdir, v)[0]
    hostname = keys.get("hostname") or f"CT{v}"
    with _locked(simdir, v):
        if init_pid(simdir, v):
            raise ContainerError(f"CT {v} already running")
        _unlink(os.path.join(ct_dir(simdir, v), "init.pid"))
        # A stale cgroup of ours (a crashed run): clean it up first.
        _remove_cgroup(simdir, v)
        ns = _make_cgroup(simdir, v)
        log = open(os.path.join(ct_dir(simdir, v), "console.log"), "ab")
        r, w = os.pipe()
        try:
            proc = subprocess.Popen(
                [_python(), "-I", "-S", CTINIT, "--dir", simdir, "--vmid", str(v), "--hostname", hostname,
                 "--cgroup", ns, "--ready-fd", str(w)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(w,), start_new_session=True,
                cwd="/", env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "container": "lxc"})
        except OSError as e:
            os.close(r)
            os.close(w)
            log.close()
            _remove_cgroup(simdir, v)
            raise ContainerError(f"cannot start CT {v}: {e}") from e
        os.close(w)
        log.close()
        try:
            lines = _read_lines(r, START_TIMEOUT)
        finally:
            os.close(r)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        pid = None
        err = None
        for line in lines:
            if line.startswith("pid "):
                pid = int(line.split()[1])
            elif line.startswith("error "):
                err = line[6:]
        st = _read_stat(pid) if pid else None
        if err or "ready" not in lines or st is None:
            if pid and st:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _wait_dead(pid, st[1], 5.0)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            with contextlib.suppress(Exception):
                _remove_cgroup(simdir, v)
            raise ContainerError(f"cannot start CT {v}: {err or 'the init did not report ready'}")
        _atomic_write(os.path.join(ct_dir(simdir, v), "init.pid"), f"{pid} {st[1]}\n")
        _record_owned(simdir, pid, st[1])


# --- running commands inside ----------------------------------------------------------------------

def command_env(simdir: str, vmid: Union[int, str], env: Optional[Dict[str, str]]) -> Dict[str, str]:
    """`env` plus PATH with DIR/ctbin and DIR/bin first, and GPUSIM_VMID."""
    v = parse_vmid(vmid)
    out = dict(os.environ if env is None else env)
    first = [os.path.join(simdir, "ctbin"), os.path.join(simdir, "bin")]
    rest = [p for p in out.get("PATH", DEFAULT_PATH).split(":") if p and p not in first]
    out["PATH"] = ":".join(first + rest)
    out["GPUSIM_VMID"] = str(v)
    return out


def _attach_argv(simdir: str, v: int, ip: Tuple[int, int], argv: Sequence[str], detach: bool,
                 status_fd: int = -1) -> List[str]:
    cg = attach_cgroup(v)
    if not os.path.isdir(cg):  # a container started before .lxc existed
        with contextlib.suppress(OSError):
            os.mkdir(cg)
    out = [_python(), "-I", "-S", CTATTACH, "--dir", simdir, "--vmid", str(v), "--init-pid", str(ip[0]),
           "--init-starttime", str(ip[1]), "--cgroup", cg]
    if detach:
        out.append("--detach")
    if status_fd >= 0:
        out += ["--status-fd", str(status_fd)]
    return out + ["--"] + [str(a) for a in argv]


def _running(simdir: str, vmid: Union[int, str]) -> Tuple[int, Tuple[int, int]]:
    v = _require(simdir, vmid)
    ip = init_pid(simdir, v)
    if not ip:
        raise ContainerError(f"container '{v}' not running!")
    return v, ip


def exec_argv(simdir: str, vmid: Union[int, str], argv: Sequence[str], env: Optional[Dict[str, str]],
              *, forward_signals: bool = False) -> int:
    """Run argv inside the running container and wait; returns its exit status (128+N if killed
    by signal N; 127/126 if it cannot be executed).  stdin/stdout/stderr are the caller's."""
    v, ip = _running(simdir, vmid)
    if not argv:
        raise ContainerError("missing command")
    proc = subprocess.Popen(_attach_argv(simdir, v, ip, argv, detach=False), env=command_env(simdir, v, env))
    old = {}
    if forward_signals:
        def fwd(sig, _frame):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
        with contextlib.suppress(ValueError):  # not the main thread: no forwarding
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
                old[sig] = signal.signal(sig, fwd)
            old[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return proc.wait()
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def spawn(simdir: str, vmid: Union[int, str], argv: Sequence[str], env: Optional[Dict[str, str]],
          pass_fds: Iterable[int] = (), log: Optional[str] = None) -> Optional[int]:
    """Start argv inside the running container, detached (it keeps running after we return; it is
    re-parented to the container's init).  pass_fds are inherited; stdin is /dev/null and
    stdout/stderr go to `log` (default DIR/ct/<vmid>/console.log).  Its parent is the container's
    init.  Returns its host pid (None if it already exited; callers may ignore it)."""
    v, ip = _running(simdir, vmid)
    if not argv:
        raise ContainerError("missing command")
    r, w = os.pipe()
    logf = open(log or os.path.join(ct_dir(simdir, v), "console.log"), "ab")
    try:
        proc = subprocess.Popen(_attach_argv(simdir, v, ip, argv, detach=True, status_fd=w),
                                env=command_env(simdir, v, env), stdin=subprocess.DEVNULL, stdout=logf,
                                stderr=logf, pass_fds=tuple(pass_fds) + (w,), start_new_session=True)
    finally:
        os.close(w)
        logf.close()
    try:
        data = b""
        while True:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
    proc.wait()
    pid = None
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("error "):
            raise ContainerError(f"CT {v}: {line[6:]}")
        if line.startswith("pid "):
            pid = int(line.split()[1])
            if pid <= 0:
                return None  # it ran and exited already
    if pid is None:
        raise ContainerError(f"CT {v}: cannot run {argv[0]} (attach helper exited {proc.returncode})")
    return pid


# --- stopping -------------------------------------------------------------------------------------

def _wait_dead(pid: int, start: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid, start):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _signal_init(ip: Tuple[int, int], sig: int) -> None:
    """Signal the init, race-free against pid reuse (pidfd) where the platform has it."""
    pid, start = ip
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return  # gone
        try:
            if _alive(pid, start):
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, sig)
        finally:
            os.close(fd)
        return
    if _alive(pid, start):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _finish_stop(simdir: str, v: int) -> None:
    with _locked(simdir, v):
        if init_pid(simdir, v):
            return  # started again meanwhile
        _unlink(os.path.join(ct_dir(simdir, v), "init.pid"))
        _remove_cgroup(simdir, v)


def shutdown(simdir: str, vmid: Union[int, str], timeout: float = 60, force_stop: bool = False) -> None:
    """Like `lxc-stop [--nokill] --timeout N`: SIGPWR to the init, which SIGTERMs every process of
    the container and exits once they are gone; wait up to `timeout`; then SIGKILL the init if
    force_stop, else raise ContainerError('container did not stop')."""
    v = _require(simdir, vmid)
    ip = init_pid(simdir, v)
    if not ip:
        raise ContainerError(f"CT {v} not running")
    _signal_init(ip, signal.SIGPWR)
    if not _wait_dead(ip[0], ip[1], max(0.0, float(timeout))):
        if not force_stop:
            raise ContainerError("container did not stop")
        _signal_init(ip, signal.SIGKILL)
        if not _wait_dead(ip[0], ip[1], 30.0):
            raise ContainerError(f"container did not stop (init {ip[0]} survived SIGKILL)")
    _finish_stop(simdir, v)


def stop(simdir: str, vmid: Union[int, str]) -> None:
    """Like `lxc-stop --kill`: SIGKILL the init at once (the kernel kills the PID namespace)."""
    v = _require(simdir, vmid)
    ip = init_pid(simdir, v)
    if not ip:
        raise ContainerError(f"CT {v} not running")
    _signal_init(ip, signal.SIGKILL)
    if not _wait_dead(ip[0], ip[1], 30.0):
        raise ContainerError(f"CT {v}: init {ip[0]} survived SIGKILL")
    _finish_stop(simdir, v)


def stop_all(simdir: str) -> List[str]:
    """Stop every running container of this scenario and remove their cgroups.  Never raises;
    returns the problems it met (for `gpusim down` to print)."""
    problems: List[str] = []
    try:
        vmids = list(simdir)
        # Also directories whose config is gone but which still hold an init or a cgroup record.
        with contextlib.suppress(OSError):
            for n in os.listdir(os.path.join(simdir, "ct")):
                if re.fullmatch(r"[1-9][0-9]{2,8}", n) and int(n) not in vmids:
                    vmids.append(int(n))
    except Exception as e:  # noqa: BLE001
        return [f"cannot list containers: {e}"]
    for v in vmids:
        try:
            ip = init_pid(simdir, v)
            if ip:
                _signal_init(ip, signal.SIGKILL)
                if not _wait_dead(ip[0], ip[1], 30.0):
                    problems.append(f"CT {v}: init {ip[0]} survived SIGKILL")
                    continue
            _unlink(os.path.join(ct_dir(simdir, v), "init.pid"))
            _remove_cgroup(simdir, v)
        except Exception as e:  # noqa: BLE001 (must never raise)
            problems.append(f"CT {v}: {e}")
    return problems
