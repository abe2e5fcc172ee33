# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""The kernel log, read: /dev/kmsg, a file, or dmesg (its Xid events are judged in _health)."""

from __future__ import annotations

import errno
import os


def _read_kmsg(path: str) -> str:
    """Every record /dev/kmsg holds now (non-blocking: one record per read, EAGAIN at the end)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks = []
    try:
        while True:
            try:
                data = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record was overwritten while reading: go on with the next
                    continue
                raise
            if not data:
                break
            chunks.append(data.decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return "".join(chunks)


KMSG = "/dev/kmsg"


def read_kernel_log(path=None, run=None) -> dict:
    """The kernel log's text, and where it came from: {text, source, problem}.

    ``path``: a file to read (a saved log, a simulator's), else /dev/kmsg, then ``run(['dmesg'])``
    (-> rc, out, err) when /dev/kmsg cannot be read. ``text`` is None and ``problem`` says why
    when nothing could be read (not root on the node, a container without the host's log)."""
    if path and path != KMSG:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return {"text": f.read(), "source": path, "problem": None}
        except OSError as exc:
            return {"text": None, "source": path, "problem": f"{path}: {exc.strerror or exc}"}
    problems = []
    try:
        return {"text": _read_kmsg(KMSG), "source": KMSG, "problem": None}
    except OSError as exc:
        problems.append(f"{KMSG}: {exc.strerror or exc}")
    if run is not None:
        rc, out, err = run(["dmesg"])
        if rc == 0:
            return {"text": out, "source": "dmesg", "problem": None}
        problems.append(f"dmesg: exit {rc}: {' '.join((err or out).split())[:200]}")
    return {"text": None, "source": None, "problem": "; ".join(problems)}
