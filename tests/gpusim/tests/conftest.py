"""Fixtures for the simulator's own tests: ``gpusim`` and ``gpusim_factory``.

They come from gpusimkit.pytest_plugin.  They are imported here rather than named in
``pytest_plugins``, which pytest refuses in a conftest that is not at the root of the run (e.g.
``pytest tests``).
"""

import os
import sys

GPUSIM = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if GPUSIM not in sys.path:
    sys.path.insert(0, GPUSIM)

from gpusimkit.pytest_plugin import gpusim, gpusim_factory  # noqa: E402  (fixtures)

__all__ = ["gpusim", "gpusim_factory"]
