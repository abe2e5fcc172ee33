"""The one way the tests run what a user runs: a module of this checkout the way Ansible does (a fresh
interpreter and an args file: run_module, run_module_text, start_module for runs side by side), in this
process with patched arguments (run_module_in_process, for many runs: the fuzz tests), or a playbook
(run_playbook: ansible-playbook with this checkout's collection, everything it writes in the test's tmp;
run_predeploy: gpuops.gpu.predeploy for one container of a simulated node)."""

import contextlib
import ctypes
import importlib
import io
import json
import os
import subprocess
import sys
from unittest import mock

MODULES = "ansible_collections.gpuops.gpu.plugins.modules."


def run_module(host, collection, name, args, prefix=(), check_mode=False, env=None):
    """Run one module as Ansible would (a fresh interpreter with its args file); returns its JSON result."""
    return run_module_text(host, collection, name, args, prefix, check_mode, env=env)[0]


def run_module_text(host, collection, name, args, prefix=(), check_mode=False, diff=False, tag="", env=None):
    """Like run_module; returns (result, everything the module printed on stdout and stderr).

    ``tag`` names the args file apart, for runs of one module at the same time; ``env``: variables set over the
    host's environment (host.env())."""
    argv = module_argv(name, args, host.dir, prefix, check_mode=check_mode, diff=diff, tag=tag)
    env = dict(host.env(), **(env or {}), PYTHONPATH=collection)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    return module_result(name, proc), proc.stdout + proc.stderr


def start_module(host, collection, name, args, prefix=(), tag=""):
    """Start one module as run_module does, without waiting: (the Popen, with stdout and stderr piped as text).
    ``prefix``: a wrapper argv before the interpreter. Read its result with json.loads(proc.communicate()[0])."""
    argv = module_argv(name, args, host.dir, prefix, tag=tag)
    return subprocess.Popen(argv, env=dict(host.env(), PYTHONPATH=collection), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def module_argv(name, args, workdir, prefix=(), check_mode=False, diff=False, tag=""):
    """The argv that runs module ``name`` as Ansible does on a target (a fresh interpreter, ``python -m`` the module
    with its args file, written here in ``workdir``): for a caller that runs it itself (a benchmark timing it, a
    tool on a real host). Run it with the collection on PYTHONPATH; read the result with module_result."""
    payload = dict(args)
    if check_mode:
        payload["_ansible_check_mode"] = True
    if diff:
        payload["_ansible_diff"] = True
    argsfile = os.path.join(workdir, f"args-{name}{tag}.json")
    with open(argsfile, "w", encoding="utf-8") as f:
        json.dump({"ANSIBLE_MODULE_ARGS": payload}, f)
    return list(prefix) + [sys.executable, "-m", MODULES + name, argsfile]


def module_result(name, proc):
    """The JSON result a module run (a CompletedProcess with text stdout) printed; AssertionError when it printed none."""
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"{name} printed no JSON (rc {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}") from None


def controller_env(collection, tmp_path, base=None, **extra):
    """ansible-playbook's environment: ``collection`` (this checkout's, laid out as ansible_collections/...), Ansible's
    files in ``tmp_path`` (a path or a str), no colours, no retry files; ``base``: the environment it starts from
    (os.environ), ``extra``: variables set over it (an ANSIBLE_CONFIG, a callback)."""
    tmp = str(tmp_path)
    env = dict(os.environ if base is None else base, ANSIBLE_COLLECTIONS_PATH=str(collection), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_NOCOLOR="1", ANSIBLE_HOME=os.path.join(tmp, "ansible-home"), ANSIBLE_LOCAL_TEMP=os.path.join(tmp, "tmp"),
               ANSIBLE_RETRY_FILES_ENABLED="0", ANSIBLE_HOST_KEY_CHECKING="0")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env.update(extra)
    return env


def run_under_runner(collection, pdd, plays, inventory, base=None, cmdline="", **extra):
    """``plays`` (a playbook, as a list) run by ansible-runner as AWX runs a job, its private data dir ``pdd`` (a
    path, made here), ``inventory`` a dict, ``base`` and ``extra`` as controller_env's; returns the runner (its
    ``status`` and ``events``)."""
    import ansible_runner  # noqa: PLC0415

    pdd = str(pdd)
    for sub in ("project", "inventory", "env"):
        os.makedirs(os.path.join(pdd, sub), exist_ok=True)
    for path, data in (("project/site.yml", plays), ("inventory/hosts.json", inventory),
                       ("env/envvars", controller_env(collection, pdd, base=base, **extra))):
        with open(os.path.join(pdd, path), "w", encoding="utf-8") as f:
            json.dump(data, f)
    return ansible_runner.run(private_data_dir=pdd, playbook="site.yml", cmdline=cmdline, quiet=True)


def event_sizes(events) -> list:
    """[(len(str(res)), the event, its task)] of the events that carry a task's result, the largest first: what
    ansible-runner measures of an event against MAX_EVENT_RES (its display callback replaces a larger res by {})."""
    out = [(len(str(e["event_data"]["res"])), e["event"], e["event_data"].get("task"))
           for e in events if isinstance(e.get("event_data"), dict) and "res" in e["event_data"]]
    return sorted(out, key=lambda x: -x[0])


def run_playbook(env, tmp_path, playbook, inventory, *args, timeout=240):
    """(rc, output, seconds) of one ansible-playbook run (``inventory``: a dict, written as JSON in ``tmp_path``;
    ``env``: controller_env's). Past ``timeout`` its process group is killed and the test fails with what it
    printed."""
    import secrets  # noqa: PLC0415
    import signal  # noqa: PLC0415
    import time  # noqa: PLC0415

    import pytest  # noqa: PLC0415

    path = tmp_path / f"inventory-{secrets.token_hex(3)}.json"
    path.write_text(json.dumps(inventory))
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), playbook, "-i", str(path), *args]
    t0 = time.monotonic()
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:
        try:
            out, _err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _err = proc.communicate()
            pytest.fail(f"ansible-playbook {playbook} still ran after {timeout} s:\n{out[-4000:]}", pytrace=False)
    return proc.returncode, out, time.monotonic() - t0


def run_predeploy(host, collection, tmp_path, vmid, *args, timeout=240):
    """(rc, output, (bytes printed, its longest line)) of ansible-playbook gpuops.gpu.predeploy for one GPU host,
    gpu-ct: CT ``vmid`` on this simulated node, pve (the README's inventory shape, local connection)."""
    inventory = {"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "gpuops_device_files": [host.path("dev", "nvidia*")]},
        "children": {"proxmox_nodes": {"hosts": {"pve": {}}},
                     "gpu_hosts": {"hosts": {"gpu-ct": {"proxmox_node": "pve", "proxmox_vmid": vmid}}}}}}
    rc, out, _took = run_playbook(controller_env(collection, tmp_path, host.env()), tmp_path, "gpuops.gpu.predeploy",
                                  inventory, *args, timeout=timeout)
    return rc, out, (len(out.encode()), max((len(line) for line in out.splitlines()), default=0))


def alive(pid):
    """Whether a process exists and is not a zombie (what the tests check of what must survive)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: it exited between the open and the read
        return False


def gone(pid, timeout=10.0):
    """Whether a process is gone (alive() false) within ``timeout`` seconds."""
    import time  # noqa: PLC0415

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def wait_for(predicate, timeout=10.0):
    """Whether ``predicate()`` comes true within ``timeout`` seconds (polled every 0.05 s)."""
    import time  # noqa: PLC0415

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def warnings(res):
    """A module result's warnings as text (ansible-core 2.19+ returns WarningSummary dicts around an Event)."""
    out = []
    for w in res.get("warnings", []):
        while isinstance(w, dict):
            w = w.get("event") or w.get("msg") or w.get("message")
        out.append(w or "")
    return out


def run_module_in_process(host, collection, name, args, check_mode=False):
    """Run one module in this process (as ansible-core's own testing helper does): patched
    arguments, the host's environment, stdout captured, SystemExit caught.

    Nothing is logged to syslog or the journal (``_ansible_no_log``): many runs would fill it.
    Returns (result, stdout). Anything the module raises instead of calling exit_json or
    fail_json propagates: a traceback where Ansible would show MODULE FAILURE. The first host run
    this way loads its libnvidia-ml into the process; the library follows GPUSIM_DIR, so later
    hosts are read through it (hosts of other driver profiles need run_module).
    """
    from ansible.module_utils.common import warnings  # noqa: PLC0415 (imported only where used)
    from ansible.module_utils.testing import patch_module_args  # noqa: PLC0415

    if collection not in sys.path:
        sys.path.insert(0, collection)
    if not _LOADED:
        # pynvml opens "libnvidia-ml.so.1" by name: the loader finds the one loaded here by its SONAME.
        _LOADED.append(ctypes.CDLL(os.path.join(host.dir, "lib", "libnvidia-ml.so.1")))
    module = importlib.import_module(MODULES + name)
    payload = dict(args, _ansible_no_log=True)
    if check_mode:
        payload["_ansible_check_mode"] = True
    out = io.StringIO()
    with patch_module_args(payload), mock.patch.dict(os.environ, host.env_vars()), \
            mock.patch.dict(warnings._global_warnings, clear=True), \
            mock.patch.dict(warnings._global_deprecations, clear=True), contextlib.redirect_stdout(out):
        try:
            module.main()
        except SystemExit:
            pass
    text = out.getvalue()
    try:
        return json.loads(text), text
    except ValueError:
        raise AssertionError(f"{name} printed no JSON: {text[-2000:]}") from None


_LOADED = []
