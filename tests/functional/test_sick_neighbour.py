"""A sick GPU next door, and nvidia-smi's warnings (issue 29, item 4), on the simulated node.

- A GPU the fenced container does not have whose process list fails (NVML_ERROR_UNKNOWN) does not fail
  the fence: the fence's release selects the container's GPUs, and the other GPU's error is reported.
- nvidia-smi's warning line (``WARNING: infoROM is corrupted at gpu 0000:1A:00.0``) and its exit code 14
  (nvidia-smi(1) RETURN VALUE: "infoROM is corrupted") are a warning and a health finding, never a failure:
  gpu_facts and gpu_release with the nvidia-smi backend, and gpu_wait_idle's final nvidia-smi query.

vmids 4291-4292 only.
"""

import pytest
from modrun import alive, gone, run_module_text, warnings

CT = 4291
OTHER = 4292


def run(host, collection, name, args, check_mode=False):
    return run_module_text(host, collection, name, args, check_mode=check_mode)[0]


@pytest.fixture
def node(gpusim_factory):
    """An 8-GPU node with CT 4291 (GPUs 0-1, running) and CT 4292 (GPU 5, running)."""
    host = gpusim_factory(release_lag_ms=0)
    host.ct_create(CT, "gpu-a", "0,1", devices_style="lxc", systemd=True)
    host.ct_create(OTHER, "gpu-b", "5", devices_style="lxc")
    for vmid in (CT, OTHER):
        host.ct_start(vmid)
    return host


def test_an_unreadable_process_list_on_another_gpu_does_not_fail_the_fence(node, collection):
    """GPU 5 (CT 4292's) answers NVML_ERROR_UNKNOWN to every process query: the fence of CT 4291 (GPUs 0-1)
    releases its worker all the same, says which GPUs it released, and reports GPU 5's error."""
    worker = node.hold(gpus=[0, 1], mib=4096, ct=CT, service="sglang")
    neighbour = node.hold(gpus=[5], mib=1024, ct=OTHER)
    node.fault(unknown={5: ["processes"]})
    args = dict(containers=[CT], state="released", grace_period=5, pct=node.path("bin", "pct"))
    res = run(node, collection, "proxmox_gpu_containers", args)
    assert not res.get("failed"), res.get("msg")
    assert res["changed"] and res["gpus"] == [0, 1]
    assert worker in [r["pid"] for r in res["release"]["released"]], res["release"]
    assert [g["index"] for g in res["release"]["gpus_before"]] == [0, 1]
    errors = res["release"]["gpu_errors"]
    assert [e["index"] for e in errors] == [5] and "Unknown Error" in errors[0]["error"], errors
    assert any("GPU 5" in w and "Unknown Error" in w and "not selected" in w for w in warnings(res)), warnings(res)
    assert gone(worker) and alive(neighbour)

    # A fence of the sick GPU's own container still refuses: its list cannot be trusted to be complete.
    res = run(node, collection, "proxmox_gpu_containers", dict(args, containers=[OTHER]))
    assert res.get("failed") and "Nothing was signalled" in res["msg"] and "GPU 5" in res["msg"], res
    assert alive(neighbour)


INFOROM = {1: {"inforom_corrupt": 1}}


@pytest.mark.parametrize("backend", ["nvidia-smi", "nvml"])
def test_a_corrupted_inforom_is_a_health_finding_not_a_failure(gpusim, collection, backend):
    """gpu_facts: nvidia-smi prints its WARNING line first and exits 14 (its output complete): every GPU is
    reported, GPU 1 with the health check inforom (not blocking by default), and nvidia-smi's line as a warning;
    NVML's nvmlDeviceValidateInforom gives the same finding."""
    gpusim.fault(health=INFOROM)
    res = run(gpusim, collection, "gpu_facts", {"backend": backend})
    assert not res.get("failed"), res.get("msg")
    gpus = res["ansible_facts"]["gpu_devices"]
    assert [g["index"] for g in gpus] == list(range(8))
    assert [g["inforom_corrupt"] for g in gpus] == [False, True] + [False] * 6
    checks = {g["index"]: [c["check"] for c in g["health"]["checks"]] for g in gpus}
    assert checks[1] == ["inforom"] and not any(checks[i] for i in checks if i != 1), checks
    finding = gpus[1]["health"]["checks"][0]
    assert finding["blocking"] is False and "infoROM" in finding["detail"], finding
    assert gpus[1]["idle"] is True
    if backend == "nvidia-smi":  # its warning line, said once, of the GPU it names
        said = [w for w in warnings(res) if "infoROM" in w]
        assert len(said) == 1 and said[0].startswith("GPU 1 (") and gpusim.status()["gpus"][1]["pci_bus_id"][4:] in said[0], warnings(res)


def test_exit_14_is_success_for_every_module(gpusim, collection):
    """gpu_release (nvidia-smi backend) releases a holder; gpu_wait_idle is ready with the nvidia-smi backend and
    with NVML plus its final nvidia-smi query (confirm_with_nvidia_smi), which got exit 14 twice before."""
    gpusim.fault(health=INFOROM)
    holder = gpusim.hold(gpus=[0], mib=2048, name="python3 serve.py")
    res = run(gpusim, collection, "gpu_release", {"backend": "nvidia-smi", "gpus": ["0"], "grace_period": 2})
    assert not res.get("failed"), res.get("msg")
    assert holder in [r["pid"] for r in res["released"]] and gone(holder)
    for backend in ("nvidia-smi", "nvml"):
        res = run(gpusim, collection, "gpu_wait_idle",
                  {"backend": backend, "timeout": 20, "settle": 0.3, "sleep": 0.1, "confirm_with_nvidia_smi": True})
        assert not res.get("failed") and res["ready"], (backend, res.get("msg"))
        assert res["idle_gpus"] == list(range(8))
        if backend == "nvml":
            assert res["confirmation"], res
