"""code-v1 and code-repair-v1: task sources, splits, grading through the env, repair episodes."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from rldojo.data.loading import DataError
from rldojo.envs.base import Env
from rldojo.envs.code import CodeEnv, CodeRepairEnv, TurnCostGrader
from rldojo.envs.code.feedback import FeedbackError, feedback_message, visible_tests
from rldojo.envs.code.tasks import N_HELD_OUT, N_VISIBLE, format_call
from rldojo.envs.code.templates import TEMPLATES
from rldojo.envs.registry import list_envs, make_env
from rldojo.graders.code.grader import CodeTestsGrader, suite_from_info
from rldojo.rollout.episodes import collect_rollouts, grade_rollouts
from rldojo.sandbox import ExecResult, probe
from rldojo.types import Completion, Rollout, SamplingParams, Score, Task

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sandbox() -> None:
    if not probe().strict:
        if os.environ.get("CI") == "true":
            pytest.fail("CI requires the strict sandbox:\n" + probe().summary)
        pytest.skip("strict sandbox unavailable:\n" + probe().summary)


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}```\n"


def wrong(task: Task) -> str:
    return fenced(f"def {task.info['entry_point']}(*args, **kwargs):\n    return None\n")


def rollout(task: Task, completion: str, **info) -> Rollout:
    return Rollout(task_id=task.id, env=task.env, messages=[], completion=completion, info=info)


def grade_all(grader, pairs: list[tuple[Task, str]]) -> list[Score]:
    async def run() -> list[Score]:
        return list(await asyncio.gather(*(grader.grade(rollout(t, c), t) for t, c in pairs)))

    return asyncio.run(run())


# --- procedural tasks ----------------------------------------------------------------------


def test_registered_and_envs() -> None:
    assert {"code-v1", "code-repair-v1"} <= set(list_envs())
    assert isinstance(make_env("code-v1"), Env)
    assert isinstance(make_env("code-repair-v1", max_turns=2), Env)


def test_same_seed_same_tasks_prefix_stable_other_seed_differs() -> None:
    env = CodeEnv()
    a, b = env.tasks("train", seed=3, n=30), env.tasks("train", seed=3, n=30)
    assert a == b
    assert env.tasks("train", seed=3, n=10) == a[:10]
    assert [t.prompt for t in env.tasks("train", seed=4, n=30)] != [t.prompt for t in a]
    assert CodeRepairEnv().tasks("test", seed=1, n=5)[0].env == "code-repair-v1"


def _spec_text(task: Task) -> str:
    return str(task.prompt).split("\n", 1)[0]  # "Write a Python function `sig` that ..."


def test_splits_are_disjoint_and_cover_every_template() -> None:
    env = CodeEnv()
    train, test = env.tasks("train", seed=0), env.tasks("test", seed=0)
    assert not {_spec_text(t) for t in train} & {_spec_text(t) for t in test}
    assert len({t.prompt for t in test}) == len(test)
    assert {t.info["template"] for t in test} == set(TEMPLATES)
    assert {t.info["template"] for t in train} == set(TEMPLATES)


def test_task_info_is_what_the_grader_reads() -> None:
    task = CodeEnv().tasks("train", seed=0, n=1)[0]
    info = task.info
    suite = suite_from_info(info)
    assert suite.entry_point == info["entry_point"]
    assert len(info["tests"]) == N_VISIBLE and len(info["held_out_tests"]) == N_HELD_OUT
    assert sum(t.held_out for t in suite.tests) == N_HELD_OUT
    for test in info["tests"]:  # visible tests are the prompt's examples
        assert format_call(info["entry_point"], test["input"]) in task.prompt
    for test in info["held_out_tests"]:
        assert format_call(info["entry_point"], test["input"]) not in task.prompt
    assert "```python" in task.prompt
    plain = CodeEnv(held_out=False).tasks("train", seed=0, n=1)[0]
    assert "held_out_tests" not in plain.info and plain.prompt == task.prompt


def test_env_options() -> None:
    env = CodeEnv(partial_credit=True, templates=["clamp"], system_prompt=None)
    assert env.default_grader().config.partial_credit is True
    assert {t.info["template"] for t in env.tasks("train", n=20)} == {"clamp"}
    assert env.prompt_messages(env.tasks("train", n=1)[0])[0]["role"] == "user"
    with pytest.raises(ValueError, match="unknown templates"):
        CodeEnv(templates=["nope"])
    with pytest.raises(ValueError, match="unknown split"):
        CodeEnv().tasks("valid")


@pytest.mark.slow  # the sandbox
def test_reference_of_every_template_scores_1_and_a_wrong_one_0(sandbox) -> None:
    env = CodeEnv(test_timeout_s=10.0)  # generous: the limit is not under test
    by_template: dict[str, Task] = {}
    for task in env.tasks("train", seed=0, n=200):
        by_template.setdefault(task.info["template"], task)
    assert set(by_template) == set(TEMPLATES)
    tasks = list(by_template.values())
    pairs = [(t, fenced(t.info["reference"])) for t in tasks] + [(t, wrong(t)) for t in tasks]
    scores = grade_all(env.default_grader(), pairs)
    assert all(s.ok for s in scores), [s.explanation for s in scores if not s.ok]
    n = len(tasks)
    assert [s.value for s in scores[:n]] == [1.0] * n, [s.explanation for s in scores[:n]]
    assert [s.value for s in scores[n:]] == [0.0] * n


# --- HumanEval and JSONL ----------------------------------------------------------------------


@pytest.mark.slow  # the sandbox
def test_humaneval_source_loads_164_tasks(sandbox) -> None:
    env = CodeEnv(source="humaneval")
    train, test = env.tasks("train"), env.tasks("test")
    assert len(train) + len(test) == 164 and not {t.id for t in train} & {t.id for t in test}
    every = CodeEnv(source="humaneval", test_fraction=1.0).tasks("test")
    assert len(every) == 164
    task = next(t for t in every if t.info["task_id"] == "HumanEval/2")
    assert "def truncate_number" in task.prompt and "```python" in task.prompt
    stub_body = "    return number % 1.0\n"
    full = "def truncate_number(number: float) -> float:\n    return number % 1.0\n"
    scores = grade_all(
        env.default_grader(),
        [(task, fenced(stub_body)), (task, fenced(full)), (task, wrong(task))],
    )
    assert [s.value for s in scores] == [1.0, 1.0, 0.0]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


GOOD_ROWS = [
    {
        "task_id": "he-like",
        "prompt": 'def double(x: int) -> int:\n    """Twice x."""\n',
        "entry_point": "double",
        "test": "def check(c):\n    assert c(2) == 4\n    assert c(0) == 0\n",
        "canonical_solution": "    return 2 * x\n",
    },
    {
        "id": "calls",
        "prompt": "Write `add(a, b)` returning the sum.",
        "entry_point": "add",
        "tests": [{"input": [1, 2], "output": 3}],
        "held_out_tests": [{"input": [-5, 5], "output": 0}],
    },
    {"prompt": "Print the sum of two integers.", "tests": [{"stdin": "2 3\n", "stdout": "5\n"}]},
]


@pytest.mark.slow  # the sandbox
def test_jsonl_source_tasks_and_grades(tmp_path, sandbox) -> None:
    path = write_jsonl(tmp_path / "code.jsonl", GOOD_ROWS)
    env = CodeEnv(source=str(path), test_fraction=0.0)
    tasks = {t.id: t for t in env.tasks("train")}
    assert set(tasks) == {"code-v1/he-like", "code-v1/calls", "code-v1/line3"}
    program = tasks["code-v1/line3"]
    assert "standard input" in program.prompt
    assert "held_out_tests" in tasks["code-v1/calls"].info
    plain = {t.id: t for t in CodeEnv(source=path, held_out=False, test_fraction=0.0).tasks()}
    assert "held_out_tests" not in plain["code-v1/calls"].info
    solutions = {
        "code-v1/he-like": "def double(x):\n    return x + x\n",
        "code-v1/calls": "def add(a, b):\n    return a + b\n",
        "code-v1/line3": "a, b = map(int, input().split())\nprint(a + b)\n",
    }
    pairs = [(tasks[k], fenced(v)) for k, v in solutions.items()]
    assert [s.value for s in grade_all(env.default_grader(), pairs)] == [1.0, 1.0, 1.0]
    assert CodeEnv(source=str(path), test_fraction=1.0).tasks("train") == []


BAD_ROWS = [
    ({"tests": [{"input": [1], "output": 1}], "entry_point": "f"}, "field 'prompt': missing"),
    ({"prompt": "p"}, "field 'tests|test': missing"),
    ({"prompt": "p", "entry_point": "f", "tests": "nope"}, "field 'tests': expected list"),
    ({"prompt": "p", "entry_point": "f", "tests": []}, "field 'tests': empty"),
    ({"prompt": "p", "entry_point": "f", "tests": [{"input": [1]}]}, "field 'tests[0]'"),
    ({"prompt": "p", "tests": [{"input": [1], "output": 2}]}, "field 'entry_point'"),
    (
        {
            "prompt": "p",
            "entry_point": "f",
            "tests": [{"input": [1], "output": 2}],
            "held_out_tests": [{"stdin": "1", "stdout": "2"}],
        },
        "field 'tests': stdin/stdout tests cannot be mixed",
    ),
    ({"prompt": "p", "entry_point": "f", "test": "def check(c:\n"}, "field 'test'"),
    ({"prompt": "p", "entry_point": "not a name", "test": "assert f(1)"}, "field 'entry_point'"),
    ({"prompt": "p", "test": "assert f(1) == 1"}, "field 'entry_point': missing"),
    ({"id": True, "prompt": "p", "test": "assert f(1)", "entry_point": "f"}, "field 'task_id'"),
    ("{not json", "malformed JSON"),
]


@pytest.mark.parametrize(("row", "message"), BAD_ROWS, ids=[m for _, m in BAD_ROWS])
def test_bad_jsonl_rows_name_file_line_and_field(tmp_path, row, message) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD_ROWS[1], "", row])
    with pytest.raises(DataError) as info:
        CodeEnv(source=str(path))
    text = str(info.value)
    assert text.startswith(f"{path}:3: ") and message in text and "\n" not in text


def test_duplicate_ids_and_missing_file(tmp_path) -> None:
    path = write_jsonl(tmp_path / "dup.jsonl", [GOOD_ROWS[1], GOOD_ROWS[1]])
    with pytest.raises(DataError, match=r"dup.jsonl:2: field 'task_id': duplicate of line 1"):
        CodeEnv(source=str(path))
    with pytest.raises(DataError, match="cannot read"):
        CodeEnv(source=str(tmp_path / "missing.jsonl"))


# --- code-repair-v1 ---------------------------------------------------------------------------


class ScriptedPolicy:
    """Replays one action per turn; "tokens" are characters (the engine's re-encoding lines up)."""

    version = 0
    tokenizer = None

    def __init__(self, actions: list[str]) -> None:
        self.actions = actions

    def encode_chat(self, messages) -> list[int]:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return [ord(ch) for ch in text]

    def generate(self, prompts, sampling: SamplingParams) -> list[Completion]:
        out = []
        for prompt in prompts:
            turn = "".join(map(chr, prompt)).count("<assistant>") - 1
            action = self.actions[min(turn, len(self.actions) - 1)]
            ids = tuple(ord(ch) for ch in action)
            out.append(Completion(action, ids, (0.0,) * len(ids), "stop"))
        return out


def repair_task() -> Task:
    return CodeRepairEnv(templates=["add_n"]).tasks("train", seed=0, n=1)[0]


def run_episode(env_kwargs: dict, task: Task, actions: list[str]) -> tuple[Rollout, Score]:
    def factory() -> CodeRepairEnv:
        return CodeRepairEnv(templates=["add_n"], **env_kwargs)

    policy = ScriptedPolicy(actions)
    rollouts = asyncio.run(collect_rollouts(factory, policy, [(task, 0, 7)], SamplingParams()))
    scores = asyncio.run(grade_rollouts(factory().default_grader(), rollouts, [task]))
    return rollouts[0], scores[0]


@pytest.mark.slow  # the sandbox
def test_repair_wrong_then_right_gets_feedback_and_pays_the_turn_cost(sandbox) -> None:
    task = repair_task()
    off_by_one = fenced("def add_n(xs, n=0):\n    return [x + n + 1 for x in xs]\n")
    right = fenced(task.info["reference"])
    r, score = run_episode({"turn_cost": 0.1}, task, [off_by_one, right])
    assert r.status == "ok" and [m["role"] for m in r.messages][-3:] == [
        "assistant", "user", "assistant",
    ]  # fmt: skip
    feedback = r.messages[-2]["content"]
    first = task.info["tests"][0]
    assert format_call("add_n", first["input"]) in feedback and repr(first["output"]) in feedback
    assert "got [" in feedback and "```python" in feedback
    assert r.info["repair_turns"] == 2 and r.info["episode/done_reason"] == "passed"
    assert score.ok and score.value == pytest.approx(0.9)
    assert score.components["repair/tests"] == 1.0 and score.components["repair/turns"] == 2.0


@pytest.mark.slow  # the sandbox
def test_feedback_shows_errors_and_never_held_out_expected_outputs(sandbox) -> None:
    env = CodeRepairEnv(max_failures_shown=5)
    checked = 0
    for task in env.tasks("train", seed=2, n=6):
        asyncio.run(env.reset(task, seed=0))
        step = asyncio.run(env.step(fenced(f"def {task.info['entry_point']}(*a):\n    1 / 0\n")))
        assert not step.done and step.info["repair/visible_passed"] == 0
        feedback = step.messages[0]["content"]
        assert "ZeroDivisionError" in feedback
        lines = [line for line in feedback.splitlines() if line.startswith("- ")]
        visible_calls = [
            format_call(task.info["entry_point"], t["input"]) for t in task.info["tests"]
        ]
        assert len(lines) == N_VISIBLE and all(
            any(line[2:].startswith(c) for c in visible_calls) for line in lines
        )
        for test in task.info["held_out_tests"]:
            call = format_call(task.info["entry_point"], test["input"])
            assert call not in visible_calls and call not in feedback
        checked += 1
    assert checked == 6


@pytest.mark.slow  # the sandbox
def test_repair_stops_at_max_turns_and_grades_the_last_attempt(sandbox) -> None:
    task = repair_task()
    bad = fenced("def add_n(xs, n=0):\n    return xs\n")
    r, score = run_episode({"turn_cost": 0.25, "max_turns": 3}, task, [bad, bad, bad])
    assert r.status == "ok" and r.info["repair_turns"] == 3
    assert r.info["episode/done_reason"] == "max_turns"
    assert sum(m["role"] == "user" for m in r.messages) == 3  # the prompt + two feedbacks
    assert score.value == pytest.approx(-0.5)


def test_sandbox_failure_is_a_status_never_a_zero(monkeypatch) -> None:
    task = repair_task()
    env = CodeRepairEnv(templates=["add_n"])
    broken = ExecResult("sandbox_error", None, "", "", 0.0, error="bwrap failed", attempts=3)

    class Pool:
        async def execute_async(self, spec):
            return broken

    monkeypatch.setattr(CodeTestsGrader, "pool", property(lambda self: Pool()))
    asyncio.run(env.reset(task, seed=0))
    with pytest.raises(FeedbackError, match="sandbox error"):
        asyncio.run(env.step(wrong(task)))
    r, score = run_episode({}, task, [wrong(task)])
    assert r.status == "env_error" and score.status == "error" and score.value is None

    class Failing:
        name = "failing"

        async def grade(self, rollout, task):
            return Score.failed("timeout", "slow")

    failed = asyncio.run(TurnCostGrader(Failing(), 0.5).grade(rollout(task, "x"), task))
    assert failed.status == "timeout" and failed.value is None


def test_visible_tests_of_assert_suites_and_count_only_feedback() -> None:
    tasks = CodeEnv(source="humaneval", test_fraction=1.0).tasks("test")
    info = next(t for t in tasks if t.info["task_id"] == "HumanEval/0").info
    visible = visible_tests(info)
    converted = [t for t in suite_from_info(info).tests]
    assert visible is not None and 0 < len(visible) <= len(converted) // 2 + 1
    assert visible_tests({"entry_point": "f", "test": "def check(c):\n    for i in range(3):\n"
                          "        assert c(i) == i\n"}) is None  # fmt: skip
    from rldojo.envs.code.feedback import VisibleCheck

    message = feedback_message(VisibleCheck(2, 5, detailed=False))
    assert "passed 2 of 5 tests" in message


def test_turn_cost_reads_turns_from_rollout_info() -> None:
    class Perfect:
        name = "perfect"

        async def grade(self, rollout, task):
            return Score(1.0, components={"tests/total": 3.0})

    task = Task(id="t", prompt="p")
    grader = TurnCostGrader(Perfect(), 0.2)
    assert asyncio.run(grader.grade(rollout(task, "x", repair_turns=3), task)).value == 0.6
    two = Rollout("t", "e", [{"role": "assistant", "content": "a"}] * 2, "x")
    assert asyncio.run(grader.grade(two, task)).value == pytest.approx(0.8)
