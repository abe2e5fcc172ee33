"""Fixtures for functional tests of the modules against the simulated host.

``gpusim``/``gpusim_factory`` come from the simulator (tests/gpusim/gpusimkit/pytest_plugin.py);
``collection`` lays this checkout out as ansible_collections/gpuops/gpu (a symlink) so that the
modules can run as ``python -m ansible_collections.gpuops.gpu.plugins.modules.<name>``, inside
simulated containers too.
"""

import os
import sys

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPUSIM = os.path.join(TOP, "tests", "gpusim")
if GPUSIM not in sys.path:
    sys.path.insert(0, GPUSIM)

from gpusimkit.pytest_plugin import gpusim, gpusim_factory  # noqa: E402  (fixtures)

__all__ = ["gpusim", "gpusim_factory", "collection"]


@pytest.fixture
def collection():
    """build/functional-collections/ansible_collections/gpuops/gpu -> this checkout: inside the
    checkout, so that it is there in the simulator's containers too (they bind the checkout in)."""
    root = os.path.join(TOP, "build", "functional-collections")
    link = os.path.join(root, "ansible_collections", "gpuops", "gpu")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.realpath(link) != os.path.realpath(TOP):
        tmp = f"{link}.tmp.{os.getpid()}"
        os.symlink(TOP, tmp)
        os.replace(tmp, link)
    return root


# make simtests runs these files with `-n 2 --dist loadfile --no-loadscope-reorder`: a file at a time per worker, in
# this order. The longest files first (seconds on 2 loaded cores, `pytest --durations`, 2026-12-05), so that the last
# files to start are short ones and neither worker idles long while the other ends a long file; pytest-xdist's own
# order (most tests first) started the few-test, long files last. A file not listed keeps its place after these.
LONGEST_FIRST = (
    "functional/test_ready.py",                    # 360 s
    "functional/test_output_size.py",              # 330 s
    "functional/test_scenarios.py",                # 290 s (the generated ones: a time budget)
    "functional/test_proxmox_gpu_containers.py",   # 230 s
    "functional/test_fault_matrix.py",             # 210 s
    "functional/test_ssh_become.py",               # 180 s
    "functional/test_ready_proved.py",             # 140 s
    "functional/test_bad_input.py",                # 130 s
    "functional/test_predeploy.py",                # 105 s
    "functional/test_fuzz.py",                     # 100 s
    "functional/test_gpu_report.py",               # 90 s
    "functional/test_driver_profiles.py",          # 90 s
    "gpusim/tests/test_containers.py",             # 85 s
)


def pytest_collection_modifyitems(items):
    def rank(item):
        path = item.nodeid.split("::", 1)[0]
        return next((i for i, end in enumerate(LONGEST_FIRST) if path.endswith(end)), len(LONGEST_FIRST))
    items.sort(key=rank)  # stable: each file's tests keep their order, every worker gets the same order
