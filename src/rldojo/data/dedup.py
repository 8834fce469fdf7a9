"""Near-duplicate removal: normalised-text equality and word n-gram overlap.

Used by curation to drop tasks that duplicate a given set (e.g. questions already seen in
supervised training, or a test set) before spending model calls on them. Texts are
normalised (Unicode NFKC, lowercase, words, numbers and arithmetic symbols kept, other
punctuation dropped) and compared three ways:

1. exact: equal normalised text;
2. contained: a short text (fewer than `n` tokens) that appears whole, token-aligned,
   inside a reference text ("What is 23 + 45?" inside "What is 23 + 45? Show work.");
3. n-gram: the share of the candidate's word n-grams found in one reference text
   (containment, as in GPT-3's contamination check, which used 13-grams on documents;
   8 suits task-sized texts) is at least `threshold`.

N-grams found in more than `max_df` of the references (shared boilerplate such as an
answer instruction) are ignored, so they neither create matches nor cost time. Tasks are
compared by their question (`info["question"]` when present), not the full prompt.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rldojo.types import Task

__all__ = ["DuplicateMatch", "NgramIndex", "dedup_tasks", "normalise_text", "task_text"]

_TOKEN = re.compile(r"[^\W_]+|[+\-*/=^<>%]")


def normalise_text(text: str) -> str:
    """Lowercase NFKC text as space-separated tokens (words, numbers, math symbols)."""
    return " ".join(_TOKEN.findall(unicodedata.normalize("NFKC", text).lower()))


def task_text(task: Task) -> str:
    """The text a task is compared by: its question, else its prompt (user turns)."""
    question = task.info.get("question")
    if isinstance(question, str) and question.strip():
        return question
    if isinstance(task.prompt, str):
        return task.prompt
    return "\n".join(m["content"] for m in task.prompt if m.get("role") == "user")


@dataclass(frozen=True)
class DuplicateMatch:
    """Candidate `index` duplicates reference `ref_index` (`kind`: exact | contained | ngram)."""

    index: int
    ref_index: int
    kind: str
    overlap: float


def _grams(tokens: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


class NgramIndex:
    """An index of reference texts for near-duplicate lookups (see the module docstring)."""

    def __init__(
        self, texts: Iterable[str] = (), *, n: int = 8, threshold: float = 0.5, max_df: float = 0.1
    ) -> None:
        if n < 1 or not 0.0 < threshold <= 1.0:
            raise ValueError(f"need n >= 1 and 0 < threshold <= 1, got {n}, {threshold}")
        self.n, self.threshold, self.max_df = n, threshold, max_df
        self.norm: list[str] = []
        self._exact: dict[str, int] = {}
        self._grams: dict[tuple[str, ...], list[int]] = {}
        self._words: dict[str, list[int]] = {}
        for text in texts:
            self.add(text)

    def add(self, text: str) -> int:
        """Index one more reference text; returns its index."""
        index = len(self.norm)
        norm = normalise_text(text)
        tokens = norm.split()
        self.norm.append(norm)
        self._exact.setdefault(norm, index)
        for gram in _grams(tokens, self.n):
            self._grams.setdefault(gram, []).append(index)
        for word in set(tokens):
            self._words.setdefault(word, []).append(index)
        return index

    def _common(self, postings: list[int]) -> bool:
        """Boilerplate: in more than max_df of the references (and at least 20 of them)."""
        return len(postings) >= 20 and len(postings) > self.max_df * len(self.norm)

    def _contained(self, tokens: list[str], norm: str) -> int | None:
        postings = [self._words.get(w, []) for w in tokens]
        if not tokens or any(not p for p in postings):
            return None
        padded = f" {norm} "
        for ref in min(postings, key=len):  # only texts with the candidate's rarest word
            if padded in f" {self.norm[ref]} ":
                return ref
        return None

    def match(self, text: str) -> tuple[int, str, float] | None:
        """The best reference `(index, kind, overlap)` that `text` duplicates, or None."""
        norm = normalise_text(text)
        if norm in self._exact:
            return self._exact[norm], "exact", 1.0
        tokens = norm.split()
        if len(tokens) < self.n:
            ref = self._contained(tokens, norm)
            return None if ref is None else (ref, "contained", 1.0)
        grams = [g for g in _grams(tokens, self.n) if not self._common(self._grams.get(g, []))]
        if not grams:
            return None
        shared: Counter[int] = Counter()
        for gram in grams:
            shared.update(set(self._grams.get(gram, ())))
        if not shared:
            return None
        ref, count = shared.most_common(1)[0]
        overlap = count / len(grams)
        return (ref, "ngram", overlap) if overlap >= self.threshold else None


def dedup_tasks(
    tasks: Sequence[Task],
    reference: Iterable[str] = (),
    *,
    n: int = 8,
    threshold: float = 0.5,
    within: bool = True,
) -> tuple[list[Task], list[tuple[Task, DuplicateMatch]]]:
    """Split `tasks` into kept and removed (with the match that removed each).

    A task is removed when it duplicates a `reference` text or, with `within`, an
    earlier kept task of the same list (then `ref_index` is negative: -1 - its position
    in `tasks`).
    """
    index = NgramIndex(reference, n=n, threshold=threshold)
    n_ref = len(index.norm)
    seen = NgramIndex(n=n, threshold=threshold)
    seen_pos: list[int] = []
    kept: list[Task] = []
    removed: list[tuple[Task, DuplicateMatch]] = []
    for i, task in enumerate(tasks):
        text = task_text(task)
        hit = index.match(text) if n_ref else None
        if hit is not None:
            removed.append((task, DuplicateMatch(i, hit[0], hit[1], hit[2])))
            continue
        own = seen.match(text) if within and seen.norm else None
        if own is not None:
            removed.append((task, DuplicateMatch(i, -1 - seen_pos[own[0]], own[1], own[2])))
            continue
        kept.append(task)
        if within:
            seen.add(text)
            seen_pos.append(i)
    return kept, removed
