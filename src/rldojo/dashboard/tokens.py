"""A rollout's completion as the viewer draws it: segments of policy tokens (the model's
turns, coloured by entropy, the mask's selection outlined) and of environment tokens (tool
results and env turns, which carry no loss).

Token text comes from the run's tokenizer (`model.name` of its config), each token
decoded alone; when the tokenizer cannot be loaded (a model directory since deleted) a
token shows as its id, and the page says so.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rldojo.policy.base import Tokenizer

TOKENIZER_CACHE = 4
"""Tokenizers kept loaded (one per model name)."""


@functools.lru_cache(maxsize=TOKENIZER_CACHE)
def _tokenizer(name: str) -> Tokenizer:
    from rldojo.policy.models import load_tokenizer

    return load_tokenizer(name)


def tokenizer_for(name: str | None) -> tuple[Tokenizer | None, str | None]:
    """(tokenizer, None) or (None, why not)."""
    if not name:
        return None, "the run's config names no model"
    try:
        return _tokenizer(name), None
    except Exception as exc:  # any load failure: the viewer falls back to token ids
        return None, f"tokenizer of {name!r} not loadable ({type(exc).__name__})"


def segments(rollout: dict[str, Any], tokenizer: Tokenizer | None) -> list[dict[str, Any]]:
    """Consecutive runs of policy / non-policy completion tokens. Each token:
    `t` text, `lp` behaviour logprob, `h` entropy (nats), `sel` selected by the mask."""
    ids = rollout["completion_ids"]
    mask = rollout["policy_mask"]
    logprobs = rollout["logprobs"]
    entropies = rollout["entropies"]
    selected = set(rollout.get("selected") or [])
    out: list[dict[str, Any]] = []
    for pos, tok in enumerate(ids):
        policy = bool(mask[pos]) if pos < len(mask) else False
        text = tokenizer.decode([tok]) if tokenizer is not None else f"⟨{tok}⟩"
        token = {
            "i": pos,
            "t": text,
            "lp": logprobs[pos] if pos < len(logprobs) else None,
            "h": entropies[pos] if pos < len(entropies) else None,
            "sel": pos in selected,
        }
        if not out or out[-1]["policy"] != policy:
            out.append({"policy": policy, "tokens": []})
        out[-1]["tokens"].append(token)
    return out


def turns(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(prompt messages, later messages): the conversation before the first assistant turn
    is the prompt; the rest is what the completion tokens spell."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    return messages[:first], messages[first:]
