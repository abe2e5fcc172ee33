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
def collection(tmp_path):
    root = tmp_path / "collections"
    (root / "ansible_collections" / "gpuops").mkdir(parents=True)
    os.symlink(TOP, root / "ansible_collections" / "gpuops" / "gpu")
    return str(root)
