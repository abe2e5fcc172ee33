# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import subprocess
import sys

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _snapshot
from ansible_collections.gpuops.gpu.plugins.module_utils._common import IDLE_ARGS, SNAPSHOT_ARGS
from ansible_collections.gpuops.gpu.plugins.module_utils._host.snapshots import SnapshotTaker
from ansible_collections.gpuops.gpu.plugins.module_utils._errors import RegexTooSlow

SK = "sk-proj0123456789abcdefXYZ"


class Params:
    def __init__(self, **over):
        self.params = {k: v.get("default") for k, v in dict(SNAPSHOT_ARGS, **IDLE_ARGS).items()}
        self.params.update(over)


@pytest.fixture
def secret_process():
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdout.write('ok'); sys.stdout.flush();"
                             " time.sleep(60)", "--api-key", SK, "HF_TOKEN=hf_AbCdEfGhIjKlMnOpQr"],
                            stdout=subprocess.PIPE)
    assert proc.stdout.read(2) == b"ok"
    yield proc.pid
    proc.kill()
    proc.wait()


def test_read_process_redacts_and_keeps_the_raw_text_internal(secret_process):
    taker = SnapshotTaker(Params())
    info = taker.read_process(secret_process)
    assert info["cmdline"].endswith("--api-key **** HF_TOKEN=****") and SK not in repr(info)
    assert SK in taker.match_text(info)


def test_cmdline_false_and_extra_patterns(secret_process):
    assert SnapshotTaker(Params(cmdline=False)).read_process(secret_process)["cmdline"] is None
    shown = SnapshotTaker(Params(redact=[r"time\.sleep\(\d+\)"])).read_process(secret_process)["cmdline"]
    assert "time.sleep" not in shown and "****" in shown


def test_a_slow_protect_pattern_fails_when_the_process_is_read(secret_process):
    taker = SnapshotTaker(Params(protect=[".*.*.*.*.*.*.*=X"]))
    with pytest.raises(RegexTooSlow, match="^protect: "):
        # The pattern backtracks on this command line (it has '='): polynomially, over the budget.
        taker._screen({"name": "x"}, "a=" * 2000)


@pytest.mark.parametrize("holders, expected", [
    ({10: ["/dev/nvidia0", "/dev/nvidiactl"]}, {10: ["/dev/nvidia0", "/dev/nvidiactl"]}),
    ({11: ["/dev/nvidia5"]}, {}),
    ({12: ["/dev/nvidia5", "/dev/nvidiactl"]}, {12: ["/dev/nvidiactl"]}),
])
def test_restricted_nvidia_smi_keeps_the_nodes_of_the_selected_gpus(holders, expected):
    raw = {"gpus": [{"index": 0, "minor_number": 0}, {"index": 3, "minor_number": 3}]}
    assert _snapshot.selected_files_only(holders, raw["gpus"]) == expected


def test_unknown_minor_numbers_keep_every_node():
    raw = {"gpus": [{"index": 0, "minor_number": None}]}
    assert _snapshot.selected_files_only({11: ["/dev/nvidia5"]}, raw["gpus"]) == {11: ["/dev/nvidia5"]}


def test_run_smi_restricts_to_the_selected_gpus(monkeypatch):
    seen = {}

    def fake(argv, timeout, what):
        seen.update(argv=argv, timeout=timeout, what=what)
        return 0, "", ""

    monkeypatch.setattr("ansible_collections.gpuops.gpu.plugins.module_utils._host.snapshots.run_in_group", fake)
    taker = SnapshotTaker(Params(query_timeout=3.0))
    taker.smi_ids = ["0", "3"]
    taker.run_smi(["/usr/bin/nvidia-smi", "--query-gpu=index,uuid", "--format=csv"])
    assert seen == {"argv": ["/usr/bin/nvidia-smi", "--id=0,3", "--query-gpu=index,uuid", "--format=csv"],
                    "timeout": 3.0, "what": "/usr/bin/nvidia-smi --query-gpu"}
