"""Per-token texts and log-probabilities of a completion, for OpenAI's `logprobs` field.

Engines fill `ChatChoice.pieces` and `ChatChoice.logprobs` with these; the HTTP layer
writes them out with `logprobs_json` (whole replies and stream chunks alike).

What a choice reports for each completion token (one entry per token, EOS included):

- `token`: the text this token adds to the message content, so a choice's tokens join to
  exactly its content. A character split over several tokens belongs to the token that
  completes it (the earlier ones add ""); special tokens (EOS) add ""; text from a stop
  string on is cut, as it is from the content. `bytes` is the UTF-8 of `token`.
- `logprob`: the token's log-probability under the raw model distribution: log-softmax
  of the generating model's logits, before temperature and top_p. This is vLLM's default
  (`logprobs_mode="raw_logprobs"`) and what OpenAI returns, so the value for a given
  prompt and completion does not depend on the request's temperature, and a greedy
  token is the most likely one. Values are clamped at -9999.0 (JSON has no -inf).
- `top_logprobs`: the K most likely tokens at that position under the same distribution,
  most likely first. Each alternative is its token decoded on its own (special tokens by
  name); the entry for the token actually chosen uses the same text as `token`.

`TransformersEngine` computes them after generation with one forward pass of prompt +
completion through the model that generated (its dtype included): the sampler keeps
only the chosen token's log-probability, at the sampling temperature. That pass sees the
same logits as decoding did, up to floating-point summation order (a cached decode and a
full forward pass add in different orders; in bf16 the two may differ in the last bits).
A streamed reply cannot wait for that pass: its entries come from the logits each token
was sampled from (`token_entries`), the same distribution up to that summation order.
`echo` on /v1/completions scores the prompt's own tokens with one pass too
(`score_sequence`); the first prompt token, which nothing precedes, has no logprob.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rldojo.policy.base import Tokenizer

if TYPE_CHECKING:
    import torch

__all__ = [
    "LOGPROB_FLOOR",
    "TokenLogprob",
    "logprobs_json",
    "prompt_pieces",
    "score_sequence",
    "score_tokens",
    "scripted_logprobs",
    "token_entries",
    "token_pieces",
    "word_pieces",
]

LOGPROB_FLOOR = -9999.0
"""Lowest logprob reported (vLLM's floor too): -inf is not valid JSON."""


@dataclass(frozen=True)
class TokenLogprob:
    """One completion token: its text, log-probability and the K most likely alternatives."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()
    """(token text, logprob) of the most likely tokens at this position, most likely first."""


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _exact_pieces(tokenizer: Tokenizer, token_ids: Sequence[int], text: str) -> tuple[str, ...]:
    """Token i adds what decode(ids[:i+1]) agrees with `text` beyond decode(ids[:i]).

    Quadratic in the completion's length; only used when `_incremental_pieces` disagrees.
    """
    pieces: list[str] = []
    done = 0
    for i in range(1, len(token_ids) + 1):
        prefix = tokenizer.decode(list(token_ids[:i]), skip_special_tokens=True)
        reach = min(_common_prefix_len(prefix, text), len(text))
        pieces.append(text[done:reach] if reach > done else "")
        done = max(done, reach)
    if pieces and done < len(text):
        pieces[-1] += text[done:]
    return tuple(pieces)


def _incremental_pieces(
    tokenizer: Tokenizer, token_ids: Sequence[int], *, skip_special: bool = True
) -> list[str]:
    """Streaming detokenization over a short window of earlier tokens (linear time).

    A token whose text would end in U+FFFD (an incomplete UTF-8 character) adds nothing
    yet; the window keeps the earlier tokens so merged characters decode whole.
    """
    pieces: list[str] = []
    start = read = 0  # window start; first token not yet turned into text
    ids = list(token_ids)
    for i in range(1, len(ids) + 1):
        before = tokenizer.decode(ids[start:read], skip_special_tokens=skip_special)
        after = tokenizer.decode(ids[start:i], skip_special_tokens=skip_special)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            pieces.append(after[len(before) :])
            start, read = read, i
        else:
            pieces.append("")
    return pieces


def token_pieces(tokenizer: Tokenizer, token_ids: Sequence[int], text: str) -> tuple[str, ...]:
    """The text each of `token_ids` adds to `text` (the decoded, stop-cut content).

    One piece per token; the pieces join to `text` exactly (see the module docstring).
    """
    pieces: list[str] = []
    done = 0
    for piece in _incremental_pieces(tokenizer, token_ids):
        kept = piece[: max(0, len(text) - done)]
        pieces.append(kept)
        done += len(kept)
    joined = "".join(pieces)
    if pieces and text.startswith(joined):  # e.g. a last character left incomplete
        pieces[-1] += text[len(joined) :]
    elif joined != text:  # a tokenizer whose decode is not prefix-stable
        return _exact_pieces(tokenizer, token_ids, text)
    return tuple(pieces)


def score_tokens(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    prompt: Sequence[int],
    token_ids: Sequence[int],
    pieces: Sequence[str],
    top_k: int,
) -> tuple[TokenLogprob, ...]:
    """Raw-model logprobs of `token_ids` after `prompt`, with the `top_k` alternatives.

    One forward pass of prompt + completion (all but the last token, whose successor is
    not needed), keeping the logits of the completion's positions only.
    """
    return score_sequence(model, tokenizer, [*prompt, *token_ids], len(prompt), pieces, top_k)


def score_sequence(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    ids: Sequence[int],
    start: int,
    pieces: Sequence[str],
    top_k: int,
) -> tuple[TokenLogprob, ...]:
    """Raw-model logprobs of `ids[start:]` (`start` >= 1), each given the ids before it,
    with the `top_k` alternatives; `pieces`: the text of each of those tokens. One
    forward pass: how `echo` scores a prompt's tokens (/v1/completions)."""
    import torch

    n = len(ids) - start
    if n <= 0:
        return ()
    if start < 1:
        raise ValueError("the first token has no logprob: start must be >= 1")
    inputs = torch.tensor([list(ids[:-1])], dtype=torch.long)  # [1, L-1]
    with torch.no_grad():
        logits = model(input_ids=inputs, logits_to_keep=n).logits[0]  # [N, V]
    return token_entries(tokenizer, logits, ids[start:], pieces, top_k)


def token_entries(
    tokenizer: Tokenizer,
    logits: torch.Tensor,
    token_ids: Sequence[int],
    pieces: Sequence[str],
    top_k: int,
) -> tuple[TokenLogprob, ...]:
    """One `TokenLogprob` per token from the raw logits it was drawn from (`logits`
    [N, V], row i for token i): the log-softmax, clamped at `LOGPROB_FLOOR`."""
    import torch

    logp = torch.log_softmax(logits.float(), dim=-1).clamp_(min=LOGPROB_FLOOR)  # [N, V]
    index = torch.tensor(list(token_ids), dtype=torch.long, device=logp.device)  # [N]
    chosen = logp.gather(-1, index[:, None])[:, 0].tolist()  # [N]
    top_lp, top_ids = logp.topk(top_k, dim=-1)  # [N, K]
    names = _token_names(tokenizer, top_ids.flatten().tolist())
    entries = []
    for pos, (tok, piece) in enumerate(zip(token_ids, pieces, strict=True)):
        top = tuple(
            (piece if alt == tok else names[alt], lp)
            for alt, lp in zip(top_ids[pos].tolist(), top_lp[pos].tolist(), strict=True)
        )
        entries.append(TokenLogprob(piece, float(chosen[pos]), top))
    return tuple(entries)


def prompt_pieces(tokenizer: Tokenizer, token_ids: Sequence[int]) -> tuple[str, ...]:
    """The text of each prompt token, special tokens written out (a prompt is echoed as
    it was given); they join to the prompt's decoded text."""
    pieces = _incremental_pieces(tokenizer, token_ids, skip_special=False)
    whole = tokenizer.decode(list(token_ids), skip_special_tokens=False)
    joined = "".join(pieces)
    if pieces and whole.startswith(joined):  # a last character left incomplete
        pieces[-1] += whole[len(joined) :]
    return tuple(pieces)


def _token_names(tokenizer: Tokenizer, ids: list[int]) -> dict[int, str]:
    unique = sorted(set(ids))
    if not unique:
        return {}
    texts = tokenizer.batch_decode([[i] for i in unique], skip_special_tokens=False)
    return dict(zip(unique, texts, strict=True))


# ----------------------------------------------------------------------------- scripted

_WORD = re.compile(r"\s*\S+")


def word_pieces(text: str) -> tuple[str, ...]:
    """`text` cut into whitespace-led words (trailing space joins the last): scripted tokens."""
    pieces = _WORD.findall(text)
    if not pieces:
        return (text,) if text else ()
    pieces[-1] += text[sum(map(len, pieces)) :]
    return tuple(pieces)


def scripted_logprobs(pieces: Sequence[str], top_k: int) -> tuple[TokenLogprob, ...]:
    """Deterministic logprobs for a scripted reply: every token has probability 1/2 and is
    the most likely; alternative j (`alt1`, `alt2`, ...) has probability e^-j / 2."""
    chosen = -math.log(2.0)
    entries = []
    for piece in pieces:
        top = ((piece, chosen), *((f"alt{j}", chosen - j) for j in range(1, top_k)))
        entries.append(TokenLogprob(piece, chosen, top[:top_k]))
    return tuple(entries)


def logprobs_json(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's `choice.logprobs` object for these tokens."""
    return {
        "content": [
            {
                "token": e.token,
                "logprob": e.logprob,
                "bytes": list(e.token.encode("utf-8")),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))} for t, lp in e.top
                ],
            }
            for e in entries
        ],
        "refusal": None,
    }
