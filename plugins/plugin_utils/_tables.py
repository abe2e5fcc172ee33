# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The GPU tables, the blockers of a failure and the fleet report's rows, shared by the filters
(gpu_table, gpu_blockers, gpu_report_*) and the action plugin predeploy_host."""

from __future__ import annotations

from ansible_collections.gpuops.gpu.plugins.module_utils import _bound, _holding, _snapshot

MAX_HOLDERS = 3
MAX_REASON = 72  # a table cuts a busy reason here; busy_reasons and gpu_blockers keep it whole
UNKNOWN = "?"


# --- one rule: what holds a GPU, and how a holder is named ------------------------------------------

def _gpus(value, holder_processes=None) -> list:
    """The GPU dicts of ``value``, their holders in the snapshot's form (a result's compact holders expanded
    with ``holder_processes``, _snapshot.expand_gpus)."""
    return _snapshot.expand_gpus([g for g in (value or []) if isinstance(g, dict)], holder_processes)


def _text(value) -> str:
    return UNKNOWN if value is None or value == "" else str(value)


def _memory(gpu: dict):
    memory = gpu.get("memory") if isinstance(gpu.get("memory"), dict) else {}
    return memory.get("used"), memory.get("total")


def holders(gpu: dict) -> list:
    """What keeps a GPU busy, by the holding model: the snapshot's ``blockers`` (_holding.holders_of)."""
    gpu = _snapshot.expand_gpus([gpu])[0]  # compact holders with no details: pid and evidence
    entries = {key: [p for p in (gpu.get(key) or []) if isinstance(p, dict) and p.get("pid") is not None]
               for key in ("processes", "holders")}
    return _holding.holders_of(dict(gpu, **entries))


def _container(ct, containers=None) -> str:
    """'CT 129' (or 'CT 129 gpu-ct' when ``containers`` names its inventory host); '' when not in one."""
    if not isinstance(ct, dict) or ct.get("id") is None:
        return ""
    kind = ct.get("kind") or "lxc"
    text = f"CT {ct['id']}" if kind == "lxc" else f"{kind} {ct['id']}"
    owner = (containers or {}).get(str(ct["id"])) if kind == "lxc" else None
    return f"{text} {owner}" if owner else text


def describe(proc: dict, mib=True, containers=None) -> str:
    """'pid 8812 python3 (CT 129, sglang.service, 130048 MiB)' - how the tables name a holder."""
    pid = _text(proc.get("pid"))
    if proc.get("visible") is False:
        return f"pid {pid} (not visible from here)"
    extras = [e for e in (_container(proc.get("container"), containers), proc.get("unit") or "") if e]
    if proc.get("evidence") == "device":
        extras.append("device file")
    if mib and proc.get("used_mib") is not None:
        extras.append(f"{proc['used_mib']} MiB")
    return f"pid {pid} {proc.get('name') or UNKNOWN}" + (f" ({', '.join(extras)})" if extras else "")


def _cut(items: list, limit=MAX_HOLDERS, more=0) -> list:
    """At most ``limit`` items and '+N more'; ``more``: those a result in summary left out already (_bound)."""
    if len(items) <= limit and not more:
        return items
    return items[:limit] + [f"+{max(len(items) - limit, 0) + more} more"]


def _reasons(gpu: dict) -> list:
    return [str(r) for r in gpu.get("busy_reasons") or [] if r]


def _short(reason: str, limit=MAX_REASON) -> str:
    """A reason cut at a word before ``limit`` characters, for a table line."""
    if len(reason) <= limit:
        return reason
    cut = reason[:limit - 3].rsplit(" ", 1)[0].rstrip(",;:(")
    return cut + "..."


def state_text(gpu: dict, containers=None) -> str:
    """What holds one GPU (at most three holders), else 'idle', else why it is busy; '?' when unknown."""
    found = holders(gpu)
    if found:
        status = (gpu.get("health") or {}).get("status") if isinstance(gpu.get("health"), dict) else None
        prefix = f"health {status}: " if status not in (None, "ok") else ""
        return prefix + ", ".join(_cut([describe(h, containers=containers) for h in found],
                                       more=_bound.left_out(gpu, "blockers")))
    if gpu.get("idle") is True:
        return "idle"
    reasons = _reasons(gpu)
    if reasons:
        return "; ".join(_cut([_short(r) for r in reasons]))
    return "busy" if gpu.get("idle") is False else UNKNOWN


# --- gpu_table -----------------------------------------------------------------------------------

def _key(gpu: dict):
    return ("uuid", gpu["uuid"]) if gpu.get("uuid") else ("index", gpu.get("index"))


def _pairs(after: list, before, holder_processes=None):
    """[(before gpu or None, after gpu or None)] in after's order, then the GPUs only ``before`` had."""
    if before is None:
        return [(None, g) for g in after]
    earlier = _gpus(before, holder_processes)
    by_uuid = {g["uuid"]: g for g in earlier if g.get("uuid")}
    by_index = {g.get("index"): g for g in earlier}
    pairs, used = [], set()
    for g in after:
        match = by_uuid.get(g.get("uuid")) if g.get("uuid") else None
        if match is None and not (g.get("uuid") and by_uuid):
            match = by_index.get(g.get("index"))
        if match is not None and id(match) in used:
            match = None
        if match is not None:
            used.add(id(match))
        pairs.append((match, g))
    pairs.extend((g, None) for g in earlier if id(g) not in used)
    return pairs


def _header(count: int, host, seen_from, title, driver, gpu_count) -> str:
    lead = " - ".join(str(p) for p in (title, host) if p)
    gpus = f"{count} of {gpu_count} GPU(s)" if gpu_count is not None and gpu_count != count else f"{count} GPU(s)"
    parts = [f"{lead}: {gpus}" if lead else gpus]
    if isinstance(driver, dict):
        if driver.get("driver_version"):
            parts.append(f"driver {driver['driver_version']}" + (f" ({driver['backend']})" if driver.get("backend") else ""))
    elif driver:
        parts.append(f"driver {driver}")
    if seen_from and seen_from != host:
        parts.append(f"seen from {seen_from}")
    return ", ".join(parts)


def gpu_table(after, before=None, host="", seen_from="", title="", driver=None, gpu_count=None, holder_processes=None) -> list:
    """A header and one line per GPU (see DOCUMENTATION)."""
    pairs = _pairs(_gpus(after, holder_processes), before, holder_processes)
    shown = [g for pair in pairs for g in pair if g is not None]
    width = max([len(_text(g.get("name"))) for g in shown] or [1])
    cells = []
    for old, new in pairs:
        now = new if new is not None else old
        used_new = _text(_memory(new)[0]) if new is not None else UNKNOWN
        total = _memory(new)[1] if new is not None else None
        if total is None and old is not None:
            total = _memory(old)[1]
        same = (old is not None and new is not None and _memory(old)[0] == _memory(new)[0]
                and state_text(old) == state_text(new))
        if before is None or same:
            # Nothing changed on this GPU (or there is no before): its state once, not "x -> x".
            memory = [used_new]
            what = state_text(new)
        else:
            memory = [_text(_memory(old)[0]) if old is not None else UNKNOWN, used_new]
            what = (state_text(old) if old is not None else UNKNOWN) + " -> " + (state_text(new) if new is not None else "not seen")
        cells.append((_text(now.get("index")), _text(now.get("name")), memory, _text(total), what))
    pairs_of_memory = [c[2] for c in cells if len(c[2]) == 2]
    widths = [max([len(m[i]) for m in pairs_of_memory] or [1]) for i in range(2)]
    span = max([widths[0] + 4 + widths[1] if pairs_of_memory else 0] + [len(c[2][0]) for c in cells if len(c[2]) == 1])
    total_width = max([len(c[3]) for c in cells] or [1])
    lines = [_header(len(_gpus(after)), host, seen_from, title, driver, gpu_count)]
    for index, name, memory, total, what in cells:
        used = " -> ".join(m.rjust(w) for m, w in zip(memory, widths)) if len(memory) == 2 else memory[0].rjust(span)
        lines.append(f"GPU {index:<2} {name:<{width}}  {used} / {total:>{total_width}} MiB  {what}")
    return lines


# --- gpu_blockers --------------------------------------------------------------------------------

def gpu_blockers(gpus, holder_processes=None) -> list:
    """'GPU 3: pid 8812 python3 (CT 129, sglang.service) 130048 MiB', one string per busy GPU; ``holder_processes``:
    the result's details of its device-file holders (see gpu_table)."""
    out = []
    for gpu in _gpus(gpus, holder_processes):
        if gpu.get("idle") is True:
            continue
        found = holders(gpu)
        if found:
            what = ", ".join(describe(h, mib=False) + (f" {h['used_mib']} MiB" if h.get("used_mib") is not None else "")
                             for h in found)
            left = _bound.left_out(gpu, "blockers")
            what += f", +{left} more" if left else ""
        else:
            what = "; ".join(_reasons(gpu)) or "busy"
        out.append(f"GPU {_text(gpu.get('index'))}: {what}")
    return out


# --- the fleet report ----------------------------------------------------------------------------

def _healthy(status, checks):
    """True: the driver reads the GPU (status ok) and no blocking check fails; False: lost, an error, or a blocking
    check fails; None: the status is unknown."""
    if status is None:
        return None
    return status == "ok" and not any(c.get("blocking") for c in checks)


def gpu_report_rows(gpus, host, seen_from=None, containers=None, holder_processes=None) -> list:
    """One row per GPU for the fleet report; ``containers``: {vmid: inventory hostname} of the node's containers;
    ``holder_processes``: ansible_facts.gpu_holder_processes (see gpu_table)."""
    owners = {str(k): str(v) for k, v in (containers or {}).items() if v}
    rows = []
    for gpu in _gpus(gpus, holder_processes):
        used, total = _memory(gpu)
        found = holders(gpu)
        health = gpu.get("health") if isinstance(gpu.get("health"), dict) else {}
        checks = [c for c in health.get("checks") or [] if isinstance(c, dict) and c.get("check")]
        fit = gpu.get("fit") if isinstance(gpu.get("fit"), dict) else {}
        memory = gpu.get("memory") if isinstance(gpu.get("memory"), dict) else {}
        hosts = sorted({owners[str(h["container"]["id"])] for h in found if isinstance(h.get("container"), dict)
                        and (h["container"].get("kind") or "lxc") == "lxc" and str(h["container"].get("id")) in owners})
        rows.append({
            "host": host, "seen_from": seen_from or host, "index": gpu.get("index"), "name": gpu.get("name"),
            "uuid": gpu.get("uuid"), "used_mib": used, "total_mib": total, "free_mib": memory.get("free"),
            "idle": gpu.get("idle"), "fits": gpu.get("fits"), "need_mib": fit.get("need_mib"),
            "health": health.get("status"), "healthy": _healthy(health.get("status"), checks),
            "checks": [c["check"] for c in checks], "blocking_checks": [c["check"] for c in checks if c.get("blocking")],
            "unsupported": [str(u) for u in gpu.get("unsupported") or []], "holders": [h["pid"] for h in found],
            "holders_text": ", ".join(describe(h, containers=owners) for h in found),
            "container_hosts": hosts, "busy_reasons": _reasons(gpu),
        })
    return rows


def _idle_word(idle, yes="idle", no="busy") -> str:
    return yes if idle is True else no if idle is False else UNKNOWN


def _what(row: dict, short=True) -> str:
    """The holders of a row, else why it is busy, else '-'."""
    if row.get("holders_text"):
        return row["holders_text"]
    if row.get("idle") is not True and row.get("busy_reasons"):
        reasons = [str(r) for r in row["busy_reasons"]]
        return "; ".join(_cut([_short(r) for r in reasons]) if short else reasons)
    return "-"


def _fits_word(row: dict) -> str:
    """yes / no, '-' when no fit was asked for (no min_free_mib or min_free_pct) or it cannot be told."""
    return {True: "yes", False: "no"}.get(row.get("fits"), "-")


def _health_word(row: dict) -> str:
    """'ok'; else the status (lost, error) and the failing checks, a blocking one marked: 'row_remap_pending
    (blocking), hw_slowdown'; '?' when unknown."""
    status = row.get("health")
    if status is None:
        return UNKNOWN
    blocking = set(row.get("blocking_checks") or [])
    parts = [str(status)] if status != "ok" else []
    parts += [f"{c} (blocking)" if c in blocking else str(c) for c in row.get("checks") or []]
    return ", ".join(parts) or "ok"


def gpu_report_table(rows) -> list:
    """A header line and one aligned line per row: host, GPU, name, used / total MiB, idle or busy, whether the next
    server fits, health, holders."""
    rows = [r for r in rows or [] if isinstance(r, dict)]
    used = [_text(r.get("used_mib")) for r in rows]
    total = [_text(r.get("total_mib")) for r in rows]
    wu, wt = max([len(u) for u in used] or [0]), max([len(t) for t in total] or [0])
    cells = [("host", "GPU", "name", "used / total MiB", "state", "fits", "health", "holders")]
    for r, u, t in zip(rows, used, total):
        cells.append((_text(r.get("host")), _text(r.get("index")), _text(r.get("name")), f"{u:>{wu}} / {t:<{wt}}",
                      _idle_word(r.get("idle")), _fits_word(r), _health_word(r), _what(r)))
    last = len(cells[0]) - 1
    widths = [max(len(c[i]) for c in cells) for i in range(last)]
    return [("  ".join(c[i].ljust(widths[i]) for i in range(last)) + "  " + c[last]).rstrip() for c in cells]


def _md(value) -> str:
    return _text(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def gpu_report_markdown(rows) -> str:
    """The report as Markdown: a title and one table row per GPU (the textfile is gpu_report_prometheus)."""
    lines = ["# GPU report", "",
             "| host | GPU | name | used MiB | free MiB | total MiB | idle | fits | health | holders |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in [r for r in rows or [] if isinstance(r, dict)]:
        cells = [r.get("host"), r.get("index"), r.get("name"), r.get("used_mib"), r.get("free_mib"), r.get("total_mib"),
                 _idle_word(r.get("idle"), "yes", "no"), _fits_word(r), _health_word(r), _what(r, short=False)]
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


# --- the Prometheus textfile ---------------------------------------------------------------------
# The text exposition format (https://prometheus.io/docs/instrumenting/exposition_formats/), as node_exporter's
# textfile collector reads it: no timestamps (the collector refuses them), each family's HELP and TYPE lines and
# then all its samples together, a newline at the end.

MIB = 1024 * 1024
PROM_LABELS = ("host", "gpu", "uuid", "name")
# (metric name, help, the value of a row: a number, or None when unknown - then the GPU has no sample of it)
PROM_METRICS = (
    ("gpuops_gpu_ready", "1 when the GPU is ready for the next server (idle, by the gpu_wait_idle rule), else 0.",
     lambda r: _bool_value(r.get("idle"))),
    ("gpuops_gpu_fits", "1 when the next server fits in the free memory (min_free_mib, min_free_pct), else 0;"
     " no sample when no fit was asked for or the driver reports no memory.",
     lambda r: _bool_value(r.get("fits"))),
    ("gpuops_gpu_healthy", "1 when the GPU is healthy, 0 when it is lost, in error or a blocking health check fails.",
     lambda r: _bool_value(r.get("healthy"))),
    ("gpuops_gpu_memory_used_bytes", "GPU memory in use, in bytes.", lambda r: _bytes(r.get("used_mib"))),
    ("gpuops_gpu_memory_free_bytes", "GPU memory free, in bytes.", lambda r: _bytes(r.get("free_mib"))),
    ("gpuops_gpu_memory_total_bytes", "GPU memory in total, in bytes.", lambda r: _bytes(r.get("total_mib"))),
)


def _bool_value(value):
    return None if not isinstance(value, bool) else int(value)


def _bytes(mib):
    if isinstance(mib, bool) or not isinstance(mib, (int, float)):
        return None
    return int(mib * MIB)


def _label_value(value) -> str:
    """A label value of the text format: backslash, double quote and line feed escaped; '' when unknown."""
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _help_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def gpu_report_prometheus(rows) -> str:
    """The report as a node_exporter textfile: one gauge per GPU for ready, fits, healthy and memory (bytes),
    labelled host, gpu (the index), uuid and name; a value that is not known has no sample."""
    rows = [r for r in rows or [] if isinstance(r, dict)]
    lines = []
    for name, text, value_of in PROM_METRICS:
        lines += [f"# HELP {name} {_help_text(text)}", f"# TYPE {name} gauge"]
        for r in rows:
            value = value_of(r)
            if value is None:
                continue
            labels = dict(zip(PROM_LABELS, (r.get("host"), r.get("index"), r.get("uuid"), r.get("name"))))
            pairs = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{pairs}}} {value}")
    return "\n".join(lines) + "\n"
