"""Multi-turn agentic training: scripted episodes through the rollout engine, and tiny runs.

The tiny random model never writes a valid tool call, so the training runs show the
plumbing: multi-turn episodes that end at the turn limit, error observations, statuses
counted, environment tokens masked out of the loss, a finished run with a full ledger.
A scripted policy shows the reward path end to end through the same engine.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sqlite3
import tomllib
from pathlib import Path

import pytest
from tiny_config import tiny_overrides

from rldojo.config import load_config
from rldojo.envs.crm import CrmEnv
from rldojo.envs.registry import make_env
from rldojo.rollout.episodes import collect_rollouts, grade_rollouts
from rldojo.training.loop import run_training
from rldojo.types import Completion, SamplingParams

pytestmark = pytest.mark.slow  # trains tiny-random

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class ScriptedPolicy:
    """A policy that replays fixed turns per task; its "tokens" are characters.

    The chat encoding is ``<role>content`` per message plus a trailing ``<assistant>``,
    so the engine's re-encoding lines up exactly with the sampled characters.
    """

    version = 0
    tokenizer = None

    def __init__(self, scripts: dict[str, list[str]]) -> None:
        self.scripts = scripts

    def encode_chat(self, messages) -> list[int]:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return [ord(ch) for ch in text]

    def generate(self, prompts, sampling: SamplingParams) -> list[Completion]:
        out = []
        for prompt in prompts:
            text = "".join(map(chr, prompt))
            user = text.split("<user>", 1)[1].split("<", 1)[0]
            turn = text.count("<assistant>") - 1
            action = self.scripts[user][min(turn, len(self.scripts[user]) - 1)]
            ids = tuple(ord(ch) for ch in action)
            out.append(Completion(action, ids, (0.0,) * len(ids), "stop"))
        return out

    def update_weights(self, state_dict=None) -> None:
        self.version += 1


def call(tool: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': tool, 'arguments': arguments})}</tool_call>"


def test_scripted_crm_episodes_through_the_engine():
    env = CrmEnv(levels=(3,), db_size="small", n_databases=1)
    task = next(t for t in env.tasks("train", n=100) if t.info["template"] == "win_and_thank")
    update = task.info["expected"]["updates"][0]
    contact = task.info["expected"]["inserts"][0]["match"]["to_contact_id"]
    good = [
        call("get_deal", deal_id=update["id"]),
        call("update_deal", deal_id=update["id"], **update["set"]),
        call("send_email", contact_id=contact, subject="Thanks", body="Thank you!"),
        "<answer>Marked won and thanked them.</answer>",
    ]
    liar = ["<answer>Done, all updated.</answer>"]
    requests = [(task, 0, 11), (task, 1, 11)]
    results = {}
    for name, script in (("good", good), ("liar", liar)):
        policy = ScriptedPolicy({task.prompt: script})
        factory = lambda: CrmEnv(levels=(3,), db_size="small", n_databases=1)  # noqa: E731
        rollouts = asyncio.run(collect_rollouts(factory, policy, requests, SamplingParams()))
        scores = asyncio.run(grade_rollouts(env.default_grader(), rollouts, [task, task]))
        results[name] = (rollouts, scores)
    rollouts, scores = results["good"]
    assert [s.value for s in scores] == [pytest.approx(1.0)] * 2
    r = rollouts[0]
    assert r.status == "ok" and r.info["tool/calls"] == 3 and r.info["crm/changed_rows"] == 2
    assert [m["role"] for m in r.messages].count("tool") == 3
    policy_text = "".join(chr(t) for t, m in zip(r.completion_ids, r.policy_mask, strict=True) if m)
    env_text = "".join(
        chr(t) for t, m in zip(r.completion_ids, r.policy_mask, strict=True) if not m
    )
    assert policy_text == "".join(good)  # exactly the policy's turns carry the loss mask
    assert "<tool_response>" in env_text and "update_deal" not in env_text.split("<tool>")[0]
    liar_scores = results["liar"][1]
    assert all(
        s.value == pytest.approx(-0.5) and "hack:false_claim" in s.flags for s in liar_scores
    )


TINY = tiny_overrides(
    "rollout.max_turns=3",
    "sampling.max_new_tokens=8",
    "optim.micro_batch_size=4",
    "env.train_tasks=6",
    "run.steps=1",
)


@pytest.fixture
def fast_tiny_model(tiny, monkeypatch):
    """Reuse the session's tiny model and tokenizer instead of rebuilding them per run."""
    model, tokenizer = tiny
    monkeypatch.setattr(
        "rldojo.training.run.load_model", lambda name, **kw: (copy.deepcopy(model), tokenizer)
    )


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        (
            "crm-v1",
            '{levels = [1, 2], db_size = "small", n_databases = 1, schema_style = "signatures"}',
        ),
        ("arith-tools-v1", '{python = "off"}'),
        ("tictactoe-v1", "{opponent_depth = 1, max_illegal = 5}"),
    ],
)
def test_tiny_multi_turn_training_run(env_id, kwargs, tmp_path, fast_tiny_model):
    cfg = load_config(
        None,
        [
            *TINY,
            f"env.id={env_id}",
            f"env.kwargs={kwargs}",
            f"run.output_dir={tmp_path}",
            "run.name=r",
        ],
    )
    summary = run_training(cfg)
    assert summary["steps"] == 1 and summary["rollouts"] == 4
    db = sqlite3.connect(tmp_path / "r" / "ledger.sqlite")
    rows = db.execute("SELECT status, score_status, messages, policy_mask FROM rollouts").fetchall()
    assert len(rows) == 4
    for status, score_status, messages, mask in rows:
        assert status in ("ok", "truncated") and score_status == "ok"
        turns = [m["role"] for m in json.loads(messages)]
        assert turns.count("assistant") >= 2 or status == "ok"  # multi-turn unless it ended early
        mask = json.loads(mask)
        assert 1 in mask and (0 in mask or turns.count("assistant") == 1)  # env tokens masked
    assert any(status == "truncated" for status, *_ in rows)  # the turn limit ends episodes
    metrics = [
        json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    ]
    step = next(m for m in metrics if "time/step" in m)
    assert step["rollout/samples"] == 4 and step.get("rollout/status_truncated", 0) >= 1


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("agentic_*.toml")), ids=lambda p: p.name)
def test_example_configs_load_and_build_their_env(path):
    cfg = load_config(path)
    assert cfg.model.name == "smollm2-135m-instruct"
    env = make_env(cfg.env.id, **cfg.env.kwargs)
    assert env.tasks("train", seed=0, n=2)
    assert tomllib.loads(path.read_text())["env"]["id"] == cfg.env.id


def test_there_is_an_example_per_agentic_env():
    ids = {load_config(p).env.id for p in EXAMPLES.glob("agentic_*.toml")}
    assert {"crm-v1", "arith-tools-v1", "tictactoe-v1"} <= ids
