"""The data of a supervised fine-tuning job: OpenAI chat fine-tuning rows, as `rldojo sft`
demonstrations.

A row is ``{"messages": [{"role", "content"}, ...], "tools": [...] (optional)}`` with
roles system, user, assistant and tool, and at least one assistant turn (the tokens the
loss is on). `read_sft_rows(path, name)` checks every row up front through
`rldojo.training.sft.read_demos` and raises `DataError` as ``"<name>:<line>: field ..."``
(the uploaded file's name, not where the service stored it). What OpenAI accepts and
this service does not is refused the same way, never silently dropped:

- an assistant message with `"weight": 0` (OpenAI: do not train on that turn; here every
  assistant turn trains), and a weight other than 0 or 1;
- structured `tool_calls` on an assistant message (write the call in `content`, as the
  model's chat template does);
- `content` that is not a string (a list of parts).

`validation_loss(checkpoint, path, name, ...)` is the mean negative log-likelihood (and
the share of argmax hits) of the trained model over the assistant tokens of the
validation rows: the same replay (`rldojo.rollout.replay`) and mask as training, without
gradient. The job reports it as OpenAI's `full_valid_loss` and
`full_valid_mean_token_accuracy`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rldojo.data.loading import DataError, read_rows
from rldojo.training.sft import Demo, read_demos

__all__ = ["read_sft_rows", "renamed", "validation_loss"]


def renamed(exc: DataError, path: str, where: str) -> DataError:
    """The same error naming the uploaded file instead of the stored path."""
    if exc.path != path:
        return exc
    text = str(exc)
    prefix = f"{path}:{exc.line}: " if exc.line is not None else f"{path}: "
    return DataError(where, exc.line, text.removeprefix(prefix))


def _check_extras(row: Mapping[str, Any], where: str, line: int) -> None:
    messages = row.get("messages")
    if not isinstance(messages, list):
        return  # read_demos names it
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            continue
        field = f"field 'messages[{i}]'"
        if "weight" in m:
            if m["weight"] == 0:
                raise DataError(
                    where,
                    line,
                    f"{field}.weight: 0 is not supported here (every assistant turn is "
                    "trained on); remove the turn or its weight",
                )
            if m["weight"] != 1 or isinstance(m["weight"], bool):
                raise DataError(where, line, f"{field}.weight: expected 0 or 1")
        if m.get("tool_calls"):
            raise DataError(
                where,
                line,
                f"{field}.tool_calls: structured tool calls are not supported; write the "
                "call in 'content' as the model's chat template does",
            )


def read_sft_rows(path: str | os.PathLike[str], name: str | None = None) -> list[Demo]:
    """Every row of a supervised file as a demonstration, checked (module docstring)."""
    stored = os.fspath(path)
    where = name or stored
    try:
        for line, row in read_rows(stored):
            _check_extras(row, where, line)
        demos, _ = read_demos(stored, only_passed=False)
    except DataError as exc:
        raise renamed(exc, stored, where) from None
    if not demos:
        raise DataError(where, None, "no rows")
    return demos


def validation_loss(
    checkpoint: str,
    path: str,
    name: str | None,
    *,
    max_seq_len: int,
    micro_batch_size: int,
    device: str = "auto",
) -> dict[str, Any]:
    """The trained model's loss on the validation rows (module docstring)."""
    import torch

    from rldojo.policy.device import resolve_device
    from rldojo.policy.models import load_model
    from rldojo.training.batch import build_token_batch, completion_logits
    from rldojo.training.sft import tokenize_demos

    demos = read_sft_rows(path, name)
    model, tokenizer = load_model(checkpoint)
    model.to(resolve_device(device)).eval()
    try:
        demo_set = tokenize_demos(demos, tokenizer, max_seq_len=max_seq_len, path=name or path)
    except DataError as exc:
        raise renamed(exc, path, name or path) from None
    rollouts = demo_set.rollouts
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    nll, hits, tokens = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, len(rollouts), micro_batch_size):
            batch = build_token_batch(rollouts[start : start + micro_batch_size], pad_id)
            batch = batch.to(next(model.parameters()).device)
            where = batch.policy_mask  # [M, T]
            logits = completion_logits(model, batch, share_prefix=False)[where].float()  # [N, V]
            targets = batch.completion_ids[where]  # [N]
            nll += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
            hits += int((logits.argmax(-1) == targets).sum())
            tokens += int(targets.numel())
    return {
        "full_valid_loss": nll / max(tokens, 1),
        "full_valid_mean_token_accuracy": hits / max(tokens, 1),
        "valid_tokens": tokens,
        "valid_rows": len(rollouts),
        "valid_left_out": dict(demo_set.skipped),
    }
