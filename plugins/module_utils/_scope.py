# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""THE scope gate of a release: one function that every signal and every unit stop passes.

A release does not make a list at its start and trust it later: a host keeps moving while it runs.
Every process that a release would signal (a holder of a selected GPU, the root of its workload,
a descendant, a child that appeared during the release) is judged here, at that moment, from:

- its identity (pid + start time: a recycled pid is another process),
- its evidence on the selected GPUs (a context; a device node with no context, which counts only
  when named in ``pids`` or when the GPU's process list cannot be trusted; control nodes, only
  when named),
- its place (host, container, unit) and protection (PID 1, a container's init, kernel threads,
  NVIDIA daemons, the module and its ancestors, ``protect``),
- the user's filters (containers, users, match, pids, exclude),
- MPS: a server is signalled only when every client whose context runs inside it is a target
  (_holding.mps_server_problem), whatever the filters and ``pids`` say; the control daemon never,
- and its relation to what is already in the scope (a root joins only when every GPU holder below
  it is a target; a descendant only below a target; a process that appeared during the release only
  when it descends from a target that was signalled, or was orphaned by one).

The gate keeps one verdict per identity: a process is a target or skipped (with its reason), never
both, and nothing outside the gate can add a target. Pure: no I/O (the caller reads /proc).
"""

from __future__ import annotations

from ansible_collections.gpuops.gpu.plugins.module_utils import _holding
from ansible_collections.gpuops.gpu.plugins.module_utils._snapshot import daemon_impostor, is_protected

CONTEXT, DEVICE, CONTROL = _holding.CONTEXT, _holding.DEVICE, _holding.CONTROL  # the evidence kinds, declared once in _holding

HOLDER = "holder"            # holds a selected GPU
ROOT = "root"                # an ancestor of holders, the root of their workload
DESCENDANT = "descendant"    # below a target (tree)
NEWCOMER = "newcomer"        # appeared during the release below (or orphaned by) a signalled target


def identity(proc: dict) -> tuple:
    return (proc["pid"], proc.get("start_time"))


def container_id(proc: dict):
    return (proc.get("container") or {}).get("id")


def mps_of(gpus: list) -> dict:
    """{identity: mps_server entry} of the MPS servers of a snapshot's GPUs (_snapshot.build marks them)."""
    return {identity(p): p["mps_server"] for g in gpus for p in g.get("processes") or [] if p.get("mps_server")}


def own_uid(proc: dict):
    """The uid of a process where it lives: inside its container (through the container's idmap), else the node's."""
    ct = proc.get("container") or {}
    if ct.get("id") is not None:
        return ct.get("uid_in_container", proc.get("uid"))
    return proc.get("uid")


def user_selected(proc: dict, users) -> bool:
    """Whether ``users`` (names or uids) names the process's user, as its own place names it: for a process in a
    container its name in the container's /etc/passwd and its uid in the container (1000, not node uid 101000);
    a node user of the same name or uid is another user."""
    uid = own_uid(proc)
    return proc.get("user") in users or (uid is not None and str(uid) in users)


def user_text(proc: dict) -> str:
    ct = proc.get("container") or {}
    if ct.get("id") is None:
        return str(proc.get("user"))
    return f"{proc.get('user')} (uid {own_uid(proc)} in CT {ct['id']}, node uid {proc.get('uid')})"


def match_miss(match, texts) -> str:
    """Why ``match`` missed a holder, with what it saw (a process that renamed itself - vLLM's ``VLLM::EngineCore``,
    ``VLLM::Worker_TP0``, through setproctitle - shows only its new title), and when only the case differs, that."""
    seen = "; ".join(repr(t) for t in texts) or "nothing"
    folded = [t for t in texts if getattr(match, "search_any_case", None) and match.search_any_case(t)]
    why = f"neither its command line, executable nor unit matches {match.pattern!r} (it saw {seen})"
    if folded:
        why += (f": {folded[0]!r} matches it only ignoring case - match is case-sensitive; (?i){match.pattern} matches"
                " both")
    return why


class Scope:
    """The gate. ``judge`` decides, ``admit``/``refuse`` record, ``targets``/``skipped`` report.

    ``selected``: the GPU indexes the release is about. ``filters``: {containers, users, match,
    pids, exclude} (regexes with ``search``, as _validate gives them). ``protected_pids``: {pid:
    reason} (the module and its ancestors). ``protect``: the protect patterns. ``text_of(proc)``:
    the raw command line the regexes see; ``exe_of(pid)``: the executable. ``untrusted``: {GPU index:
    why its process list cannot be trusted to be complete}. ``verify``: {pid: reason} for driver
    pids that could not be verified to be the process the driver means (never targets). ``mps``:
    {identity: the ``mps_server`` entry of an MPS server} of the snapshot (mps_of), for the processes
    judged from /proc rather than from a GPU's list.
    """

    def __init__(self, selected, filters=None, protected_pids=None, protect=(), text_of=None, exe_of=None,
                 untrusted=None, unverified=None, mps=None):
        self.selected = set(selected)
        self.filters = dict(filters or {})
        self.named = set(self.filters.get("pids") or ())
        self.protected_pids = dict(protected_pids or {})
        self.protect = protect
        self.text_of = text_of
        self.exe_of = exe_of
        self.untrusted = dict(untrusted or {})
        self.unverified = dict(unverified or {})
        self.mps = dict(mps or {})
        self._targets = {}      # identity -> entry
        self._skipped = {}      # identity -> entry (with reason)
        self._protected = {}    # identity -> entry (with reason)

    # --- the decision --------------------------------------------------------------------------
    def text(self, proc: dict) -> str:
        return (self.text_of(proc) if self.text_of else proc.get("cmdline")) or proc.get("name") or ""

    def protection(self, proc: dict) -> str:
        """Why a process must never be signalled, whatever the filters ('' when it may be)."""
        if proc["pid"] in self.protected_pids:
            return self.protected_pids[proc["pid"]]
        ct = proc.get("container") or {}
        if ct.get("id") is not None and ct.get("pid_in_container") == 1:
            return f"the init (PID 1) of CT {ct['id']}"
        check = dict(proc, cmdline=self.text(proc))
        return is_protected(check, self.protect, context=proc.get("evidence") == CONTEXT, exe_of=self.exe_of)

    def _outside_place(self, proc: dict) -> str:
        containers, users = self.filters.get("containers"), self.filters.get("users")
        ct = container_id(proc)
        if containers:
            if ct is None:
                return "not in a container (containers: " + ", ".join(map(str, containers)) + ")"
            if ct not in containers:
                return f"in CT {ct}, not in containers " + ", ".join(map(str, containers))
        if users and not user_selected(proc, users):
            return f"user {user_text(proc)} is not in users"
        exclude = self.filters.get("exclude")
        if exclude is not None and exclude.search(self.text(proc)):
            return f"command line matches exclude {exclude.pattern!r}"
        return ""

    def match_texts(self, proc: dict, root=None) -> list:
        """What ``match`` sees of a holder: its command line, executable and unit, and its workload root's."""
        texts = []
        for x in (proc, root):
            if x is not None:
                exe = x.get("exe") or (self.exe_of(x["pid"]) if self.exe_of else None)
                texts += [self.text(x), exe or "", x.get("unit") or ""]
        return [t for t in texts if t]

    def _holder_problem(self, proc: dict, root=None) -> str:
        gpus = set(proc.get("gpus") or ()) & self.selected
        if not gpus:
            return "holds none of the selected GPUs"
        evidence = proc.get("evidence")
        pid = proc["pid"]
        if pid in self.unverified:
            return self.unverified[pid]
        if evidence == DEVICE and pid not in self.named:
            untrusted = sorted(g for g in gpus if g in self.untrusted)
            if not untrusted:
                return ("holds the device node of GPU " + ", ".join(map(str, sorted(gpus)))
                        + " with no context there (as every CUDA process does for the GPUs it can see): it holds no"
                          " GPU memory and does not keep the next server from starting; lingering, not signalled."
                          " Name it in pids to stop it")
        if evidence == CONTROL and pid not in self.named:
            return "holds only the NVIDIA control nodes; name it in pids to stop it"
        match = self.filters.get("match")
        if match is not None and not match.search(self.text(proc)) and not any(
                match.search(t) for t in self.match_texts(proc, root)):
            return match_miss(match, self.match_texts(proc, root))
        if self.named and pid not in self.named:
            return "pid not in pids"
        return ""

    def judge(self, proc: dict, role: str, via=None, holders_below=(), root=None) -> str:
        """Why ``proc`` is outside the scope in ``role`` ('' when it is inside). Records nothing.

        ``via``: the target it relates to (the holder a root is above, the target a descendant or
        newcomer is below). ``holders_below``: identities of every GPU holder below a root.
        """
        reason = self.protection(proc)
        if reason:
            return "protected: " + reason
        reason = self._outside_place(proc)
        if reason:
            return reason
        server = proc.get("mps_server") or self.mps.get(identity(proc))
        if server:
            reason = _holding.mps_server_problem(server, self.selected, lambda key: key in self._targets)
            if reason:
                return reason
        if role == HOLDER:
            return self._holder_problem(proc, root)
        if via is None or identity(via) not in self._targets:
            return "related to no target"
        elsewhere = set(proc.get("context_gpus") or ()) - self.selected
        if elsewhere and not set(proc.get("context_gpus") or ()) & self.selected:
            return ("has a context on GPU " + ", ".join(map(str, sorted(elsewhere)))
                    + " only, which is not selected: another job")
        if role == ROOT:
            outside = [h for h in holders_below if h not in self._targets]
            if outside:
                return ("an ancestor of the targets that also runs other GPU jobs (pid "
                        + ", ".join(str(p) for p, _st in sorted(outside)) + ", not in the scope): left running,"
                        " and only the targets below it are signalled")
            return ""
        if role in (DESCENDANT, NEWCOMER):
            return ""
        return f"unknown role {role}"

    # --- the record ------------------------------------------------------------------------------
    def admit(self, proc: dict, role: str, via=None, holders_below=(), root=None, why=None) -> bool:
        """Judge and record. True when ``proc`` is (now) a target."""
        key = identity(proc)
        if key in self._targets:
            return True
        reason = self.judge(proc, role, via, holders_below, root)
        if reason:
            self.refuse(proc, reason)
            return False
        entry = dict(proc)
        entry.pop("reason", None)
        if via is not None:
            entry["via"] = via["pid"]
            entry.setdefault("gpus", list(via.get("gpus") or []))
        if why:
            entry["why"] = why
        elif proc.get("evidence") == CONTEXT:
            impostor = daemon_impostor(proc, self.exe_of)
            if impostor:
                entry["why"] = impostor
        self._skipped.pop(key, None)
        self._targets[key] = entry
        return True

    def refuse(self, proc: dict, reason: str) -> None:
        key = identity(proc)
        if key in self._targets:
            return
        bucket = self._protected if reason.startswith("protected: ") else self._skipped
        text = reason[len("protected: "):] if bucket is self._protected else reason
        if key not in self._protected and key not in self._skipped:
            bucket[key] = dict(proc, reason=text, gpus=list(proc.get("gpus") or []))

    def still_in(self, proc: dict, now: dict) -> str:
        """At the signal: why a target may no longer be signalled ('' when it may).

        ``now``: the process as read this moment (None: gone). Its identity, place and protection
        must be what they were when it was admitted.
        """
        if now is None:
            return "gone"
        if now.get("start_time") != proc.get("start_time"):
            return "the pid now belongs to another process (recycled)"
        if container_id(now) != container_id(proc):
            return "it moved to another container"
        reason = self.protection(dict(now, evidence=proc.get("evidence")))
        if reason:
            return "protected: " + reason
        return ""

    def entry(self, proc: dict):
        """The recorded target entry of ``proc`` (None when it is not a target)."""
        return self._targets.get(identity(proc))

    def is_target(self, proc: dict) -> bool:
        return identity(proc) in self._targets

    @property
    def targets(self) -> list:
        return sorted(self._targets.values(), key=lambda p: p["pid"])

    @property
    def skipped(self) -> list:
        return sorted(self._skipped.values(), key=lambda p: p["pid"])

    @property
    def protected(self) -> list:
        return sorted(self._protected.values(), key=lambda p: p["pid"])
