# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The real host's snapshots (SnapshotTaker): the driver through NVML or nvidia-smi, /proc, the device-file scan,
the kernel log, each under its time limit; what they read is built into the facts by the rules (_snapshot.take)."""

from __future__ import annotations

import os
import time

from ansible_collections.gpuops.gpu.plugins.module_utils import (
    _errors, _redact, _selection, _smi, _snapshot, _validate)
from ansible_collections.gpuops.gpu.plugins.module_utils._host import kernel_log, mig_caps, nvml as _nvml, procs as _procs
from ansible_collections.gpuops.gpu.plugins.module_utils._host.calls import Background, run_in_group

# Where the simulator (tests/gpusim) points the modules at its kernel log; an unset kernel_log reads it.
KERNEL_LOG_ENV = "GPUOPS_KERNEL_LOG"

SBIN_DIRS = ["/usr/bin", "/usr/sbin", "/sbin", "/usr/local/bin"]
MIN_CALL_S = 0.2  # the least time a call gets when a deadline is (nearly) up


class SnapshotTaker:
    """Takes snapshots for one module run; keeps the backend decision and NVML initialised."""

    def __init__(self, module, params=None, selection=None):
        self.module = module
        self.params = params or module.params
        # The gpus option as _validate parsed it (_selection.Selection; None: every GPU): the MIG devices it narrows to.
        self.selection = selection or _selection.Selection()
        self.backend = None
        self.smi = None
        self.minors = None
        # nvidia-smi ids (--id=) to restrict every nvidia-smi query to; None: all GPUs.
        self.smi_ids = None
        self.protect = _validate.regexes("protect", self.params["protect"])
        self.redact = _validate.regexes("redact", self.params.get("redact"))
        self.show_cmdline = self.params.get("cmdline", True)
        # (pid, start time) -> the raw command line (first 4,096 characters), for match/exclude/protect
        # only, and the text that may be shown (redacted and cut, or None). The raw text is never returned.
        self._raw = {}
        self._shown = {}
        self._texts = {}  # argv tuple -> (match text, shown text)
        self._smi_health = None  # nvidia-smi's health rows, refreshed at each full snapshot
        self._smi_health_fields = {}  # the health fields this nvidia-smi accepts (_smi.health_query)
        self.kernel_log = None  # the kernel log's summary at the last read (_snapshot.take)
        self.xids = None        # its Xid events (None: not read, or unreadable)
        self.deadline = None  # time.monotonic() by which every call must end (a wait's timeout), or None

    def call_limit(self) -> float:
        """One call's time limit: query_timeout, or what is left before ``deadline`` when that is less (a wait with
        timeout T ends by T, a hung nvidia-smi or NVML call included; a floor of MIN_CALL_S)."""
        limit = self.params["query_timeout"]
        if self.deadline is not None:
            limit = min(limit, round(max(self.deadline - time.monotonic(), MIN_CALL_S), 1))
        return limit

    def run_smi(self, argv):
        """One nvidia-smi run (argv list, no shell, the C locale) under query_timeout, in its own process group.

        module.run_command cannot kill what it started when the time is up; run_in_group kills the
        whole group, so a hung nvidia-smi never outlives the module.
        """
        argv = list(argv)
        what = f"{argv[0]} {argv[1].split('=', 1)[0] if len(argv) > 1 else ''}".strip()
        if self.smi_ids:
            argv = [argv[0], "--id=" + ",".join(self.smi_ids)] + argv[1:]
        return run_in_group(argv, self.call_limit(), what)

    def read_process(self, pid: int):
        """_procs.read_process with this run's redaction (O(redact), O(cmdline)); the raw text stays here."""
        kept = {}

        def text(argv):
            # A command line does not change while a process lives: redact each one once per run.
            key = tuple(argv)
            if key not in self._texts:
                self._texts[key] = (_redact.match_text(argv),
                                    _redact.redact_argv(argv, self.redact) if self.show_cmdline else None)
            kept["raw"], shown = self._texts[key]
            return shown

        info = _procs.read_process(pid, cmdline=text)
        if info is None:
            return None
        key = (info["pid"], info["start_time"])
        self._raw[key] = kept.get("raw", "")
        self._shown[key] = info["cmdline"]
        self._screen(info, self._raw[key])
        return info

    def match_text(self, proc: dict) -> str:
        """The raw command line (first 4,096 characters) that match, exclude and protect see; internal only."""
        raw = self._raw.get((proc.get("pid"), proc.get("start_time")))
        return raw if raw is not None else (proc.get("cmdline") or "")

    def _screen(self, info: dict, raw: str) -> None:
        """Run the protect patterns under their time budget on the texts _snapshot.is_protected matches
        (name, basename of argv[0], command line), so that a slow pattern fails naming protect."""
        if not self.protect:
            return
        texts = {info.get("name") or "", raw}
        argv0 = raw.split(" ", 1)[0]
        if argv0:
            texts.add(os.path.basename(argv0))
        for pattern in self.protect:
            for text in texts:
                pattern.search(text)

    def read_for_build(self, pid: int):
        info = self.read_process(pid)
        # _snapshot.build matches protect on the raw text; take() puts the shown text back right after.
        return None if info is None else dict(info, cmdline=self._raw[(info["pid"], info["start_time"])])

    def with_shown_text(self, snap: dict) -> dict:
        """The built snapshot with each process's shown (redacted) command line back in place of the raw one."""
        for gpu in snap["gpus"]:
            for entry in list(gpu["processes"]) + list(gpu["holders"]):
                if entry.get("cmdline") is not None:
                    entry["cmdline"] = self._shown.get((entry.get("pid"), entry.get("start_time")))
        return snap

    def _find_smi(self):
        path = self.module.get_bin_path(self.params["nvidia_smi_path"], required=False, opt_dirs=SBIN_DIRS)
        if not path:
            raise _errors.LibraryNotFound(
                f"no NVIDIA driver libraries here: a container without them, or not a GPU host"
                f" ({self.params['nvidia_smi_path']} not found, and NVML is not usable). Run on the host"
                " that has the GPUs (on Proxmox VE: the node), or set missing=ignore to gather facts on a"
                " mixed fleet.", backend="nvidia-smi")
        return path

    def _choose_backend(self):
        wanted = self.params["backend"]
        if wanted in ("nvml", "auto"):
            try:
                Background(_nvml.init, what="NVML initialisation").result(self.call_limit())
                return "nvml"
            except _errors.LibraryNotFound:
                if wanted == "nvml":
                    raise
        self.smi = self._find_smi()
        return "nvidia-smi"

    def raw(self, need_minors=False) -> dict:
        if self.backend is None:
            self.backend = self._choose_backend()
        if self.backend == "nvml":
            timeout = self.call_limit()
            deadline = time.monotonic() + timeout
            return Background(_nvml.query, deadline, what="NVML query").result(timeout)
        health = None
        if self._smi_health is None or need_minors:
            # Health is one more nvidia-smi run, at the same time as the others (the minor numbers', the
            # snapshot's): at the first and each full snapshot, kept in between.
            health = Background(_smi.health_query, self.run_smi, self.smi, self._smi_health_fields,
                                what="nvidia-smi health")
        try:
            if need_minors and self.minors is None:
                # Minor numbers tie /dev/nvidiaN to a GPU; only nvidia-smi's XML report has them.
                self.minors = _smi.minor_query(self.run_smi, self.smi)
            raw = _smi.query(self.run_smi, self.smi, self.minors, background=Background)
            mig_caps.fill_device_nodes(raw["gpus"])
        finally:
            rows, error = self._smi_health, None
            if health is not None:
                try:
                    rows = health.result()
                except Exception as exc:  # pylint: disable=broad-except  # reported below
                    rows, error = {}, exc
        problem = None
        if health is not None:
            # A health query that fails (a GPU lost while it ran, one that is not selected) does not fail the
            # snapshot: the health fields are then null, the GPUs' errors say why, and the next full snapshot
            # asks again.
            self._smi_health = None if error else rows
            problem = None if error is None else (
                f"nvidia-smi --query-gpu (health): {getattr(error, 'msg', None) or error}")
        _smi.merge_health(raw["gpus"], rows, problem)
        return raw

    def read_kernel_log(self) -> dict:
        """The kernel log (O(kernel_log), else $GPUOPS_KERNEL_LOG, else /dev/kmsg, then dmesg): kernel_log.read_kernel_log's
        answer (its ``text`` None when it cannot be read)."""
        path = self.params.get("kernel_log") or os.environ.get(KERNEL_LOG_ENV) or None

        def dmesg(argv):
            found = self.module.get_bin_path(argv[0], required=False, opt_dirs=SBIN_DIRS)
            if not found:
                return 127, "", f"{argv[0]}: not found"
            return run_in_group([found] + argv[1:], self.call_limit(), "dmesg")

        return kernel_log.read_kernel_log(path, dmesg)

    @staticmethod
    def scan_holders(patterns) -> dict:
        """{pid: [device files]} of the processes (but this one) that hold a file matching ``patterns``."""
        return _procs.scan_fd_holders(patterns, exclude_pids=(os.getpid(),))

    @staticmethod
    def exe(pid: int):
        return _procs.read_exe(pid)

    def take(self, gather_processes=True, gather_holders=True, gather_xid=False) -> dict:
        """One snapshot of every GPU: what this taker reads, built by the rules (_snapshot.take)."""
        return _snapshot.take(self, gather_processes, gather_holders, gather_xid)

    def host_namespace(self):
        """Whether the module runs in the host's PID namespace (None: cannot tell): the driver's pids are then ours."""
        if not hasattr(self, "_host_namespace"):
            self._host_namespace = _procs.in_initial_pid_namespace()
        return self._host_namespace

    def in_container(self):
        """Whether the module runs inside a container (its PID namespace may not see every GPU user)."""
        if not hasattr(self, "_in_container"):
            self._in_container = _procs.in_container()
        return self._in_container
