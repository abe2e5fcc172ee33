"""Secrets on a command line never leave the modules: facts, results, diffs, failures.

The workload's command line carries ``--api-key sk-...`` and ``HF_TOKEN=hf_...`` (the simulator's
``hold(name=...)`` sets its argv); the whole output of every module run must not contain them,
while ``match`` still selects on the real command line.
"""

import os

from modrun import alive, run_module_text

SK = "sk-proj0123456789abcdefXYZsecret"
HF = "hf_AbCdEfGhIjKlMnOpQrStUv123secret"
NAME = f"python3 -m vllm.entrypoints.openai.api_server --port 8000 --api-key {SK} HF_TOKEN={HF}"
SHOWN = "python3 - -m vllm.entrypoints.openai.api_server --port 8000 --api-key **** HF_TOKEN=****"


def assert_no_secret(text):
    for secret in (SK, HF, SK[3:], HF[3:]):
        assert secret not in text, f"{secret} leaked: ...{text[max(0, text.find(secret) - 200):text.find(secret) + 50]}..."


def base(host, **extra):
    return dict({"device_files": [os.path.join(host.dir, "dev", "nvidia*")]}, **extra)


def test_secrets_never_leave_facts_release_or_wait(gpusim, collection):
    holder = gpusim.hold(gpus=[0], mib=2048, name=NAME)
    with open(f"/proc/{holder}/cmdline", "rb") as f:
        assert SK.encode() in f.read()  # the secret is really there

    facts, out = run_module_text(gpusim, collection, "gpu_facts", base(gpusim))
    assert_no_secret(out)
    procs = facts["ansible_facts"]["gpu_devices"][0]["processes"]
    assert [p["cmdline"] for p in procs if p["pid"] == holder] == [SHOWN]
    assert holder in facts["ansible_facts"]["gpu_devices"][0]["holders"]["context"]
    assert facts["ansible_facts"]["gpu_holder_processes"][str(holder)]["cmdline"] == SHOWN

    # The wait fails at its timeout; its diagnosis, gpus and blockers carry the process.
    res, out = run_module_text(gpusim, collection, "gpu_wait_idle", base(gpusim, gpus=["0"], timeout=1, settle=0.5))
    assert res.get("failed") and "timed out" in res["msg"], res
    assert_no_secret(out)
    assert any(p.get("cmdline") == SHOWN for g in res["gpus"] for p in g["processes"])

    # match selects on the real command line (the secret itself), yet nothing shows it. exclude keeps
    # the simulator's own processes (the workload's parent is its daemon) out of the release.
    release = base(gpusim, gpus=["0"], match="api-key sk-proj0123", exclude="gpusimkit", grace_period=5)
    res, out = run_module_text(gpusim, collection, "gpu_release", release, check_mode=True, diff=True)
    assert not res.get("failed") and res["changed"], res
    assert [x["pid"] for x in res["released"]] == [holder] and res["released"][0]["cmdline"] == SHOWN
    assert "diff" in res
    assert_no_secret(out)
    assert alive(holder)

    res, out = run_module_text(gpusim, collection, "gpu_release", release, diff=True)
    assert not res.get("failed") and [x["pid"] for x in res["released"]] == [holder], res
    assert res["released"][0]["cmdline"] == SHOWN and "diff" in res
    assert_no_secret(out)
    assert not alive(holder)


def test_cmdline_false_and_extra_redact_patterns(gpusim, collection):
    holder = gpusim.hold(gpus=[1], mib=1024, name=NAME)
    facts, out = run_module_text(gpusim, collection, "gpu_facts", base(gpusim, gpus=["1"], cmdline=False))
    assert_no_secret(out)
    entries = facts["ansible_facts"]["gpu_devices"][0]["processes"] + list(facts["ansible_facts"]["gpu_holder_processes"].values())
    assert entries and all(e["cmdline"] is None for e in entries if e["pid"] == holder)

    facts, out = run_module_text(gpusim, collection, "gpu_facts",
                                 base(gpusim, gpus=["1"], redact=[r"--port (\d+)", r"openai\.api_server"]))
    assert_no_secret(out)
    shown = [p["cmdline"] for p in facts["ansible_facts"]["gpu_devices"][0]["processes"] if p["pid"] == holder]
    assert shown == ["python3 - -m vllm.entrypoints.**** --port **** --api-key **** HF_TOKEN=****"]

    # protect still matches the real command line, with cmdline: false too.
    res, out = run_module_text(gpusim, collection, "gpu_release",
                               base(gpusim, gpus=["1"], protect=["HF_TOKEN=hf_AbCd"], exclude="gpusimkit", cmdline=False), check_mode=True)
    assert not res.get("failed") and res["released"] == [], res
    assert [(p["pid"], p["cmdline"]) for p in res["protected"]] == [(holder, None)]
    assert_no_secret(out)
    assert alive(holder)
