"""gpuops.gpu.predeploy as users run it (ansible-playbook, the README's inventory shape) on the
simulated Proxmox VE node: under --limit, with a supervised service nobody named, with two
tenants on one node, in check mode, on a failure and with a node that cannot be reached.

Every workload is the simulator's (started by this test); the unreachable node is a closed port
on loopback. vmids from 5129 up (see the fixture vmids) keep clear of the other suites (cgroups under lxc/ are machine-wide).
"""

import json
import os
import re
import sys
import time

import pytest

import modrun


@pytest.fixture
def vmids(request):
    """Two vmids of this test's own: pytest-xdist runs the tests of this file in parallel, and the
    simulator's containers are cgroups under lxc/<vmid>, shared by the whole machine."""
    names = [item.name for item in request.session.items if item.fspath == request.node.fspath]
    base = 5129 + 2 * names.index(request.node.name)
    return base, base + 1


def inventory(host, gpu_hosts, node_vars=None, extra_nodes=None):
    nodes = {"pve": dict(node_vars or {})}
    nodes.update(extra_nodes or {})
    return {"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "gpuops_device_files": [host.dir + "/dev/nvidia*"]},
        "children": {"proxmox_nodes": {"hosts": nodes}, "gpu_hosts": {"hosts": gpu_hosts}},
    }}


def playbook(host, collection, tmp_path, inv, *args, timeout=240):
    return modrun.run_playbook(modrun.controller_env(collection, tmp_path, host.env()), tmp_path, "gpuops.gpu.predeploy",
                               inv, *args, timeout=timeout)


def recap(out, name):
    m = re.search(rf"^{re.escape(name)}\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+"
                  rf"skipped=(\d+)\s+rescued=(\d+)", out, re.M)
    assert m, out[-3000:]
    return dict(zip(("ok", "changed", "unreachable", "failed", "skipped", "rescued"), map(int, m.groups())))


def alive(pid):
    return os.path.exists(f"/proc/{pid}")


def test_limit_to_the_gpu_host_fences_its_container_and_a_supervised_unit_stays_down(gpusim, collection, tmp_path, vmids):
    """--limit gpu-ct (the node is not in the play) and proxmox_fence_services empty: the fence runs on
    the node anyway, gpu_release stops the server's unit, and the run is ready."""
    ct_a = vmids[0]
    host = gpusim
    host.fault(release_lag_ms=300)
    host.ct_create(ct_a, hostname="gpu-ct", systemd=True)
    host.ct_start(ct_a)
    server = host.hold(gpus="0-7", mib=8192, ct=ct_a, tree=True, respawn=True, service="sglang")
    inv = inventory(host, {"gpu-ct": {"proxmox_node": "pve", "proxmox_vmid": ct_a, "gpu_idle_expected_count": 8}})
    rc, out, took = playbook(host, collection, tmp_path, inv, "--limit", "gpu-ct")
    assert rc == 0, out[-4000:]
    assert took < 60, out[-2000:]
    assert recap(out, "gpu-ct")["failed"] == 0
    assert f"stopped sglang.service in CT {ct_a}" in out, out[-3000:]
    assert not alive(server)
    time.sleep(1.5)  # the supervisor would have restarted it by now
    state = host.systemctl("is-active", "sglang", ct=ct_a).stdout.strip()
    assert state in ("inactive", "failed"), state
    assert [g["memory_used_mib"] for g in host.status()["gpus"]] == [0] * 8


def test_two_tenants_on_one_node_each_waits_on_its_own_gpus(gpusim, collection, tmp_path, vmids):
    """CT A has GPUs 0-3, CT B GPUs 4-7: fencing and waiting for A leaves B's job running, and B's
    busy GPUs do not fail A."""
    ct_a, ct_b = vmids
    host = gpusim
    host.fault(release_lag_ms=300)
    host.ct_create(ct_a, hostname="tenant-a", gpus="0-3")
    host.ct_create(ct_b, "tenant-b", "4-7", devices_style="dev")
    host.ct_start(ct_a)
    host.ct_start(ct_b)
    a = host.hold(gpus="0-3", mib=4096, ct=ct_a, tree=True, name="python3 -m vllm.entrypoints.api_server")
    b = host.hold(gpus="4-7", mib=4096, ct=ct_b, tree=True, name="python3 train.py")
    inv = inventory(host, {"tenant-a": {"proxmox_node": "pve", "proxmox_vmid": ct_a},
                           "tenant-b": {"proxmox_node": "pve", "proxmox_vmid": ct_b}})
    rc, out, _took = playbook(host, collection, tmp_path, inv, "--limit", "tenant-a", "-e", "gpu_idle_timeout=20")
    assert rc == 0, out[-4000:]
    assert not alive(a)
    assert alive(b), "the other tenant's job was signalled"
    # the table of tenant-a shows its four GPUs only
    assert re.search(r"GPUs before -> after - tenant-a: 4 GPU\(s\), seen from pve", out), out[-3000:]


def test_check_mode_reports_changed_where_a_real_run_changes_and_stops_nothing(gpusim, collection, tmp_path, vmids):
    ct_a = vmids[0]
    host = gpusim
    host.ct_create(ct_a, hostname="gpu-ct", systemd=True)
    host.ct_start(ct_a)
    server = host.hold(gpus="0-7", mib=8192, ct=ct_a, tree=True, respawn=True, service="sglang")
    inv = inventory(host, {"gpu-ct": {"proxmox_node": "pve", "proxmox_vmid": ct_a}})
    rc, out, _took = playbook(host, collection, tmp_path, inv, "--check")
    assert rc == 0, out[-4000:]
    assert alive(server)
    r = recap(out, "gpu-ct")
    assert r["changed"] >= 1 and r["failed"] == 0, out[-3000:]
    assert f"Check mode, nothing was stopped - would have: fenced CT {ct_a}" in out
    # a real run changes, a second real run does not
    rc, out, _took = playbook(host, collection, tmp_path, inv)
    assert rc == 0 and not alive(server), out[-4000:]
    rc, out, _took = playbook(host, collection, tmp_path, inv, "--check")
    assert rc == 0 and recap(out, "gpu-ct")["changed"] == 0, out[-4000:]


def test_a_failure_prints_one_small_error(gpusim, collection, tmp_path, vmids):
    """A job on the host holds GPU 0 (outside the container's scope): the wait times out and the play
    fails once, with the diagnosis and a line per busy GPU, no snapshot and no command lines."""
    ct_a = vmids[0]
    host = gpusim
    host.ct_create(ct_a, hostname="gpu-ct", gpus="0-1")
    host.ct_start(ct_a)
    outsider = host.hold(gpus=[0], mib=2048, name="python3 secret-job.py --token=hunter2")
    inv = inventory(host, {"gpu-ct": {"proxmox_node": "pve", "proxmox_vmid": ct_a, "gpu_idle_timeout": 2}})
    rc, out, _took = playbook(host, collection, tmp_path, inv)
    assert rc != 0
    assert alive(outsider)
    r = recap(out, "gpu-ct")
    assert r["failed"] == 1 and r["rescued"] == 0, out[-3000:]
    fatal = [line for line in out.splitlines() if line.startswith("fatal: ")]
    assert len(fatal) == 1, out[-4000:]
    assert "timed out after 2 s: GPU 0 is used by pid %d" % outsider in fatal[0]
    # named as outside the fence, with its (redacted) command line and what to do
    assert f"Pid {outsider} python3 holds GPU 0 and is outside the fence (CT {ct_a}), so it was not stopped:" \
        " python3 - secret-job.py --token=" in fatal[0], fatal[0]
    # a process on the node itself: advice for the node, not "fence its container too" (issue 33, item 4)
    assert f"it runs on the node itself, in no container: stop it on the node (`kill {outsider}`)" in fatal[0], fatal[0]
    assert "fence its container" not in fatal[0]
    assert "GPU 0: pid %d" % outsider in fatal[0]
    assert "hunter2" not in out and "cmdline" not in fatal[0]
    assert len(fatal[0]) < 1500, fatal[0]


def test_a_node_that_cannot_be_reached_fails_its_gpu_host_at_once(gpusim, collection, tmp_path, vmids):
    ct_a = vmids[0]
    host = gpusim
    inv = inventory(host, {"gpu-ct": {"proxmox_node": "pve-down", "proxmox_vmid": ct_a}},
                    extra_nodes={"pve-down": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1",
                                              "ansible_port": 9, "ansible_ssh_common_args": "-o ConnectTimeout=3"}})
    rc, out, took = playbook(host, collection, tmp_path, inv, "--limit", "gpu-ct", "-e", "gpu_idle_timeout=300")
    assert rc != 0
    assert took < 60, "it waited for a server that nobody stopped"
    # The node's connection failed inside the one task: a result with its reason (rc 2), not a lost host.
    assert rc == 2 and recap(out, "gpu-ct")["failed"] == 1, out[-3000:]
    assert "pve-down could not be reached" in out and re.search(r"(?i)connect", out)


@pytest.mark.parametrize("serial", ["1", "50%"])
def test_rolling_runs_with_predeploy_serial(gpusim, collection, tmp_path, vmids, serial):
    ct_a, ct_b = vmids
    host = gpusim
    host.ct_create(ct_a, hostname="tenant-a", gpus="0-3")
    host.ct_create(ct_b, hostname="tenant-b", gpus="4-7")
    host.ct_start(ct_a)
    host.ct_start(ct_b)
    inv = inventory(host, {"tenant-a": {"proxmox_node": "pve", "proxmox_vmid": ct_a},
                           "tenant-b": {"proxmox_node": "pve", "proxmox_vmid": ct_b}})
    rc, out, _took = playbook(host, collection, tmp_path, inv, "-e", f"predeploy_serial={serial}")
    assert rc == 0, out[-3000:]
    # one batch per host: the wait play starts twice
    assert out.count("PLAY [Fence and wait for each GPU host]") == 2, out[-3000:]


def test_a_stopped_container_waits_on_the_gpus_of_its_config_only(gpusim, collection, tmp_path, vmids):
    """CT A (GPUs 0-1) is stopped; CT B runs a job on GPU 5: the fence has nothing to stop, and the wait
    covers GPUs 0 and 1 (A's config), not every GPU of the node - B's job neither fails it nor is touched."""
    ct_a, ct_b = vmids
    host = gpusim
    host.ct_create(ct_a, hostname="gpu-ct", gpus="0-1")
    host.ct_create(ct_b, hostname="other", gpus="5")
    host.ct_start(ct_b)
    job = host.hold(gpus=[5], mib=4096, ct=ct_b, name="python3 train.py")
    inv = inventory(host, {"gpu-ct": {"proxmox_node": "pve", "proxmox_vmid": ct_a, "gpu_idle_timeout": 5}})
    rc, out, _took = playbook(host, collection, tmp_path, inv, "--limit", "gpu-ct")
    assert rc == 0, out[-4000:]
    assert alive(job)
    # the table of the wait: GPUs 0 and 1 (the config of the stopped container), not GPU 5
    shown = re.findall(r'^GPU (\d+)  NVIDIA', out, re.M)
    assert sorted(set(shown)) == ["0", "1"], out[-3000:]
    assert f"skipped CT {ct_a} (stopped)" in out, out[-3000:]


def test_a_frozen_container_fails_the_fence_and_is_never_ready(gpusim, collection, tmp_path, vmids):
    """Issue 29, item 2: CT A frozen (a suspend-mode backup, lxc-freeze) with a Restart=always server: the fence
    fails at once with the reason and signals nothing, so the run is not ready (before: the unit stop gave up,
    the server was killed, the run was ready, and systemd had the server back 2 s after the thaw)."""
    ct_a = vmids[0]
    host = gpusim
    host.ct_create(ct_a, hostname="gpu-ct", systemd=True)
    host.ct_start(ct_a)
    server = host.hold(gpus="0-1", mib=8192, ct=ct_a, respawn=True, service="sglang", exit_delay=0.5)
    freeze = next((p for p in (f"/sys/fs/cgroup/unified/lxc/{ct_a}/ns/cgroup.freeze", f"/sys/fs/cgroup/lxc/{ct_a}/ns/cgroup.freeze")
                   if os.path.exists(p)), None)
    if freeze is None:
        pytest.skip("no cgroup2 freezer for the container's cgroup")
    inv = inventory(host, {"gpu-ct": {"proxmox_node": "pve", "proxmox_vmid": ct_a, "gpu_idle_timeout": 5}})
    with open(freeze, "w", encoding="utf-8") as f:
        f.write("1")
    try:
        rc, out, took = playbook(host, collection, tmp_path, inv, "--limit", "gpu-ct")
        assert alive(server)
    finally:
        with open(freeze, "w", encoding="utf-8") as f:
            f.write("0")
    assert rc != 0 and recap(out, "gpu-ct")["failed"] == 1, out[-4000:]
    fatal = [line for line in out.splitlines() if line.startswith("fatal: ")]
    assert len(fatal) == 1 and f"CT {ct_a} is frozen (a suspend-mode backup, or lxc-freeze" in fatal[0], out[-4000:]
    assert f"wait for the backup to finish, or thaw it with `lxc-unfreeze -n {ct_a}`" in fatal[0], fatal[0]
    assert took < 60, took
    time.sleep(0.5)
    assert alive(server) and host.systemctl("is-active", "sglang", ct=ct_a).stdout.strip() == "active"
    assert host.systemctl("stop", "sglang", ct=ct_a).returncode == 0


def test_the_result_file_answers_a_deploy_script_ready_not_ready_and_unreachable(gpusim, collection, tmp_path, vmids):
    """issue 34 item 3: one run, three GPU hosts - one ready, one whose GPUs stay busy, one whose node cannot be
    reached. rc 2, in the recap the task for a ready host, the task and its failure for the others, and predeploy_result_file
    says per host ready or not, the reason, the blockers and the time - for the unreachable node too."""
    ct_a, ct_b = vmids
    host = gpusim
    host.ct_create(ct_a, hostname="ready-ct", gpus="0-1")
    host.ct_create(ct_b, hostname="busy-ct", gpus="2-3")
    host.ct_start(ct_a)
    host.ct_start(ct_b)
    outsider = host.hold(gpus=[2], mib=2048, name="python3 other-job.py")
    inv = inventory(host, {"ready-ct": {"proxmox_node": "pve", "proxmox_vmid": ct_a},
                           "busy-ct": {"proxmox_node": "pve", "proxmox_vmid": ct_b, "gpu_idle_timeout": 2},
                           "lost-ct": {"proxmox_node": "pve-down", "proxmox_vmid": ct_a}},
                    extra_nodes={"pve-down": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1",
                                              "ansible_port": 9, "ansible_ssh_common_args": "-o ConnectTimeout=3"}})
    answer_file = tmp_path / "predeploy.json"
    rc, out, _took = playbook(host, collection, tmp_path, inv, "--limit", "gpu_hosts",
                              "-e", f"predeploy_result_file={answer_file}")
    assert rc == 2, out[-3000:]
    assert alive(outsider)
    for name, results in (("ready-ct", 1), ("busy-ct", 2), ("lost-ct", 2)):
        r = recap(out, name)
        assert r["ok"] + r["failed"] + r["skipped"] == results, (name, r)
    answer = json.loads(answer_file.read_text())
    assert answer["ready"] is False
    hosts = answer["hosts"]
    assert hosts["ready-ct"]["ready"] is True and hosts["ready-ct"]["reason"] is None
    assert hosts["busy-ct"]["ready"] is False and hosts["busy-ct"]["failure"]["kind"] == "wait_timeout"
    assert any(f"pid {outsider}" in b for b in hosts["busy-ct"]["blockers"]), hosts["busy-ct"]
    assert hosts["lost-ct"]["ready"] is False and hosts["lost-ct"]["failure"]["kind"] == "unreachable"
    assert "pve-down could not be reached" in hosts["lost-ct"]["reason"]
    assert all(isinstance(h["elapsed"], (int, float)) for h in hosts.values())


def test_a_bad_predeploy_serial_is_refused_naming_it(gpusim, collection, tmp_path, vmids):
    """issue 33 item 6: -e predeploy_serial=abc ended in an ansible-core traceback (rc 250)."""
    host = gpusim
    inv = inventory(host, {"gpu-ct": {"proxmox_node": "pve", "proxmox_vmid": vmids[0]}})
    rc, out, _took = playbook(host, collection, tmp_path, inv, "-e", "predeploy_serial=abc")
    assert rc not in (0, 250), out[-3000:]
    assert "Traceback" not in out
    assert "predeploy_serial must be a number, a percentage or a list of them" in out and "got abc" in out, out[-3000:]


def test_one_module_run_per_host_and_no_task_for_the_node_a_gpu_host_names(gpusim, collection, tmp_path, vmids):
    """The common case (the server stops within the wait's first slice): the fence, the release and the wait are one
    module run on the node (gpuops.gpu.predeploy_host), a ready host has one task result, and the node that the GPU
    host names has no task of its own in the first play (only the run-once task that finds such nodes: its meta
    end_host runs in ansible-playbook's own process and counts none)."""
    ct = vmids[0]
    host = gpusim
    host.ct_create(ct, hostname="gpu-ct", gpus="0-1")
    host.ct_start(ct)
    server = host.hold(gpus="0-1", mib=4096, ct=ct, tree=True, name="python3 serve.py")
    runs = tmp_path / "module-runs.log"
    python = tmp_path / "python"  # the interpreter: each module run's script (non-pipelined: its file), then Python
    python.write_text(f'#!/bin/sh\nbasename "$1" >> {runs}\nexec {sys.executable} "$@"\n', encoding="utf-8")
    python.chmod(0o755)
    inv = inventory(host, {"gpu-ct": {"proxmox_node": "pve", "proxmox_vmid": ct}})
    inv["all"]["vars"]["ansible_python_interpreter"] = str(python)
    rc, out, _took = playbook(host, collection, tmp_path, inv)
    assert rc == 0, out[-4000:]
    assert not alive(server)
    assert runs.read_text(encoding="utf-8").split() == ["AnsiballZ_predeploy_host.py"], out[-3000:]
    # one task result for a host that is ready (its meta end_host, like the node's, runs in ansible-playbook's process)
    assert recap(out, "gpu-ct") == {"ok": 1, "changed": 1, "unreachable": 0, "failed": 0, "skipped": 0, "rescued": 0}
    # the node: the run-once task that finds the nodes GPU hosts name, nothing of its own
    assert recap(out, "pve") == {"ok": 1, "changed": 0, "unreachable": 0, "failed": 0, "skipped": 0, "rescued": 0}
