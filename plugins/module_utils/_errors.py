# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""Typed errors that carry details. Only the modules turn them into fail_json."""

from __future__ import annotations


class GpuError(Exception):
    """Base: ``msg`` is a human sentence (cause and what to do); ``details`` is structured."""

    kind = "error"

    def __init__(self, msg: str, **details):
        super().__init__(msg)
        self.msg = msg
        self.details = details

    def result(self) -> dict:
        """Keyword arguments for fail_json."""
        out = {"msg": self.msg, "error": self.kind}
        if self.details:
            out["error_details"] = self.details
        return out


class LibraryNotFound(GpuError):
    kind = "library_not_found"


class DriverNotLoaded(GpuError):
    kind = "driver_not_loaded"


class VersionMismatch(GpuError):
    kind = "version_mismatch"


class NoPermission(GpuError):
    kind = "no_permission"


class GpuLost(GpuError):
    kind = "gpu_lost"


class PctNotFound(GpuError):
    """The ``pct`` option names no program here (a Proxmox VE node has /usr/sbin/pct)."""

    kind = "pct_not_found"


class QueryTimeout(GpuError):
    kind = "timeout"


class SelectionError(GpuError):
    kind = "selection"


class BackendError(GpuError):
    kind = "backend"


class UnreadableOutput(GpuError, ValueError):
    """What a program or a kernel file printed, and a parser cannot read (nvidia-smi, /proc, pct, pmxcfs' files).

    ``source`` names what printed it, ``problem`` what is wrong with it, ``sample`` the input that broke it (cut to
    SAMPLE_CHARS: driver, /proc and pct output carry no command-line arguments), ``todo`` what to do. A ValueError
    too, so that a caller that reads on past one bad line can say so."""

    kind = "unreadable_output"
    SAMPLE_CHARS = 200

    def __init__(self, source: str, problem: str, sample: str = "", todo: str = ""):
        shown = (sample or "")[:self.SAMPLE_CHARS]
        msg = f"{source}: {problem}" + (f": {shown!r}" if shown else "") + ". " + (
            todo or "Report it with the output of that command; nothing was signalled")
        super().__init__(msg, source=source, problem=problem, sample=shown)


class InvalidOption(GpuError, ValueError):
    """Bad input, found before anything is read or signalled; ``option`` names it."""

    kind = "invalid_option"


class RegexTooSlow(GpuError):
    """A regular expression of an option took longer than its time budget on a command line."""

    kind = "regex_too_slow"


def message_for_init_failure(kind: str, backend: str, detail: str = "") -> GpuError:
    """The error for a driver/library that cannot be initialised, with what to do about it."""
    suffix = f" ({detail})" if detail else ""
    if kind == "library_not_found":
        return LibraryNotFound(
            "no NVIDIA driver libraries here: a container without them, or not a GPU host"
            f"{suffix}. Run on the host that has the GPUs (on Proxmox VE: the node), or set missing=ignore"
            " to gather facts on a mixed fleet.", backend=backend)
    if kind == "driver_not_loaded":
        return DriverNotLoaded(
            f"the NVIDIA kernel driver is not loaded{suffix}: check `lsmod | grep nvidia` and `dmesg`,"
            " load it (modprobe nvidia) or reboot after a driver install.", backend=backend)
    if kind == "version_mismatch":
        return VersionMismatch(
            f"NVIDIA driver/library version mismatch{suffix}: the driver was upgraded without a reboot"
            " or module reload. Reboot the host (or unload and reload the nvidia modules) before a deploy.",
            backend=backend)
    if kind == "no_permission":
        return NoPermission(
            f"no permission to query the NVIDIA driver{suffix}: run the task with become: true, or give"
            " the user access to /dev/nvidia*.", backend=backend)
    return BackendError(f"{backend} failed{suffix}", backend=backend)


class NotPermitted(GpuError):
    """The module may not act on another user's process (signal it): it does not run as root."""

    kind = "not_permitted"


BECOME_HINT = ("run the task as root: become: true on the task or play, or -b (--become) on the command line"
               " (AWX: Privilege Escalation)")


def not_permitted(action: str, whom: str, uid=None, user=None, detail: str = "") -> NotPermitted:
    """The error for an action on another user's process refused by the kernel (EPERM): names root and become.

    ``action``: what was refused ("signal"); ``whom``: the process ("pid 8812 (python3) in CT 129");
    ``uid``/``user``: who the module runs as.
    """
    who = ""
    if uid is not None:
        who = f" as {user} (uid {uid})" if user and user != str(uid) else f" as uid {uid}"
    suffix = f" ({detail})" if detail else ""
    return NotPermitted(
        f"not permitted to {action} {whom}{suffix}: the module runs{who}, not as root, and only root may {action}"
        f" other users' processes - {BECOME_HINT}.", action=action, uid=uid)


class Blocked(GpuError):
    """gpu_wait_idle: a selected GPU is kept busy by a process the release before it left (outside its scope, or
    protected) - nothing in the hook will stop it, so the wait fails fast instead of at its timeout."""

    kind = "blocked"


class WaitTimeout(GpuError):
    """gpu_wait_idle: the selected GPUs were not idle (and settled) within its timeout; the message is the diagnosis."""

    kind = "wait_timeout"


class ConfirmationDisagrees(GpuError):
    """gpu_wait_idle: the driver (NVML) found the GPUs idle, and the final nvidia-smi query did not."""

    kind = "confirmation_disagrees"


# predeploy_host's one module run (_host/runs.steps): its steps in their order, each with its module; each writes
# STEP_MARK and its module's name to stderr as it starts, so that a run that dies (a signal, no result) is the crash of
# the step it was in (plugins/action/predeploy_host.py).
STEP_MODULES = (("fence", "proxmox_gpu_containers"), ("release", "gpu_release"), ("wait", "gpu_wait_idle"))
STEP_MARK = "gpuops.gpu.predeploy_host step: "
