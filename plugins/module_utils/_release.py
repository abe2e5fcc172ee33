# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The release's decisions that are not about holding: its scope, the units to stop, respawns.

Pure; no I/O, no AnsibleModule (gpu_release runs the commands these functions plan).
"""

from __future__ import annotations


def place_of(proc: dict) -> str:
    ct = (proc.get("container") or {}).get("id")
    return f"CT {ct}" if ct is not None else "the host"


def places(targets: list) -> dict:
    """{place: [pids]}: where the targets live ('CT 129', 'the host')."""
    out = {}
    for t in targets:
        out.setdefault(place_of(t), []).append(t["pid"])
    return {k: sorted(v) for k, v in sorted(out.items())}


def scope_problem(targets: list, filtered: bool, everything: bool) -> str:
    """Why an unscoped release must not proceed ('' when it may).

    With no filter (containers, users, match, pids) a release proceeds only when every target
    lives in one place (one container, or the host), or when ``everything`` (the option ``all``).
    """
    where = places(targets)
    if filtered or everything or len(where) <= 1:
        return ""
    listed = "; ".join(f"{place}: pid {', '.join(map(str, pids))}" for place, pids in where.items())
    return (f"no filter was given and the holders of the selected GPUs live in {len(where)} places ({listed})."
            " Nothing was signalled. Name the scope with containers (e.g. containers: [129]), users, match or"
            " pids, or set all: true to stop every one of them.")


def unit_plan(targets: list, protected: list, keep_units=()) -> list:
    """The systemd service units to stop before signalling: [{unit, container, pids}], in order.

    A unit is stopped when a target runs in it (a ``.service``); never a unit a protected process
    runs in (an NVIDIA daemon), nor one in ``keep_units`` ((container id or None, unit): the
    module's own and its ancestors').
    """
    guarded = {((p.get("container") or {}).get("id"), p.get("unit")) for p in protected if p.get("unit")}
    guarded |= set(keep_units)
    plan = {}
    for t in targets:
        unit = t.get("unit")
        if not unit or not unit.endswith(".service"):
            continue
        key = ((t.get("container") or {}).get("id"), unit)
        if key in guarded:
            continue
        plan.setdefault(key, []).append(t["pid"])
    return [{"unit": unit, "container": ct, "pids": sorted(pids)}
            for (ct, unit), pids in sorted(plan.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1]))]


def unit_command(entry: dict, systemctl: str, pct=None, on_node=True) -> list:
    """The argv that stops one unit: in a container through ``pct exec`` when run on the node."""
    if entry["container"] is not None and on_node:
        if not pct:
            return []
        return [pct, "exec", str(int(entry["container"])), "--", "systemctl", "stop", entry["unit"]]
    return [systemctl, "stop", entry["unit"]]


def unit_text(entry: dict) -> str:
    return entry["unit"] + (f" in CT {entry['container']}" if entry["container"] is not None else "")


def respawn_advice(proc: dict, after_s, supervisor=None, stop_units=True) -> str:
    """'pid 812 started 1.1 s after the release in sglang.service in CT 129: ...what to do'."""
    where = ""
    if proc.get("unit"):
        where = f" in {proc['unit']}"
    ct = (proc.get("container") or {}).get("id")
    if ct is not None:
        where += f" in CT {ct}"
    when = f" started {after_s:.1f} s after the release" if after_s is not None else " appeared after the release"
    who = f" by {supervisor}" if supervisor else ""
    if proc.get("unit"):
        todo = ("its supervisor restarted it; stop the unit (stop_units: true)" if not stop_units else
                "its supervisor restarted it although the unit was stopped; check what starts it")
        todo += " or name it in proxmox_fence_services"
    else:
        todo = "a supervisor outside a systemd unit restarted it; stop that supervisor first"
    return f"pid {proc['pid']}{when}{where}{who}: {todo}"
