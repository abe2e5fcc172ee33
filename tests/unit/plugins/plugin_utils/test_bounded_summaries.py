# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The filters count what a result in summary (_bound: the modules' detail option) left out: here, with the
controller's plugins (the module_utils tests run on every target Python, without ansible's controller code). What the
action plugin predeploy_host prints per host at each verbosity, a failure's message cut to fit its line, and no printed
line (the wait's progress line too) over 2,000 characters."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.plugin_utils import _results, _slices
from ansible_collections.gpuops.gpu.plugins.plugin_utils._results import gpu_idle_result
from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import gpu_blockers, state_text
from ansible_collections.gpuops.gpu.plugins.module_utils import _bound, _redact
from ansible_collections.gpuops.gpu.tests.unit.plugins.module_utils.test__bound import busy_gpu, release_result


def test_the_filters_count_what_a_summary_left_out():
    gpu = _bound.gpu(busy_gpu(0, list(range(100, 130)), []))
    details = {str(p): {"pid": p, "name": f"w{p}"} for p in range(100, 130)}
    assert state_text(compact_gpu_expanded(gpu, details)).endswith(f"+{30 - 3} more")
    assert gpu_blockers([gpu], holder_processes=details)[0].endswith(f"+{30 - _bound.CAP} more")
    release = _bound.bound(release_result(64, 2, 40))
    wait = {"would_wait": True, "gpus": release["gpus"], "idle_gpus": []}
    summary = gpu_idle_result(wait, release=release, check_mode=True, release_required=True)["summary"]
    assert summary["ready"] is False
    assert len(summary["released"]) + summary["more"]["released"] == 64 * 2 + 40


def compact_gpu_expanded(gpu, details):
    from ansible_collections.gpuops.gpu.plugins.module_utils._snapshot import expand_gpus  # noqa: PLC0415
    return expand_gpus([gpu], details)[0]


RECORD = {"table": ["GPUs before -> after - h: 8 GPU(s)"] + [f"GPU {i}  H200  4096 -> 0 / 143771 MiB  x -> idle" for i in range(8)],
          "processes": [f"released pid {1000 + i} python3 (CT 129, GPU {i % 8}; SIGTERM): " + "python3 -m sglang" * 40
                        for i in range(36)]}


@pytest.mark.parametrize("verbosity, processes, more", [
    (0, 0, False),                          # the table only
    (1, _results.PROCESS_LINES, True),      # -v: the first processes and a count of the others
    (2, 36, False),                         # -vv: every process
])
def test_what_the_task_prints_per_verbosity(verbosity, processes, more):
    lines = _results.printed(RECORD, verbosity)
    assert lines[:9] == RECORD["table"]
    assert [x for x in lines if x.startswith("released pid")] == [_results.line(x) for x in RECORD["processes"][:processes]]
    assert (lines[-1] == f"+{36 - processes} more process(es): every one with -vv, and in gpu_idle_result.processes") is more
    assert all(len(x) <= _redact.LINE for x in lines)


@pytest.mark.parametrize("whole, fits", [
    ("GPU 3 is lost", True),
    ("x" * _results.MESSAGE, True),
    ("x" * (_results.MESSAGE + 1), False),
    ('"' * (_results.MESSAGE // 2), True),  # each quote prints as two characters
    ('"' * (_results.MESSAGE // 2 + 1), False),
    ("\\" + "\n" * 2000, False),
])
def test_a_message_is_cut_to_fit_as_printed(whole, fits):
    tail = " ... (cut: the whole diagnosis is printed with -vv)"
    out = _results.fit_message(whole, tail)
    assert (out == whole) is fits
    assert _results.printed_length(out) <= _results.MESSAGE
    assert fits or (out.endswith(tail) and whole.startswith(out[:-len(tail)]))


@pytest.mark.parametrize("length", [0, _redact.LINE - 1, _redact.LINE, _redact.LINE + 1, 10 ** 6])
def test_a_printed_line_is_at_most_line_characters(length):
    text = "x" * length
    out = _redact.line(text)
    assert len(out) <= _redact.LINE and (out == text) is (length <= _redact.LINE)
    assert length <= _redact.LINE or out.endswith(f"[... {length - (_redact.LINE - 40)} more characters cut]")


def test_the_wait_s_progress_line_is_bounded_on_a_host_of_many_gpus(monkeypatch):
    """A progress line names each busy GPU: on a host of 64 busy GPUs it is over 2,000 characters."""
    said = []
    monkeypatch.setattr(_slices.display, "display", said.append)
    progress = "gpu_wait_idle: 0/64 GPUs idle; waiting on " + ", ".join(
        f"GPU {i} (1024 MiB, pid {1000 + i} python3, CT 129 +3 more)" for i in range(64)) + " - 10 s of 300 s"
    answers = iter([{"pending": True, "progress": progress, "progress_state": {}}, {"ready": True, "gpus": []}])
    assert _slices.run_wait(lambda args: next(answers), {"timeout": 300}, "gpu-ct") == {"ready": True, "gpus": []}
    assert len(progress) > 3000 and len(said) == 1 and len(said[0]) <= _redact.LINE
    assert said[0].startswith("[gpu-ct] gpu_wait_idle: 0/64 GPUs idle; waiting on GPU 0 (1024 MiB, pid 1000 python3")


def test_a_slice_that_finds_the_gpus_as_before_says_so_in_a_few_words(monkeypatch):
    """A wait that runs to its timeout prints a progress line per 10 s slice: 30 of them in 300 s, each naming every
    busy GPU again (about 750 characters at 8 busy GPUs: 22 KB). A line that would say what the one before said is
    short; a change (a GPU freed, another holder) is said in full."""
    said = []
    monkeypatch.setattr(_slices.display, "display", said.append)
    busy = "gpu_wait_idle: 0/8 GPUs idle; waiting on " + ", ".join(
        f"GPU {i} (1024 MiB, pid {1000 + i} python3, CT 129 +3 more)" for i in range(8))
    freed = "gpu_wait_idle: 1/8 GPUs idle; waiting on " + ", ".join(
        f"GPU {i} (1024 MiB, pid {1000 + i} python3, CT 129 +3 more)" for i in range(1, 8))
    lines = [busy, busy, busy, freed, freed]
    answers = iter([{"pending": True, "progress": f"{text} - {10 * (n + 1)} s of 300 s", "progress_state": {}}
                    for n, text in enumerate(lines)] + [{"ready": True, "gpus": []}])
    _slices.run_wait(lambda args: next(answers), {"timeout": 300}, "h")
    same = "waiting on the same GPUs and holders"
    assert said == [f"[h] {busy} - 10 s of 300 s", f"[h] gpu_wait_idle: 0/8 GPUs idle; {same} - 20 s of 300 s",
                    f"[h] gpu_wait_idle: 0/8 GPUs idle; {same} - 30 s of 300 s", f"[h] {freed} - 40 s of 300 s",
                    f"[h] gpu_wait_idle: 1/8 GPUs idle; {same} - 50 s of 300 s"]
