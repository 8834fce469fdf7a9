"""TRL's `GRPOTrainer(environment_factory=...)` against rldojo's served crm-v1, through
`rldojo.interop.trl_adapter` and OpenEnv's own client.

The server runs in this process (a thread), so the tests read what its episodes replied
(`ServedEpisode.reset`/`step`, wrapped) and compare that with what TRL saw: the tools
TRL renders are the served tools, the expert's calls dispatched the way TRL dispatches
them solve the served tasks, and a GRPO step of `tiny-random` logs the grader's rewards.

The GRPO step (~25 s on 2 idle cores, plus ~11 s importing TRL) runs in `make
test-interop` (RLDOJO_INTEROP=1), not in `make test`, whose ~20-minute budget it would
overrun; the adapter's own test runs everywhere.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("trl", reason="TRL is needed for its GRPOTrainer")

from rldojo.envs.experts import expert_for
from rldojo.envs.registry import make_env
from rldojo.envs.tool_calls import parse_turn
from rldojo.interop.openenv_server import start_env_server
from rldojo.interop.served_episode import ServedEnvSpec, ServedEpisode
from rldojo.interop.trl_adapter import EpisodeOverError, served_env_factory, served_reward

pytestmark = pytest.mark.slow  # servers; the GRPO step loads tiny-random

TASK_KWARGS = {"db_size": "small", "n_databases": 1}
SERVE_KWARGS = {**TASK_KWARGS, "schema_style": "template", "no_action": "end"}
"""crm-v1 as the adapter's docstring advises serving it to TRL."""


@pytest.fixture
def crm(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """crm-v1 served on loopback, and the log of every reply its episodes gave."""
    log: list[dict[str, Any]] = []
    reset, step = ServedEpisode.reset, ServedEpisode.step

    async def logged_reset(self: ServedEpisode, **kwargs: Any) -> Any:
        reply = await reset(self, **kwargs)
        log.append({"kind": "reset", "task_id": reply.task_id, "done": reply.done})
        return reply

    async def logged_step(self: ServedEpisode, text: str) -> Any:
        reply = await step(self, text)
        log.append({"kind": "step", "task_id": reply.task_id, "done": reply.done,
                    "reward": reply.reward, "status": reply.status})  # fmt: skip
        return reply

    monkeypatch.setattr(ServedEpisode, "reset", logged_reset)
    monkeypatch.setattr(ServedEpisode, "step", logged_step)
    with start_env_server(ServedEnvSpec("crm-v1", SERVE_KWARGS)) as handle:
        yield handle.url, log


def _without_descriptions(schema: dict[str, Any]) -> dict[str, Any]:
    """A function schema without the descriptions of its arguments (the served ones may
    have none; the adapter writes a stand-in) and with `required` as a sorted list."""
    out = json.loads(json.dumps(schema))
    out.pop("return", None)
    parameters = out.setdefault("parameters", {"type": "object", "properties": {}})
    for spec in parameters["properties"].values():
        spec.pop("description", None)
    parameters["required"] = sorted(parameters.get("required") or [])
    return out


def test_the_tools_trl_sees_are_the_served_tools_and_carry_the_experts_episodes(crm):
    """TRL's view of the adapter (its public methods, `get_json_schema` of each) is the
    served tool list; the crm expert's calls, run as TRL runs a parsed call
    (``method(**arguments)``), and its answer through `served_reward`, score 1.0."""
    import inspect

    from transformers.utils import get_json_schema

    url, log = crm
    factory = served_env_factory(url)
    env = factory()
    try:
        public = {n for n, _ in inspect.getmembers(type(env), inspect.isfunction)
                  if not n.startswith("_")}  # fmt: skip
        served = {s["function"]["name"]: s["function"] for s in factory.tools}
        assert factory.env_id == "crm-v1" and public == {"reset", *served}
        for name, schema in served.items():
            rendered = get_json_schema(getattr(env, name))["function"]
            assert _without_descriptions(rendered) == _without_descriptions(schema)
        expert, tasks = expert_for("crm-v1", **TASK_KWARGS), make_env("crm-v1", **TASK_KWARGS)
        for index in range(3):
            del log[:]
            calls = _play_expert(env, expert, tasks.tasks("train")[index], index)
            assert env.reward == 1.0 and env.status == "ok" and env.turns == calls + 1
            ends = [e for e in log if e["kind"] == "step" and e["done"]]
            assert [(e["reward"], e["status"]) for e in ends] == [(1.0, "ok")]
            assert sum(e["kind"] == "step" for e in log) == calls + 1
        with pytest.raises(EpisodeOverError):
            env.search_kb(query="refund")
    finally:
        factory.close()


def _play_expert(env: Any, expert: Any, task: Any, index: int) -> int:
    """One episode: the expert's turns, each call dispatched by name as TRL does and its
    answer scored by `served_reward`; the number of tool calls."""
    messages = [{"role": "user", "content": env.reset(index=index, prompt=[])}]
    calls = 0
    while True:
        turn = expert.act(messages, task)
        messages.append({"role": "assistant", "content": turn})
        parsed = parse_turn(turn)
        if not parsed.calls:
            (reward,) = served_reward([[{"role": "assistant", "content": turn}]], [env])
            assert reward == env.reward
            return calls
        for call in parsed.calls:
            result = getattr(env, call.name)(**call.arguments)
            messages.append({"role": "tool", "content": f"<tool_response>{result}</tool_response>"})
            calls += 1


@pytest.mark.timeout(240)
@pytest.mark.skipif(
    os.environ.get("RLDOJO_INTEROP") != "1", reason="make test-interop (RLDOJO_INTEROP=1)"
)
def test_grpo_trainer_trains_a_step_of_tiny_random_on_served_crm(crm, tmp_path, monkeypatch):
    """One GRPO step: every rollout is an episode on the server (task of its row), the
    rewards TRL logs are the grader's, and the step's loss and gradient are finite."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    from rldojo.policy.models import load_model

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    url, log = crm
    model, tokenizer = load_model("tiny-random")
    # SmolLM2's ChatML template has no tool calls; Qwen2.5's is ChatML with Hermes tool
    # calls (rldojo's <tool_call> syntax), and TRL knows how to parse its replies.
    tokenizer.chat_template = qwen2_5_chat_template
    factory = served_env_factory(url)
    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, num_generations=2,
        max_completion_length=8, max_tool_calling_iterations=2, use_cpu=True, bf16=False,
        report_to=[], logging_steps=1, save_strategy="no", seed=0,
    )  # fmt: skip
    rows = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]], "index": [3]})
    trainer = GRPOTrainer(model, reward_funcs=served_reward, args=args, train_dataset=rows,
                          processing_class=tokenizer, environment_factory=factory)  # fmt: skip
    try:
        trainer.train()
    finally:
        factory.close()
    assert trainer.state.global_step == 1
    logged = trainer.state.log_history[0]
    task_id = make_env("crm-v1", **TASK_KWARGS).tasks("train")[3].id
    rollout_resets = [e for e in log if e["kind"] == "reset"][1:]  # the first: the probe's
    assert [e["task_id"] for e in rollout_resets] == [task_id, task_id]
    ends = [e for e in log if e["kind"] == "step" and e["done"]]
    assert len(ends) == 2 and all(e["status"] == "ok" for e in ends)
    steps = sum(e["kind"] == "step" for e in log)
    assert steps == 2 + round(logged["tools/call_frequency"] * 2)  # calls + closing turns
    rewards = [e["reward"] for e in ends]
    assert sorted(env.reward for env in factory.instances) == sorted(rewards)
    assert logged["rewards/served_reward/mean"] == pytest.approx(sum(rewards) / 2)
    assert logged["reward"] == pytest.approx(sum(rewards) / 2)
    # Logged and finite. A random model writes no answer, so both rollouts of the group
    # score the same (the format penalty): zero advantages, a zero loss, no update.
    assert math.isfinite(logged["loss"]) and math.isfinite(logged["grad_norm"])
