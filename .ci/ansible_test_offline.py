"""Put ansible-test's pip bootstrap script in place, offline.

ansible-test bootstraps pip in every venv it creates with a get-pip script that it downloads
from ci-files.testing.ansible.com, a host this network cannot reach, unless
~/.ansible/test/cache/get_pip_<version>.py exists.  This writes a stand-in there that
bootstraps pip with the standard library's ensurepip and then installs the requested pip
(and packages) from the package registry.  See ../shared notes (ansible-test-offline.md).
"""

import os
import re
import sys

STANDIN = '''\
"""get-pip stand-in written by gpuops.gpu/.ci/ansible_test_offline.py (offline bootstrap)."""
import ensurepip
import os
import subprocess
import sys

ensurepip.bootstrap(upgrade=True)
# ensurepip sets PIP_CONFIG_FILE=/dev/null and leaves it set; that hides the machine's pip
# configuration (CA bundle, mirrors), so drop it before the real install.
os.environ.pop("PIP_CONFIG_FILE", None)
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install"] + args))
'''


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
    os.makedirs(cache, exist_ok=True)
    for version in versions:
        path = os.path.join(cache, "get_pip_%s.py" % version.replace(".", "_"))
        with open(path, "w", encoding="utf-8") as f:
            f.write(STANDIN)
        print("ansible-test pip bootstrap stand-in: %s" % path)


if __name__ == "__main__":
    main()
