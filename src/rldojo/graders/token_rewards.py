"""Per-token rewards: a penalty on the tokens of a span of the completion.

A sequence reward says *that* a sample was bad; a token reward says *where*: the span of
a wrong intermediate step, a hallucinated fact, a forbidden phrase. Graders return them
in `Score.token_rewards`, aligned with `rollout.completion_ids` (one float per token, 0
on untouched tokens); the trainer adds them to the sequence advantage token by token.

Spans are character ranges of `rollout.completion` (the final policy turn). They are
mapped to tokens by decoding the final turn's tokens with the policy's tokenizer, one
prefix at a time, which gives each token the characters it added (a token that ends in
the middle of a multi-byte character gets none; the token that completes it gets the
character). Every token that overlaps a span gets that span's reward; overlapping spans
add up.

`SpanPenaltyGrader` wraps a sequence grader and adds token rewards for regex matches:

    SpanPenaltyGrader(answer_reward(), {r"(?i)as an ai language model": -0.5}, tokenizer)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from rldojo.graders.base import Grader
from rldojo.policy.base import Tokenizer
from rldojo.types import Rollout, Score, Task

__all__ = [
    "SpanPenaltyGrader",
    "final_turn_range",
    "quote_spans",
    "spans_to_token_rewards",
    "token_char_ranges",
]

Span = tuple[int, int, float]
"""(start, end, reward): characters [start, end) of the completion text."""


def token_char_ranges(
    tokenizer: Tokenizer, ids: Sequence[int]
) -> tuple[str, list[tuple[int, int]]]:
    """The decoded text of `ids` and the character range each token added to it."""
    ranges: list[tuple[int, int]] = []
    end = 0
    text = ""
    for i in range(len(ids)):
        text = tokenizer.decode(list(ids[: i + 1]), skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an unfinished multi-byte character: no text yet
            ranges.append((end, end))
            continue
        ranges.append((min(end, len(text)), len(text)))
        end = len(text)
    return text, ranges


def final_turn_range(rollout: Rollout) -> tuple[int, int]:
    """Token positions [start, end) of the final policy turn within `completion_ids`."""
    mask = rollout.policy_mask or (True,) * len(rollout.completion_ids)
    end = len(mask)
    while end > 0 and not mask[end - 1]:
        end -= 1
    start = end
    while start > 0 and mask[start - 1]:
        start -= 1
    return start, end


def spans_to_token_rewards(
    tokenizer: Tokenizer, rollout: Rollout, spans: Sequence[Span]
) -> tuple[float, ...] | None:
    """Token rewards for `spans` of `rollout.completion`; None if the text cannot be
    aligned with the tokens (no token ids, or the decoded tokens do not contain it)."""
    if not rollout.completion_ids:
        return None
    start, end = final_turn_range(rollout)
    text, ranges = token_char_ranges(tokenizer, rollout.completion_ids[start:end])
    base = text.find(rollout.completion) if rollout.completion else 0
    if base < 0:
        return None
    rewards = [0.0] * len(rollout.completion_ids)
    for lo, hi, reward in spans:
        lo, hi = lo + base, hi + base
        for j, (a, b) in enumerate(ranges):
            if a < hi and b > lo:
                rewards[start + j] += reward
    return tuple(rewards)


def quote_spans(text: str, quote: str, reward: float) -> list[Span]:
    """Every occurrence of `quote` in `text` (whitespace-insensitive) as a span."""
    quote = quote.strip()
    if not quote:
        return []
    pattern = r"\s+".join(re.escape(part) for part in quote.split())
    return [(m.start(), m.end(), reward) for m in re.finditer(pattern, text)]


class SpanPenaltyGrader:
    """`inner`'s score plus token rewards on regex matches in the completion.

    Args:
        inner: the sequence grader (its value, status and components are kept).
        patterns: regex -> reward for every token of each match (usually negative).
        tokenizer: the policy's tokenizer (or a model name for `load_tokenizer`).
    """

    version = "1"

    def __init__(
        self,
        inner: Grader,
        patterns: Mapping[str, float],
        tokenizer: Tokenizer | str,
        *,
        name: str = "span_penalty",
    ) -> None:
        if isinstance(tokenizer, str):
            from rldojo.policy.models import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self.inner = inner
        self.patterns = [(re.compile(p), float(r)) for p, r in patterns.items()]
        self.tokenizer = tokenizer
        self.name = name

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        score = await self.inner.grade(rollout, task)
        if not score.ok:
            return score
        spans = [
            (m.start(), m.end(), reward)
            for pattern, reward in self.patterns
            for m in pattern.finditer(rollout.completion)
            if m.end() > m.start()
        ]
        rewards = spans_to_token_rewards(self.tokenizer, rollout, spans) if spans else None
        if score.token_rewards is not None:  # keep the inner grader's own token rewards
            own = tuple(score.token_rewards)
            rewards = (
                own if rewards is None else tuple(a + b for a, b in zip(own, rewards, strict=True))
            )
        if spans and rewards is None and rollout.completion_ids:
            explanation = f"{score.explanation}; spans could not be aligned with tokens"
        else:
            explanation = score.explanation
        components = dict(score.components) | {"penalised_spans": float(len(spans))}
        return Score(
            score.value,
            components=components,
            flags=score.flags,
            token_rewards=rewards,
            explanation=explanation,
            provenance={"grader": self.name, "version": self.version, "inner": score.provenance},
        )
