"""The public Python API (`rldojo.api`): a reward function and rows train a model, its
failures are failed grades (never rewards of 0), a run directory evaluates as its own
"after" evaluation did, and `import rldojo` stays free of torch."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import rldojo
from rldojo.api.runs import as_config, with_reward
from rldojo.config import ConfigError, ConfigValueError
from rldojo.data.loading import DataError
from rldojo.envs.function_reward import FunctionGrader, register_function_env, rows_to_tasks
from rldojo.policy.adapters import callable_policy
from rldojo.types import Rollout, Task


def tiny(tmp_path: Path, steps: int = 2) -> dict:
    """A tiny run (tiny-random, 2 prompts x 2 samples, 4 tokens) writing under tmp_path."""
    return {
        "model": {"name": "tiny-random", "autocast_bf16": False},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "dynamic_sampling": False},
        "sampling": {"max_new_tokens": 4},
        "run": {"steps": steps, "threads": 1, "output_dir": str(tmp_path), "name": "run"},
    }


def even_length(prompt, completion, answer, bad=False):
    """Deterministic for a greedy model, and passes on some tasks only; raises on `bad`."""
    if bad:
        raise ValueError(f"no reward for {answer}\n(second line)")
    return float(len(completion) % 2 == 0)


TRAIN_ROWS = [
    {"prompt": "1 + 1 =", "answer": "2"},
    {"prompt": "2 + 2 =", "answer": "4", "bad": True},
]
EVAL_ROWS = [
    {"id": "e0", "prompt": "3 + 3 =", "answer": "6"},
    {"id": "e1", "prompt": [{"role": "user", "content": "4 + 4 ="}], "answer": "8"},
    {"id": "e2", "prompt": "5 + 5 =", "answer": "10"},
    {"id": "e3", "prompt": "6 + 6 =", "answer": "12", "bad": True},
]


def grade(reward, completion="done", **task):
    """The score `reward` gives `completion` on the task of one row."""
    (t,) = rows_to_tasks([{"prompt": "p", **task}])
    rollout = Rollout(task_id=t.id, env="x", messages=[], completion=completion)
    return asyncio.run(FunctionGrader(reward).grade(rollout, t))


# ------------------------------------------------------------------ no model needed


@pytest.mark.slow
def test_import_rldojo_imports_no_torch():
    code = (
        "import sys, rldojo\n"
        "assert 'torch' not in sys.modules, 'import rldojo'\n"
        "rldojo.train, rldojo.evaluate, rldojo.Callback, rldojo.RunResult, rldojo.EvalResult\n"
        "rldojo.load_config, rldojo.Grader, rldojo.Env, rldojo.Score, rldojo.make_env\n"
        "assert 'torch' not in sys.modules, 'the API names'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_rldojo_train_is_the_function_whatever_was_imported_first():
    code = (
        "import rldojo.training.callbacks as c, rldojo, rldojo.api\n"  # the subpackage first
        "assert rldojo.train is rldojo.api.train and rldojo.training.callbacks is c\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert set(rldojo.__all__) >= {"train", "sft", "distill", "evaluate", "load_config",
                                   "make_env", "Env", "Grader", "Score", "Callback",
                                   "RunResult", "EvalResult"}  # fmt: skip


def test_a_failing_reward_is_a_failed_grade_never_zero():
    score = grade(even_length, answer="4", bad=True)
    assert (score.value, score.status) == (None, "error")
    assert score.explanation == "ValueError: no reward for 4 (second line)"
    for returned in (float("nan"), float("inf"), "1.0", [1.0]):
        score = grade(lambda p, c, r=returned: r)
        assert (score.value, score.status) == (None, "error"), returned
        assert "not a finite number" in score.explanation
    score = grade(lambda p, c: None)  # None skips the function: with one, nothing is left
    assert (score.status, score.explanation) == ("error", "no reward: lambda returned None")
    assert grade(lambda p, c: True).value == 1.0  # bools and ints are numbers


def test_sync_and_async_functions_get_the_fields_they_accept():
    seen = []

    def only_answer(prompt, completion, answer):
        seen.append((prompt, completion, answer))
        return 0.5

    async def takes_all(prompt, completion, **fields):
        await asyncio.sleep(0)
        seen.append(fields)
        return 1

    assert grade(only_answer, "out", answer=4, level=2).value == 0.5
    assert grade(takes_all, "out", answer=4, level=2).value == 1.0
    assert seen == [("p", "out", 4), {"answer": 4, "level": 2}]
    messages = [{"role": "user", "content": "hi"}]
    (t,) = rows_to_tasks([{"prompt": messages}])
    rollout = Rollout(task_id=t.id, env="x", messages=[], completion="c")
    got = []
    asyncio.run(FunctionGrader(lambda p, c: got.append(p) or 1.0).grade(rollout, t))
    assert got == [messages]  # the prompt as the row gave it


@pytest.mark.parametrize(
    ("rows", "error"),
    [
        ([{"prompt": "a"}, {"answer": "4"}], "tasks[1]: field 'prompt': missing"),
        ([{"prompt": "a", "completion": "x"}], "tasks[0]: field 'completion': reserved"),
        ([{"prompt": 3}], "tasks[0]: field 'prompt': expected a string"),
        ([{"prompt": [{"role": "me", "content": "x"}]}], "tasks[0]: field 'prompt': message 0"),
        ([{"prompt": "a", "id": 1}, {"prompt": "b", "id": "1"}], "tasks[1]: field 'id'"),
        (["a prompt"], "tasks[0]: expected a mapping"),
        ([{"prompt": "a"}], "tasks[0]: reward even_length(prompt, completion, answer, "),
        ({"prompt": "a"}, "tasks: expected a list of rows"),
        ([], "tasks: no rows"),
    ],
)
def test_bad_rows_are_one_line_errors(rows, error):
    with pytest.raises(DataError) as caught:
        register_function_env(even_length, rows)
    assert str(caught.value).startswith(error)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("rollout", "env_workers", 2),
        ("rollout", "grade_in_workers", True),
        ("run", "cluster", "ray"),
        ("env", "mix", [{"id": "arith-v1"}]),
        ("grader", "spec", {"type": "string_check"}),
    ],
)
def test_a_reward_function_refuses_other_processes_and_other_envs(section, key, value):
    config = as_config({section: {key: value}})
    with pytest.raises(ConfigValueError, match=rf"^{section}\.{key}: "):
        with_reward(config, even_length, TRAIN_ROWS, None)


def test_a_dict_config_has_the_files_one_line_errors():
    one_line = r"^config: run\.stepz: unknown key \(did you mean steps\?\)$"
    with pytest.raises(ConfigError, match=one_line):
        as_config({"run": {"stepz": 2}})
    with pytest.raises(ValueError, match="tasks= and reward= go together"):
        rldojo.train({}, tasks=TRAIN_ROWS)


@pytest.mark.slow  # builds every registered environment
def test_evaluate_an_env_by_id_instance_or_rows_with_any_policy():
    policy = callable_policy(lambda messages: "The answer is 4.")
    by_id = rldojo.evaluate(policy, "arith-v1", n=3)
    by_instance = rldojo.evaluate(policy, rldojo.make_env("arith-v1"), n=3)
    assert (by_id.n, by_id.statuses) == (3, {"ok": 3})
    assert by_instance.rows == by_id.rows
    rows = [{"prompt": "2 + 2 =", "answer": "4"}, {"prompt": "1 + 2 =", "answer": "3"}]
    by_rows = rldojo.evaluate(policy, tasks=rows, reward=lambda p, c, answer: float(answer in c))
    assert [r["passed"] for r in by_rows.rows] == [True, False]


# ------------------------------------------------------------------ tiny-random runs (slow)


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("api")
    return rldojo.train(tiny(out), tasks=TRAIN_ROWS, eval_tasks=EVAL_ROWS, reward=even_length)


@pytest.mark.slow
def test_failed_grades_are_counted_as_statuses_not_rewards(reward_run):
    s = reward_run.summary
    assert s["statuses"] == {"ok/ok": 4, "ok/error": 4}  # the bad row: both samples, 2 steps
    assert s["evals"]["after"]["statuses"] == {"ok": 3, "error": 1}
    with sqlite3.connect(reward_run.run_dir / "ledger.sqlite") as db:
        failed = db.execute("SELECT score_value, explanation, provenance FROM rollouts "
                            "WHERE score_status = 'error'").fetchall()  # fmt: skip
    assert {f[:2] for f in failed} == {(None, "ValueError: no reward for 4 (second line)")}
    for _, _, provenance in failed:  # the ledger keeps where the reward function raised
        trace = json.loads(provenance)["traceback"]
        assert ", in even_length\n" in trace and "ValueError: no reward for 4" in trace
    assert reward_run.stopped == "steps" and reward_run.checkpoint is not None
    assert reward_run.checkpoint.name == "step_000002"
    assert [m["step"] for m in reward_run.metrics("train")] == [1, 2]


@pytest.mark.slow
def test_evaluating_the_run_dir_matches_its_after_evaluation(reward_run):
    result = rldojo.evaluate(reward_run.run_dir, tasks=EVAL_ROWS, reward=even_length)
    assert result.accuracy == reward_run.accuracy_after
    # in this process the run's environment is registered: the run dir alone suffices
    assert rldojo.evaluate(reward_run.run_dir).rows == result.rows
    after = [json.loads(line) for line in (reward_run.run_dir / "evals" / "after.jsonl").open()]
    assert [(r["task_id"], r["passed"], r["status"]) for r in result.rows] == [
        (r["task_id"], r["passed"], r["status"]) for r in after
    ]


async def async_even_length(prompt, completion, answer, bad=False):
    await asyncio.sleep(0)
    return even_length(prompt, completion, answer, bad)


@pytest.mark.slow
def test_an_async_reward_on_any_iterable_of_rows_trains(tmp_path, capfd):
    rows = (dict(r) for r in TRAIN_ROWS)  # a generator: read once
    result = rldojo.train(tiny(tmp_path, steps=1), tasks=rows, reward=async_even_length)
    assert result.summary["statuses"] == {"ok/ok": 2, "ok/error": 2}
    assert result.accuracy_after is None  # no eval_tasks: no held-out evaluation
    assert capfd.readouterr().out == ""  # nothing printed without a console callback


@pytest.mark.slow
def test_several_weighted_reward_functions_train_and_are_recorded(tmp_path):
    sizes = []

    def answered(prompts, completions, answer):  # TRL's batched signature
        sizes.append(len(completions))
        return [float(a in c[0]["content"]) for a, c in zip(answer, completions, strict=True)]

    def even(prompt, completion):  # per sample; chat rows give messages
        return float(len(completion[0]["content"]) % 2 == 0)

    rows = [{"prompt": [{"role": "user", "content": f"{a} + 1 ="}], "answer": str(a + 1)}
            for a in range(2)]  # fmt: skip
    result = rldojo.train(tiny(tmp_path, steps=1), tasks=rows, reward=[answered, even],
                          reward_weights=[1.0, 0.5])  # fmt: skip
    assert result.summary["statuses"] == {"ok/ok": 4}
    assert sizes == [1, 1, 2, 2]  # the reference answers (one per task), then once per group
    (metrics,) = result.metrics("train")
    assert {"reward/component/answered", "reward/component/even",
            "reward/reward.answered.even-v1/mean"} <= metrics.keys()  # fmt: skip
    with sqlite3.connect(result.run_dir / "ledger.sqlite") as db:
        graded = db.execute("SELECT score_value, components FROM rollouts").fetchall()
    for value, components in graded:
        parts = json.loads(components)
        assert value == parts["answered"] + 0.5 * parts["even"]
    assert 'id = "reward.answered.even-v1"' in (result.run_dir / "config.toml").read_text()


@pytest.mark.slow
def test_a_datasets_dataset_trains(tmp_path):
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_list([{"prompt": "1 + 1 =", "answer": "2"}] * 2)
    result = rldojo.train(tiny(tmp_path, steps=1), tasks=data, reward=even_length)
    assert result.summary["statuses"] == {"ok/ok": 4}


def always_right(prompt, completion):
    """Every completion passes: no group is informative."""
    return 1.0


@pytest.mark.slow
def test_a_constant_reward_says_why_nothing_trains(tmp_path, caplog):
    """Without a callback the run still says why it trained nothing: a WARNING record of
    the `rldojo.run` logger (which Python prints on stderr when logging is unconfigured),
    `RunResult.diagnosis` and summary.json's `no_signal`; all-pass is "too easy", never
    the token limit that cut every completion."""
    caplog.set_level(logging.INFO, logger="rldojo")
    result = rldojo.train(tiny(tmp_path), tasks=TRAIN_ROWS, reward=always_right)
    assert (result.stopped, result.summary["rollouts_trained"]) == ("steps", 0)
    ((cause, steps, text),) = [(d.cause, d.steps, d.text) for d in result.diagnosis]
    assert (cause, steps) == ("too_easy", (1, 2))
    assert text.startswith("every completion passed (reward +1.00)")
    saved = json.loads((result.run_dir / "summary.json").read_text())
    assert saved["no_signal"] == [{"cause": "too_easy", "steps": [1, 2], "text": text}]
    ours = [r for r in caplog.records if r.name == "rldojo.run"]
    warned = [r.getMessage() for r in ours if r.levelno == logging.WARNING]
    # said at step 1; step 2 has the same cause (said again after EVERY such steps)
    assert warned == [f"no learning signal at step 1 (0 of 2 groups informative): {text}"]
    assert "max_new_tokens" not in warned[0]
    infos = [r.getMessage() for r in ours if r.levelno == logging.INFO]
    assert [m[:26] for m in infos if m.startswith("step")] == [
        "step   1 reward +1.00 pass",
        "step   2 reward +1.00 pass",
    ]
    assert infos[0].startswith("rldojo train tiny-random on reward.")  # the header, plain


@pytest.mark.slow
def test_a_callback_stops_the_run(tmp_path, caplog):
    from rich.console import Console

    from rldojo.training.callbacks import ConsoleCallback

    class StopAfter(rldojo.Callback):
        def __init__(self):
            self.steps = []

        def on_step_end(self, step, metrics):
            self.steps.append(step)

        def should_stop(self):
            return len(self.steps) >= 1

    stop = StopAfter()
    caplog.set_level(logging.INFO, logger="rldojo")
    printed = io.StringIO()
    console = ConsoleCallback(Console(file=printed, width=200))
    result = rldojo.train(tiny(tmp_path, steps=3), tasks=TRAIN_ROWS, reward=even_length,
                          callbacks=[stop, console])  # fmt: skip
    assert (stop.steps, result.stopped, result.summary["steps"]) == ([1], "callback", 1)
    assert result.checkpoint is not None and result.checkpoint.name == "step_000001"
    # a console prints the run as the CLI does, and the run logs nothing twice
    assert "step   1 reward" in printed.getvalue()
    assert "a callback asked to stop: stopping after step 1" in printed.getvalue()
    assert not [r for r in caplog.records if r.name == "rldojo.run"]


def test_a_task_list_is_kept_as_given():
    tasks = [Task(id="t", prompt="2 + 2 =", answer="4")]
    result = rldojo.evaluate(callable_policy(lambda m: "4"), "arith-v1", tasks=tasks)
    assert [r["task_id"] for r in result.rows] == ["t"]


@pytest.mark.slow
def test_sft_then_distill_from_python(tmp_path):
    demos = [
        {"messages": [{"role": "user", "content": f"{a} + 1 ="},
                      {"role": "assistant", "content": str(a + 1)}], "passed": True}
        for a in range(4)
    ]  # fmt: skip
    data = tmp_path / "demos.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in demos))
    base = {"model": {"name": "tiny-random", "autocast_bf16": False}, "eval": {"tasks": 0},
            "sampling": {"max_new_tokens": 4}, "rollout": {"prompts_per_step": 2}}  # fmt: skip
    run = {"threads": 1, "output_dir": str(tmp_path), "steps": 1}
    sft = rldojo.sft({**base, "run": {**run, "name": "sft"}}, data=data)
    assert sft.summary["demonstrations"] == 4 and sft.checkpoint is not None
    teacher = {
        "distill": {"teacher": str(sft.checkpoint), "batch_size": 2},
        "run": {**run, "name": "distill"},
    }
    distilled = rldojo.distill({**base, **teacher})
    assert distilled.stopped == "steps" and distilled.checkpoint is not None
    assert [m["kind"] for m in distilled.metrics()] == ["distill"]
