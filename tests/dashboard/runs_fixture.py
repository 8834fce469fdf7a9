"""Run directories for the dashboard tests, written with the real parts: the `Ledger`
(SQLite), `metrics.jsonl` lines as `MetricsLogger` writes them, config.toml, summary.json,
and an eval report. One ledger row is known token by token (`KNOWN`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rldojo.store.ledger import Ledger
from rldojo.types import Rollout, Score

KNOWN_TEXT = "The answer is 42, so Answer: 42"
KNOWN_SELECTED = [2, 3]
"""Completion positions of the known row that the mask selected."""


def rollout(tokenizer, task: str, sample: int, text: str, *, status: str = "ok",
            entropies: list[float] | None = None) -> Rollout:  # fmt: skip
    prompt = [{"role": "user", "content": f"task {task}"}]
    ids = tokenizer.encode(text, add_special_tokens=False)
    return Rollout(
        task_id=task, env="arith-v1", messages=[*prompt, {"role": "assistant", "content": text}],
        completion=text, prompt_ids=tuple(tokenizer.encode("task", add_special_tokens=False)),
        completion_ids=tuple(ids), policy_mask=(True,) * len(ids),
        logprobs=tuple(-0.1 * (i + 1) for i in range(len(ids))),
        entropies=tuple(entropies or [0.05 * i for i in range(len(ids))]),
        sample_index=sample, status=status,
    )  # fmt: skip


def tool_rollout(tokenizer) -> Rollout:
    """A multi-turn rollout: an assistant tool call, the tool's result, a final answer."""
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    result = "<tool_response>5</tool_response>"
    final = "Answer: 5"
    parts = [(call, True), (result, False), (final, True)]
    ids: list[int] = []
    mask: list[bool] = []
    for text, policy in parts:
        t = tokenizer.encode(text, add_special_tokens=False)
        ids += t
        mask += [policy] * len(t)
    messages = [
        {"role": "user", "content": "What is 2 + 3? Use the tool."},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": result},
        {"role": "assistant", "content": final},
    ]
    return Rollout(
        task_id="tools/0", env="arith-tools-v1", messages=messages,
        completion=call + result + final,
        prompt_ids=(1, 2), completion_ids=tuple(ids), policy_mask=tuple(mask),
        logprobs=tuple([-0.2] * len(ids)), entropies=tuple([0.5] * len(ids)),
    )  # fmt: skip


def write_metrics(path: Path, steps: int, *, truncated: bool = False) -> None:
    lines = [{"step": 0, "kind": "eval", "eval/accuracy": 0.25, "eval/ci_low": 0.1,
              "eval/ci_high": 0.45}]  # fmt: skip
    for s in range(1, steps + 1):
        lines.append({
            "step": s, "kind": "train", "reward/mean": 0.1 * s, "reward/std": 0.2,
            "reward/pass_rate": 0.05 * s, "reward/arith-v1/pass_rate": 0.05 * s,
            "rollout/completion_len": 20 + s, "entropy/p50": 0.1, "entropy/p80": 0.5,
            "entropy/p95": 1.2, "entropy/frac_below_0.01": 0.3, "entropy/threshold": 0.5,
            "entropy/tokens_selected": 10, "entropy/tokens_policy": 50,
            "loss/clip_frac": 0.01, "optim/grad_norm": 1.5, "loss/kl": 0.0,
            "time/generate": 2.0, "time/train": 1.0, "time/step": 3.2,
            "time/tokens_per_s_generate": 100.0, "rollout/status_timeout": s % 2,
        })  # fmt: skip
    lines.append({"step": steps, "kind": "eval", "eval/accuracy": 0.5, "eval/ci_low": 0.3,
                  "eval/ci_high": 0.7})  # fmt: skip
    text = "".join(json.dumps(r) + "\n" for r in lines)
    if truncated:
        text += '{"step": 99, "kind": "train", "reward/me'  # a line still being written
    path.write_text(text)


def make_runs(root: Path, tokenizer) -> dict[str, int]:
    """alpha (finished, trained rows), beta (being written: no summary, a cut-off metrics
    line), gamma (metrics only, no ledger), and an eval report. Returns row ids."""
    alpha = root / "alpha"
    alpha.mkdir(parents=True)
    (alpha / "config.toml").write_text('[model]\nname = "tiny-random"\n\n[run]\nsteps = 4\n')
    write_metrics(alpha / "metrics.jsonl", 4)
    (alpha / "summary.json").write_text(json.dumps({
        "model": "tiny-random", "env": "arith-v1", "steps": 4, "accuracy_before": 0.25,
        "accuracy_after": 0.5, "wall_s": 12.8,
    }))  # fmt: skip
    (alpha / "checkpoints" / "step_000004").mkdir(parents=True)
    ledger = Ledger(alpha / "ledger.sqlite")
    rows = [rollout(tokenizer, "arith-v1/train/0/7", i, t) for i, t in enumerate(
        [KNOWN_TEXT, "I think 41", "no idea", "Answer: 42"])]  # fmt: skip
    scores = [Score(value=1.0), Score(value=-0.5), Score(value=-0.5), Score(value=1.0)]
    ids = ledger.add(0, rows, scores)
    ledger.mark_trained(ids, 1, {ids[0]: (0.87, KNOWN_SELECTED)})
    failed = rollout(tokenizer, "arith-v1/train/0/8", 0, "stuck", status="timeout")
    (failed_id,) = ledger.add(1, [failed], [Score.failed("timeout", "env timed out")])
    (tool_id,) = ledger.add(1, [tool_rollout(tokenizer)], [Score(value=1.0)])
    ledger.close()
    beta = root / "beta"
    beta.mkdir()
    (beta / "config.toml").write_text('[model]\nname = "tiny-random"\n')
    write_metrics(beta / "metrics.jsonl", 2, truncated=True)
    Ledger(beta / "ledger.sqlite").close()
    later = time.time() + 86_400  # "changed just now" for as long as any test runs
    for f in beta.iterdir():
        os.utime(f, (later, later))
    gamma = root / "gamma"
    gamma.mkdir()
    write_metrics(gamma / "metrics.jsonl", 1)
    (root / "evals").mkdir()
    (root / "evals" / "report.md").write_text(
        "# rldojo eval: tiny-random on arith-v1\n\n| metric | value |\n|---|---:|\n"
        "| pass@1 | 0.250 |\n\n## Paired comparison\n\nMcNemar p = 0.031\n"
    )
    return {"known": ids[0], "failed": failed_id, "tool": tool_id}
