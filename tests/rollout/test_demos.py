"""Demos: the text-level episode loop, failures as statuses, rejection sampling, records,
and a teacher behind a real OpenAI-compatible server on the loopback interface."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from rldojo.envs.experts import expert_for
from rldojo.envs.registry import make_env, register
from rldojo.inference.engine import ScriptedEngine
from rldojo.inference.server import start_server
from rldojo.rollout.demos import Teacher, collect_demos, passed, play_episode
from rldojo.types import Observation, Score, StepResult, Task

RECORD_KEYS = {"env", "task_id", "seed", "messages", "tools", "score", "passed", "status",
               "components", "turns", "source"}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}]


class _AnswerGrader:
    name, version = "answer", "1"

    async def grade(self, rollout, task):
        return Score(1.0, components={"correct": float(rollout.info.get("answer") == task.answer)})


class CountEnv:
    """Replies to each turn until an ``<answer>``; `mode` makes it crash or hang."""

    env_id = "demo-count-v1"

    def __init__(self, mode: str = "ok") -> None:
        self.mode, self.turn = mode, 0

    def tasks(self, split="train", *, seed=0, n=None):
        return [Task(f"count/{split}/{i}", f"say {i}", str(i), env=self.env_id) for i in range(n)]

    async def reset(self, task, *, seed):
        if self.mode == "reset_crash":
            raise RuntimeError("no database")
        self.turn = 0
        opening = [{"role": "system", "content": "sys"}, {"role": "user", "content": task.prompt}]
        return Observation(opening, info={"seed": seed, "tools": TOOLS})

    async def step(self, action):
        self.turn += 1
        if self.mode == "crash":
            raise RuntimeError("env exploded")
        if self.mode == "hang":
            await asyncio.Event().wait()  # never set: only the timeout ends it
        info = {"step": self.turn, f"only_{self.turn}": True}
        if "<answer>" in action:
            info["answer"] = action.removeprefix("<answer>").removesuffix("</answer>")
            return StepResult([{"role": "user", "content": "bye"}], True, info)
        reply = {"role": "tool", "content": f"reply {self.turn}", "name": "x"}  # an extra key
        return StepResult([reply], False, info)

    async def close(self):
        pass

    def default_grader(self):
        return _AnswerGrader()


register("demo-count-v1", CountEnv, overwrite=True)


def answering(messages, task):
    """Calls once, then answers right."""
    done = any(m["role"] == "assistant" for m in messages)
    return f"<answer>{task.answer}</answer>" if done else "<tool_call>{}</tool_call>"


def test_play_episode_builds_the_rollout_the_way_the_engine_does():
    env, task = CountEnv(), CountEnv().tasks(n=1)[0]
    ep = asyncio.run(play_episode(env, answering, task, seed=7))
    r = ep.rollout
    assert [m["role"] for m in r.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert r.messages[3]["content"] == "reply 1"  # the env's reply; its final "bye" is dropped
    assert r.completion == "<answer>0</answer>" and r.status == "ok" and r.seed == 7
    assert r.info == {"step": 2, "only_1": True, "only_2": True, "answer": "0"}  # merged by key
    assert (ep.turns, ep.tools, ep.score.components["correct"]) == (2, TOOLS, 1.0)


def test_an_async_actor_plays_and_a_raising_one_is_a_policy_error():
    async def later(messages, task):
        await asyncio.sleep(0)
        return answering(messages, task)

    def broken(messages, task):
        raise ConnectionError("endpoint down")

    task = CountEnv().tasks(n=1)[0]
    assert asyncio.run(play_episode(CountEnv(), later, task, 0)).score.value == 1.0
    ep = asyncio.run(play_episode(CountEnv(), broken, task, 0))
    assert ep.rollout.status == "policy_error" and "endpoint down" in ep.rollout.error
    assert not ep.score.ok


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "status"), [("crash", "env_error"), ("reset_crash", "env_error"), ("hang", "timeout")]
)
def test_env_failures_are_counted_statuses_and_passed_keeps_none(mode, status):
    kwargs = {"mode": mode}
    records, stats = asyncio.run(
        collect_demos("demo-count-v1", kwargs, n=3, actor=answering, timeout_s=0.5)
    )
    assert records == [] and stats.statuses == {status: 3} and stats.episodes == 3
    records, _ = asyncio.run(
        collect_demos("demo-count-v1", kwargs, n=3, actor=answering, timeout_s=0.5, keep="all")
    )
    assert [(r["status"], r["passed"], r["score"]) for r in records] == [(status, False, None)] * 3


def test_episodes_cut_at_max_turns_are_truncated_and_not_kept():
    records, stats = asyncio.run(
        collect_demos("demo-count-v1", {}, n=2, actor=lambda m, t: "hmm", max_turns=3, keep="all")
    )
    assert stats.statuses == {"truncated": 2} and stats.passed == 0
    assert all(r["turns"] == 3 and not r["passed"] for r in records)
    assert records[0]["messages"][-1] == {"role": "assistant", "content": "hmm"}


def test_rejection_sampling_stops_at_the_first_pass_and_keeps_one_per_task():
    attempts: dict[str, int] = {}

    def flaky(messages, task):  # task 0 passes at once, task 1 on its 2nd try, task 2 never
        if not any(m["role"] == "assistant" for m in messages):
            attempts[task.id] = attempts.get(task.id, 0) + 1
        wrong = task.answer == "2" or (task.answer == "1" and attempts[task.id] == 1)
        return "<answer>wrong</answer>" if wrong else f"<answer>{task.answer}</answer>"

    def collect(**kwargs):
        attempts.clear()
        return asyncio.run(
            collect_demos("demo-count-v1", {}, n=3, actor=flaky, samples=2, **kwargs)
        )

    records, stats = collect(seed=10)  # episode seed: seed + task + attempt * tasks
    assert [(r["task_id"], r["seed"]) for r in records] == [("count/train/0", 10),
                                                            ("count/train/1", 14)]  # fmt: skip
    assert (stats.episodes, stats.passed, stats.kept, stats.tasks_passed) == (5, 2, 2, 2)
    records, _ = collect(keep="all")
    assert [r["passed"] for r in records] == [True, False, True, False, False]


def test_records_round_trip_as_json_with_the_schema():
    records, _ = asyncio.run(collect_demos("demo-count-v1", {}, n=2, actor=answering))
    for record in records:
        assert json.loads(json.dumps(record)) == record and set(record) == RECORD_KEYS
        assert all(set(m) == {"role", "content"} for m in record["messages"])
        assert record["messages"][-1]["role"] == "assistant" and record["tools"] == TOOLS
        assert (record["env"], record["status"], record["source"]) == (
            "demo-count-v1",
            "ok",
            "actor",
        )


def test_the_pass_rule_is_the_evaluations():
    assert passed(Score(0.2, components={"correct": 1.0}))
    assert not passed(Score(1.5, components={"correct": 0.0}))
    assert passed(Score(0.5), 0.5) and not passed(Score(0.9)) and passed(Score(1.0))
    assert not passed(Score.failed("error", "grader bug"), 0.0)


# ------------------------------------------------------------------ a teacher over HTTP

ARITH = {"levels": [1], "python": "off"}


@pytest.mark.slow
def test_teacher_rejection_sampling_keeps_exactly_the_passing_tasks():
    tasks = make_env("arith-tools-v1", **ARITH).tasks("train", n=4)
    index = {t.prompt: (i, t) for i, t in enumerate(tasks)}
    expert = expert_for("arith-tools-v1")

    def reply(request):  # even tasks: the expert's turn; odd tasks: a wrong answer
        i, task = index[next(m["content"] for m in request.messages if m["role"] == "user")]
        return expert.act(request.messages, task) if i % 2 == 0 else "<answer>0</answer>"

    engine = ScriptedEngine(reply, model="teach-1")

    async def collect(url):
        teacher = Teacher(url, "teach-1", temperature=0.3, max_tokens=64, max_retries=0)
        try:
            return await collect_demos("arith-tools-v1", ARITH, n=4, actor=teacher, samples=2)
        finally:
            await teacher.aclose()

    with start_server(engine) as server:
        records, stats = asyncio.run(collect(server.url))
    assert [r["task_id"] for r in records] == [tasks[0].id, tasks[2].id]
    assert {r["source"] for r in records} == {"teacher:teach-1"}
    answers = {t.id: f"<answer>{t.answer}</answer>" for t in tasks}
    assert all(r["messages"][-1]["content"] == answers[r["task_id"]] for r in records)
    assert (stats.episodes, stats.passed, stats.kept) == (2 + 2 * 2, 2, 2)
    assert engine.calls == 2 * 2 + 2 * 2  # two turns per good episode, one per bad
    roles = [m["role"] for m in engine.requests[-1].messages]
    assert roles[0] == "system" and engine.requests[0].temperature == 0.3
    assert any("tool" in [m["role"] for m in r.messages] for r in engine.requests)


def test_a_teacher_whose_endpoint_is_down_is_a_policy_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def collect():
        teacher = Teacher(f"http://127.0.0.1:{port}/v1", "gone", max_retries=0, timeout_s=5)
        try:
            return await collect_demos("arith-tools-v1", ARITH, n=2, actor=teacher)
        finally:
            await teacher.aclose()

    records, stats = asyncio.run(collect())
    assert records == [] and stats.statuses == {"policy_error": 2}


def test_teacher_spec_needs_url_and_model():
    assert Teacher.from_spec("http://127.0.0.1:1/v1#m").source == "teacher:m"
    for spec in ("http://127.0.0.1:1/v1", "teach-1", "ftp://x#m"):
        with pytest.raises(ValueError, match="host:port/v1#model-name"):
            Teacher.from_spec(spec)
