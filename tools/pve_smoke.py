#!/usr/bin/env python
# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the simulator assumes of a Proxmox VE node, recorded on a real one (read-only; run as root on the node):

    python tools/pve_smoke.py [--json OUT] [--runs N] [--pct PATH] [--pve-dir DIR] [--lxc-path DIR]

1. pct's cost: the wall time of ``pct help``, ``pct list`` and ``pct config <vmid>`` (the first container), N runs
   each, min and median - the figure tests/gpusim/gpusimkit/pct.py STARTUP_S assumes (README "What pct costs");
2. what proxmox_gpu_containers reads without pct agrees with what pct says: every container of ``pct list`` (status,
   lock, name) against .vmlist, the LXC monitors' sockets and the config files (_pct.node_containers, active_vmids,
   list_row), and each one's ``pct config <vmid> [--current 1]`` against the config file's views (_pct.config_view),
   through _pct.parse_config.

It runs nothing but ``pct help|list|config``: it starts, stops and changes nothing. With --pct/--pve-dir/--lxc-path
it checks the simulator the same way (tests/functional/test_pve_smoke.py). Exit status: 0 agreed, 1 a difference,
2 it could not run. Nothing here asserts on timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def module_utils():
    """The collection's _pct, _fence and _host.node_io, from this checkout (laid out as ansible_collections/gpuops/gpu)."""
    root = tempfile.mkdtemp(prefix="pve-smoke-")
    os.makedirs(os.path.join(root, "ansible_collections", "gpuops"))
    os.symlink(ROOT, os.path.join(root, "ansible_collections", "gpuops", "gpu"))
    sys.path.insert(0, root)
    sys.dont_write_bytecode = True
    from ansible_collections.gpuops.gpu.plugins.module_utils import _fence, _pct  # noqa: PLC0415
    from ansible_collections.gpuops.gpu.plugins.module_utils._host import node_io  # noqa: PLC0415
    return _pct, _fence, node_io


def pct(path, *args):
    start = time.monotonic()
    proc = subprocess.run([path, *args], capture_output=True, text=True, timeout=120, check=False,
                          env=dict(os.environ, LC_ALL="C"))
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start


def timed(path, args, runs):
    seconds = [pct(path, *args)[3] for _run in range(runs)]
    return {"argv": ["pct", *args], "runs": runs, "min_s": round(min(seconds), 3),
            "median_s": round(statistics.median(seconds), 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pct", default="/usr/sbin/pct")
    ap.add_argument("--pve-dir", default=None, help="default: $GPUOPS_PVE_DIR, else /etc/pve")
    ap.add_argument("--lxc-path", default=None, help="default: $GPUOPS_LXC_PATH, else /var/lib/lxc")
    a = ap.parse_args(argv)
    _pct, _fence, node_io = module_utils()
    if not os.access(a.pct, os.X_OK):
        print(f"no pct at {a.pct}: run this on a Proxmox VE node (or pass --pct)", file=sys.stderr)
        return 2
    io = node_io.NodeIO(a.pct, None, type("R", (), {"warn": print, "now": time.monotonic})(),
                        pve_dir=a.pve_dir, lxc_path=a.lxc_path)
    problems = []
    rc, out, err, _s = pct(a.pct, "list")
    if rc != 0:
        print(f"pct list failed (rc {rc}): {err.strip()}", file=sys.stderr)
        return 2
    listed = _pct.parse_list(out)
    try:
        vmids, running = io.node()
    except _fence.FenceFailed as exc:
        print(exc.msg, file=sys.stderr)
        return 2
    if sorted(listed) != vmids:
        problems.append(f"pct list shows {sorted(listed)}, .vmlist lists {vmids} for this node")
    containers = []
    for vmid in sorted(set(listed) & set(vmids)):
        conf = _pct.parse_conf_file(io.config(vmid) or "")
        row = _pct.list_row(vmid, _pct.config_keys(conf, True), vmid in running)
        entry = {"vmid": vmid, "pct_list": listed[vmid], "files": row, "config": {}}
        if row != listed[vmid]:
            problems.append(f"CT {vmid}: pct list says {listed[vmid]}, the files {row}")
        for current in (True, False):
            rc, out, err, _s = pct(a.pct, "config", str(vmid), *(["--current", "1"] if current else []))
            theirs = _pct.parse_config(out)
            ours = _pct.parse_config(_pct.config_view(conf, current))
            same = rc == 0 and {k: theirs[k] for k in ("minors", "lines", "hostname")} == \
                {k: ours[k] for k in ("minors", "lines", "hostname")}
            entry["config"]["current" if current else "pending"] = same
            if not same:
                problems.append(f"CT {vmid}: pct config{' --current 1' if current else ''} (rc {rc}) gives"
                                f" {theirs['lines']}, the file {ours['lines']}")
        containers.append(entry)
    costs = [timed(a.pct, ["help"], a.runs), timed(a.pct, ["list"], a.runs)]
    if vmids:
        costs.append(timed(a.pct, ["config", str(vmids[0])], a.runs))
    report = {"pct": a.pct, "pve_dir": io.pve_dir, "lxc_path": io.lxc_path, "node": io._node, "costs": costs,
              "containers": containers, "problems": problems, "ok": not problems}
    for c in costs:
        print(f"{' '.join(c['argv']):24} min {c['min_s']:.3f} s  median {c['median_s']:.3f} s  ({c['runs']} runs)")
    print(f"{len(containers)} container(s) compared; " + ("result: ok" if not problems else "differences:"))
    for p in problems:
        print("  " + p)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
