"""The two-stage recipe of every `examples/agentic_*.toml` works as its comment says:
`rldojo demos RECIPE` -> `rldojo sft RECIPE` -> `rldojo train RECIPE` from the SFT
checkpoint (on tiny-random, one step of each)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rldojo.cli import app

pytestmark = pytest.mark.slow  # loads tiny-random or starts the CLI

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = ["model.name=tiny-random", "eval.tasks=2", "sampling.max_new_tokens=8",
        "eval.max_new_tokens=8", "run.report_to=[]", "run.threads=1"]  # fmt: skip


def _sets(*items: str) -> list[str]:
    return [a for item in items for a in ("--set", item)]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("agentic_*.toml")), ids=lambda p: p.name)
def test_demos_then_sft_then_rl_from_the_sft_checkpoint(path, tmp_path):
    config = tomllib.loads(path.read_text())
    env_id = config["env"]["id"]
    comment = path.read_text().split("\n[")[0]
    recipe = path.relative_to(EXAMPLES.parent)
    assert f"rldojo demos {recipe} --n" in comment and f"rldojo sft {recipe}" in comment
    runner = CliRunner()
    demos = tmp_path / "demos.jsonl"  # the comment's command: the env and kwargs of the TOML
    result = runner.invoke(app, ["demos", str(path), "--n", "3", "--out", str(demos)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in demos.read_text().splitlines()]
    assert lines and all(x["passed"] and x["env"] == env_id for x in lines)
    out = f"run.output_dir={tmp_path}"
    # a recipe's LoRA layers name SmolLM2's 30; tiny-random has 2: adapt its top one
    layers = ["model.lora.layers=[1]"] if config["model"].get("lora", {}).get("layers") else []
    result = runner.invoke(app, ["sft", str(path), "--data", str(demos),
                                 *_sets(*TINY, *layers, out, "sft.run.epochs=1")])  # fmt: skip
    assert result.exit_code == 0, result.output
    sft_dir = tmp_path / f"{config['run']['name']}-sft"
    summary = json.loads((sft_dir / "summary.json").read_text())
    assert summary["demonstrations"] == len(lines) and summary["steps"] == 1
    assert set(summary["evals"]) == {"before", "after"}
    checkpoint = summary["checkpoint"]
    # the comment's checkpoint name is the one this recipe writes at full size
    steps = -(-int(re.search(r"--n (\d+)", comment).group(1)) // config["sft"]["batch_size"])
    epochs = config["sft"].get("run", {}).get("epochs", 2)  # run.epochs for SFT alone
    assert f"step_{steps * epochs:06d}" in comment
    result = runner.invoke(app, ["train", str(path), *_sets(*TINY, *layers, out, "run.steps=1",
                                 f"model.name={checkpoint}", "rollout.prompts_per_step=2",
                                 "rollout.group_size=2")])  # fmt: skip
    assert result.exit_code == 0, result.output
    rl = json.loads((tmp_path / config["run"]["name"] / "summary.json").read_text())
    assert rl["model"] == checkpoint and rl["steps"] == 1
    before = (tmp_path / config["run"]["name"] / "evals" / "before.jsonl").read_text()
    assert [json.loads(x)["task_id"] for x in before.splitlines()] == [
        json.loads(x)["task_id"]
        for x in (sft_dir / "evals" / "after.jsonl").read_text().splitlines()
    ]  # both stages evaluate the same held-out tasks: paired comparisons
