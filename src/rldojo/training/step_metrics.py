"""The metrics logged for one step's rollouts and groups (`rldojo.rollout.groups`).

Besides reward, lengths and statuses, `signal/` holds what explains a step without
learning signal (`rldojo.training.no_signal` reads it): how many completions were cut at the
token limit and how many had no answer the grader could extract.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rldojo.config import RolloutConfig
from rldojo.eval.harness import passed
from rldojo.graders.rules import NO_ANSWER_FLAG
from rldojo.rollout.groups import Group
from rldojo.types import Rollout, Score


def rollout_metrics(
    rollouts: Sequence[Rollout],
    scores: Sequence[Score],
    groups: Sequence[Group],
    cfg: RolloutConfig,
    pass_threshold: float = 1.0,
) -> dict[str, Any]:
    """Reward, pass rate (`passed` at `pass_threshold`), lengths and failure counts of
    every rollout drawn this step."""
    ok = [s for s in scores if s.ok]
    values = torch.tensor([float(s.value or 0.0) for s in ok]) if ok else torch.zeros(0)
    out: dict[str, Any] = {
        "reward/mean": float(values.mean()) if len(values) else 0.0,
        "reward/std": float(values.std(unbiased=False)) if len(values) else 0.0,
        "reward/pass_rate": sum(passed(s, pass_threshold) for s in ok) / max(len(ok), 1),
        "rollout/samples": len(rollouts),
        "rollout/completion_len": sum(sum(r.policy_mask) for r in rollouts) / max(len(rollouts), 1),
        "rollout/truncated_frac": sum(bool(r.info.get("truncated_turns")) for r in rollouts)
        / max(len(rollouts), 1),
        "rollout/groups": len(groups),
        "rollout/groups_informative": sum(g.informative for g in groups),
        "rollout/groups_short": max(0, cfg.prompts_per_step - sum(g.informative for g in groups)),
    }
    for status, n in Counter(r.status for r in rollouts).items():
        if status != "ok":
            out[f"rollout/status_{status}"] = n
    for grade_status, n in Counter(s.status for s in scores).items():
        if grade_status != "ok":
            out[f"grade/status_{grade_status}"] = n
    by_env: dict[str, list[Score]] = {}
    for r, s in zip(rollouts, scores, strict=True):
        if s.ok:
            by_env.setdefault(r.env or "env", []).append(s)
    for env, env_scores in by_env.items():
        out[f"reward/{env}/mean"] = sum(float(s.value or 0.0) for s in env_scores) / len(env_scores)
        passes = sum(passed(s, pass_threshold) for s in env_scores)
        out[f"reward/{env}/pass_rate"] = passes / len(env_scores)
    out |= info_metrics(rollouts) | signal_metrics(rollouts, scores)
    components: dict[str, list[float]] = {}
    for s in ok:
        for name, value in s.components.items():
            components.setdefault(name, []).append(float(value))
    for name, vals in components.items():
        out[f"reward/component/{name}"] = sum(vals) / len(vals)
    return out


def signal_metrics(rollouts: Sequence[Rollout], scores: Sequence[Score]) -> dict[str, float]:
    """`signal/truncated`: the share of rollouts in which a policy turn stopped at
    `sampling.max_new_tokens` (finish reason `length`, which the rollout engine counts in
    `info["truncated_turns"]`). `signal/no_answer`: the share of graded rollouts whose
    grader found no answer to extract (`Score.flags` holds `NO_ANSWER_FLAG`); always 0
    for graders that extract none (code tests, games). A failed grade is left out of that
    share: it says nothing about the answer."""
    cut = sum(bool(r.info.get("truncated_turns")) for r in rollouts)
    graded = [s for s in scores if s.ok]
    missing = sum(NO_ANSWER_FLAG in s.flags for s in graded)
    return {
        "signal/truncated": cut / max(len(rollouts), 1),
        "signal/no_answer": missing / max(len(graded), 1),
    }


_INFO_PREFIXES = ("tool/", "format/", "episode/", "game/", "crm/", "repair")


def info_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Environment counters from `rollout.info`: numeric ones averaged over rollouts,
    text ones (e.g. `episode/done_reason`) counted per value."""
    sums: dict[str, float] = {}
    counts: Counter[str] = Counter()
    for r in rollouts:
        for key, value in r.info.items():
            if not key.startswith(_INFO_PREFIXES):
                continue
            if isinstance(value, bool | int | float):
                sums[key] = sums.get(key, 0.0) + float(value)
            elif isinstance(value, str):
                counts[f"{key}/{value}"] += 1
    n = max(len(rollouts), 1)
    return {f"env/{k}": v / n for k, v in sums.items()} | {f"env/{k}": c for k, c in counts.items()}


def forking_tokens(
    tokenizer: Any, token_ids: torch.Tensor, selected: torch.Tensor, top: int = 20
) -> list[str]:
    """The `top` most frequent selected (forking) tokens as `text×count` strings."""
    counts = Counter(int(t) for t in token_ids[selected].tolist())
    return [f"{tokenizer.decode([tok])!r}×{n}" for tok, n in counts.most_common(top)]


def entropy_stats(entropy: Tensor, mask: Tensor) -> dict[str, float]:
    """Entropy distribution over masked tokens, for the `entropy/` metrics.

    Percentiles use linear interpolation between order statistics (numpy's default
    `method="linear"`): position q·(N-1) in the sorted values. Computed from one sort, not
    `torch.quantile`, which fails above 2^24 elements. An empty mask gives all zeros.
    """
    values = entropy[mask.bool()].float().sort().values  # [N]
    n = values.numel()
    stats = {"p50": 0.0, "p80": 0.0, "p95": 0.0, "frac_below_0.01": 0.0, "mean": 0.0}
    stats["count"] = float(n)
    if n == 0:
        return stats
    for name, q in (("p50", 0.50), ("p80", 0.80), ("p95", 0.95)):
        pos = q * (n - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        v_lo, v_hi = float(values[lo].item()), float(values[hi].item())
        stats[name] = v_lo + (v_hi - v_lo) * (pos - lo)
    stats["frac_below_0.01"] = float((values < 0.01).float().mean().item())
    stats["mean"] = float(values.double().mean().item())
    return stats


def mask_threshold(entropy: Tensor, selected: Tensor, scope: str, micro: int) -> float | None:
    """The entropy cut the mask used: the lowest selected entropy of each scope (the whole
    batch, each micro-batch block of `micro` rows, or each sequence), averaged over the
    scopes that selected anything; exactly the threshold for scope `batch`. None when
    nothing was selected."""
    rows = entropy.shape[0]
    step = {"batch": max(rows, 1), "microbatch": micro, "sequence": 1}[scope]
    cuts = []
    for start in range(0, rows, step):
        picked = entropy[start : start + step][selected[start : start + step].bool()]
        if picked.numel():
            cuts.append(float(picked.min()))
    return sum(cuts) / len(cuts) if cuts else None
