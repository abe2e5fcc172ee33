"""Every module and gpuops.gpu.predeploy over real SSH, as a non-root user with become (sudo), with
pipelining on and off, against the simulator: the results are those of the local connection. Without
become, gpu_release fails naming root and become (no traceback), gpu_facts warns that holders are
incomplete, and predeploy fails at the fence at once (not after the wait's timeout).

The fixture ``sshd`` (one per test module, so one per pytest-xdist worker; tests/gpusim/gpusimkit/sshd.py
does the work, benchmarks/bench_e2e.py uses it too) sets up, and tears down afterwards: a private sshd
(Debian's openssh-server; .ci/sshd_prereqs.sh installs it and sudo when missing) on a loopback address
127.0.0.x with its own config and host key in a temp dir; a non-root user with a unique name, a key
in that dir, and passwordless sudo (a file in /etc/sudoers.d). It needs root (it adds a user), as the
rest of the simulator does.

What stands for the node's software: the simulator's tools (nvidia-smi, pct, systemctl) and its NVML
library are on PATH and LD_LIBRARY_PATH of the module's interpreter, a small script ``sim_python``
writes (sudo's secure_path and env_reset would drop them otherwise: on a real node they are installed
system-wide). The interpreter is one every user may run (the controller's Python lives under /root);
the NVML bindings (pynvml, one pure-Python file) are copied next to it.
"""

import json
import os
import re
import secrets
import shlex
import subprocess
import sys

import modrun
import pytest
from gpusimkit import SshdError, throwaway_sshd, world_runnable

# vmids of this file's own, one per test (pytest-xdist runs tests in parallel; cgroups under lxc/ are machine-wide).
VMIDS = {"modules": 5301, "predeploy": 5303, "no-become-pipelining": 5305, "no-become-no-pipelining": 5307,
         "no-become-predeploy": 5309}
SERVER = "python3 -m sglang.launch_server --tp 2"


@pytest.fixture(scope="module")
def sshd():
    """The throwaway sshd of gpusimkit.sshd with a plain user (passwordless sudo), torn down after the module."""
    try:
        with throwaway_sshd(plain_user=True) as s:
            yield s
    except SshdError as e:
        pytest.fail(str(e), pytrace=False)


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
    env = dict(modrun.controller_env(collection, tmp_path), ANSIBLE_DEPRECATION_WARNINGS="0")
    for name in ("GPUSIM_DIR", "LD_LIBRARY_PATH"):
        env.pop(name, None)  # the modules get the simulator's environment from their interpreter only
    return env


def ansible_playbook(collection, tmp_path, playbook, inv, *args, timeout=300):
    return modrun.run_playbook(controller_env(collection, tmp_path), tmp_path, playbook, inv, *args, timeout=timeout)


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


HOLDER_EVIDENCE = {"context", "device", "control", "lingering"}


def normalize(value):
    if isinstance(value, dict):
        if value and all(isinstance(k, str) and k.isdigit() for k in value):
            # holder_processes, keyed by pid: its entries, in an order that does not depend on the pids
            return sorted((normalize(v) for v in value.values()), key=repr)
        if set(value) == HOLDER_EVIDENCE:
            return {k: len(v) for k, v in sorted(value.items())}  # a GPU's holders: pids by evidence, counted
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
                   for h in got["facts"]["ansible_facts"]["gpu_holder_processes"].values()), connection
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
    assert out.count("no lock against another release") <= 1, out[-3000:]  # not one per lock file (issue 33, item 6)
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
    assert "the fence before the wait failed" in fatal[0], out[-4000:]  # the fence's failure, not the wait's
    assert recap(out, "gpu-ct")["failed"] == 1
    assert alive(server)
    assert sshd.leftovers() == []
