"""The parsers and the nvidia-smi backend against real outputs from the field (tests/field, SOURCES.md).

- every ``nvidia-smi -q -x`` of the corpus through ``_smi.parse_minor_numbers`` and, through the replaying
  nvidia-smi (tests/field/replay_smi.py), ``_smi.minor_query``;
- every captured ``--query-gpu`` / ``--query-compute-apps`` pair through ``_smi.query`` (the backend as the
  modules run it), idle and under load, Linux and Windows, MIG on and off, against what the CSV itself says;
- every ``--help-query-gpu`` listing: the backend asks exactly the fields that listing names (before R510:
  no memory.reserved) and, when it cannot read the listing, drops the field the real tool refuses;
- every container config through ``_pct.parse_config``;
- on the simulator, whose nvidia-smi refuses fields by driver branch as those listings do: gpu_facts with
  the nvidia-smi backend on pre-R510 profiles, and proxmox_gpu_containers with pending passthrough changes.
"""

import csv
import importlib
import json
import os
import re
import subprocess
import sys

import pytest
from modrun import run_module_text

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIELD = os.path.join(TOP, "tests", "field")
SMI = os.path.join(FIELD, "smi")
REPLAY = os.path.join(FIELD, "replay_smi.py")
HOSTS = sorted(os.listdir(SMI))


def meta(host):
    with open(os.path.join(SMI, host, "meta.json"), encoding="utf-8") as f:
        return json.load(f)


def has(host, name):
    return os.path.isfile(os.path.join(SMI, host, name))


def text(host, name):
    with open(os.path.join(SMI, host, name), encoding="utf-8") as f:
        return f.read()


XML_HOSTS = [h for h in HOSTS if has(h, "q.xml")]
CSV_HOSTS = [h for h in HOSTS if has(h, "query-gpu.idle.csv")]
LISTING_HOSTS = [h for h in HOSTS if has(h, "help-query-gpu.txt")]
with open(os.path.join(FIELD, "pct", "index.json"), encoding="utf-8") as _f:
    PCT = json.load(_f)


@pytest.fixture(scope="module")
def utils(tmp_path_factory):
    """The collection's module_utils, imported from this checkout (laid out as ansible_collections)."""
    root = tmp_path_factory.mktemp("layout")
    (root / "ansible_collections" / "gpuops").mkdir(parents=True)
    os.symlink(TOP, root / "ansible_collections" / "gpuops" / "gpu")
    sys.path.insert(0, str(root))
    try:
        base = "ansible_collections.gpuops.gpu.plugins.module_utils"
        return {name: importlib.import_module(f"{base}.{name}") for name in ("_smi", "_pct", "_errors")}
    finally:
        sys.path.remove(str(root))


@pytest.fixture
def replay(tmp_path, utils):
    """replay(host, state="idle", no_help=False, rows_from=None) -> (run, executable, calls): run(argv) -> (rc, out,
    err) runs the replaying nvidia-smi (installed as DIR/bin/nvidia-smi); calls() lists the argvs it was given. Each
    replay is a run of its own for the backend (its field list is read anew). ``rows_from``: the host whose CSV
    captures answer the queries (FIELD_SMI_ROWS), the fields accepted being ``host``'s listing's."""
    def make(host, state="idle", no_help=False, rows_from=None):
        utils["_smi"]._LISTED.clear()
        utils["_smi"]._DROPPED.clear()
        bindir = tmp_path / host / state / "bin"
        bindir.mkdir(parents=True)
        exe = bindir / "nvidia-smi"
        exe.write_text(f'#!/bin/sh\nexec {sys.executable} {REPLAY} "$@"\n', encoding="utf-8")
        exe.chmod(0o755)
        log = tmp_path / host / state / "calls.jsonl"
        env = dict(os.environ, FIELD_SMI_HOST=os.path.join(SMI, host), FIELD_SMI_STATE=state, FIELD_SMI_LOG=str(log),
                   FIELD_SMI_NO_HELP="1" if no_help else "0", FIELD_SMI_ROWS=os.path.join(SMI, rows_from) if rows_from else "")

        def run(argv):
            p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
            return p.returncode, p.stdout, p.stderr

        def calls():
            if not log.exists():
                return []
            return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]

        return run, str(exe), calls

    yield make
    utils["_smi"]._LISTED.clear()
    utils["_smi"]._DROPPED.clear()


# --- the corpus itself ------------------------------------------------------------------------------

def test_every_file_has_its_source():
    """Every output in tests/field is named in a sidecar with its source, and SOURCES.md lists it."""
    with open(os.path.join(FIELD, "SOURCES.md"), encoding="utf-8") as f:
        sources = f.read()
    for host in HOSTS:
        m = meta(host)
        src = m["source"]
        assert ("repo" in src and "path" in src and re.fullmatch(r"[0-9a-f]{40}", src["commit"])) or \
            src.get("url", "").startswith("https://"), (host, src)
        on_disk = set(os.listdir(os.path.join(SMI, host))) - {"meta.json"}
        assert on_disk == set(m["files"]), host
        assert f"`{host}`" in sources, host
    for name in os.listdir(os.path.join(FIELD, "pct")):
        if name == "index.json":
            continue
        assert name in PCT, name
        src = PCT[name]["source"]
        assert ("repo" in src and re.fullmatch(r"[0-9a-f]{40}", src["commit"])) or src["url"].startswith("https://")
        assert f"`{name}`" in sources, name
    assert len(XML_HOSTS) >= 20 and len(CSV_HOSTS) >= 10 and len(LISTING_HOSTS) >= 10 and len(PCT) >= 10


# --- nvidia-smi -q -x ---------------------------------------------------------------------------------

def expected_minors(host):
    return {g["uuid"]: int(g["minor_number"]) for g in meta(host)["expect"]["xml_gpus"]
            if g["uuid"] and g["minor_number"] is not None and g["minor_number"].isdigit()}


@pytest.mark.parametrize("host", XML_HOSTS)
def test_minor_numbers_from_real_xml(host, utils, replay):
    minors = expected_minors(host)
    assert utils["_smi"].parse_minor_numbers(text(host, "q.xml")) == minors
    if meta(host)["os"] == "windows":
        assert minors == {}  # WDDM: N/A, never guessed
    else:
        # (the placeholder UUIDs of some stored copies can repeat: one entry per distinct UUID)
        assert len(minors) == len({g["uuid"] for g in meta(host)["expect"]["xml_gpus"]}) >= 1
    run, exe, calls = replay(host)
    assert utils["_smi"].minor_query(run, exe) == minors
    assert calls() == [["-q", "-x"]]


# --- --query-gpu / --query-compute-apps through the backend ------------------------------------------------

def capture(host, name):
    """(header names without units, rows as dicts) of a captured --format=csv output."""
    rows = list(csv.reader(text(host, name).splitlines(), skipinitialspace=True))
    names = [re.sub(r" \[[^\]]+\]$", "", h) for h in rows[0]]
    return names, [dict(zip(names, r)) for r in rows[1:] if r]


def number(cell):
    m = re.match(r"^(-?[0-9.]+)(?: \S+)?$", cell)
    return None if m is None else float(m.group(1))


def enabled(cell):
    return {"Enabled": True, "Disabled": False}.get(cell)


@pytest.mark.parametrize("state", ["idle", "load"])
@pytest.mark.parametrize("host", CSV_HOSTS)
def test_backend_reads_real_captures(host, state, utils, replay):
    smi = utils["_smi"]
    run, exe, calls = replay(host, state)
    raw = smi.query(run, exe)
    again = smi.query(run, exe)
    assert again["gpus"] == raw["gpus"]
    # R590 and later know every field the backend asks: no refusal, so no --help-query-gpu either
    assert raw["driver"]["missing_fields"] == []
    assert "--help-query-gpu" not in [c[0] for c in calls()]
    assert raw["driver"]["driver_version"] == meta(host)["driver"]
    _names, rows = capture(host, f"query-gpu.{state}.csv")
    assert len(raw["gpus"]) == len(rows) >= 1
    for gpu, row in zip(raw["gpus"], rows):
        assert gpu["index"] == int(row["index"]) and gpu["uuid"] == row["uuid"] and gpu["name"] == row["name"]
        assert gpu["pci_bus_id"] == row["pci.bus_id"]
        for key in ("total", "used", "free", "reserved"):
            want = number(row[f"memory.{key}"])
            assert gpu["memory"][key] == (None if want is None else int(want)), (key, row[f"memory.{key}"])
        assert gpu["memory"]["used_includes_reserved"] is (False if gpu["memory"]["used"] is not None else None)
        assert gpu["utilization"]["gpu"] == (None if number(row["utilization.gpu"]) is None
                                             else int(number(row["utilization.gpu"])))
        assert gpu["power"] == number(row["power.draw"])
        assert gpu["persistence_mode"] is enabled(row["persistence_mode"])
        assert gpu["mig_mode"] is enabled(row["mig.mode.current"])
        assert gpu["compute_mode"] == row["compute_mode"].lower()
    _names, apps = capture(host, f"query-compute-apps.{state}.csv")
    procs = [p for g in raw["gpus"] for p in g["processes"]]
    # one GPU per capture; the capture script masked every UUID the same, so only the count can be matched
    assert len({r["uuid"] for r in rows}) == len(rows)
    assert sorted(p["pid"] for p in procs) == sorted(int(a["pid"]) for a in apps)
    for p in procs:
        a = next(a for a in apps if int(a["pid"]) == p["pid"])
        want = number(a["used_gpu_memory"])
        assert p["used_mib"] == (None if want is None else int(want)), a  # [N/A] on Windows (WDDM)
    if "mig" in host:
        assert all(g["mig_mode"] is True for g in raw["gpus"])
    if state == "load":
        assert procs, "the load captures hold processes"


def test_replayed_nounits_is_the_real_nounits(replay):
    """netdata's tesla-p100.csv is a real `--format=csv,nounits` output (units in the header, none in the
    values): asking the replay for the same gives it back, line for line."""
    host = "netdata-tesla-p100-csv"
    real = text(host, "query-gpu.csv").splitlines()
    run, exe, _calls = replay(host)
    rc, out, _err = run([exe, meta(host)["files"]["query-gpu.csv"]["argv"][0], "--format=csv,nounits"])
    assert rc == 0 and out.splitlines() == real
    rc, out, _err = run([exe, "--query-gpu=memory.reserved,memory.used,memory.free", "--format=csv,noheader,nounits"])
    assert (rc, out) == (0, "103, 0, 16280\n")


# --- the field listings: what the backend asks on each branch ------------------------------------------------

def listed(host, utils):
    return utils["_smi"].parse_listed_fields(text(host, "help-query-gpu.txt"))


@pytest.mark.parametrize("host", LISTING_HOSTS)
def test_listings(host, utils):
    names = listed(host, utils)
    assert {"index", "uuid", "name", "gpu_name", "memory.used", "driver_version"} <= names
    assert "minor_number" not in names  # no branch has it (the simulator's nvidia-smi refuses it too)
    assert ("memory.reserved" in names) is (meta(host)["branch"] != "pre-R510")
    if meta(host)["branch"] in ("R590", "R595", "R610"):
        assert {"power.draw.instant", "clocks_event_reasons.active", "fabric.state", "remapped_rows.pending"} <= names


@pytest.mark.parametrize("host", [h for h in LISTING_HOSTS if not has(h, "query-gpu.idle.csv")])
def test_backend_asks_only_listed_fields(host, utils, replay):
    """A host with a listing and no CSV capture (pre-R510, R510-R525): the backend asks every field; the
    pre-R510 nvidia-smi refuses memory.reserved, then the backend reads the listing (once) and asks only what
    it names. The replay has no rows to give at the end (exit 99), which fails the read, naming NVML."""
    smi = utils["_smi"]
    names = listed(host, utils)
    run, exe, calls = replay(host)
    with pytest.raises(utils["_errors"].BackendError) as info:
        smi.query(run, exe)
    assert "exit 99" in info.value.msg and "nvidia-ml-py" in info.value.msg
    asked = [c[0].split("=", 1)[1].split(",") for c in calls() if c[0].startswith("--query-gpu=")]
    helps = [c for c in calls() if c == ["--help-query-gpu"]]
    if meta(host)["branch"] == "pre-R510":
        assert asked == [smi.GPU_FIELDS, [f for f in smi.GPU_FIELDS if f in names]] and len(helps) == 1
        assert "memory.reserved" not in asked[1]
    else:
        assert set(smi.GPU_FIELDS) <= names
        assert asked == [smi.GPU_FIELDS] and helps == []


# Real rows for the listings that come without a capture of their own (pre-R510, R510-R525): an R590 capture
# that has every column the backend asks; only the columns that listing accepts are taken from it.
ROWS_FOR_LISTING_ONLY = "exporter-linux-h200-590.48.01"


@pytest.mark.parametrize("host", LISTING_HOSTS)
def test_every_listing_gives_the_gpus_and_names_what_it_lacks(host, utils, replay):
    """Issue 27 item 3, one test per real --help-query-gpu listing: the backend, with an nvidia-smi that accepts
    exactly what that listing names, ends with the GPUs (never an empty success), the fields it could give, and
    missing_fields naming the ones it could not (memory.reserved before R510)."""
    smi = utils["_smi"]
    names = listed(host, utils)
    rows_from = None if has(host, "query-gpu.idle.csv") else ROWS_FOR_LISTING_ONLY
    run, exe, calls = replay(host, rows_from=rows_from)
    raw = smi.query(run, exe)
    _names, rows = capture(rows_from or host, "query-gpu.idle.csv")
    assert len(raw["gpus"]) == len(rows) >= 1
    lacking = [f for f in smi.GPU_FIELDS if f not in names]
    assert raw["driver"]["missing_fields"] == lacking
    asked = [c[0].split("=", 1)[1].split(",") for c in calls() if c[0].startswith("--query-gpu=")]
    assert set(asked[-1]) == set(smi.GPU_FIELDS) - set(lacking)
    for gpu, row in zip(raw["gpus"], rows):
        assert (gpu["index"], gpu["uuid"]) == (int(row["index"]), row["uuid"])
        assert gpu["memory"]["used"] == int(number(row["memory.used"]))
        if "memory.reserved" in lacking:
            # that nvidia-smi reads NVML's v1 figures: used includes what it cannot report apart
            assert gpu["memory"]["reserved"] is None and gpu["memory"]["used_includes_reserved"] is True
        else:
            assert gpu["memory"]["reserved"] == int(number(row["memory.reserved"]))


def test_exit_0_without_a_row_is_a_failure_naming_the_fields(utils, replay, tmp_path):
    """nvidia-smi that exits 0 and prints no GPU row (the corpus's pre-R510 listing, rows from a capture with its
    header only): a failure that names the fields asked and those it lacks, never 'no GPU' with no message."""
    rows = tmp_path / "header-only"
    rows.mkdir()
    real = text(ROWS_FOR_LISTING_ONLY, "query-gpu.idle.csv").splitlines(True)
    (rows / "query-gpu.idle.csv").write_text(real[0], encoding="utf-8")  # the real header, no row
    (rows / "query-compute-apps.idle.csv").write_text(text(ROWS_FOR_LISTING_ONLY, "query-compute-apps.idle.csv"),
                                                      encoding="utf-8")
    run, exe, _calls = replay("exporter-2021-help-query-gpu", rows_from=str(rows))
    with pytest.raises(utils["_errors"].BackendError) as info:
        utils["_smi"].query(run, exe)
    msg = info.value.msg
    assert "exited 0 and gave no GPU row" in msg and "memory.reserved" in msg and "backend: nvml" in msg
    assert info.value.details["missing_fields"] == ["memory.reserved"]


def test_pre_r510_refusal_without_a_listing_drops_the_field(utils, replay):
    """When --help-query-gpu cannot be read, the backend asks every field; the pre-R510 nvidia-smi refuses
    memory.reserved (exit 2, as the real one), and the backend asks again without it."""
    smi = utils["_smi"]
    run, exe, calls = replay("exporter-2021-help-query-gpu", no_help=True)
    rc, out, _err = run([exe, "--query-gpu=index,memory.reserved", "--format=csv"])
    assert (rc, out) == (2, 'Field "memory.reserved" is not a valid field to query.\n\n')
    with pytest.raises(utils["_errors"].BackendError):
        smi.query(run, exe)  # exit 99 at the end: the corpus has no pre-R510 CSV with these fields
    asked = [c[0].split("=", 1)[1].split(",") for c in calls() if c[0].startswith("--query-gpu=") and len(c[0]) > 40]
    assert asked == [smi.GPU_FIELDS, [f for f in smi.GPU_FIELDS if f != "memory.reserved"]]
    assert ["--help-query-gpu"] in calls()


# --- container configs ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PCT))
def test_container_configs(name, utils):
    with open(os.path.join(FIELD, "pct", name), encoding="utf-8") as f:
        cfg = utils["_pct"].parse_config(f.read())
    want = PCT[name]["expect"]
    assert (cfg["hostname"], cfg["passthrough"], cfg["minors"]) == (want["hostname"], want["passthrough"], want["minors"])
    assert all(":" in line for line in cfg["lines"])


# --- the simulator: pre-R510 through nvidia-smi, pending passthrough ------------------------------------------

@pytest.mark.parametrize("profile, missing", [("r440", ["memory.reserved", "mig.mode.current", "mig.mode.pending"]),
                                              ("r470", ["memory.reserved"]), ("r580", [])])
def test_gpu_facts_through_nvidia_smi_on_old_branches(gpusim_factory, collection, profile, missing):
    host = gpusim_factory(driver=profile, gpus=2)
    pid = host.hold(gpus=[0], mib=1024)
    res = run_module_text(host, collection, "gpu_facts", {"backend": "nvidia-smi",
                                                          "device_files": [host.dir + "/dev/nvidia*"]})[0]
    assert not res.get("failed"), res.get("msg")
    facts = res["ansible_facts"]
    assert facts["gpu_driver"]["backend"] == "nvidia-smi"
    assert facts["gpu_driver"]["missing_fields"] == missing
    gpu0 = facts["gpu_devices"][0]
    assert gpu0["memory"]["used"] == 1024 and [p["pid"] for p in gpu0["processes"]] == [pid]
    assert gpu0["memory"]["used_includes_reserved"] is ("memory.reserved" in missing)
    assert gpu0["memory"]["reserved"] == (None if missing else 0)


def pct_run(host, collection, **args):
    args.setdefault("pct", host.path("bin", "pct"))
    return run_module_text(host, collection, "proxmox_gpu_containers", args)[0]


def add_pending(host, vmid, lines):
    """What `pct set` writes for a running container when the change cannot be hot-plugged (pve-container
    PVE::LXC::Config->write_pct_config: a [pve:pending] section after the current keys)."""
    with open(host.ct_config_path(vmid), "a", encoding="utf-8") as f:
        f.write("\n[pve:pending]\n" + "".join(line + "\n" for line in lines))


@pytest.mark.parametrize("pending, removed, added, minors", [
    (["delete: dev0"], ["dev0: /dev/nvidia0"], [], []),
    (["dev0: /dev/nvidia1"], ["dev0: /dev/nvidia0"], ["dev0: /dev/nvidia1"], [1]),
])
def test_running_container_is_read_as_it_runs_and_pending_changes_are_said(
        gpusim_factory, collection, pending, removed, added, minors):
    host = gpusim_factory(gpus=2)
    host.ct_create(4140, "gpu-pending", "0", devices_style="dev")
    host.ct_start(4140)
    add_pending(host, 4140, pending)
    res = pct_run(host, collection)
    assert not res.get("failed"), res.get("msg")
    (ct,) = res["containers"]
    assert (ct["vmid"], ct["running"], ct["minors"], ct["gpus"]) == (4140, True, [0], [0])  # what it runs with
    assert res["pending_passthrough"] == [{"vmid": 4140, "removed": removed, "added": added, "minors": minors}]
    warnings = [w if isinstance(w, str) else (w.get("event") or {}).get("msg", json.dumps(w)) for w in res.get("warnings") or []]
    assert any("CT 4140 has pending changes to its NVIDIA passthrough" in w for w in warnings), res.get("warnings")


def test_stopped_container_is_read_with_its_pending_changes(gpusim_factory, collection):
    host = gpusim_factory(gpus=2)
    host.ct_create(4141, "gpu-stopped", "0", devices_style="dev")
    add_pending(host, 4141, ["dev0: /dev/nvidia1"])
    res = pct_run(host, collection, containers=[4141])
    (ct,) = res["containers"]
    assert (ct["running"], ct["minors"]) == (False, [1]) and res["pending_passthrough"] == []
