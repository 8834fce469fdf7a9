"""Training with a rubric judge (tiny model as policy and judge), end to end.

1. The judge is `rldojo serve` with `tiny-random` on loopback, through the openai client.
   A random judge writes garbage, so every score is `invalid`: the run counts them,
   finishes, and trains on none of them (never a 0 reward).
2. The judge is a deterministic stand-in server: scores are valid and vary within
   groups, so an optimizer step happens.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from judge_standin import split_blocks
from tiny_config import tiny_overrides

from rldojo.config import load_config
from rldojo.inference import ScriptedEngine, start_server
from rldojo.training.loop import run_training
from rldojo.training.stops import FailureBudgetExceeded

pytestmark = pytest.mark.slow  # trains tiny-random

TINY = tiny_overrides(
    "rollout.group_size=4",
    "sampling.max_new_tokens=8",
    "sampling.temperature=1.0",
    "optim.micro_batch_size=4",
    "optim.lr=1e-3",
    "env.train_tasks=8",
    "run.steps=1",
)


def rubric_override(url: str, model: str, cache: str) -> str:
    return (
        f'grader.spec={{type="rubric", judge={{base_url="{url}", model="{model}"}}, '
        f'cache="{cache}", sampling_params={{max_tokens=12}}, criteria=['
        '{id="correct", text="The final answer is right", points=2}, '
        '{id="shows_work", text="The steps are shown", points=1}, '
        '{id="wrong_step", text="A step is wrong", points=-1}]}'
    )


def train(tmp_path, name: str, url: str, model: str, *more: str) -> tuple[dict, dict]:
    overrides = [
        *TINY,
        f"run.output_dir={tmp_path}",
        f"run.name={name}",
        rubric_override(url, model, str(tmp_path / "judge.sqlite")),
        *more,
    ]
    summary = run_training(load_config(None, overrides))
    lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    steps = [m for m in map(json.loads, lines) if "time/step" in m]
    return summary, steps[-1]


def test_tiny_random_judge_over_http_scores_are_invalid_and_not_trained_on(tmp_path):
    with start_server("tiny-random") as server:
        # the failure budget stops a run whose judge gives nothing usable, before it
        # generates: the preflight's reference answers are all invalid
        with pytest.raises(FailureBudgetExceeded, match="grader invalid in 8/8 reference"):
            train(tmp_path, "stopped", server.url, server.model)
        # with the budget off, the step runs and its invalid scores train nothing
        summary, metrics = train(tmp_path, "tiny-judge", server.url, server.model,
                                 "run.max_failure_rate=1")  # fmt: skip
    assert summary["steps"] == 1 and summary["rollouts"] == 8
    assert metrics["grade/status_invalid"] == 8  # garbage verdicts: invalid, never 0
    assert metrics["train/skipped"] == 1 and summary["rollouts_trained"] == 0
    assert summary["statuses"]  # the ledger counted them


def hashed_judge(request) -> str:
    """Deterministic stand-in: criterion met iff a hash of (sample, id) is even."""
    prompt = request.messages[1]["content"]
    _, blocks = split_blocks(prompt)
    sample = blocks["SAMPLE"]
    nonce = re.search(r"\(ID (\w+)\)", prompt).group(1)
    ids = re.findall(r"^- id: (\S+) \|", prompt, re.MULTILINE)
    criteria = [
        {"id": cid, "met": int(hashlib.sha256((sample + cid).encode()).hexdigest(), 16) % 2 == 0}
        for cid in ids
    ]
    return json.dumps({"sample_id": nonce, "criteria": criteria})


def test_standin_judge_gives_valid_varied_scores_and_an_update(tmp_path):
    engine = ScriptedEngine(hashed_judge)
    with start_server(engine) as server:
        summary, metrics = train(tmp_path, "standin", server.url, server.model)
    # identical samples share one call: at most 8 for the step's samples, and at most 8
    # for the grader preflight's reference answers
    assert 1 <= engine.calls <= 16
    assert "grade/status_invalid" not in metrics
    assert metrics["rollout/groups_informative"] >= 1
    assert "train/skipped" not in metrics and metrics["optim/grad_norm"] > 0
    assert summary["rollouts_trained"] > 0
    assert set(metrics) >= {"reward/component/correct", "reward/component/wrong_step"}
