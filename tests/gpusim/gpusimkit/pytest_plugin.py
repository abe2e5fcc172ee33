"""pytest fixtures over SimHost.

- ``gpusim``: a started simulated host (8 x NVIDIA H200, release lag 0) in a fresh directory.
- ``gpusim_factory``: ``gpusim_factory(gpus=2, release_lag_ms=500, driver="r535", ...)`` starts
  hosts of other shapes (the keyword arguments of ``SimHost.up``); any number per test.

Teardown always calls ``down()`` on every host the test started, even when the test failed,
and then fails the test if anything of the host's own (a process recorded in DIR/run/owned with
its starttime, the daemon, the directory, the host's cgroup ``gpusim-<id>``, a container's vmid
reservation or a cgroup directory LXC made for it) is still there.

Use it with ``pytest_plugins = ["gpusimkit.pytest_plugin"]`` in a root conftest, ``-p
gpusimkit.pytest_plugin``, or by importing the two fixtures into a conftest (what
tests/gpusim/tests/conftest.py does).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from typing import Any, List

import pytest

from . import cgroups, container, proctools, vmids
from .host import SimHost, _kill, _mounts_under


class GpusimFactory:
    def __init__(self) -> None:
        # Short paths: the daemon's unix socket path must stay under 108 bytes.
        self.base = tempfile.mkdtemp(prefix="gpusim-")
        self.hosts: List[SimHost] = []

    def __call__(self, **kwargs: Any) -> SimHost:
        # SimHost.up's defaults are the driver profile's: 8 x H200 for the default (r580).
        host = SimHost.up(os.path.join(self.base, f"h{len(self.hosts)}"), **kwargs)
        self.hosts.append(host)
        return host

    def finish(self) -> List[str]:
        problems: List[str] = []
        for host in self.hosts:
            owned = proctools.read_owned(host.dir)
            cgroup = cgroups.host_base(host.dir)
            cts = sorted(set(container.list(host.dir)) | set(vmids.reserved_by(host.dir)))
            try:
                report = host.down()
                problems += report["errors"]
            except Exception as e:  # noqa: BLE001 (still clean up below)
                problems.append(f"{host.dir}: down() failed: {type(e).__name__}: {e}")
            left = [(p, s) for p, s in owned if proctools.alive(p, s)]
            if left:
                problems.append(f"{host.dir}: processes left running after down(): {[p for p, _st in left]}")
                for p, s in left:
                    _kill(p, s, signal.SIGKILL)
            if os.path.exists(host.dir):
                problems.append(f"{host.dir}: directory left after down()")
            if cgroup is not None and os.path.exists(cgroup):
                problems.append(f"{host.dir}: cgroup {cgroup} left after down()")
            for v in cts:
                if vmids.owner(v) == os.path.realpath(host.dir):
                    problems.append(f"{host.dir}: vmid {v} still reserved after down()")
                elif vmids.owner(v) is None:  # (else another simulator has it now)
                    left_cg = [d for d in container.lxc_cgroups(v) if os.path.exists(d)]
                    if left_cg:
                        problems.append(f"{host.dir}: LXC cgroups of CT {v} left after down(): {left_cg}")
        if not _mounts_under(self.base):
            shutil.rmtree(self.base, ignore_errors=True)
        return problems


@pytest.fixture
def gpusim_factory():
    factory = GpusimFactory()
    try:
        yield factory
    finally:
        problems = factory.finish()
    if problems:
        pytest.fail("gpusim teardown: " + "; ".join(problems), pytrace=False)


@pytest.fixture
def gpusim(gpusim_factory) -> SimHost:  # noqa: redefined-outer-name (pytest fixtures)
    return gpusim_factory()
