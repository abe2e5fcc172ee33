#!/usr/bin/env python
# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Render docs/reliability.md from the fault matrix's results (build/fault-matrix.json).

    .venv/bin/python tools/reliability_doc.py [--json build/fault-matrix.json] [--out docs/reliability.md]

tests/functional/test_fault_matrix.py writes the JSON at the end of its run (and calls render()
itself when GPUOPS_WRITE_DOCS=1); table() is also what it prints on the terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = ("#", "fault", "what the collection does", "outcome", "s", "outside the scope alive", "left behind", "check")


def cell(text) -> str:
    """One markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def table(rows) -> list:
    """The markdown table, one line per fault."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(" --- " for _col in COLUMNS) + "|"]
    for r in rows:
        left = "; ".join(r.get("left_behind") or []) or "nothing"
        seconds = "-" if r.get("seconds") is None else f"{r['seconds']:.1f}"
        values = (r["row"], r["fault"], r["does"], r["outcome"], seconds, r.get("bystanders_alive") or "-", left, r["check"])
        lines.append("| " + " | ".join(cell(v) for v in values) + " |")
    return lines


def render(data: dict) -> str:
    machine = data.get("machine") or {}
    rows = data.get("rows") or []
    passed = sum(1 for r in rows if r.get("check") == "pass")
    bugs = [r for r in rows if r.get("known_bug")]
    total = sum(r.get("seconds") or 0 for r in rows)
    out = [
        "# Reliability: the fault matrix",
        "",
        "Every fault a GPU host shows, each run against the GPU host simulator (tests/gpusim) by",
        "`tests/functional/test_fault_matrix.py`, one test per fault, each checked the same way: the outcome",
        "(success, or a failure whose message has the expected key words), every process outside the scope",
        "still alive, nothing left behind (no child of a module, no process the test started, no container",
        "cgroup after the teardown) and the time of each module run bounded (its own time limit + 15 s: a",
        "safety net, not a benchmark). This file is generated: do not edit it by hand.",
        "",
        f"- Machine: `{machine.get('uname', '?')}`, {machine.get('cpus', '?')} CPUs, Python {machine.get('python', '?')}",
        f"- Date: {data.get('generated', '?')}",
        "- Command: `make test` (the functional tests), or on its own:",
        f"  `{data.get('command', '.venv/bin/python -m pytest tests/functional/test_fault_matrix.py')}`;",
        "  `GPUOPS_WRITE_DOCS=1` renders this file, else the results are in `build/fault-matrix.json`",
        "  (`.venv/bin/python tools/reliability_doc.py` renders it from there).",
        f"- Result: {passed} of {len(rows)} faults pass, {len(bugs)} {'shows' if len(bugs) == 1 else 'show'} a known bug (below), {total:.0f} s in all.",
        "",
        "Columns: *outcome* is what the modules answered (`ok`, or `failed:` and the message, cut); *s* the",
        "seconds the row took; *outside the scope alive* the processes that must survive (a job on another",
        "GPU, nvidia-persistenced holding every GPU node, an exporter holding the control nodes, a job in",
        "another container: alive / started); *check* whether the row's assertions held.",
        "",
    ]
    out += table(rows)
    if bugs:
        out += ["", "## Known bugs", "",
                "Rows marked `xfail(strict=True)`: the row fails the day the bug is fixed, and its mark goes then.", ""]
        out += [f"- Row {r['row']} ({r['fault']}): {cell(r['known_bug'])}" for r in bugs]
    out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "fault-matrix.json"))
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "reliability.md"))
    args = parser.parse_args(argv)
    try:
        with open(args.json, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"cannot read {args.json}: {exc} (run the fault matrix first)\n")
        return 1
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(render(data))
    sys.stdout.write(f"wrote {args.out} ({len(data.get('rows') or [])} faults)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
