"""`rldojo pipeline`: demos -> SFT -> RL -> the stages paired, from one TOML, resumable.

The end-to-end run is examples/agentic_tictactoe.toml on tiny-random (8 demos, 2 SFT
steps, 1 RL step of 2 x 2, 4 held-out games), once for the module (slow tier); the
interrupted stages use stand-ins for `run_sft` and `run_training` (no model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.eval.compare import paired_comparison, read_outcomes, success_rate
from rldojo.training.stops import RunInterrupted

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "agentic_tictactoe.toml"
TINY = ["model.name=tiny-random", "run.device=cpu", "run.threads=1", "run.steps=1",
        "eval.tasks=4", "eval.before_tasks=2", "sampling.max_new_tokens=8",
        "eval.max_new_tokens=8", "sft.batch_size=4", "sft.run.epochs=1", "model.lora.layers=[1]",
        "rollout.prompts_per_step=2", "rollout.group_size=2", "run.report_to=[]"]  # fmt: skip
runner = CliRunner()


def _pipeline(pipe: Path, *extra: str):
    sets = [a for s in TINY for a in ("--set", s)]
    args = ["pipeline", str(RECIPE), *sets, "--demos", "8", "--run-dir", str(pipe), *extra]
    return runner.invoke(app, args)


@pytest.fixture(scope="module")
def pipe(tmp_path_factory) -> Path:
    """A pipeline run through the CLI, every stage."""
    pipe = tmp_path_factory.mktemp("pipeline") / "ttt"
    result = _pipeline(pipe, "--by-kind", "mark")
    assert result.exit_code == 0, result.output
    assert "-> SFT+RL" in result.output and str(pipe / "summary.json") in result.output
    return pipe


@pytest.mark.slow
def test_every_stage_runs_and_the_summary_pairs_them_by_task(pipe):
    state = json.loads((pipe / "pipeline.json").read_text())
    assert list(state["done"]) == ["demos", "sft", "rl"] and state["demos"] == 8
    demos = [json.loads(x) for x in (pipe / "demos.jsonl").read_text().splitlines()]
    assert len(demos) == 8 and {d["env"] for d in demos} == {"tictactoe-v1"}
    sft = json.loads((pipe / "sft" / "summary.json").read_text())
    assert sft["data"] == str(pipe / "demos.jsonl") and sft["steps"] == 2
    # RL starts from the SFT checkpoint, and does not evaluate it again
    rl = json.loads((pipe / "rl" / "summary.json").read_text())
    assert rl["model"] == sft["checkpoint"] == str(pipe / "sft/checkpoints/step_000002")
    assert rl["steps"] == 1 and not (pipe / "rl" / "evals" / "before.jsonl").exists()
    summary = json.loads((pipe / "summary.json").read_text())
    base, after_sft = read_outcomes(pipe / "sft", "before"), read_outcomes(pipe / "sft", "after")
    after_rl = read_outcomes(pipe / "rl", "after")
    assert (len(base), len(after_sft), len(after_rl)) == (2, 4, 4)
    assert set(base) <= set(after_sft) == set(after_rl)  # the same held-out games
    assert summary["success"] == {"base": success_rate(base), "sft": success_rate(after_sft),
                                  "sft_rl": success_rate(after_rl)}  # fmt: skip
    paired = summary["paired"]
    assert paired["base_to_sft"] == paired_comparison(base, after_sft)
    assert paired["sft_to_sft_rl"] == paired_comparison(after_sft, after_rl)
    assert paired["base_to_sft"]["n"] == 2 and paired["sft_to_sft_rl"]["n"] == 4
    assert summary["demos"]["episodes"] == 8 and summary["sft"]["steps"] == 2
    assert summary["rl"]["steps"] == 1 and summary["rl"]["stopped"] == "steps"
    assert summary["by_kind"]["key"] == "mark" and set(summary["by_kind"]["sft"]) <= {"X", "O"}
    walls = summary["wall_s"]
    assert walls["total"] == pytest.approx(walls["demos"] + walls["sft"] + walls["rl"])


@pytest.mark.slow
def test_a_pipeline_whose_sft_completed_runs_only_rl(pipe):
    """The state says demos and SFT completed (RL never started): the same command runs
    RL alone, from the SFT checkpoint, and leaves the demos and the SFT run as they were."""
    state = json.loads((pipe / "pipeline.json").read_text())
    del state["done"]["rl"]
    (pipe / "pipeline.json").write_text(json.dumps(state))
    shutil.rmtree(pipe / "rl")
    (pipe / "summary.json").unlink()
    kept = [pipe / "demos.jsonl", pipe / "sft" / "summary.json", pipe / "sft" / "metrics.jsonl"]
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in kept}
    result = _pipeline(pipe)
    assert result.exit_code == 0, result.output
    assert "sft completed before; skipped" in result.output
    assert "rldojo sft" not in result.output and "rldojo train" in result.output
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in kept} == before
    assert json.loads((pipe / "pipeline.json").read_text())["done"].keys() == {
        "demos", "sft", "rl"}  # fmt: skip
    assert json.loads((pipe / "summary.json").read_text())["rl"]["steps"] == 1


@pytest.mark.slow
def test_an_sft_adapter_is_merged_before_rl_adds_its_own(tmp_path):
    """SFT under `model.lora` (the recipe's `[sft.model]` table emptied): the SFT
    checkpoint holds an adapter; RL starts from it merged into its base (PIPE/sft-merged)
    and trains fresh adapters (`model.lora`)."""
    from rldojo.policy.lora import is_adapter_dir

    pipe = tmp_path / "ttt"
    result = _pipeline(pipe, "--set", "sft.model={}", "--set", "eval.tasks=2")
    assert result.exit_code == 0, result.output
    sft = json.loads((pipe / "sft" / "summary.json").read_text())
    assert is_adapter_dir(Path(sft["checkpoint"]))
    rl = json.loads((pipe / "rl" / "summary.json").read_text())
    assert rl["model"] == str(pipe / "sft-merged") and is_adapter_dir(Path(rl["checkpoint"]))
    assert (pipe / "sft-merged" / "config.json").exists()


def _state(pipe: Path, done: list[str]) -> None:
    """A pipeline state whose stages `done` completed."""
    pipe.mkdir(parents=True)
    records = {"demos": {"wall_s": 1.0},
               "sft": {"run": str(pipe / "sft"), "wall_s": 1.0,
                       "checkpoint": str(pipe / "sft" / "checkpoints" / "step_1")}}  # fmt: skip
    state = {"config": str(RECIPE), "overrides": TINY, "rl_overrides": [], "demos": 8,
             "done": {k: records[k] for k in done}}  # fmt: skip
    (pipe / "pipeline.json").write_text(json.dumps(state))


@pytest.mark.parametrize("stage", ["sft", "rl"])
def test_an_interrupted_stage_is_resumed_in_its_run_directory(stage, tmp_path, monkeypatch):
    calls, models = [], []

    def stand_in(name):
        def run(config, *data, run_dir, resume, overwrite, console):
            calls.append((name, resume, overwrite))
            models.append((config.model.name, config.eval.before))
            if name == stage and len(calls) == 1:  # interrupted after the run started
                run_dir.mkdir(parents=True)
                (run_dir / "config.toml").write_text("")
                raise RunInterrupted("interrupted at step 1")
            return {"checkpoint": str(run_dir / "checkpoints" / "step_1")}

        return run

    monkeypatch.setattr("rldojo.training.sft.run_sft", stand_in("sft"))
    monkeypatch.setattr("rldojo.training.loop.run_training", stand_in("rl"))
    monkeypatch.setattr("rldojo.training.pipeline.summarize", lambda *a: {"fake": True})
    monkeypatch.setattr("rldojo.commands.pipeline._line", lambda summary: "done")
    pipe = tmp_path / "pipe"
    _state(pipe, ["demos"] if stage == "sft" else ["demos", "sft"])
    result = _pipeline(pipe)
    assert result.exit_code == 130 and "the same command resumes" in result.stderr
    assert stage not in json.loads((pipe / "pipeline.json").read_text())["done"]
    result = _pipeline(pipe)
    assert result.exit_code == 0, result.output
    then = [("rl", False, True)] if stage == "sft" else []  # RL after the resumed SFT
    assert calls == [(stage, False, True), (stage, True, False), *then]
    assert set(json.loads((pipe / "pipeline.json").read_text())["done"]) == {"demos", "sft", "rl"}
    # RL starts from the SFT checkpoint without evaluating it again
    assert models[-1] == (str(pipe / "sft" / "checkpoints" / "step_1"), False)


def test_a_directory_that_is_not_a_pipeline_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = _pipeline(tmp_path)
    assert result.exit_code == 2 and "not a pipeline" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
