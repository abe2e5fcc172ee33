"""An MPS server shared by two jobs (issue 29, item 1).

The MPS control daemon (``nvidia-cuda-mps-control -d``) starts one ``nvidia-cuda-mps-server`` for the GPUs
it serves; the clients' CUDA contexts run inside the server, and the driver lists the server on every GPU
it serves and each client (``M+C``) on the GPU it uses. Before the holding model knew MPS, ``gpu_release
gpus: [0]`` SIGTERMed the server (a context holder of GPU 0) and the control daemon (its parent, taken as the
root of its workload), and so ended the work of the client on GPU 1, which it listed as skipped."""

import pytest
from modrun import alive, run_module
from test_scope_gate import devices, release


def by_pid(entries):
    return {e["pid"]: e for e in entries}


def mps_node(host, ct=None):
    control, server = host.mps_daemon(gpus=[0, 1], mib=28, ct=ct)
    a = host.hold(gpus=[0], mib=790, type="CM", name="python3 client_a.py", ct=ct)
    b = host.hold(gpus=[1], mib=790, type="CM", name="python3 client_b.py", ct=ct)
    return control, server, a, b


@pytest.mark.parametrize("scope", [{}, {"match": "client_a"}, {"users": ["root"]}, {"pids": None}],
                         ids=["gpus-only", "match", "users", "pids"])
def test_releasing_one_client_leaves_the_shared_server_and_the_control_daemon(gpusim, collection, scope):
    control, server, a, b = mps_node(gpusim)
    if "pids" in scope:
        scope = {"pids": [a, server]}  # naming the server does not make it the release's to stop
    res = release(gpusim, collection, gpus=["0"], **scope)
    assert not res.get("failed"), res.get("msg")
    assert set(by_pid(res["released"])) == {a}, res["released"]
    assert not alive(a)
    for pid in (server, control, b):
        assert alive(pid), (pid, res["released"])
    kept = by_pid(res["skipped_processes"])[server]["reason"]
    assert "MPS server" in kept and f"pid {b} on GPU 1" in kept, kept
    assert "nvidia-cuda-mps-control" in kept, kept  # how to stop MPS when that is what is wanted
    assert control not in by_pid(res["released"]) and control not in by_pid(res["skipped_processes"])


def test_a_server_whose_every_client_is_released_may_go_with_them(gpusim, collection):
    control, server, a, b = mps_node(gpusim)
    res = release(gpusim, collection, gpus=["0", "1"])
    assert not res.get("failed"), res.get("msg")
    assert set(by_pid(res["released"])) == {a, b, server}, res["released"]
    assert alive(control)  # the control daemon is never signalled


def test_the_wait_after_the_release_names_the_server_and_why_it_stays(gpusim, collection):
    _control, server, a, b = mps_node(gpusim)
    res = release(gpusim, collection, gpus=["0"])
    assert set(by_pid(res["released"])) == {a}, res["released"]
    wait = run_module(gpusim, collection, "gpu_wait_idle", {"gpus": ["0"], "device_files": devices(gpusim),
                                                            "timeout": 1, "settle": 0, "sleep": 0.2})
    assert wait.get("failed"), wait
    msg = wait["msg"]
    assert f"pid {server}" in msg and "MPS server" in msg and f"pid {b} on GPU 1" in msg, msg
    assert "nvidia-cuda-mps-control" in msg, msg


def test_in_a_container_the_server_shared_with_a_job_on_another_gpu_is_left(gpusim, collection):
    gpusim.ct_create(129)
    gpusim.ct_start(129)
    control, server, a, b = mps_node(gpusim, ct=129)
    res = release(gpusim, collection, gpus=["0"], containers=[129])
    assert not res.get("failed"), res.get("msg")
    assert set(by_pid(res["released"])) == {a}, res["released"]
    for pid in (server, control, b):
        assert alive(pid), (pid, res["released"])
    kept = by_pid(res["skipped_processes"])[server]["reason"]
    assert "MPS server" in kept and f"pid {b} on GPU 1" in kept, kept


def test_with_nvidia_smi_no_client_is_listed_and_a_server_on_an_unselected_gpu_stays(gpusim, collection):
    # nvidia-smi --query-compute-apps has no MPS list: the server shows, its clients look like any CUDA process.
    control, server, a, b = mps_node(gpusim)
    res = release(gpusim, collection, gpus=["0"], backend="nvidia-smi")
    assert not res.get("failed"), res.get("msg")
    assert set(by_pid(res["released"])) == {a}, res["released"]
    for pid in (server, control, b):
        assert alive(pid), (pid, res["released"])
    kept = by_pid(res["skipped_processes"])[server]["reason"]
    assert "also serves GPU 1, not selected, and no MPS client is listed" in kept, kept
