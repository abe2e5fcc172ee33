"""The size of the modules' results.

1. In full (detail: full) they say each GPU holder once (issue 20): their size grows with the GPUs plus the
   processes, not with GPUs x processes x files. A 16-GPU host with a server of 16 workers (each opens every
   /dev/nvidiaN, as CUDA does, and has a context on its own GPU) in CT 7600, and 20 other processes: NVML-only
   clients and CUDA clients holding every node with no context on the host, and in CT 7600 a few of each.
2. In summary (the default) they are bounded by design (issue 27, item 4): ansible-runner (AWX) replaces any
   event whose len(str(res)) is over 700,000 characters by {} (awx_display.py, MAX_EVENT_RES), and a host of 64
   GPUs with many processes per GPU returns more than that in full. A 64-GPU host with PER_GPU servers of one
   worker per GPU (a long command line each), measured as ansible-runner measures it (invocation included),
   for every module, then the roles proxmox_fence and gpu_idle under ansible-runner itself: no event dropped,
   each under the limit, the set_stats artifacts too; detail: full and detail_file give the whole record.
   benchmarks/bench_output.py measures 8/32/64 GPUs with 1/4/16 processes per GPU.
"""

import json
import os
import stat
import sys

import ansible_runner

from modrun import controller_env, event_sizes, run_module, run_under_runner

VMID = 7600
GPUS = 16
OTHERS = 20
# What one GPU's entry may take besides its holders' pids (its fields: ids, memory, health, fit, its
# processes with their details), what one process's details may take besides its files and GPUs, and what
# one reference to a pid may take (its digits and a separator; a GPU names a holder in holders and in
# lingering or blockers).
PER_GPU = 4000
PER_PROCESS = 1500
PER_FILE_OR_GPU = 24
PER_REF = 2 * 10


def bound(gpus: int, processes: int, dev_dir: str) -> int:
    """The most a result of ``gpus`` GPUs and ``processes`` holders may take when each holder is said once:
    linear in each (plus one pid per GPU and holder), where the snapshot's form takes GPUs x processes x files."""
    files = gpus + 2  # every GPU's node, nvidiactl, nvidia-uvm
    per_process = PER_PROCESS + len(dev_dir) + files * PER_FILE_OR_GPU + gpus * PER_FILE_OR_GPU
    return gpus * PER_GPU + processes * per_process + gpus * processes * PER_REF


def start(host):
    host.ct_create(VMID, hostname="out-size")
    host.ct_start(VMID)
    api = host.hold(gpus="all", mib=20480, ct=VMID, tree=True, name="sglang-server")
    for index in range(OTHERS):
        where = {"ct": VMID} if index % 4 == 3 else {}
        if index % 2:
            host.hold("all", device_only=True, name="cuda-client", **where)
        else:
            host.hold(None, control_only=True, name="nvml-agent", **where)
    return api


def check(result, gpu_keys, details_key, dev_dir):
    text = json.dumps(result)
    details = result[details_key]
    named = {pid for key in gpu_keys for g in result[key] for pids in g["holders"].values() for pid in pids}
    # Each pid once in the holders' details, every named pid there; the details are nowhere else.
    assert {int(k) for k in details} == named, sorted(named ^ {int(k) for k in details})
    assert text.count('"files"') == len(details)
    assert all(set(d["files"]) <= {dev_dir} for d in details.values()), "files are keyed by their directory"
    # The server (API + a worker per GPU) and the others all hold the GPUs: 1 + GPUS + OTHERS.
    assert len(details) >= 1 + GPUS + OTHERS
    limit = bound(GPUS, len(details), dev_dir) * (len(gpu_keys))
    assert len(text) < limit, (len(text), limit)
    return len(text)


def test_each_holder_once_and_the_size_linear(gpusim_factory, collection):
    host = gpusim_factory(gpus=GPUS)
    api = start(host)
    dev_dir = host.path("dev")
    devices = {"device_files": [os.path.join(dev_dir, "nvidia*")]}

    devices["detail"] = "full"  # the whole result: each holder once (in summary the lists are capped: below)
    facts = run_module(host, collection, "gpu_facts", devices)
    assert not facts.get("failed"), facts.get("msg")
    check(facts["ansible_facts"], ("gpu_devices",), "gpu_holder_processes", dev_dir)
    workers = [p["pid"] for g in facts["ansible_facts"]["gpu_devices"] for p in g["processes"]]
    assert len(workers) == GPUS
    details = facts["ansible_facts"]["gpu_holder_processes"]
    # A worker holds every GPU's node: named on each GPU, its context on its own, said once with all 16 GPUs.
    g0 = facts["ansible_facts"]["gpu_devices"][0]
    assert workers[0] in g0["holders"]["context"] and set(workers[1:]) <= set(g0["holders"]["lingering"])
    assert details[str(workers[1])]["gpus"] == list(range(GPUS))
    assert details[str(api)]["container"]["id"] == VMID

    release = run_module(host, collection, "gpu_release", dict(devices, containers=[VMID]), check_mode=True)
    assert not release.get("failed") and release["changed"], release.get("msg")
    assert "gpus_before" not in release  # check mode: one look, said once
    check(release, ("gpus",), "holder_processes", dev_dir)
    assert {r["pid"] for r in release["released"]} >= set(workers) | {api}


# --- bounded by design (issue 27, item 4) ----------------------------------------------------------------

RUNNER_LIMIT = 700000  # ansible-runner's MAX_EVENT_RES: an event's res over it becomes {}
BIG_GPUS = 64
# Servers of one worker per GPU: PER_GPU processes with a context on each GPU, each holding all 64 nodes. 16 per
# GPU (benchmarks/bench_output.py) takes 4 minutes to start on 2 cores and 10 GB; 4 per GPU already makes every
# module's full result but gpu_facts' larger than the limit, and the summary's caps are reached at 4 (2 processes,
# 4 busy reasons, 8 pids of each list).
PER_GPU = 4
BIG_VMID = 7601
# A real server's command line (sglang, vLLM): a few hundred characters.
COMMAND = ("python3 -m sglang.launch_server --model-path /models/Qwen3-235B-A22B-Instruct-2507-FP8 --tp-size 8"
           " --host 0.0.0.0 --port 30000 --mem-fraction-static 0.88 --context-length 131072 --chunked-prefill-size"
           " 8192 --enable-metrics --served-model-name qwen3 --trust-remote-code --log-level info")


def runner_size(result) -> int:
    """len(str(res)), as ansible-runner's display callback measures an event's result."""
    return len(str(result))


def start_big(host):
    host.ct_create(BIG_VMID, hostname="out-big")
    host.ct_start(BIG_VMID)
    for index in range(PER_GPU):
        for low in range(0, BIG_GPUS, 16):  # trees of 16 workers: a loaded machine starts 64 at once in over 30 s
            host.hold(gpus=f"{low}-{low + 15}", mib=1024, tree=True, name=f"{COMMAND} --worker-set {index}")
    # the fence's container: a job on GPU 0 and an NVML agent
    job = host.hold([0], mib=512, ct=BIG_VMID, name="ct-job")
    host.hold(None, control_only=True, name="nvml-agent")
    return job


def assert_verdicts_kept(gpus, details=None):
    """Every GPU there, each busy one with its blockers (named among its processes or holders) and reasons."""
    assert len(gpus) == BIG_GPUS
    for g in gpus:
        assert g["idle"] is False and g["blockers"] and g["busy_reasons"], g["index"]
        named = {p["pid"] for p in g["processes"]} | {pid for pids in g["holders"].values() for pid in pids}
        assert set(g["blockers"]) <= named, g["index"]
        assert g["more"]["holders"]["lingering"] > 0  # every other GPU's workers hold this node
    if details is not None:
        assert 0 < len(details) <= 64


def test_every_result_is_bounded_at_64_gpus_and_whole_on_request(gpusim_factory, collection, tmp_path):
    host = gpusim_factory(gpus=BIG_GPUS)
    start_big(host)
    devices = {"device_files": [host.path("dev", "nvidia*")], "_ansible_inject_invocation": True}
    runs = {
        "gpu_facts": (dict(devices), False),
        "gpu_release": (dict(devices, all=True), True),
        "gpu_wait_idle": (dict(devices, timeout=5), True),
        "proxmox_gpu_containers": (dict(devices, containers=[BIG_VMID], state="released"), True),
    }
    sizes, results = {}, {}
    for name, (args, check) in runs.items():
        summary = run_module(host, collection, name, args, check_mode=check)
        full = run_module(host, collection, name, dict(args, detail="full"), check_mode=check)
        results[name] = (summary, full)  # the runs below read these (nothing here changes the host: check mode)
        for result in (summary, full):
            assert not result.get("failed"), (name, result.get("msg"))
            assert "module_args" in result["invocation"]
        sizes[name] = (runner_size(summary), runner_size(full))
        assert summary["detail"]["level"] == "summary" and full["detail"] == {"level": "full", "file": None, "more": {}}
        # Under half the limit in summary (the caps are reached: 16 per GPU is no larger); in full, what the
        # scenario makes (past the limit but for the facts, which have one GPU list, and the fence).
        assert sizes[name][0] < RUNNER_LIMIT // 2, sizes
        # (the fence carries its release's outcome and its GPUs as records, not the snapshot: under it in full too)
        assert sizes[name][1] > RUNNER_LIMIT or name in ("gpu_facts", "proxmox_gpu_containers"), sizes
        # a message at most 2,000 characters in summary; the whole of it in full (the wait names every busy GPU)
        assert len(summary.get("msg") or "") <= 2000, (name, len(summary["msg"]))
        if name == "gpu_wait_idle":
            assert len(full["msg"]) > 2000 and summary["detail"]["more"]["msg"] == len(full["msg"]) - 1900
    facts = results["gpu_facts"][0]["ansible_facts"]
    assert_verdicts_kept(facts["gpu_devices"], facts["gpu_holder_processes"])
    release, full = results["gpu_release"]
    assert_verdicts_kept(release["gpus"], release["holder_processes"])  # check mode: its one look
    # Counted, never lost: every process released is in the list or in the count.
    assert len(release["released"]) + release["detail"]["more"]["released"] == len(full["released"])
    assert len(full["released"]) > 4 * BIG_GPUS

    # detail_file: the whole result on the node, mode 0600, the result says where.
    path = str(tmp_path / "release.json")
    told = run_module(host, collection, "gpu_release", dict(runs["gpu_release"][0], detail_file=path), check_mode=True)
    assert told["detail"]["file"] == path and told["detail"]["level"] == "summary"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path, encoding="utf-8") as f:
        whole = json.load(f)
    assert {r["pid"] for r in whole["released"]} == {r["pid"] for r in full["released"]}
    assert set(whole["holder_processes"]) == set(full["holder_processes"])
    assert [g["holders"] for g in whole["gpus"]] == [g["holders"] for g in full["gpus"]]
    print("\nlen(str(result)) at 64 GPUs x", PER_GPU, "processes per GPU (summary, full):", sizes)


def test_the_roles_events_and_set_stats_fit_under_ansible_runner(gpusim_factory, collection, tmp_path):
    """proxmox_fence then gpu_idle (with its release), in check mode, under ansible-runner as AWX runs them: no
    event's result is dropped, each is under the limit, and so are the set_stats artifacts."""
    host = gpusim_factory(gpus=BIG_GPUS)
    start_big(host)
    pdd = tmp_path / "runner"
    for sub in ("project", "inventory", "env"):
        (pdd / sub).mkdir(parents=True)
    (pdd / "project" / "site.yml").write_text(json.dumps([{
        "name": "Fence and release a 64-GPU node", "hosts": "node", "gather_facts": False,
        "roles": [{"role": "gpuops.gpu.proxmox_fence", "proxmox_fence_containers": [BIG_VMID]},
                  {"role": "gpuops.gpu.gpu_idle", "gpu_idle_release": True, "gpu_idle_release_users": ["root"]}]}]))
    (pdd / "inventory" / "hosts.json").write_text(json.dumps({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "gpuops_device_files": [host.path("dev", "nvidia*")]},
        "hosts": {"node": {}}}}))
    env = controller_env(collection, pdd, base=host.env_vars(), ANSIBLE_INJECT_INVOCATION="1")
    (pdd / "env" / "envvars").write_text(json.dumps(env))
    run = ansible_runner.run(private_data_dir=str(pdd), playbook="site.yml", cmdline="--check", quiet=True)
    assert run.status == "successful", "".join(e.get("stdout", "") for e in run.events)[-4000:]
    # Each role's job is one task of the action plugin (the fence; the release and the wait), which runs the modules
    done = [e for e in run.events if e.get("event") in ("runner_on_ok", "runner_on_failed")]
    ran = [e for e in done if e["event_data"].get("resolved_action") == "gpuops.gpu.predeploy_host"]
    assert len(ran) == 2, [e["event_data"].get("task") for e in done]
    for e in ran:
        res = e["event_data"]["res"]
        assert res, f"{e['event_data']['task']}: its result was dropped (over {RUNNER_LIMIT:,} characters)"
    biggest = max(runner_size(e["event_data"].get("res")) for e in done)
    assert biggest < RUNNER_LIMIT // 2, biggest
    stats = [e for e in run.events if e.get("event") == "playbook_on_stats"][-1]["event_data"]["artifact_data"]
    assert runner_size(stats) < RUNNER_LIMIT // 10, runner_size(stats)
    summary = stats["gpu_idle_summary"]["node"]
    assert summary["ready"] is False and summary["check_mode"] is True  # busy GPUs: it would wait
    assert len(summary["released"]) + summary["more"]["released"] > 4 * BIG_GPUS
    assert stats["proxmox_fence_summary"]["node"]["released"]
    print(f"\nlargest event {biggest:,}, set_stats {runner_size(stats):,} characters")


# --- the heavy node with --diff (issue 34, item 2) --------------------------------------------------------------

EVENT_GOAL = 200000  # DESIGN.md 6b: every event under this as ansible-runner measures it, even with --diff
FENCED_GPUS = 32
FENCED_SERVERS = 2   # in the fenced container: 64 workers, each holding all 32 nodes (64 GPUs x 4: bench_output --fenced)
FENCED_VMID = 7602


def test_the_fence_with_diff_on_a_heavy_node_fits_every_event(gpusim_factory, collection, tmp_path):
    """The fence (servers inside the fenced container) and the wait after it, with --diff, in check mode and then
    for real, under ansible-runner itself: every event's res under 200,000 characters (ansible-runner's own limit
    raised, so that what it would drop is measured); the fence carries its release's outcome, not its snapshot and
    diff again; the diff shows the units and each GPU before and after, bounded."""
    host = gpusim_factory(gpus=FENCED_GPUS)
    host.ct_create(FENCED_VMID, hostname="fenced-heavy")
    host.ct_start(FENCED_VMID)
    for index in range(FENCED_SERVERS):
        for low in range(0, FENCED_GPUS, 16):
            host.hold(gpus=f"{low}-{low + 15}", mib=1024, tree=True, ct=FENCED_VMID, name=f"{COMMAND} --worker-set {index}")
    devices = [host.path("dev", "nvidia*")]
    play = [{"name": "Fence and wait", "hosts": "node", "gather_facts": False, "tasks": [
        {"name": "Fence", "register": "fenced", "gpuops.gpu.proxmox_gpu_containers": {
            "containers": [FENCED_VMID], "state": "released", "pct": host.path("bin", "pct"), "device_files": devices}},
        {"name": "Wait", "gpuops.gpu.gpu_wait_idle": {"device_files": devices, "timeout": 60}}]}]
    inventory = {"all": {"hosts": {"node": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}
    largest = {}
    for mode, cmdline in (("check", "--check --diff"), ("real", "--diff")):
        run = run_under_runner(collection, tmp_path / mode, play, inventory, base=host.env_vars(), cmdline=cmdline,
                               MAX_EVENT_RES=str(10 ** 9))
        assert run.status == "successful", "".join(e.get("stdout", "") for e in run.events)[-4000:]
        sizes = event_sizes(run.events)
        largest[mode] = sizes[0]
        assert sizes[0][0] < EVENT_GOAL, (mode, sizes[:3])
        fence = [e["event_data"]["res"] for e in run.events
                 if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == "Fence"][0]
        release = fence["release"]
        left = fence["detail"]["more"].get("release.released", 0)  # a summary's count of what it left out
        assert len(release["released"]) + left >= FENCED_SERVERS * (FENCED_GPUS + 2)
        # the release's outcome, its GPUs as records; its diff is the fence's
        looks = release["gpus"] + release.get("gpus_before", [])  # check mode: one look (gpus)
        assert "diff" not in release and looks and all("process_count" in g for g in looks)
        assert ("gpus_before" in release) is (mode == "real")
        diffs = [e["event_data"]["diff"] for e in run.events if e.get("event") == "runner_on_file_diff"
                 and e["event_data"].get("task") == "Fence"][0]
        gpus = [d for d in diffs if "GPU 0: " in d.get("before", "")][0]
        before, after = gpus["before"].splitlines(), gpus["after"].splitlines()
        assert len(before) == len(after) == FENCED_GPUS, (before[:3], after[:3])
        assert all(len(line) < 1000 for line in before + after) and f"in CT {FENCED_VMID}" in before[0], before[0]
        assert after[0] == "GPU 0: released" if mode == "check" else after[0].startswith("GPU 0: "), after[0]
    print(f"\nlargest event with --diff at {FENCED_GPUS} GPUs x {FENCED_SERVERS} servers in the fenced container:", largest)
