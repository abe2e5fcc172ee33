# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""THE gpus option, in one place: ``parse`` reads it once (before anything runs) into a Selection, and every part
- the facts, the release, the wait, the fence - takes that value: ``resolve`` says which GPUs it names whole, which
only through which MIG devices, and what it names that the host does not have; ``pick`` gives the GPUs.

The forms of a GPU id (the option's, and the toolkit's NVIDIA_VISIBLE_DEVICES through ``match``): an index
(``1``, ``01``), a GPU UUID (``GPU-...``), a MIG UUID (``MIG-...``: its GPU, as far as that MIG device goes) and a
PCI bus id in any of its forms (``00000000:3B:00.0``, ``0000:3b:00.0``, ``3b:00.0``), in any case. A GPU named
whole (index, UUID, bus id) means all of its MIG devices, also beside one of its MIG UUIDs.
"""

from __future__ import annotations

import re

from ansible_collections.gpuops.gpu.plugins.module_utils._errors import InvalidOption, SelectionError

MAX_GPU_INDEX = 4095
INDEX, UUID, MIG, BUS = "index", "uuid", "mig", "bus"
_FORMS = ((INDEX, re.compile(r"[0-9]{1,4}", re.ASCII)), (UUID, re.compile(r"GPU-[0-9a-f-]{1,80}", re.ASCII | re.I)),
          (MIG, re.compile(r"MIG-[0-9a-f-]{1,80}", re.ASCII | re.I)),
          (BUS, re.compile(r"(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", re.ASCII)))


def selector(text):
    """(kind, key) of one GPU id, or None: the index as an int, a UUID in lower case, a bus id as the driver writes
    it (``00000000:3B:00.0``)."""
    text = str(text).strip()
    for kind, form in _FORMS:
        m = form.fullmatch(text)
        if m and kind == INDEX:
            return kind, int(text)
        if m and kind == BUS:
            return kind, f"{int(m.group(1) or '0', 16):08X}:{m.group(2).upper()}:{m.group(3).upper()}.{m.group(4)}"
        if m:
            return kind, text.lower()
    return None


def match(kind, key, gpus, prefix=False) -> list:
    """[(GPU, the MIG device named or None)] of ``gpus`` that the id (``selector``'s kind and key) names; ``prefix``:
    a GPU UUID may be a prefix of the GPU's (as the toolkit allows)."""
    out = []
    for gpu in gpus:
        uuid = (gpu.get("uuid") or "").lower()
        if kind == MIG:
            out += [(gpu, d) for d in gpu.get("mig_devices") or [] if (d.get("uuid") or "").lower() == key]
        elif kind == INDEX:
            out += [(gpu, None)] if gpu["index"] == key else []
        elif kind == BUS:
            out += [(gpu, None)] if (selector(gpu.get("pci_bus_id") or "") or (BUS, None))[1] == key else []
        elif uuid == key or (prefix and uuid.startswith(key)):
            out.append((gpu, None))
    return out


class Selection:
    """The gpus option, parsed: ``named`` [(the text given, kind, key)]. Empty: every GPU."""

    def __init__(self, named=()):
        self.named = tuple(named)

    def __bool__(self):
        return bool(self.named)

    def indexes(self):
        """The GPU indexes named when the option names GPUs by index only (what nvidia-smi's --id may ask), else None."""
        if self.named and all(kind == INDEX for _t, kind, _k in self.named):
            return sorted({key for _t, _kind, key in self.named})
        return None

    def resolve(self, gpus) -> tuple:
        """(GPU indexes named whole, {GPU index: its MIG UUIDs named, lower case} of the GPUs named only through MIG
        devices, the texts that name nothing on this host). Empty: every GPU whole."""
        if not self.named:
            return {g["index"] for g in gpus}, {}, []
        whole, mig, missing = set(), {}, []
        for text, kind, key in self.named:
            found = match(kind, key, gpus)
            if not found:
                missing.append(text)
            for gpu, dev in found:
                if dev is None:
                    whole.add(gpu["index"])
                else:
                    mig.setdefault(gpu["index"], set()).add(dev["uuid"].lower())
        return whole, {i: uuids for i, uuids in mig.items() if i not in whole}, missing

    def pick(self, gpus) -> list:
        """The GPUs named, in index order; SelectionError naming what the host has when an id names nothing."""
        whole, mig, missing = self.resolve(gpus)
        if missing:
            existing = ", ".join(f"{g['index']} ({g.get('uuid')}, {g.get('pci_bus_id')}"
                                 + "".join(f", {d['uuid']}" for d in g.get("mig_devices") or []) + ")" for g in gpus)
            raise SelectionError(f"gpus: no GPU matches {missing[0]!r} on this host; it has: {existing or 'none'}",
                                 selector=missing[0], available=[g["index"] for g in gpus])
        return sorted((g for g in gpus if g["index"] in whole or g["index"] in mig), key=lambda g: g["index"])


def parse(values) -> Selection:
    """The gpus option (a list of ids) as a Selection; InvalidOption naming ``gpus`` and the id when one is none of the
    forms, or not in ASCII."""
    named = []
    for value in values or []:
        text = str(value).strip()
        found = selector(text) if text.isascii() else None
        if found is None:
            raise InvalidOption(f"gpus: {value!r} is neither a GPU index (0 to {MAX_GPU_INDEX}), a UUID (GPU-... or"
                                " MIG-...) nor a PCI bus id (00000000:3B:00.0), in ASCII", option="gpus",
                                selector=str(value))
        if found[0] == INDEX and found[1] > MAX_GPU_INDEX:
            raise InvalidOption(f"gpus: {value!r} is not a GPU index (0 to {MAX_GPU_INDEX})", option="gpus",
                                selector=str(value))
        named.append((text,) + found)
    return Selection(named)


def of_indexes(indexes) -> Selection:
    """The Selection of these GPU indexes (what a fence selects of its containers' GPUs)."""
    return Selection((str(i), INDEX, int(i)) for i in indexes)
