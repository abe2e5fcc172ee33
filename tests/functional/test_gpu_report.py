"""gpuops.gpu.gpu_report over the simulated host, on the README's inventory: a node ``pve`` with 8
GPUs and a container host ``gpu-ct`` (a container of pve; the README's CT 129 gets a vmid of its own
here, because the simulator's containers are cgroups of this machine, shared with tests running next to these). Each physical GPU is counted once, the rows
name the container host that owns a holder, and the report goes to gpu_report_dir or, under AWX
or with no directory, to the job's artifact (set_stats), run with ansible-runner as AWX does. Each row shows
fit and health; with gpu_report_prometheus_path the rows go to a node_exporter textfile too, read back here by
prometheus_client's parser of the text format."""

import json
import sys

import ansible_runner
import pytest
from modrun import controller_env
from prometheus_client.parser import text_string_to_metric_families

VMID = 6129
INVENTORY = {
    "all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "children": {
            "proxmox_nodes": {"hosts": {"pve": {}}},
            "gpu_hosts": {"hosts": {"gpu-ct": {"proxmox_node": "pve", "proxmox_vmid": VMID}}},
        },
    }
}


@pytest.fixture
def workload(gpusim):
    """A holder of GPUs 0 and 1 inside the container, in its sglang.service."""
    gpusim.ct_create(VMID, systemd=True)
    gpusim.ct_start(VMID)
    return gpusim.hold(gpus=[0, 1], mib=40960, ct=VMID, service="sglang")


def report(host, collection, tmp_path, extravars=None, limit=None, more_hosts=None):
    """Run the playbook under ansible-runner: (run, stdout, artifacts, the project directory)."""
    pdd = tmp_path / "runner"
    for sub in ("project", "inventory", "env"):
        (pdd / sub).mkdir(parents=True)
    (pdd / "project" / "site.yml").write_text("---\n- name: The fleet report\n  ansible.builtin.import_playbook: gpuops.gpu.gpu_report\n")
    inventory = json.loads(json.dumps(INVENTORY))
    inventory["all"]["vars"]["gpuops_device_files"] = [host.dir + "/dev/nvidia*"]
    inventory["all"]["children"]["gpu_hosts"]["hosts"].update(more_hosts or {})
    (pdd / "inventory" / "hosts.json").write_text(json.dumps(inventory))
    env = controller_env(collection, pdd, base=host.env_vars())  # every variable that points programs at this host
    (pdd / "env" / "envvars").write_text(json.dumps(env))
    run = ansible_runner.run(private_data_dir=str(pdd), playbook="site.yml", quiet=True, extravars=extravars or {},
                             limit=limit)
    stdout = "".join(e.get("stdout", "") + "\n" for e in run.events)
    assert run.status == "successful", stdout[-4000:]
    stats = [e for e in run.events if e.get("event") == "playbook_on_stats"]
    return run, stdout, stats[-1]["event_data"].get("artifact_data") or {}, pdd / "project"


def written(tmp_path):
    return sorted(str(p) for p in tmp_path.rglob("gpu_report*") if p.is_file()) + sorted(
        str(p) for p in tmp_path.rglob("gpu-report"))


def test_each_gpu_counted_once_and_holders_name_the_container_host(gpusim, workload, collection, tmp_path):
    out = tmp_path / "report"
    _run, stdout, artifacts, _project = report(gpusim, collection, tmp_path, {"gpu_report_dir": str(out)})
    data = json.loads((out / "gpu_report.json").read_text())
    rows = data["rows"]
    assert len(rows) == 8 and data["gpus"] == 8 and data["busy"] == 2  # the node's 8 GPUs, not 16
    assert {(r["host"], r["seen_from"]) for r in rows} == {("pve", "pve")}
    busy = [r for r in rows if not r["idle"]]
    assert [r["index"] for r in busy] == [0, 1]
    for r in busy:
        assert r["used_mib"] == 40960 and workload in r["holders"] and r["container_hosts"] == ["gpu-ct"]
        assert f"pid {workload} " in r["holders_text"] and f"(CT {VMID} gpu-ct, sglang.service, 40960 MiB)" in r["holders_text"]
    assert all(r["idle"] and r["holders"] == [] and r["health"] == "ok" for r in rows if r["index"] > 1)
    md = (out / "gpu_report.md").read_text()
    assert md.startswith("# GPU report\n")
    assert "| host | GPU | name | used MiB | free MiB | total MiB | idle | fits | health | holders |" in md
    assert f"| pve | 0 | NVIDIA H200 | 40960 | {rows[0]['free_mib']} | 143771 | no | - | ok | pid {workload} " in md
    assert md.count("| pve |") == 8
    # one table, printed by one task: a header line and a line per GPU
    assert "host  GPU  name" in stdout and stdout.count("NVIDIA H200") >= 8
    assert f"CT {VMID} gpu-ct, sglang.service" in stdout
    # not under AWX and written to a directory: no artifact
    assert "gpu_report" not in artifacts


def test_limit_to_the_container_host_gathers_on_its_node(gpusim, workload, collection, tmp_path):
    out = tmp_path / "report"
    report(gpusim, collection, tmp_path, {"gpu_report_dir": str(out)}, limit="gpu-ct")
    rows = json.loads((out / "gpu_report.json").read_text())["rows"]
    assert len(rows) == 8
    assert {(r["host"], r["seen_from"]) for r in rows} == {("gpu-ct", "pve")}
    assert [r["index"] for r in rows if not r["idle"]] == [0, 1]
    assert all(f"CT {VMID} gpu-ct" in r["holders_text"] for r in rows if not r["idle"])


@pytest.mark.parametrize("limit", [None, "gpu-ct,gpu-ct2"])
def test_two_containers_of_one_node_count_its_gpus_once(gpusim, collection, tmp_path, limit):
    out = tmp_path / "report"
    report(gpusim, collection, tmp_path, {"gpu_report_dir": str(out)}, limit=limit,
           more_hosts={"gpu-ct2": {"proxmox_node": "pve", "proxmox_vmid": VMID + 1}})
    rows = json.loads((out / "gpu_report.json").read_text())["rows"]
    assert len(rows) == 8
    assert {(r["host"], r["seen_from"]) for r in rows} == {("gpu-ct", "pve") if limit else ("pve", "pve")}


def test_without_a_directory_nothing_is_written_and_the_report_is_the_artifact(gpusim, workload, collection, tmp_path):
    _run, _stdout, artifacts, project = report(gpusim, collection, tmp_path)
    assert written(tmp_path) == [] and not (project / "gpu-report").exists()
    rep = artifacts["gpu_report"]
    assert rep["gpus"] == 8 and rep["busy"] == 2 and len(rep["rows"]) == 8
    assert [r["index"] for r in rep["rows"] if not r["idle"]] == [0, 1]
    assert all(r["host"] == "pve" for r in rep["rows"])


def test_under_awx_the_report_is_written_and_published(gpusim, collection, tmp_path):
    out = tmp_path / "report"
    _run, _stdout, artifacts, _project = report(gpusim, collection, tmp_path, {"gpu_report_dir": str(out), "awx_job_id": 42})
    assert (out / "gpu_report.md").is_file() and (out / "gpu_report.json").is_file()
    rep = artifacts["gpu_report"]
    assert rep["gpus"] == 8 and rep["busy"] == 0 and all(r["idle"] for r in rep["rows"])
    assert rep == json.loads((out / "gpu_report.json").read_text())


def families(path):
    """{metric: {(host, gpu, uuid, name): value}} of a textfile, by prometheus_client's parser; every family a gauge."""
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        assert fam.type == "gauge" and fam.documentation, fam
        out[fam.name] = {}
        for sample in fam.samples:
            assert sample.name == fam.name and sample.timestamp is None
            key = (sample.labels["host"], int(sample.labels["gpu"]), sample.labels["uuid"], sample.labels["name"])
            assert key not in out[fam.name], f"{fam.name}: two samples for {key}"
            out[fam.name][key] = sample.value
    return out


def test_fit_and_health_per_gpu_and_the_prometheus_textfile(gpusim, workload, collection, tmp_path):
    """GPUs 0 and 1 held (40960 MiB each: the next server does not fit at min_free_pct 90), GPU 2 with a pending row
    remap (a blocking check), GPU 3 slowed down by the hardware (a check that does not block)."""
    gpusim.fault(health={2: {"remap_uncorrected": 1, "remap_pending": 1}, 3: {"clock_reasons": 0x40}})
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    prom = textdir / "gpu_report.prom"
    out = tmp_path / "report"
    _run, stdout, _artifacts, _project = report(gpusim, collection, tmp_path, {
        "gpu_report_dir": str(out), "gpu_report_prometheus_path": str(prom), "gpu_report_min_free_pct": 90})
    rows = {r["index"]: r for r in json.loads((out / "gpu_report.json").read_text())["rows"]}
    assert len(rows) == 8
    assert [i for i, r in rows.items() if r["fits"] is False] == [0, 1]
    assert all(r["fits"] is True and r["need_mib"] == 129394 for i, r in rows.items() if i > 1)
    assert (rows[2]["healthy"], rows[2]["checks"], rows[2]["blocking_checks"]) == (False, ["row_remap_pending"],
                                                                                   ["row_remap_pending"])
    assert (rows[3]["healthy"], rows[3]["checks"], rows[3]["blocking_checks"]) == (True, ["hw_slowdown"], [])
    assert [i for i, r in rows.items() if r["idle"]] == [3, 4, 5, 6, 7]
    assert "row_remap_pending (blocking)" in stdout and "hw_slowdown" in stdout
    md = (out / "gpu_report.md").read_text()
    assert f"| pve | 2 | NVIDIA H200 | 0 | {rows[2]['free_mib']} | 143771 | no | yes | row_remap_pending (blocking) |" in md

    assert oct(prom.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in textdir.iterdir()] == ["gpu_report.prom"]  # renamed into place, no temporary file left
    got = families(prom)
    assert sorted(got) == sorted(["gpuops_gpu_ready", "gpuops_gpu_fits", "gpuops_gpu_healthy",
                                  "gpuops_gpu_memory_used_bytes", "gpuops_gpu_memory_free_bytes",
                                  "gpuops_gpu_memory_total_bytes"])
    key = {i: ("pve", i, r["uuid"], "NVIDIA H200") for i, r in rows.items()}
    assert all(len(samples) == 8 and set(samples) == set(key.values()) for samples in got.values())
    for i, r in rows.items():
        assert got["gpuops_gpu_ready"][key[i]] == (1 if i > 2 else 0)
        assert got["gpuops_gpu_fits"][key[i]] == (0 if i < 2 else 1)
        assert got["gpuops_gpu_healthy"][key[i]] == (0 if i == 2 else 1)
        assert got["gpuops_gpu_memory_used_bytes"][key[i]] == r["used_mib"] * 1048576
        assert got["gpuops_gpu_memory_free_bytes"][key[i]] == r["free_mib"] * 1048576
        assert got["gpuops_gpu_memory_total_bytes"][key[i]] == 143771 * 1048576
    assert got["gpuops_gpu_memory_used_bytes"][key[0]] == 40960 * 1048576


def test_the_textfile_replaces_the_last_one_and_has_no_fits_without_a_fit(gpusim, collection, tmp_path):
    """Without gpu_report_min_free_mib/_pct no fit is judged: gpuops_gpu_fits has no sample; a second run replaces
    the file whole."""
    prom = tmp_path / "gpu_report.prom"
    prom.write_text("# an old file\n")
    report(gpusim, collection, tmp_path, {"gpu_report_prometheus_path": str(prom)})
    got = families(prom)
    assert got["gpuops_gpu_fits"] == {}
    assert len(got["gpuops_gpu_ready"]) == 8 and set(got["gpuops_gpu_ready"].values()) == {1.0}
    assert set(got["gpuops_gpu_healthy"].values()) == {1.0}
