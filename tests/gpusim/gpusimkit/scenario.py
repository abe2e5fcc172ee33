"""The scenario model: what the simulated host looks like.

This module is the only writer of ``DIR/scenario`` (read by the C library) and of
``DIR/scenario.json`` (read by Python).  See ../README.md for the format.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
from typing import Dict, Iterator, List, Optional

from . import profiles

FORMAT_VERSION = 1

# Defaults taken from a real 8 x H200 host.
DEFAULT_MODEL = "NVIDIA H200"
DEFAULT_MEMORY_MIB = 143771
DEFAULT_DRIVER = "580.159.03"
DEFAULT_CUDA = 13000  # CUDA 13.0 as nvmlSystemGetCudaDriverVersion reports it
# PCI bus numbers of the eight GPUs on a typical HGX H200 board.
HGX_BUSES = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
H200_PCI_DEVICE_ID = 0x233510DE
H200_PCI_SUBSYSTEM_ID = 0x18BE10DE

NOT_SUPPORTED_FIELDS = frozenset(
    [
        "serial",
        "memory",
        "utilization",
        "temperature",
        "power",
        "power_limit",
        "fan",
        "persistence",
        "compute_mode",
        "mig_mode",
        "processes",
        "minor_number",
        "encoder",
        "decoder",
        "memory_v1",  # nvmlDeviceGetMemoryInfo only ("memory": both calls)
        "memory_v2",  # nvmlDeviceGetMemoryInfo_v2 only
        "conf_compute",  # nvmlDeviceGetConfComputeMemSizeInfo
        "remapped_rows",  # nvmlDeviceGetRemappedRows
        "retired_pages",  # nvmlDeviceGetRetiredPagesPendingStatus
        "ecc",  # nvmlDeviceGetEccMode, nvmlDeviceGetTotalEccErrors
        "fabric",  # nvmlDeviceGetGpuFabricInfo, nvmlDeviceGetGpuFabricInfoV
        "clock_reasons",  # nvmlDeviceGetCurrentClocksEventReasons, ...ThrottleReasons
    ]
)
# nvmlGpuFabricState_t (nvml.h NVML_GPU_FABRIC_STATE_*)
FABRIC_STATES = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}
IDLE_CLOCK_REASONS = 0x1  # nvmlClocksEventReasonGpuIdle
INIT_ERRORS = {0: "ok", 4: "no_permission", 9: "driver_not_loaded", 18: "version_mismatch"}
PID_MODES = ("host", "translate")
HIDEABLE_PREFIX = "nvml"


# MIG (tests/gpusim/README.md "MIG"): at most 7 MIG devices per GPU (nvmlDeviceGetMaxMigDeviceCount on an A100/H100/H200);
# GPU instance ids 0..14 and compute instance ids 0..7 (the /proc/driver/nvidia-caps/mig-minors layout of the MIG user
# guide: per GPU 15 GPU instances of 1 + 8 capability minors each, after config (1) and monitor (2)).
MAX_MIG_DEVICES = 7
MIG_GI_IDS = 15
MIG_CI_IDS = 8
MIG_UUID_RE = re.compile(r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
MIG_PROFILE_RE = re.compile(r"(\d\+)?\d+g\.\d+gb(\+me)?")


def mig_cap_minor(gpu_minor: int, gi: int, ci: Optional[int] = None) -> int:
    """The minor of /dev/nvidia-caps/nvidia-cap<N> for gpu<minor>/gi<gi>/access (ci None) or .../ci<ci>/access."""
    base = 3 + gpu_minor * MIG_GI_IDS * (1 + MIG_CI_IDS) + gi * (1 + MIG_CI_IDS)
    return base if ci is None else base + 1 + ci


class ScenarioError(ValueError):
    """Invalid scenario value; the message names the field."""


def _check(cond: bool, field: str, value, why: str) -> None:
    if not cond:
        raise ScenarioError(f"invalid {field}={value!r}: {why}")


@dataclasses.dataclass
class MigDevice:
    """One MIG device: a compute instance ``ci`` of GPU instance ``gi`` (README "MIG")."""
    gi: int
    ci: int
    profile: str
    memory_mib: int
    uuid: str

    def render(self) -> str:
        return f"{self.gi}:{self.ci}:{self.profile}:{self.memory_mib}:{self.uuid}"


@dataclasses.dataclass
class Gpu:
    index: int
    name: str = DEFAULT_MODEL
    uuid: str = ""
    serial: str = ""
    pci_bus_id: str = ""
    pci_device_id: int = H200_PCI_DEVICE_ID
    pci_subsystem_id: int = H200_PCI_SUBSYSTEM_ID
    minor: int = -1
    memory_total_mib: int = DEFAULT_MEMORY_MIB
    memory_reserved_mib: int = 0
    base_used_mib: int = 0
    leaked_mib: int = 0
    util_gpu: int = 0
    util_mem: int = 0
    temperature: int = 31
    power_mw: int = 76000
    power_limit_mw: int = 700000
    fan: int = -1
    persistence: int = 1
    # A display on the GPU (nvidia-smi display_active / display_mode; README "nvidia-smi -r"): nvidia-smi -r refuses it.
    display_active: int = 0
    display_mode: int = 0
    compute_mode: int = 0
    mig_current: int = 0
    mig_pending: int = 0
    lost_at_ns: int = -1
    # Health (README "Health"): what the row remapper, page retirement, ECC counters, the NVSwitch
    # fabric and the clock event reasons report. Which of them a GPU has follows its model (the C library).
    remap_corrected: int = 0
    remap_uncorrected: int = 0
    remap_pending: int = 0
    remap_failure: int = 0
    retired_pending: int = 0
    ecc_mode: int = 1
    ecc_volatile_corrected: int = 0
    ecc_volatile_uncorrected: int = 0
    fabric_state: int = 3
    fabric_status: int = 0
    clock_reasons: int = IDLE_CLOCK_REASONS
    # nvmlDeviceValidateInforom answers NVML_ERROR_CORRUPTED_INFOROM, and nvidia-smi warns and exits 14 (README "Health").
    inforom_corrupt: int = 0
    not_supported: List[str] = dataclasses.field(default_factory=list)
    unknown: List[str] = dataclasses.field(default_factory=list)
    # MIG devices (only while mig_current is 1), in NVML's index order (nvmlDeviceGetMigDeviceHandleByIndex).
    mig_devices: List[MigDevice] = dataclasses.field(default_factory=list)

    def validate(self) -> None:
        f = f"gpu.{self.index}"
        _check(bool(self.name) and "\n" not in self.name, f + ".name", self.name, "must be a non-empty single line")
        _check(re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", self.uuid) is not None,
               f + ".uuid", self.uuid, "must look like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
        _check(re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.0", self.pci_bus_id) is not None,
               f + ".pci_bus_id", self.pci_bus_id, "must look like 00000000:18:00.0")
        _check(self.serial.isdigit(), f + ".serial", self.serial, "must be digits")
        _check(0 <= self.minor <= 255, f + ".minor", self.minor, "must be 0..255")
        _check(self.memory_total_mib > 0, f + ".memory_total_mib", self.memory_total_mib, "must be > 0")
        for name in ("memory_reserved_mib", "base_used_mib", "leaked_mib"):
            v = getattr(self, name)
            _check(0 <= v <= self.memory_total_mib, f"{f}.{name}", v, "must be between 0 and memory_total_mib")
        for name in ("util_gpu", "util_mem"):
            v = getattr(self, name)
            _check(0 <= v <= 100, f"{f}.{name}", v, "must be 0..100")
        _check(self.power_mw >= 0, f + ".power_mw", self.power_mw, "must be >= 0")
        _check(self.persistence in (0, 1), f + ".persistence", self.persistence, "must be 0 or 1")
        for name in ("display_active", "display_mode"):
            _check(getattr(self, name) in (0, 1), f"{f}.{name}", getattr(self, name), "must be 0 or 1")
        _check(self.compute_mode in (0, 2, 3), f + ".compute_mode", self.compute_mode, "must be 0, 2 or 3")
        _check(self.mig_current in (0, 1), f + ".mig_current", self.mig_current, "must be 0 or 1")
        _check(self.mig_pending in (0, 1), f + ".mig_pending", self.mig_pending, "must be 0 or 1")
        for name in ("remap_pending", "remap_failure", "retired_pending", "ecc_mode", "inforom_corrupt"):
            v = getattr(self, name)
            _check(v in (0, 1), f"{f}.{name}", v, "must be 0 or 1")
        for name in ("remap_corrected", "remap_uncorrected", "ecc_volatile_corrected", "ecc_volatile_uncorrected"):
            v = getattr(self, name)
            _check(isinstance(v, int) and 0 <= v < 2**32, f"{f}.{name}", v, "must be a count 0..2**32-1")
        _check(self.fabric_state in FABRIC_STATES.values(), f + ".fabric_state", self.fabric_state,
               "must be 0 (not supported), 1 (not started), 2 (in progress) or 3 (completed)")
        _check(0 <= self.fabric_status <= 999, f + ".fabric_status", self.fabric_status, "must be an NVML return code")
        _check(0 <= self.clock_reasons < 2**64, f + ".clock_reasons", self.clock_reasons, "must be a 64-bit mask")
        self.validate_mig()
        bad = sorted(set(self.not_supported) - NOT_SUPPORTED_FIELDS)
        _check(not bad, f + ".not_supported", ",".join(bad), f"unknown field; known: {', '.join(sorted(NOT_SUPPORTED_FIELDS))}")
        bad = sorted(set(self.unknown) - NOT_SUPPORTED_FIELDS)
        _check(not bad, f + ".unknown", ",".join(bad), f"unknown field; known: {', '.join(sorted(NOT_SUPPORTED_FIELDS))}")

    def validate_mig(self) -> None:
        f = f"gpu.{self.index}.mig_devices"
        devs = self.mig_devices
        _check(not devs or self.mig_current == 1, f, len(devs), "MIG devices need mig_current 1")
        _check(len(devs) <= MAX_MIG_DEVICES, f, len(devs), f"at most {MAX_MIG_DEVICES} MIG devices per GPU")
        for d in devs:
            _check(isinstance(d, MigDevice), f, d, "must be MigDevice entries")
            _check(0 <= d.gi < MIG_GI_IDS and 0 <= d.ci < MIG_CI_IDS, f, (d.gi, d.ci),
                   f"gi must be 0..{MIG_GI_IDS - 1}, ci 0..{MIG_CI_IDS - 1}")
            _check(MIG_PROFILE_RE.fullmatch(d.profile) is not None, f, d.profile, "a profile looks like 3g.71gb")
            _check(0 < d.memory_mib <= self.memory_total_mib, f, d.memory_mib, "memory must be 1..memory_total_mib")
            _check(MIG_UUID_RE.fullmatch(d.uuid) is not None, f, d.uuid,
                   "must look like MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
        ids = [(d.gi, d.ci) for d in devs]
        _check(len(set(ids)) == len(ids), f, ids, "(gi, ci) pairs must be unique")
        # compute instances of one GPU instance share its memory: count each GPU instance once
        per_gi = {d.gi: d.memory_mib for d in devs}
        _check(sum(per_gi.values()) <= self.memory_total_mib, f, sum(per_gi.values()),
               "the GPU instances' memory exceeds the GPU's")

    def mig_device(self, ref) -> Optional[MigDevice]:
        """A MIG device of this GPU by MIG UUID or (gi, ci)."""
        for d in self.mig_devices:
            if (isinstance(ref, str) and d.uuid.lower() == ref.lower()) or (isinstance(ref, tuple) and (d.gi, d.ci) == ref):
                return d
        return None


def mig_uuid(seed: str, gpu: int, gi: int, ci: int) -> str:
    digest = hashlib.sha256(f"{seed}/mig/{gpu}/{gi}/{ci}".encode()).hexdigest()
    return f"MIG-{digest[0:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def mig_layout(gpu: Gpu, profiles_: List[str], seed: str = "") -> List[MigDevice]:
    """MIG devices for ``profiles_`` (``"3g.71gb"``, ...; one GPU instance with one compute instance each, gi ids
    from 1 as nvidia-smi mig -cgi hands them out in the field corpus' outputs), memory from the profile's name
    (GiB less 1/16 for the instance's own use: assumed) capped by what is left."""
    devs: List[MigDevice] = []
    left = gpu.memory_total_mib
    for n, prof in enumerate(profiles_):
        m = re.fullmatch(r"(?:\d\+)?\d+g\.(\d+)gb(?:\+me)?", str(prof))
        _check(m is not None, f"gpu.{gpu.index}.mig", prof, "a profile looks like 3g.71gb")
        mib = min(left, int(m.group(1)) * 1024 - int(m.group(1)) * 64)
        _check(mib > 0, f"gpu.{gpu.index}.mig", list(profiles_), "the profiles need more memory than the GPU has")
        left -= mib
        gi = n + 1
        devs.append(MigDevice(gi=gi, ci=0, profile=str(prof), memory_mib=mib, uuid=mig_uuid(seed or gpu.uuid, gpu.index, gi, 0)))
    return devs


@dataclasses.dataclass
class Scenario:
    gpus: List[Gpu]
    driver_version: str = DEFAULT_DRIVER
    nvml_version: str = ""
    cuda_version: int = DEFAULT_CUDA
    init_error: int = 0
    pid_mode: str = "translate"
    host_pidns: int = 0
    release_lag_ms: int = 0
    # After the lag, the memory of an exited process is released linearly over drain_ms (0: at once).
    drain_ms: int = 0
    unknown_every: int = 0
    call_delay_ms: int = 0
    hidden_symbols: List[str] = dataclasses.field(default_factory=list)
    # The driver branch this host stands for (gpusimkit/profiles.py); the C library ignores the
    # name and reads what the profile implies from the other keys.
    driver_profile: str = profiles.DEFAULT_PROFILE
    # What the _v3 process symbols write: 24 (nvmlProcessInfo_t) or 32 (nvmlProcessInfo_v3_t).
    process_v3_entry_bytes: int = profiles.ENTRY_V2

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def validate(self) -> None:
        _check(re.fullmatch(r"\d+\.\d+(\.\d+)?", self.driver_version) is not None, "driver_version",
               self.driver_version, "must look like 580.159.03")
        _check(self.cuda_version > 0, "cuda_version", self.cuda_version, "must be > 0, e.g. 13000")
        _check(self.init_error in INIT_ERRORS, "init_error", self.init_error,
               "must be one of " + ", ".join(f"{k} ({v})" for k, v in INIT_ERRORS.items()))
        _check(self.pid_mode in PID_MODES, "pid_mode", self.pid_mode, "must be host or translate")
        _check(self.release_lag_ms >= 0, "release_lag_ms", self.release_lag_ms, "must be >= 0")
        _check(isinstance(self.drain_ms, int) and self.drain_ms >= 0, "drain_ms", self.drain_ms, "must be >= 0")
        _check(self.unknown_every >= 0, "unknown_every", self.unknown_every, "must be >= 0")
        _check(self.call_delay_ms >= 0, "call_delay_ms", self.call_delay_ms, "must be >= 0")
        _check(self.driver_profile in profiles.PROFILES, "driver", self.driver_profile,
               "must be one of " + ", ".join(profiles.NAMES))
        _check(self.process_v3_entry_bytes in profiles.ENTRY_SIZES, "process_v3_entry_bytes",
               self.process_v3_entry_bytes, "must be 24 or 32")
        _check(0 <= len(self.gpus) <= 64, "gpus", len(self.gpus), "must be 0..64")
        for s in self.hidden_symbols:
            _check(re.fullmatch(r"nvml\w+", s) is not None, "hidden_symbols", s, "must be NVML symbol names")
        for i, g in enumerate(self.gpus):
            _check(g.index == i, f"gpu.{i}.index", g.index, "indexes must be 0..N-1 in order")
            g.validate()
        minors = [g.minor for g in self.gpus]
        _check(len(set(minors)) == len(minors), "gpu.minor", minors, "minor numbers must be unique")

    # --- rendering -----------------------------------------------------
    def render(self) -> str:
        """The C library's line format."""
        nvml_version = self.nvml_version or f"13.{self.driver_version}"
        out = [
            f"version {FORMAT_VERSION}",
            f"driver_version {self.driver_version}",
            f"nvml_version {nvml_version}",
            f"cuda_version {self.cuda_version}",
            f"init_error {self.init_error}",
            f"pid_mode {self.pid_mode}",
            f"host_pidns {self.host_pidns}",
            f"release_lag_ms {self.release_lag_ms}",
            f"drain_ms {self.drain_ms}",
            f"unknown_every {self.unknown_every}",
            f"call_delay_ms {self.call_delay_ms}",
            f"hidden_symbols {','.join(self.hidden_symbols)}",
            f"driver_profile {self.driver_profile}",
            f"process_v3_entry_bytes {self.process_v3_entry_bytes}",
            f"gpu_count {len(self.gpus)}",
        ]
        for g in self.gpus:
            for field in dataclasses.fields(Gpu):
                if field.name == "index":
                    continue
                v = getattr(g, field.name)
                if field.name == "mig_devices":
                    v = ",".join(d.render() for d in v)
                elif isinstance(v, list):
                    v = ",".join(v)
                out.append(f"gpu.{g.index}.{field.name} {v}")
        return "\n".join(out) + "\n"

    def to_json(self) -> Dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Dict) -> "Scenario":
        data = dict(data)
        gpus = []
        for g in data.pop("gpus"):
            g = dict(g)
            g["mig_devices"] = [MigDevice(**d) for d in g.get("mig_devices", [])]
            gpus.append(Gpu(**g))
        return cls(gpus=gpus, **data)


def pidns_inode(pid: str = "self") -> int:
    """Inode of a process's PID namespace (readlink works where stat of pid 1's is denied)."""
    link = os.readlink(f"/proc/{pid}/ns/pid")  # 'pid:[4026531836]'
    return int(link[link.index("[") + 1:-1])


def host_pidns_inode() -> int:
    """The host PID namespace: the one `gpusim up` runs in."""
    return pidns_inode("self")


def make_gpus(count: int, model: str = DEFAULT_MODEL, memory_mib: int = DEFAULT_MEMORY_MIB, seed: str = "") -> List[Gpu]:
    """Deterministic identities for `count` GPUs (seed: e.g. the scenario directory)."""
    gpus = []
    for i in range(count):
        digest = hashlib.sha256(f"{seed}/{i}".encode()).hexdigest()
        uuid = f"GPU-{digest[0:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        bus = HGX_BUSES[i] if count <= len(HGX_BUSES) else 0x10 + 3 * i
        serial = "16540" + str(int(digest[32:40], 16) % 10**8).zfill(8)
        gpus.append(Gpu(index=i, name=model, uuid=uuid, serial=serial, pci_bus_id=f"00000000:{bus & 0xFF:02X}:00.0",
                        minor=i, memory_total_mib=memory_mib))
    return gpus


def new_scenario(count: int, model: str = DEFAULT_MODEL, memory_mib: int = DEFAULT_MEMORY_MIB, seed: str = "") -> Scenario:
    _check(isinstance(count, int) and 0 <= count <= 64, "gpus", count, "must be an integer 0..64")
    _check(isinstance(memory_mib, int) and memory_mib > 0, "memory_mib", memory_mib, "must be a positive integer")
    _check(bool(model) and "\n" not in model, "model", model, "must be a non-empty single line")
    sc = Scenario(gpus=make_gpus(count, model, memory_mib, seed), host_pidns=host_pidns_inode())
    sc.validate()
    return sc


def profile_of(sc: Scenario) -> "profiles.Profile":
    return profiles.get(sc.driver_profile)


def profile_hidden(sc: Scenario, extra=()) -> List[str]:
    """The hidden symbols of the scenario's profile plus ``extra`` (sorted, unique)."""
    return sorted(set(profile_of(sc).hidden_symbols) | {s.strip() for s in extra if s.strip()})


def profile_not_supported(sc: Scenario) -> List[str]:
    """The NOT_SUPPORTED fields every GPU of the scenario's profile has."""
    return sorted(set(profile_of(sc).not_supported))


def profile_scenario(driver: str = profiles.DEFAULT_PROFILE, count: Optional[int] = None, model: Optional[str] = None,
                     memory_mib: Optional[int] = None, seed: str = "", hidden_symbols=()) -> Scenario:
    """A new scenario for a driver profile (gpusimkit/profiles.py); explicit ``count``, ``model``
    and ``memory_mib`` override the profile's, ``hidden_symbols`` are hidden as well as the
    profile's."""
    _check(isinstance(driver, str) and driver in profiles.PROFILES, "driver", driver,
           "must be one of " + ", ".join(profiles.NAMES))
    prof = profiles.get(driver)
    sc = new_scenario(prof.gpus if count is None else count, prof.model if model is None else model,
                      prof.memory_mib if memory_mib is None else memory_mib, seed)
    sc.driver_profile = prof.name
    sc.driver_version = prof.driver_version
    sc.nvml_version = prof.nvml_version
    sc.cuda_version = prof.cuda_version
    sc.process_v3_entry_bytes = prof.process_v3_entry_bytes
    for g, bus_id in zip(sc.gpus, prof.pci_bus_ids):
        g.pci_bus_id = bus_id
    for g in sc.gpus:
        g.not_supported = profile_not_supported(sc)
        g.fabric_state = prof.fabric_state
    sc.hidden_symbols = profile_hidden(sc, hidden_symbols)
    sc.validate()
    return sc


# --- persistence ----------------------------------------------------------

def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        # The library re-reads a file when (st_mtim, st_ino, st_size) changed.  Timestamps are
        # coarse (a tick) on older kernels and a freed inode number comes back soon, so two
        # versions of equal size written within one tick could look the same: keep the mtime
        # strictly increasing from one version to the next.
        try:
            old_ns = os.stat(path).st_mtime_ns
        except FileNotFoundError:
            old_ns = None
        st = os.fstat(f.fileno())
        if old_ns is not None and st.st_mtime_ns <= old_ns:
            os.utime(f.fileno(), ns=(st.st_atime_ns, old_ns + 1))
    os.replace(tmp, path)


def save(dirpath: str, sc: Scenario) -> None:
    sc.validate()
    _atomic_write(os.path.join(dirpath, "scenario.json"), json.dumps(sc.to_json(), indent=1, sort_keys=True))
    _atomic_write(os.path.join(dirpath, "scenario"), sc.render())


def load(dirpath: str) -> Scenario:
    with open(os.path.join(dirpath, "scenario.json"), encoding="utf-8") as f:
        return Scenario.from_json(json.load(f))


@contextlib.contextmanager
def edit(dirpath: str) -> Iterator[Scenario]:
    """Read-modify-write the scenario under an exclusive lock; validated before it is written."""
    with open(os.path.join(dirpath, "scenario.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sc = load(dirpath)
        yield sc
        save(dirpath, sc)


def parse_gpu_list(text: str, count: Optional[int] = None) -> List[int]:
    """'0,1,3' or '0-3' or 'all' -> indexes; raises ScenarioError naming the field."""
    text = str(text).strip()
    if text == "all":
        _check(count is not None, "gpus", text, "'all' needs a known GPU count")
        return list(range(count or 0))
    out: List[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        _check(m is not None, "gpus", text, "must be indexes like 0,1,3 or 0-3")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        _check(lo <= hi, "gpus", text, "range must be ascending")
        out.extend(range(lo, hi + 1))
    if count is not None:
        bad = [i for i in out if i >= count]
        _check(not bad, "gpus", text, f"index {bad[0] if bad else ''} out of range: the host has {count} GPUs")
    _check(len(set(out)) == len(out), "gpus", text, "duplicate index")
    return out
