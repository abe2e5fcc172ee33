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

# The simulator's own tests check pct's formats, not its cost: its start-up (gpusimkit/pct.py STARTUP_S) is not spent
# here unless a test asks for it (test_containers.py's test of the cost sets it).
os.environ.setdefault("GPUSIM_PCT_STARTUP_S", "0")

__all__ = ["gpusim", "gpusim_factory"]
