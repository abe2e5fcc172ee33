"""AWX runs jobs with ansible-runner: run gpuops.gpu.predeploy under it, on the seed's scenario,
and find the set_stats artifacts that an AWX workflow passes to its next node."""

import json
import os
import sys

import ansible_runner
from modrun import controller_env


VMID = 9129

INVENTORY = {
    "all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "children": {
            "proxmox_nodes": {"hosts": {"pve": {"proxmox_fence_services": ["sglang"]}}},
            "gpu_hosts": {"hosts": {"gpu-ct": {"proxmox_node": "pve", "proxmox_vmid": VMID, "gpu_idle_expected_count": 8}}},
        },
    }
}


def test_predeploy_under_ansible_runner_leaves_set_stats_artifacts(gpusim, collection, tmp_path):
    host = gpusim
    host.fault(release_lag_ms=300)
    host.ct_create(VMID, systemd=True)
    host.ct_start(VMID)
    host.hold(gpus="0-7", mib=8192, ct=VMID, tree=True, respawn=True, service="sglang")
    bystander = host.hold(gpus=[0], mib=16, device_only=True, name="nvidia-persistenced")

    pdd = tmp_path / "runner"
    (pdd / "project").mkdir(parents=True)
    (pdd / "inventory").mkdir()
    (pdd / "env").mkdir()
    (pdd / "project" / "site.yml").write_text("---\n- name: The pre-deploy hook\n  ansible.builtin.import_playbook: gpuops.gpu.predeploy\n")
    inventory = dict(INVENTORY)
    inventory["all"]["vars"]["gpuops_device_files"] = [host.dir + "/dev/nvidia*"]
    (pdd / "inventory" / "hosts.json").write_text(json.dumps(inventory))
    # Every variable that points programs at this simulated node (its PATH, its NVML, its /etc/pve, /run and kernel log).
    env = controller_env(collection, pdd, base=host.env_vars())
    (pdd / "env" / "envvars").write_text(json.dumps(env))

    run = ansible_runner.run(private_data_dir=str(pdd), playbook="site.yml", quiet=True)
    assert run.status == "successful", "".join(e.get("stdout", "") for e in run.events)[-4000:]
    stats = [e for e in run.events if e.get("event") == "playbook_on_stats"]
    artifacts = stats[-1]["event_data"]["artifact_data"]
    assert artifacts["gpu_idle_ready"] is True
    assert artifacts["gpu_idle_summary"]["gpu-ct"]["ready"] is True
    assert float(artifacts["gpu_idle_elapsed"]) >= 0
    # the fence's summary, published once per batch: the GPU host whose container was fenced, and only it
    assert list(artifacts["proxmox_fence_summary"]) == ["gpu-ct"], artifacts["proxmox_fence_summary"]
    assert artifacts["proxmox_fence_summary"]["gpu-ct"]["containers"] == [VMID]
    assert artifacts["proxmox_fence_summary"]["gpu-ct"]["services_stopped"] == [{"vmid": VMID, "unit": "sglang"}]
    # the protected daemon outlived the fence
    assert os.path.exists(f"/proc/{bystander}")
