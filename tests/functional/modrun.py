"""Run a module of this checkout the way Ansible does: a fresh interpreter and an args file."""

import json
import os
import subprocess
import sys


def run_module(host, collection, name, args, prefix=(), check_mode=False):
    """Run one module as Ansible would (a fresh interpreter with its args file); returns its JSON result."""
    return run_module_text(host, collection, name, args, prefix, check_mode)[0]


def run_module_text(host, collection, name, args, prefix=(), check_mode=False, diff=False):
    """Like run_module; returns (result, everything the module printed on stdout and stderr)."""
    payload = dict(args)
    if check_mode:
        payload["_ansible_check_mode"] = True
    if diff:
        payload["_ansible_diff"] = True
    argsfile = os.path.join(host.dir, f"args-{name}.json")
    with open(argsfile, "w", encoding="utf-8") as f:
        json.dump({"ANSIBLE_MODULE_ARGS": payload}, f)
    env = dict(host.env(), PYTHONPATH=collection)
    argv = list(prefix) + [sys.executable, "-m", f"ansible_collections.gpuops.gpu.plugins.modules.{name}", argsfile]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    try:
        return json.loads(proc.stdout), proc.stdout + proc.stderr
    except ValueError:
        raise AssertionError(f"{name} printed no JSON (rc {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}") from None


def alive(pid):
    """Whether a process exists and is not a zombie (what the tests check of what must survive)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
