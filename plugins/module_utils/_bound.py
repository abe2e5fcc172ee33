# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""A result's size, bounded by design (the options ``detail`` and ``detail_file``).

ansible-runner (AWX) replaces a task's result by ``{}`` when ``len(str(result))`` is over 700,000 characters
(ansible_runner/display_callback/callback/awx_display.py, MAX_EVENT_RES), and a host of 64 GPUs with many
processes per GPU returns more than that: each GPU names its processes and holders, and every process holds
every GPU's node. So a result in summary (``detail: summary``, the default) keeps every GPU and every verdict
whole (idle, busy_reasons not empty, fits, health, blockers not empty, idle_gpus, counts) and caps each list
that grows with the processes - a GPU's processes, holders, blockers, lingering pids and busy reasons; the
holders' details and their files and GPUs; the processes released, survivors, respawned, skipped, protected;
the units; a wait's blockers and samples - at a few entries, with what it left out counted in ``more``:

- a GPU (or a process's details) whose lists were cut carries ``more``: ``{"processes": 12, "holders":
  {"lingering": 1000}, "blockers": 8}`` (the entries left out of each list, by key);
- the result carries ``detail``: ``{"level": "summary"|"full", "file": path|None, "more": {key: count}}`` - the
  entries left out of its own lists and mappings, by dotted key (``release.released``,
  ``ansible_facts.gpu_holder_processes``).

What is kept comes first by what matters: a GPU's blockers first in each of its lists, the blockers' details
first among the holders'. Nothing is cut that a verdict reads: a GPU is never dropped, nor its idle flag.
The whole result is in ``detail: full``, and in ``detail_file`` (JSON, mode 0600) whatever ``detail`` is.
The caps keep 64 GPUs x 16 processes per GPU under 200,000 characters, a diff with them (DESIGN.md 6b;
tests/functional/test_output_size.py, benchmarks/bench_output.py --fenced).
"""

from __future__ import annotations

from ansible_collections.gpuops.gpu.plugins.module_utils._redact import cut

SUMMARY = "summary"
FULL = "full"
MORE = "more"
DETAIL = "detail"
# The options of every module (the doc fragment gpuops.gpu.gpu).
DETAIL_ARGS = dict(
    detail=dict(type="str", choices=[SUMMARY, FULL], default=SUMMARY),
    detail_file=dict(type="path"),
)

# The caps of a GPU's lists are those of a host of SCALE_GPUS GPUs or more; a host of N < SCALE_GPUS GPUs gets
# SCALE_GPUS // N times as many per GPU (scale()), so that its lists are cut only where a large host's would be.
SCALE_GPUS = 64
CAP = 8             # pids of a GPU's list (blockers, holders by evidence, lingering); files and GPUs of a process
CAP_PROCESSES = 1   # a GPU's processes (each with its details; blockers and busy_reasons name more of them)
CAP_REASONS = 4     # a GPU's busy reasons
CAP_ENTRIES = 16    # processes or units of a result's list (released, survivors, skipped_processes, ...), scaled too
ENTRY_TIMES = 8     # ... up to this many times (an 8-GPU host's): a result's lists do not grow with its GPUs
CAP_LEFT = 64       # a release's left_holders (each keeps a GPU busy: the wait fails fast on any of them), scaled
CAP_DETAILS = 32    # holders' details (holder_processes), on any host (the blockers' first)
CAP_SAMPLES = 16    # the points of a GPU's samples: its first (where the wait began) and the latest
TEXT = 200          # characters of a busy reason in a summary
MSG = 2000          # characters of a result's msg in a summary (the whole of it in detail: full and detail_file)
CMDLINE = 100       # characters of a command line in a summary (_redact.cut's marker says how many more)

GPU_LISTS = ("gpus_before", "gpus", "gpu_devices")
DETAILS = ("holder_processes", "gpu_holder_processes")
ENTRY_LISTS = ("released", "survivors", "respawned", "skipped_processes", "protected", "stopped_units",
               "unstopped_units", "left_blockers")
NESTED = ("release", "ansible_facts")


def listed(texts, level: str = SUMMARY, sep: str = ", ", limit: int = CAP) -> str:
    """``texts`` joined with ``sep`` for a message: in summary the first ``limit`` of them and how many more (a
    message names what a list holds, and is bounded like the lists: 2,000 pids are not a sentence); all in full."""
    texts = list(texts)
    if level == FULL or len(texts) <= limit:
        return sep.join(texts)
    return sep.join(texts[:limit]) + f"{sep}and {len(texts) - limit} more (detail: full names them)"


def left_out(obj, key, sub=None) -> int:
    """How many entries of ``obj[key]`` (of ``obj[key][sub]``) a summary left out (0: none); ``obj``: a GPU, a
    process's details, or a result (then the count is in ``detail.more`` by ``key``)."""
    if not isinstance(obj, dict):
        return 0
    more = obj.get(MORE)
    if not isinstance(more, dict):
        more = obj[DETAIL].get(MORE) if isinstance(obj.get(DETAIL), dict) else None
    value = (more or {}).get(key) if isinstance(more, dict) else None
    if sub is not None:
        value = value.get(sub) if isinstance(value, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _first(items, keep, pid=lambda x: x):
    """``items`` with those whose pid is in ``keep`` first, each part in its order."""
    return [x for x in items if pid(x) in keep] + [x for x in items if pid(x) not in keep]


def _cap(items, limit, more: dict, key):
    if not isinstance(items, list) or len(items) <= limit:
        return items
    more[key] = more.get(key, 0) + len(items) - limit
    return items[:limit]


def _pid(entry):
    return entry.get("pid") if isinstance(entry, dict) else entry


def _cmdline(entry, times=1):
    limit = CMDLINE * times
    if isinstance(entry, dict) and isinstance(entry.get("cmdline"), str) and len(entry["cmdline"]) > limit:
        return dict(entry, cmdline=cut(entry["cmdline"], limit))
    return entry


def scale(gpus: int) -> int:
    """How many times the caps of a GPU's lists a host of ``gpus`` GPUs gets (1 from SCALE_GPUS GPUs on)."""
    return max(1, SCALE_GPUS // max(int(gpus), 1))


def gpu(entry: dict, times: int = 1) -> dict:
    """One GPU in summary: its blockers, processes, holders by evidence, lingering pids and busy reasons capped
    (the blockers first in each; ``times`` the caps, scale()), ``more`` counting what was left out; every other field
    as it is."""
    if not isinstance(entry, dict):
        return entry
    out, more = dict(entry), {}
    pids, processes, reasons = CAP * times, CAP_PROCESSES * times, CAP_REASONS * times
    blockers = _cap(entry.get("blockers"), pids, more, "blockers")
    keep = set(blockers) if isinstance(blockers, list) else set()
    out["blockers"] = blockers
    if isinstance(entry.get("processes"), list):
        kept = _cap(_first(entry["processes"], keep, _pid), processes, more, "processes")
        out["processes"] = [_cmdline(p, times) for p in kept]
    holders = entry.get("holders")
    if isinstance(holders, dict):
        cut_holders = {}
        out["holders"] = {k: _cap(_first(v, keep), pids, cut_holders, k) if isinstance(v, list) else v
                          for k, v in holders.items()}
        if cut_holders:
            more["holders"] = cut_holders
    elif isinstance(holders, list):  # the snapshot's form (a result not compacted): dicts
        out["holders"] = [_cmdline(h, times) for h in _cap(_first(holders, keep, _pid), pids, more, "holders")]
    out["lingering"] = _cap(entry.get("lingering"), pids, more, "lingering")
    if "lingering" not in entry:
        del out["lingering"]
    if isinstance(entry.get("busy_reasons"), list):
        out["busy_reasons"] = [cut(r, TEXT) if isinstance(r, str) else r
                               for r in _cap(entry["busy_reasons"], reasons, more, "busy_reasons")]
    if more:
        out[MORE] = more
    return out


def holder_details(entry: dict, times: int = 1) -> dict:
    """A holder's details in summary: its files (by directory) and GPUs capped (``times`` the cap), its command
    line cut."""
    if not isinstance(entry, dict):
        return entry
    out, more = dict(_cmdline(entry, times)), {}
    files = entry.get("files")
    if isinstance(files, dict):
        cut_files = {}
        out["files"] = {d: _cap(names, CAP * times, cut_files, d) for d, names in files.items()}
        if cut_files:
            more["files"] = cut_files
    elif isinstance(files, list):
        out["files"] = _cap(files, CAP * times, more, "files")
    out["gpus"] = _cap(entry.get("gpus"), CAP * times, more, "gpus")
    if "gpus" not in entry:
        del out["gpus"]
    if more:
        out[MORE] = more
    return out


def _process_entry(entry, times=1):
    """One entry of a result's process list (released, skipped_processes, a wait's blockers): its command line
    cut, its GPUs and files capped."""
    if not isinstance(entry, dict):
        return entry
    out, more = dict(_cmdline(entry, times)), {}
    for key in ("gpus", "files"):
        if isinstance(entry.get(key), list):
            out[key] = _cap(entry[key], CAP * times, more, key)
    if more:
        out[MORE] = more
    return out


def _referenced(gpus) -> list:
    """The pids the (summarized) GPUs name, the blockers first, then by evidence as they are listed."""
    first, rest = [], []
    for g in gpus or []:
        if not isinstance(g, dict):
            continue
        first += [p for p in g.get("blockers") or [] if not isinstance(p, (dict, list))]
        holders = g.get("holders")
        if isinstance(holders, dict):
            for pids in holders.values():
                rest += [p for p in pids or [] if not isinstance(p, (dict, list))]
    seen, out = set(), []
    for pid in first + rest:
        if str(pid) not in seen:
            seen.add(str(pid))
            out.append(str(pid))
    return out


def summarize(result: dict, more: dict = None, prefix: str = "") -> dict:
    """A copy of ``result`` (a module's result, compacted: _snapshot.compact_result) in summary; the entries left
    out of its own lists, by dotted key, are added to ``more``."""
    if not isinstance(result, dict):
        return result
    more = {} if more is None else more
    out = dict(result)
    gpus = []
    times = scale(max([len(out[k]) for k in GPU_LISTS if isinstance(out.get(k), list)] or [SCALE_GPUS]))
    for key in GPU_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [gpu(g, times) for g in out[key]]
            gpus += out[key]
    for key in DETAILS:
        details = out.get(key)
        if isinstance(details, dict):
            # The details of the pids the GPUs still name (their blockers' first), at most CAP_DETAILS of them.
            named = [k for k in _referenced(gpus) if k in details]
            kept = named[:CAP_DETAILS]
            if len(kept) < len(details):
                more[prefix + key] = len(details) - len(kept)
            out[key] = {k: holder_details(details[k], times) for k in sorted(kept, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else k))}
    # A result's own lists do not grow with its GPUs: scaled as an 8-GPU host's at most (2,000 targets of one GPU
    # would keep 1,024 entries, 250 KB, at a one-GPU result's scale).
    entries = min(times, ENTRY_TIMES)
    for key in ENTRY_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_process_entry(e, entries) for e in _cap(out[key], CAP_ENTRIES * entries, more, prefix + key)]
    if isinstance(out.get("left_holders"), list):  # what the wait after a release fails fast on: any one of them will do
        out["left_holders"] = _cap(out["left_holders"], CAP_LEFT * entries, more, prefix + "left_holders")
    if isinstance(out.get("blockers"), dict):  # a wait's failure: {gpu: [holders]}
        out["blockers"] = {k: [_process_entry(e, entries) for e in _cap(v, CAP * times, more, f"{prefix}blockers.{k}")]
                           if isinstance(v, list) else v
                           for k, v in out["blockers"].items()}
    if isinstance(out.get("samples"), dict):  # a wait's time series per GPU: where it began, and the latest points
        samples = {}
        for k, series in out["samples"].items():
            if isinstance(series, list) and len(series) > CAP_SAMPLES:
                more[f"{prefix}samples.{k}"] = len(series) - CAP_SAMPLES
                series = series[:1] + series[1 - CAP_SAMPLES:]
            samples[k] = series
        out["samples"] = samples
    for key in NESTED:
        if isinstance(out.get(key), dict):
            out[key] = summarize(out[key], more, f"{prefix}{key}.")
    return out


def carry(earlier, result: dict, key: str = "gpus_before", details: str = "holder_processes") -> dict:
    """``result`` of a later slice of a wait (the action plugin runs it in slices; only the first takes
    ``gpus_before``) with the ``gpus_before`` of the whole result that the slice before wrote to the detail file
    (``earlier``: what it holds, _host.files.read_json) and their holders' details, so that the file keeps the whole
    wait; as it is when the file has none or could not be read (None)."""
    if not isinstance(earlier, dict) or key in result or not isinstance(earlier.get(key), list):
        return result
    merged = dict(earlier.get(details) or {}) if isinstance(earlier.get(details), dict) else {}
    merged.update(result.get(details) or {})
    return dict(result, **{key: earlier[key], details: merged})


def bound(result: dict, level: str = SUMMARY, path: str = None, warn=None, write=None) -> dict:
    """What a module returns: ``result`` whole (``level`` full) or in summary, with ``detail`` saying which, where
    the whole of it was written (``path``, the detail_file option, by ``write(path, result)``: _host.files.write_json;
    a file that cannot be written is a warning) and what the summary left out."""
    level = FULL if level == FULL else SUMMARY
    written = None
    if write is not None and path and path.startswith("/") and not path.endswith("/"):  # else the option's check failed
        try:
            write(path, result)
            written = path
        except (OSError, TypeError, ValueError) as exc:
            if warn is not None:
                warn(f"detail_file: the whole result could not be written to {path!r} ({exc}); the result is"
                     f" returned in {level}")
    more = {}
    out = result if level == FULL else summarize(result, more)
    out = dict(out)
    msg = out.get("msg")
    if level == SUMMARY and isinstance(msg, str) and len(msg) > MSG:
        # One message, printed whole on a failure's line: its first MSG characters say the first causes.
        kept = MSG - 100  # the marker takes less
        more["msg"] = len(msg) - kept  # characters, not entries
        out["msg"] = msg[:kept] + f" [... {more['msg']} more characters: the whole message with detail: full, or in detail_file]"
    out[DETAIL] = {"level": level, "file": written, "more": more}
    return out
