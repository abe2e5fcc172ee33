"""The simulated node's Proxmox VE containers (gpusimkit.container: real LXC containers) and `pct`.

Real LXC (lxc-start, lxc-attach, lxc-stop, lxc-info), real cgroups, real signals: nothing is mocked.
Every test checks afterwards that it left no process, no namespace and no cgroup directory behind.
If LXC is not installed or cannot start a container here, the tests FAIL naming what is missing.

vmids 9100-9199 are reserved for this file (other suites run at the same time).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

KIT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if KIT_ROOT not in sys.path:
    sys.path.insert(0, KIT_ROOT)

from gpusimkit import container, scenario, vmids  # noqa: E402
from gpusimkit import pct as pct_mod  # noqa: E402

NODE = container.nodename()
HEADER = "VMID       Status     Lock         Name                \n"
CT_VMID = re.compile(r"/lxc/(91\d\d)(/|$)")


# --- helpers ---------------------------------------------------------------------------------------

def proc_read(pid, name, binary=False):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            data = f.read()
    except OSError:
        return b"" if binary else ""
    return data if binary else data.decode(errors="replace")


def all_pids():
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def ns_links(pid):
    out = set()
    for ns in ("pid", "mnt", "uts"):
        try:
            out.add(os.readlink(f"/proc/{pid}/ns/{ns}"))
        except OSError:
            pass
    return out


def host_ns():
    return ns_links("self")


def stat_state(pid):
    data = proc_read(pid, "stat")
    return data[data.rindex(")") + 2:].split()[0] if data else None


def ours(pid, simdir, vmids_of_test):
    """Is this process one of this test's (started for its scenario or sitting in its containers' cgroups)?"""
    if simdir.encode() in proc_read(pid, "cmdline", True) or simdir.encode() in proc_read(pid, "environ", True):
        return True
    for line in proc_read(pid, "cgroup").splitlines():
        m = CT_VMID.search(line) if line.startswith("0::") else None
        if m and int(m.group(1)) in vmids_of_test:
            return True
    return False


def in_ct_cgroup(pid, vmid, leaf=""):
    """Does /proc/<pid>/cgroup's 0:: line read /lxc/<vmid>/ns<leaf> (leaf None: anywhere below ns)?"""
    want = f"0::/lxc/{vmid}/ns"
    for line in proc_read(pid, "cgroup").splitlines():
        if leaf is None and (line == want or line.startswith(want + "/")):
            return True
        if leaf is not None and line == want + leaf:
            return True
    return False


def find_procs(simdir, argv, vmid, timeout=10.0):
    """Host pids of the live processes running exactly `argv` in the cgroup lxc/<vmid>/ns or
    below it (pct exec and spawn: lxc/<vmid>/ns/.lxc)."""
    deadline = time.monotonic() + timeout
    want = "\0".join(argv).encode() + b"\0"
    while True:
        found = [p for p in all_pids()
                 if proc_read(p, "cmdline", True) == want
                 and in_ct_cgroup(p, vmid, None)
                 and stat_state(p) not in (None, "Z")]
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def gone(pid):
    return stat_state(pid) in (None, "Z", "X")


def wait_gone(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not gone(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


class Sim:
    """A minimal scenario directory with DIR/bin/pct, as SimHost installs it."""

    def __init__(self, simdir):
        self.dir = simdir
        self.namespaces = set()
        self.children = []
        self.vmids = set()
        for sub in ("ct", "bin", "ctbin", "run", "lxc", "dev"):
            os.makedirs(os.path.join(simdir, sub), exist_ok=True)
        scenario.save(simdir, scenario.new_scenario(8, seed=simdir))
        self.pct_path = os.path.join(simdir, "bin", "pct")
        with open(self.pct_path, "w", encoding="utf-8") as f:
            f.write(f"#!{sys.executable}\n"
                    "import sys\n"
                    f"sys.path.insert(0, {KIT_ROOT!r})\n"
                    "from gpusimkit.pct import main\n"
                    f"sys.exit(main(sys.argv[1:], simdir={simdir!r}))\n")
        os.chmod(self.pct_path, 0o755)

    def env(self):
        env = dict(os.environ)
        env["PATH"] = os.path.join(self.dir, "bin") + ":" + env.get("PATH", container.DEFAULT_PATH)
        return env

    def pct(self, *args, input=None, timeout=60):
        proc = subprocess.run([self.pct_path, *map(str, args)], capture_output=True, text=True,
                              input=input, timeout=timeout, env=self.env(), check=False)
        if args and args[0] == "start" and proc.returncode == 0:
            self.track(args[1])
        return proc

    def pct_bg(self, *args, **kw):
        p = subprocess.Popen([self.pct_path, *map(str, args)], env=self.env(), **kw)
        self.children.append(p)
        return p

    def create(self, vmid, **kw):
        self.vmids.add(vmid)
        container.create(self.dir, vmid, **kw)

    def start(self, vmid):
        proc = self.pct("start", vmid)
        assert proc.returncode == 0, f"pct start {vmid} failed ({proc.returncode}): {proc.stderr}"
        return container.init_pid(self.dir, vmid)[0]

    def spawn(self, vmid, argv):
        return container.spawn(self.dir, vmid, argv, {"PATH": container.DEFAULT_PATH})

    def track(self, vmid):
        ip = container.init_pid(self.dir, vmid)
        if ip:
            self.namespaces |= ns_links(ip[0]) - host_ns()

    def init(self, vmid):
        ip = container.init_pid(self.dir, vmid)
        assert ip, f"CT {vmid} is not running"
        return ip[0]


@pytest.fixture
def sim(tmp_path):
    """A scenario directory; afterwards: nothing left (processes, namespaces, cgroups)."""
    simdir = str(tmp_path / "sim")
    os.makedirs(simdir)
    s = Sim(simdir)
    try:
        yield s
    finally:
        problems = container.stop_all(simdir)
        for p in s.children:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                problems.append(f"pct child {p.pid} had to be killed")
        # Zombies of exited inits are reaped by the machine's init, with a delay: wait a little.
        deadline = time.monotonic() + 15
        while True:
            left = [p for p in all_pids() if p != os.getpid() and ours(p, simdir, s.vmids)]
            nss = set()
            for p in all_pids():
                nss |= ns_links(p) & s.namespaces
            # the cgroups of this test's vmids, unless another simulator has taken the vmid since
            cg = [d for v in sorted(s.vmids) if vmids.owner(v) is None
                  for d in container.lxc_cgroups(v) if os.path.exists(d)]
            cg += [f"reservation of {v}" for v in sorted(s.vmids) if vmids.owner(v) == os.path.realpath(simdir)]
            if not left and not nss and not cg:
                break
            if time.monotonic() >= deadline:
                problems.append(f"left behind: processes {[(p, proc_read(p, 'cmdline')) for p in left]}, "
                                f"namespaces {sorted(nss)}, cgroups {cg}")
                break
            time.sleep(0.1)
        assert not problems, problems


# --- capabilities ------------------------------------------------------------------------------------

def test_machine_can_run_lxc_containers(sim):
    """Not a skip: CI must fail loudly when LXC is missing or cannot start a container."""
    try:
        container.check_lxc()
        container.cgroup2_mount()
    except container.ContainerError as e:
        pytest.fail(f"missing capability: {e}")
    r = subprocess.run(["lxc-start", "--version"], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and r.stdout.strip().startswith("5."), r
    sim.create(9199, hostname="probe", devices_style="none")
    init = sim.start(9199)
    assert container.status(sim.dir, 9199) == "running"
    r = subprocess.run(["lxc-ls", "-P", container.lxcpath(sim.dir), "--running"], capture_output=True, text=True,
                       check=False)
    assert r.stdout.split() == ["9199"]
    # pve-container's layout in every hierarchy: the payload in lxc/<vmid>/ns, lxc-start's monitor in
    # lxc.monitor/<vmid>
    assert "0::/lxc/9199/ns" in proc_read(init, "cgroup").splitlines()
    monitor = int(proc_read(init, "stat").rsplit(")", 1)[1].split()[1])
    assert "0::/lxc.monitor/9199" in proc_read(monitor, "cgroup").splitlines()
    with open(os.path.join(container.lxcpath(sim.dir), "9199", "config"), encoding="utf-8") as f:
        conf = f.read().splitlines()
    for line in ("lxc.cgroup.dir.container = lxc/9199", "lxc.cgroup.dir.container.inner = ns",
                 "lxc.cgroup.dir.monitor = lxc.monitor/9199", "lxc.net.0.type = empty", "lxc.uts.name = probe"):
        assert line in conf


def test_lxc_missing_fails_naming_the_set_up(sim, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(container, "DEFAULT_PATH", "/nonexistent")
    with pytest.raises(container.ContainerError, match="LXC is not installed.*setup-lxc.sh"):
        container.check_lxc()


def test_a_vmid_is_one_per_machine(sim, tmp_path, monkeypatch):
    """Two simulators never take the same vmid: /lxc/<vmid> is one cgroup per machine."""
    other = Sim(str(tmp_path / "other"))
    sim.create(9160)
    monkeypatch.setattr(vmids, "VMID_WAIT_S", 0.3)
    with pytest.raises(container.ContainerError, match="vmid 9160 is in use by another simulator"):
        other.create(9160)
    assert container.stop_all(sim.dir) == []  # gpusim down releases it
    other.create(9160)
    assert vmids.owner(9160) == os.path.realpath(other.dir)
    assert container.stop_all(other.dir) == []
    assert vmids.owner(9160) is None


# --- create / config ---------------------------------------------------------------------------------

CONFIG_LXC = """arch: amd64
cores: 8
hostname: gpu-ct
memory: 32768
net0: name=eth0,bridge=vmbr0,firewall=1,hwaddr={hw},ip=dhcp,type=veth
ostype: debian
rootfs: local-lvm:vm-9110-disk-0,size=32G
swap: 512
unprivileged: 1
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 509:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file
"""


def test_config_lxc_style(sim):
    sim.create(9110, hostname="gpu-ct", gpus="0,1")
    r = sim.pct("config", 9110)
    assert r.returncode == 0, r.stderr
    hw = re.search(r"hwaddr=([0-9A-F:]+)", r.stdout).group(1)
    assert re.fullmatch(r"BC:24:11(:[0-9A-F]{2}){3}", hw)
    assert r.stdout == CONFIG_LXC.format(hw=hw)
    assert r.stderr == ""


def test_config_all_gpus_dev_style_and_none(sim):
    sim.create(9111, gpus="all", devices_style="dev")
    out = sim.pct("config", 9111).stdout
    devs = re.findall(r"^(dev\d+): (\S+)$", out, re.M)
    assert devs == sorted(devs)  # sorted keys, as PVE prints them
    assert {p for _key, p in devs} == {f"/dev/nvidia{i}" for i in range(8)} | {
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    assert "hostname: CT9111\n" in out  # PVE's default hostname
    assert "lxc." not in out
    sim.create(9112, devices_style="none")
    out = sim.pct("config", 9112).stdout
    assert "nvidia" not in out and "lxc." not in out
    assert out.splitlines()[0] == "arch: amd64"


def test_config_toolkit_hook_and_dev_bind_styles_bind_the_simulated_nodes_only(sim):
    """The toolkit's hook (lxc's hooks/nvidia: the nodes of NVIDIA_VISIBLE_DEVICES's GPUs and the control nodes) and
    a bind of the whole /dev are imitated by binding the simulated nodes; neither the hook nor the node's /dev reaches
    LXC's config."""
    for name in [f"nvidia{i}" for i in range(8)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
        open(os.path.join(sim.dir, "dev", name), "w").close()  # the simulated nodes, as SimHost makes them
    sim.create(9114, gpus="2,5", devices_style="hook")
    out = sim.pct("config", 9114).stdout
    assert out.endswith("lxc.hook.mount: /usr/share/lxc/hooks/nvidia\nlxc.environment: NVIDIA_VISIBLE_DEVICES=2,5\n"
                        "lxc.environment: NVIDIA_DRIVER_CAPABILITIES=compute,utility\n"), out
    assert container.config_gpu_minors(sim.dir, 9114) == [2, 5]
    uuids = {g.index: g.uuid for g in scenario.load(sim.dir).gpus}
    conf = container.config_path(sim.dir, 9114)
    for value, minors in ((uuids[6][:12], [6]), ("all", list(range(8))), ("none", []), ("void", []), ("", [])):
        with open(conf, "w", encoding="utf-8") as f:
            f.write(out.replace("NVIDIA_VISIBLE_DEVICES=2,5", "NVIDIA_VISIBLE_DEVICES=" + value))
        assert container.config_gpu_minors(sim.dir, 9114) == minors, value
    with open(conf, "w", encoding="utf-8") as f:
        f.write(out)
    lxc = container.lxc_config(sim.dir, 9114)
    bound = re.findall(r"^lxc\.mount\.entry = \S+/dev/(nvidia\S*) dev/", lxc, re.M)
    assert bound == ["nvidia2", "nvidia5", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"], bound
    assert "lxc.hook" not in lxc
    sim.create(9115, gpus="0", devices_style="devdir")
    out = sim.pct("config", 9115).stdout
    assert out.endswith("lxc.mount.entry: /dev dev none bind,optional,create=dir\n") and "cgroup" not in out, out
    assert container.config_gpu_minors(sim.dir, 9115) == list(range(8))
    lxc = container.lxc_config(sim.dir, 9115)
    assert "= /dev dev " not in lxc
    assert f"lxc.mount.entry = {os.path.realpath(sim.dir)}/dev/nvidia7 dev/nvidia7 none bind,create=file 0 0" in lxc


def test_config_sorts_keys_and_keeps_raw_lines_in_file_order(sim):
    sim.create(9113, hostname="gpu-ct", gpus="1")
    path = container.config_path(sim.dir, 9113)
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    # A config as PVE writes it to disk: keys unsorted, lxc.* lines interleaved, a digest.
    keys = [ln for ln in lines if not ln.startswith("lxc.")]
    raw = [ln for ln in lines if ln.startswith("lxc.")]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(["lock: backup", raw[0], *reversed(keys), "digest: abc", *raw[1:]]) + "\n")
    out = sim.pct("config", 9113).stdout.splitlines()
    assert out[:len(keys) + 1] == sorted(keys + ["lock: backup"])
    assert out[len(keys) + 1:] == raw
    assert "digest: abc" not in out


def test_create_rejects_bad_input(sim):
    for bad in (99, "abc", 1000000000, "0100", -5, "9100x"):
        with pytest.raises(container.ContainerError, match="vmid"):
            container.create(sim.dir, bad)
    sim.create(9114)
    with pytest.raises(container.ContainerError, match="CT 9114 already exists"):
        container.create(sim.dir, 9114)
    with pytest.raises(container.ContainerError, match="gpus"):
        container.create(sim.dir, 9115, gpus="8")
    with pytest.raises(container.ContainerError, match="devices_style"):
        container.create(sim.dir, 9115, devices_style="usb")
    with pytest.raises(container.ContainerError, match="hostname"):
        container.create(sim.dir, 9115, hostname="bad host")
    assert not container.exists(sim.dir, 9115)


# --- list / status -------------------------------------------------------------------------------------

def test_list_empty_prints_nothing(sim):
    r = sim.pct("list")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_list_and_status(sim):
    sim.create(9121, hostname="gpu-a", gpus="0")
    sim.create(9105, hostname="gpu-b", gpus="1")
    r = sim.pct("status", 9121)
    assert (r.returncode, r.stdout) == (0, "status: stopped\n")
    sim.start(9121)
    r = sim.pct("list")
    assert r.returncode == 0
    assert r.stdout == (HEADER
                        + "9105       stopped                 gpu-b               \n"
                        + "9121       running                 gpu-a               \n")
    assert sim.pct("status", 9121).stdout == "status: running\n"
    assert sim.pct("status", 9105).stdout == "status: stopped\n"
    verbose = sim.pct("status", 9121, "--verbose")
    assert verbose.returncode == 0
    lines = verbose.stdout.splitlines()
    assert lines == sorted(lines)
    d = dict(ln.split(": ", 1) for ln in lines)
    assert d["status"] == "running" and d["type"] == "lxc" and d["name"] == "gpu-a" and d["vmid"] == "9121"
    assert int(d["pid"]) == sim.init(9121)
    # a lock shows in the Lock column
    with open(container.config_path(sim.dir, 9105), "a", encoding="utf-8") as f:
        f.write("lock: backup\n")
    assert sim.pct("list").stdout.splitlines()[1] == "9105       stopped    backup       gpu-b               "


# --- errors ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ("status", 9198), ("start", 9198), ("stop", 9198), ("shutdown", 9198), ("config", 9198),
    ("exec", 9198, "--", "true"),
])
def test_unknown_vmid(sim, args):
    r = sim.pct(*args)
    assert r.returncode == 2
    assert r.stderr == f"Configuration file 'nodes/{NODE}/lxc/9198.conf' does not exist\n"
    assert r.stdout == ""


@pytest.mark.parametrize("cmd,vmid", [("status", "abc"), ("start", "99"), ("config", "0100"),
                                      ("stop", "1000000000"), ("exec", "x1")])
def test_bad_vmid(sim, cmd, vmid):
    args = [cmd, vmid] + (["--", "true"] if cmd == "exec" else [])
    r = sim.pct(*args)
    assert r.returncode == 255
    usage = "pct exec <vmid> [<extra-args>] [OPTIONS]" if cmd == "exec" else f"pct {cmd} <vmid> [OPTIONS]"
    assert r.stderr == ("400 Parameter verification failed.\n"
                        "vmid: invalid format - value does not look like a valid VM ID\n"
                        f"{usage}\n")


def test_usage_errors(sim):
    r = sim.pct()
    assert r.returncode == 255 and r.stderr.startswith("ERROR: no command specified\nUSAGE: pct <COMMAND> [ARGS] [OPTIONS]\n")
    r = sim.pct("frobnicate")
    assert r.returncode == 255 and r.stderr.startswith("ERROR: unknown command 'pct frobnicate'\n")
    r = sim.pct("status")
    assert (r.returncode, r.stderr) == (255, "400 not enough arguments\npct status <vmid> [OPTIONS]\n")
    r = sim.pct("status", 9120, 9121)
    assert (r.returncode, r.stderr) == (255, "400 too many arguments\npct status <vmid> [OPTIONS]\n")
    r = sim.pct("status", 9120, "--bogus")
    assert (r.returncode, r.stderr) == (255, "Unknown option: bogus\n400 unable to parse option\n"
                                             "pct status <vmid> [OPTIONS]\n")
    sim.create(9120)
    r = sim.pct("shutdown", 9120, "--timeout", "soon")
    assert (r.returncode, r.stderr) == (255, "400 Parameter verification failed.\n"
                                             "timeout: type check ('integer') failed - got 'soon'\n"
                                             "pct shutdown <vmid> [OPTIONS]\n")
    r = sim.pct("shutdown", 9120, "--forceStop", "maybe")
    assert (r.returncode, r.stderr) == (255, "400 unable to parse boolean option\npct shutdown <vmid> [OPTIONS]\n")


def test_stopped_container_errors(sim):
    sim.create(9122)
    r = sim.pct("exec", 9122, "--", "true")
    assert (r.returncode, r.stdout, r.stderr) == (255, "", "container '9122' not running!\n")
    r = sim.pct("shutdown", 9122)
    assert (r.returncode, r.stderr) == (255, "CT 9122 not running\n")
    r = sim.pct("stop", 9122)
    assert (r.returncode, r.stderr) == (255, "CT 9122 not running\n")
    with pytest.raises(container.ContainerError, match="container '9122' not running!"):
        container.exec_argv(sim.dir, 9122, ["true"], {})
    sim.start(9122)
    r = sim.pct("start", 9122)
    assert (r.returncode, r.stderr) == (255, "CT 9122 already running\n")


# --- exec ------------------------------------------------------------------------------------------------

def test_exec_passes_exit_status_and_stdio(sim):
    sim.create(9123, hostname="gpu-exec")
    sim.start(9123)
    assert sim.pct("exec", 9123, "--", "sh", "-c", "exit 7").returncode == 7
    assert sim.pct("exec", 9123, "--", "true").returncode == 0
    assert sim.pct("exec", 9123, "--", "false").returncode == 1
    r = sim.pct("exec", 9123, "--", "sh", "-c", "cat; echo oops >&2; exit 3", input="hello\n")
    assert (r.returncode, r.stdout, r.stderr) == (3, "hello\n", "oops\n")
    r = sim.pct("exec", 9123, "--", "sh", "-c", "kill -TERM $$")
    assert r.returncode == 128 + signal.SIGTERM
    r = sim.pct("exec", 9123, "--", "no-such-command-gpusim")
    assert r.returncode == 127 and 'Failed to exec "no-such-command-gpusim"' in r.stderr
    r = sim.pct("exec", 9123)
    assert (r.returncode, r.stderr) == (255, "missing command\n")
    r = sim.pct("exec", 9123, "--")
    assert (r.returncode, r.stderr) == (255, "missing command\n")
    # options after the vmid are pct's; after -- they are the command's.  lxc-attach --clear-env: PATH and
    # container=lxc (plus the simulated driver's plumbing); --keep-env (the default): ours, with DIR/ctbin
    # (nvidia-smi in the container) in place of the node's DIR/bin.
    r = sim.pct("exec", 9123, "--keep-env", "0", "--", "sh", "-c", 'echo "$PATH|$GPUSIM_VMID|${HOME:-unset}|$container"')
    assert r.returncode == 0, r.stderr
    path, vmid, home, ct = r.stdout.strip().split("|")
    assert path == os.path.join(sim.dir, "ctbin") + ":" + container.DEFAULT_PATH
    assert (vmid, home, ct) == ("9123", "unset", "lxc")
    r = sim.pct("exec", 9123, "--", "sh", "-c", 'echo "$PATH|$GPUSIM_VMID|${HOME:-unset}"')
    path, vmid, home = r.stdout.strip().split("|")
    assert path.split(":")[0] == os.path.join(sim.dir, "ctbin")
    assert os.path.join(sim.dir, "bin") not in path.split(":")
    assert vmid == "9123" and home == os.environ.get("HOME", "unset")
    assert container.exec_argv(sim.dir, 9123, ["sh", "-c", "exit 42"], {}) == 42


def test_container_processes_live_in_namespaces_and_cgroup(sim):
    sim.create(9124, hostname="gpu-ns", gpus="0,1")
    init = sim.start(9124)
    host_pidns = os.readlink("/proc/self/ns/pid")
    # the init (busybox's): PID 1 of its own namespaces, in lxc/<vmid>/ns
    assert "0::/lxc/9124/ns" in proc_read(init, "cgroup").splitlines()
    assert proc_read(init, "comm") == "init\n"
    assert os.readlink(f"/proc/{init}/ns/pid") != host_pidns
    assert re.search(r"^NSpid:\s+%d\s+1$" % init, proc_read(init, "status"), re.M)

    bg = sim.pct_bg("exec", 9124, "--", "sleep", "300")
    pids = find_procs(sim.dir, ["sleep", "300"], 9124)
    assert len(pids) == 1, pids
    pid = pids[0]
    cg = proc_read(pid, "cgroup").splitlines()
    # What a PVE host shows for a process run by pct exec: lxc-attach's leaf .lxc of the
    # container's cgroup (liblxc cgroup_attach_leaf; task_memcg=/lxc/<vmid>/ns/.lxc in PVE logs).
    assert "0::/lxc/9124/ns/.lxc" in cg, cg
    assert os.readlink(f"/proc/{pid}/ns/pid") == os.readlink(f"/proc/{init}/ns/pid") != host_pidns
    assert os.readlink(f"/proc/{pid}/ns/uts") == os.readlink(f"/proc/{init}/ns/uts")
    assert os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink(f"/proc/{init}/ns/mnt")
    nspid = proc_read(pid, "status").split("NSpid:")[1].split("\n")[0].split()
    assert len(nspid) == 2 and nspid[0] == str(pid) and int(nspid[1]) < 100

    # Inside: only the container's processes, the config's hostname, the same cgroup.
    r = sim.pct("exec", 9124, "--", "ps", "-e", "-o", "pid=,comm=")
    assert r.returncode == 0, r.stderr
    procs = [ln.split(None, 1) for ln in r.stdout.splitlines()]
    assert procs[0] == ["1", "init"]
    assert sorted(c for _pid, c in procs) == ["init", "ps", "sleep"], procs
    r = sim.pct("exec", 9124, "--", "sh", "-c", "ls /proc | grep -c '^[0-9]'")
    assert int(r.stdout) <= 5  # init, sleep, sh, ls, grep
    assert sim.pct("exec", 9124, "--", "hostname").stdout == "gpu-ns\n"
    assert os.uname().nodename != "gpu-ns"  # the host's hostname is untouched
    # LXC gives the container a cgroup namespace rooted at lxc/<vmid>/ns: inside, the leaf reads /.lxc
    r = sim.pct("exec", 9124, "--", "cat", "/proc/self/cgroup")
    assert "0::/.lxc" in r.stdout.splitlines(), r.stdout
    r = sim.pct("exec", 9124, "--", "readlink", "/proc/self/ns/pid")
    assert r.stdout.strip() == os.readlink(f"/proc/{init}/ns/pid")

    assert sim.pct("stop", 9124).returncode == 0
    assert bg.wait(timeout=10) == 128 + signal.SIGKILL
    assert wait_gone(pid)


def test_spawn_detaches(sim):
    sim.create(9125)
    init = sim.start(9125)
    pid = sim.spawn(9125, ["sleep", "300"])
    assert pid and not gone(pid)
    assert find_procs(sim.dir, ["sleep", "300"], 9125) == [pid]
    # detached: its parent is the container's init, which reaps it
    ppid = int(proc_read(pid, "stat").rsplit(")", 1)[1].split()[1])
    assert ppid == init
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid, 5)
    assert sim.pct("exec", 9125, "--", "sh", "-c", "ps -e -o stat= | grep -c Z || true").stdout.strip() == "0"


# --- shutdown / stop ---------------------------------------------------------------------------------

def test_shutdown_stops_cooperative_processes(sim):
    sim.create(9126)
    init = sim.start(9126)
    bg = sim.pct_bg("exec", 9126, "--", "sleep", "300")
    detached = sim.spawn(9126, ["sleep", "301"])
    assert find_procs(sim.dir, ["sleep", "300"], 9126)
    t = time.monotonic()
    r = sim.pct("shutdown", 9126, "--timeout", "20")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert time.monotonic() - t < 10
    assert sim.pct("status", 9126).stdout == "status: stopped\n"
    assert bg.wait(timeout=10) == 128 + signal.SIGTERM
    assert gone(init) and wait_gone(detached)
    assert not [d for d in container.lxc_cgroups(9126) if os.path.exists(d)]
    # and it starts again
    sim.start(9126)
    assert sim.pct("exec", 9126, "--", "true").returncode == 0


def test_shutdown_blocked_by_process_ignoring_sigterm(sim):
    """systemd as PID 1 waits (90 s) for a process that ignores SIGTERM: `pct shutdown --timeout 2`
    gives up, `--forceStop 1` kills the container (lxc-stop without --nokill)."""
    sim.create(9127, systemd=True)
    sim.start(9127)
    code = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(300)")
    bg = sim.pct_bg("exec", 9127, "--", sys.executable, "-c", code, stdout=subprocess.PIPE, text=True)
    assert bg.stdout.readline() == "ready\n"
    stubborn = find_procs(sim.dir, [sys.executable, "-c", code], 9127)
    assert len(stubborn) == 1
    t = time.monotonic()
    r = sim.pct("shutdown", 9127, "--timeout", "2")
    assert (r.returncode, r.stderr) == (255, "container did not stop\n")
    assert 2 <= time.monotonic() - t < 15
    assert not gone(stubborn[0])
    r = sim.pct("shutdown", 9127, "--timeout", "1", "--forceStop", "1")
    assert (r.returncode, r.stderr) == (0, "")
    assert sim.pct("status", 9127).stdout == "status: stopped\n"
    assert wait_gone(stubborn[0])
    bg.wait(timeout=10)
    bg.stdout.close()
    assert not [d for d in container.lxc_cgroups(9127) if os.path.exists(d)]


def test_stop_kills_at_once(sim):
    sim.create(9128)
    init = sim.start(9128)
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    pid = sim.spawn(9128, [sys.executable, "-c", code])
    t = time.monotonic()
    r = sim.pct("stop", 9128)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert time.monotonic() - t < 5
    assert gone(init) and wait_gone(pid)
    assert sim.pct("status", 9128).stdout == "status: stopped\n"


# --- cgroup ownership, crashes, stop_all -------------------------------------------------------------

def test_start_refuses_a_cgroup_with_processes_in_it(sim):
    """lxc/<vmid> holding processes (a container LXC lost track of): start refuses, never kills them."""
    sim.create(9150)
    base = container.cgroup_dirs(9150)[1]
    os.makedirs(base)
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        with open(os.path.join(base, "cgroup.procs"), "w", encoding="utf-8") as f:
            f.write(str(sleeper.pid))
        r = sim.pct("start", 9150)
        assert r.returncode == 255
        assert f"cgroup {base} still has processes [{sleeper.pid}]" in r.stderr
        assert sim.pct("status", 9150).stdout == "status: stopped\n"
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
    assert container.stop_all(sim.dir) == []
    assert not os.path.exists(base)


def test_restart_after_a_crashed_init(sim):
    sim.create(9151)
    init = sim.start(9151)
    sim.spawn(9151, ["sleep", "300"])
    os.kill(init, signal.SIGKILL)  # the init dies: the kernel kills the PID namespace, LXC cleans up
    assert wait_gone(init)
    deadline = time.monotonic() + 10
    while container.status(sim.dir, 9151) != "stopped" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sim.pct("status", 9151).stdout == "status: stopped\n"
    sim.start(9151)
    assert sim.pct("exec", 9151, "--", "true").returncode == 0


def test_stop_all_survives_a_half_broken_state(sim):
    sim.create(9152)
    sim.create(9153)
    sim.create(9154)
    sim.start(9152)
    sim.start(9153)
    os.makedirs(os.path.join(sim.dir, "ct", "9155"))  # a directory without config
    os.unlink(container.config_path(sim.dir, 9153))  # config gone, container still running
    problems = container.stop_all(sim.dir)
    assert problems == []
    assert container.status(sim.dir, 9152) == "stopped"
    assert container.init_pid(sim.dir, 9153) is None
    assert container.stop_all(sim.dir) == []  # idempotent
    assert container.stop_all(os.path.join(sim.dir, "nonexistent")) == []


def test_pct_exec_is_lxc_attach(sim):
    """pct exec becomes lxc-attach (pve-container's exec): a signal to it is lxc-attach's."""
    sim.create(9129)
    sim.start(9129)
    bg = sim.pct_bg("exec", 9129, "--", "sleep", "300")
    pids = find_procs(sim.dir, ["sleep", "300"], 9129)
    assert len(pids) == 1
    assert proc_read(bg.pid, "cmdline", True).split(b"\0")[0].endswith(b"lxc-attach")
    nspid = proc_read(pids[0], "status").split("NSpid:")[1].split("\n")[0].split()[-1]
    assert sim.pct("exec", 9129, "--", "kill", "-TERM", nspid).returncode == 0
    assert bg.wait(timeout=10) in (128 + signal.SIGTERM, -signal.SIGTERM)
    assert wait_gone(pids[0])
    assert container.status(sim.dir, 9129) == "running"


def test_create_without_gpus(sim):
    sim.create(9130, gpus=[])
    sim.create(9131, gpus=None)
    for v in (9130, 9131):
        out = sim.pct("config", v).stdout
        assert "nvidia" not in out and "lxc." not in out


def test_the_node_files_are_as_pmxcfs_shows_them(sim):
    """DIR/etc/pve: pmxcfs' links, .vmlist in pmxcfs' JSON (its entries of this node's containers), and the configs
    that pct config reads (README "The node's files")."""
    d = container.pve_dir(sim.dir)
    node = container.nodename()
    sim.create(9180)
    first = json.load(open(os.path.join(d, ".vmlist"), encoding="utf-8"))
    sim.create(9181, gpus="1", devices_style="dev")
    with open(os.path.join(d, ".vmlist"), encoding="utf-8") as f:
        text = f.read()
    vmlist = json.loads(text)
    assert vmlist["version"] == first["version"] + 1
    assert vmlist["ids"] == {"9180": {"node": node, "type": "lxc", "version": first["version"]},
                             "9181": {"node": node, "type": "lxc", "version": vmlist["version"]}}
    assert text.startswith('{\n"version": ') and f'"9180": {{ "node": "{node}", "type": "lxc", ' in text  # status.c's
    assert os.readlink(os.path.join(d, "local")) == f"nodes/{node}"
    assert os.readlink(os.path.join(d, "lxc")) == f"nodes/{node}/lxc"
    assert container.config_path(sim.dir, 9181) == os.path.join(d, "nodes", node, "lxc", "9181.conf")
    assert os.path.realpath(os.path.join(sim.dir, "ct", "9181", "config")) == container.config_path(sim.dir, 9181)
    with open(container.config_path(sim.dir, 9181), "a", encoding="utf-8") as f:
        f.write("\n[pve:pending]\ndelete: dev0\n")
    assert "dev0: /dev/nvidia1" not in sim.pct("config", 9181).stdout          # one source of truth: the .conf
    assert "dev0: /dev/nvidia1" in sim.pct("config", 9181, "--current", "1").stdout
    assert container.list(sim.dir) == [9180, 9181]
    # a node with no guest: no "ids" at all
    assert container.vmlist_text(3, {}) == '{\n"version": 3\n\n}\n'


@pytest.mark.parametrize("setting, at_least", [(None, pct_mod.STARTUP_S), ("0.5", 0.5)])
def test_pct_costs_what_a_real_one_costs_to_start(sim, setting, at_least):
    """Each pct invocation first spends a real pct's start-up (assumed: README "What pct costs"), even for its usage;
    GPUSIM_PCT_STARTUP_S sets it."""
    env = sim.env()
    env.pop("GPUSIM_PCT_STARTUP_S", None)
    if setting is not None:
        env["GPUSIM_PCT_STARTUP_S"] = setting
    start = time.monotonic()
    proc = subprocess.run([sim.pct_path, "help"], capture_output=True, text=True, env=env, timeout=30, check=False)
    assert proc.returncode == 0 and time.monotonic() - start >= at_least
    assert pct_mod.STARTUP_S == 0.3


def test_pct_counts_its_invocations(sim):
    """Every pct process appends one line to DIR/pct-calls.log (a usage error too): a benchmark counts the pct
    processes a method started (pct.calls)."""
    before = len(pct_mod.calls(sim.dir))
    env = dict(sim.env(), GPUSIM_PCT_STARTUP_S="0")
    for argv in (["help"], ["list"], ["nosuchcommand"]):
        subprocess.run([sim.pct_path, *argv], capture_output=True, text=True, env=env, timeout=30, check=False)
    calls = pct_mod.calls(sim.dir)[before:]
    assert [c[1:] for c in calls] == [["help"], ["list"], ["nosuchcommand"]]
    assert all(c[0].isdigit() for c in calls)
