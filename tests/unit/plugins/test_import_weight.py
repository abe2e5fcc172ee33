# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What each controller-side plugin drags in when it is imported. ansible-playbook imports a filter in every
forked worker (one per host and task) whose template names it, from source where no byte code is written
(benchmarks/README.md, "Where the controller's CPU goes"): a plugin must not import module_utils it does not
use. Each case imports one plugin in a fresh interpreter and lists the collection's modules loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PREFIX = "ansible_collections.gpuops.gpu.plugins."

# plugin -> the collection's modules it may load (besides itself and the packages)
CASES = [
    # the records (module_outcome, the fence's and the wait's) need none of the tables' code until a table is made
    # (and the small _bound, which counts what a summary left out, and _mig, which names a container's MIG devices)
    ("plugin_utils._results", {"module_utils._redact", "module_utils._bound", "module_utils._mig"}),
    # the wait's action plugin needs the number checks, not the holding model (and the small _host.calls, where the
    # patterns' time budget has its timer)
    ("action.gpu_wait_idle", {"plugin_utils._slices", "module_utils._validate", "module_utils._errors",
                              "module_utils._redact", "module_utils._host", "module_utils._host.calls"}),
    # the one task of predeploy and the roles: the records, the wait's slices and the tables (each host prints one:
    # ansible-playbook's main process imports the action's class before it forks the workers, so they are imported
    # once per run, not once per host - lib/ansible/plugins/strategy/linear.py, action_loader.get(class_only=True))
    ("action.predeploy_host", {"plugin_utils._slices", "plugin_utils._results", "plugin_utils._tables",
                               "module_utils._validate", "module_utils._errors", "module_utils._redact",
                               "module_utils._bound", "module_utils._mig", "module_utils._holding", "module_utils._health",
                               "module_utils._snapshot", "module_utils._host", "module_utils._host.calls"}),
    # the redaction needs none of the validation (_validate, _holding, _health)
    ("module_utils._redact", set()),
]


def collections_path():
    """The directory that holds this collection's ``ansible_collections`` (where a fresh interpreter imports it from):
    the one above this file's ansible_collections/gpuops/gpu when it is laid out so (ansible-test), else PYTHONPATH's."""
    parts = os.path.abspath(__file__).split(os.sep)
    if "ansible_collections" in parts:
        return os.sep.join(parts[:len(parts) - 1 - parts[::-1].index("ansible_collections")])
    return None


def loaded(module):
    code = ("import importlib, json, sys; importlib.import_module(sys.argv[1]); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(sys.argv[2]))))")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    top = collections_path()
    if top:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (top, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", code, PREFIX + module, PREFIX], check=False, capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc
    names = {m[len(PREFIX):] for m in json.loads(out.stdout)}
    return {n for n in names if "." in n and n != module}


@pytest.mark.parametrize("module, allowed", CASES, ids=[c[0] for c in CASES])
def test_a_plugin_imports_only_what_it_uses(module, allowed):
    assert loaded(module) - allowed == set()
