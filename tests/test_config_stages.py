"""One config dialect: every objective reads `[model]`, `[optim]`, `[eval]` and `[run]`;
`[sft.optim]` (and the like) set a shared key for one objective alone; the keys that moved
there answer with their new place."""

from __future__ import annotations

import tomllib

import pytest

from rldojo.config import ConfigError, TrainConfig, dump_config, load_config
from rldojo.config.stages import MOVED, for_objective


def test_an_objectives_table_sets_shared_keys_for_it_alone():
    cfg = load_config(None, ["optim.lr=2e-4", "model.lora.r=4", "sft.optim.lr=5e-5",
                             "sft.model.lora=none", "sft.run.epochs=3"])  # fmt: skip
    sft = for_objective(cfg, "sft")
    assert (sft.optim.lr, sft.model.lora, sft.run.epochs) == (5e-5, None, 3)
    assert sft.optim.warmup_steps == 2  # SFT's own default: the file sets none
    assert (cfg.optim.lr, cfg.model.lora.r, cfg.run.epochs) == (2e-4, 4, 2)  # train's
    distill = for_objective(cfg, "distill")  # [sft.*] is SFT's alone
    assert (distill.optim.lr, distill.model.lora.r, distill.optim.warmup_steps) == (2e-4, 4, 0)


def test_a_shared_key_the_file_sets_wins_over_the_objectives_default():
    sft = for_objective(load_config(None, ["optim.lr=3e-4", "optim.warmup_steps=0"]), "sft")
    assert (sft.optim.lr, sft.optim.warmup_steps) == (3e-4, 0)
    assert for_objective(load_config(None, []), "sft").optim.lr == 5e-5


def test_config_toml_keeps_only_the_keys_a_table_was_given():
    cfg = for_objective(load_config(None, ["sft.model.lora=none", "sft.optim.lr=1e-3",
                                           "model.lora.r=4"]), "sft")  # fmt: skip
    text = dump_config(cfg)
    data = tomllib.loads(text)
    assert data["sft"]["optim"] == {"lr": 1e-3} and data["sft"]["model"] == {"lora": "none"}
    back = TrainConfig.model_validate(data)
    assert back == cfg and for_objective(back, "sft") == cfg  # a resume reads the same run


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_key_is_one_line_naming_its_new_place(old):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{old}=1"])
    message = str(err.value)
    assert message == f"--set {old}: moved to {MOVED[old]}" and "\n" not in message


def test_an_unknown_key_in_an_objectives_table_names_the_closest():
    with pytest.raises(ConfigError, match=r"sft\.optim\.lrr: unknown key \(did you mean lr\?\)"):
        load_config(None, ["sft.optim.lrr=1"])
    with pytest.raises(ConfigError, match=r"sft\.run\.epochs: Input should be greater than 0"):
        load_config(None, ["sft.run.epochs=0"])
