"""tools/gpu_smoke.py (the `make gpu-smoke` script) keeps working where no GPU is: its --simulator run."""

import json
import os
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(TOP, "tools", "gpu_smoke.py")


def number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def test_gpu_smoke_on_the_simulator(tmp_path):
    out = tmp_path / "smoke.json"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("GPUSIM_DIR", None)
    proc = subprocess.run([sys.executable, SCRIPT, "--simulator", "--json", str(out)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["mode"] == "simulator" and report["ok"] is True and report["problems"] == []
    assert "1. gpu_facts vs nvidia-smi --query-gpu" in proc.stdout and "result: ok" in proc.stdout

    # 1. every field of every GPU, both backends, equal to nvidia-smi --query-gpu
    rows = report["compare"]["rows"]
    assert report["compare"]["all_equal"] is True
    assert {r["gpu"] for r in rows} == set(range(8))
    assert {r["field"] for r in rows} == {"index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used"}
    assert len(rows) == 8 * 6
    for row in rows:
        assert row["equal"] is True, row
        for backend in ("nvml", "nvidia-smi"):
            assert row[backend]["verdict"] == "equal", row
            if row["field"] != "memory.used":
                assert row[backend]["value"] == row["nvidia_smi_csv"], row

    # 2. the workload was seen by both backends: pid, memory, device file
    work = report["workload"]
    assert isinstance(work["pid"], int) and work["pid"] > 0
    assert work["gpu"] == 0 and work["mib"] == 1024
    for backend in ("nvml", "nvidia-smi"):
        seen = work["seen"][backend]
        assert seen["pid_reported"] is True, seen
        assert seen["used_mib"] >= work["mib"] and seen["memory_ok"] is True, seen
        assert seen["holder"] is True and any(f.endswith("/dev/nvidia0") for f in seen["files"]), seen
    # the device-node rule: the simulated CUDA workload holds every GPU's node, its context is on GPU 0 only
    rule = work["device_nodes"]
    assert rule["context_gpus"] == [0] and rule["opens_every_gpu"] is True, rule
    assert rule["nodes_without_context"] == list(range(1, 8)), rule

    # 3. released (that pid only), memory freed, GPU idle, latencies measured
    rel = report["release"]
    assert rel["failed"] is False and rel["released"] is True and rel["signals"] == ["SIGTERM"]
    assert rel["others_signalled"] == [] and rel["survivors"] == []
    assert work["killed_in_cleanup"] is False  # gpu_release stopped it; the cleanup had nothing left to do
    wait = report["wait_idle"]
    assert wait["failed"] is False and 0 in wait["idle_gpus"]
    timing = report["timing"]
    for key in ("signal_to_exit_s", "signal_to_free_s", "exit_to_free_s", "detection_latency_s"):
        assert number(timing[key]), (key, timing[key])
    assert timing["signal_to_free_s"] > 0 and timing["detection_latency_s"] > 0
    assert timing["signal_to_exit_s"] >= 0 and timing["exit_to_free_s"] > 0
    assert timing["baseline_used_mib"] == 0 and timing["free_used_mib"] == 0
    used = [sample[1] for sample in timing["nvml_samples_s_from_signal"]]
    assert max(used) >= work["mib"] and used[-1] == 0

    # it left nothing behind: its simulated host is gone
    assert not os.path.exists(report["settings"]["simulator"]["dir"])
