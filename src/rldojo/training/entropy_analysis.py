"""Token-entropy analysis of chains of thought ("Beyond the 80/20 Rule", arXiv 2506.01939).

The paper's forking-token rule rests on three measurements, all reproduced here:

1. the entropy distribution over response tokens: most tokens are near-deterministic
   (paper: over half below 0.01 nats; 80th percentile about 0.672);
2. which tokens carry high entropy ("forking" tokens such as "wait", "however") and which
   low (completions of words, formulas), listed as text;
3. RL mostly keeps high-entropy positions where the base model had them: on the *same*
   sequences, the top-ρ positions of the base and the trained model overlap strongly,
   and entropy changes mostly where it was high to begin with.

Entropies are recomputed with the model by a teacher-forced forward over fixed token
sequences (generated, or read from a run's ledger) at a given temperature, so any two
checkpoints are measured on identical tokens. Forwards run `micro_batch` sequences at a
time and the softmax is taken in chunks (`rldojo.training.losses.logprobs_and_entropy`),
so the fp32 [B, L, V] tensor never exists at once. Only policy tokens are counted.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rldojo.training.batch import build_token_batch, completion_logits
from rldojo.training.losses import (
    high_entropy_mask,
    high_entropy_threshold,
    logprobs_and_entropy,
)
from rldojo.training.step_metrics import entropy_stats
from rldojo.types import Rollout

__all__ = [
    "PAPER",
    "entropy_change_by_bucket",
    "entropy_report",
    "position_overlap",
    "sequences_from_ledger",
    "teacher_forced_entropy",
    "token_table",
    "top_positions",
]

PAPER = {"frac_below_0.01": 0.5, "p80": 0.672}
"""The paper's figures for Qwen3-8B chains of thought (share below 0.01 is "over half")."""


def sequences_from_ledger(
    path: str | Path, *, limit: int | None = None, step: int | None = None
) -> list[Rollout]:
    """Token sequences of a run's ledger (run directory or ledger.sqlite), oldest first."""
    db_path = Path(path)
    if db_path.is_dir():
        db_path = db_path / "ledger.sqlite"
    if not db_path.exists():
        raise FileNotFoundError(f"no ledger at {db_path}")
    query = (
        "SELECT task_id, env, sample_index, completion, prompt_ids, completion_ids,"
        " policy_mask, logprobs, policy_version FROM rollouts"
        " WHERE status IN ('ok', 'truncated')"
    )
    params: list[Any] = []
    if step is not None:
        query += " AND step = ?"
        params.append(step)
    query += " ORDER BY id" + (" LIMIT ?" if limit is not None else "")
    if limit is not None:
        params.append(limit)
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        rows = db.execute(query, params).fetchall()
    return [
        Rollout(
            task_id=task_id,
            env=env,
            messages=[],
            completion=text,
            prompt_ids=tuple(json.loads(prompt)),
            completion_ids=tuple(json.loads(ids)),
            policy_mask=tuple(bool(m) for m in json.loads(mask)),
            logprobs=tuple(json.loads(logprobs)),
            policy_version=version,
            sample_index=sample,
        )
        for task_id, env, sample, text, prompt, ids, mask, logprobs, version in rows
        if json.loads(ids)
    ]


def _with_logprobs(r: Rollout) -> Rollout:
    """`build_token_batch` wants one behaviour log-prob per token; unused here."""
    if len(r.logprobs) == len(r.completion_ids):
        return r
    return replace(r, logprobs=(0.0,) * len(r.completion_ids), entropies=())


@torch.no_grad()
def teacher_forced_entropy(
    model: Any,
    rollouts: Sequence[Rollout],
    *,
    temperature: float = 1.0,
    micro_batch: int = 8,
    chunk_size: int = 1024,
) -> list[np.ndarray]:
    """Per rollout, the model's entropy (nats, at `temperature`) at every completion token.

    Returns one float32 array of length ``len(completion_ids)`` per rollout; entries at
    non-policy tokens are computed too (mask them with `policy_mask`).
    """
    was_training = model.training
    model.eval()
    out: list[np.ndarray] = []
    try:
        for start in range(0, len(rollouts), micro_batch):
            chunk = [_with_logprobs(r) for r in rollouts[start : start + micro_batch]]
            batch = build_token_batch(chunk, pad_id=0)
            logits = completion_logits(model, batch, share_prefix=False)  # [M, T, V]
            _, entropy = logprobs_and_entropy(
                logits, batch.completion_ids, temperature, chunk_size
            )  # [M, T]
            for row, r in enumerate(chunk):
                out.append(entropy[row, : len(r.completion_ids)].float().numpy().copy())
            del logits
    finally:
        model.train(was_training)
    return out


def _padded(
    values: Sequence[np.ndarray], rollouts: Sequence[Rollout]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Entropies, token ids and policy mask as padded [B, T] tensors."""
    t = max((len(v) for v in values), default=1) or 1
    ent = torch.zeros(len(values), t)  # [B, T]
    ids = torch.zeros(len(values), t, dtype=torch.long)  # [B, T]
    mask = torch.zeros(len(values), t, dtype=torch.bool)  # [B, T]
    for row, (v, r) in enumerate(zip(values, rollouts, strict=True)):
        n = len(v)
        ent[row, :n] = torch.from_numpy(np.asarray(v, dtype=np.float32))
        ids[row, :n] = torch.tensor(r.completion_ids[:n], dtype=torch.long)
        mask[row, :n] = torch.tensor(r.policy_mask[:n], dtype=torch.bool)
    return ent, ids, mask


def top_positions(
    entropies: Sequence[np.ndarray], rollouts: Sequence[Rollout], rho: float
) -> torch.Tensor:
    """The top-ρ policy positions by entropy over all sequences (batch scope): [B, T] bool."""
    ent, _, mask = _padded(entropies, rollouts)
    return high_entropy_mask(ent, mask, rho, "batch")  # [B, T]


def token_table(
    tokenizer: Any, ids: torch.Tensor, ent: torch.Tensor, select: torch.Tensor, top: int = 20
) -> list[dict[str, Any]]:
    """The `top` most frequent tokens among `select`, as text with count and mean entropy."""
    chosen, values = ids[select].tolist(), ent[select].tolist()
    counts = Counter(chosen)
    sums: dict[int, float] = defaultdict(float)
    for tok, value in zip(chosen, values, strict=True):
        sums[tok] += value
    return [
        {"token": tokenizer.decode([tok]), "count": n, "mean_entropy": sums[tok] / n}
        for tok, n in counts.most_common(top)
    ]


def position_overlap(
    base: Sequence[np.ndarray], new: Sequence[np.ndarray], rollouts: Sequence[Rollout], rho: float
) -> dict[str, float]:
    """Overlap of the top-ρ positions of two models on the same sequences.

    `overlap` = |A ∩ B| / |A| (the paper's measure), `jaccard` = |A ∩ B| / |A ∪ B|;
    `chance` = ρ is the expected overlap if the two selections were independent.
    """
    a, b = top_positions(base, rollouts, rho), top_positions(new, rollouts, rho)
    inter, union = int((a & b).sum()), int((a | b).sum())
    return {
        "rho": rho,
        "selected_base": int(a.sum()),
        "selected_new": int(b.sum()),
        "overlap": inter / max(int(a.sum()), 1),
        "jaccard": inter / max(union, 1),
        "chance": rho,
    }


def entropy_change_by_bucket(
    base: Sequence[np.ndarray],
    new: Sequence[np.ndarray],
    rollouts: Sequence[Rollout],
    buckets: int = 5,
) -> list[dict[str, Any]]:
    """Mean entropy before and after, by percentile bucket of the base entropy."""
    eb, _, mask = _padded(base, rollouts)
    en, _, _ = _padded(new, rollouts)
    xb, xn = eb[mask].numpy(), en[mask].numpy()  # [N], [N]
    if xb.size == 0:
        return []
    order = np.argsort(xb, kind="stable")
    rows = []
    for i, part in enumerate(np.array_split(order, buckets)):
        if part.size == 0:
            continue
        lo_pct, hi_pct = 100 * i // buckets, 100 * (i + 1) // buckets
        rows.append(
            {
                "bucket": f"{lo_pct}-{hi_pct}%",
                "base_range": [float(xb[part].min()), float(xb[part].max())],
                "mean_base": float(xb[part].mean()),
                "mean_new": float(xn[part].mean()),
                "mean_change": float((xn[part] - xb[part]).mean()),
                "count": int(part.size),
            }
        )
    return rows


def entropy_report(
    tokenizer: Any,
    rollouts: Sequence[Rollout],
    entropies: Sequence[np.ndarray],
    *,
    rho: float = 0.2,
    top: int = 20,
    compare: Sequence[np.ndarray] | None = None,
    buckets: int = 5,
) -> dict[str, Any]:
    """The paper's statistics for one model, and for two when `compare` is given."""
    ent, ids, mask = _padded(entropies, rollouts)
    stats = entropy_stats(ent, mask)
    forking = high_entropy_mask(ent, mask, rho, "batch")  # [B, T]
    low = high_entropy_mask(-ent, mask, rho, "batch")  # [B, T]: the bottom-ρ tokens
    report: dict[str, Any] = {
        "sequences": len(rollouts),
        "stats": stats,
        "paper": PAPER,
        "rho": rho,
        "threshold": high_entropy_threshold(ent, mask, rho),
        "forking_tokens": token_table(tokenizer, ids, ent, forking, top),
        "low_entropy_tokens": token_table(tokenizer, ids, ent, low, top),
    }
    sampler = [np.asarray(r.entropies, dtype=np.float32) for r in rollouts]
    if all(len(s) == len(e) and len(s) for s, e in zip(sampler, entropies, strict=True)):
        gap = np.concatenate([np.abs(s - e) for s, e in zip(sampler, entropies, strict=True)])
        report["sampler_vs_forward_mean_abs_diff"] = float(gap.mean())
    if compare is not None:
        ent_new, _, _ = _padded(compare, rollouts)
        report["compare"] = {
            "stats": entropy_stats(ent_new, mask),
            "overlap": position_overlap(entropies, compare, rollouts, rho),
            "change_by_bucket": entropy_change_by_bucket(entropies, compare, rollouts, buckets),
            "forking_tokens": token_table(
                tokenizer, ids, ent_new, high_entropy_mask(ent_new, mask, rho, "batch"), top
            ),
        }
    return report


def entropy_markdown(report: dict[str, Any], *, labels: tuple[str, str] = ("base", "new")) -> str:
    """The report as Markdown: the paper's numbers beside ours, token lists, comparison."""
    s, paper = report["stats"], report["paper"]
    lines = [
        f"Sequences: {report['sequences']}, policy tokens: {int(s['count'])}",
        "",
        "| statistic | paper | measured |",
        "|---|---:|---:|",
        f"| share of tokens with entropy < 0.01 | > {paper['frac_below_0.01']:.2f} "
        f"| {s['frac_below_0.01']:.3f} |",
        f"| p50 | | {s['p50']:.3f} |",
        f"| p80 | {paper['p80']:.3f} | {s['p80']:.3f} |",
        f"| p95 | | {s['p95']:.3f} |",
        "",
        f"Forking tokens (top {report['rho']:.0%} by entropy): "
        + ", ".join(f"{t['token']!r}×{t['count']}" for t in report["forking_tokens"][:15]),
        "",
        "Low-entropy tokens (bottom share): "
        + ", ".join(f"{t['token']!r}×{t['count']}" for t in report["low_entropy_tokens"][:15]),
    ]
    if "compare" in report:
        c = report["compare"]
        ov = c["overlap"]
        lines += [
            "",
            f"{labels[1]} vs {labels[0]} on the same sequences: top-{ov['rho']:.0%} position "
            f"overlap {ov['overlap']:.1%} (chance {ov['chance']:.0%}), Jaccard "
            f"{ov['jaccard']:.2f}; p80 {s['p80']:.3f} -> {c['stats']['p80']:.3f}, share < 0.01 "
            f"{s['frac_below_0.01']:.3f} -> {c['stats']['frac_below_0.01']:.3f}",
            "",
            f"| {labels[0]} entropy bucket | range | mean {labels[0]} | mean {labels[1]} "
            "| change |",
            "|---|---|---:|---:|---:|",
        ]
        for b in c["change_by_bucket"]:
            lo, hi = b["base_range"]
            lines.append(
                f"| {b['bucket']} | {lo:.3g}–{hi:.3g} | {b['mean_base']:.3f} "
                f"| {b['mean_new']:.3f} | {b['mean_change']:+.3f} |"
            )
    return "\n".join(lines) + "\n"
