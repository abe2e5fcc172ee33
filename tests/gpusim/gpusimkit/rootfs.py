"""The two root filesystems of the simulator's containers.

- busybox (``gpusim ct create``): a directory per container with a static busybox as ``/bin/busybox``
  (one link per applet in /bin, ``/sbin/init`` -> busybox: busybox's init is PID 1), an inittab, and
  the host's ``/usr`` bound read-only by the LXC config (a Python interpreter and its libraries for
  the workloads).  Made in a few milliseconds.
- systemd (``gpusim ct create --systemd``): a Debian 12 rootfs with systemd as PID 1, built once by
  ``setup-lxc.sh`` (debootstrap from the mirror apt uses) into ``tests/gpusim/build/rootfs/debian-systemd``
  and shared read-only by every container through an overlay (``lxc.rootfs.path = overlay:<it>:<upper>``).

Stdlib only.
"""

from __future__ import annotations

import os
import shutil
import subprocess

KIT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/gpusim
SETUP = os.path.join(KIT_ROOT, "setup-lxc.sh")
INITTAB = """\
# busybox init (gpusim): nothing to start; on halt (lxc-stop: SIGUSR1) it sends SIGTERM to every
# process, then SIGKILL a second later, and the container stops.
::shutdown:/bin/true
"""


class RootfsError(RuntimeError):
    pass


def rootfs_dir() -> str:
    return os.environ.get("GPUSIM_ROOTFS_DIR") or os.path.join(KIT_ROOT, "build", "rootfs")


def systemd_rootfs() -> str:
    return os.path.join(rootfs_dir(), "debian-systemd")


def ensure_systemd_rootfs() -> str:
    """The Debian rootfs with systemd (built by setup-lxc.sh --rootfs when it is missing)."""
    path = systemd_rootfs()
    if not os.path.isfile(os.path.join(path, ".gpusim-complete")):
        r = subprocess.run(["bash", SETUP, "--rootfs"], capture_output=True, text=True, check=False)
        if r.returncode != 0 or not os.path.isfile(os.path.join(path, ".gpusim-complete")):
            from .container import ContainerError  # noqa: PLC0415
            raise ContainerError(f"no Debian rootfs with systemd at {path}: {SETUP} --rootfs failed "
                                 f"(exit {r.returncode}): {(r.stderr or r.stdout).strip()[-1500:]}")
    return path


def busybox() -> str:
    for p in ("/bin/busybox", "/usr/bin/busybox"):
        if os.path.isfile(p):
            return p
    p = shutil.which("busybox")
    if not p:
        from .container import ContainerError  # noqa: PLC0415
        raise ContainerError(f"busybox is not installed: run {SETUP} (make sim installs busybox-static)")
    return p


def make_busybox_rootfs(path: str, users=None) -> None:
    """A busybox root filesystem in ``path`` (idempotent); ``users``: {name: uid} of its own /etc/passwd and
    /etc/group (each user's group has its uid as gid)."""
    if os.path.isfile(os.path.join(path, "bin", "busybox")):
        return
    src = busybox()
    tmp = f"{path}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for d in ("bin", "sbin", "etc", "proc", "sys", "dev", "tmp", "run", "root", "usr", "var/log"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    os.chmod(os.path.join(tmp, "tmp"), 0o1777)
    shutil.copy2(src, os.path.join(tmp, "bin", "busybox"))
    applets = subprocess.run([src, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for a in applets:
        link = os.path.join(tmp, "bin", a)
        if not os.path.lexists(link):
            os.symlink("busybox", link)
    os.symlink("../bin/busybox", os.path.join(tmp, "sbin", "init"))
    # Debian's merged /usr: the libraries are under the bound /usr.
    for name in ("lib", "lib64"):
        os.symlink(f"usr/{name}", os.path.join(tmp, name))
    extra = sorted((users or {}).items(), key=lambda item: item[1])
    files = {
        "etc/inittab": INITTAB,
        "etc/passwd": "root:x:0:0:root:/root:/bin/sh\n" + "".join(f"{n}:x:{u}:{u}::/tmp:/bin/sh\n" for n, u in extra)
                      + "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        "etc/group": "root:x:0:\n" + "".join(f"{n}:x:{u}:\n" for n, u in extra) + "nogroup:x:65534:\n",
        "etc/os-release": 'PRETTY_NAME="gpusim busybox container"\nID=busybox\n',
    }
    for rel, text in files.items():
        with open(os.path.join(tmp, rel), "w", encoding="utf-8") as f:
            f.write(text)
    os.replace(tmp, path)
