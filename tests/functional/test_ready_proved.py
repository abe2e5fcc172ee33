""""Ready" only when proved (issue 18, item 5): a crash injected into each module the roles call, an
unreachable node and a skipped wait, through ansible-playbook on the simulated Proxmox VE node.

The crash is real and test-only: tests/functional/crash_injection/sitecustomize.py, on PYTHONPATH
for these runs only, makes the interpreter that Ansible starts for one module die by SIGSEGV (a
NULL read in native code, as a crash in the NVIDIA library) or SIGKILL (as the OOM killer), or
raise an unhandled exception (which ansible-core 2.19+ keeps under failed_when only as
failed_when_suppressed_exception, with no msg) - as the module starts, right after its first
signal, or at a command it runs (pct, nvidia-smi). Every test checks that the crash happened (the injection's log), that the
play fails once with the module, what happened and what to do, and that the run's statistics (what
AWX passes to the next node of a workflow, set_stats) never say gpu_idle_ready: true.

vmids 8300-8399 (cgroups under lxc/ are machine-wide): 8300 + 2 per test of this file.
"""

import json
import os
import re
import time

import modrun
import pytest
from test_predeploy import alive, inventory, recap

CRASH_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_injection")


@pytest.fixture
def vmids(request):
    names = [item.name for item in request.session.items if item.fspath == request.node.fspath]
    base = 8300 + 2 * names.index(request.node.name)
    return base, base + 1


def run(host, collection, tmp_path, inv, *args, playbook="gpuops.gpu.predeploy", crash=None, env_extra=None,
        timeout=240):
    """ansible-playbook with the custom statistics shown; returns (rc, output, stats, crashes):
    stats is the RUN line of CUSTOM STATS ({} when nothing was published), crashes the injection's log."""
    log = tmp_path / "crashes.log"
    env = dict(modrun.controller_env(collection, tmp_path, host.env()), ANSIBLE_SHOW_CUSTOM_STATS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default", ANSIBLE_REMOTE_TEMP=str(tmp_path / "remote-tmp"))
    if crash:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (CRASH_DIR, env.get("PYTHONPATH")) if p)
        env.update(GPUOPS_TEST_CRASH=crash, GPUOPS_TEST_CRASH_LOG=str(log))
    env.update(env_extra or {})
    rc, out, _took = modrun.run_playbook(env, tmp_path, playbook, inv, *args, timeout=timeout)
    found = re.findall(r"^\s*RUN: (\{.*\})\s*$", out, re.M)
    stats = json.loads(found[-1]) if found else {}
    crashes = log.read_text().splitlines() if log.exists() else []
    return rc, out, stats, crashes


def fatal_lines(out, name):
    return [line for line in out.splitlines() if line.startswith(f"fatal: [{name}")]


def assert_not_ready(out, stats, name):
    """The run says not ready wherever it says anything: the statistics and this host's summary."""
    assert stats.get("gpu_idle_ready") is False, (stats, out[-3000:])
    summary = (stats.get("gpu_idle_summary") or {}).get(name)
    if summary is not None:
        assert summary["ready"] is False and summary["error"], summary
    assert not re.search(r'"gpu_idle_ready": true', out), out[-3000:]


# What the failure says of each crash. The action plugin reads an unhandled exception's message from its result
# (ansible-core 2.19+ keeps it in an ErrorSummary), with or without ANSIBLE_DISPLAY_TRACEBACK.
HOW = {"segv": "killed by SIGSEGV (rc ", "kill": "killed by SIGKILL (rc ",
       "raise": "with an unhandled error: RuntimeError: crash injected into",
       "raise-traceback": "with an unhandled error: RuntimeError: crash injected into"}
TRACEBACK = {"ANSIBLE_DISPLAY_TRACEBACK": "error"}


def crash_case(module, how, event=None, env=None):
    spec = f"{module}:{how}" + (f"@{event}" if event else "")
    said = HOW["raise-traceback" if how == "raise" and env else how]
    return pytest.param(module, spec, said, env, id=f"{module}-{how}-{event or 'start'}" + ("-traceback" if env else ""))


@pytest.mark.parametrize("module, crash, said, env", [
    # the fence: one proxmox_gpu_containers run on the node (the containers, their services, the release)
    crash_case("proxmox_gpu_containers", "raise"),
    crash_case("proxmox_gpu_containers", "segv", "ctypes.dlopen"),  # in its discovery: loading NVML for the minors
    crash_case("proxmox_gpu_containers", "segv", "signal"),  # in its release, right after its first signal
    # the wait, on the node
    crash_case("gpu_wait_idle", "raise"),
    crash_case("gpu_wait_idle", "segv", "subprocess.Popen"),  # it saw idle GPUs: at nvidia-smi's confirmation
    crash_case("gpu_wait_idle", "kill"),
])
def test_predeploy_fails_with_the_reason_and_is_never_ready_when_a_module_crashes(
        gpusim, collection, tmp_path, vmids, module, crash, said, env):
    ct = vmids[0]
    host = gpusim
    host.ct_create(ct, hostname="gpu-ct", gpus="0-1")
    host.ct_start(ct)
    server = host.hold(gpus="0-1", mib=4096, ct=ct, tree=True, name="python3 -m vllm.entrypoints.api_server")
    inv = inventory(host, {"gpu-ct": {"proxmox_node": "pve", "proxmox_vmid": ct, "gpu_idle_timeout": 5}})
    rc, out, stats, crashes = run(host, collection, tmp_path, inv, "--limit", "gpu-ct", crash=crash, env_extra=env)
    assert any(line.startswith(module + " ") for line in crashes), f"no crash was injected into {module}: {out[-3000:]}"
    assert rc != 0, out[-4000:]
    assert recap(out, "gpu-ct")["failed"] == 1, out[-3000:]
    fatal = fatal_lines(out, "gpu-ct")
    assert len(fatal) == 1, out[-4000:]
    assert f"{module} crashed on pve" in fatal[0] and said in fatal[0], fatal[0]
    assert "run the play again" in fatal[0], fatal[0]  # and what to do
    assert_not_ready(out, stats, "gpu-ct")
    if module == "proxmox_gpu_containers" and "@signal" not in crash:
        assert alive(server), "the release ran after the fence crashed before it"


@pytest.mark.parametrize("module, crash, said, env", [
    crash_case("gpu_release", "raise"),
    crash_case("gpu_release", "raise", "signal", env=TRACEBACK),
    crash_case("gpu_release", "segv", "signal"),
    crash_case("gpu_wait_idle", "raise", env=TRACEBACK),
    crash_case("gpu_wait_idle", "segv"),
])
def test_the_gpu_idle_role_alone_fails_with_the_reason_when_a_module_crashes(
        gpusim, collection, tmp_path, module, crash, said, env):
    """The role on the GPU host itself (no fence, no delegate), releasing what holds its GPUs."""
    host = gpusim
    host.hold(gpus="0-1", mib=4096, name="python3 train.py")
    play = tmp_path / "site.yml"
    play.write_text("""---
- name: Free GPUs 0 and 1
  hosts: gpu_hosts
  gather_facts: false
  tasks:
    - name: Run gpuops.gpu.gpu_idle
      ansible.builtin.include_role:
        name: gpuops.gpu.gpu_idle
      vars:
        gpu_idle_gpus: ["0", "1"]
        gpu_idle_release: true
        gpu_idle_release_grace_period: 1
        gpu_idle_timeout: 5
""")
    inv = inventory(host, {"gpu-host": {}})
    rc, out, stats, crashes = run(host, collection, tmp_path, inv, playbook=str(play), crash=crash, env_extra=env)
    assert any(line.startswith(module + " ") for line in crashes), f"no crash was injected into {module}: {out[-3000:]}"
    assert rc != 0, out[-4000:]
    fatal = fatal_lines(out, "gpu-host")
    assert len(fatal) == 1, out[-4000:]
    assert f"{module} crashed on gpu-host" in fatal[0] and said in fatal[0], fatal[0]
    assert_not_ready(out, stats, "gpu-host")
    assert stats["gpu_idle_summary"]["gpu-host"]["failure"] == {"module": module, "kind": "crashed"}
    if module == "gpu_release":  # no wait after a release that did not succeed
        assert stats["gpu_idle_summary"]["gpu-host"]["elapsed"] == 0.0 and "gpu_wait_idle " not in "".join(crashes)


def test_a_host_whose_node_cannot_be_reached_keeps_the_run_not_ready(gpusim, collection, tmp_path, vmids):
    """Two GPU hosts: tenant-a's node answers and its GPUs are free; tenant-b's node cannot be reached.
    tenant-a alone proves nothing about tenant-b: the run is not ready."""
    ct_a = vmids[0]
    host = gpusim
    host.ct_create(ct_a, hostname="tenant-a", gpus="0-1")
    host.ct_start(ct_a)
    inv = inventory(host, {"tenant-a": {"proxmox_node": "pve", "proxmox_vmid": ct_a},
                           "tenant-b": {"proxmox_node": "pve-down", "proxmox_vmid": vmids[1]}},
                    extra_nodes={"pve-down": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1",
                                              "ansible_port": 9, "ansible_ssh_common_args": "-o ConnectTimeout=3"}})
    t0 = time.monotonic()
    rc, out, stats, _crashes = run(host, collection, tmp_path, inv, "--limit", "tenant-a,tenant-b")
    assert time.monotonic() - t0 < 90, out[-3000:]
    assert rc != 0
    # the node's connection failed inside tenant-b's one task: a failure with its reason, recorded and published
    assert recap(out, "tenant-b")["failed"] == 1, out[-3000:]
    assert recap(out, "tenant-a")["failed"] == 0, out[-3000:]
    assert stats["gpu_idle_summary"]["tenant-a"]["ready"] is True  # its own wait proved it
    assert stats["gpu_idle_summary"]["tenant-b"]["failure"] == {"module": "proxmox_fence", "kind": "unreachable"}
    assert_not_ready(out, stats, "tenant-b")


def test_a_run_without_the_wait_is_not_ready(gpusim, collection, tmp_path, vmids):
    """--tags gpuops_fence: the containers are fenced, nothing is waited for - a failure with its reason."""
    ct = vmids[0]
    host = gpusim
    host.ct_create(ct, hostname="gpu-ct", gpus="0-1")
    host.ct_start(ct)
    inv = inventory(host, {"gpu-ct": {"proxmox_node": "pve", "proxmox_vmid": ct}})
    rc, out, stats, _crashes = run(host, collection, tmp_path, inv, "--tags", "gpuops_fence")
    assert rc == 2, out[-4000:]
    assert f"fenced CT {ct}" in out, out[-3000:]  # fenced, never waited
    fatal = fatal_lines(out, "gpu-ct")
    assert len(fatal) == 1 and "gpu_wait_idle was skipped on pve (this run's --tags/--skip-tags leave out" in fatal[0]
    assert_not_ready(out, stats, "gpu-ct")


def test_the_crash_injection_is_inert_for_a_module_that_is_not_called(gpusim, collection, tmp_path, vmids):
    """predeploy does not call gpu_facts: with a crash armed for it, the run is ready, as without it -
    the injection changes nothing but the module it names."""
    ct = vmids[0]
    host = gpusim
    host.ct_create(ct, hostname="gpu-ct", gpus="0-1")
    host.ct_start(ct)
    server = host.hold(gpus="0-1", mib=4096, ct=ct, tree=True, name="python3 serve.py")
    inv = inventory(host, {"gpu-ct": {"proxmox_node": "pve", "proxmox_vmid": ct, "gpu_idle_timeout": 30}})
    rc, out, stats, crashes = run(host, collection, tmp_path, inv, "--limit", "gpu-ct", crash="gpu_facts:segv")
    assert rc == 0, out[-4000:]
    assert crashes == []
    assert not alive(server)
    assert stats["gpu_idle_ready"] is True and stats["gpu_idle_summary"]["gpu-ct"]["error"] is None


@pytest.mark.parametrize("crash, said", [("gpu_facts:segv", "Segmentation fault"),
                                         ("gpu_facts:raise", "crash injected into gpu_facts")])
def test_gpu_report_fails_naming_a_crash_of_gpu_facts(gpusim, collection, tmp_path, crash, said):
    """gpu_facts is called by the gpu_report playbook (not by the roles), without failed_when: Ansible fails
    the host itself, with the crash, and the report does not list the host's GPUs."""
    host = gpusim
    inv = inventory(host, {})
    rc, out, stats, crashes = run(host, collection, tmp_path, inv, playbook="gpuops.gpu.gpu_report", crash=crash)
    assert crashes and crashes[0].startswith("gpu_facts "), out[-3000:]
    assert rc != 0
    fatal = fatal_lines(out, "pve")
    assert len(fatal) == 1 and said in fatal[0], out[-3000:]
    assert not (stats.get("gpu_report") or {}).get("rows"), stats
