#!/usr/bin/env python
# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The house in figures, at one commit or side by side at two: lines (and code lines) per file under plugins/, the
biggest functions and classes, the functions over 50 lines, the exception kinds each parser raises, and the sites of
tests/, benchmarks/ and tools/ that reach the simulator past gpusimkit's public API or run a module or a
playbook outside tests/functional/modrun.py.

    tools/house_report.py                 # the working tree
    tools/house_report.py 0266fc8 HEAD    # before and after, side by side

Reads the files of a commit with ``git archive``; prints Markdown. A code line is a line with a token of code: not
blank, not a comment, not a docstring, not a module's DOCUMENTATION, EXAMPLES or RETURN, and nothing of doc_fragments/.
"""

import argparse
import ast
import io
import os
import re
import subprocess
import sys
import tarfile
import tokenize

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The parsers of what programs print and the kernel writes (issue 28, item 2): file -> function name prefixes.
PARSERS = {"_smi.py": ("parse", "_parse", "query", "read_"), "procs.py": ("parse", "read_stat", "_stat", "read_status"),
           "_validate.py": ("signal_number",), "_pct.py": ("parse", "validate")}
# What a test may import from the simulator (tests/gpusim/README.md, "The public API"; kept so by
# tests/gpusim/tests/test_public_api.py): the package's public names and its pytest plugin, as the working tree has them.
sys.path.insert(0, os.path.join(TOP, "tests", "gpusim"))
import gpusimkit  # noqa: E402  pylint: disable=wrong-import-position

PUBLIC_NAMES = set(gpusimkit.__all__)
PUBLIC_GPUSIMKIT = re.compile(r"^gpusimkit(\.pytest_plugin)?$")
IMPORT = re.compile(r"^\s*(?:from\s+(gpusimkit[\w.]*)\s+import\s+([\w, ()]+)|import\s+(gpusimkit[\w.]*))", re.M)
MODULE_RUN = re.compile(r"plugins\.modules\.|ANSIBLE_COLLECTIONS_PATH")
# Files that name a module without running it (as test_public_api.py's NAMES_A_MODULE).
# A rule file that touches the machine (DESIGN.md section 4; the unit test test_host_boundary.py is the gate).
MACHINE = re.compile(r"^\s*(?:import|from) (?:subprocess|threading|concurrent|ctypes|fcntl|select)\b|open\(", re.M)
NAMES_A_MODULE = ("tests/functional/crash_injection/sitecustomize.py", "tests/functional/conftest.py", "tools/house_report.py")


def files_at(rev):
    """{path: text} of plugins/, tests/ (but the simulator's build), benchmarks/ and tools/ at ``rev`` (None: the tree)."""
    out = {}
    if rev is None:
        for top in ("plugins", "tests", "benchmarks", "tools"):
            for root, dirs, names in os.walk(os.path.join(TOP, top)):
                dirs[:] = [d for d in dirs if d not in ("build", "__pycache__")]
                for name in names:
                    if name.endswith(".py"):
                        path = os.path.join(root, name)
                        with open(path, encoding="utf-8") as f:
                            out[os.path.relpath(path, TOP)] = f.read()
        return out
    blob = subprocess.run(["git", "-C", TOP, "archive", rev, "plugins", "tests", "benchmarks", "tools"],
                          capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".py") and "/build/" not in member.name:
                out[member.name] = tar.extractfile(member).read().decode("utf-8", "replace")
    return out


def code_lines(path, text):
    """How many lines of ``text`` carry code (see the module's docstring); None for a doc fragment."""
    if "/doc_fragments/" in path:
        return None
    tree = ast.parse(text)
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            docs.update(range(first.lineno, first.end_lineno + 1))
        if node in tree.body and isinstance(node, ast.Assign) and any(
                getattr(t, "id", "") in ("DOCUMENTATION", "EXAMPLES", "RETURN") for t in node.targets):
            docs.update(range(node.lineno, node.end_lineno + 1))
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    return len({n for tok in tokenize.generate_tokens(io.StringIO(text).readline) if tok.type not in skip
                for n in range(tok.start[0], tok.end[0] + 1)} - docs)


def units(files):
    """[(lines, kind, 'file:name')] of every function, method and class under plugins/ (a function's without its docstring)."""
    out = []
    for path, text in files.items():
        if not path.startswith("plugins/"):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                lines = node.end_lineno - node.lineno + 1
                doc = node.body[0] if node.body else None
                if kind == "function" and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant):
                    lines -= doc.end_lineno - doc.lineno + 1  # a function's size is its code: its docstring is not
                out.append((lines, kind, f"{path.split('/', 1)[1]}:{node.name}"))
    return sorted(out, reverse=True)


def raised(files):
    """{parser file: {function: sorted exception names it raises itself}}."""
    out = {}
    for path, text in files.items():
        name = os.path.basename(path)
        if not path.startswith("plugins/module_utils/") or name not in PARSERS:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and node.name.startswith(PARSERS[name]):
                kinds = set()
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Raise) and sub.exc is not None:
                        call = sub.exc.func if isinstance(sub.exc, ast.Call) else sub.exc
                        kinds.add(getattr(call, "id", None) or getattr(call, "attr", "?"))
                if kinds:
                    out.setdefault(name, {})[node.name] = sorted(kinds)
    return out


def reaching_sites(files):
    """(internal imports of gpusimkit, module or playbook runs outside modrun): lists of 'file:line text'."""
    internal, runs = [], []
    for path, text in sorted(files.items()):
        if not path.startswith(("tests/functional/", "benchmarks/", "tools/")) or path.endswith("modrun.py"):
            continue
        for m in IMPORT.finditer(text):
            mod = m.group(1) or m.group(3)
            names = [n.strip(" ()") for n in (m.group(2) or "").split(",") if n.strip(" ()")]
            if not PUBLIC_GPUSIMKIT.match(mod):
                bad = [mod]
            else:
                bad = [f"{mod}.{n.split()[0]}" for n in names if mod == "gpusimkit" and n.split()[0] not in PUBLIC_NAMES]
            line = text.count("\n", 0, m.start()) + 1
            internal += [f"{path}:{line} {b}" for b in bad]
        for number, line in enumerate(text.splitlines(), 1):
            if MODULE_RUN.search(line) and not line.lstrip().startswith("#") and path not in NAMES_A_MODULE:
                runs.append(f"{path}:{number} {line.strip()[:100]}")
    return internal, runs


def report(rev):
    files = files_at(rev)
    plugin_lines = {p: (t.count("\n"), code_lines(p, t)) for p, t in files.items() if p.startswith("plugins/")}
    big = units(files)
    internal, runs = reaching_sites(files)
    machine = sorted(p for p, t in files.items() if re.fullmatch(r"plugins/module_utils/[^/]+\.py", p) and MACHINE.search(t))
    return {"files": plugin_lines, "units": big, "raised": raised(files), "internal": internal, "runs": runs,
            "machine": machine}


def _cell(lines, code):
    return f"{lines} ({'-' if code is None else code})"


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revs", nargs="*", metavar="REV", help="commits to compare, side by side (none: the working tree)")
    revs = parser.parse_args(argv[1:]).revs or [None]
    reports = [(rev or "working tree", report(rev)) for rev in revs]
    names = [n for n, _r in reports]
    print("## Lines (code lines) per file under plugins/\n")
    paths = sorted(set().union(*(r["files"] for _n, r in reports)))
    print("| file | " + " | ".join(names) + " |\n| --- |" + " --- |" * len(names))
    for p in paths:
        cells = [_cell(*r["files"][p]) if p in r["files"] else "-" for _n, r in reports]
        print(f"| {p.split('/', 1)[1]} | " + " | ".join(cells) + " |")
    totals = [_cell(sum(v[0] for v in r["files"].values()), sum(v[1] or 0 for v in r["files"].values()))
              for _n, r in reports]
    print("| **plugins/ in all** | " + " | ".join(totals) + " |")
    for name, r in reports:
        print(f"\n## {name}: the five biggest classes and functions; functions over 50 lines\n")
        for kind in ("class", "function"):
            top = [u for u in r["units"] if u[1] == kind][:5]
            print(f"- {kind}es: " if kind == "class" else "- functions: ", end="")
            print(", ".join(f"`{n}` {lines}" for lines, _k, n in top))
        long = [f"`{n}` {lines}" for lines, k, n in r["units"] if k == "function" and lines > 50]
        print(f"- functions over 50 lines ({len(long)}): " + (", ".join(long) or "none"))
        print(f"\n## {name}: exception kinds the parsers raise themselves\n")
        for f, funcs in sorted(r["raised"].items()):
            print(f"- {f}: " + "; ".join(f"`{fn}` {', '.join(k)}" for fn, k in sorted(funcs.items())))
        print(f"\n## {name}: rule files (plugins/module_utils/*.py) that import subprocess, threading, ctypes, fcntl or"
              f" select or open files ({len(r['machine'])})\n")
        for path in r["machine"]:
            print(f"- {path}")
        print(f"\n## {name}: sites past gpusimkit's public API ({len(r['internal'])}) and module or playbook runs"
              f" outside modrun ({len(r['runs'])})\n")
        for site in r["internal"] + r["runs"]:
            print(f"- {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
