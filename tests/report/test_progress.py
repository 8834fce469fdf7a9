"""A long phase shows how far it got: plain lines on a log console (the start, each eighth,
the end), a rich bar on an interactive one; log lines reach a console through `log_lines`."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from rldojo.report.progress import PhaseProgress, log_lines, plain_due, with_turn


def _plain() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=120), out


def test_a_log_console_gets_a_line_at_the_start_each_eighth_and_the_end():
    console, out = _plain()
    shown = PhaseProgress(console)
    for done in range(129):
        shown.update("evaluating before", done, 128)
    shown.update("evaluating before", 128, 128)  # said already: no second end line
    lines = out.getvalue().splitlines()
    assert lines == [f"evaluating before: {k}/128" for k in range(0, 129, 16)]


def test_a_new_label_starts_a_new_phase_and_counts_may_jump():
    console, out = _plain()
    shown = PhaseProgress(console)
    shown.update("evaluating after", 0, 3)
    shown.update("evaluating after", 3, 3)  # a policy that reports only the turn's end
    shown.update(with_turn("evaluating after", 2), 0, 2)
    shown.update(with_turn("evaluating after", 2), 2, 2)
    shown.close()
    assert out.getvalue().splitlines() == [
        "evaluating after: 0/3",
        "evaluating after: 3/3",
        "evaluating after, turn 2: 0/2",
        "evaluating after, turn 2: 2/2",
    ]


def test_plain_lines_are_due_once_per_eighth_whatever_the_steps():
    assert plain_due(0, 5, None) and plain_due(5, 5, 3) and not plain_due(5, 5, 5)
    said, lines = None, []
    for done in (0, 3, 7, 8, 30, 31, 32, 33):
        if plain_due(done, 32, said):
            said = done
            lines.append(done)
    assert lines == [0, 7, 8, 30, 32]  # eighths of 32 are 4 apart; 3 is within the first


def test_an_interactive_console_draws_a_bar_that_goes_away():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    shown = PhaseProgress(console)
    shown.update("evaluating before", 64, 128)
    assert shown.live is None and shown._own is not None  # a bar of its own, on screen
    shown.close()
    assert shown._own is None
    assert "evaluating before" in out.getvalue() and "64/128" in out.getvalue()


def test_log_lines_hands_info_records_to_the_console_while_open():
    said: list[str] = []
    log = logging.getLogger("rldojo.test.progress")
    level = log.level
    with log_lines(said.append, "rldojo.test.progress"):
        log.info("converting %s from GGUF", "SmolLM2")
        log.debug("not for a person")
    log.info("after: not forwarded")
    assert said == ["converting SmolLM2 from GGUF"]
    assert log.level == level and not log.handlers
