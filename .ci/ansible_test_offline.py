"""Put ansible-test's pip bootstrap script in place, offline.

ansible-test bootstraps pip in every venv it creates with a get-pip script that it downloads
from ci-files.testing.ansible.com, a host this network cannot reach, unless
~/.ansible/test/cache/get_pip_<version>.py exists.  This writes a stand-in there that
installs the requested pip from its wheel, downloaded once into ~/.ansible/test/cache/wheels
(pip runs from its own wheel: `python pip-X.whl/pip install --no-index ...`), or, when that wheel
is not there or the install asks for more, bootstraps pip with the standard library's ensurepip
and then installs the requested pip (and packages) from the package registry.  make test creates
a dozen venvs this way (sanity's tests, units on each Python): the wheel takes a few seconds off
each (no ensurepip install, uninstall and reinstall).  See ../shared notes (ansible-test-offline.md).
"""

import glob
import os
import re
import subprocess
import sys

STANDIN = '''\
"""get-pip stand-in written by gpuops.gpu/.ci/ansible_test_offline.py (offline bootstrap)."""
import ensurepip
import glob
import os
import subprocess
import sys

WHEELS = %r
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
pins = [a.split("==", 1)[1] for a in args if a.startswith("pip==")]
for wheel in glob.glob(os.path.join(WHEELS, "pip-%%s-*.whl" %% (pins[0] if pins else "*"))):
    # pip run from its own wheel installs that wheel (anything else asked for: the way below), not byte-compiled:
    # ansible-test runs pip a few times (and uninstalls it from the import test's venvs), which compiles what it uses
    if subprocess.call([sys.executable, os.path.join(wheel, "pip"), "install", "--no-compile", "--no-index",
                        "--find-links", WHEELS] + args) == 0:
        sys.exit(0)
ensurepip.bootstrap(upgrade=True)
# ensurepip sets PIP_CONFIG_FILE=/dev/null and leaves it set; that hides the machine's pip
# configuration (CA bundle, mirrors), so drop it before the real install.
os.environ.pop("PIP_CONFIG_FILE", None)
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install"] + args))
'''


def download_pip(version, wheels):
    """pip's wheel of that version into ``wheels``, through this Python's pip (and its cache); False when it cannot."""
    if glob.glob(os.path.join(wheels, "pip-%s-*.whl" % version)):
        return True
    return subprocess.call([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                            "--no-deps", "--only-binary", ":all:", "-d", wheels, "pip==%s" % version]) == 0


def pip_versions(ansible_test_dir):
    with open(os.path.join(ansible_test_dir, "_internal", "python_requirements.py"), encoding="utf-8") as f:
        source = f.read()
    return sorted(set(re.findall(r"pip='([0-9.]+)'", source)))


def main():
    import ansible_test

    versions = pip_versions(os.path.dirname(ansible_test.__file__))
    if not versions:
        sys.exit("could not find ansible-test's pip version in python_requirements.py")
    cache = os.path.expanduser("~/.ansible/test/cache")
    wheels = os.path.join(cache, "wheels")
    os.makedirs(wheels, exist_ok=True)
    for version in versions:
        path = os.path.join(cache, "get_pip_%s.py" % version.replace(".", "_"))
        with open(path, "w", encoding="utf-8") as f:
            f.write(STANDIN % wheels)
        how = "its wheel" if download_pip(version, wheels) else "ensurepip (no wheel)"
        print("ansible-test pip bootstrap stand-in: %s (pip %s from %s)" % (path, version, how))


if __name__ == "__main__":
    main()
