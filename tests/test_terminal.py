"""Text from outside made safe for a terminal (``trainmon.terminal``), and what
``trainmon runs``/``compare`` print of a ledger whose records carry escape sequences."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from testkit.daemon import trainmon_command
from trainmon.ledger import RunRecord
from trainmon.ledger.store import Ledger, RecordUpdate
from trainmon.terminal import clean, duration_text, escape_json, one_line

#: What may never reach a terminal: C0 but newline and tab, DEL, C1, bidi controls.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.mark.parametrize("raw, printed", [
    ("plain text, 中文, tabs\tand\nnewlines", "plain text, 中文, tabs\tand\nnewlines"),
    ("\x1b[31mred\x1b[0m", "red"),                                  # CSI (colour)
    ("a\x1b[2J\x1b[1;1Hb", "ab"),                                   # clear, move the cursor
    ("ask\x1b[6n", "ask"),                                          # DSR: the terminal answers
    ("\x1b]0;title\x07x", "x"),                                     # OSC ended by BEL
    ("\x1b]8;;http://evil/\x1b\\link\x1b]8;;\x1b\\", "link"),       # OSC 8 hyperlink, ST
    ("\x1bP+q544e\x1b\\d", "d"),                                    # DCS
    ("\x1b_apc\x1b\\e", "e"),                                       # APC
    ("\x1b]0;never ended\nnext line", "\nnext line"),               # unterminated: to the line end
    ("\x9b2J8bit", "8bit"),                                         # 8-bit CSI
    ("\x9d0;t\x9cz", "z"),                                          # 8-bit OSC ... ST
    ("\x1b(Bcharset", "charset"),                                   # ESC ( B
    ("\x1b7save\x1b8", "save"),                                     # ESC 7 / ESC 8
    ("over\rwrite", "overwrite"),                                   # carriage return
    ("bell\x07nul\x00del\x7fnel\x85", "bellnuldelnel"),
    ("abc\u202eevil\u2066x\u2069", "abcevilx"),                     # bidi override, isolates
    ("lone \udc80 surrogate", "lone \ufffd surrogate"),
])
def test_clean_removes_what_a_terminal_acts_on(raw: str, printed: str) -> None:
    assert clean(raw) == printed
    assert UNSAFE.search(clean(raw)) is None


def test_one_line_keeps_a_value_on_its_line() -> None:
    assert one_line("job\n[CRITICAL] forged\tline\x1b[2K") == "job [CRITICAL] forged line"


@pytest.mark.parametrize("seconds, text", [
    (0.4, "0s"), (-3.0, "0s"), (59.4, "59s"), (59.6, "1m00s"), (95.0, "1m35s"),
    (3599.0, "59m59s"), (7260.0, "2h01m"), (86399.0, "23h59m"), (90000.0, "1d01h"),
    (None, "?"),
])
def test_a_duration_reads_the_same_in_every_command(seconds: float | None, text: str) -> None:
    """``trainmon runs``, ``compare`` and ``doctor``'s run history write it so."""
    assert duration_text(seconds, unknown="?") == text


def test_escape_json_keeps_the_data_and_escapes_the_rest() -> None:
    value = {"job": "a\x1b[2J\x9b31m\u202e\x7f\udc80b", "zh": "训练"}
    text = escape_json(json.dumps(value, ensure_ascii=False))
    assert json.loads(text) == value
    assert UNSAFE.search(text) is None and "训练" in text


def test_runs_and_compare_print_no_escape_sequence_from_the_ledger(tmp_path: Path) -> None:
    now = time.time()
    hostile = "\x1b]0;owned\x07\x1b[2J\x1b[6n\x9b31m\u202e\nCRITICAL forged line"
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path, readonly=False) as ledger:
        ledger.write([RecordUpdate(RunRecord(
            job=f"train{hostile}", run=f"run-{index}", node=f"node{hostile}",
            config_hash="sha256:0000000000000000", started=now - 600 + index, ended=now,
            end_reason="finished", updated=now, world_size=8, ranks=8,
            description={"config": {"lr": f"0.{index}{hostile}"}},
            summary={"final_verdict": f"compute{hostile}"}, owner="uid:1000"), {})
            for index in (1, 2)])
    kept = {name: value for name, value in os.environ.items() if not name.startswith("TRAINMON_")}
    for args in (["runs"], ["runs", "--json"], ["compare", "run-1", "run-2"],
                 ["compare", "run-1", "run-2", "--json"]):
        done = subprocess.run([*trainmon_command(), *args, "--ledger", str(path)], env=kept,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert UNSAFE.search(done.stdout) is None, done.stdout
        if "--json" not in args:  # a value never starts a line of its own
            assert not any(line.startswith("CRITICAL") for line in done.stdout.splitlines())
