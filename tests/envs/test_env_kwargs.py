"""Kwargs models: each family's declared once (every field documented), the environment
built from the validated model, one-line errors naming the TOML key, listed by `rldojo envs
--kwargs`; factories with plain keyword arguments still work."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.envs import registry
from rldojo.envs.arith.env import ArithEnv, ArithKwargs
from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.crm.env import CrmEnv, CrmKwargs
from rldojo.envs.games.env import GameEnv, GameKwargs, TicTacToeEnv
from rldojo.envs.kwargs import EnvKwargs, EpisodeLimits, kwargs_model, takes_model
from rldojo.envs.multiturn import ToolEnv
from rldojo.envs.registry import EnvKwargsError, check_kwargs, make_env, register, resolve_factory

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUILTIN = ["arith-v1", "arith-tools-v1", "code-v1", "code-repair-v1", "connect4-v1", "crm-v1",
           "math-v1", "mcq-v1", "openenv-v1", "reasoning-gym-v1", "tictactoe-v1",
           "verifiers-v1", "web-crm-v1"]  # fmt: skip


@pytest.fixture
def clean_registry():
    registry.ENVS.load()
    saved = dict(registry.ENVS.plugins)
    yield
    registry.ENVS.plugins.clear()
    registry.ENVS.plugins.update(saved)


def _models(model: type[BaseModel]) -> list[type[BaseModel]]:
    out = [model]
    for info in model.model_fields.values():
        for arg in (info.annotation, *get_args(info.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out += _models(arg)
    return out


@pytest.mark.parametrize("env_id", BUILTIN)
def test_every_builtin_is_built_from_its_documented_model(env_id: str) -> None:
    factory = resolve_factory(env_id)
    model = kwargs_model(factory)
    assert model is not None and takes_model(factory, model)
    for m in _models(model):
        undocumented = [n for n, f in m.model_fields.items() if not f.description]
        assert undocumented == [], f"{m.__name__}: {undocumented}"


def test_the_env_receives_the_validated_model() -> None:
    env = make_env("crm-v1", levels=[2], db_size="small", reward={"turn_credit": 0.5})
    assert isinstance(env, CrmEnv) and isinstance(env.kwargs, CrmKwargs)
    assert env.kwargs.levels == (2,) and env.kwargs.db_size == "small"
    assert env.default_grader().reward is env.kwargs.reward  # the grader reads the same model
    assert env.kwargs.reward.turn_credit == 0.5 and env.kwargs.reward.w_state == 0.7
    assert env.fork().kwargs is env.kwargs


def test_python_keywords_are_validated_against_the_same_model() -> None:
    assert ArithEnv(levels=[2, 3]).kwargs == ArithEnv(ArithKwargs(levels=(2, 3))).kwargs
    with pytest.raises(EnvKwargsError, match=r"^env.kwargs.levls: arith-v1 takes no argument"):
        ArithEnv(levls=[1])
    with pytest.raises(EnvKwargsError, match=r"^env.kwargs.levels: arith-v1: levels must be"):
        ArithEnv(levels=[7])
    with pytest.raises(TypeError, match="takes a ArithKwargs or keywords"):
        ArithEnv(ArithKwargs(), levels=[1])
    with pytest.raises(TypeError, match="takes a ArithKwargs or keywords, got str"):
        ArithEnv("x.jsonl")  # type: ignore[arg-type]


class _PlainKwargs(EnvKwargs):
    words: int = 3
    """Words per sentence."""


class _PlainEnv(SingleTurnEnv):
    """A factory with a model but plain keyword arguments (the older way)."""

    env_id = "plain-v1"
    Kwargs = _PlainKwargs

    def __init__(self, words: int = 3) -> None:
        super().__init__()
        self.words = words


def test_a_factory_with_plain_keywords_gets_them_as_written(clean_registry) -> None:
    register("plain-v1", _PlainEnv)
    assert not takes_model(_PlainEnv, _PlainKwargs)
    assert make_env("plain-v1", words=5).words == 5  # type: ignore[attr-defined]
    with pytest.raises(EnvKwargsError, match="did you mean 'words'"):
        make_env("plain-v1", word=5)
    register("fn-v1", lambda words=1: _PlainEnv(words))
    assert make_env("fn-v1", words=2).words == 2  # type: ignore[attr-defined]


def test_a_tool_env_with_plain_keywords_keeps_its_own_limits_and_forks() -> None:
    class Scaffolded(ToolEnv):  # what `rldojo new-env --tools` writes
        env_id = "scaffolded-v1"
        default_limits = EpisodeLimits(max_turns=6)

        def __init__(self, items: int = 2, *, limits=None, **tool_env_kwargs) -> None:
            super().__init__(limits=limits, items=items, **tool_env_kwargs)
            self.items = items

    env = Scaffolded(items=3, limits={"max_wall_s": 9}, no_action="end")
    assert env.limits == EpisodeLimits(max_turns=6, max_wall_s=9)
    assert env.kwargs.no_action == "end" and kwargs_model(Scaffolded) is None
    child = env.fork()
    assert child.items == 3 and child.limits == env.limits and child.kwargs == env.kwargs
    with pytest.raises(EnvKwargsError, match=r"^env.kwargs.no_action: scaffolded-v1: expected"):
        Scaffolded(no_action="stop")


def test_a_class_model_describes_the_init_that_declares_it() -> None:
    assert kwargs_model(TicTacToeEnv) is GameKwargs  # inherited with GameEnv's __init__
    assert takes_model(TicTacToeEnv, GameKwargs)

    class Bigger(TicTacToeEnv):
        def __init__(self, board: int = 3, **kwargs: object) -> None:
            super().__init__(**kwargs)

    assert kwargs_model(Bigger) is None  # its own __init__: checked by signature
    check_kwargs("bigger-v1", Bigger, {"board": 4, "anything": 1})
    assert isinstance(Bigger(opponent_depth=2), GameEnv)


@pytest.mark.parametrize(
    ("env_id", "kwargs", "message"),
    [
        ("crm-v1", {"db_size": "huge"},
         "env.kwargs.db_size: crm-v1: expected 'small', 'default' or 'large', got 'huge'"),
        ("crm-v1", {"limits": {"max_turnz": 3}},
         "env.kwargs.limits.max_turnz: crm-v1's limits takes no argument 'max_turnz' (did you "
         "mean 'max_turns'?); it takes: max_turns, max_tokens, max_wall_s"),
        ("crm-v1", {"reward": {"collateral_penalty": "high"}},
         "env.kwargs.reward.collateral_penalty: crm-v1: expected a valid number, got 'high'"),
        ("crm-v1", {"levels": [1, "2"]},
         "env.kwargs.levels[1]: crm-v1: expected a valid integer, got '2'"),
        ("arith-tools-v1", {"python": "yes"},
         "env.kwargs.python: arith-tools-v1: expected 'auto', 'on' or 'off', got 'yes'"),
        ("tictactoe-v1", {"outcome_reward": {"wins": 1.0}},
         "env.kwargs.outcome_reward.wins: tictactoe-v1: expected 'win', 'draw', 'loss', "
         "'forfeit' or 'unfinished', got 'wins'"),
        ("math-v1", {"path": "x.jsonl", "test_fraction": "0.2"},
         "env.kwargs.test_fraction: math-v1: expected a valid number, got '0.2'"),
        ("math-v1", {}, "env.kwargs: math-v1: pass exactly one of path and hf_dataset"),
        ("mcq-v1", {"labels": "roman"},
         "env.kwargs.labels: mcq-v1: expected one of 'letters', 'numbers', 'paren', "
         "'bracketed', got 'roman'"),
        ("code-repair-v1", {"turn_cost": -0.5},
         "env.kwargs.turn_cost: code-repair-v1: expected a value greater than or equal to 0, "
         "got -0.5"),
    ],
)  # fmt: skip
def test_bad_kwargs_are_one_line_naming_the_key(env_id: str, kwargs: dict, message: str) -> None:
    with pytest.raises(EnvKwargsError) as info:
        make_env(env_id, **kwargs)
    assert str(info.value) == message


def test_an_unknown_key_lists_what_the_env_takes() -> None:
    with pytest.raises(EnvKwargsError) as info:
        make_env("arith-v1", levls=[1])
    assert str(info.value) == (
        "env.kwargs.levls: arith-v1 takes no argument 'levls' (did you mean 'levels'?); "
        "it takes: levels, system_prompt, answer_format, format_penalty, grader_timeout_s"
    )


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_the_examples_kwargs_pass_their_models(example: Path) -> None:
    env = tomllib.loads(example.read_text()).get("env", {})
    for entry in env.get("mix", []) or [env]:
        if "id" in entry:
            check_kwargs(entry["id"], resolve_factory(entry["id"]), entry.get("kwargs", {}))


@pytest.mark.slow
def test_train_dry_run_names_the_config_and_the_key(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[env]\nid = "crm-v1"\nkwargs = { db_size = "huge" }\n')
    result = runner.invoke(app, ["train", str(config), "--dry-run"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        f"error: {config}: env.kwargs.db_size: crm-v1: expected 'small', 'default' or "
        "'large', got 'huge'"
    )


def test_envs_kwargs_lists_the_model(monkeypatch, clean_registry) -> None:
    from rich.console import Console

    # a wide console whatever the process's terminal (a pytest-xdist worker has none)
    monkeypatch.setattr("rldojo.commands.ui.console", Console(width=250))
    result = runner.invoke(app, ["envs", "--kwargs", "crm-v1"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    row = next(x for x in result.output.splitlines() if "│ db_size" in x)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[:3] == ["db_size", "Literal['small', 'default', 'large']", '"default"']
    assert cells[3].startswith("Accounts per database")
    assert any("│ limits.max_turns" in x for x in result.output.splitlines())
    register("plain-fn-v1", lambda words=1: _PlainEnv(words))
    plain = runner.invoke(app, ["envs", "--kwargs", "plain-fn-v1"], env={"COLUMNS": "250"})
    assert plain.exit_code == 0 and "declares no Kwargs model" in plain.output
    assert any("│ words" in x and "│ 1" in x for x in plain.output.splitlines())
    unknown = runner.invoke(app, ["envs", "--kwargs", "crm-v9"])
    assert unknown.exit_code == 2 and "unknown environment 'crm-v9'" in unknown.output


OWN_LIMITS = {"web-crm-v1": 24, "crm-v1": 10, "arith-tools-v1": 6, "tictactoe-v1": 12,
              "connect4-v1": 30, "code-repair-v1": 3}  # fmt: skip
"""Each environment's own `max_turns` (docs/environments.md), the default of its model's
`limits`; its other limits are `EpisodeLimits`' defaults."""


@pytest.mark.parametrize(("env_id", "max_turns"), OWN_LIMITS.items())
def test_a_partial_limits_table_keeps_the_envs_other_limits(env_id: str, max_turns: int) -> None:
    quiet = {"python": "off"} if env_id == "arith-tools-v1" else {}  # no sandbox probe
    env = make_env(env_id, limits={"max_wall_s": 200}, **quiet)  # web-crm: no browser yet
    try:
        assert env.limits == EpisodeLimits(max_turns=max_turns, max_wall_s=200)
        assert env.fork().limits == env.limits
    finally:
        asyncio.run(env.close())
    whole = EpisodeLimits(max_turns=2, max_tokens=500, max_wall_s=9.0)
    assert make_env(env_id, limits=whole, **quiet).limits == whole  # given whole: as given
    assert make_env(env_id, **quiet).limits == EpisodeLimits(max_turns=max_turns)


@pytest.mark.parametrize(("env_id", "max_turns"), OWN_LIMITS.items())
def test_envs_kwargs_shows_the_envs_own_limits(env_id: str, max_turns: int) -> None:
    result = runner.invoke(app, ["envs", "--kwargs", env_id], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    cells = {}
    for line in result.output.splitlines():
        row = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(row) == 4 and row[0].startswith("limits"):
            cells[row[0]] = row[2]
    assert cells == {"limits": "", "limits.max_turns": str(max_turns),
                     "limits.max_tokens": "16384", "limits.max_wall_s": "300.0"}  # fmt: skip
