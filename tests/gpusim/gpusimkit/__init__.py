"""gpusimkit's public API: what tests, benchmarks and tools may use (tests/gpusim/README.md "The public API").

``SimHost`` (one simulated host: everything that concerns it is one of its methods), the pytest fixtures of
``gpusimkit.pytest_plugin`` (``gpusim``, ``gpusim_factory``, ``GpusimFactory``), and the names below. Every
other module of the package is internal. The names load on first use (PEP 562), so that ``python -m
gpusimkit.smi`` and the other entry points do not import the whole kit at each start.
"""

import importlib

# name -> (internal module, its name there)
_EXPORTS = {
    "SimHost": ("host", "SimHost"),
    "SimError": ("host", "SimError"),
    "ScenarioError": ("scenario", "ScenarioError"),
    "ContainerError": ("container", "ContainerError"),
    "DRIVERS": ("profiles", "NAMES"),
    "starttime": ("proctools", "starttime"),
    "alive": ("proctools", "alive"),
    "read_stat": ("proctools", "read_stat"),
    "cmdline": ("proctools", "cmdline"),
    "nspid": ("proctools", "nspid"),
    "cgroup_of": ("cgroups", "of_pid"),
    "ct_cgroups_left": ("container", "leftover_cgroups"),
    "throwaway_sshd": ("sshd", "throwaway_sshd"),
    "SshdError": ("sshd", "SshdError"),
    "world_runnable": ("sshd", "world_runnable"),
}

__all__ = sorted(_EXPORTS)

# The modules a file outside the kit may import by name (besides the package itself).
PUBLIC_MODULES = ("pytest_plugin",)


def __getattr__(name):
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'gpusimkit' has no attribute {name!r} (public: {', '.join(__all__)})") from None
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
