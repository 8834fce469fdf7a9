"""K-sample evaluation, text-level policies (byte codec, OpenAI endpoint) and paired comparison."""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter
from http.server import HTTPServer
from typing import ClassVar

import pytest
from chat_stub import ChatStub

from rldojo.envs.registry import make_env
from rldojo.eval.harness import SampledEval, TaskResult, compare_evals, evaluate_samples
from rldojo.policy.adapters import OpenAIPolicy, TextPolicy, callable_policy, decode_chat
from rldojo.types import Rollout, SamplingParams, Score, Task

_QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


def _solve(messages) -> int:
    a, b = _QUESTION.search(messages[-1]["content"]).groups()
    return int(a) + int(b)


def _run(policy, tasks, samples=1, grader=None, progress=None):
    env = make_env("arith-v1")
    return asyncio.run(
        evaluate_samples(
            lambda: make_env("arith-v1"),
            grader or env.default_grader(),
            policy,
            tasks,
            SamplingParams(max_new_tokens=8),
            samples=samples,
            progress=progress,
        )
    )


def test_text_policy_codec_round_trips_and_extends_as_a_prefix():
    policy = TextPolicy(lambda batch, _s: ["x"] * len(batch))
    convo = [{"role": "system", "content": "sé"}, {"role": "user", "content": "2+2?"}]
    ids = policy.encode_chat(convo)
    assert decode_chat(ids) == convo
    reply = policy.generate([ids], SamplingParams())[0]
    longer = [*convo, {"role": "assistant", "content": "x"}, {"role": "tool", "content": "ok"}]
    full = policy.encode_chat(longer)
    # The rollout engine splices environment turns as full[len(prompt + reply):].
    assert full[: len(ids) + len(reply.token_ids)] == ids + list(reply.token_ids)
    assert decode_chat(full) == longer


def test_k_samples_pass_at_k_avg_and_majority():
    tasks = make_env("arith-v1").tasks("test", n=6)
    calls: Counter[str] = Counter()

    def half_right(messages):  # right on the 1st and 3rd call per question, wrong otherwise
        key = messages[-1]["content"]
        calls[key] += 1
        answer = _solve(messages) + (0 if calls[key] % 2 == 1 else 1)
        return f"Answer: {answer}"

    heard = []
    result = _run(callable_policy(half_right), tasks, samples=4,
                  progress=lambda *turn_done_total: heard.append(turn_done_total))  # fmt: skip
    assert [t.c for t in result.tasks] == [2] * 6
    # A text policy reports no decode steps: its turn's start and end
    assert heard == [(1, 0, 24), (1, 24, 24)]
    summary = result.summary((1, 2, 4))
    assert summary["pass@1"].value == pytest.approx(0.5)
    assert summary["pass@2"].value == pytest.approx(1 - 1 / 6)
    assert summary["pass@4"].value == 1.0
    assert summary["avg@4"].value == pytest.approx(0.5)
    assert summary["maj@4"].value == 1.0  # 2-2 tie: the first answer (right) wins
    # All tasks pass maj@4: the bootstrap collapses to a point, Wilson does not.
    assert (summary["maj@4"].lo, summary["maj@4"].hi) == (1.0, 1.0)
    assert summary["maj@4"].wilson is not None and summary["maj@4"].wilson[0] < 0.7
    assert summary["pass@1"].wilson is None  # per-task values of 0.5: not binary
    assert summary["reward"].value == pytest.approx(0.5)
    assert len(result.records) == 24 and result.statuses() == {"ok": 24}


class _FlakyGrader:
    """Fails (status error) on the first task, grades the rest by exact match."""

    name = "flaky"

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        if task.id.endswith("/0"):
            return Score.failed("error", "grader crashed")
        ok = rollout.completion.strip() == f"Answer: {task.answer}"
        return Score(float(ok), components={"correct": float(ok)})


def test_failed_grades_are_excluded_not_counted_wrong():
    tasks = make_env("arith-v1").tasks("test", n=3)
    result = _run(callable_policy(lambda m: f"Answer: {_solve(m)}"), tasks, 2, _FlakyGrader())
    assert result.statuses() == {"error": 2, "ok": 4}
    assert result.tasks[0].n == 0 and result.tasks[0].pass_at(1) is None
    summary = result.summary((1,))
    assert summary["pass@1"].value == 1.0 and summary["pass@1"].n == 2


def test_compare_evals_paired_bootstrap_and_mcnemar():
    tasks = make_env("arith-v1").tasks("test", n=10)
    easy = {t.prompt for t in tasks[:6]}

    def weak(messages):
        right = messages[-1]["content"] in easy
        return f"Answer: {_solve(messages) + (0 if right else 1)}"

    a = _run(callable_policy(weak), tasks)
    b = _run(callable_policy(lambda m: f"Answer: {_solve(m)}"), tasks)
    c = compare_evals(a, b, seed=0)
    assert c["tasks"] == 10 and c["diff"] == pytest.approx(0.4)
    assert c["mcnemar"] == {"a_only": 0, "b_only": 4, "p_value": pytest.approx(0.125)}
    assert c["diff_ci95"][0] > 0
    assert sorted(c["flipped_tasks"]["b_only"]) == sorted(t.id for t in tasks[6:])


def test_compare_evals_pairs_episodes_without_an_answer():
    # A game's completion is its last move, not an answer: McNemar pairs the grades.
    def run(passes):
        tasks = [
            TaskResult(f"g/{i}", None, [ok], ["ok"], [float(ok)], [None], ["<move>5</move>"])
            for i, ok in enumerate(passes)
        ]
        return SampledEval(1, tasks, [])

    a = run([True, True, False, False, False])
    b = run([True, False, True, True, False])
    c = compare_evals(a, b, seed=0)
    assert c["diff"] == pytest.approx(0.2)
    assert c["mcnemar"]["a_only"] == 1 and c["mcnemar"]["b_only"] == 2
    assert c["flipped_tasks"] == {"a_only": ["g/1"], "b_only": ["g/2", "g/3"]}


class _StubChat(ChatStub):
    """A stand-in OpenAI-compatible server: answers the arithmetic question correctly."""

    seen: ClassVar[list[dict]] = []

    def answer(self, body):
        return f"Answer: {_solve(body['messages'])}"


@pytest.fixture
def stub_server():
    server = HTTPServer(("127.0.0.1", 0), _StubChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()
    server.server_close()


@pytest.mark.slow  # an HTTP server
def test_openai_endpoint_policy_against_a_local_stub(stub_server):
    tasks = make_env("arith-v1").tasks("test", n=4)
    _StubChat.seen.clear()
    result = _run(OpenAIPolicy(stub_server, "stub-model", concurrency=2), tasks, samples=2)
    assert result.summary((1,))["pass@1"].value == 1.0
    assert len(_StubChat.seen) == 8
    first = _StubChat.seen[0]
    assert first["model"] == "stub-model" and first["max_tokens"] == 8
    assert first["messages"][0]["role"] == "system"  # the env's opening conversation


@pytest.mark.slow  # serves tiny-random
def test_openai_policy_against_rldojo_serve_on_the_tiny_model():
    serve = pytest.importorskip("rldojo.inference")
    tasks = make_env("arith-v1").tasks("test", n=3)
    with serve.start_server("tiny-random") as server:
        policy = OpenAIPolicy(server.url, server.model, concurrency=2)
        result = _run(policy, tasks, samples=2)
    assert result.statuses() == {"ok": 6}  # a random model is wrong, but every call works
    assert all(isinstance(c, str) for t in result.tasks for c in t.completions)


@pytest.mark.slow  # tiny-random
def test_a_decoding_policy_reports_each_answer_as_it_ends(tiny):
    import torch

    from rldojo.policy.transformers_backend import TransformersPolicy

    model, tokenizer = tiny
    policy = TransformersPolicy(model, tokenizer, generation_dtype=None, max_batch=1)
    heard = []
    tasks = make_env("arith-v1").tasks("test", n=3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on two shared cores wait on each other
    try:
        _run(policy, tasks, progress=lambda *turn_done_total: heard.append(turn_done_total))
    finally:
        torch.set_num_threads(threads)
    assert heard == [(1, 0, 3), (1, 1, 3), (1, 2, 3), (1, 3, 3)]  # one row decodes at a time
