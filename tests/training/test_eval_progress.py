"""What a console shows of an evaluation under way (`on_eval_progress`): plain lines in a
log, ended by the evaluation's result; every callback of a `CallbackList` hears it."""

from __future__ import annotations

import io

from rich.console import Console

from rldojo.training.callbacks import Callback, CallbackList, ConsoleCallback


class _Result:
    accuracy, n, ci95, statuses = 0.5, 2, (0.1, 0.9), {"ok": 2}

    def metrics(self):
        return {}


class _Heard(Callback):
    def __init__(self):
        self.heard = []

    def on_eval_progress(self, label, done, total):
        self.heard.append((label, done, total))


def test_the_console_prints_evaluation_progress_then_the_result():
    out = io.StringIO()
    heard = _Heard()
    calls = CallbackList([ConsoleCallback(Console(file=out, force_terminal=False)), heard])
    for done in range(3):
        calls.on_eval_progress("before", done, 2)
    calls.on_eval("before", 0, _Result())
    for done in (0, 1):
        calls.on_eval_progress("step_1, turn 2", done, 1)
    lines = out.getvalue().splitlines()
    assert lines[:3] == ["evaluating before: 0/2", "evaluating before: 1/2",
                         "evaluating before: 2/2"]  # fmt: skip
    assert lines[3].startswith("held-out accuracy (before): 50.0% (2 tasks")
    assert lines[4:] == ["evaluating step_1, turn 2: 0/1", "evaluating step_1, turn 2: 1/1"]
    assert heard.heard[0] == ("before", 0, 2) and len(heard.heard) == 5
