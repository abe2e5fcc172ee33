"""Test-only crash injection into a module of this collection (tests/functional/test_ready_proved.py).

Put this directory on PYTHONPATH and set GPUOPS_TEST_CRASH=<module>:<how>[@<event>]; every Python
started with that environment imports this file (Python's ``site`` imports ``sitecustomize``), but
only the interpreter that Ansible starts for that module (``AnsiballZ_<module>.py``) crashes:

- ``<how>``: ``segv`` - a real segmentation fault (a NULL pointer read through ctypes): the
  interpreter dies by SIGSEGV, as a crash in the NVIDIA library does; ``kill`` - it dies by
  SIGKILL, as the OOM killer kills it; ``raise`` - an unhandled exception raised where the module
  is (ansible-core reports it as an exception, with no ``msg`` under ``failed_when``).
- the fence's, the release's and the wait's ``<module>`` crashes in predeploy_host's one module run too
  (``AnsiballZ_predeploy_host``), as that step starts: it writes its mark to stderr then (_errors.STEP_MARK).
- ``@<event>[#<n>]``: the n-th time (default: the first) the module does that, a Python audit
  event - ``subprocess.Popen`` (a command: pct, nvidia-smi), ``glob.glob`` (a look at the device
  files: each look at the GPUs makes one), ``ctypes.dlopen`` (loading NVML) - or ``signal``: right
  after its first signal (``os.kill`` or ``signal.pidfd_send_signal``, not signal 0) reached a
  process; without it, as the module's code starts.

Each crash appends ``<module> <how> <event>`` to the file GPUOPS_TEST_CRASH_LOG (when set), so that a
test knows the crash happened. Core dumps are turned off first. Nothing in plugins/ knows of this.
"""

import os
import sys

_SPEC = os.environ.get("GPUOPS_TEST_CRASH", "")
# predeploy_host's steps (plugins/module_utils/_errors.py, STEP_MODULES and STEP_MARK: copied, this file imports
# nothing of the collection's).
STEPS = ("proxmox_gpu_containers", "gpu_release", "gpu_wait_idle")
STEP_MARK = "gpuops.gpu.predeploy_host step: "


def _arm(spec):
    module, _sep, rest = spec.partition(":")
    how, _sep, event = rest.partition("@")
    how = how or "segv"
    event, _sep, nth = event.partition("#")
    nth = int(nth or 1)
    started_by = os.path.basename(sys.argv[0] if sys.argv else "")
    in_steps = started_by.startswith("AnsiballZ_predeploy_host.") and module in STEPS
    if not started_by.startswith(f"AnsiballZ_{module}.") and not in_steps:
        return  # the controller, the simulator, another module: nothing happens
    target = f"ansible_collections.gpuops.gpu.plugins.modules.{module}"
    state = {"armed": False, "done": False, "seen": 0}

    def crash(where):
        if state["done"]:
            return
        state["done"] = True
        log = os.environ.get("GPUOPS_TEST_CRASH_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as f:
                f.write(f"{module} {how} {where}\n")
        if how == "raise":
            raise RuntimeError(f"crash injected into {module} at {where}")
        import resource  # noqa: PLC0415 (only in the interpreter that crashes)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        sys.stderr.flush()
        if how == "kill":
            import signal  # noqa: PLC0415
            os.kill(os.getpid(), signal.SIGKILL)
        import ctypes  # noqa: PLC0415
        ctypes.string_at(0)  # SIGSEGV

    def audit(name, _args):
        if state["armed"] and name == event:
            state["seen"] += 1
            if state["seen"] == nth:
                crash(f"{event}#{nth}")

    def after_signal(send):
        def wrapper(who, sig, *args, **kwargs):
            out = send(who, sig, *args, **kwargs)
            if state["armed"] and sig:
                crash("signal")
            return out
        return wrapper

    class Finder:
        """Sees the import of the module (runpy looks it up): the module's code starts now."""

        @staticmethod
        def find_spec(fullname, path=None, target_module=None):  # noqa: ARG004 (the finder protocol)
            if fullname == target and not state["armed"]:
                state["armed"] = True
                if not event:
                    crash("start")
            return None

    class StepMark:
        """predeploy_host's stderr: the step of ``module`` starts when its mark is written."""

        def __init__(self, stream):
            self.stream = stream

        def write(self, text):
            out = self.stream.write(text)
            if text.startswith(STEP_MARK + module) and not state["armed"]:
                self.stream.flush()
                state["armed"] = True
                if not event:
                    crash("start")
            return out

        def __getattr__(self, name):
            return getattr(self.stream, name)

    if in_steps:
        sys.stderr = StepMark(sys.stderr)
    else:
        sys.meta_path.insert(0, Finder())
    if event == "signal":
        import signal  # noqa: PLC0415
        os.kill = after_signal(os.kill)
        if hasattr(signal, "pidfd_send_signal"):
            signal.pidfd_send_signal = after_signal(signal.pidfd_send_signal)
    elif event:
        sys.addaudithook(audit)


if _SPEC:
    _arm(_SPEC)
