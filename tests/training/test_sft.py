"""SFT on demonstrations: the assistant-only mask token by token on a real multi-turn tool
episode, malformed tool calls as observations the policy corrects (and their metrics),
SFT lowering the loss on its demonstrations, and the command's one-line errors."""

from __future__ import annotations

import asyncio
import io
import json
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.config import load_config
from rldojo.envs.registry import make_env
from rldojo.rollout.episodes import collect_rollouts, grade_rollouts
from rldojo.rollout.replay import ScriptedPolicy, conversation_rollout, split_conversation
from rldojo.training.sft import assistant_turn_tokens, read_demos, run_sft, sft_schedule
from rldojo.training.step_metrics import info_metrics
from rldojo.types import SamplingParams

pytestmark = pytest.mark.slow  # loads tiny-random or starts the CLI

CALL = '<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'


def _expression(task) -> str:
    return task.prompt.removeprefix("What is ").rstrip("?")  # "What is A * B?"


def _task():
    env = make_env("arith-tools-v1", levels=[1], python="off")
    return env, env.tasks("train", seed=0, n=1)[0]


def _turns(task) -> list[str]:
    """Bad JSON, an unknown tool, a wrongly typed argument, the right call, the answer."""
    expression = _expression(task)
    return [
        '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>',
        CALL.format(name="abacus", args=json.dumps({"expression": expression})),
        CALL.format(name="calculator", args=json.dumps({"expression": [expression]})),
        CALL.format(name="calculator", args=json.dumps({"expression": expression})),
        f"<answer>{task.answer}</answer>",
    ]


def _episode(tiny):
    """The five scripted turns played in the real arith-tools-v1 through the engine."""
    env, task = _task()
    policy = ScriptedPolicy(tiny[1], _turns(task))
    (rollout,) = asyncio.run(
        collect_rollouts(lambda: env, policy, [(task, 0, 0)], SamplingParams(8), max_turns=8)
    )
    return env, task, rollout


def test_malformed_calls_are_observations_the_policy_corrects_and_step_metrics(tiny):
    env, task, rollout = _episode(tiny)
    assert rollout.status == "ok" and rollout.info["episode/done_reason"] == "answer"
    tool_replies = [m["content"] for m in rollout.messages if m["role"] == "tool"]
    assert len(tool_replies) == 4  # each malformed call got an error message back
    assert '"malformed"' in tool_replies[0] and "could not parse" in tool_replies[0]
    assert "unknown tool 'abacus'" in tool_replies[1]
    assert "bad arguments" in tool_replies[2]
    assert str(task.answer) in tool_replies[3]  # the corrected call's real result
    (score,) = asyncio.run(grade_rollouts(env.default_grader(), [rollout], [task]))
    assert score.ok and score.components["correct"] == 1.0
    metrics = info_metrics([rollout, rollout])  # what every training step logs
    assert metrics["env/tool/malformed"] == 1.0
    assert metrics["env/tool/unknown_tool"] == 1.0
    assert metrics["env/tool/bad_arguments"] == 1.0
    assert metrics["env/tool/errors"] == 3.0 and metrics["env/tool/calls"] == 1.0
    assert metrics["env/format/protocol_errors"] == 3.0


def test_demo_tokens_are_the_rollout_tokens_and_only_assistant_tokens_train(tiny):
    _, _, played = _episode(tiny)
    tokenizer = tiny[1]
    tools = played.info.get("tools")
    replayed = conversation_rollout(tokenizer, played.messages, tools)
    # the replay of the recorded conversation holds the engine's own tokens and mask
    assert replayed.prompt_ids == played.prompt_ids
    assert replayed.completion_ids == played.completion_ids
    assert replayed.policy_mask == played.policy_mask
    # token by token: the trained tokens are each assistant turn's tokens + end of turn
    _, turns = split_conversation(played.messages)
    expected: list[list[int]] = [
        [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        for text, _ in turns
    ]
    runs: list[list[int]] = []
    previous = False
    for token, trained in zip(replayed.completion_ids, replayed.policy_mask, strict=True):
        if trained and not previous:
            runs.append([])
        if trained:
            runs[-1].append(token)
        previous = trained
    assert runs == expected
    assert assistant_turn_tokens(replayed) == [len(run) for run in expected]
    # everything else is the template around the turns and the environment's messages
    untrained = tokenizer.decode(
        [t for t, m in zip(replayed.completion_ids, replayed.policy_mask, strict=True) if not m]
    )
    for m in played.messages[2:]:
        if m["role"] == "tool":
            assert m["content"] in untrained
    assert "<|im_start|>assistant" in untrained and "<answer>" not in untrained
    # and the whole sequence is the chat template's rendering of the conversation
    text = tokenizer.decode([*replayed.prompt_ids, *replayed.completion_ids])
    assert text + "\n" == tokenizer.apply_chat_template(played.messages, tokenize=False)


def _write_demos(path: Path, tiny, n: int = 6) -> None:
    env = make_env("arith-tools-v1", levels=[1], python="off")
    lines = []
    for task in env.tasks("train", seed=0, n=n):
        opening = asyncio.run(env.reset(task, seed=0)).messages
        call = CALL.format(name="calculator", args=json.dumps({"expression": _expression(task)}))
        result = asyncio.run(env.step(call)).messages
        answer = {"role": "assistant", "content": f"<answer>{task.answer}</answer>"}
        messages = [*opening, {"role": "assistant", "content": call}, *result, answer]
        lines.append({"env": env.env_id, "task_id": task.id, "messages": messages,
                      "tools": None, "passed": True, "score": 1.0})  # fmt: skip
    lines.append({**lines[0], "passed": False})  # left out (only_passed)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _longest_turns(path: Path, tokenizer) -> list[int]:
    """Per passed demonstration, its longest assistant turn in tokens (+1: end of turn)."""
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    turns = [
        [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        for row in rows
        if row["passed"]
    ]
    return [
        max(len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1 for text in texts)
        for texts in turns
    ]


def test_sft_lowers_the_loss_on_its_demonstrations_and_writes_a_train_checkpoint(tiny, tmp_path):
    data = tmp_path / "demos.jsonl"
    _write_demos(data, tiny)
    longest = _longest_turns(data, tiny[1])
    limit = sorted(longest)[2]  # some demonstrations' tool call is longer, some not
    cfg = load_config(None, ["model.name=tiny-random", "eval.tasks=0", "run.epochs=12",
                             "optim.lr=1e-2", "sft.batch_size=6", "optim.micro_batch_size=4",
                             f"sampling.max_new_tokens={limit}", "eval.max_new_tokens=512",
                             "run.report_to=[]", "run.threads=1"])  # fmt: skip
    out = io.StringIO()
    summary = run_sft(cfg, data, run_dir=tmp_path / "run", console=Console(file=out, width=200))
    assert summary["demonstrations"] == 6 and summary["left_out"] == {"not_passed": 1}
    # the budget check: demonstrations RL (sampling.max_new_tokens) would cut, warned
    over = sum(n > limit for n in longest)
    assert 0 < over < 6
    assert summary["turn_budget"]["longest_turn_tokens"] == max(longest)
    assert summary["turn_budget"]["demos_over"] == {
        "sampling.max_new_tokens": over,
        "eval.max_new_tokens": 0,
    }
    warnings = [x for x in out.getvalue().splitlines() if x.startswith("warning:")]
    assert len(warnings) == 1
    assert f"{over} of 6 demonstrations" in warnings[0]
    assert f"sampling.max_new_tokens = {limit}" in warnings[0]
    lines = out.getvalue().splitlines()
    assert f"sft: tokenizing 6 demonstrations from {data}" in lines  # before the header
    assert lines.index(f"sft: tokenizing 6 demonstrations from {data}") < next(
        i for i, x in enumerate(lines) if x.startswith("rldojo sft"))  # fmt: skip
    assert any(x.startswith("sft step  12/12 epoch 12/12 loss ") for x in lines)
    assert any(x.startswith("sft step   1/12 epoch 1/12 loss ") for x in lines)
    precision = summary["precision"]  # the console says what the run chose, as train does
    line = next(x for x in out.getvalue().splitlines() if x.startswith("precision: "))
    assert f"generation {precision['generation_dtype']}, training fp32" in line
    assert precision["reason"] in line
    assert summary["steps"] == 12
    assert summary["loss_last"] < 0.5 * summary["loss_first"]
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "sft"] == list(range(1, 13))
    checkpoint = Path(summary["checkpoint"])
    assert (checkpoint / "model.safetensors").exists() and (checkpoint / "state.json").exists()
    # rldojo train starts from it by name, as from any model directory
    from rldojo.policy.models import check_model, load_model

    check_model(str(checkpoint))
    model, _ = load_model(str(checkpoint))
    assert model.config.num_hidden_layers == tiny[0].config.num_hidden_layers


def test_sft_evaluates_before_and_after_on_the_heldout_tasks(tiny, tmp_path):
    data = tmp_path / "demos.jsonl"
    _write_demos(data, tiny, n=2)
    cfg = load_config(None, ["model.name=tiny-random", "env.id=arith-tools-v1",
                             'env.kwargs={levels = [1], python = "off"}', "eval.tasks=3",
                             "eval.before_tasks=2", "eval.max_new_tokens=8", "run.epochs=1",
                             "run.report_to=[]", "run.threads=1"])  # fmt: skip
    out = io.StringIO()
    summary = run_sft(cfg, data, run_dir=tmp_path / "run", console=Console(file=out, width=200))
    assert set(summary["evals"]) == {"before", "after"}
    # each evaluation shows how far it got (a plain console: its start and end at least)
    lines = out.getvalue().splitlines()
    for label, n in (("before", 2), ("after", 3)):
        shown = [x for x in lines if x.startswith(f"evaluating {label}: ")]
        assert shown[0] == f"evaluating {label}: 0/{n}"
        assert shown[-1] == f"evaluating {label}: {n}/{n}"
        result = next(x for x in lines if x.startswith(f"held-out accuracy ({label})"))
        assert lines.index(shown[-1]) < lines.index(result)
    # the base model's evaluation keeps the first eval.before_tasks of the same tasks
    assert summary["evals"]["before"]["n"] == 2 and summary["evals"]["after"]["n"] == 3
    ids = [t.id for t in make_env("arith-tools-v1", levels=[1], python="off").tasks("test", n=3)]
    for label, expected in (("before", ids[:2]), ("after", ids)):
        rows = (tmp_path / "run" / "evals" / f"{label}.jsonl").read_text().splitlines()
        assert [json.loads(r)["task_id"] for r in rows] == expected


@pytest.mark.parametrize("skip", ["eval.before=false", "sft.eval.before=false"])
def test_either_key_skips_the_starting_models_evaluation(tiny, tmp_path, skip):
    data = tmp_path / "demos.jsonl"
    _write_demos(data, tiny, n=2)
    cfg = load_config(None, ["model.name=tiny-random", "env.id=arith-tools-v1",
                             'env.kwargs={levels = [1], python = "off"}', "eval.tasks=2",
                             "eval.max_new_tokens=4", "run.epochs=1", "run.report_to=[]",
                             "run.threads=1", skip])  # fmt: skip
    summary = run_sft(cfg, data, run_dir=tmp_path / "run")
    assert set(summary["evals"]) == {"after"}
    assert sorted(p.name for p in (tmp_path / "run" / "evals").iterdir()) == ["after.jsonl"]


def test_schedule_covers_every_demo_once_per_epoch_in_length_sorted_micro_batches():
    lengths = [5, 50, 7, 30, 9, 100, 3]
    steps = sft_schedule(lengths, batch_size=4, micro_batch_size=2, epochs=2, seed=0)
    assert len(steps) == 4  # 2 per epoch (4 + 3 demos)
    for epoch in (steps[:2], steps[2:]):
        seen = sorted(i for step in epoch for mb in step for i in mb)
        assert seen == list(range(7))
    for step in steps:
        flat = [i for mb in step for i in mb]
        assert [lengths[i] for i in flat] == sorted((lengths[i] for i in flat), reverse=True)
        assert all(len(mb) <= 2 for mb in step)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ({"messages": "hi"}, "demos.jsonl:1: field 'messages': expected list, got str"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "field 'messages[0]'.role"),
        ({"messages": [{"role": "user", "content": 3}]}, "field 'messages[0]'.content"),
        ({"messages": [{"role": "user", "content": "x"}]}, "no assistant turn"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
          "tools": "calculator"}, "field 'tools'"),
    ],
)  # fmt: skip
def test_bad_demonstrations_are_one_line_errors_before_any_model_loads(tmp_path, line, error):
    data = tmp_path / "demos.jsonl"
    data.write_text(json.dumps(line) + "\n")
    result = CliRunner().invoke(app, ["sft", "--data", str(data), "--set", "model.name=nope"])
    assert result.exit_code == 2
    out = " ".join(result.output.split())
    assert error in out and out.count("error:") == 1
    with pytest.raises(ValueError, match=r"demos\.jsonl:1"):
        read_demos(data)


def test_missing_data_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(app, ["sft", "--data", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 2 and "none.jsonl: file not found" in result.output
    result = CliRunner().invoke(app, ["sft"])
    assert result.exit_code == 2 and "no demonstrations" in result.output


def test_a_nan_gradient_skips_its_step_counted_and_warned(tiny, tmp_path, monkeypatch):
    from rldojo.training import sft as sft_module

    original, calls = sft_module.sft_step, []

    def poisoned(model, *args, **kwargs):  # step 2's gradient is NaN (a kernel's, say)
        out = original(model, *args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            next(p for p in model.parameters() if p.grad is not None).grad.fill_(float("nan"))
        return out

    monkeypatch.setattr(sft_module, "sft_step", poisoned)
    data = tmp_path / "demos.jsonl"
    _write_demos(data, tiny)
    cfg = load_config(None, ["model.name=tiny-random", "eval.tasks=0", "run.epochs=3",
                             "sft.batch_size=6", "run.report_to=[]", "run.threads=1"])  # fmt: skip
    out = io.StringIO()
    summary = run_sft(cfg, data, run_dir=tmp_path / "run", console=Console(file=out, width=200))
    assert summary["steps"] == 3 and summary["nonfinite_skipped"] == 1
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["sft/nonfinite_skipped"] for r in records if r["kind"] == "sft"] == [0.0, 1.0, 0.0]
    lines = out.getvalue().splitlines()
    assert any(x.startswith("warning: sft step 2: gradient norm nan") for x in lines)
    # the skipped step changed nothing: step 3 trained from finite weights, and so on
    from rldojo.policy.models import load_model

    model, _ = load_model(summary["checkpoint"])
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert math.isfinite(summary["loss_last"])


@pytest.mark.parametrize("sft_lora", [True, False])
def test_sft_lora_false_trains_every_weight_and_rl_adds_the_adapters(tiny, tmp_path, sft_lora):
    """`model.lora` is set for the RL stage; `[sft.model] lora = "none"` keeps it out of SFT: the
    checkpoint holds full, changed weights, and RL's loader wraps them in fresh adapters."""
    pytest.importorskip("peft", reason="the `lora` extra (peft) is not installed")
    from rldojo.policy.lora import is_peft_model
    from rldojo.policy.models import load_model
    from rldojo.policy.training_model import load_training_model

    data = tmp_path / "demos.jsonl"
    _write_demos(data, tiny, n=3)
    lora = "model.lora={r = 4, alpha = 8, target_modules = ['q_proj', 'v_proj']}"
    cfg = load_config(None, ["model.name=tiny-random", "eval.tasks=0", "run.epochs=1",
                             "optim.lr=1e-2", "optim.warmup_steps=0", "run.report_to=[]",
                             "run.threads=1", lora,
                             *([] if sft_lora else ["sft.model.lora=none"])])  # fmt: skip
    checkpoint = Path(run_sft(cfg, data, run_dir=tmp_path / "run")["checkpoint"])
    assert (checkpoint / "adapter_config.json").exists() is sft_lora
    assert (checkpoint / "model.safetensors").exists() is not sft_lora
    if sft_lora:
        return
    base = tiny[0].state_dict()
    trained, _ = load_model(str(checkpoint))
    changed = [k for k, v in trained.state_dict().items() if not torch.equal(v, base[k])]
    assert any("mlp" in k for k in changed) and any("self_attn.o_proj" in k for k in changed)
    rl_model = cfg.model.model_copy(update={"name": str(checkpoint)})
    model, _ = load_training_model(rl_model, None, torch.device("cpu"), load_model)
    assert is_peft_model(model)
    trainable = [k for k, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in k for k in trainable)
    weights = model.get_base_model().state_dict()
    key = next(k for k in changed if "mlp" in k)
    assert torch.equal(weights[key], trained.state_dict()[key])
