# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""Bad input fails before anything is read or signalled, with a message that names the option.

THE bounds of every option of the three modules (and of the action plugin's own arithmetic) live
here, once: numbers are finite and bounded, integers sane, strings that stand for numbers are
ASCII (``str.isdigit()`` is true for '²'), regular expressions are compiled, screened for nested
quantifiers and run under a time budget on at most MATCH_CHARS characters of a command line.
Pure: no AnsibleModule, no I/O; errors are _errors.InvalidOption (also a ValueError) and
_errors.RegexTooSlow.
"""

from __future__ import annotations

import math
import re
import signal

from ansible_collections.gpuops.gpu.plugins.module_utils._errors import InvalidOption, RegexTooSlow
from ansible_collections.gpuops.gpu.plugins.module_utils._host.calls import Interrupted, call_interrupted
# Regular expressions see at most MATCH_CHARS characters of a command line (one constant, kept in _redact).
from ansible_collections.gpuops.gpu.plugins.module_utils._redact import MATCH_CHARS

try:  # Python 3.11+; sre_parse is deprecated there
    from re import _constants as _sre
    from re import _parser as _sre_parse
except ImportError:  # Python 3.9, 3.10
    import sre_constants as _sre
    import sre_parse as _sre_parse

DAY = 86400.0
MIN_SLEEP = 0.05
MAX_QUERY_TIMEOUT = 300.0
MAX_GPUS = 1024
MAX_PID = 4194304  # PID_MAX_LIMIT of 64-bit Linux (2**22)
MAX_MEMORY_MIB = 16 * 1024 * 1024  # 16 TiB
PVE_VMID_MIN = 100
PVE_VMID_MAX = 999999999
MAX_PATTERN_CHARS = 1000
# One search may take this long, all the searches of one option in one module run this long together.
SEARCH_BUDGET_S = 0.5
OPTION_BUDGET_S = 2.0

_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def _fail(option: str, msg: str, **details):
    raise InvalidOption(msg, option=option, **details)


def is_ascii_digits(text: str) -> bool:
    """'12' yes; '²', '١٢', '', '-1', '1.0' no."""
    return text.isascii() and text.isdigit()


def number(option: str, value, low: float = 0.0, high: float = DAY, above_low: bool = False, unit: str = " s") -> float:
    """A finite float in [low, high] (or (low, high] with ``above_low``); else InvalidOption naming ``option``.

    Accepts ints, floats and ASCII number strings (the action plugin sees the task's raw args).
    """
    if isinstance(value, bool) or value is None:
        _fail(option, f"{option} must be a number, got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if not _NUMBER.fullmatch(text):
            _fail(option, f"{option} must be a number (ASCII digits), got {value!r}")
        value = text
    try:
        result = float(value)
    except OverflowError:
        _fail(option, f"{option} is too large (at most {high:g}{unit})")
    except (TypeError, ValueError):
        _fail(option, f"{option} must be a number, got {value!r}")
    if not math.isfinite(result):
        _fail(option, f"{option} must be a finite number, got {result}")
    if above_low and result <= low:
        _fail(option, f"{option} must be > {low:g}, got {result:g}")
    if result < low:
        _fail(option, f"{option} must be >= {low:g}, got {result:g}")
    if result > high:
        _fail(option, f"{option} must be at most {high:g}{unit}, got {result:g}")
    return result


def integer(option: str, value, low: int, high: int) -> int:
    """An int in [low, high]; ASCII digit strings are accepted; else InvalidOption naming ``option``."""
    if isinstance(value, str) and is_ascii_digits(value.strip()) and len(value.strip()) <= 18:
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(option, f"{option} must be an integer, got {value!r}")
    if not low <= value <= high:
        shown = value if abs(value) < 10 ** 18 else "a number with more than 18 digits"
        _fail(option, f"{option} must be between {low} and {high}, got {shown}")
    return value


def signal_number(value) -> int:
    """'SIGTERM', 'TERM', 'sigint', 15 or '15' -> the number; ValueError naming the value otherwise."""
    text = str(value).strip()
    if text.isdigit() and not (text.isascii() and len(text) <= 3):
        raise InvalidOption(f"signal: {value!r} is not a valid signal number", option="signal")
    if text.isdigit():
        num = int(text)
        valid = {int(s) for s in signal.valid_signals()}
        if num not in valid or num == 0:
            raise InvalidOption(f"signal: {value!r} is not a valid signal number", option="signal")
        return num
    name = text.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    sig = getattr(signal.Signals, name, None) if name in signal.Signals.__members__ else None
    if sig is None:
        raise InvalidOption(f"signal: {value!r} is not a signal name (like SIGTERM, SIGINT, SIGKILL)", option="signal")
    return int(sig)


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def items(values) -> list:
    """A list (or one value) whose strings may hold comma-separated items ("129,130"): the items, stripped."""
    if values is None:
        return []
    if not isinstance(values, (list, tuple)):
        values = [values]
    out = []
    for value in values:
        if isinstance(value, str) and "," in value:
            out.extend(part.strip() for part in value.split(","))
        else:
            out.append(value)
    return out


def unique(values) -> list:
    """The values in the order given, each once."""
    seen = set()
    return [v for v in values if not (v in seen or seen.add(v))]


def vmids(values) -> list:
    """Proxmox VE container ids, the one form of every module's ``containers``: ints, ASCII digit strings or
    comma-separated strings ("129,130"), each PVE_VMID_MIN..PVE_VMID_MAX (PVE's own bounds); unique, in the order
    given. InvalidOption (a ValueError) naming ``containers`` and the bad value."""
    out = []
    for v in items(values):
        text = str(v).strip() if not isinstance(v, bool) else ""
        if not is_ascii_digits(text) or len(text) > 9 or not PVE_VMID_MIN <= int(text) <= PVE_VMID_MAX:
            _fail("containers", f"containers: {v!r} is not a Proxmox VE container id (an integer"
                                f" {PVE_VMID_MIN}..{PVE_VMID_MAX})")
        out.append(int(text))
    return unique(out)


def path(option: str, value, absolute: bool = False) -> str:
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        _fail(option, f"{option}: {value!r} is not a path")
    if absolute and not value.startswith("/"):
        _fail(option, f"{option}: {value!r} must be an absolute path or glob (like /dev/nvidia*)")
    return value


# --- regular expressions -------------------------------------------------------------------

_REPEATS = {_sre.MAX_REPEAT, _sre.MIN_REPEAT}


def _children(op, av):
    """The sub-patterns of one parsed node."""
    if op in _REPEATS or op is getattr(_sre, "POSSESSIVE_REPEAT", None):
        return [av[2]]
    if op is _sre.SUBPATTERN:
        return [av[-1]]
    if op is _sre.BRANCH:
        return list(av[1])
    if op in (_sre.ASSERT, _sre.ASSERT_NOT):
        return [av[1]]
    if op is _sre.GROUPREF_EXISTS:
        return [p for p in av[1:] if p is not None]
    if op is getattr(_sre, "ATOMIC_GROUP", None):
        return [av]
    return []


def _ambiguous(parsed) -> bool:
    """Whether a sub-pattern can match one text in more than one way: a variable repeat or an alternation."""
    for op, av in parsed:
        if op in _REPEATS and av[0] != av[1]:
            return True
        if op is _sre.BRANCH:
            return True
        if any(_ambiguous(child) for child in _children(op, av)):
            return True
    return False


def nested_quantifier(parsed) -> bool:
    """Whether a parsed pattern repeats (+, *, {n,m} with m > 1) something ambiguous: (a+)+, (a*)*, (a|aa)+.

    Such a pattern backtracks exponentially on a text that almost matches. A possessive repeat
    (Python 3.11+) does not backtrack and is not counted.
    """
    for op, av in parsed:
        if op in _REPEATS and av[1] > 1 and _ambiguous(av[2]):
            return True
        if any(nested_quantifier(child) for child in _children(op, av)):
            return True
    return False


class Regex:
    """A validated regular expression of an option, searched under a time budget.

    Has ``pattern`` and ``search(text)`` as a compiled pattern has (so the policy can use either);
    ``finditer(text)`` returns a list. Each call sees at most MATCH_CHARS characters of the text.
    A search slower than SEARCH_BUDGET_S, or all the searches of this option together slower than
    OPTION_BUDGET_S, raises RegexTooSlow naming the option.
    """

    def __init__(self, option: str, pattern: str, compiled):
        self.option = option
        self.pattern = pattern
        self._re = compiled
        self.spent = 0.0

    def _run(self, fn, text):
        try:
            value, took = call_interrupted(fn, (text or "")[:MATCH_CHARS], SEARCH_BUDGET_S)
        except Interrupted:
            took = None
        if took is not None:
            self.spent += took
        if took is None or took > SEARCH_BUDGET_S:
            raise RegexTooSlow(
                f"{self.option}: {self.pattern!r} took more than {SEARCH_BUDGET_S:g} s on one command line: it"
                " backtracks too much (adjacent or nested unbounded repeats like .*.* or (a+)+); simplify it",
                option=self.option, pattern=self.pattern)
        if self.spent > OPTION_BUDGET_S:
            raise RegexTooSlow(
                f"{self.option}: {self.pattern!r} took {self.spent:.1f} s in all on this host's command lines, more"
                f" than {OPTION_BUDGET_S:g} s: simplify it", option=self.option, pattern=self.pattern)
        return value

    def search(self, text):
        return self._run(self._re.search, text)

    def search_any_case(self, text):
        """search, ignoring case: what tells a user why a text was missed (``VLLM::EngineCore`` and ``vllm``)."""
        return self._run(re.compile(self.pattern, self._re.flags | re.IGNORECASE).search, text)

    def finditer(self, text) -> list:
        return self._run(lambda t: list(self._re.finditer(t)), text)


def regex(option: str, pattern):
    """A Regex for an option's pattern (None stays None), or InvalidOption naming the option."""
    if pattern is None:
        return None
    if not isinstance(pattern, str) or not pattern:
        _fail(option, f"{option}: {pattern!r} is not a regular expression (an empty one would match everything)")
    if len(pattern) > MAX_PATTERN_CHARS:
        _fail(option, f"{option}: a regular expression of {len(pattern)} characters, more than {MAX_PATTERN_CHARS}")
    try:
        compiled = re.compile(pattern)
        parsed = _sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError, ValueError) as exc:
        _fail(option, f"{option}: {pattern!r} is not a valid regular expression: {exc}")
    if nested_quantifier(parsed):
        _fail(option, f"{option}: {pattern!r} repeats a group that itself repeats or alternates (like (a+)+, (a*)* or"
                      " (a|aa)+): it can take exponential time on a command line; rewrite it without the outer repeat")
    return Regex(option, pattern, compiled)


def regexes(option: str, patterns) -> list:
    return [regex(option, p) for p in patterns or []]


# --- the options of each module -------------------------------------------------------------

def _device_pattern_problem(pattern):
    # Imported when a module checks its options, not with this file: the controller's plugins that need only the
    # number checks (the gpu_wait_idle and predeploy_host action plugins, in every forked worker) do not
    # import _holding and _health. A module's payload still carries them (the AnsiballZ finder reads every import).
    # pylint: disable-next=import-outside-toplevel
    from ansible_collections.gpuops.gpu.plugins.module_utils._holding import device_pattern_problem

    return device_pattern_problem(pattern)


def snapshot(params: dict):
    """The options of the doc fragment gpuops.gpu.gpu (and .idle where present); returns the gpus option parsed
    (_selection.Selection: the one value every part takes)."""
    # Imported here, as _device_pattern_problem's: the controller's plugins that check numbers only do not load it.
    # pylint: disable-next=import-outside-toplevel
    from ansible_collections.gpuops.gpu.plugins.module_utils import _selection

    selection = _selection.parse(params.get("gpus"))
    number("query_timeout", params["query_timeout"], low=0.0, high=MAX_QUERY_TIMEOUT, above_low=True)
    path("nvidia_smi_path", params["nvidia_smi_path"])
    for pattern in params["device_files"]:
        path("device_files", pattern, absolute=True)
        problem = _device_pattern_problem(pattern)
        if problem and not params.get("allow_any_device_files"):
            _fail("device_files", f"device_files: {pattern!r} {problem}: a pattern that matches other files would make"
                                  " every process that holds them a GPU holder (and a release target). Name the NVIDIA"
                                  " device nodes, or set allow_any_device_files: true if you really mean it.")
    regexes("protect", params["protect"])
    regexes("redact", params.get("redact"))
    if params.get("detail_file") is not None:
        where = path("detail_file", params["detail_file"])
        if not where.startswith("/") or where.endswith("/"):
            _fail("detail_file", f"detail_file: {where!r} must be the absolute path of a file (like /root/gpu_release.json)")
    idle(params)
    return selection


def idle(params: dict) -> None:
    """The options of the doc fragment gpuops.gpu.gpu.idle (what idle means)."""
    if params.get("max_memory_used_mib") is not None:
        integer("max_memory_used_mib", params["max_memory_used_mib"], 0, MAX_MEMORY_MIB)
    if params.get("max_utilization_pct") is not None:
        integer("max_utilization_pct", params["max_utilization_pct"], 0, 100)
    if params.get("min_free_mib") is not None:
        integer("min_free_mib", params["min_free_mib"], 0, MAX_MEMORY_MIB)
    if params.get("min_free_pct") is not None:
        number("min_free_pct", params["min_free_pct"], 0.0, 100.0, unit=" %")
    if params.get("kernel_log") is not None:
        path("kernel_log", params["kernel_log"], absolute=True)


def device_pattern_warnings(params: dict) -> list:
    """The warnings for device_files patterns accepted only because of allow_any_device_files."""
    return [f"device_files: {pattern!r} {_device_pattern_problem(pattern)}; accepted because allow_any_device_files is"
            " true: every process that holds a matching file counts as a GPU holder"
            for pattern in params["device_files"] if _device_pattern_problem(pattern)]


def expected_count(params: dict) -> None:
    if params.get("expected_count") is not None:
        integer("expected_count", params["expected_count"], 0, MAX_GPUS)


def release(params: dict, gpus) -> dict:
    """gpu_release's own options; returns the filters: ``gpus`` (the Selection that ``snapshot`` returned), containers,
    users, match, pids, exclude - the one validated value of each that the release takes."""
    expected_count(params)
    for name in ("grace_period", "kill_timeout", "lock_timeout"):
        number(name, params[name])
    for pid in params.get("pids") or []:
        integer("pids", pid, 1, MAX_PID)
    return dict(
        gpus=gpus,
        containers=vmids(params.get("containers")),
        users=params.get("users"),
        match=regex("match", params.get("match")),
        pids=set(params.get("pids") or []),
        exclude=regex("exclude", params.get("exclude")),
    )


def wait(params: dict) -> None:
    """gpu_wait_idle's own options."""
    timeout = number("timeout", params["timeout"])
    number("delay", params["delay"])
    number("sleep", params["sleep"], low=MIN_SLEEP)
    settle = number("settle", params["settle"])
    if settle > timeout:
        _fail("settle", f"settle ({settle:g} s) must not be above timeout ({timeout:g} s)")
    expected_count(params)
    quiet = params.get("quiet_since")
    if quiet:
        number("quiet_since.clock", quiet["clock"], high=float("inf"))
        for holder in quiet.get("device_holders") or ():
            if not (isinstance(holder, (list, tuple)) and len(holder) == 2 and all(
                    (x is None and i) or (isinstance(x, int) and not isinstance(x, bool)) for i, x in enumerate(holder))):
                _fail("quiet_since", f"quiet_since.device_holders: {holder!r} is not [pid, start time] (integers); pass"
                                     " the quiet_since of a gpu_release result as it is")
    if params.get("blocker_grace") is not None:
        number("blocker_grace", params["blocker_grace"])
    for holder in params.get("left_holders") or ():
        integer("left_holders.pid", holder.get("pid"), 1, MAX_PID)
    if params.get("leak_after") is not None:
        number("leak_after", params["leak_after"], above_low=True)
    if params.get("progress_slice") is not None:
        number("progress_slice", params["progress_slice"], above_low=True)
    state = params.get("progress_state")
    if state is not None:
        wait_state = state.get("wait")
        # The shape _wait.new_state() writes: a state of another shape was not written by this module.
        shape = {"polls": int, "full_scans": int, "samples": dict, "known_holders": dict}
        if not isinstance(wait_state, dict) or any(
                not isinstance(wait_state.get(k), t) or isinstance(wait_state.get(k), bool) is not (t is bool)
                for k, t in shape.items()) or any(
                wait_state.get(k) is not None and (isinstance(wait_state.get(k), bool)
                                                   or not isinstance(wait_state.get(k), (int, float)))
                for k in ("last_holder_at", "last_full_scan_at")):
            _fail("progress_state", "progress_state: not a wait state (it is set by the action plugin only)")
        number("progress_state", state.get("offset", 0.0), high=3 * DAY)
