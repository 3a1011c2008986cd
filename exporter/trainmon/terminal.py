"""Text from outside made safe for a terminal: one rule for everything the commands print.

A daemon's answer, a ledger row or a process name is written by whoever sent it:
a job name may carry escape sequences that retitle the terminal, move the
cursor, rewrite earlier lines or, on some terminals, answer back with input.
Everything ``doctor``, ``runs`` and ``compare`` print that came from a daemon,
a ledger or ``/proc`` goes through this module before it reaches a terminal:

- ``clean``: whole escape sequences (CSI ``ESC [``/``0x9b``; OSC, DCS, SOS, PM and
  APC up to their terminator or the end of the line; any other ``ESC x``)
  removed; then every other C0 control but newline and tab, DEL, every C1
  control (``0x80``-``0x9f``) and the bidirectional overrides and isolates
  (``U+202A``-``U+202E``, ``U+2066``-``U+2069``: text shown in another order
  than it reads) removed; a lone surrogate becomes ``U+FFFD`` (it cannot be
  encoded, and writing it would fail);
- ``one_line``: ``clean``, and newlines and tabs as spaces, for a value shown
  inside a line (a table cell, a sentence) so that it cannot start a line of
  its own;
- ``escape_json``: JSON text (``json.dumps(..., ensure_ascii=False)``, whose C0
  controls are already ``\\uXXXX``) with DEL, C1 controls, bidirectional
  controls and lone surrogates written as ``\\uXXXX`` too: the same document,
  nothing a terminal acts on.

``duration_text`` is the one way the commands write a duration (``1m35s``).
"""

from __future__ import annotations

import re

#: A whole escape sequence: CSI (7- and 8-bit) with its parameters; a string
#: sequence (OSC, DCS, SOS, PM, APC) up to BEL/ST or the end of the line, as a
#: terminal would swallow it; any other two-character escape.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)
#: What remains to remove: C0 but tab and newline, DEL, C1, bidirectional controls.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile("[\ud800-\udfff]")
#: Characters that JSON text may carry raw but a terminal must not see.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_LINE_BREAKS = re.compile("[\n\t]")


def clean(text: str) -> str:
    """``text`` without escape sequences and control characters (newline and tab kept)."""
    if text.isprintable():  # the common case: nothing to do (newlines are not printable)
        return text
    text = _SEQUENCE.sub("", text)
    text = _CONTROL.sub("", text)
    return _SURROGATE.sub("\ufffd", text)


def one_line(text: str) -> str:
    """``clean(text)`` with newlines and tabs as spaces: a value inside a line."""
    return _LINE_BREAKS.sub(" ", clean(text))


def duration_text(seconds: float | None, *, unknown: str) -> str:
    """``95`` → ``1m35s``, ``7260`` → ``2h01m``, ``90000`` → ``1d01h`` (rounded to the
    second, never below ``0s``); ``unknown`` for None."""
    if seconds is None:
        return unknown
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def escape_json(text: str) -> str:
    """JSON text with every character a terminal could act on as a ``\\uXXXX`` escape."""
    return _JSON_UNSAFE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)
