"""One run, one directory: a rerun of the same config is refused instead of continuing the
old run's ledger, metrics and checkpoints; `--overwrite` moves the old run aside;
`--resume` refuses a config that changes what the ledger's rollouts mean, unless
`--force`, and records every change in config_history.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_config import tiny_overrides
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.store.run_dir import claim_run_dir, describe_run, resume_changes

TINY = tiny_overrides("run.report_to=[]", "run.threads=1", "run.name=same",
                      drop=["sampling.max_new_tokens"])  # fmt: skip


def _train(tmp_path: Path, *overrides: str, flags: tuple[str, ...] = ()):
    sets = [a for o in (*TINY, f"run.output_dir={tmp_path}", *overrides) for a in ("--set", o)]
    return CliRunner().invoke(app, ["train", *sets, *flags])


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # trains tiny-random
def test_a_second_run_with_the_same_name_is_refused_and_leaves_the_first_untouched(tmp_path):
    first = _train(tmp_path, "run.steps=2", "sampling.max_new_tokens=16")
    assert first.exit_code == 0, first.output
    run = tmp_path / "same"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    second = _train(tmp_path, "run.steps=1", "sampling.max_new_tokens=4")
    assert second.exit_code == 2
    line = second.output.strip()
    assert "\n" not in line and str(run) in line and "already holds a run" in line
    assert "finished at step 2" in line and "--resume" in line and "--overwrite" in line
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after == before  # nothing written: no config, no metrics line, no checkpoint


@pytest.mark.slow  # trains tiny-random
def test_overwrite_moves_the_old_run_aside_and_starts_clean(tmp_path):
    assert _train(tmp_path, "run.steps=2", "sampling.max_new_tokens=16").exit_code == 0
    result = _train(tmp_path, "run.steps=1", "sampling.max_new_tokens=4", flags=("--overwrite",))
    assert result.exit_code == 0, result.output
    run = tmp_path / "same"
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("same.old-")]
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == ["step_000002"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001"]
    assert [r["step"] for r in _records(run) if r["kind"] == "train"] == [1]
    assert "max_new_tokens = 4" in (run / "config.toml").read_text()
    assert "reused" not in result.output  # nothing came from the old run's ledger


@pytest.mark.slow  # trains tiny-random
def test_resume_refuses_a_changed_sampling_key_and_allows_more_steps(tmp_path):
    assert _train(tmp_path, "run.steps=1", "sampling.max_new_tokens=8").exit_code == 0
    run = tmp_path / "same"
    refused = CliRunner().invoke(
        app, ["train", "--resume", str(run), "--set", "sampling.max_new_tokens=4"]
    )
    assert refused.exit_code == 2
    assert "sampling.max_new_tokens 8 -> 4" in refused.output and "--force" in refused.output
    assert [r["step"] for r in _records(run)] == [1]  # untouched
    more = CliRunner().invoke(app, ["train", "--resume", str(run), "--set", "run.steps=2"])
    assert more.exit_code == 0, more.output
    assert [r["step"] for r in _records(run) if r["kind"] == "train"] == [1, 2]
    history = [json.loads(x) for x in (run / "config_history.jsonl").read_text().splitlines()]
    assert [h["event"] for h in history] == ["start", "resume"]
    assert history[1]["changed"] == {"run.steps": [1, 2]}
    args = ["--resume", str(run), "--force", "--set", "run.steps=3",
            "--set", "sampling.temperature=0.5"]  # fmt: skip
    forced = CliRunner().invoke(app, ["train", *args])
    assert forced.exit_code == 0, forced.output
    last = json.loads((run / "config_history.jsonl").read_text().splitlines()[-1])
    assert last["changed"] == {"run.steps": [2, 3], "sampling.temperature": [0.7, 0.5]}


@pytest.mark.slow  # trains tiny-random
def test_resumed_steps_say_how_many_rollouts_they_reused(tmp_path):
    """A run killed after its step-2 rollouts were committed but before its checkpoint:
    the resume reuses them, and the step line says so."""
    assert _train(tmp_path, "run.steps=2", "run.checkpoint_every=1").exit_code == 0
    run = tmp_path / "same"
    import shutil

    shutil.rmtree(run / "checkpoints" / "step_000002")  # as if killed before it was saved
    (run / "summary.json").unlink()
    result = CliRunner().invoke(app, ["train", "--resume", str(run)])
    assert result.exit_code == 0, result.output
    step2 = next(x for x in result.output.splitlines() if x.startswith("step   2"))
    assert step2.endswith("reused 4 rollouts from the ledger")


def test_claim_and_describe(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert claim_run_dir(empty, command="train") is None  # an empty directory is free
    (empty / "notes.txt").write_text("mine")
    assert claim_run_dir(empty, command="sft") is None  # so is one without a run's files
    run = tmp_path / "r"
    (run / "checkpoints" / "step_000003").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 3, "kind": "train"}\n{"step": 4, "kin')
    assert describe_run(run) == "stopped early: step 3 logged, newest checkpoint step_000003"


def test_resume_changes_split_meaning_from_harmless():
    """A run's config.toml holds the precision it resolved ("bf16", True); a resume whose
    config leaves them at "auto" changes nothing."""
    stored = {"model": {"name": "m", "generation_dtype": "bf16", "autocast_bf16": True},
              "run": {"steps": 2, "seed": 0}, "eval": {"every": 0},
              "rollout": {"group_size": 8, "workers": 0}}  # fmt: skip
    new = {"model": {"name": "m", "generation_dtype": "auto", "autocast_bf16": "auto"},
           "run": {"steps": 5, "seed": 1}, "eval": {"every": 2},
           "rollout": {"group_size": 4, "workers": 2}}  # fmt: skip
    meaning, harmless = resume_changes(stored, new)
    assert meaning == {"rollout.group_size": (8, 4), "run.seed": (0, 1)}
    assert harmless == {"eval.every": (0, 2), "rollout.workers": (0, 2), "run.steps": (2, 5)}


@pytest.mark.slow  # trains tiny-random
def test_resume_with_the_runs_own_config_file_is_no_change(tmp_path):
    """`rldojo train CONFIG --resume RUN` with the file the run started from: its "auto"
    precision keys were resolved into RUN/config.toml, which is not a change."""
    auto = [o for o in TINY if not o.startswith("model.autocast_bf16")]
    toml = tmp_path / "c.toml"
    sections: dict[str, list[str]] = {}
    for item in [*auto, f"run.output_dir={tmp_path}", "run.steps=1"]:
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        literal = (
            value if value[:1] in "[0123456789" or value in ("true", "false") else f'"{value}"'
        )
        sections.setdefault(section, []).append(f"{name} = {literal}")
    toml.write_text("".join(f"[{s}]\n" + "\n".join(v) + "\n" for s, v in sections.items()))
    assert CliRunner().invoke(app, ["train", str(toml)]).exit_code == 0
    run = tmp_path / "same"
    assert "autocast_bf16 = " in (run / "config.toml").read_text()  # resolved there
    result = CliRunner().invoke(app, ["train", str(toml), "--resume", str(run),
                                      "--set", "run.steps=2"])  # fmt: skip
    assert result.exit_code == 0, result.output
    last = json.loads((run / "config_history.jsonl").read_text().splitlines()[-1])
    assert last["changed"] == {"run.steps": [1, 2]}
