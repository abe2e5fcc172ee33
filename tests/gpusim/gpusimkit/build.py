"""Build the simulated NVML library and install it into a scenario directory.

``ensure_built()`` runs ``make -C tests/gpusim`` (idempotent);
``install_library(simdir, hidden_symbols)`` puts ``simdir/lib/libnvidia-ml.so.1`` in place:
a copy of the build, or a variant linked from ``build/nvml.o`` with a linker version
script that does not export ``hidden_symbols`` (so ``dlsym`` fails for them, as with an
older driver).  Stdlib only (Python 3.9+).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from typing import Iterable, Iterator, List, Optional, Sequence

SRC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/gpusim
BUILD_DIR = os.path.join(SRC_DIR, "build")
LIBRARY_NAME = "libnvidia-ml.so.1"
LIBRARY_PATH = os.path.join(BUILD_DIR, LIBRARY_NAME)
OBJECT_PATH = os.path.join(BUILD_DIR, "nvml.o")
SYMBOL_PREFIX = "nvml"


class BuildError(RuntimeError):
    """The library could not be built or linked; the message says why."""


def _tool(name: str, env_var: Optional[str] = None) -> str:
    wanted = os.environ.get(env_var, "") if env_var else ""
    wanted = wanted.split()[0] if wanted.strip() else name
    path = shutil.which(wanted)
    if not path:
        raise BuildError(
            f"'{wanted}' not found on PATH: building the simulated libnvidia-ml.so.1 needs "
            f"gcc, make and binutils (e.g. apt-get install build-essential)"
        )
    return path


def _run(argv: Sequence[str], what: str) -> str:
    try:
        proc = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    except OSError as e:
        raise BuildError(f"{what}: cannot run {argv[0]}: {e}") from e
    if proc.returncode != 0:
        raise BuildError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n{proc.stdout}")
    return proc.stdout


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """Serialize builds (parallel test workers share one build directory)."""
    os.makedirs(BUILD_DIR, exist_ok=True)
    with open(os.path.join(BUILD_DIR, ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _compiler() -> str:
    return _tool("gcc", "CC")


def ensure_built() -> str:
    """Run ``make -C tests/gpusim``; returns the path of build/libnvidia-ml.so.1."""
    make = _tool("make")
    _compiler()  # a clear error before make's own
    with _build_lock():
        _run([make, "-C", SRC_DIR, "--no-print-directory"], "building the simulated NVML library")
    if not os.path.isfile(LIBRARY_PATH) or not os.path.isfile(OBJECT_PATH):
        raise BuildError(f"make finished but {LIBRARY_PATH} or {OBJECT_PATH} is missing")
    return LIBRARY_PATH


def exported_symbols() -> List[str]:
    """The NVML symbols the library exports (from ``nm -g --defined-only build/nvml.o``)."""
    ensure_built()
    return _object_symbols()


def _object_symbols() -> List[str]:
    out = _run([_tool("nm"), "-g", "--defined-only", OBJECT_PATH], "listing the library's symbols")
    names = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[-1].startswith(SYMBOL_PREFIX):
            names.append(parts[-1])
    return sorted(set(names))


def _atomic_target(dest: str) -> str:
    return f"{dest}.tmp.{os.getpid()}"


def install_library(simdir: str, hidden_symbols: Iterable[str] = ()) -> str:
    """Install ``simdir/lib/libnvidia-ml.so.1``; returns its path.

    Without ``hidden_symbols`` it is a copy of the build.  With them, it is linked from
    ``build/nvml.o`` with a version script exporting every ``nvml*`` symbol except those;
    each hidden name must be a symbol the library really exports (else ``ValueError``
    naming it).  The file is replaced atomically: processes that already loaded the old
    one keep it, processes started afterwards load the new one.
    """
    hidden = list(dict.fromkeys(hidden_symbols))
    ensure_built()
    libdir = os.path.join(simdir, "lib")
    os.makedirs(libdir, exist_ok=True)
    dest = os.path.join(libdir, LIBRARY_NAME)
    tmp = _atomic_target(dest)
    try:
        if not hidden:
            shutil.copyfile(LIBRARY_PATH, tmp)
        else:
            exported = _object_symbols()
            for name in hidden:
                if name not in exported:
                    raise ValueError(
                        f"cannot hide {name!r}: it is not a symbol the simulated libnvidia-ml.so.1 exports "
                        f"(exported: {', '.join(exported)})"
                    )
            keep = [s for s in exported if s not in set(hidden)]
            script = f"{tmp}.map"
            with open(script, "w", encoding="utf-8") as f:
                f.write("{\n  global:\n")
                f.writelines(f"    {s};\n" for s in keep)
                f.write("  local: *;\n};\n")
            try:
                _run(
                    [_compiler(), "-shared", "-Wl,-soname," + LIBRARY_NAME, "-Wl,--version-script=" + script,
                     "-o", tmp, OBJECT_PATH, "-ldl", "-lpthread"],
                    f"linking {LIBRARY_NAME} without {', '.join(hidden)}",
                )
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(script)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return dest
