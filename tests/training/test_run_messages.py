"""What a run says reaches a person: `LoggingCallback` (the Python API's default) as records
of the `rldojo.run` logger, warnings at WARNING, which Python prints on stderr when logging
is unconfigured; `ConsoleCallback` prints the rollout pipeline's progress lines with the
run's other lines while the steps run."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from rldojo.training.callbacks import ConsoleCallback, LoggingCallback


def _records(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "rldojo.run"]


def test_a_warning_line_is_a_warning_record_and_the_rest_info(caplog):
    caplog.set_level(logging.INFO, logger="rldojo")
    said = LoggingCallback()
    said.on_start({"lines": ["[bold]rldojo train[/] tiny-random on arith-v1 -> runs/x"]})
    said.on_message("warning: no learning signal at step 3 (0 of 2 groups informative): why")
    said.on_message("resume: config changes run.steps 2 -> 4 (config_history.jsonl)")
    said.step_line = lambda step, metrics: f"step {step:>3} loss {metrics['loss']:.2f}"
    said.on_step_end(3, {"loss": 0.5})
    said.on_end({"command": "train", "stopped": "steps", "steps": 3, "run_dir": "runs/x"})
    assert _records(caplog) == [
        (logging.INFO, "rldojo train tiny-random on arith-v1 -> runs/x"),  # markup dropped
        (logging.WARNING, "no learning signal at step 3 (0 of 2 groups informative): why"),
        (logging.INFO, "resume: config changes run.steps 2 -> 4 (config_history.jsonl)"),
        (logging.INFO, "step   3 loss 0.50"),
        (logging.INFO, "rldojo train: stopped steps after step 3; runs/x"),
    ]


def test_unconfigured_logging_prints_the_warning_on_stderr_only(monkeypatch, capsys):
    """A script or notebook that set up no logging: Python's last-resort handler prints
    WARNING records (the message alone) on stderr, and nothing of INFO."""
    monkeypatch.setattr(logging.root, "handlers", [])  # as in a fresh interpreter
    said = LoggingCallback()
    said.on_message("warning: no learning signal at step 1 (0 of 2 groups informative): why")
    said.on_message("a note")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "no learning signal at step 1 (0 of 2 groups informative): why\n"


def test_the_console_prints_the_pipelines_progress_with_the_runs_lines(caplog):
    printed = io.StringIO()
    console = ConsoleCallback(Console(file=printed, width=200))
    pipeline = logging.getLogger("rldojo.pipeline")
    level = pipeline.level
    console.on_start({"total_steps": 2, "lines": []})
    with console.progress():
        pipeline.info("still generating 8 samples (for 61.0s)")  # the watchdog's line
    pipeline.info("after the steps")  # no longer the console's
    assert "still generating 8 samples (for 61.0s)" in printed.getvalue()
    assert "after the steps" not in printed.getvalue()
    assert pipeline.level == level and not pipeline.handlers  # as it was
