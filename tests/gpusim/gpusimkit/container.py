"""Proxmox VE containers of the simulated node: real LXC containers (Debian's lxc 5, the base of PVE 8).

A container is two directories of the scenario:

- ``DIR/etc/pve/nodes/<node>/lxc/<vmid>.conf``: the container's PVE config (the file ``pct config`` and the
  modules read, with its ``[pve:pending]`` and snapshot sections), listed in ``DIR/etc/pve/.vmlist`` as pmxcfs
  lists it, with pmxcfs' links ``DIR/etc/pve/lxc`` and ``local``; ``DIR/ct/<vmid>/``: ``kind`` (``busybox`` or
  ``systemd``), ``lock``.
- ``DIR/lxc/<vmid>/``: the LXC container under the lxcpath ``DIR/lxc`` (so two simulators never share
  one): ``config`` (LXC's, written at each start from the PVE config as pve-container's
  ``update_lxc_config`` does), ``rootfs/`` (busybox) or ``upper/`` (the overlay over the cached Debian
  rootfs with systemd), ``lxc.log``.

The LXC config carries pve-container's cgroup layout (``lxc.cgroup.dir.container = lxc/<vmid>``,
``lxc.cgroup.dir.container.inner = ns``, ``lxc.cgroup.dir.monitor = lxc.monitor/<vmid>``), no network
(``lxc.net.0.type = empty``), the simulated device files ``DIR/dev/nvidia*`` bound in as
``/dev/nvidia*``, and binds of the scenario directory (read-write, same path) and of the simulator and the
Python that runs workloads (read-only, same paths).  Busybox containers also get the host's ``/usr``
read-only (a Python interpreter and its libraries; busybox's init is PID 1).

vmids are machine-wide: ``lxc/<vmid>`` is one cgroup per machine.  ``create`` reserves the vmid
(``/run/gpusim/vmids/<vmid>``, gpusimkit.vmids); a vmid reserved by a live simulator is waited for
(``VMID_WAIT_S``), then refused.  ``stop_all`` (``gpusim down``) stops every container, removes every
cgroup directory LXC left behind and releases the reservations.

Stdlib only, Python 3.9+.  Every operation is one of LXC's tools: ``lxc-start``, ``lxc-stop``,
``lxc-attach``, ``lxc-info``.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import cgroups, proctools, rootfs, vmids
from . import scenario as _scenario

VMID_MIN = 100
VMID_MAX = 999999999
DEVICES_STYLES = ("lxc", "dev", "hook", "devdir", "none")
# The NVIDIA container toolkit's LXC hook (lxc's hooks/nvidia), as its users configure it.
TOOLKIT_HOOK = "/usr/share/lxc/hooks/nvidia"
KINDS = ("busybox", "systemd")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
START_TIMEOUT = 60.0
LXC_TOOLS = ("lxc-start", "lxc-stop", "lxc-attach", "lxc-info")
KIT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/gpusim
SETUP = os.path.join(KIT_ROOT, "setup-lxc.sh")


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


def pve_dir(simdir: str) -> str:
    """The node's /etc/pve (pmxcfs on a node): DIR/etc/pve."""
    return os.path.join(simdir, "etc", "pve")


def node_lxc_dir(simdir: str) -> str:
    """This node's container configs: /etc/pve/nodes/<node>/lxc (what /etc/pve/lxc links to). The node is the one
    pmxcfs' ``local`` link names (make_pve made it), not this process's hostname: a workload in a container reads
    the config too, and its hostname is the container's."""
    try:
        node = os.readlink(os.path.join(pve_dir(simdir), "local")).rstrip("/").rsplit("/", 1)[-1]
    except OSError:
        node = nodename()
    return os.path.join(pve_dir(simdir), "nodes", node, "lxc")


def config_path(simdir: str, vmid: Union[int, str]) -> str:
    """The container's PVE config, /etc/pve/nodes/<node>/lxc/<vmid>.conf: what pct and the modules read."""
    return os.path.join(node_lxc_dir(simdir), f"{parse_vmid(vmid)}.conf")


VMLIST_LOCK = ".vmlist.lock"


def make_pve(simdir: str) -> None:
    """DIR/etc/pve as pmxcfs shows it on a single node (pve-cluster src/pmxcfs/pmxcfs.c create_symlinks: ``local`` ->
    ``nodes/<node>``, ``lxc`` -> ``nodes/<node>/lxc``, ``qemu-server`` -> ``nodes/<node>/qemu-server``), with its
    ``.vmlist``; kept as it is when there."""
    d = pve_dir(simdir)
    node = nodename()
    for sub in ("lxc", "qemu-server"):
        os.makedirs(os.path.join(d, "nodes", node, sub), exist_ok=True)
    for name, target in (("local", f"nodes/{node}"), ("lxc", f"nodes/{node}/lxc"),
                         ("qemu-server", f"nodes/{node}/qemu-server")):
        with contextlib.suppress(FileExistsError):
            os.symlink(target, os.path.join(d, name))
    if not os.path.exists(os.path.join(d, ".vmlist")):
        write_vmlist(simdir)


def vmlist_text(version: int, ids: Dict[int, Tuple[str, str, int]]) -> str:
    """pmxcfs' .vmlist (pve-cluster src/pmxcfs/status.c, cfs_create_vmlist_msg): ``"version"``, then, when there is a
    guest, ``"ids"`` with ``"<vmid>": { "node": ..., "type": ..., "version": ... }`` per guest."""
    if not ids:
        return '{\n"version": %u\n\n}\n' % version
    rows = ",\n".join('"%u": { "node": "%s", "type": "%s", "version": %u }' % (v, n, t, ver)
                      for v, (n, t, ver) in sorted(ids.items()))
    return '{\n"version": %u,\n"ids": {\n%s}\n\n}\n' % (version, rows)


def write_vmlist(simdir: str) -> None:
    """Rebuild .vmlist from the configs under nodes/*/lxc (pmxcfs' memdb_recreate_vmlist), its version one more than
    before; a guest already listed keeps its version."""
    d = pve_dir(simdir)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, VMLIST_LOCK), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old: Dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(d, ".vmlist"), encoding="utf-8") as f:
                old = json.load(f)
        version = int(old.get("version", 0)) + 1
        before = old.get("ids", {})
        ids: Dict[int, Tuple[str, str, int]] = {}
        with contextlib.suppress(OSError):
            for node in sorted(os.listdir(os.path.join(d, "nodes"))):
                with contextlib.suppress(OSError):
                    for name in os.listdir(os.path.join(d, "nodes", node, "lxc")):
                        m = re.fullmatch(r"([1-9][0-9]{2,8})\.conf", name)
                        if m:
                            v = int(m.group(1))
                            ids[v] = (node, "lxc", int((before.get(str(v)) or {}).get("version", version)))
        _atomic_write(os.path.join(d, ".vmlist"), vmlist_text(version, ids))


def lxcpath(simdir: str) -> str:
    """LXC's lxcpath of this scenario (``lxc-* -P``)."""
    return os.path.join(os.path.realpath(simdir), "lxc")


def lxc_dir(simdir: str, vmid: Union[int, str]) -> str:
    return os.path.join(lxcpath(simdir), str(parse_vmid(vmid)))


def exists(simdir: str, vmid: Union[int, str]) -> bool:
    return os.path.isfile(config_path(simdir, vmid))


def _require(simdir: str, vmid: Union[int, str]) -> int:
    v = parse_vmid(vmid)
    if not exists(simdir, v):
        raise NoSuchContainer(f"Configuration file 'nodes/{nodename()}/lxc/{v}.conf' does not exist")
    return v


def kind(simdir: str, vmid: Union[int, str]) -> str:
    """``busybox`` or ``systemd`` (the rootfs the container boots)."""
    try:
        with open(os.path.join(ct_dir(simdir, vmid), "kind"), encoding="utf-8") as f:
            k = f.read().strip()
    except OSError:
        return "busybox"
    return k if k in KINDS else "busybox"


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


def _python() -> str:
    return sys.executable or os.readlink("/proc/self/exe")


# --- LXC's tools ------------------------------------------------------------------------------------

def check_lxc() -> None:
    """ContainerError naming the missing tool and the set-up that installs it."""
    missing = [t for t in LXC_TOOLS if not shutil.which(t, path=os.environ.get("PATH", "") + ":" + DEFAULT_PATH)]
    if missing:
        raise ContainerError(f"LXC is not installed ({', '.join(missing)} not found): the simulator's containers "
                             f"are real LXC containers; run {SETUP} (make sim installs lxc, debootstrap, busybox-static)")


def _tool(name: str) -> str:
    check_lxc()
    return shutil.which(name, path=os.environ.get("PATH", "") + ":" + DEFAULT_PATH) or name


def lxc_argv(simdir: str, tool: str, vmid: Union[int, str], *args: str) -> List[str]:
    """``<tool> -n <vmid> -P DIR/lxc args...``"""
    return [_tool(tool), "-n", str(parse_vmid(vmid)), "-P", lxcpath(simdir), *args]


def _run(argv: Sequence[str], timeout: float = 60.0, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(builtins.list(argv), capture_output=True, text=True, check=False, timeout=timeout,
                          stdin=subprocess.DEVNULL, **kw)


# --- cgroups LXC makes ------------------------------------------------------------------------------

def cgroup2_mount() -> str:
    """The machine's cgroup2 mount point (cgroups.mount), as a ContainerError when there is none."""
    try:
        return cgroups.mount()
    except cgroups.CgroupError as e:
        raise ContainerError(f"{e}: containers need a cgroup2 hierarchy (lxc/<vmid>/ns)") from e


def cgroup_dirs(vmid: Union[int, str]) -> Tuple[str, str, str]:
    """(<cgroup2 mount>/lxc, <mount>/lxc/<vmid>, <mount>/lxc/<vmid>/ns)."""
    lxc = os.path.join(cgroup2_mount(), "lxc")
    base = os.path.join(lxc, str(parse_vmid(vmid)))
    return lxc, base, os.path.join(base, "ns")


def cgroup_path(vmid: Union[int, str]) -> str:
    """The container's cgroup as /proc/<pid>/cgroup shows it on the host: /lxc/<vmid>/ns (its
    processes are there or below it: ns/.lxc, ns/init.scope, ns/system.slice/<name>.service)."""
    return f"/lxc/{parse_vmid(vmid)}/ns"


def attach_cgroup(vmid: Union[int, str]) -> str:
    """<mount>/lxc/<vmid>/ns/.lxc: where lxc-attach puts an attached process (cgroup2)."""
    return os.path.join(cgroup_dirs(vmid)[2], cgroups.ATTACH)


def lxc_cgroups(vmid: Union[int, str]) -> List[str]:
    """Every cgroup directory LXC makes for the container, in every hierarchy of the machine (cgroup2
    and, on a hybrid or v1 machine, each v1 hierarchy): ``lxc/<vmid>`` and ``lxc.monitor/<vmid>``."""
    v = parse_vmid(vmid)
    out = []
    for root in cgroups.hierarchies():
        out += [os.path.join(root, "lxc", str(v)), os.path.join(root, "lxc.monitor", str(v))]
    return out


def leftover_cgroups(vmid: Union[int, str]) -> List[str]:
    """The directories of lxc_cgroups(vmid) that exist now: after the container stopped, none should."""
    return [d for d in lxc_cgroups(vmid) if os.path.isdir(d)]


def _cgroup_procs(d: str) -> List[int]:
    return cgroups.procs(d, recursive=True)


def _remove_cgroups(vmid: int, kill: bool) -> List[str]:
    """Remove what LXC left of lxc/<vmid> and lxc.monitor/<vmid> (and lxc/, lxc.monitor/ when they are
    empty).  The vmid is this scenario's (reserved), so processes still there are its own: with
    ``kill`` they get SIGKILL, else the directory is reported.  Returns the problems."""
    problems = []
    for d in leftover_cgroups(vmid):
        if _cgroup_procs(d):
            if not kill:
                problems.append(f"cgroup {d} still has processes {_cgroup_procs(d)}")
                continue
            cgroups.kill(d)
            if not cgroups.wait_empty(d, 5.0):
                # v1 hierarchies have no cgroup.events: wait on cgroup.procs
                deadline = time.monotonic() + 5
                while _cgroup_procs(d) and time.monotonic() < deadline:
                    for p in _cgroup_procs(d):
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(p, signal.SIGKILL)
                    time.sleep(0.02)
        try:
            cgroups.remove_tree(d, timeout=5.0)
        except OSError as e:
            problems.append(f"cannot remove cgroup {d}: {e.strerror}")
    with vmids.machine_lock():
        for root in cgroups.hierarchies():
            for parent in ("lxc", "lxc.monitor"):
                with contextlib.suppress(OSError):  # not empty (another container), gone, busy
                    os.rmdir(os.path.join(root, parent))
    return problems


# --- the PVE config ---------------------------------------------------------------------------------

def _hwaddr(vmid: int) -> str:
    d = hashlib.sha256(f"gpusim-ct-{vmid}".encode()).digest()
    return "BC:24:11:%02X:%02X:%02X" % (d[0], d[1], d[2])


def _check_hostname(name: str) -> None:
    label = r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
    if not re.fullmatch(rf"{label}(\.{label})*", name) or len(name) > 253:
        raise ContainerError(f"invalid hostname={name!r}: must be a DNS name (letters, digits, '-', '.')")


def _gpu_minors(simdir: str, gpus) -> List[int]:
    sc = _scenario.load(simdir) if _gpu_indexes(simdir, gpus) else None
    return [sc.gpus[i].minor for i in _gpu_indexes(simdir, gpus)] if sc else []


def _gpu_indexes(simdir: str, gpus) -> List[int]:
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
        return builtins.list(_scenario.parse_gpu_list(str(gpus), sc.gpu_count))
    except _scenario.ScenarioError as e:
        raise ContainerError(str(e)) from None


def render_config(vmid: int, hostname: str, minors: Sequence[int], devices_style: str, indexes: Sequence[int] = ()) -> str:
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
    elif devices_style == "hook" and minors:
        # The toolkit's hook mounts the nodes of NVIDIA_VISIBLE_DEVICES's GPUs (indexes), the control nodes too.
        raw.append(("lxc.hook.mount", TOOLKIT_HOOK))
        raw.append(("lxc.environment", "NVIDIA_VISIBLE_DEVICES=" + ",".join(str(i) for i in indexes)))
        raw.append(("lxc.environment", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"))
    elif devices_style == "devdir" and minors:
        # The node's whole /dev: every GPU (whichever were asked for). No cgroup line: a privileged container, or
        # one whose device permissions are set elsewhere.
        raw.append(("lxc.mount.entry", "/dev dev none bind,optional,create=dir"))
    lines = [f"{k}: {keys[k]}" for k in sorted(keys)]
    lines += [f"{k}: {v}" for k, v in raw]
    return "\n".join(lines) + "\n"


class PveConfig:
    """A container's config file as pve-container's ``parse_pct_config`` reads it: the leading ``#``
    lines (the description), ``key: value`` lines, raw ``lxc.*`` entries (in file order), a
    ``[pve:pending]`` section (pending values and ``delete: key,key``) and ``[snapshot]`` sections."""

    def __init__(self, text: str):
        self.keys: Dict[str, str] = {}
        self.raw: List[Tuple[str, str]] = []
        self.pending: Dict[str, str] = {}
        self.pending_delete: List[str] = []
        self.snapshots: Dict[str, Dict[str, str]] = {}
        section: Optional[str] = None
        descr = ""
        cur = self.keys
        for line in text.split("\n"):
            if not line.strip():
                continue
            m = re.match(r"^\[(pve:pending|[a-z][a-z0-9_\-]+)\]\s*$", line, re.I)
            if m:
                if descr:
                    cur["description"] = descr
                descr = ""
                section = m.group(1).lower()
                cur = self.pending if section == "pve:pending" else self.snapshots.setdefault(section, {})
                continue
            if line.startswith("#"):
                descr += decode_text(line[1:]) + "\n"
                continue
            m = re.match(r"^(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*$", line)
            if m:
                if section is None:
                    self.raw.append((m.group(1), m.group(3)))
                continue
            m = re.match(r"^description:\s*(.*\S)\s*$", line)
            if m:
                descr += decode_text(m.group(1))
                continue
            m = re.match(r"^delete:\s*(.*\S)\s*$", line)
            if m:
                if section == "pve:pending":
                    self.pending_delete = [k.lstrip("!") for k in re.split(r"[\s,;]+", m.group(1)) if k]
                continue
            m = re.match(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$", line)
            if m:
                cur[m.group(1)] = m.group(2)
        if descr:
            cur["description"] = descr

    def current(self, current: bool) -> Dict[str, str]:
        """PVE::AbstractConfig::load_current_config: the config with its pending changes applied, or
        (``current``) without them."""
        out = dict(self.keys)
        if not current:
            out.update(self.pending)
            for k in self.pending_delete:
                out.pop(k, None)
        return out


def encode_text(text: str) -> str:
    """PVE::Tools::encode_text: control and non-ASCII characters and ':' as %XX of their UTF-8 bytes."""
    return "".join(chr(b) if 0x20 <= b <= 0x39 or 0x3b <= b <= 0x7e else "%%%02X" % b for b in text.encode())


def decode_text(text: str) -> str:
    """PVE::Tools::decode_text (URI unescape, then UTF-8)."""
    raw = re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), text.encode())
    return raw.decode("utf-8", errors="replace")


def load_config(simdir: str, vmid: Union[int, str]) -> PveConfig:
    v = _require(simdir, vmid)
    with open(config_path(simdir, v), encoding="utf-8") as f:
        return PveConfig(f.read())


def read_config(simdir: str, vmid: Union[int, str], current: bool = True
                ) -> Tuple[Dict[str, str], List[Tuple[str, str]]]:
    """(keys, raw lxc.* entries in file order) of a container's config: its current values (the
    container runs with them), or with ``current=False`` the pending changes applied."""
    conf = load_config(simdir, vmid)
    return conf.current(current), builtins.list(conf.raw)


NODE_RE = re.compile(r"^/dev/nvidia(\d+)$")


def _is_dev_bind(key: str, value: str) -> bool:
    """``lxc.mount.entry: /dev dev none bind,...``: the node's whole /dev."""
    return key == "lxc.mount.entry" and bool(value.split()) and value.split()[0].rstrip("/") == "/dev"


def _toolkit_paths(simdir: Optional[str], raw: Sequence[Tuple[str, str]]) -> List[str]:
    """The nodes the NVIDIA container toolkit's hook would mount (lxc's hooks/nvidia: nvidia-container-cli
    ``--device=$NVIDIA_VISIBLE_DEVICES``): none without ``lxc.hook.mount: .../nvidia``, or when NVIDIA_VISIBLE_DEVICES
    (the last ``lxc.environment`` of it) is unset, empty or ``void``; the control nodes for ``none``; with them, every
    GPU's node for ``all``, else those of the GPUs named by index or UUID (an id that no GPU has: nothing, where
    nvidia-container-cli fails the start)."""
    if simdir is None or not any(k == "lxc.hook.mount" and v.split() and os.path.basename(v.split()[0]) == "nvidia"
                                 for k, v in raw):
        return []
    env = dict(v.split("=", 1) for k, v in raw if k == "lxc.environment" and "=" in v)
    value = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if value in ("", "void"):
        return []
    control = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    if value == "none":
        return control
    sc = _scenario.load(simdir)
    if value == "all":
        chosen = builtins.list(sc.gpus)
    else:
        ids = [t.strip() for t in value.split(",") if t.strip()]
        prefixes = [t.lower() for t in ids if t.lower().startswith("gpu-")]
        chosen = [g for g in sc.gpus if str(g.index) in ids or any(g.uuid.lower().startswith(t) for t in prefixes)]
    return [f"/dev/nvidia{g.minor}" for g in chosen] + control


def _device_paths(keys: Dict[str, str], raw: Sequence[Tuple[str, str]], simdir: Optional[str] = None) -> List[str]:
    """Host paths of the devices the config passes through: the sources of ``lxc.mount.entry`` lines
    under /dev, the paths of ``devN:`` entries, the nodes of the toolkit's hook (_toolkit_paths) and, for a bind of
    the whole /dev, every simulated ``DIR/dev/nvidia*`` node (the hook and the bind need ``simdir``)."""
    paths = [v.split()[0] for k, v in raw if k == "lxc.mount.entry" and v.split() and v.split()[0].startswith("/dev/")]
    paths += [v.split(",")[0].strip() for k, v in sorted(keys.items()) if re.fullmatch(r"dev\d+", k)]
    paths += _toolkit_paths(simdir, raw)
    if simdir is not None and any(_is_dev_bind(k, v) for k, v in raw):
        with contextlib.suppress(FileNotFoundError):
            paths += ["/dev/" + n for n in sorted(os.listdir(os.path.join(simdir, "dev"))) if n.startswith("nvidia")]
    return builtins.list(dict.fromkeys(p[len("path="):] if p.startswith("path=") else p for p in paths))


def config_gpu_minors(simdir: str, vmid: Union[int, str]) -> List[int]:
    """Minors of the /dev/nvidia<N> nodes the container's current config passes through (sorted, unique)."""
    keys, raw = read_config(simdir, vmid)
    return sorted({int(m.group(1)) for m in (NODE_RE.match(p) for p in _device_paths(keys, raw, simdir)) if m})


def create(simdir: str, vmid: Union[int, str], hostname: Optional[str] = None, gpus="all",
           devices_style: str = "lxc", systemd: bool = False, unprivileged: bool = False,
           users: Optional[Dict[str, int]] = None) -> None:
    """Create container ``vmid``: reserve the vmid on this machine, write DIR/ct/<vmid>/config (PVE's
    ``pct config`` shape, with the NVIDIA passthrough lines) and the container's rootfs.

    gpus: "all", "0,1", "0-3", a list of indexes, or None/"none"/[] (no GPU lines, as
    devices_style="none").  devices_style: "lxc" (lxc.cgroup2.devices.allow + lxc.mount.entry),
    "dev" (devN: /dev/nvidiaN ...), "hook" (the NVIDIA container toolkit's lxc.hook.mount with
    lxc.environment: NVIDIA_VISIBLE_DEVICES=<indexes>), "devdir" (a bind of the node's whole /dev: every
    GPU, whichever ``gpus`` names) or "none".  systemd: boot a Debian 12 rootfs with systemd as PID 1
    (services started in it are systemd units) instead of busybox.  unprivileged: map the container's
    uids and gids as pve-container does for ``unprivileged: 1`` (``lxc.idmap = u 0 100000 65536``, the
    same for g; see ensure_subids): its root is node uid 100000; else the container runs unmapped (what
    every other test of the simulator was written against, although its config says ``unprivileged: 1``).
    users: {name: uid} added to the busybox rootfs's /etc/passwd and /etc/group (the container's own
    users, which the node's passwd does not know)."""
    v = parse_vmid(vmid)
    if users and systemd:
        raise ContainerError("users= is for busybox containers (their /etc/passwd is the simulator's)")
    if devices_style not in DEVICES_STYLES:
        raise ContainerError(f"invalid devices_style={devices_style!r}: must be one of {', '.join(DEVICES_STYLES)}")
    name = hostname if hostname is not None else f"CT{v}"
    _check_hostname(name)
    minors = [] if devices_style == "none" else _gpu_minors(simdir, gpus)
    indexes = _gpu_indexes(simdir, gpus) if devices_style == "hook" else []
    check_lxc()
    if systemd:
        rootfs.ensure_systemd_rootfs()
    d = ct_dir(simdir, v)
    os.makedirs(os.path.join(simdir, "ct"), exist_ok=True)
    make_pve(simdir)
    try:
        os.mkdir(d)
    except FileExistsError:
        if exists(simdir, v):
            raise ContainerError(f"CT {v} already exists ({config_path(simdir, v)})") from None
    vmids.reserve(simdir, v)
    text = render_config(v, name, minors, devices_style, indexes)
    # O_EXCL: two concurrent creates of the same vmid cannot both succeed.
    try:
        fd = os.open(config_path(simdir, v), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise ContainerError(f"CT {v} already exists ({config_path(simdir, v)})") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    # DIR/ct/<vmid>/config: a link to it, where earlier simulators kept the config (their vmid reservations look
    # there: a simulator of another checkout on this machine then sees this vmid as live, gpusimkit.vmids).
    with contextlib.suppress(FileExistsError):
        os.symlink(os.path.relpath(config_path(simdir, v), d), os.path.join(d, "config"))
    write_vmlist(simdir)
    _atomic_write(os.path.join(d, "kind"), ("systemd" if systemd else "busybox") + "\n")
    if unprivileged:
        ensure_subids()
        _atomic_write(os.path.join(d, "idmap"), "".join(f"{k} {IDMAP}\n" for k in ("u", "g")))
    ld = lxc_dir(simdir, v)
    os.makedirs(ld, exist_ok=True)
    if systemd:
        os.makedirs(os.path.join(ld, "upper"), exist_ok=True)
    else:
        rootfs.make_busybox_rootfs(os.path.join(ld, "rootfs"), users=users)
    if unprivileged:
        _shift_owner(os.path.join(ld, "upper" if systemd else "rootfs"))
        _searchable(ld)


def _searchable(path: str) -> None:
    """Let the container's root (node uid 100000) reach its rootfs, as LXC asks ("Could not access DIR. Please
    grant it x access"): search permission for others on each directory above ``path`` that lacks it (the
    scenario's temporary directories are 0700)."""
    path = os.path.realpath(path)
    while path != os.path.dirname(path):
        mode = os.stat(path).st_mode
        if not mode & 0o001:
            os.chmod(path, (mode & 0o7777) | 0o001)
        path = os.path.dirname(path)


def _shift_owner(top: str) -> None:
    """Give an unprivileged container its files, as pve-container's restore and create do: each file's owner and
    group shifted into the container's range (root's become node uid 100000)."""
    base = int(IDMAP.split()[1])
    for root, dirs, files in os.walk(top):
        for name in [root] + [os.path.join(root, n) for n in dirs + files]:
            st = os.lstat(name)
            if st.st_uid < base:
                os.lchown(name, st.st_uid + base, st.st_gid + base)


# --- unprivileged containers ------------------------------------------------------------------------
# pve-container (src/PVE/LXC.pm, update_lxc_config): an unprivileged container without lxc.idmap lines of its
# own gets ``lxc.idmap = u 0 100000 65536`` and ``g 0 100000 65536``, and /usr/share/lxc/config/userns.conf.
IDMAP = "0 100000 65536"
SUBID_LINE = "root:100000:65536"


def idmap_lines(simdir: str, vmid: Union[int, str]) -> List[str]:
    """The lxc.idmap values of an unprivileged container of the simulator ([] for one that is not mapped)."""
    try:
        with open(os.path.join(ct_dir(simdir, vmid), "idmap"), encoding="utf-8") as f:
            return [ln.strip() for ln in f if ln.strip()]
    except FileNotFoundError:
        return []


def reachable(path: str) -> bool:
    """Whether a user that is neither root nor in the owner's group (an unprivileged container's root) may reach
    ``path`` (search permission for others on every directory down to it)."""
    path = os.path.realpath(path)
    while path != os.path.dirname(path):
        path = os.path.dirname(path)
        if not os.stat(path).st_mode & 0o001:
            return False
    return True


def container_python(simdir: str, vmid: Union[int, str], uid: Optional[int] = None) -> Optional[str]:
    """The interpreter a workload of this container runs (None: this one's, bound in): an unprivileged container
    cannot mount an interpreter it may not reach, nor can a user other than root run it, so these run the node's
    /usr/bin/python3 (the simulator is stdlib-only), bound in with /usr."""
    if not (idmap_lines(simdir, vmid) or uid) or reachable(os.path.realpath(_python())):
        return None
    for p in ("/usr/bin/python3",):
        if os.path.isfile(p):
            return p
    raise ContainerError(f"CT {parse_vmid(vmid)} is unprivileged and cannot reach {_python()}, and there is no "
                         "/usr/bin/python3 to run its workloads")


def container_kit(simdir: str, vmid: Union[int, str], uid: Optional[int] = None) -> Optional[str]:
    """Where a workload of this container imports the simulator from (None: KIT_ROOT, bound in with the checkout).

    An unprivileged container's root (node uid 100000), or a user other than root, cannot reach a checkout that lies
    under a folder only root may enter (mode 0700: root's home, a ``mktemp -d`` folder): LXC cannot bind it for them
    and they could not read it if it did. Such a container gets a copy of the simulator's package in the scenario
    directory (``DIR/kit/gpusimkit``, readable by all), which every container binds at the same path and may reach
    (_searchable: search permission on each directory above it, as for its rootfs)."""
    if not (idmap_lines(simdir, vmid) or uid) or reachable(os.path.join(KIT_ROOT, "gpusimkit", "workload.py")):
        return None
    dest = os.path.join(simdir, "kit")
    if not os.path.isfile(os.path.join(dest, "gpusimkit", "workload.py")):
        tmp = f"{dest}.tmp.{os.getpid()}"
        shutil.copytree(os.path.join(KIT_ROOT, "gpusimkit"), os.path.join(tmp, "gpusimkit"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        for root, _dirs, files in os.walk(tmp):
            os.chmod(root, 0o755)
            for name in files:
                os.chmod(os.path.join(root, name), 0o644)
        try:
            os.rename(tmp, dest)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another start made it meanwhile
    _searchable(dest)
    return dest


def unreachable_cause(simdir: str, vmid: Union[int, str], paths: Sequence[str], uid: Optional[int] = None) -> str:
    """Why a workload of an unprivileged container (or of ``uid``) may not have started: the ``paths`` it needs (its
    interpreter, what it imports) that a user other than root cannot reach ('' when it can reach all of them)."""
    if not (idmap_lines(simdir, vmid) or uid):
        return ""
    blocked = [p for p in paths if p and not reachable(p)]
    if not blocked:
        return ""
    who = f"uid {uid}" if uid else "its root (node uid 100000)"
    return (f"CT {parse_vmid(vmid)} is unprivileged and {who} cannot reach {', '.join(blocked)}: a directory above it"
            " is not searchable by others (mode 0700, like /root or a mktemp -d folder); clone the checkout under a"
            " folder others may enter (chmod o+x on each directory above it)")


def ensure_subids() -> None:
    """root's subordinate ids in /etc/subuid and /etc/subgid (``root:100000:65536``, as a Proxmox VE node has them),
    added only when root has none there: LXC reads them for the idmap of a container that root starts."""
    for path in ("/etc/subuid", "/etc/subgid"):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            text = ""
        if any(ln.split(":")[0] == "root" for ln in text.splitlines()):
            continue
        with open(path, "a", encoding="utf-8") as f:
            f.write(("" if not text or text.endswith("\n") else "\n") + SUBID_LINE + "\n")


# --- the LXC config ---------------------------------------------------------------------------------

def _ro_paths() -> List[str]:
    """Host directories a workload (or a module run by `pct exec`) needs inside a container, bound
    read-only at the same path: the checkout that holds the simulator (the collection: tests/gpusim
    and the modules), and the Python that runs them (its prefixes: a venv, its interpreter), unless
    under /usr."""
    top = os.path.dirname(os.path.dirname(KIT_ROOT))
    paths = [top if top != "/" else KIT_ROOT]
    exe = os.path.realpath(_python())
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.dirname(exe))):
        p = os.path.realpath(p)
        if p != "/" and not (p == "/usr" or p.startswith("/usr/")):
            paths.append(p)
    out: List[str] = []
    for p in sorted(set(paths), key=len):
        if not any(p == q or p.startswith(q + "/") for q in out):
            out.append(p)
    return out


def lxc_config(simdir: str, vmid: int) -> str:
    """LXC's config of the container, as pve-container's update_lxc_config writes /var/lib/lxc/<vmid>/config."""
    sim = os.path.realpath(simdir)
    keys, raw = read_config(simdir, vmid)
    k = kind(simdir, vmid)
    ld = lxc_dir(simdir, vmid)
    out = [
        "# Written by gpusim at each start (gpusimkit/container.py), as pve-container's update_lxc_config",
        "lxc.cgroup.relative = 0",
        f"lxc.cgroup.dir.monitor = lxc.monitor/{vmid}",
        f"lxc.cgroup.dir.container = lxc/{vmid}",
        "lxc.cgroup.dir.container.inner = ns",
        f"lxc.arch = {keys.get('arch', 'amd64')}",
        "lxc.include = /usr/share/lxc/config/common.conf",
        "lxc.apparmor.profile = unconfined",
        "lxc.mount.auto = proc:mixed sys:mixed cgroup:mixed",
        "lxc.monitor.unshare = 1",
        "lxc.console.path = none",
        "lxc.tty.max = 0",
        "lxc.environment = TERM=linux",
        f"lxc.uts.name = {keys.get('hostname') or f'CT{vmid}'}",
        "lxc.net.0.type = empty",
        "lxc.init.cmd = /sbin/init",
    ]
    idmap = idmap_lines(simdir, vmid)
    if idmap and not any(key == "lxc.idmap" for key, _value in raw):
        out.append("lxc.include = /usr/share/lxc/config/userns.conf")
        out += [f"lxc.idmap = {line}" for line in idmap]
    if k == "systemd":
        out.append(f"lxc.rootfs.path = overlay:{rootfs.systemd_rootfs()}:{os.path.join(ld, 'upper')}")
    else:
        out.append(f"lxc.rootfs.path = dir:{os.path.join(ld, 'rootfs')}")
        out.append("lxc.signal.halt = SIGUSR1")  # busybox init halts on SIGUSR1
        out.append("lxc.mount.entry = /usr usr none ro,bind 0 0")
    for p in _ro_paths():
        if idmap and not reachable(p):
            continue  # the container's root may not mount it (e.g. a Python under /root): see container_python
        out.append(f"lxc.mount.entry = {p} {p.lstrip('/')} none ro,bind,create=dir 0 0")
    out.append(f"lxc.mount.entry = {sim} {sim.lstrip('/')} none bind,create=dir 0 0")
    # The passthrough: each /dev/nvidia* node of the config, from the simulated device files (the toolkit hook's
    # mounts and a bind of the whole /dev imitated so: the hooks are never run, the node's /dev is never bound).
    for p in _device_paths(keys, raw, sim):
        name = os.path.relpath(p, "/dev")  # nvidia0, or nvidia-caps/nvidia-cap21 (a MIG device's: README "MIG")
        src = os.path.join(sim, "dev", name)
        if p.startswith("/dev/nvidia") and os.path.exists(src):
            # a directory too: the whole /dev/nvidia-caps (tests/field/pct/telmate-issue-1138-lines.conf)
            create = "dir" if os.path.isdir(src) else "file"
            out.append(f"lxc.mount.entry = {src} dev/{name} none bind,create={create} 0 0")
    for key, value in raw:
        if key == "lxc.mount.entry" and value.split() and value.split()[0].startswith("/dev/nvidia"):
            continue  # the real host's node: the simulated one is bound above
        if key.startswith("lxc.hook.") or _is_dev_bind(key, value):
            continue  # imitated above (the toolkit's hook, /dev), or not run (any other hook: assumed harmless here)
        out.append(f"{key} = {value}")
    return "\n".join(out) + "\n"


# --- state ----------------------------------------------------------------------------------------

def _info(simdir: str, vmid: int) -> Dict[str, str]:
    """lxc-info's fields ({} when LXC does not know the container)."""
    if not os.path.isfile(os.path.join(lxc_dir(simdir, vmid), "config")):
        return {}
    r = _run(lxc_argv(simdir, "lxc-info", vmid, "-s", "-p"), timeout=30)
    out = {}
    for line in r.stdout.splitlines():
        k, sep, val = line.partition(":")
        if sep:
            out[k.strip()] = val.strip()
    return out


def init_pid(simdir: str, vmid: Union[int, str]) -> Optional[Tuple[int, int]]:
    """(hostpid, starttime) of the running container's init (lxc-info -p), or None when it is stopped."""
    v = parse_vmid(vmid)
    info = _info(simdir, v)
    if info.get("State") != "RUNNING" or not info.get("PID", "").isdigit():
        return None
    pid = int(info["PID"])
    st = proctools.read_stat(pid)
    return (pid, st[1]) if st and st[0] not in ("Z", "X", "x") else None


def status(simdir: str, vmid: Union[int, str]) -> str:
    """'running' or 'stopped' (lxc-info -s): PVE counts a container as running while its LXC monitor's command
    socket exists (PVE::LXC::list_active_containers), so a FROZEN (or FREEZING, THAWED, STARTING, STOPPING) one
    is running too."""
    v = _require(simdir, vmid)
    return "stopped" if _info(simdir, v).get("State", "STOPPED") in ("STOPPED", "ABORTING") else "running"


def list(simdir: str) -> List[int]:  # noqa: A001 (the API name)
    """The vmids of this scenario's containers, sorted."""
    try:
        names = os.listdir(node_lxc_dir(simdir))
    except FileNotFoundError:
        return []
    out = [int(n[:-len(".conf")]) for n in names if re.fullmatch(r"[1-9][0-9]{2,8}\.conf", n)
           and os.path.isfile(os.path.join(node_lxc_dir(simdir), n))]
    return sorted(out)


def uptime(simdir: str, vmid: Union[int, str]) -> int:
    """Seconds since the init started (0 when stopped), as pve-container computes it."""
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

def _record_owned(simdir: str, pid: int, start: int) -> None:
    """Tell `gpusim down` about the init (DIR/run/owned)."""
    proctools.append_owned(simdir, pid, start)


def start(simdir: str, vmid: Union[int, str]) -> None:
    """Start the container (lxc-start); a systemd container is started once systemd says the system
    is running (or degraded)."""
    v = _require(simdir, vmid)
    vmids.reserve(simdir, v)  # ours already, or taken back after a crash
    with _locked(simdir, v):
        if init_pid(simdir, v):
            raise ContainerError(f"CT {v} already running")
        problems = _remove_cgroups(v, kill=False)
        if problems:
            raise ContainerError(f"cannot start CT {v}: " + "; ".join(problems))
        ld = lxc_dir(simdir, v)
        os.makedirs(ld, exist_ok=True)
        if kind(simdir, v) == "systemd":
            rootfs.ensure_systemd_rootfs()
            os.makedirs(os.path.join(ld, "upper"), exist_ok=True)
        elif not os.path.isdir(os.path.join(ld, "rootfs")):
            rootfs.make_busybox_rootfs(os.path.join(ld, "rootfs"))
        _atomic_write(os.path.join(ld, "config"), lxc_config(simdir, v))
        log = os.path.join(ld, "lxc.log")
        _unlink(log)
        r = _run(lxc_argv(simdir, "lxc-start", v, "-l", "INFO", "-o", log), timeout=START_TIMEOUT)
        ip = init_pid(simdir, v)
        if r.returncode != 0 or not ip:
            errors = [ln for ln in proctools.tail(log, 6000).splitlines() if " ERROR " in ln]
            with contextlib.suppress(Exception):
                _run(lxc_argv(simdir, "lxc-stop", v, "--kill"), timeout=30)
            raise ContainerError(f"cannot start CT {v}: lxc-start exited {r.returncode}: "
                                 f"{(r.stderr.strip() + ' ' + ' | '.join(errors[-3:])).strip()} (log: {log})")
        _record_owned(simdir, ip[0], ip[1])
    if kind(simdir, v) == "systemd":
        _wait_systemd(simdir, v)


def _wait_systemd(simdir: str, v: int, timeout: float = START_TIMEOUT) -> None:
    """Until `systemctl is-system-running` inside says running or degraded."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        r = _run(lxc_argv(simdir, "lxc-attach", v, "--clear-env", "--", "systemctl", "is-system-running"),
                 timeout=30)
        state = (r.stdout.strip() or r.stderr.strip()).splitlines()[-1] if (r.stdout.strip() or r.stderr.strip()) else ""
        if state in ("running", "degraded"):
            return
        time.sleep(0.05)
    raise ContainerError(f"CT {v}: systemd did not finish booting within {timeout:g} s (is-system-running: {state})")


# --- running commands inside ----------------------------------------------------------------------

def command_env(simdir: str, vmid: Union[int, str], env: Optional[Dict[str, str]]) -> Dict[str, str]:
    """`env` (the caller's, kept by lxc-attach --keep-env) as a command in the container sees the
    simulator: GPUSIM_VMID, and PATH with DIR/ctbin (nvidia-smi: the driver's tools installed in
    the container) in place of DIR/bin (the node's tools: pct, the host's systemctl)."""
    v = parse_vmid(vmid)
    out = dict(os.environ if env is None else env)
    sim = os.path.realpath(simdir)
    node_bins = {os.path.join(simdir, "bin"), os.path.join(sim, "bin")}
    ctbin = os.path.join(sim, "ctbin")
    rest = [p for p in out.get("PATH", DEFAULT_PATH).split(":") if p and p not in node_bins and p != ctbin]
    out["PATH"] = ":".join([ctbin] + rest)
    out["GPUSIM_VMID"] = str(v)
    return out


def _running(simdir: str, vmid: Union[int, str]) -> Tuple[int, Tuple[int, int]]:
    v = _require(simdir, vmid)
    ip = init_pid(simdir, v)
    if not ip:
        raise ContainerError(f"container '{v}' not running!")
    return v, ip


def attach_argv(simdir: str, vmid: Union[int, str], argv: Sequence[str], keep_env: bool = True,
                set_vars: Optional[Dict[str, str]] = None, uid: Optional[int] = None) -> List[str]:
    """``lxc-attach -n <vmid> -P DIR/lxc --keep-env|--clear-env [-u UID -g UID] [--set-var K=V...] -- argv``
    (pct exec's; ``uid``: run as that user of the container, its group the same number)."""
    out = lxc_argv(simdir, "lxc-attach", vmid, "--keep-env" if keep_env else "--clear-env")
    if uid is not None:
        out += ["-u", str(int(uid)), "-g", str(int(uid))]
    for k, val in (set_vars or {}).items():
        out += ["--set-var", f"{k}={val}"]
    return out + ["--"] + [str(a) for a in argv]


def exec_argv(simdir: str, vmid: Union[int, str], argv: Sequence[str], env: Optional[Dict[str, str]],
              *, forward_signals: bool = False, **popen) -> int:
    """Run argv inside the running container with lxc-attach and wait; returns its exit status.
    stdin/stdout/stderr are the caller's (or ``popen``'s)."""
    v, _ip = _running(simdir, vmid)
    if not argv:
        raise ContainerError("missing command")
    proc = subprocess.Popen(attach_argv(simdir, v, argv), env=command_env(simdir, v, env), **popen)
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


def run(simdir: str, vmid: Union[int, str], argv: Sequence[str], env: Optional[Dict[str, str]] = None,
        input: Optional[str] = None, timeout: float = 120.0) -> subprocess.CompletedProcess:  # noqa: A002
    """Run argv inside the running container and capture its output (text)."""
    v, _ip = _running(simdir, vmid)
    return subprocess.run(attach_argv(simdir, v, argv), env=command_env(simdir, v, env), input=input,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _nspid_chain(pid: int) -> List[int]:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def host_pid(init: int, nspid: int) -> Optional[int]:
    """The host pid of the process that is ``nspid`` in the PID namespace of the container whose init
    is ``init``."""
    try:
        pidns = os.readlink(f"/proc/{init}/ns/pid")
    except OSError:
        return None
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        chain = _nspid_chain(int(name))
        if len(chain) >= 2 and chain[-1] == nspid:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{name}/ns/pid") == pidns:
                    return int(name)
    return None


def spawn(simdir: str, vmid: Union[int, str], argv: Sequence[str], env: Optional[Dict[str, str]],
          log: Optional[str] = None, uid: Optional[int] = None) -> Optional[int]:
    """Start argv inside the running container, detached: lxc-attach runs a shell that starts it in
    its own session and exits, so that the container's init adopts it (and reaps it).  stdin is
    /dev/null, stdout/stderr go to ``log`` (default DIR/ct/<vmid>/console.log).  ``uid``: run it as that uid
    of the container (lxc-attach -u/-g; the log must be writable by it).  Returns its host pid (None if it
    already exited)."""
    v, ip = _running(simdir, vmid)
    if not argv:
        raise ContainerError("missing command")
    logpath = os.path.realpath(log or os.path.join(ct_dir(simdir, v), "console.log"))
    script = 'log=$1; shift; setsid "$@" </dev/null >>"$log" 2>&1 & echo $!'
    r = subprocess.run(attach_argv(simdir, v, ["/bin/sh", "-c", script, "sh", logpath, *argv], uid=uid),
                       env=command_env(simdir, v, env), capture_output=True, text=True, timeout=60, check=False)
    out = r.stdout.strip()
    if r.returncode != 0 or not out.isdigit():
        raise ContainerError(f"CT {v}: cannot run {argv[0]}: lxc-attach exited {r.returncode}: {r.stderr.strip()}")
    return host_pid(ip[0], int(out))


# --- stopping -------------------------------------------------------------------------------------

def _wait_stopped(simdir: str, v: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while init_pid(simdir, v):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _finish_stop(simdir: str, v: int) -> None:
    with _locked(simdir, v):
        if init_pid(simdir, v):
            return  # started again meanwhile
        problems = _remove_cgroups(v, kill=True)
        if problems:
            raise ContainerError(f"CT {v}: " + "; ".join(problems))


def shutdown(simdir: str, vmid: Union[int, str], timeout: float = 60, force_stop: bool = False) -> None:
    """pve-container's vm_stop for `pct shutdown`: ``lxc-stop -n <vmid> [--nokill] --timeout N`` (the
    container's init halts it: busybox init, or systemd stopping its units); after the timeout the
    container is killed with ``force_stop``, else ContainerError('container did not stop')."""
    v = _require(simdir, vmid)
    if not init_pid(simdir, v):
        raise ContainerError(f"CT {v} not running")
    args = ["--timeout", str(int(timeout))]
    if not force_stop:
        args.append("--nokill")
    with contextlib.suppress(subprocess.TimeoutExpired):
        _run(lxc_argv(simdir, "lxc-stop", v, *args), timeout=float(timeout) + 30)
    if not _wait_stopped(simdir, v, 5.0):
        raise ContainerError("container did not stop")
    _finish_stop(simdir, v)


def stop(simdir: str, vmid: Union[int, str]) -> None:
    """pve-container's vm_stop for `pct stop`: ``lxc-stop -n <vmid> --kill``."""
    v = _require(simdir, vmid)
    if not init_pid(simdir, v):
        raise ContainerError(f"CT {v} not running")
    _run(lxc_argv(simdir, "lxc-stop", v, "--kill"), timeout=60)
    if not _wait_stopped(simdir, v, 30.0):
        raise ContainerError(f"CT {v}: still running after lxc-stop --kill")
    _finish_stop(simdir, v)


def _scenario_vmids(simdir: str) -> List[int]:
    out = set(list(simdir))
    for sub in ("ct", "lxc"):
        with contextlib.suppress(OSError):
            out |= {int(n) for n in os.listdir(os.path.join(simdir, sub)) if re.fullmatch(r"[1-9][0-9]{2,8}", n)}
    out |= set(vmids.reserved_by(simdir))
    return sorted(out)


def stop_all(simdir: str) -> List[str]:
    """Stop every container of this scenario (lxc-stop --kill), remove every cgroup directory LXC left
    behind and release the vmids.  Never raises; returns the problems it met (for `gpusim down`)."""
    problems: List[str] = []
    try:
        vs = _scenario_vmids(simdir)
    except Exception as e:  # noqa: BLE001
        return [f"cannot list containers: {e}"]
    for v in vs:
        try:
            if vmids.owner(v) not in (None, os.path.realpath(simdir)):
                continue  # another simulator's now: not ours to touch
            if os.path.isfile(os.path.join(lxc_dir(simdir, v), "config")) and init_pid(simdir, v):
                _run(lxc_argv(simdir, "lxc-stop", v, "--kill"), timeout=60)
                if not _wait_stopped(simdir, v, 30.0):
                    problems.append(f"CT {v}: still running after lxc-stop --kill")
                    continue
            problems += [f"CT {v}: {p}" for p in _remove_cgroups(v, kill=True)]
            vmids.release(simdir, v)
        except Exception as e:  # noqa: BLE001 (must never raise)
            problems.append(f"CT {v}: {type(e).__name__}: {e}")
    return problems


def describe(simdir: str, vmid: Union[int, str]) -> str:
    """One line for people: the kind and the lxc-* command that reaches it."""
    v = parse_vmid(vmid)
    return f"CT {v} ({kind(simdir, v)}): lxc-attach -n {v} -P {shlex.quote(lxcpath(simdir))}"
