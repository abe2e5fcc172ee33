# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""Time: a monotonic clock, time-limited calls. Pure; no AnsibleModule."""

from __future__ import annotations

import threading
import time

from ansible_collections.gpuops.gpu.plugins.module_utils._errors import QueryTimeout


def call_with_timeout(fn, timeout: float, what: str):
    """Run ``fn()`` with a time limit; raise QueryTimeout naming ``what`` when it is exceeded.

    A driver call that hangs (a wedged GPU, a stuck nvidia-smi) cannot be interrupted from
    Python, so the call runs in a daemon thread: the module can fail and exit while the thread
    is abandoned, and the play goes on.
    """
    if timeout is None or timeout <= 0:
        return fn()
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # pylint: disable=broad-except  # re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"gpuops:{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise QueryTimeout(
            f"{what} did not answer within {timeout:g} s: the driver may be hung (check dmesg for Xid"
            " errors and `nvidia-smi` on the host); raise query_timeout if the host is merely slow.",
            timeout=timeout, call=what)
    if "error" in box:
        raise box["error"]
    return box.get("value")


def clock(total: float, interval: float, now=time.monotonic, sleep=time.sleep):
    """Yield the elapsed seconds at most every ``interval`` s until ``total`` s have passed.

    The first value is 0 (no sleep before the first poll); the last one is yielded at or after
    ``total`` so that a caller always gets one final look.
    """
    start = now()
    yield 0.0
    while True:
        elapsed = now() - start
        if elapsed >= total:
            return
        sleep(min(interval, total - elapsed))
        yield now() - start
