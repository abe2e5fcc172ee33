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
