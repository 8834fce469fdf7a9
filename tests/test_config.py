"""Config loading: defaults, TOML, --set overrides, one-line errors naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rldojo.config import (
    ConfigError,
    TrainConfig,
    apply_overrides,
    dump_config,
    load_config,
)


def test_defaults_are_the_quickstart():
    cfg = load_config()
    assert cfg.model.name == "smollm2-135m-instruct"
    assert cfg.env.id == "arith-v1"
    assert cfg.loss.rho == 0.2
    assert (cfg.loss.eps_low, cfg.loss.eps_high) == (0.2, 0.28)
    assert cfg.loss.kl_coef == 0.0


def test_toml_and_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[loss]\nrho = 0.5\n[env]\nid = "math-v1"\nkwargs = {path = "x.jsonl"}\n')
    cfg = load_config(path, ["loss.rho=1.0", "run.name=abc", 'sampling.stop=["\\n\\n"]'])
    assert cfg.loss.rho == 1.0
    assert cfg.run.name == "abc"
    assert cfg.env.kwargs == {"path": "x.jsonl"}
    assert cfg.sampling.stop == ["\n\n"]


def test_round_trip_through_dump(tmp_path):
    cfg = load_config(None, ["loss.rho=0.3", "env.kwargs={levels=[1, 2]}"])
    path = tmp_path / "dumped.toml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg


@pytest.mark.parametrize(
    ("text", "overrides", "expected"),
    [
        ("[loss]\nrho = 1.5\n", [], "c.toml: loss.rho: Input should be less than or equal to 1"),
        ("[loss]\nrhoo = 0.2\n", [], "c.toml: loss.rhoo: unknown key"),
        ("[loss\n", [], "c.toml: invalid TOML"),
        ("", ["optim.lr=-1"], "--set optim.lr: Input should be greater than 0"),
        ("", ["loss.scope=everything"], "--set loss.scope: Input should be"),
        ("[loss]\neps_low = 1.0\n", [], "c.toml: loss.eps_low: Input should be less than 1"),
        ("", ["loss.dual_clip=1.0"], "--set loss.dual_clip: Input should be greater"),
        ("", ["optim.mini_batches=0"], "--set optim.mini_batches: Input should be"),
    ],
)
def test_errors_are_one_line_and_name_the_key(tmp_path, text, overrides, expected):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(tmp_path)) or expected.split(":")[0] in message
    assert expected.split(": ", 1)[1].split(":")[0] in message


@pytest.mark.parametrize(
    ("text", "overrides", "expected"),
    [
        ("[rollout]\ngroup_sise = 4\n", [],
         "c.toml: rollout.group_sise: unknown key (did you mean group_size?)"),
        ("", ["rollout.group_sise=4"],  # --set gave the key: no file is blamed
         "--set rollout.group_sise: unknown key (did you mean group_size?)"),
        ("[rolout]\n", [], "c.toml: rolout: unknown key (did you mean rollout?)"),
        ("[model]\nlora = { rr = 4 }\n", [],
         "c.toml: model.lora.rr: unknown key (did you mean r?)"),
        ('[env]\nmix = [{ id = "arith-v1", kwarg = {} }]\n', [],
         "c.toml: env.mix.0.kwarg: unknown key (did you mean kwargs?)"),
        ("[loss]\nzzzz = 1\n", [], "c.toml: loss.zzzz: unknown key"),  # nothing close
    ],
)  # fmt: skip
def test_unknown_keys_name_the_closest_key_of_their_section(tmp_path, text, overrides, expected):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    assert str(info.value) == (expected if overrides else f"{tmp_path}/{expected}")


def test_an_error_names_where_its_value_came_from():
    """An override that set the key (or a table above or below it) is blamed, not the file."""
    from rldojo.config import blame

    assert blame("loss.rho: too big", "c.toml", ["optim.lr=1"]) == "c.toml: loss.rho: too big"
    assert blame("loss.rho: too big", "c.toml", ["loss.rho=2"]) == "--set loss.rho: too big"
    assert blame("env.kwargs.levls: no", "c.toml", ["env.kwargs={levls=1}"]) == (
        "--set env.kwargs.levls: no")  # fmt: skip
    assert blame("env.kwargs: arith-v1: bad", None, ["env.kwargs.levels=[9]"]) == (
        "--set env.kwargs: arith-v1: bad")  # fmt: skip
    assert blame("env.mix.1.id: unknown", "c.toml", ["env.mix[1].id=x"]) == (
        "--set env.mix.1.id: unknown")  # fmt: skip
    assert blame("env.id: unknown", None, []) == "defaults: env.id: unknown"
    # a message that names no key of the config: the file, and the overrides if any
    assert blame("unknown environment 'x'", None, ["run.steps=1"]) == (
        "defaults + --set: unknown environment 'x'")  # fmt: skip
    assert blame("neither: a key", "c.toml", []) == "c.toml: neither: a key"


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["loss.rho"])


# Training configs among the examples (the others are grader specs, not configs).
EXAMPLES = sorted(
    p
    for p in (Path(__file__).parent.parent / "examples").glob("*.toml")
    if "[model]" in p.read_text() or "[env]" in p.read_text()
)

PYTHON_GRADER = """def grade(sample, item) -> float:
    text = sample["output_text"]  # "quotes", 'single', \\backslash, unicode: é ✓
    return 1.0 if text.strip().endswith(item["answer"]) else 0.0
"""


def test_every_field_type_round_trips_through_the_written_toml(tmp_path):
    """Multi-line strings, quotes, unicode, inline tables, arrays of tables, tuples, None."""
    table = {"type": "python", "name": "ends_with", "source": PYTHON_GRADER, "timeout_s": 5}
    cfg = TrainConfig.model_validate({
        "grader": {"spec": table},
        "env": {"mix": [{"id": "arith-v1", "weight": 0.5, "kwargs": {"levels": [1, 2]}},
                        {"id": "math-v1", "kwargs": {"path": "données/ü.jsonl"}}]},
        "sampling": {"stop": ["\n\n", 'say "stop"', "\\end"]},
        "optim": {"betas": [0.8, 0.95]},
        "run": {"name": "naïve run ✓", "threads": None},
    })  # fmt: skip
    path = tmp_path / "config.toml"
    path.write_text(dump_config(cfg))
    again = load_config(path)
    assert again == cfg
    assert again.grader.spec["source"] == PYTHON_GRADER


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_config_round_trips(tmp_path, example):
    cfg = load_config(example)
    path = tmp_path / "config.toml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[optim]\nlr = "1e-5"\n', "optim.lr"),
        ("[run]\nsteps = 2.5\n", "run.steps"),
        ("[rollout]\ndynamic_sampling = 1\n", "rollout.dynamic_sampling"),
        ('[optim]\nbetas = ["0.9", 0.99]\n', "optim.betas.0"),
    ],
)
def test_values_of_the_wrong_type_are_errors_not_coerced(tmp_path, text, key):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(path)


def test_integers_are_valid_floats_and_arrays_valid_tuples(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[optim]\nlr = 1\nbetas = [0.8, 1]\n")
    cfg = load_config(path)
    assert cfg.optim.lr == 1.0 and cfg.optim.betas == (0.8, 1.0)


def _config_models() -> list[type]:
    """Every pydantic model reachable from `TrainConfig` (sections and their items)."""
    import typing

    from pydantic import BaseModel

    from rldojo.config import TrainConfig

    found: list[type] = []
    todo: list[type] = [TrainConfig]
    while todo:
        model = todo.pop()
        if model in found:
            continue
        found.append(model)
        for field in model.model_fields.values():
            stack = [field.annotation]
            while stack:
                tp = stack.pop()
                if isinstance(tp, type) and issubclass(tp, BaseModel):
                    todo.append(tp)
                stack.extend(typing.get_args(tp))
    return found


def test_every_config_field_has_a_docstring():
    """The README says every key is documented where it is defined: walk the models and
    read the string literal after each field in the source (pydantic's
    `use_attribute_docstrings` reads the same thing)."""
    import ast
    import inspect

    missing = []
    models = _config_models()
    assert len(models) >= 12  # the sections, EnvMixEntry included
    for model in models:
        tree = ast.parse(inspect.getsource(model))
        body = tree.body[0].body  # type: ignore[attr-defined]
        documented = {
            st.target.id
            for st, nxt in zip(body, [*body[1:], None], strict=True)
            if isinstance(st, ast.AnnAssign)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
            and nxt.value.value.strip()
        }
        missing += [f"{model.__name__}.{f}" for f in model.model_fields if f not in documented]
    assert missing == []


# --- None from TOML: the string "none" for a key whose type admits None ---------------


@pytest.mark.parametrize("text", ['"none"', '"None"', '"NONE"'])
def test_none_text_in_a_toml_file_is_none_for_a_key_that_admits_none(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(f"[loss]\ntis_cap = {text}\n[model]\nlora = {text}\n")
    cfg = load_config(path)
    assert cfg.loss.tis_cap is None  # its default is 2.0
    assert cfg.model.lora is None
    assert load_config().loss.tis_cap == 2.0


def test_none_from_set(tmp_path):
    assert load_config(None, ["loss.tis_cap=none"]).loss.tis_cap is None
    assert load_config(None, ["loss.tis_cap=None"]).loss.tis_cap is None
    assert load_config(None, ['loss.tis_cap="none"']).loss.tis_cap is None
    # a string key keeps the word: only a key whose type admits None takes it as None
    assert load_config(None, ["run.output_dir=none"]).run.output_dir == "none"


def test_a_key_turned_off_stays_off_through_dump_config(tmp_path):
    cfg = load_config(None, ["loss.tis_cap=none", "loss.dual_clip=3.0"])
    text = dump_config(cfg)
    assert 'tis_cap = "none"' in text  # default 2.0: leaving it out would turn it back on
    assert "name =" not in text.split("[run]", 1)[1]  # run.name: None is its default
    path = tmp_path / "config.toml"
    path.write_text(text)
    again = load_config(path)
    assert again == cfg and again.loss.tis_cap is None and again.loss.dual_clip == 3.0


@pytest.mark.parametrize(("text", "overrides"), [("[loss]\nrho = \"none\"\n", []),
                                                 ("", ["loss.rho=none"])])  # fmt: skip
def test_none_for_a_key_that_does_not_admit_none_is_a_one_line_error(tmp_path, text, overrides):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("--set loss.rho: " if overrides else f"{path}: loss.rho: ")
    assert "loss.rho: Input should be a valid number" in message
    assert "'none' is None only for a key whose type admits None" in message


# --- recipes: named defaults under the config's own keys -------------------------------


def test_a_recipe_fills_in_under_the_explicit_keys(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('recipe = "dapo"\n[loss]\nrho = 0.5\n')
    cfg = load_config(path)
    assert cfg.recipe == "dapo"
    assert cfg.loss.rho == 0.5  # explicit wins over the recipe's 1.0
    assert (cfg.loss.eps_high, cfg.optim.mini_batches) == (0.28, 4)  # the recipe's
    assert cfg.loss.tis_cap == 2.0  # neither: the field's default
    assert load_config(path, ["optim.mini_batches=2"]).optim.mini_batches == 2
    by_set = load_config(None, ["recipe=dr_grpo", "loss.eps_high=0.3"])
    assert by_set.recipe == "dr_grpo" and by_set.loss.scale_adv_by_std is False
    assert (by_set.loss.rho, by_set.loss.eps_high) == (1.0, 0.3)
    assert by_set.rollout.dynamic_sampling is False


def test_a_recipe_applies_to_configs_built_in_code():
    from rldojo.config import LossConfig

    cfg = TrainConfig(recipe="dapo", loss=LossConfig(rho=0.3))
    assert (cfg.loss.rho, cfg.loss.eps_high, cfg.optim.mini_batches) == (0.3, 0.28, 4)
    assert TrainConfig(recipe="grpo") == TrainConfig().model_copy(update={"recipe": "grpo"})


def test_every_recipe_sets_existing_keys_and_is_recorded_through_dump(tmp_path):
    import typing

    from rldojo.config.recipes import RECIPES, RecipeName

    assert tuple(RECIPES) == typing.get_args(RecipeName)
    for name, values in RECIPES.items():
        cfg = load_config(None, [f"recipe={name}"])
        for dotted, value in values.items():
            section, key = dotted.split(".")
            assert getattr(getattr(cfg, section), key) == value, (name, dotted)
        path = tmp_path / f"{name}.toml"
        path.write_text(dump_config(cfg))
        assert load_config(path) == cfg and load_config(path).recipe == name


def test_the_paper_example_is_the_paper_recipe():
    example = Path(__file__).parent.parent / "examples" / "paper_dapo.toml"
    cfg = load_config(example)
    assert cfg.recipe == "paper"
    assert (cfg.loss.rho, cfg.loss.scope, cfg.loss.entropy_source) == (0.2, "batch", "sampler")
    assert (cfg.loss.eps_low, cfg.loss.eps_high, cfg.loss.kl_coef) == (0.2, 0.28, 0.0)
    assert (cfg.optim.mini_batches, cfg.optim.epochs, cfg.sampling.temperature) == (4, 1, 1.0)
    assert (cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.run.steps) == (8, 8, 12)


def test_an_unknown_recipe_is_a_one_line_error_naming_the_valid_ones(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('recipe = "dappo"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: recipe: Input should be 'grpo', 'dapo', 'dr_grpo' or 'paper'"
    )


def test_describe_recipe_lists_its_values_and_the_explicit_keys():
    from rldojo.config.recipes import describe_recipe

    assert describe_recipe(load_config()) == []
    lines = describe_recipe(load_config(None, ["recipe=dapo", "loss.rho=0.5"]))
    assert lines[0] == "recipe dapo: loss.rho=1.0 (explicit: loss.rho=0.5)"
    assert "recipe dapo: loss.eps_high=0.28" in lines
    assert 'recipe dapo: loss.normaliser="selected"' in lines
    assert sum("explicit" in line for line in lines) == 1
    assert describe_recipe(load_config(None, ["recipe=grpo"])) == [
        "recipe grpo: the field defaults (it sets no key)"
    ]


@pytest.mark.parametrize(
    ("overrides", "binds"),
    [
        ([], False),  # one step per batch, no generation ahead: the ratio is exactly 1
        (["loss.dual_clip=3.0"], False),
        (["optim.mini_batches=2"], True),
        (["optim.epochs=2"], True),
        (["rollout.max_policy_lag=1"], True),  # stale rows: the ratio to the sampler's
        (["recipe=dapo"], True),
        (["recipe=dr_grpo"], False),
    ],
)
def test_clip_note_says_when_the_clips_cannot_act(overrides, binds):
    from rldojo.config.recipes import clip_note

    note = clip_note(load_config(None, overrides))
    assert (note is None) == binds
    if note is not None:
        assert "\n" not in note and "loss.eps_high=" in note and "cannot act" in note
        assert ("loss.dual_clip=3" in note) == ("loss.dual_clip=3.0" in overrides)
