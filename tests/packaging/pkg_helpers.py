"""Helpers of the packaging tests (tests/packaging): run a command, the files git would ship, an
environment in which Ansible sees only one collections path, the pyenv interpreters."""

import glob
import os
import shutil
import subprocess
import sys

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUNCTIONAL = os.path.join(TOP, "tests", "functional")  # modrun
if FUNCTIONAL not in sys.path:
    sys.path.append(FUNCTIONAL)

# The tools of the virtual environment that runs pytest (ansible-core, antsibull-*, ansible-builder).
BIN = os.path.dirname(sys.executable)


def tool(name):
    path = os.path.join(BIN, name)
    return path if os.path.exists(path) else (shutil.which(name) or name)


def run(argv, env=None, cwd=None, timeout=300, check=True):
    """Run argv; with check, fail the test with the command's output unless it exits 0."""
    proc = subprocess.run([str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(str(a) for a in argv)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}"
                    f"\n--- stderr\n{proc.stderr[-6000:]}", pytrace=False)
    return proc


def git_visible_files(top):
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=top,
                         capture_output=True, check=True).stdout.decode()
    return sorted(f for f in out.split("\0") if f and os.path.lexists(os.path.join(top, f)))


def copy_files(top, files, dest):
    for rel in files:
        src = os.path.join(top, rel)
        dst = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def ansible_env(collections_path, home, extra=None):
    """os.environ without the caller's Ansible settings; Ansible sees only collections_path (modrun.controller_env,
    Ansible's files in ``home``)."""
    from modrun import controller_env  # noqa: PLC0415  (tests/functional: one way to build Ansible's environment)

    base = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTEST_"))}
    return controller_env(collections_path, home, base=base, HOME=str(home), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
                          ANSIBLE_DEPRECATION_WARNINGS="1", PYTHONDONTWRITEBYTECODE="1", **(extra or {}))


def pyenv_python(version):
    """The interpreter of Python `version` (3.X) from pyenv, else from PATH; None when absent."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(os.path.join(root, "versions", version + ".*", "bin", "python" + version)))
    return found[-1] if found else shutil.which("python" + version)
