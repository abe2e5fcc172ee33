# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The host's interfaces: what the rules are given as ``io``. Each is implemented by the adapter named in its
docstring on a real host, and by a fake in the unit tests (tests/unit/plugins/module_utils/test_host_boundary.py checks
both). Adapters read and act; they decide nothing."""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable


@runtime_checkable
class Job(Protocol):
    """A call in the background (calls.Background): ``result(timeout=None)`` -> its value, its error, or QueryTimeout."""

    def result(self, timeout: float = None) -> Any:
        ...


@runtime_checkable
class WaitHost(Protocol):
    """What _wait.Wait reads and does (_host.wait_io.WaitIO; test__wait_run.FakeHost)."""

    def snapshot(self, full: bool, processes: bool = True) -> list:
        ...

    def restrict(self, indexes) -> None:
        ...

    def restricted(self) -> bool:
        ...

    def alive(self, pid: int, start_time) -> bool:
        ...

    def now(self) -> float:
        ...

    def boot_id(self) -> Any:
        ...

    def sleep(self, seconds: float) -> None:
        ...

    def confirm_path(self) -> Any:
        ...

    def smi_path(self) -> Any:
        ...

    def smi_query(self, path) -> dict:
        ...

    def run(self, argv: list, what: str) -> tuple:
        ...

    def device_holders(self) -> dict:
        ...

    def read(self, pid: int) -> Any:
        ...

    def exe(self, pid: int) -> Any:
        ...

    def background(self, func, *args) -> Job:
        ...


@runtime_checkable
class ReleaseHost(Protocol):
    """What _release.Release and run_release read and do (_host.release_io.ReleaseIO; test__release.FakeHost)."""

    run_command: Callable    # (argv, timeout, what) -> (rc, out, err); QueryTimeout (calls.run_in_group)
    warn: Callable           # (text) -> None
    bins: Callable           # (name) -> path or None (systemctl, pct)

    def snapshot(self, holders: bool = True) -> list:
        ...

    def read(self, pid: int) -> Any:
        ...

    def text(self, proc: dict) -> str:
        ...

    def exe(self, pid: int) -> Any:
        ...

    def children(self) -> dict:
        ...

    def me(self) -> tuple:
        ...

    def host_namespace(self) -> Any:
        ...

    def pin(self, info: dict) -> tuple:
        ...

    def wait_gone(self, targets: list, timeout: float) -> list:
        ...

    def check_may_signal(self, procs) -> None:
        ...

    def state(self, pid: int) -> Any:
        ...

    def frozen(self, pid: int) -> bool:
        ...

    def container_init(self, proc: dict) -> Any:
        ...

    def now(self) -> float:
        ...

    def boot_id(self) -> Any:
        ...

    def ticks_now(self) -> float:
        ...

    def ticks_per_s(self) -> float:
        ...

    def sleep(self, seconds: float) -> None:
        ...


@runtime_checkable
class NodeHost(Protocol):
    """What _fence.Fence reads and does on a Proxmox VE node (_host.node_io.NodeIO; test__fence.FakeNode)."""

    release_io: Any          # the ReleaseHost of the release the fence runs
    warn: Callable
    now: Callable

    def node(self) -> tuple:
        ...

    def config(self, vmid: int) -> Any:
        ...

    def where(self) -> str:
        ...

    def pct(self, argv: list, timeout: float, what: str) -> tuple:
        ...

    def pct_calls(self) -> int:
        ...

    def gpus(self) -> Any:
        ...

    def look(self) -> list:
        ...

    def take_locks(self, vmids) -> None:
        ...

    def gpu_locks(self, containers, gpus) -> bool:
        ...

    def background(self, func, *args, what: str = None) -> Job:
        ...

    def run_all(self, func, items: list, workers: int) -> list:
        ...
