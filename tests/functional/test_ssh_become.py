"""Every module and gpuops.gpu.predeploy over real SSH, as a non-root user with become (sudo), with
pipelining on and off, against the simulator: the results are those of the local connection. Without
become, gpu_release fails naming root and become (no traceback), gpu_facts warns that holders are
incomplete, and predeploy fails at the fence at once (not after the wait's timeout).

The fixture ``sshd`` (one per test module, so one per pytest-xdist worker) sets up, and tears down
afterwards: a private sshd (Debian's openssh-server; .ci/sshd_prereqs.sh installs it and sudo when
missing) on a loopback address 127.0.0.x with its own config and host key in a temp dir; a non-root
user with a unique name, a key in that dir, and passwordless sudo (a file in /etc/sudoers.d). It needs
root (it adds a user), as the rest of the simulator does.

What stands for the node's software: the simulator's tools (nvidia-smi, pct, systemctl) and its NVML
library are on PATH and LD_LIBRARY_PATH of the module's interpreter, a small script ``sim_python``
writes (sudo's secure_path and env_reset would drop them otherwise: on a real node they are installed
system-wide). The interpreter is one every user may run (the controller's Python lives under /root);
the NVML bindings (pynvml, one pure-Python file) are copied next to it.
"""

import contextlib
import importlib.util
import json
import os
import pathlib
import pwd
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

import pytest

SSHD = "/usr/sbin/sshd"
SBIN = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
SHARED_PYTHONS = ["/usr/bin/python3", "/usr/local/bin/python3"]
# vmids of this file's own, one per test (pytest-xdist runs tests in parallel; cgroups under lxc/ are machine-wide).
VMIDS = {"modules": 5301, "predeploy": 5303, "no-become-pipelining": 5305, "no-become-no-pipelining": 5307,
         "no-become-predeploy": 5309}
SERVER = "python3 -m sglang.launch_server --tp 2"


def tool(name):
    path = shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))
    if not path:
        pytest.fail(f"{name} not found: run .ci/sshd_prereqs.sh (make simtests does) to install openssh-server"
                    " and sudo", pytrace=False)
    return path


def run(argv, **kwargs):
    kwargs.setdefault("timeout", 60)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(shlex.quote, argv))}: rc {proc.returncode}: {proc.stdout}{proc.stderr}")
    return proc


def world_runnable(path):
    """Whether a user who is not the owner may run ``path``: o+x on it and on every directory above it."""
    path = os.path.realpath(path)
    try:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(path)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == "/":
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


def shared_python():
    for candidate in [sys.executable] + SHARED_PYTHONS:
        if candidate and world_runnable(candidate):
            version = run([candidate, "-c", "import sys; print(sys.version_info >= (3, 9))"]).stdout.strip()
            if version == "True":
                return candidate
    pytest.fail("no Python 3.9+ that a non-root user may run (looked at the controller's and " + ", ".join(SHARED_PYTHONS)
                + "): install Debian's python3", pytrace=False)
    return None


def free_port(address):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def wait_listening(address, port, proc, log, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"sshd did not listen on {address}:{port} within {timeout} s")


def uid_pids(uid):
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid == uid:
                    pids.append(int(name))
    return pids


class Sshd:
    """What the fixture set up: the daemon's address, the user, its key, home and sudo."""

    def __init__(self, root):
        self.root = root
        self.address = f"127.0.0.{2 + secrets.randbelow(250)}"
        self.port = None
        self.user = "gpuops" + secrets.token_hex(4)
        self.uid = None
        self.home = os.path.join(root, "home")
        self.key = os.path.join(root, "id_ed25519")
        self.sudoers = f"/etc/sudoers.d/{self.user}"
        self.python = None
        self.pylib = os.path.join(root, "pylib")
        self.proc = None
        self.log = None

    def vars(self, pipelining):
        """Inventory variables that reach the node over this sshd as the plain user."""
        return {
            "ansible_connection": "ssh", "ansible_host": self.address, "ansible_port": self.port,
            "ansible_user": self.user, "ansible_ssh_private_key_file": self.key, "ansible_pipelining": pipelining,
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
            "ansible_ssh_args": f"-o ControlMaster=auto -o ControlPersist=30s -o ControlPath={self.root}/cp-%C",
        }

    def leftovers(self):
        """Files the runs left in the user's remote tmp (Ansible removes its own)."""
        tmp = os.path.join(self.home, ".ansible", "tmp")
        return sorted(os.listdir(tmp)) if os.path.isdir(tmp) else []


@pytest.fixture(scope="module")
def sshd():
    if os.geteuid() != 0:
        pytest.fail("the real-SSH tests need root: they add a user, a sudoers file and start an sshd", pytrace=False)
    for name in ("sshd", "ssh", "ssh-keygen", "sudo", "visudo", "useradd", "userdel"):
        tool(name)
    root = tempfile.mkdtemp(prefix="gpuops-sshd-")
    os.chmod(root, 0o755)  # the user reaches its home and the interpreter below it
    s = Sshd(root)
    added = False
    try:
        s.python = shared_python()
        os.makedirs(s.pylib)
        spec = importlib.util.find_spec("pynvml")
        if spec and spec.origin:
            shutil.copy(spec.origin, s.pylib)
        run([tool("useradd"), "--home-dir", s.home, "--create-home", "--shell", "/bin/sh", "--user-group",
             "--password", "*", s.user])
        added = True
        s.uid = pwd.getpwnam(s.user).pw_uid
        run([tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-C", s.user, "-f", s.key])
        run([tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(root, "ssh_host_ed25519_key")])
        shutil.copy(s.key + ".pub", os.path.join(root, "authorized_keys"))
        sudoers_tmp = os.path.join(root, "sudoers")
        with open(sudoers_tmp, "w", encoding="utf-8") as f:
            f.write(f"{s.user} ALL=(ALL:ALL) NOPASSWD: ALL\n")
        os.chmod(sudoers_tmp, 0o440)
        run([tool("visudo"), "-c", "-q", "-f", sudoers_tmp])
        shutil.copy(sudoers_tmp, s.sudoers)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        s.port = free_port(s.address)
        config = os.path.join(root, "sshd_config")
        with open(config, "w", encoding="utf-8") as f:
            f.write(f"""ListenAddress {s.address}:{s.port}
HostKey {root}/ssh_host_ed25519_key
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
AllowUsers {s.user}
PermitRootLogin no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 64:30:128
MaxSessions 64
Subsystem sftp internal-sftp
LogLevel VERBOSE
""")
        run([SSHD, "-t", "-f", config])
        s.log = pathlib.Path(root, "sshd.log")
        with open(s.log, "ab") as logf:
            s.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", config], stdin=subprocess.DEVNULL, stdout=logf,
                                      stderr=logf, start_new_session=True)
        wait_listening(s.address, s.port, s.proc, s.log)
        yield s
    finally:
        _teardown(s, added)


def _teardown(s, added):
    for control in [p for p in os.listdir(s.root) if p.startswith("cp-")]:
        with contextlib.suppress(Exception):
            subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={os.path.join(s.root, control)}", "x"],
                           capture_output=True, timeout=10, check=False)
    if s.proc is not None:
        s.proc.terminate()
        try:
            s.proc.wait(10)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait()
    if s.uid is not None:
        # The user's sessions (sshd's per-connection children run as the user): by pid, this user only.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = uid_pids(s.uid)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 5
            while uid_pids(s.uid) and time.monotonic() < deadline:
                time.sleep(0.05)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(s.sudoers)
    if added:
        subprocess.run([tool("userdel"), s.user], capture_output=True, timeout=30, check=False)
    shutil.rmtree(s.root, ignore_errors=True)
    problems = []
    if s.uid is not None and uid_pids(s.uid):
        problems.append(f"processes of {s.user} left: {uid_pids(s.uid)}")
    with contextlib.suppress(KeyError):
        pwd.getpwnam(s.user)
        problems.append(f"user {s.user} left")
    if os.path.exists(s.sudoers):
        problems.append(f"{s.sudoers} left")
    if problems:
        pytest.fail("sshd teardown: " + "; ".join(problems), pytrace=False)


# --- the simulator, as the node's software ------------------------------------------------------------
def sim_python(host, s):
    """An interpreter for the modules on the simulated node: the shared Python with the simulator's
    environment (its tools first on PATH, its NVML library) and pynvml; any user may run it. The
    simulator's directory and tools are made reachable for the plain user too."""
    base = os.path.dirname(host.dir)
    if os.stat(base).st_uid == os.geteuid():
        os.chmod(base, 0o755)  # gpusim_factory's mkdtemp (0700): the plain user reads the scenario
    # The simulator's tools were written for the controller's Python (under /root): run them with the shared one.
    for sub in ("bin", "ctbin"):
        for name in os.listdir(host.path(sub)):
            path = host.path(sub, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            first, _nl, rest = text.partition("\n")
            if first.startswith("#!") and not world_runnable(first[2:].strip()):
                with open(path, "w", encoding="utf-8") as f:
                    f.write(f"#!{s.python}\n{rest}")
    env = dict(host.env_vars())
    env["PYTHONPATH"] = s.pylib
    env["PATH"] = os.pathsep.join([host.path("bin"), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin",
                                   "/sbin", "/bin"])
    path = os.path.join(s.root, f"python-{os.path.basename(host.dir)}-{secrets.token_hex(3)}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\n" + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
                + f"exec {shlex.quote(s.python)} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def controller_env(collection, tmp_path):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=collection, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_HOME=str(tmp_path / "ansible-home"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_RETRY_FILES_ENABLED="0", ANSIBLE_HOST_KEY_CHECKING="0", ANSIBLE_DEPRECATION_WARNINGS="0")
    for name in ("GPUSIM_DIR", "LD_LIBRARY_PATH"):
        env.pop(name, None)  # the modules get the simulator's environment from their interpreter only
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    return env


def ansible_playbook(collection, tmp_path, playbook, inv, *args, timeout=300):
    """(rc, output, seconds) of one ansible-playbook run; past ``timeout`` its process group is killed
    and the test fails with what it printed."""
    tag = secrets.token_hex(3)
    inv_path = tmp_path / f"inventory-{tag}.json"
    inv_path.write_text(json.dumps(inv))
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), playbook, "-i", str(inv_path), *args]
    t0 = time.monotonic()
    with subprocess.Popen(argv, env=controller_env(collection, tmp_path), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as proc:
        try:
            out, _err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _err = proc.communicate()
            pytest.fail(f"ansible-playbook {playbook} still ran after {timeout} s:\n{out[-4000:]}", pytrace=False)
    return proc.returncode, out, time.monotonic() - t0


CONNECTIONS = {
    "local": None,
    "ssh -b, pipelining": True,
    "ssh -b, no pipelining": False,
}


def node_vars(s, python, connection):
    if CONNECTIONS[connection] is None:
        return {"ansible_connection": "local", "ansible_python_interpreter": python}
    return dict(s.vars(CONNECTIONS[connection]), ansible_python_interpreter=python)


# --- every module -------------------------------------------------------------------------------------
MODULES_PLAY = """
- name: Every module on the node
  hosts: pve
  gather_facts: false
  vars:
    devices: ["{devdir}/nvidia*"]
  tasks:
    - name: Containers with GPUs
      gpuops.gpu.proxmox_gpu_containers:
      register: cts
    - name: Facts
      gpuops.gpu.gpu_facts:
        device_files: "{{{{ devices }}}}"
      register: facts
    - name: Release the container's GPU work
      gpuops.gpu.gpu_release:
        containers: [{vmid}]
        device_files: "{{{{ devices }}}}"
        grace_period: 5
      register: release
    - name: Wait until idle
      gpuops.gpu.gpu_wait_idle:
        device_files: "{{{{ devices }}}}"
        timeout: 30
      register: wait
    - name: Facts after
      gpuops.gpu.gpu_facts:
        device_files: "{{{{ devices }}}}"
      register: after
    - name: Keep the results on the controller
      ansible.builtin.copy:
        content: "{{{{ dict(cts=cts, facts=facts, release=release, wait=wait, after=after) | to_json }}}}"
        dest: "{out}"
        mode: "0600"
      delegate_to: localhost
      vars:
        ansible_connection: local
        ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
"""

# Values that differ from run to run whatever the connection: the processes are new each time.
VOLATILE_KEYS = {"pid", "ppid", "pids", "start_time", "elapsed", "seconds", "pid_in_container", "invocation",
                 "blockers", "lingering", "ns_pid", "session", "pgrp", "tty_nr", "waited", "polls", "attempts",
                 "timestamp", "uptime", "time", "via"}


def normalize(value):
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in sorted(value.items()) if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, str):
        return re.sub(r"\b(pid|pids|PID) [\d, ]+\d", r"\1 N", re.sub(r"\d+(\.\d+)? s\b", "T s", value))
    return value


def project(got):
    """What must not depend on the connection. A release is compared by what it released (which worker
    its parent's SIGTERM took along before its own signal came is a race of every run)."""
    release = got["release"]
    return {
        "cts": normalize(got["cts"]),
        "facts": normalize(got["facts"]),
        "release": {
            "changed": release["changed"], "failed": release.get("failed", False),
            "released": sorted((r.get("name"), (r.get("container") or {}).get("id")) for r in release["released"]),
            "survivors": release["survivors"], "respawned": release["respawned"],
            "stopped_units": normalize(release["stopped_units"]), "protected": normalize(release["protected"]),
            "gpus_after": normalize(release["gpus"]),
        },
        "wait": normalize(got["wait"]),
        "after": normalize(got["after"]),
    }


def first_difference(a, b, where="$"):
    if type(a) is not type(b):
        return f"{where}: {a!r} != {b!r}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{where}.{k}: only in {'the first' if k in a else 'the second'}"
            diff = first_difference(a[k], b[k], f"{where}.{k}")
            if diff:
                return diff
        return ""
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            diff = first_difference(x, y, f"{where}[{i}]")
            if diff:
                return diff
        return ""
    return "" if a == b else f"{where}: {a!r} != {b!r}"


def alive(pid):
    return os.path.exists(f"/proc/{pid}")


def test_every_module_over_ssh_with_become_gives_the_local_results(gpusim, collection, tmp_path, sshd):
    host = gpusim
    vmid = VMIDS["modules"]
    host.ct_create(vmid, hostname="gpu-ct", gpus="0-1")
    host.ct_start(vmid)
    python = sim_python(host, sshd)
    results = {}
    for connection in CONNECTIONS:
        server = host.hold(gpus="0-1", mib=4096, ct=vmid, tree=True, name=SERVER)
        out = tmp_path / f"results-{len(results)}.json"
        play = tmp_path / f"modules-{len(results)}.yml"
        play.write_text(MODULES_PLAY.format(devdir=host.path("dev"), vmid=vmid, out=out))
        inv = {"all": {"hosts": {"pve": node_vars(sshd, python, connection)}}}
        become = [] if connection == "local" else ["-b"]
        rc, log, _took = ansible_playbook(collection, tmp_path, str(play), inv, *become)
        assert rc == 0, f"{connection}:\n{log[-5000:]}"
        assert not alive(server), f"{connection}: the server survived"
        got = json.loads(out.read_text())
        assert got["release"]["released"], f"{connection}: {got['release']}"
        assert any(h.get("container") and h["container"]["id"] == vmid
                   for g in got["facts"]["ansible_facts"]["gpu_devices"] for h in g["holders"]), connection
        results[connection] = project(got)
    for connection in CONNECTIONS:
        assert first_difference(results["local"], results[connection]) == "", connection
    assert sshd.leftovers() == []


# --- predeploy ----------------------------------------------------------------------------------------
def predeploy_inventory(host, node, vmid):
    """The README's inventory: the node (reachable) and the GPU host, which predeploy never contacts (it
    points at a closed port here)."""
    unreachable = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9,
                   "ansible_ssh_common_args": "-o ConnectTimeout=3"}
    return {"all": {
        "vars": {"gpuops_device_files": [host.path("dev") + "/nvidia*"]},
        "children": {"proxmox_nodes": {"hosts": {"pve": node}},
                     "gpu_hosts": {"hosts": {"gpu-ct": dict(unreachable, proxmox_node="pve", proxmox_vmid=vmid)}}},
    }}


def recap(out, name):
    m = re.search(rf"^{re.escape(name)}\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+"
                  rf"skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)", out, re.M)
    assert m, out[-3000:]
    return dict(zip(("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored"), map(int, m.groups())))


def fence_summary(out):
    lines = [line for line in out.splitlines() if "fenced CT" in line]
    return normalize(lines[0].strip()) if lines else None


def test_predeploy_over_ssh_with_become_gives_the_local_result(gpusim, collection, tmp_path, sshd):
    host = gpusim
    vmid = VMIDS["predeploy"]
    host.ct_create(vmid, hostname="gpu-ct", gpus="0-3", systemd=True)
    host.ct_start(vmid)
    python = sim_python(host, sshd)
    seen = {}
    for connection in CONNECTIONS:
        server = host.hold(gpus="0-3", mib=8192, ct=vmid, tree=True, respawn=True, service="sglang", name=SERVER)
        inv = predeploy_inventory(host, node_vars(sshd, python, connection), vmid)
        become = [] if connection == "local" else ["-b"]
        rc, out, took = ansible_playbook(collection, tmp_path, "gpuops.gpu.predeploy", inv, *become,
                                         "-e", "gpu_idle_timeout=60")
        assert rc == 0, f"{connection}:\n{out[-5000:]}"
        assert not alive(server), connection
        assert f"stopped sglang.service in CT {vmid}" in out, out[-3000:]
        seen[connection] = (recap(out, "gpu-ct"), recap(out, "pve"), fence_summary(out))
        assert took < 60, f"{connection}: {took:.1f} s"
    for connection in CONNECTIONS:
        assert seen[connection] == seen["local"], connection
    assert sshd.leftovers() == []


# --- without become -----------------------------------------------------------------------------------
def adhoc(collection, tmp_path, inv, module, args):
    """One module run with the `ansible` command: (its result, everything it printed, warnings included)."""
    inv_path = tmp_path / f"adhoc-{secrets.token_hex(3)}.json"
    inv_path.write_text(json.dumps(inv))
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible"), "pve", "-i", str(inv_path),
            "-m", module, "-a", json.dumps(args)]
    proc = subprocess.run(argv, env=controller_env(collection, tmp_path), capture_output=True, text=True,
                          timeout=120, check=False)
    m = re.search(r"^pve \| [A-Z]+!? => ", proc.stdout, re.M)
    assert m, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.JSONDecoder().raw_decode(proc.stdout[m.end():])[0], proc.stdout + proc.stderr


def plain_user_node(host, s, vmid, pipelining):
    """A container with a GPU server (root's processes), and the node as the plain user sees it."""
    host.ct_create(vmid, hostname="gpu-ct", gpus="0-1")
    host.ct_start(vmid)
    python = sim_python(host, s)
    server = host.hold(gpus="0-1", mib=4096, ct=vmid, tree=True, name=SERVER)
    return server, dict(s.vars(pipelining), ansible_python_interpreter=python)


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelining", "no pipelining"])
def test_without_become_gpu_facts_warns_and_gpu_release_fails_naming_root(gpusim, collection, tmp_path, sshd,
                                                                          pipelining):
    host = gpusim
    vmid = VMIDS["no-become-" + ("pipelining" if pipelining else "no-pipelining")]
    server, node = plain_user_node(host, sshd, vmid, pipelining)
    inv = {"all": {"hosts": {"pve": node}}}
    devices = [host.path("dev") + "/nvidia*"]

    # gpu_facts: the facts, and a warning that holders are incomplete
    res, out = adhoc(collection, tmp_path, inv, "gpuops.gpu.gpu_facts", {"device_files": devices})
    assert "pve | SUCCESS =>" in out and res["ansible_facts"]["gpu_count"] == 8, out[-3000:]
    warnings = " ".join(" ".join(line.split()) for line in re.findall(r"\[WARNING\]: (.*(?:\n(?!\S).*)*)", out))
    assert "could not read the file descriptors" in warnings and "holders are incomplete" in warnings, out[-3000:]
    assert f"runs as {sshd.user}" in warnings and "become" in warnings, warnings

    # gpu_release: fails naming root and become, before it signals anything; no traceback
    res, out = adhoc(collection, tmp_path, inv, "gpuops.gpu.gpu_release",
                     {"containers": [vmid], "device_files": devices, "grace_period": 5})
    assert "pve | FAILED! =>" in out, out[-3000:]
    assert "Traceback" not in out and "MODULE FAILURE" not in out and "module_stderr" not in res, out[-3000:]
    assert "not as root" in res["msg"] and "become: true" in res["msg"], res["msg"]
    assert res.get("error") == "not_permitted", res  # the module's own failure (fail_json), not an exception
    assert alive(server)
    assert sshd.leftovers() == []


def test_without_become_predeploy_fails_at_the_fence_naming_root(gpusim, collection, tmp_path, sshd):
    """Not after the wait's timeout (300 s here): the fence fails at once, with the message."""
    host = gpusim
    server, node = plain_user_node(host, sshd, VMIDS["no-become-predeploy"], True)
    rc, out, took = ansible_playbook(collection, tmp_path, "gpuops.gpu.predeploy",
                                     predeploy_inventory(host, node, VMIDS["no-become-predeploy"]),
                                     "-e", "gpu_idle_timeout=300", timeout=120)
    assert rc != 0
    assert took < 60, f"it waited for the GPUs: {took:.1f} s\n{out[-3000:]}"
    fatal = [line for line in out.splitlines() if line.startswith("fatal: ")]
    assert len(fatal) == 1 and "root" in fatal[0] and "become" in fatal[0], out[-4000:]
    assert "proxmox_fence" in out[:out.index(fatal[0])].rsplit("TASK [", 1)[-1], out[-4000:]  # the fence's task
    assert recap(out, "gpu-ct")["failed"] == 1
    assert alive(server)
    assert sshd.leftovers() == []
