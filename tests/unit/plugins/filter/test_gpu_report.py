# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet report's fit and health per GPU, and its node_exporter textfile (gpu_report_prometheus),
read back by prometheus_client's parser of the text format."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.gpuops.gpu.plugins.filter import gpu_report_markdown as gpu_report_markdown_plugin
from ansible_collections.gpuops.gpu.plugins.filter import gpu_report_prometheus as gpu_report_prometheus_plugin
from ansible_collections.gpuops.gpu.plugins.plugin_utils._tables import (
    gpu_report_markdown,
    gpu_report_prometheus,
    gpu_report_rows,
    gpu_report_table,
)

MIB = 1024 * 1024
REMAP = {"check": "row_remap_pending", "blocking": True, "detail": "a row remap is pending", "action": "reset"}
SLOW = {"check": "hw_slowdown", "blocking": False, "detail": "the hardware slows its clocks down", "action": "cool"}


def gpu(index=0, used=0, free=143771, total=143771, status="ok", checks=(), fit=None, idle=True, uuid=None,
        name="NVIDIA H200", unsupported=()):
    """A GPU dict shaped like _snapshot.build's, with the fields the report reads."""
    return {"index": index, "name": name, "uuid": uuid or f"GPU-{index:04d}",
            "memory": {"used": used, "free": free, "total": total},
            "health": {"status": status, "detail": None, "checks": list(checks)}, "fit": fit,
            "fits": None if fit is None else fit["fits"], "unsupported": list(unsupported), "processes": [],
            "holders": [], "blockers": [], "idle": idle, "busy_reasons": [] if idle else ["something"]}


def fit(fits, free=143771, need=129394):
    return {"free_mib": free, "need_mib": need, "fits": fits, "memory": "nvmlDeviceGetMemoryInfo_v2"}


# (name, gpu, the row's fit and health keys, the table's fits and health cells)
ROWS = [
    ("healthy, no fit asked", gpu(),
     {"fits": None, "need_mib": None, "free_mib": 143771, "healthy": True, "checks": [], "blocking_checks": []},
     ("-", "ok")),
    ("fits", gpu(fit=fit(True)), {"fits": True, "need_mib": 129394, "healthy": True}, ("yes", "ok")),
    ("does not fit", gpu(used=20000, free=123771, fit=fit(False, 123771), idle=False),
     {"fits": False, "need_mib": 129394, "free_mib": 123771}, ("no", "ok")),
    ("a blocking check fails", gpu(checks=[REMAP], idle=False),
     {"healthy": False, "checks": ["row_remap_pending"], "blocking_checks": ["row_remap_pending"]},
     ("-", "row_remap_pending (blocking)")),
    ("a check that does not block", gpu(checks=[SLOW]),
     {"healthy": True, "checks": ["hw_slowdown"], "blocking_checks": []}, ("-", "hw_slowdown")),
    ("both", gpu(checks=[REMAP, SLOW], idle=False),
     {"healthy": False, "checks": ["row_remap_pending", "hw_slowdown"]},
     ("-", "row_remap_pending (blocking), hw_slowdown")),
    ("lost", gpu(status="lost", idle=False), {"healthy": False, "health": "lost"}, ("-", "lost")),
    ("an error and a check", gpu(status="error", checks=[SLOW], idle=False), {"healthy": False},
     ("-", "error, hw_slowdown")),
    ("unknown status", dict(gpu(), health=None), {"healthy": None, "health": None, "checks": []}, ("-", "?")),
    ("unified memory: no free, fit unknown", gpu(free=None, total=None, fit=fit(None, None), unsupported=["memory"]),
     {"fits": None, "free_mib": None, "unsupported": ["memory"]}, ("-", "ok")),
]


@pytest.mark.parametrize("name, g, keys, cells", ROWS, ids=[c[0] for c in ROWS])
def test_rows_carry_fit_and_health(name, g, keys, cells):
    row = gpu_report_rows([g], "pve")[0]
    assert {k: row[k] for k in keys} == keys
    line = gpu_report_table([row])[1]
    assert line.split("  ")[0] == "pve"
    header = gpu_report_table([row])[0]
    fits_at, health_at, holders_at = header.index("fits"), header.index("health"), header.index("holders")
    assert line[fits_at:health_at].strip() == cells[0]
    assert line[health_at:holders_at].strip() == cells[1]
    md = gpu_report_markdown([row]).splitlines()[-1].split(" | ")
    assert md[7:9] == list(cells)


def labels(host="pve", gpu_index="0", uuid="GPU-0000", name="NVIDIA H200"):
    return {"host": host, "gpu": gpu_index, "uuid": uuid, "name": name}


def parse(text):
    """{metric name: (type, help, {label tuple: value})} by prometheus_client's parser."""
    out = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = (fam.type, fam.documentation,
                         {tuple(sorted(s.labels.items())): s.value for s in fam.samples if s.name == fam.name})
        assert all(s.timestamp is None for s in fam.samples)  # node_exporter's textfile collector refuses timestamps
    return out


NAMES = ["gpuops_gpu_ready", "gpuops_gpu_fits", "gpuops_gpu_healthy", "gpuops_gpu_memory_used_bytes",
         "gpuops_gpu_memory_free_bytes", "gpuops_gpu_memory_total_bytes"]

# (name, gpu, {metric: value or None (no sample)})
PROM = [
    ("idle, fits, healthy", gpu(used=0, free=143771, total=143771, fit=fit(True)),
     {"gpuops_gpu_ready": 1, "gpuops_gpu_fits": 1, "gpuops_gpu_healthy": 1, "gpuops_gpu_memory_used_bytes": 0,
      "gpuops_gpu_memory_free_bytes": 143771 * MIB, "gpuops_gpu_memory_total_bytes": 143771 * MIB}),
    ("busy, does not fit", gpu(used=40960, free=102811, fit=fit(False, 102811), idle=False),
     {"gpuops_gpu_ready": 0, "gpuops_gpu_fits": 0, "gpuops_gpu_healthy": 1, "gpuops_gpu_memory_used_bytes": 40960 * MIB,
      "gpuops_gpu_memory_free_bytes": 102811 * MIB, "gpuops_gpu_memory_total_bytes": 143771 * MIB}),
    ("a blocking check fails", gpu(checks=[REMAP], idle=False),
     {"gpuops_gpu_ready": 0, "gpuops_gpu_fits": None, "gpuops_gpu_healthy": 0}),
    ("a check that does not block", gpu(checks=[SLOW]), {"gpuops_gpu_healthy": 1}),
    ("lost: no memory known", gpu(status="lost", used=None, free=None, total=None, idle=False),
     {"gpuops_gpu_ready": 0, "gpuops_gpu_healthy": 0, "gpuops_gpu_memory_used_bytes": None,
      "gpuops_gpu_memory_free_bytes": None, "gpuops_gpu_memory_total_bytes": None}),
    ("idle unknown", gpu(idle=None), {"gpuops_gpu_ready": None}),
]


@pytest.mark.parametrize("name, g, values", PROM, ids=[c[0] for c in PROM])
def test_prometheus_values(name, g, values):
    text = gpu_report_prometheus(gpu_report_rows([g], "pve"))
    families = parse(text)
    assert list(families) == NAMES  # every family, with its HELP and TYPE, even one without a sample
    for metric, value in values.items():
        kind, doc, samples = families[metric]
        assert kind == "gauge" and doc
        key = tuple(sorted(labels().items()))
        assert samples.get(key) == value, (metric, samples)
        if value is None:
            assert samples == {}


# (name, a label value, how it is written between the quotes)
ESCAPES = [
    ("plain", "NVIDIA H200", "NVIDIA H200"),
    ("a double quote", 'NVIDIA "H200"', 'NVIDIA \\"H200\\"'),
    ("a backslash", "a\\b", "a\\\\b"),
    ("a line feed", "a\nb", "a\\nb"),
    ("all three, and braces and commas", 'x"\\\n{a=b},', 'x\\"\\\\\\n{a=b},'),
    ("unicode", "GPU ü", "GPU ü"),
]


@pytest.mark.parametrize("name, value, written", ESCAPES, ids=[c[0] for c in ESCAPES])
def test_prometheus_label_escaping(name, value, written):
    text = gpu_report_prometheus(gpu_report_rows([gpu(name=value)], 'host "a"'))
    assert f'gpuops_gpu_ready{{host="host \\"a\\"",gpu="0",uuid="GPU-0000",name="{written}"}} 1\n' in text
    key = tuple(sorted(labels(host='host "a"', name=value).items()))
    assert parse(text)["gpuops_gpu_ready"][2] == {key: 1}


def test_prometheus_text_exactly():
    rows = gpu_report_rows([gpu(0, used=1, free=10, total=11, fit=fit(True, 10, 5)),
                            gpu(1, used=2, free=9, total=11, idle=False, checks=[REMAP])], "pve")
    assert gpu_report_prometheus(rows).splitlines() == [
        "# HELP gpuops_gpu_ready 1 when the GPU is ready for the next server (idle, by the gpu_wait_idle rule), else 0.",
        "# TYPE gpuops_gpu_ready gauge",
        'gpuops_gpu_ready{host="pve",gpu="0",uuid="GPU-0000",name="NVIDIA H200"} 1',
        'gpuops_gpu_ready{host="pve",gpu="1",uuid="GPU-0001",name="NVIDIA H200"} 0',
        "# HELP gpuops_gpu_fits 1 when the next server fits in the free memory (min_free_mib, min_free_pct), else 0;"
        " no sample when no fit was asked for or the driver reports no memory.",
        "# TYPE gpuops_gpu_fits gauge",
        'gpuops_gpu_fits{host="pve",gpu="0",uuid="GPU-0000",name="NVIDIA H200"} 1',
        "# HELP gpuops_gpu_healthy 1 when the GPU is healthy, 0 when it is lost, in error or a blocking health check"
        " fails.",
        "# TYPE gpuops_gpu_healthy gauge",
        'gpuops_gpu_healthy{host="pve",gpu="0",uuid="GPU-0000",name="NVIDIA H200"} 1',
        'gpuops_gpu_healthy{host="pve",gpu="1",uuid="GPU-0001",name="NVIDIA H200"} 0',
        "# HELP gpuops_gpu_memory_used_bytes GPU memory in use, in bytes.",
        "# TYPE gpuops_gpu_memory_used_bytes gauge",
        'gpuops_gpu_memory_used_bytes{host="pve",gpu="0",uuid="GPU-0000",name="NVIDIA H200"} 1048576',
        'gpuops_gpu_memory_used_bytes{host="pve",gpu="1",uuid="GPU-0001",name="NVIDIA H200"} 2097152',
        "# HELP gpuops_gpu_memory_free_bytes GPU memory free, in bytes.",
        "# TYPE gpuops_gpu_memory_free_bytes gauge",
        'gpuops_gpu_memory_free_bytes{host="pve",gpu="0",uuid="GPU-0000",name="NVIDIA H200"} 10485760',
        'gpuops_gpu_memory_free_bytes{host="pve",gpu="1",uuid="GPU-0001",name="NVIDIA H200"} 9437184',
        "# HELP gpuops_gpu_memory_total_bytes GPU memory in total, in bytes.",
        "# TYPE gpuops_gpu_memory_total_bytes gauge",
        'gpuops_gpu_memory_total_bytes{host="pve",gpu="0",uuid="GPU-0000",name="NVIDIA H200"} 11534336',
        'gpuops_gpu_memory_total_bytes{host="pve",gpu="1",uuid="GPU-0001",name="NVIDIA H200"} 11534336',
    ]


@pytest.mark.parametrize("rows", [[], None, ["not a row"]])
def test_prometheus_no_rows(rows):
    text = gpu_report_prometheus(rows)
    assert text.endswith("\n") and text.count("# TYPE ") == 6
    assert all(samples == {} for _kind, _doc, samples in parse(text).values())


@pytest.mark.parametrize("plugin, name, function", [
    (gpu_report_markdown_plugin, "gpu_report_markdown", gpu_report_markdown),
    (gpu_report_prometheus_plugin, "gpu_report_prometheus", gpu_report_prometheus),
])
def test_each_filter_file_is_named_for_what_it_writes(plugin, name, function):
    """One filter per form: the Markdown filter writes Markdown only, the textfile has its own name."""
    assert plugin.FilterModule().filters() == {name: function}
    assert plugin.DOCUMENTATION.lstrip().startswith(f"name: {name}\n")


def test_markdown_is_markdown_only():
    rows = gpu_report_rows([gpu()], "pve")
    assert gpu_report_markdown(rows).startswith("# GPU report\n")
    assert "# TYPE" not in gpu_report_markdown(rows)
    with pytest.raises(TypeError):
        gpu_report_markdown(rows, format="prometheus")  # pylint: disable=unexpected-keyword-arg
