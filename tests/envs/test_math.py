"""math-v1: tasks from JSONL/Parquet, seeded splits, and one-line errors for bad rows."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rldojo.data.loading import DataError
from rldojo.envs.math.env import MATH_INSTRUCTION, MathEnv, reference_answer
from rldojo.envs.registry import make_env
from rldojo.types import Rollout

ROWS = [{"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(40)]


def _write_jsonl(path: Path, rows: list[dict] | list[str]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_tasks(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "m.jsonl", ROWS)
    env = make_env("math-v1", path=str(path), test_fraction=0.25)
    train, test = env.tasks("train"), env.tasks("test")
    assert len(train) + len(test) == 40
    assert 3 <= len(test) <= 20
    assert {t.id for t in train}.isdisjoint({t.id for t in test})
    task = next(t for t in train + test if t.id == "math-v1/p3")
    assert task.answer == "6" and task.env == "math-v1"
    assert task.prompt == f"What is 3 + 3?\n{MATH_INSTRUCTION}"
    assert task.info["source"] == f"{path}:4"
    assert env.tasks("train", seed=1) == env.tasks("train", seed=1)
    assert env.tasks("train", seed=1) != env.tasks("train", seed=2)  # seeded order
    assert {t.id for t in env.tasks("train", seed=2)} == {t.id for t in train}  # same split
    assert env.tasks("train", seed=1, n=5) == env.tasks("train", seed=1)[:5]


def test_parquet_and_separate_test_file(tmp_path: Path) -> None:
    path = tmp_path / "m.parquet"
    pq.write_table(
        pa.table({"question": ["1+1?", "2+2?"], "solution": ["So \\boxed{2}.", "#### 4"]}), path
    )
    test_path = _write_jsonl(tmp_path / "t.jsonl", [{"prompt": "3+3?", "answer": 6}])
    env = MathEnv(path=path, test_path=test_path)
    train = sorted(env.tasks("train"), key=lambda t: t.id)
    assert [(t.id, t.answer) for t in train] == [
        ("math-v1/m.parquet:1", "2"),
        ("math-v1/m.parquet:2", "4"),
    ]
    assert train[0].info["solution"] == "So \\boxed{2}."
    [test] = env.tasks("test")
    assert (test.id, test.answer) == ("math-v1/t.jsonl:1", "6")  # numbers become strings


def test_custom_fields(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "c.jsonl", [{"q": "Half of 1?", "gold": "\\frac{1}{2}"}])
    env = MathEnv(path=path, prompt_field="q", answer_field="gold", test_fraction=0.0)
    [task] = env.tasks("train")
    assert task.answer == "\\frac{1}{2}"
    with pytest.raises(DataError, match=r"c\.jsonl:1: field 'answer': missing$"):
        MathEnv(path=path, prompt_field="q", answer_field="answer")


def test_reference_answer() -> None:
    assert reference_answer("We get \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert reference_answer("She has 3 + 4 = 7 left.\n#### 1,234") == "1234"
    assert reference_answer(" 42 ") == "42"


@pytest.mark.parametrize(
    ("lines", "pattern"),
    [
        (
            [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}, '{"prompt": "c", '],
            r"bad\.jsonl:3: malformed JSON: .*",
        ),
        (
            [{"prompt": "a", "answer": "1"}, {"prompt": "b"}],
            r"bad\.jsonl:2: field 'answer\|solution': missing",
        ),
        ([{"prompt": 7, "answer": "1"}], r"bad\.jsonl:1: field 'prompt': expected str, got int"),
        (
            [{"prompt": "a", "answer": ["1"]}],
            r"bad\.jsonl:1: field 'answer': expected str or int or float, got list",
        ),
        ([{"prompt": "a", "answer": True}], r"bad\.jsonl:1: field 'answer': expected .*got bool"),
        (
            [{"prompt": "  ", "answer": "1"}],
            r"bad\.jsonl:1: field 'prompt\|problem\|question': empty",
        ),
        (
            [{"id": "x", "prompt": "a", "answer": "1"}, {"id": "x", "prompt": "b", "answer": "2"}],
            r"bad\.jsonl:2: field 'id': duplicate id 'x' \(first on line 1\)",
        ),
        ([], r"bad\.jsonl: no rows"),
    ],
)
def test_bad_rows_give_one_line_errors(tmp_path: Path, lines: list, pattern: str) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", lines)
    with pytest.raises(DataError) as info:
        MathEnv(path=path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert re.fullmatch(f".*{pattern}", message), message


def test_bad_parquet_row_names_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "c"], "answer": ["1", None, "3"]}), path)
    with pytest.raises(DataError, match=r"bad\.parquet:2: field 'answer\|solution': missing$"):
        MathEnv(path=path)


def test_bad_arguments(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "m.jsonl", ROWS[:3])
    with pytest.raises(ValueError, match="exactly one"):
        MathEnv()
    with pytest.raises(ValueError, match="test_fraction"):
        MathEnv(path=path, test_fraction=1.0)
    with pytest.raises(ValueError, match="split"):
        MathEnv(path=path).tasks("dev")


def test_a_missing_file_is_one_data_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataError) as info:
        make_env("math-v1", path=str(missing))
    assert str(info.value) == f"{missing}: no such file"
    with pytest.raises(DataError, match=r"nope-test\.jsonl: no such file$"):
        MathEnv(
            path=_write_jsonl(tmp_path / "m.jsonl", ROWS[:3]),
            test_path=tmp_path / "nope-test.jsonl",
        )


def test_a_rejected_argument_names_the_env_once(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "m.jsonl", ROWS[:3])
    with pytest.raises(ValueError) as info:
        make_env("math-v1", path=str(path), test_fraction=1.5)
    assert str(info.value) == (
        "env.kwargs.test_fraction: math-v1: expected a value less than 1, got 1.5"
    )


def test_hf_dataset_without_datasets_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ImportError, match="needs the 'datasets' package"):
        MathEnv(hf_dataset=("openai/gsm8k", "main", "test"))


def test_hf_dataset_is_loaded_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return [{"question": "1+1?", "answer": "So 2.\n#### 2"}, {"question": "2+2?"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(DataError, match=r"^hf:gsm8k/main\[test\]:2: field 'answer\|solution'"):
        MathEnv(hf_dataset=("gsm8k", "main", "test"))
    assert calls == [("gsm8k", "main", "test")]


@pytest.mark.slow  # a math-verify worker process
def test_default_grader_uses_math_verify(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "f.jsonl", [{"prompt": "Half of 1?", "answer": "\\frac{1}{2}"}])
    env = MathEnv(path=path, test_fraction=0.0)
    [task] = env.tasks("train")
    grader = env.default_grader()

    async def grade(text: str) -> tuple[str, float | None]:
        rollout = Rollout(task_id=task.id, env=env.env_id, messages=[], completion=text)
        score = await grader.grade(rollout, task)
        return score.status, score.value

    assert asyncio.run(grade("It is one half.\nAnswer: 0.5")) == ("ok", 1.0)
    assert asyncio.run(grade("Answer: $\\frac{1}{3}$")) == ("ok", 0.0)
    assert asyncio.run(grade("\\boxed{2/4}")) == ("ok", 0.5)
