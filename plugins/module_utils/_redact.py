# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Note that this module util is **PRIVATE** to the collection. It can have breaking changes at any time.
# Do not use this from other collections or standalone plugins/modules!

"""THE rule for command lines that leave a module: secrets redacted, then cut at MAX_SHOWN characters.

Inference servers are started with ``--api-key sk-...``, ``--hf-token hf_...`` or ``HF_TOKEN=...``;
facts, results, diffs, warnings and the roles' set_stats must never carry those values. Pure:
the caller passes the argv list (``/proc/<pid>/cmdline`` split at NUL) and gets the text to show.

Built-in rules, in order:

1. an argv word that is a secret-looking option (``--api-key``, ``--token``, ``--hf-token``,
   ``--password``, ``--secret*``, and the same names with a prefix such as ``--openai-api-key``
   or ``--db-password``) hides the whole next word, unless that one is an option itself;
2. within every word (a ``bash -c "..."`` word holds a whole command): ``--option=value`` and
   ``--option value`` of those options, ``*_TOKEN=``, ``*_KEY=``, ``*_PASSWORD=``, ``*_SECRET=``
   (and ``TOKEN=`` ...; any case), ``scheme://user:password@``, ``Bearer <token>``, and bare
   ``hf_...``/``sk-...`` tokens (16 characters or more after the prefix);
3. the extra patterns of the ``redact`` option (``_validate.Regex``) on the first
   ``MATCH_CHARS`` characters: the text of each capturing group, or the whole match
   when the pattern has none, becomes MASK.

The raw text is never returned from here except by ``match_text`` (what the ``match``,
``exclude`` and ``protect`` regexes see), which callers keep internal.
"""

from __future__ import annotations

import re

# Regular expressions see at most this much of a command line (_validate's match/exclude/protect, the redact
# patterns here). Defined here, which imports nothing of the collection, so that what needs only the redaction (the
# roles' filters on the controller, in every forked worker) does not import _validate, _holding and _health with it.
MATCH_CHARS = 4096

MASK = "****"
MAX_SHOWN = 1000

_NAME = r"(?:[a-z0-9]+[-_])*(?:api[-_]?key|access[-_]?key|private[-_]?key|secret[-_]?key|token|password|passwd|secret[a-z0-9_-]*)"
_OPTION_WORD = re.compile(r"--" + _NAME, re.IGNORECASE | re.ASCII)
_VALUE = r"(?:\"[^\"]*\"?|'[^']*'?|[^\s\"']+)"
_RULES = [
    # --api-key=VALUE, and --api-key VALUE inside one word (a shell command line)
    re.compile(r"(?<![\w-])(--" + _NAME + r")(=)(" + _VALUE + ")", re.IGNORECASE | re.ASCII),
    re.compile(r"(?<![\w-])(--" + _NAME + r")(\s+)((?!--)" + _VALUE + ")", re.IGNORECASE | re.ASCII),
    # HF_TOKEN=..., OPENAI_API_KEY=..., DB_PASSWORD=..., AWS_SECRET_ACCESS_KEY=...
    re.compile(r"(?<![\w-])((?:[a-z0-9]+_)*(?:token|key|password|passwd|secret))(=)(" + _VALUE + ")",
               re.IGNORECASE | re.ASCII),
    # postgres://user:password@host
    re.compile(r"(://[^\s/:@]+)(:)([^\s/@]+)(?=@)", re.ASCII),
    # Authorization: Bearer <token>
    re.compile(r"(\bBearer)(\s+)([^\s\"']+)", re.IGNORECASE | re.ASCII),
]
_BARE = re.compile(r"(?<![A-Za-z0-9_-])(?:hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,})", re.ASCII)


def is_secret_option(word: str) -> bool:
    """'--api-key', '--hf-token', '--secret-file' yes; '--max-tokens', '--tokenizer', '--api-key=x' no."""
    return bool(_OPTION_WORD.fullmatch(word))


def redact_word(text: str) -> str:
    """The built-in text rules (2. above) on one word or any text."""
    for rule in _RULES:
        text = rule.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
    return _BARE.sub(MASK, text)


def mask_matches(text: str, pattern) -> str:
    """Mask what ``pattern`` (a _validate.Regex or a compiled pattern) matches: each group, or the whole match."""
    spans = []
    for m in pattern.finditer(text):
        groups = [m.span(i) for i in range(1, m.re.groups + 1) if m.span(i)[0] != -1]
        spans.extend((start, end) for start, end in groups or [m.span()] if end > start)
    merged = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    out, pos = [], 0
    for start, end in merged:
        out.extend((text[pos:start], MASK))
        pos = end
    out.append(text[pos:])
    return "".join(out)


def cut(text: str, limit: int = MAX_SHOWN) -> str:
    """At most ``limit`` characters, with a marker that says so."""
    if len(text) <= limit:
        return text
    return text[:limit] + f" [... {len(text) - limit} more characters cut]"


# Characters: no line the controller prints at the default verbosity is longer (DESIGN.md 6b).
LINE = 2000


def line(text) -> str:
    """One printed line: at most LINE characters, a longer one cut (cut's marker saying how much)."""
    text = str(text)
    return text if len(text) <= LINE else cut(text, LINE - 40)


def redact_argv(argv, extra=()) -> str:
    """The command line to show for an argv list: secrets masked (rules 1-3), cut at MAX_SHOWN."""
    words = list(argv or [])
    hide = set()
    for i, word in enumerate(words[:-1]):
        if is_secret_option(word) and not words[i + 1].startswith("--"):
            hide.add(i + 1)
    text = " ".join(MASK if i in hide else redact_word(word) for i, word in enumerate(words))
    if extra:
        head, tail = text[:MATCH_CHARS], text[MATCH_CHARS:]
        for pattern in extra:
            head = mask_matches(head, pattern)
        # What lies beyond MATCH_CHARS is never shown (MAX_SHOWN is smaller): it only counts in the marker.
        text = head + tail
    return cut(text)


def redact_text(text: str, extra=()) -> str:
    """The same rules for a command line that is already one string (split at spaces)."""
    return redact_argv((text or "").split(" "), extra) if text else text


def match_text(argv) -> str:
    """The raw command line that the match/exclude/protect regexes see: its first MATCH_CHARS characters.

    Internal only: never put it in a result.
    """
    return " ".join(argv or [])[:MATCH_CHARS]
