"""Kwargs models: every field documented, in step with the factory, checked with one-line
errors naming the TOML key, listed by `rldojo envs --kwargs`."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import tomllib
from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.envs.arith_tools.env import ArithToolsKwargs
from rldojo.envs.arith_tools.grader import ArithToolsReward
from rldojo.envs.crm.data import DB_SIZES
from rldojo.envs.crm.env import CrmKwargs
from rldojo.envs.crm.grader import CrmReward
from rldojo.envs.games.env import GameKwargs, TicTacToeEnv
from rldojo.envs.kwargs import LimitsKwargs, ToolEnvKwargs, kwargs_model
from rldojo.envs.multiturn import EpisodeLimits, ToolEnv
from rldojo.envs.registry import EnvKwargsError, check_kwargs, make_env, resolve_factory

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MODELLED = ["arith-v1", "arith-tools-v1", "crm-v1", "math-v1", "tictactoe-v1", "connect4-v1"]


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def _models(model: type[BaseModel]) -> list[type[BaseModel]]:
    out = [model]
    for info in model.model_fields.values():
        for arg in (info.annotation, *get_args(info.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out += _models(arg)
    return out


@pytest.mark.parametrize("env_id", MODELLED)
def test_every_field_is_documented_and_matches_the_factory(env_id: str) -> None:
    factory = resolve_factory(env_id)
    model = kwargs_model(factory)
    assert model is not None
    for m in _models(model):
        undocumented = [n for n, f in m.model_fields.items() if not f.description]
        assert undocumented == [], f"{m.__name__}: {undocumented}"
    params = {
        n: p
        for n, p in inspect.signature(factory).parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    if issubclass(model, ToolEnvKwargs):  # the rest goes on to ToolEnv
        params |= {n: p for n, p in inspect.signature(ToolEnv).parameters.items() if n != "limits"
                   and p.kind is p.KEYWORD_ONLY}  # fmt: skip
    assert set(params) == set(model.model_fields)
    for name, param in params.items():
        assert _plain(param.default) == _plain(model.model_fields[name].default), name


@pytest.mark.parametrize(
    ("model", "source"),
    [
        (LimitsKwargs, EpisodeLimits),
        (CrmKwargs.model_fields["reward"].annotation, CrmReward),
        (ArithToolsKwargs.model_fields["reward"].annotation, ArithToolsReward),
    ],
)
def test_nested_tables_match_their_dataclasses(model: object, source: type) -> None:
    nested = next(a for a in (model, *get_args(model)) if isinstance(a, type))
    assert issubclass(nested, BaseModel)
    defaults = {f.name: f.default for f in dataclasses.fields(source)}
    assert defaults == {n: f.default for n, f in nested.model_fields.items()}


def test_choices_follow_the_code() -> None:
    assert set(get_args(CrmKwargs.model_fields["db_size"].annotation)) == set(DB_SIZES)


def test_a_class_model_describes_the_init_that_declares_it() -> None:
    assert kwargs_model(TicTacToeEnv) is GameKwargs  # inherited with GameEnv's __init__

    class Bigger(TicTacToeEnv):
        def __init__(self, board: int = 3, **kwargs: object) -> None:
            super().__init__(**kwargs)  # type: ignore[arg-type]

    assert kwargs_model(Bigger) is None  # its own __init__: checked by signature
    check_kwargs("bigger-v1", Bigger, {"board": 4, "anything": 1})


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


def test_envs_kwargs_lists_the_model(monkeypatch) -> None:
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
    plain = runner.invoke(app, ["envs", "--kwargs", "mcq-v1"], env={"COLUMNS": "250"})
    assert plain.exit_code == 0 and "declares no Kwargs model" in plain.output
    unknown = runner.invoke(app, ["envs", "--kwargs", "crm-v9"])
    assert unknown.exit_code == 2 and "unknown environment 'crm-v9'" in unknown.output


OWN_LIMITS = {"web-crm-v1": 24, "crm-v1": 10, "arith-tools-v1": 6, "tictactoe-v1": 12,
              "connect4-v1": 30}  # fmt: skip
"""Each environment's own `max_turns` (docs/environments.md); its other limits are
EpisodeLimits' defaults."""


@pytest.mark.parametrize(("env_id", "max_turns"), [*OWN_LIMITS.items(), ("code-repair-v1", 3)])
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
    assert cells == {"limits": "None", "limits.max_turns": str(max_turns),
                     "limits.max_tokens": "16384", "limits.max_wall_s": "300.0"}  # fmt: skip
