# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A module file keeps its argument spec, its documentation and a short main(): the orchestration lives in
module_utils, where the unit tests reach it (_release, _fence, _wait, _snapshot)."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = ("gpu_facts", "gpu_release", "gpu_wait_idle", "proxmox_gpu_containers")


@pytest.mark.parametrize("name", MODULES)
def test_main_is_at_most_60_lines_of_code(name):
    module = importlib.import_module(f"ansible_collections.gpuops.gpu.plugins.modules.{name}")
    code = [line for line in inspect.getsource(module.main).splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(code) <= 60, f"{name}.main() has {len(code)} lines of code"


@pytest.mark.parametrize("name", MODULES[1:])
def test_the_argument_spec_is_declared_at_module_level(name):
    module = importlib.import_module(f"ansible_collections.gpuops.gpu.plugins.modules.{name}")
    assert isinstance(module.ARGUMENT_SPEC, dict) and "backend" in module.ARGUMENT_SPEC
