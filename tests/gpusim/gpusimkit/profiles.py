"""Driver-branch profiles: how the NVIDIA driver branches users run behave, as one table.

``SimHost.up(dir, driver="r535")`` / ``gpusim up --driver r535`` start a host whose library,
versions and GPUs are those of a branch:

- the versions ``nvmlSystemGetDriverVersion``/``GetNVMLVersion``/``GetCudaDriverVersion`` give;
- the symbols that branch's ``libnvidia-ml.so.1`` does not export (hidden with the
  ``hidden_symbols`` mechanism, ``build.install_library``);
- what the ``..._v3`` process queries write: 24-byte ``nvmlProcessInfo_t`` entries, or the 32-byte
  ``nvmlProcessInfo_v3_t`` of early R535 libraries (scenario key ``process_v3_entry_bytes``);
- the default GPU model, memory and count, and the fields a GPU of that kind answers
  ``NOT_SUPPORTED`` for (e.g. memory on a GB10).

Each entry's ``source`` says where its facts come from; anything without a public source is
marked "assumed, to be recorded by make gpu-smoke".  ``DEFAULT_PROFILE`` (``r580``) is the
simulator's behaviour from before profiles existed, unchanged.  Stdlib only.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

KINDS = ("Compute", "Graphics", "MPSCompute")
V2_PROCESS_SYMBOLS = tuple(f"nvmlDeviceGet{k}RunningProcesses_v2" for k in KINDS)
V3_PROCESS_SYMBOLS = tuple(f"nvmlDeviceGet{k}RunningProcesses_v3" for k in KINDS)
MEMORY_V2 = "nvmlDeviceGetMemoryInfo_v2"
# The MIG API: nvml.h of R450 (nvidia-ml-py 11.450.51 wraps every one of them; tests/gpusim/README.md "MIG").
MIG_SYMBOLS = ("nvmlDeviceGetMigMode", "nvmlDeviceIsMigDeviceHandle", "nvmlDeviceGetMaxMigDeviceCount",
               "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
               "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId")
CONF_COMPUTE_MEM = "nvmlDeviceGetConfComputeMemSizeInfo"
DETAIL_LIST = "nvmlDeviceGetRunningProcessDetailList"
TEMPERATURE_V = "nvmlDeviceGetTemperatureV"
# Health (README "Health"): the row remapper came with Ampere (R450), the fabric query with R525, its
# versioned form with R550, the clock "event" reasons (the renamed throttle reasons) with R535.
REMAPPED_ROWS = "nvmlDeviceGetRemappedRows"
FABRIC = "nvmlDeviceGetGpuFabricInfo"
FABRIC_V = "nvmlDeviceGetGpuFabricInfoV"
CLOCK_EVENTS = "nvmlDeviceGetCurrentClocksEventReasons"

ENTRY_V2 = 24  # sizeof(nvmlProcessInfo_t) == sizeof(nvmlProcessInfo_v2_t)
ENTRY_V3 = 32  # sizeof(nvmlProcessInfo_v3_t): + usedGpuCcProtectedMemory (natural alignment)
ENTRY_SIZES = (ENTRY_V2, ENTRY_V3)


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    driver_version: str
    nvml_version: str
    cuda_version: int  # nvmlSystemGetCudaDriverVersion: 12020 is CUDA 12.2
    hidden_symbols: Tuple[str, ...]  # what this branch's library does not export
    process_v3_entry_bytes: int  # what the _v3 process symbols write (24 or 32)
    model: str
    memory_mib: int
    gpus: int
    not_supported: Tuple[str, ...] = ()  # per GPU, scenario.NOT_SUPPORTED_FIELDS names
    pci_bus_ids: Tuple[str, ...] = ()  # for the first GPUs; the others get the usual defaults
    smi_absent_fields: Tuple[str, ...] = ()  # --query-gpu fields this branch's nvidia-smi does not list (below)
    # nvmlGpuFabricState_t of every GPU: 3 (Completed) on an HGX board with NVSwitch, 0 (Not Supported) elsewhere
    fabric_state: int = 3
    source: str = ""

    def process_layout(self) -> str:
        """Which process query a client built for this branch uses and what it reads."""
        if V3_PROCESS_SYMBOLS[0] not in self.hidden_symbols:
            return f"_v3 ({self.process_v3_entry_bytes}-byte entries)"
        if V2_PROCESS_SYMBOLS[0] not in self.hidden_symbols:
            return "_v2 (24-byte entries)"
        return "unversioned (16-byte entries)"


# Symbols added after a branch, in the order they appeared (from nvidia-ml-py, NVIDIA's own bindings,
# which follow each driver's nvml.h: 11.450.51 is the first with MIG, 11.510.69 with _v3 and
# MemoryInfo_v2, 12.535.77 with ConfComputeMemSizeInfo, 12.535.108 with RunningProcessDetailList,
# 12.570.86 with TemperatureV). Health: 11.450.51 is the first with RemappedRows, 11.525.150 with
# GpuFabricInfo, 12.535.77 with CurrentClocksEventReasons, 12.550.52 with GpuFabricInfoV
# (RetiredPagesPendingStatus, TotalEccErrors, EccMode and CurrentClocksThrottleReasons are in all).
_AFTER_R550 = (TEMPERATURE_V,)
_AFTER_R535 = (FABRIC_V,) + _AFTER_R550
_AFTER_R535_EARLY = (DETAIL_LIST,) + _AFTER_R535
_AFTER_R525 = (CONF_COMPUTE_MEM, CLOCK_EVENTS) + _AFTER_R535_EARLY
_AFTER_R470 = V3_PROCESS_SYMBOLS + (MEMORY_V2, FABRIC) + _AFTER_R525
_AFTER_R440 = V2_PROCESS_SYMBOLS + MIG_SYMBOLS + (REMAPPED_ROWS,) + _AFTER_R470

# The --query-gpu fields of smi.GPU_FIELDS that a branch's nvidia-smi does not list in --help-query-gpu and
# refuses (`Field "memory.reserved" is not a valid field to query.`, exit 2), from the real listings of
# tests/field (SOURCES.md): a pre-R510 listing (nvidia_gpu_exporter, 2021) has mig.mode.* but neither
# memory.reserved nor power.draw.instant; an R510-R525 listing (netdata, 2022-12) has memory.reserved but not
# power.draw.instant; the R590, R595 and R610 listings have all three. The XML of 535.54.03 and 535.86.05
# still has only <power_draw> (570.124.04: average and instant), so power.draw.instant is taken to be absent on
# early R535 too; that R535 (535.216.01) and R550 list it is assumed, to be recorded by make gpu-smoke. R418's
# XML (telegraf gtx-1660-ti, quadro-p400: 418.43) has no <mig_mode> and NVML's MIG calls came with R450, so R440
# lists no mig.mode.*.
_SMI_AFTER_R525 = ("power.draw.instant",)
_SMI_AFTER_R470 = ("memory.reserved",) + _SMI_AFTER_R525
_SMI_AFTER_R440 = ("mig.mode.current", "mig.mode.pending") + _SMI_AFTER_R470

_BINDINGS = ("nvidia-ml-py wheels 11.450.51, 11.470.66, 11.510.69, 11.525.150, 12.535.77, 12.535.108, "
             "12.535.161, 12.550.52, 12.560.30, 12.570.86 (NVIDIA's bindings of each branch's nvml.h): "
             "which symbols a branch has")

PROFILES: Dict[str, Profile] = {p.name: p for p in (
    Profile(
        name="r440", driver_version="440.118.02", nvml_version="10.440.118.02", cuda_version=10020,
        hidden_symbols=_AFTER_R440, process_v3_entry_bytes=ENTRY_V2,
        model="Tesla V100-SXM2-32GB", memory_mib=32510, gpus=8, smi_absent_fields=_SMI_AFTER_R440,
        source=("Only the unversioned process queries (16-byte {pid, usedGpuMemory}): go-nvml issue 21 "
                "(430.64 and 440.33.01, CUDA 10.x: read as 24-byte entries they come back shuffled), gpustat "
                "issue 138 (450.36.06: the _v2 "
                "queries are Function Not Found; V100-SXM2-32GB with 32510 MiB); no MIG (came with R450/A100), "
                "no MemoryInfo_v2 (R510); " + _BINDINGS + ". That the unversioned "
                "nvmlDeviceGetMPSComputeRunningProcesses exists on R440 is assumed, to be recorded by "
                "make gpu-smoke (no binding before 11.470 wraps any MPS query)."),
    ),
    Profile(
        name="r470", driver_version="470.256.02", nvml_version="11.470.256.02", cuda_version=11040,
        hidden_symbols=_AFTER_R470, process_v3_entry_bytes=ENTRY_V2,
        model="NVIDIA A100-SXM4-80GB", memory_mib=81920, gpus=8, smi_absent_fields=_SMI_AFTER_R470,
        source=("_v2 process queries (24-byte), no _v3 (added in 510.39.01: nvitop PR 89's header history; "
                "gpustat falls back to _v2 for drivers < 510.39.01, gpustat/nvml.py), no MemoryInfo_v2 "
                "(gpustat issue 141: driver < 515); " + _BINDINGS + ". 81920 MiB for an A100-SXM4-80GB is "
                "assumed, to be recorded by make gpu-smoke."),
    ),
    Profile(
        name="r525", driver_version="525.147.05", nvml_version="12.525.147.05", cuda_version=12000,
        hidden_symbols=_AFTER_R525, process_v3_entry_bytes=ENTRY_V2,
        model="NVIDIA H100 80GB HBM3", memory_mib=81559, gpus=8, smi_absent_fields=_SMI_AFTER_R525,
        source=("_v3 writes the 24-byte v2 layout (nvitop PR 79: R510 to R530 kept the v2 struct); "
                "MemoryInfo_v2 present; no ConfComputeMemSizeInfo (nvitop issue 181's log on an R525 "
                "driver: `Failed to found symbol nvmlDeviceGetConfComputeMemSizeInfo`, and "
                "nvmlDeviceGetTemperatureV missing too); " + _BINDINGS + ". 81559 MiB for an H100 80GB "
                "HBM3 is assumed, to be recorded by make gpu-smoke."),
    ),
    Profile(
        name="r535-early", driver_version="535.54.03", nvml_version="12.535.54.03", cuda_version=12020,
        hidden_symbols=_AFTER_R535_EARLY, process_v3_entry_bytes=ENTRY_V3,
        model="NVIDIA H100 80GB HBM3", memory_mib=81559, gpus=8, smi_absent_fields=_SMI_AFTER_R525,
        source=("535.43.02 to 535.86.x: _v3 writes 32-byte nvmlProcessInfo_v3_t entries without a version bump "
                "and nvmlDeviceGetConfComputeMemSizeInfo exists but nvmlDeviceGetRunningProcessDetailList does "
                "not (nvitop PR 79 \"fix process info support for NVIDIA R535 driver\", nvitop/api/libnvml.py's "
                "rule, nvidia-ml-py 12.535.77); 24-byte readers get garbage on 535.54.03: gpustat issue 161 "
                "(only the first process), go-nvml issue 75 (fixed by 535.154.05), pynvml PR 48. 535.98 "
                "removed the _v3 symbols altogether (nvitop issue 88; not a profile)."),
    ),
    Profile(
        name="r535", driver_version="535.216.01", nvml_version="12.535.216.01", cuda_version=12020,
        hidden_symbols=_AFTER_R535, process_v3_entry_bytes=ENTRY_V2,
        model="NVIDIA H100 80GB HBM3", memory_mib=81559, gpus=8,
        source=("The R535 that Debian 12 / Proxmox VE 8 ship. From 535.104.05 on, _v3 writes the 24-byte "
                "struct again and the 32-byte entries moved to nvmlDeviceGetRunningProcessDetailList: nvitop "
                "issue 88 and PR 94 (535.104.05), nvitop's libnvml.py (32-byte only when ConfComputeMemSizeInfo "
                "exists and RunningProcessDetailList does not), nvidia-ml-py 12.535.108 and 12.535.161 (_v3 "
                "with the 24-byte struct, RunningProcessDetailList declared), go-nvml issue 75 (535.154.05 "
                "fixed 24-byte readers). That 535.216.01's library exports RunningProcessDetailList is "
                "inferred from those; to be recorded by make gpu-smoke."),
    ),
    Profile(
        name="r550", driver_version="550.163.01", nvml_version="12.550.163.01", cuda_version=12040,
        hidden_symbols=_AFTER_R550, process_v3_entry_bytes=ENTRY_V2,
        model="NVIDIA H200", memory_mib=143771, gpus=8,
        source=("ConfComputeMemSizeInfo and RunningProcessDetailList both exist, _v3 writes 24 bytes (nvitop "
                "libnvml.py's rule; nvidia-ml-py 12.550.52: c_nvmlProcessInfo_v3_t = c_nvmlProcessInfo_v2_t); "
                "no TemperatureV (first in nvidia-ml-py 12.570.86)."),
    ),
    Profile(
        name="r580", driver_version="580.159.03", nvml_version="13.580.159.03", cuda_version=13000,
        hidden_symbols=(), process_v3_entry_bytes=ENTRY_V2,
        model="NVIDIA H200", memory_mib=143771, gpus=8,
        source=("The simulator's defaults (a real 8 x H200 host, 580.159.03); every simulated symbol; "
                "nvidia-ml-py 13.x (c_nvmlProcessInfo_v3_t = c_nvmlProcessInfo_v2_t)."),
    ),
    Profile(
        name="gb10", driver_version="580.126.09", nvml_version="13.580.126.09", cuda_version=13000,
        hidden_symbols=(), process_v3_entry_bytes=ENTRY_V2,
        model="NVIDIA GB10", memory_mib=122547, gpus=1,
        not_supported=("memory", "power_limit", "mig_mode"), pci_bus_ids=("0000000F:01:00.0",), fabric_state=0,
        source=("DGX Spark, unified memory: nvmlDeviceGetMemoryInfo and _v2 both NOT_SUPPORTED (leptonai/gpud "
                "PR 1170 log; XuehaiPan/nvitop PR 208 comment, raw ctypes on 580.173.02; NVIDIA DGX Spark known "
                "issues \"nvidia-smi reports memory usage not supported\"), while per-process used memory is "
                "reported (unslothai/unsloth PR 10283; Syllo/nvtop issue 426); the nvidia-smi table of "
                "snowflakedb/ArcticTraining PR 345 (580.126.09: `Not Supported` Memory-Usage, `3W /  N/A` power "
                "cap, MIG M. N/A, Bus-Id 0000000F:01:00.0, 1 GPU); no fan. 122547 MiB (the 128501256192-byte "
                "system memory in gpud PR 1170) stands for a total NVML never reports. No ECC (`N/A` in the "
                "Volatile Uncorr. ECC column of the same tables); no row remapper and a fabric state of Not "
                "Supported (one GPU, no NVSwitch: leptonai/gpud PR 1140) are assumed, to be recorded by make "
                "gpu-smoke."),
    ),
)}

DEFAULT_PROFILE = "r580"
NAMES = tuple(PROFILES)


def get(name: str) -> Profile:
    """The profile called ``name``; KeyError naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown driver profile {name!r}; known: {', '.join(NAMES)}") from None
