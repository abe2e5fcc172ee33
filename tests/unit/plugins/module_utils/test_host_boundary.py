# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The host boundary (DESIGN.md section 4): the rule files, every top-level ``plugins/module_utils/*.py``, never touch
the machine - they import none of subprocess, threading (nor concurrent's thread pools), ctypes, fcntl, select and open
no files; all of that lives in ``plugins/module_utils/_host/``. Static checks of the source (ast), each naming the file
and line that breaks it.
"""

from __future__ import annotations

import ast
import os
import sys
import types

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _errors
from ansible_collections.gpuops.gpu.plugins.module_utils._host import protocols
from ansible_collections.gpuops.gpu.plugins.module_utils._host.calls import Background
from ansible_collections.gpuops.gpu.plugins.module_utils._host.node_io import NodeIO
from ansible_collections.gpuops.gpu.plugins.module_utils._host.release_io import ReleaseIO
from ansible_collections.gpuops.gpu.plugins.module_utils._host.wait_io import WaitIO

MODULE_UTILS = os.path.dirname(os.path.abspath(_errors.__file__))
MACHINE_MODULES = ("subprocess", "threading", "concurrent", "ctypes", "fcntl", "select")
# Calls that open a file: open(), os.open, os.fdopen, io.open, os.pidfd_open.
OPENERS = {("open",), ("os", "open"), ("os", "fdopen"), ("io", "open"), ("os", "pidfd_open")}
# Rule files not yet clean (file -> why): the list only shrinks; a file that is clean must leave it.
NOT_YET = {}
# Rule files that import from _host/ (file -> why): the rules are given their host as ``io``; these are the exceptions,
# and the list only shrinks.
IMPORTS_THE_HOST = {
    "_common.py": "the modules' glue: the AnsibleModule, its locks (_host.lock) and detail file (_host.files)",
    "_validate.py": "the patterns' time budget: a timer in the main thread (_host.calls.call_interrupted)",
}


def machine_uses(source: str, name: str = "<rule file>") -> list:
    """'line: what' of every import of a machine module and every file opened in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if isinstance(node, ast.Import):
            out += [f"{node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] in MACHINE_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in MACHINE_MODULES:
            out.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            called = (func.id,) if isinstance(func, ast.Name) else (
                (func.value.id, func.attr) if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None)
            if called in OPENERS:
                out.append(f"{node.lineno}: {'.'.join(called)}(...)")
    return out


def rule_files() -> list:
    return sorted(n for n in os.listdir(MODULE_UTILS) if n.endswith(".py") and n != "__init__.py")


def uses_of(name: str) -> list:
    with open(os.path.join(MODULE_UTILS, name), encoding="utf-8") as f:
        return machine_uses(f.read(), name)


@pytest.mark.parametrize("name", rule_files())
def test_a_rule_file_does_not_touch_the_machine(name):
    found = uses_of(name)
    if name in NOT_YET:
        assert found, f"{name} no longer touches the machine: take it off NOT_YET ({NOT_YET[name]})"
        return
    assert not found, (f"plugins/module_utils/{name} touches the machine ({'; '.join(found)}): host I/O belongs in"
                       " plugins/module_utils/_host/ (DESIGN.md section 4)")


@pytest.mark.parametrize("name", rule_files())
def test_a_rule_file_is_given_its_host(name):
    with open(os.path.join(MODULE_UTILS, name), encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=name)
    found = sorted({node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and "._host" in f".{node.module or ''}"})
    assert bool(found) is (name in IMPORTS_THE_HOST), (
        f"plugins/module_utils/{name} imports the host at lines {found}: rules are given it as io" if found else
        f"{name} no longer imports the host: take it off IMPORTS_THE_HOST ({IMPORTS_THE_HOST[name]})")


def test_the_host_is_a_folder_of_its_own():
    assert os.path.isdir(os.path.join(MODULE_UTILS, "_host")) and len(rule_files()) > 10
    assert set(NOT_YET) <= set(rule_files())


@pytest.mark.parametrize("source, found", [
    ("import subprocess\n", ["1: import subprocess"]),
    ("import os, threading as t\n", ["1: import threading"]),
    ("from ctypes import CDLL\n", ["1: from ctypes import ..."]),
    ("def f():\n    import fcntl\n", ["2: import fcntl"]),
    ("import select.epoll\n", ["1: import select.epoll"]),
    ("from concurrent.futures import ThreadPoolExecutor\n", ["1: from concurrent.futures import ..."]),
    ("with open('/proc/x') as f:\n    pass\n", ["1: open(...)"]),
    ("import os\nfd = os.open('/dev/kmsg', 0)\nf = os.fdopen(fd)\n", ["2: os.open(...)", "3: os.fdopen(...)"]),
    # Not the machine: a rule file may name such things, call a method that is called open, or import the host.
    ("import re\nimport signal\nx = 'subprocess'\ntarget.open()\n", []),
    ("from ansible_collections.gpuops.gpu.plugins.module_utils._host import calls\n", []),
])
def test_the_guard_finds_what_touches_the_machine(source, found):
    assert machine_uses(source) == found


def test_the_guard_fails_on_a_rule_file_that_imports_subprocess(tmp_path, monkeypatch):
    """The guard itself, run over a folder whose one rule file imports subprocess: it fails, naming the file."""
    (tmp_path / "_host").mkdir()
    (tmp_path / "_rule.py").write_text('"""A rule."""\nimport subprocess\n\n\ndef rule():\n    return subprocess\n',
                                       encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "MODULE_UTILS", str(tmp_path))
    assert rule_files() == ["_rule.py"]
    with pytest.raises(AssertionError, match=r"plugins/module_utils/_rule.py touches the machine \(2: import subprocess\)"):
        test_a_rule_file_does_not_touch_the_machine("_rule.py")


@pytest.mark.parametrize("adapter, interface", [
    (lambda: WaitIO(None, {}, None, None), protocols.WaitHost),
    (lambda: ReleaseIO(None, None, print, None), protocols.ReleaseHost),
    (lambda: NodeIO("/usr/sbin/pct", None, types.SimpleNamespace(warn=print, now=lambda: 0.0)), protocols.NodeHost),
    (lambda: Background(int), protocols.Job),
])
def test_the_adapters_implement_the_interfaces(adapter, interface):
    """Each real adapter has every member of its typing.Protocol (the unit tests' fakes are checked beside them)."""
    assert isinstance(adapter(), interface)
    assert not isinstance(object(), interface)
