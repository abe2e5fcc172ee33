#!/usr/bin/env python
# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What gpu_facts reads on every driver branch the simulator models, against the scenario's truth.

    .venv/bin/python tools/driver_profiles.py [--profile r535-early ...]

For each profile (tests/gpusim/gpusimkit/profiles.py) it starts a simulated host, holds three
processes on GPU 0, one on GPU 1 and none on GPU 2 (GB10: the three on its one GPU), runs
gpu_facts as Ansible would (a fresh interpreter and an args file) and prints, per profile, the
process query it used, the pids and MiB it reported against the scenario's, the fields it listed
as unsupported, and what the bindings' own wrapper (nvidia-ml-py, as gpustat uses it) returns.
It signals only the processes its simulated hosts started, and tears them down.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpusim"))
sys.path.insert(0, os.path.join(ROOT, "tests", "functional"))

from gpusimkit import DRIVERS, SimHost  # noqa: E402
from modrun import run_module  # noqa: E402

MIB = {0: (1024, 2048, 3072), 1: (4096,)}
BINDINGS = r"""
import json, pynvml
pynvml.nvmlInit()
out = {}
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    try:
        out[i] = [[p.pid, (p.usedGpuMemory or 0) // 1048576] for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    except Exception as exc:  # what a client of the wrapper gets
        out[i] = type(exc).__name__
print(json.dumps(out))
"""


def run_facts(host, collection):
    return run_module(host, collection, "gpu_facts", {"device_files": [host.dir + "/dev/nvidia*"]})


def one(name, base, collection):
    host = SimHost.up(os.path.join(base, name), driver=name, gpus=1 if name == "gb10" else 3)
    try:
        scenario = {}
        count = len(host.status()["gpus"])
        for gpu, sizes in MIB.items():
            if gpu < count:
                for mib in sizes:
                    scenario[host.hold(gpus=[gpu], mib=mib)] = (gpu, mib)
        facts = run_facts(host, collection)["ansible_facts"]
        reported = {p["pid"]: (g["index"], p["used_mib"]) for g in facts["gpu_devices"] for p in g["processes"]}
        wrapper = subprocess.run([sys.executable, "-c", BINDINGS], env=host.env(), capture_output=True, text=True,
                                 timeout=60, check=False)
        return {
            "profile": name,
            "driver": facts["gpu_driver"]["driver_version"],
            "query": facts["gpu_driver"]["process_query"],
            "scenario": {str(k): v for k, v in sorted(scenario.items())},
            "gpu_facts": {str(k): list(v) for k, v in sorted(reported.items())},
            "exact": reported == {k: tuple(v) for k, v in scenario.items()},
            "unsupported": sorted({f for g in facts["gpu_devices"] for f in g["unsupported"]}),
            "memory_used": [g["memory"]["used"] for g in facts["gpu_devices"]],
            "bindings_wrapper": json.loads(wrapper.stdout) if wrapper.returncode == 0 else wrapper.stderr[-300:],
        }
    finally:
        host.down()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="append", choices=sorted(DRIVERS), help="only these profiles")
    ap.add_argument("--json", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    names = args.profile or list(DRIVERS)
    base = tempfile.mkdtemp(prefix="gpdp-")
    collection = os.path.join(base, "collections")
    os.makedirs(os.path.join(collection, "ansible_collections", "gpuops"))
    os.symlink(ROOT, os.path.join(collection, "ansible_collections", "gpuops", "gpu"))
    try:
        rows = [one(name, base, collection) for name in names]
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    print("| profile | driver | process query (entry bytes) | scenario pid: (GPU, MiB) | gpu_facts pid: (GPU, MiB) |"
          " exact | unsupported | nvidia-ml-py's nvmlDeviceGetComputeRunningProcesses |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        q = r["query"]
        wrap = r["bindings_wrapper"]
        wrap_text = wrap if isinstance(wrap, str) else "; ".join(
            f"GPU {k}: {v if isinstance(v, str) else ', '.join(f'{p}/{m}' for p, m in v) or '-'}" for k, v in wrap.items())
        print(f"| {r['profile']} | {r['driver']} | {q['function'].replace('nvmlDeviceGetComputeRunningProcesses', '...')}"
              f" ({q['entry_bytes']}) | {', '.join(f'{k}: {tuple(v)}' for k, v in r['scenario'].items())} |"
              f" {', '.join(f'{k}: {tuple(v)}' for k, v in r['gpu_facts'].items())} | {'yes' if r['exact'] else 'NO'} |"
              f" {', '.join(r['unsupported']) or '-'} | {wrap_text} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    os.unlink(os.path.join(collection, "ansible_collections", "gpuops", "gpu"))
    shutil.rmtree(base, ignore_errors=True)
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
