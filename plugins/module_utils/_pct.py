# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""What Proxmox VE's ``pct`` prints, parsed; the container ids and unit names it is given, validated.

Pure: no AnsibleModule, no subprocess (proxmox_gpu_containers runs the commands). The formats are
pve-container's (``src/PVE/CLI/pct.pm``; see the notes, section C): ``pct list`` is
``"%-10s %-10s %-12s %-20s"`` of VMID, Status, Lock, Name with a blank Lock when there is none,
and nothing at all (not even the header) when the node has no container; ``pct config`` prints
``key: value`` for the sorted keys, then the raw ``lxc.*`` entries in file order. For a running
container ``pct config <vmid>`` prints the config with its pending changes applied (a ``pct set`` that
could not be hot-plugged, such as ``delete: dev0`` or a changed ``dev0``), ``--current`` what the
container runs with (PVE::AbstractConfig::load_current_config); ``passthrough_changes`` compares the two.

What ``pct`` reads, read without it (so that the fence starts no Perl program to find the containers): the config
file ``/etc/pve/lxc/<vmid>.conf`` (``parse_conf_file``, as pve-container's ``PVE::LXC::Config::parse_pct_config``;
``config_view`` is what ``pct config`` prints of it), pmxcfs' ``/etc/pve/.vmlist`` (``node_containers``, as
``PVE::LXC::config_list``) and the LXC monitors' command sockets in ``/proc/net/unix`` (``active_vmids``, as
``PVE::LXC::list_active_containers``: a container runs while its monitor does, a frozen one too).
"""

from __future__ import annotations

import json
import re

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors, _holding, _mig, _selection, _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._errors import InvalidOption

# systemctl is-active states in which the unit runs, or is about to (it is then stopped).
ACTIVE_STATES = ("active", "activating", "deactivating", "reloading", "refreshing")
# The character major of /dev/nvidiaN, nvidiactl (minor 255) and nvidia-modeset (254) (Linux devices.txt).
NVIDIA_MAJOR = 195
CONTROL_MINORS = (254, 255)
# systemd.unit(5) allows up to 255 characters; the first one is never "-" (systemctl would take it
# for an option).
_UNIT = re.compile(r"[A-Za-z0-9:_.@\\][-A-Za-z0-9:_.@\\]*", re.ASCII)
MAX_UNIT_CHARS = 255
_DEV_KEY = re.compile(r"dev\d+")
_CGROUP_KEYS = ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow")
_ALLOW = re.compile(r"c\s+(\d+|\*):(\d+|\*)(?:\s+\S+)?", re.ASCII)
# A raw LXC key takes ":" or "=" (pct.conf(5); parse_pct_config's ``^(lxc\.[a-z0-9_\-\.]+)(:|\s*=)``).
_LXC_LINE = re.compile(r"^(lxc\.[a-z0-9_\-.]+)(?::|\s*=)\s*(.*?)\s*$")
# The NVIDIA container toolkit's LXC hook (lxc's hooks/nvidia, installed as /usr/share/lxc/hooks/nvidia): a mount hook
# that runs nvidia-container-cli for the GPUs of its environment's NVIDIA_VISIBLE_DEVICES (lxc.environment).
TOOLKIT_HOOK = "nvidia"
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
# The hooks that run before the container's init starts, where a script can bind or create device nodes
# (lxc.container.conf(5)); the stop, post-stop, clone and destroy hooks cannot give a running container a device.
_DEVICE_HOOKS = ("lxc.hook.pre-start", "lxc.hook.pre-mount", "lxc.hook.mount", "lxc.hook.autodev", "lxc.hook.start-host",
                 "lxc.hook.start")
# Keys whose content is somewhere else: an included config, an fstab file.
_ELSEWHERE_KEYS = ("lxc.include", "lxc.mount.fstab")
_LXC_CONFIGS = "/usr/share/lxc/config/"   # LXC's own common configs pass no NVIDIA device


def validate_units(values) -> list:
    """systemd unit names (``sglang``, ``sglang.service``, ``vllm@0.service``), also as a comma-separated
    string: unique, in the order given; InvalidOption naming ``services`` and the bad name."""
    out = []
    for value in _validate.items(values):
        text = value.strip() if isinstance(value, str) else value
        if not isinstance(text, str) or len(text) > MAX_UNIT_CHARS or not _UNIT.fullmatch(text):
            raise InvalidOption(
                f"services: {value!r} is not a systemd unit name (ASCII letters, digits and : _ . @ \\ -, not starting"
                f" with -, at most {MAX_UNIT_CHARS} characters)", option="services", unit=str(value))
        out.append(text)
    return _validate.unique(out)


def parse_list(stdout: str) -> dict:
    """``pct list`` -> {vmid: {"status": "running", "lock": "", "name": "gpu-ct"}}.

    Rows are split on blanks; a row of three words has either a lock or a name, told apart by the
    header's columns (a word that starts at or after the Name column is the name). Empty output is
    a node with no container. A row that is not ``<vmid> <status> ...`` raises ValueError.
    """
    out = {}
    name_col = None
    for line in (stdout or "").splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "VMID":
            name_col = line.find("Name")
            continue
        if not _validate.is_ascii_digits(words[0]) or len(words) < 2 or len(words) > 4:
            raise _errors.UnreadableOutput("pct list", "expected VMID Status [Lock] [Name]", line.strip())
        lock, name = "", ""
        if len(words) == 4:
            lock, name = words[2], words[3]
        elif len(words) == 3:
            starts_at = line.find(words[2], line.find(words[1]) + len(words[1]))
            if name_col is not None and 0 <= name_col and starts_at < name_col:
                lock = words[2]
            else:
                name = words[2]
        out[int(words[0])] = {"status": words[1], "lock": lock, "name": name}
    return out


def _device_path(value: str) -> str:
    """The path of a ``devN`` value: ``/dev/nvidia0`` or ``path=/dev/nvidia0,mode=0666`` (any order)."""
    for part in value.split(","):
        key, eq, val = part.strip().partition("=")
        if not eq:
            return key
        if key == "path":
            return val.strip()
    return ""


def _is_nvidia_path(path: str) -> bool:
    base = path.rstrip("/").rsplit("/", 1)[-1]
    return path.startswith("/dev/") and (base.startswith("nvidia") or "/nvidia-caps/" in path)


def parse_config(stdout: str) -> dict:
    """``pct config <vmid>`` (or the config file) -> which NVIDIA devices the container gets.

    Returns {"hostname", "passthrough", "minors", "devices", "lines", "visible", "unknown", "mig_all"}:

    - ``devN: /dev/nvidiaK`` and ``devN: path=/dev/nvidiaK,mode=...`` (PVE 8.1+ device
      passthrough: the node and its cgroup permission) give GPU minor K;
    - ``lxc.mount.entry: /dev/nvidiaK dev/nvidiaK none bind,optional,create=file`` (the source
      path counts) gives minor K; a mount onto ``dev/nvidia*`` from another host path
      (``/lxc/102010/devices/nvidia0``) is passthrough, but gives no minor;
    - ``lxc.cgroup2.devices.allow: c 195:K rwm`` (cgroup v1: ``lxc.cgroup.devices.allow``) gives
      minor K; ``c 195:* rwm`` allows every minor: the minors are then those of the ``devN`` and
      mount lines if there are any, else None - every GPU of the node, which cannot be narrowed;
    - the control nodes (``nvidiactl``, ``nvidia-uvm``, ``nvidia-uvm-tools``, ``nvidia-modeset``,
      ``nvidia-caps/*``, minors 254 and 255 of major 195) are passthrough, but no GPU;
    - a cgroup line of another major (nvidia-uvm's is dynamic, 509 or so) cannot be told from any
      other device's: it is neither passthrough nor listed in ``lines``;
    - ``lxc.mount.entry: /dev dev none bind,optional,create=dir`` (or ``rbind``; a bind of the node's
      whole ``/dev``) gives every GPU: minors None;
    - the NVIDIA container toolkit's hook, ``lxc.hook.mount: /usr/share/lxc/hooks/nvidia``, passes the GPUs
      of ``lxc.environment: NVIDIA_VISIBLE_DEVICES=...`` (parse_visible): ``visible`` is ``"all"`` (then
      minors None), a list of GPU ids (indexes, UUIDs: visible_gpus ties them to the node's GPUs), or [] for
      ``none`` (the driver's control nodes, no GPU); ``void`` or an empty value: the hook passes nothing;
    - a line that may pass NVIDIA devices but cannot be read here is listed in ``unknown`` (as printed): a
      hook that runs before the container's init (``lxc.hook.mount``, ``autodev``, ``pre-start``, ...) other
      than the toolkit's, the toolkit's hook with no readable ``NVIDIA_VISIBLE_DEVICES``, an ``lxc.include``
      (outside LXC's own ``/usr/share/lxc/config/``) or ``lxc.mount.fstab``; with no other passthrough line,
      passthrough is then None (unknown) - what the container's processes hold decides (the fence);
    - a bind (or ``devN``) of the whole ``/dev/nvidia-caps`` directory, like a bind of ``/dev``, passes every MIG
      device's capability nodes: ``mig_all`` (which of them the container uses, only its processes say: the fence);
    - no NVIDIA line at all: passthrough False, minors [];
    - lines after a ``[name]`` header belong to a snapshot and are ignored, and so are comments.

    ``minors`` is sorted and unique; ``devices`` the NVIDIA paths of the devN and mount lines, in
    order; ``lines`` the passthrough lines as printed (``key: value``), the hook's and its
    ``NVIDIA_VISIBLE_DEVICES`` line among them.
    """
    found = _Passthrough()
    for key, value in _settings(stdout):
        found.setting(key, value)
    return found.result()


def _settings(stdout: str):
    """(key, value) of each setting of the current config, in order: a ``[name]`` header starts a snapshot (the
    current config ends there); comments and lines without a key are skipped."""
    for raw in (stdout or "").splitlines():
        line = raw.strip()
        if line.startswith("["):
            return
        if not line or line.startswith("#"):
            continue
        m = _LXC_LINE.match(line)
        if m:
            yield m.group(1), m.group(2)
            continue
        key, sep, value = line.partition(":")
        if sep:
            yield key.strip(), value.strip()


class _Passthrough:
    """What parse_config gathers from a config's settings, one setting at a time (``setting``), and its result."""

    def __init__(self):
        self.hostname = None
        self.minors, self.devices, self.lines = set(), [], []
        self.every = self.nodes = self.whole_dev = self.caps_dir = False
        self.hooks, self.environment, self.unknown = [], {}, []

    def setting(self, key: str, value: str) -> None:
        if key == "hostname":
            self.hostname = value
        elif _DEV_KEY.fullmatch(key):
            self._device(key, value, _device_path(value))
        elif key == "lxc.mount.entry":
            self._mount(key, value)
        elif key in _DEVICE_HOOKS:
            self.hooks.append((key, value))
        elif key == "lxc.environment":
            name, eq, val = value.partition("=")
            self.environment[name.strip()] = (f"{key}: {value}", val.strip() if eq else None)
        elif key in _ELSEWHERE_KEYS:
            if not value.startswith(_LXC_CONFIGS):
                self.unknown.append(f"{key}: {value}")
        elif key in _CGROUP_KEYS:
            self._cgroup_rule(key, value)

    def _mount(self, key: str, value: str) -> None:
        words = value.split()
        path = words[0] if words else ""
        if path.rstrip("/") == "/dev":
            # the node's whole /dev: every /dev/nvidiaN there is, the control nodes too
            self.lines.append(f"{key}: {value}")
            self.whole_dev = True
        elif not _is_nvidia_path(path) and len(words) > 1 and _is_nvidia_path("/" + words[1].lstrip("/")):
            # bound from another host path onto the container's /dev/nvidia*: passthrough, but which GPU
            # cannot be told from the path (the cgroup lines say it)
            self.lines.append(f"{key}: {value}")
            self.devices.append(path)
        else:
            self._device(key, value, path)

    def _cgroup_rule(self, key: str, value: str) -> None:
        m = _ALLOW.fullmatch(value)
        if not m or m.group(1) != str(NVIDIA_MAJOR):
            return
        self.lines.append(f"{key}: {value}")
        if m.group(2) == "*":
            self.every = True
        elif int(m.group(2)) not in CONTROL_MINORS:
            self.minors.add(int(m.group(2)))

    def _device(self, key: str, value: str, path: str) -> None:
        """A devN or mount entry that passes ``path``: an NVIDIA node counts, a GPU's node gives its minor."""
        if not _is_nvidia_path(path):
            return
        self.lines.append(f"{key}: {value}")
        self.devices.append(path)
        self.caps_dir |= path.rstrip("/") == _mig.CAP_DEV_DIR
        kind, minor = _holding.node_of(path)
        if kind == "gpu":
            self.nodes = True
            self.minors.add(minor)

    def _toolkit_visible(self):
        """What the NVIDIA container toolkit's hook passes (parse_visible's forms, None when no hook passes GPUs);
        another hook, or the toolkit's with no readable NVIDIA_VISIBLE_DEVICES, is unknown."""
        visible = None
        for key, value in self.hooks:
            line = f"{key}: {value}"
            words = value.split()
            if key != "lxc.hook.mount" or not words or words[0].rsplit("/", 1)[-1] != TOOLKIT_HOOK:
                self.unknown.append(line)
                continue
            selection, env_line = toolkit_selection(self.environment)
            if selection is False:
                self.unknown.append(line)  # its NVIDIA_VISIBLE_DEVICES is not in the config
                continue
            if selection is None:
                continue  # void, empty: the hook passes nothing
            self.lines.append(line)
            if env_line:
                self.lines.append(env_line)
            visible = selection
        return visible

    def result(self) -> dict:
        visible = self._toolkit_visible()
        minors = sorted(self.minors)
        if (self.every and not self.nodes) or self.whole_dev or visible == "all":
            minors = None
        passthrough = True if self.lines else (None if self.unknown else False)
        return {"hostname": self.hostname, "passthrough": passthrough, "minors": minors, "devices": _validate.unique(self.devices),
                "lines": self.lines, "visible": visible, "unknown": self.unknown, "mig_all": self.caps_dir or self.whole_dev}


def toolkit_selection(environment: dict):
    """(what the toolkit's hook passes, the line that says it) from the config's ``lxc.environment`` entries
    ({name: (line, value or None)}, the last one of each name), as lxc's ``hooks/nvidia`` reads its environment:
    NVIDIA_VISIBLE_DEVICES ``void`` or empty: (None, line) - nothing; unset with ``CUDA_VERSION`` and no
    ``NVIDIA_REQUIRE_CUDA`` (a legacy CUDA image): ("all", line); else parse_visible. (False, None) when it cannot
    be told: NVIDIA_VISIBLE_DEVICES unset (the hook would then take it from its own environment), or passed by name
    only (``lxc.environment: NVIDIA_VISIBLE_DEVICES``, the value of lxc-start's environment)."""
    if VISIBLE not in environment:
        cuda = environment.get("CUDA_VERSION")
        if cuda and cuda[1] and not (environment.get("NVIDIA_REQUIRE_CUDA") or (None, None))[1]:
            return "all", cuda[0]
        return False, None
    line, value = environment[VISIBLE]
    if value is None:
        return False, None
    return parse_visible(value), line


def parse_visible(value: str):
    """NVIDIA_VISIBLE_DEVICES (the toolkit's docs, "GPU Enumeration"): ``all`` -> "all"; ``none`` -> [] (the driver's
    control nodes and libraries, no GPU); ``void`` or empty -> None (nothing); else the comma-separated GPU ids, in
    order: indexes as int, the others (UUIDs, ``MIG-`` ids, PCI bus ids) as str."""
    text = (value or "").strip().strip('"').strip("'").strip()
    if text in ("", "void"):
        return None
    if text == "all":
        return "all"
    if text == "none":
        return []
    out = []
    for part in text.split(","):
        part = part.strip()
        if part:
            out.append(int(part) if _validate.is_ascii_digits(part) else part)
    return _validate.unique(out)


def visible_gpus(ids, gpus: list):
    """(GPU indexes, ids no GPU of the node matches) of the toolkit's NVIDIA_VISIBLE_DEVICES ids, with the node's
    GPUs (index, uuid, pci_bus_id): an index is nvidia-container-cli's (the driver's order, as nvidia-smi's), a UUID
    may be a unique prefix (``GPU-fef8089b``), a PCI bus id any of its forms, a ``MIG-`` id gives the GPU of that MIG
    device (the GPUs' ``mig_devices``): the forms of _selection. ``ids`` "all": (every index, [])."""
    if ids == "all":
        return sorted(g["index"] for g in gpus), []
    found, unmatched = set(), []
    for gpu_id in ids or []:
        named = _selection.selector(gpu_id)
        match = _selection.match(named[0], named[1], gpus, prefix=True) if named else []
        if len(match) == 1:
            found.add(match[0][0]["index"])
        else:
            unmatched.append(gpu_id)
    return sorted(found), unmatched


def passthrough_changes(current: dict, pending: dict):
    """What a running container's pending changes do to its NVIDIA passthrough: None when nothing, else
    {"removed": lines, "added": lines, "minors": the minors with the pending changes applied}.

    ``current``: parse_config of ``pct config <vmid> --current``; ``pending``: of ``pct config <vmid>``
    (a pending ``delete: dev0`` leaves the line out there, a pending ``dev0: /dev/nvidia1`` replaces it).
    """
    removed = [line for line in current["lines"] if line not in pending["lines"]]
    added = [line for line in pending["lines"] if line not in current["lines"]]
    if not removed and not added and current["minors"] == pending["minors"]:
        return None
    return {"removed": removed, "added": added, "minors": pending["minors"]}


def gpus_of(minors, gpu_minors: dict):
    """(GPU indexes, unknown minors) of a container's minors, with {minor: index} from the driver.

    ``minors`` None (every GPU) gives (None, []); a minor that no GPU of the node has is left out of
    the indexes and listed in the unknown ones (a stale config, or a GPU that fell off the bus).
    """
    if minors is None:
        return None, []
    indexes = sorted({gpu_minors[m] for m in minors if m in gpu_minors})
    unknown = sorted(m for m in minors if m not in gpu_minors)
    return indexes, unknown


def parse_is_active(stdout: str):
    """``systemctl is-active <unit>`` -> (state, active): the first word it printed, and whether it is one of
    ACTIVE_STATES. (None, False) when it printed nothing (systemctl did not run)."""
    words = (stdout or "").split()
    if not words:
        return None, False
    return words[0], words[0] in ACTIVE_STATES


# --- the node's files, read as pve-container reads them ------------------------------------------------------

# parse_pct_config's section headers: [pve:pending] (case-insensitive), else a snapshot [name].
_SECTION = re.compile(r"^\[(pve:pending|[a-z][a-z0-9_\-]+)\]\s*$", re.I)
_KEY_LINE = re.compile(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$")
_DELETE_LINE = re.compile(r"^delete:\s*(.*\S)\s*$")
# pct config prints every key but these (pct.pm: digest, and the raw lxc list, printed after the keys).
_NOT_PRINTED = ("digest", "lxc", "description")
# LXC's abstract socket names (liblxc commands_utils.c, lxc_make_abstract_socket_name): "@<lxcpath>/<name>/command"
# when it fits in sun_path (108 bytes, less the leading NUL and a trailing one), else "@lxc/<fnv64a hex>/command" of
# "<lxcpath>/<name>".
_SUN_PATH = 108


def parse_conf_file(text: str) -> dict:
    """A container's config file (``/etc/pve/lxc/<vmid>.conf``, what write_pct_config writes) -> its parts:
    {"keys": {key: value}, "lxc": [(key, value)], "pending": {key: value}, "delete": [keys], "snapshots": {name: {key:
    value}}}.

    As pve-container's ``parse_pct_config``: blank lines skipped, ``#`` lines (the description) skipped, raw ``lxc.*``
    entries (``lxc.key: value`` or ``lxc.key = value``) kept in file order (of the current config only: ``pct config``
    never prints pending ones), ``[pve:pending]`` opens the pending values and their ``delete: a,b`` line (PVE's
    ``parse_pending_delete``: split on blanks, commas and semicolons, a leading ``!`` - a forced deletion - dropped;
    ``delete`` elsewhere is ignored, as PVE warns and ignores it), any other ``[name]`` a snapshot. A line that is none
    of these is ignored (PVE warns).
    """
    keys, lxc, pending, delete, snapshots = {}, [], {}, [], {}
    section, cur = None, keys
    for line in (text or "").split("\n"):
        if not line.strip() or line.startswith("#"):
            continue
        m = _SECTION.match(line)
        if m:
            section = m.group(1).lower()
            cur = pending if section == "pve:pending" else snapshots.setdefault(m.group(1), {})
            continue
        m = _LXC_LINE.match(line)
        if m:
            if section is None:
                lxc.append((m.group(1), m.group(2)))
            continue
        m = _DELETE_LINE.match(line)
        if m:
            if section == "pve:pending":
                delete = [k.lstrip("!") for k in re.split(r"[\s,;]+", m.group(1)) if k.lstrip("!")]
            continue
        m = _KEY_LINE.match(line)
        if m:
            cur[m.group(1)] = m.group(2)
    return {"keys": keys, "lxc": lxc, "pending": pending, "delete": delete, "snapshots": snapshots}


def config_keys(conf: dict, current: bool) -> dict:
    """The keys of a parsed file as the container runs with them (``current``), else with the pending changes applied
    (PVE::AbstractConfig::load_current_config: pending values replace, pending deletions remove)."""
    keys = dict(conf["keys"])
    if not current:
        keys.update(conf["pending"])
        for key in conf["delete"]:
            keys.pop(key, None)
    return keys


def config_view(conf: dict, current: bool) -> str:
    """What ``pct config <vmid>`` (``current`` False) or ``pct config <vmid> --current 1`` prints of a parsed file:
    the sorted keys as ``key: value`` (not digest nor the description), then the raw ``lxc.*`` entries in file order -
    the text parse_config reads."""
    keys = config_keys(conf, current)
    lines = [f"{k}: {keys[k]}" for k in sorted(keys) if k not in _NOT_PRINTED]
    lines += [f"{k}: {v}" for k, v in conf["lxc"]]
    return "".join(line + "\n" for line in lines)


def node_containers(vmlist_text: str, node: str) -> list:
    """The vmids of node ``node``'s containers in pmxcfs' ``.vmlist`` (``{"version": N, "ids": {"129": {"node": "pve1",
    "type": "lxc", "version": M}, ...}}``, no ``ids`` when the cluster has no guest), sorted: PVE::LXC::config_list's
    rule (type lxc, on this node, not 0). ValueError when it is not that JSON."""
    try:
        data = json.loads(vmlist_text)
    except ValueError as exc:
        raise _errors.UnreadableOutput("/etc/pve/.vmlist", f"not JSON ({exc})", vmlist_text) from None
    ids = data.get("ids", {}) if isinstance(data, dict) else None
    if not isinstance(ids, dict):
        raise _errors.UnreadableOutput("/etc/pve/.vmlist", "no JSON object with ids", vmlist_text)
    out = []
    for vmid, entry in ids.items():
        if _validate.is_ascii_digits(vmid) and int(vmid) and isinstance(entry, dict) \
                and entry.get("type") == "lxc" and entry.get("node") == node:
            out.append(int(vmid))
    return sorted(out)


def _fnv64a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def command_socket(lxcpath: str, vmid: int) -> str:
    """The LXC monitor's command socket of container ``vmid``, as /proc/net/unix shows it (``@`` for the NUL)."""
    name = f"{lxcpath}/{vmid}/command"
    if len(name.encode()) < _SUN_PATH - 2:
        return "@" + name
    return "@lxc/%016x/command" % _fnv64a(f"{lxcpath}/{vmid}".encode())


def active_vmids(proc_net_unix: str, lxcpath: str, vmids) -> set:
    """Which of ``vmids`` run: those whose LXC monitor's command socket is in ``/proc/net/unix`` (its text), as
    PVE::LXC::list_active_containers decides it for ``pct list`` and ``pct status``."""
    paths = set()
    for line in (proc_net_unix or "").splitlines()[1:]:
        words = line.split()
        if len(words) >= 8:
            paths.add(words[-1])
    return {v for v in vmids if command_socket(lxcpath, v) in paths}


def list_row(vmid: int, keys: dict, running: bool) -> dict:
    """The row ``pct list`` prints of a container (parse_list's): its status, its lock (the config's, else ``""``) and
    its name (PVE::LXC::vmstatus: the hostname, else ``CT<vmid>``, without whitespace)."""
    return {"status": "running" if running else "stopped", "lock": keys.get("lock", ""),
            "name": re.sub(r"\s", "", keys.get("hostname") or f"CT{vmid}")}
