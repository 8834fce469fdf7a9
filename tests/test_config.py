"""Config loading: defaults, TOML, --set overrides, one-line errors naming file and key."""

from __future__ import annotations

import pytest

from rldojo.config import ConfigError, apply_overrides, dump_config, load_config


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
        ("", ["optim.lr=-1"], "c.toml + --set: optim.lr: Input should be greater than 0"),
        ("", ["loss.scope=everything"], "c.toml + --set: loss.scope: Input should be"),
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


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["loss.rho"])
