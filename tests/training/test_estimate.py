"""The dry run's calibrated estimate (`rldojo.training.estimate`) and its reasoning-budget
warning (`rldojo.training.dry_run.reasoning_warnings`), on tiny-random. Timings are never
asserted: what is checked is what the estimate is made of and how it scales."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
import torch
from rich.console import Console
from tiny_config import tiny_overrides

from rldojo.config import load_config
from rldojo.policy.models import load_model
from rldojo.training.dry_run import REASONING_MIN_TOKENS, dry_run, reasoning_warnings
from rldojo.training.estimate import PLAYED_EPISODES, Calibration, StepCost, calibrate
from rldojo.training.inputs import build_mixture
from rldojo.training.plan import make_plan

TINY = tiny_overrides(
    "model.generation_dtype=float32", "sampling.max_new_tokens=6", "optim.micro_batch_size=2",
    "env.train_tasks=4", "eval.tasks=2", "run.threads=1", drop=["rollout.dynamic_sampling"],
)  # fmt: skip
CAL = Calibration(batch=4, prompt_tokens=50, prefill_s=1.0, decode_token_s=0.1,
                  micro_rows=2, micro_new=6, micro_batch_s=2.0, took_s=3.0)  # fmt: skip


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # `run.threads` sets them for the whole process
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # loads tiny-random
def test_calibration_runs_the_real_sampler_and_update_and_moves_no_weight():
    config = load_config(None, TINY)
    mixture = build_mixture(config)
    model, tokenizer = load_model("tiny-random")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cal = calibrate(config, mixture, model, tokenizer, torch.float32)
    assert cal is not None
    assert (cal.batch, cal.micro_rows) == (4, 2)  # 2 prompts x 2 samples; micro-batch of 2
    assert cal.prompt_tokens > 10 and cal.decode_token_s > 0 and cal.micro_batch_s > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # lr 0
    assert "calibrated here" in cal.describe()
    vllm = load_config(None, [*TINY, "generation.backend=vllm"])
    assert calibrate(vllm, mixture, model, tokenizer, torch.float32) is None  # probe instead


def test_the_step_price_follows_the_configs_shape():
    def cost(*sets: str) -> StepCost:
        return StepCost(CAL, load_config(None, [*TINY, *sets]), prompt=50)

    base = cost()
    # 4 samples in one wave: prefill (whole prompt at the calibrated rate) + 5 more tokens
    assert base.generate_s(4, 6, 1) == pytest.approx(1.0 + 5 * 0.1)
    assert base.generate_s(8, 6, 1) == pytest.approx(2 * (1.0 + 5 * 0.1))  # two waves
    assert base.train_s(1) == pytest.approx(4 / 2 * 2.0)  # two micro-batches of 2 rows
    assert base.step_s(1) == pytest.approx(base.generate_s(4, 6, 1) + base.train_s(1))
    assert cost("optim.epochs=2").train_s(1) > 2 * base.train_s(1)  # + the pi_old pass
    assert cost("loss.kl_coef=0.1").train_s(1) > base.train_s(1)  # the reference forward
    longer = cost("sampling.max_new_tokens=60")
    assert longer.step_s(1) > 2 * base.step_s(1)
    assert base.step_s(3) > base.step_s(1) and base.train_s(3) > base.train_s(1)


@pytest.mark.slow  # loads tiny-random
def test_a_calibrated_plan_says_so_and_the_probe_plan_stays_as_it_was():
    config = load_config(None, TINY)
    mixture = build_mixture(config)
    model, tokenizer = load_model("tiny-random")
    probe = make_plan(config, mixture, model, tokenizer, gflops=10.0)
    assert "matmul probe 10 GFLOP/s" in probe.lines()[-1] and probe.basis == ""
    calibrated = make_plan(config, mixture, model, tokenizer, 10.0, CAL)
    assert calibrated.lines()[3].startswith("estimate (calibrated here in 3 s")
    assert calibrated.step_s == pytest.approx(
        StepCost(CAL, config, calibrated.prompt_tokens).step_s(1)
    )
    assert replace(calibrated, step_s=1.0).total_s < calibrated.total_s


def test_reasoning_prompts_with_a_small_budget_are_warned_about():
    def warnings(*sets: str) -> list[str]:
        config = load_config(None, [*TINY, *sets])
        return reasoning_warnings(config, build_mixture(config))

    think = ["env.id=mcq-v1", "env.kwargs.instruction=think"]  # "Think step by step, ..."
    (line,) = warnings(*think)
    assert line == (
        "warning: env mcq-v1: the prompt asks for reasoning ('Think') but "
        "sampling.max_new_tokens = 6 (< 128): most completions will be cut before their "
        "answer; raise it"
    )
    assert warnings(*think, f"sampling.max_new_tokens={REASONING_MIN_TOKENS}") == []
    assert warnings("env.id=mcq-v1") == []  # "Choose the correct option. ..."
    assert warnings("env.id=arith-v1") == []  # "Solve the problem. ..."


@pytest.mark.slow  # loads tiny-random
def test_the_dry_run_prints_the_calibrated_estimate_and_the_warning(tmp_path):
    printed = io.StringIO()
    sets = ["env.id=mcq-v1", "env.kwargs.instruction=think", f"run.output_dir={tmp_path}"]
    plan = dry_run(load_config(None, [*TINY, *sets]), Console(file=printed, width=300))
    out = printed.getvalue()
    assert plan.basis.startswith("calibrated here") and plan.step_s > 0
    assert "estimate (calibrated here in" in out
    assert "warning: env mcq-v1: the prompt asks for reasoning" in out
    assert out.rstrip().endswith("dry run: nothing was written")
    assert not any(tmp_path.iterdir())


@pytest.mark.slow  # loads tiny-random, plays episodes
def test_the_plan_prices_the_turns_the_calibration_episodes_took():
    model, tokenizer = load_model("tiny-random")

    def plan(*sets: str):
        config = load_config(None, [*TINY, *sets])
        mixture = build_mixture(config)
        cal = calibrate(config, mixture, model, tokenizer, torch.float32)
        assert cal is not None
        return cal, make_plan(config, mixture, model, tokenizer, 10.0, cal)

    # a random model never calls a tool nor answers: each turn is nudged, to the last
    tools = ["env.id=arith-tools-v1", "env.kwargs.python=off", "rollout.max_turns=3"]
    cal, nudged = plan(*tools)
    assert cal.played_turns == (3,) * PLAYED_EPISODES
    assert (nudged.turns, nudged.mean_turns) == (3, 3.0)
    assert nudged.step_s == nudged.all_turns_step_s > nudged.one_turn_step_s
    # ... or ends the episode after its first move
    cal, ended = plan(*tools, "env.kwargs.no_action=end")
    assert cal.played_turns == (1,) * PLAYED_EPISODES
    assert (ended.turns, ended.mean_turns) == (3, 1.0)
    assert ended.step_s == ended.one_turn_step_s < ended.all_turns_step_s
    assert ended.eval_s == ended.one_turn_eval_s < ended.all_turns_eval_s
    assert f"episodes of 1 turn, the mean of {PLAYED_EPISODES} played here" in ended.lines()[3]
    assert ended.load == cal.load >= 0 and ended.cores == cal.cores >= 1
    assert f"calibrated at load {cal.load:.1f} on {cal.cores} core" in ended.lines()[-1]
    single, _ = plan("env.id=arith-v1")  # answers once: nothing to play
    assert single.played_turns == ()


@pytest.mark.slow  # loads tiny-random
def test_a_step_is_priced_at_the_mean_turn_count_and_the_load_is_reported():
    config = load_config(None, [*TINY, "env.id=arith-tools-v1", "env.kwargs.python=off",
                                "rollout.max_turns=4"])  # fmt: skip
    mixture = build_mixture(config)
    model, tokenizer = load_model("tiny-random")
    cal = replace(CAL, played_turns=(1, 2, 2, 3), load=3.2, cores=2)
    plan = make_plan(config, mixture, model, tokenizer, 10.0, cal)
    cost = StepCost(cal, config, plan.prompt_tokens)
    assert plan.mean_turns == 2.0 and plan.step_s == pytest.approx(cost.step_s(2))
    assert plan.all_turns_step_s == pytest.approx(cost.step_s(4))
    halves = make_plan(config, mixture, model, tokenizer, 10.0, replace(cal, played_turns=(1, 2)))
    assert halves.step_s == pytest.approx((cost.step_s(1) + cost.step_s(2)) / 2)
    assert "episodes of 1.5 turns, the mean of 2 played here" in halves.lines()[3]
    assert halves.lines()[-1] == (
        "load: calibrated at load 3.2 on 2 cores, more than the cores: the estimate is for "
        "that load (an idle machine is faster, a busier one slower)"
    )
    quiet = make_plan(config, mixture, model, tokenizer, 10.0, replace(cal, load=0.5))
    assert quiet.lines()[-1] == (
        "load: calibrated at load 0.5 on 2 cores: expect slower steps if the load grows"
    )
