"""OpenEnv in: `openenv-v1` drives OpenEnv servers through OpenEnv's own client: rldojo's
served environments, and the environment `openenv init` generates (nobody here wrote
it), started from its directory (`path`); failures across the boundary are rollout
statuses, never a reward of 0; and tiny-random's rollouts through rldojo's episode
engine come out graded."""

from __future__ import annotations

import asyncio
import json
import socket
from functools import partial

import pytest
from websockets.exceptions import ConnectionClosed

from rldojo.envs.openenv.server import ServerStartError, shared_server
from rldojo.envs.registry import make_env
from rldojo.interop.openenv_server import start_env_server
from rldojo.interop.served_episode import ServedEnvSpec
from rldojo.policy.base import chat_template_ids
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.rollout.episodes import collect_rollouts, grade_rollouts
from rldojo.types import Completion, Rollout, SamplingParams

pytestmark = pytest.mark.slow  # servers, tiny-random

ECHO_READY = "Echo Env environment ready!"


def echo_reward(text: str) -> float:
    """The generated template's reward for one step (its `step`)."""
    return min(len(text) * 0.1, 1.0)


async def play(env, task, turns: list[str]):
    """Reset, step each turn until done; the opening, the step results, and the score."""
    opening = await env.reset(task, seed=0)
    results = []
    for turn in turns:
        results.append(await env.step(turn))
        if results[-1].done:
            break
    info: dict = {}
    for r in results:
        info.update(r.info)
    rollout = Rollout(task.id, task.env, opening.messages, turns[len(results) - 1], info=info)
    score = await env.default_grader().grade(rollout, task)
    await env.close()
    return opening, results, score


def test_openenv_env_plays_rldojos_served_arith(arith_server):
    reference = make_env("arith-v1").tasks("train")
    env = make_env("openenv-v1", base_url=arith_server, tasks=3, task_api=True)
    task = env.tasks("train")[2]
    answer = reference[2].answer
    opening, (last,), right = asyncio.run(play(env, task, [f"Answer: {answer}"]))
    assert opening.messages[-1] == {"role": "user", "content": reference[2].prompt}
    assert last.done and right.ok and right.value == 1.0
    assert right.components["server/correct"] == 1.0
    _, _, wrong = asyncio.run(play(env, task, [f"Answer: {int(answer) + 1}"]))
    assert wrong.ok and wrong.value == 0.0


def test_openenv_env_plays_the_template_openenv_init_generates(template_dir):
    """On the server it starts from the directory (`path`), shared by every episode."""
    env = make_env("openenv-v1", path=str(template_dir), max_turns=3)
    task = env.tasks("train")[0]
    turns = ["hi", "hello", "hello there, echo"]
    opening, results, score = asyncio.run(play(env, task, turns))
    assert json.loads(opening.messages[0]["content"])["echoed_message"] == ECHO_READY
    for turn, result in zip(turns[:2], results[:2], strict=True):  # the echo comes back
        assert json.loads(result.messages[0]["content"])["echoed_message"] == turn
    assert results[-1].done and results[-1].info["episode/limit"] == "turns"
    assert score.ok and score.value == pytest.approx(sum(map(echo_reward, turns)))
    last = make_env("openenv-v1", path=str(template_dir), max_turns=3, reward="last")
    _, _, final = asyncio.run(play(last, task, turns))
    assert final.value == pytest.approx(echo_reward(turns[-1]))


def test_a_server_at_capacity_is_waited_for_then_env_error(template_dir):
    """The template serves one session at a time: a second episode waits for the first
    to close (bounded by capacity_wait_s), then gets the server (the same one: every
    environment with the same `path` shares it)."""
    env = make_env("openenv-v1", path=str(template_dir), max_turns=1, capacity_wait_s=0)
    other = make_env("openenv-v1", path=str(template_dir), max_turns=1, capacity_wait_s=60)
    task = env.tasks()[0]

    async def go() -> tuple:
        await env.reset(task, seed=0)  # holds the one session
        with pytest.raises(ConnectionError, match="capacity"):
            await make_env("openenv-v1", path=str(template_dir), capacity_wait_s=0).reset(
                task, seed=0
            )
        waiting = asyncio.create_task(other.reset(task, seed=0))
        first = await env.step("hi")  # done at max_turns: the session is closed
        opening = await waiting
        second = await other.step("hello")
        await other.close()
        return first, opening, second

    first, opening, second = asyncio.run(go())
    assert first.done and second.done and second.info["openenv/rewards"] == [0.5]
    assert json.loads(opening.messages[0]["content"])["echoed_message"] == ECHO_READY
    assert shared_server(template_dir) is shared_server(template_dir)


def test_a_server_that_fails_to_start_is_one_line_naming_the_path(tmp_path):
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "app.py").write_text("raise RuntimeError('broken on purpose')\n")
    env = make_env("openenv-v1", path=str(tmp_path))
    with pytest.raises(ServerStartError) as failed:
        asyncio.run(env.reset(env.tasks()[0], seed=0))
    message = str(failed.value)
    assert "\n" not in message and str(tmp_path) in message and "broken on purpose" in message
    empty = make_env("openenv-v1", path=str(tmp_path / "server"))  # no server/app.py in it
    with pytest.raises(ValueError, match="not an OpenEnv environment directory"):
        asyncio.run(empty.reset(empty.tasks()[0], seed=0))


class Scripted:
    """A policy that says `text` every turn, tokenised with tiny-random's tokenizer."""

    version = 0

    def __init__(self, tokenizer, text: str) -> None:
        self.tokenizer, self.text = tokenizer, text

    def encode_chat(self, messages, tools=None):
        return chat_template_ids(self.tokenizer, messages, tools)

    def generate(self, prompts, sampling):
        ids = tuple(self.tokenizer(self.text, add_special_tokens=False)["input_ids"])
        return [Completion(self.text, ids, (0.0,) * len(ids), "stop") for _ in prompts]

    def update_weights(self, state_dict=None):
        self.version += 1


def run(make, policy, n: int = 1, **kwargs):
    """Rollouts of `n` tasks through rldojo's episode engine, and their scores."""
    env = make()
    tasks = list(env.tasks("train", n=n))
    rollouts = asyncio.run(
        collect_rollouts(make, policy, [(t, 0, i) for i, t in enumerate(tasks)],
                         SamplingParams(max_new_tokens=8, seed=3), **kwargs)
    )  # fmt: skip
    scores = asyncio.run(grade_rollouts(env.default_grader(), rollouts, tasks))
    return rollouts, scores


def test_a_server_that_is_down_is_env_error_not_reward_0(tiny):
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        env = make_env("openenv-v1", base_url=url, tasks=1)
        with pytest.raises(ConnectionError):
            asyncio.run(env.reset(env.tasks()[0], seed=0))
        (rollout,), (score,) = run(partial(make_env, "openenv-v1", base_url=url),
                                   Scripted(tiny[1], "x"))  # fmt: skip
    assert rollout.status == "env_error" and "ConnectionError" in rollout.error
    assert score.value is None and not score.ok


def test_a_server_that_stops_mid_episode_raises_for_env_error():
    handle = start_env_server(ServedEnvSpec("tictactoe-v1"))
    env = make_env("openenv-v1", base_url=handle.url)

    async def go() -> None:
        await env.reset(env.tasks()[0], seed=0)
        await asyncio.to_thread(handle.close)
        try:  # refused on reconnecting, or the socket closed under the send
            with pytest.raises((ConnectionError, ConnectionClosed)):
                await env.step("<move>5</move>")
        finally:
            await env.close()

    asyncio.run(go())


@pytest.mark.parametrize(
    ("mode", "server_timeout_s", "client_timeout_s", "status"),
    [
        ("raise", 60.0, 60.0, "env_error"),  # the server reports env_error
        ("hang", 0.2, 60.0, "timeout"),  # the server's bound: it reports timeout
        ("hang", 2.0, 0.3, "timeout"),  # the client's bound: no reply in time
    ],
)
def test_failures_across_the_boundary_are_rollout_statuses(
    tiny, broken_env_id, mode, server_timeout_s, client_timeout_s, status
):
    spec = ServedEnvSpec(broken_env_id, {"mode": mode}, step_timeout_s=server_timeout_s)
    with start_env_server(spec) as handle:
        make = partial(make_env, "openenv-v1", base_url=handle.url,
                       message_timeout_s=client_timeout_s)  # fmt: skip
        (rollout,), (score,) = run(make, Scripted(tiny[1], "hello"))
    assert rollout.status == status and rollout.error
    assert score.value is None and score.status == "error"


def test_a_server_graders_failure_is_a_failed_score(tiny, broken_env_id):
    with start_env_server(ServedEnvSpec(broken_env_id, {"mode": "grade"})) as handle:
        make = partial(make_env, "openenv-v1", base_url=handle.url)
        (rollout,), (score,) = run(make, Scripted(tiny[1], "hello"))
    assert rollout.status == "ok" and rollout.info["openenv/status"] == "grade_error"
    assert score.status == "error" and score.value is None and "grader broke" in score.explanation


def test_tiny_random_rollouts_through_the_engine_are_graded(tiny, arith_server, template_dir):
    model, tokenizer = tiny
    policy = TransformersPolicy(model, tokenizer, generation_dtype=None)
    served = partial(make_env, "openenv-v1", base_url=arith_server, tasks=4, task_api=True)
    rollouts, scores = run(served, policy, n=4)
    for rollout, score in zip(rollouts, scores, strict=True):
        assert rollout.status == "ok" and any(rollout.policy_mask) and rollout.completion_ids
        assert score.ok and score.value == rollout.info["openenv/score"]["value"]
    echo = partial(make_env, "openenv-v1", path=str(template_dir), max_turns=2)
    (rollout,), (score,) = run(echo, policy)
    turns = [m["content"] for m in rollout.messages if m["role"] == "assistant"]
    assert rollout.status == "ok" and len(turns) == 2 and rollout.policy_mask.count(False) > 0
    assert score.ok and score.value == pytest.approx(sum(map(echo_reward, turns)))
