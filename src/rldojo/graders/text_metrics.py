"""String checks and text-similarity metrics of OpenAI's `string_check` / `text_similarity`.

Each metric is the well-kept library's own implementation, called the way OpenAI's grader
documentation describes, and returns a float in [0, 1]:

    fuzzy_match   rapidfuzz.fuzz.WRatio(output, reference) / 100
    bleu          sacrebleu.sentence_bleu(output, [reference]).score / 100
    gleu          nltk sentence_gleu([reference.split()], output.split())
    meteor        nltk meteor_score([reference.split()], output.split())
    rouge_1..5    rouge-score RougeScorer(["rougeN"], use_stemmer=True) F-measure
    rouge_l       the same with "rougeL"
    cosine        cosine of two embedding vectors (the embedding model is configured
                  separately; see `rldojo.graders.specs.openai_text`)

METEOR's synonym stage needs the WordNet corpus. NLTK's data is not a Python package and
there is no network at run time, so when WordNet is not installed (``nltk.download
("wordnet")`` or Debian's ``wordnet-base``) METEOR runs with exact and stem matching only;
`meteor_wordnet()` says which, and graders record it in provenance.

String checks: ``eq`` (equal), ``ne`` (not equal), ``like`` (reference is contained in
input, case-sensitive) and ``ilike`` (the same, case-insensitive).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "SIMILARITY_METRICS",
    "STRING_OPERATIONS",
    "cosine_similarity",
    "meteor_wordnet",
    "similarity",
    "string_check",
]

STRING_OPERATIONS = ("eq", "ne", "like", "ilike")
ROUGE_METRICS = {f"rouge_{n}": f"rouge{n}" for n in range(1, 6)} | {"rouge_l": "rougeL"}
SIMILARITY_METRICS = ("fuzzy_match", "bleu", "gleu", "meteor", "cosine", *ROUGE_METRICS)


def string_check(input_text: str, reference: str, operation: str) -> bool:
    """The string check `operation` of `input_text` against `reference`."""
    if operation == "eq":
        return input_text == reference
    if operation == "ne":
        return input_text != reference
    if operation == "like":
        return reference in input_text
    if operation == "ilike":
        return reference.lower() in input_text.lower()
    raise ValueError(f"unknown string_check operation {operation!r} ({STRING_OPERATIONS})")


class _NoSynonyms:
    """Stands in for the WordNet reader when the corpus is missing: no synonym matches."""

    def synsets(self, *args: object, **kwargs: object) -> list[Any]:
        return []


@functools.cache
def _wordnet() -> tuple[Any, str]:
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    try:
        from nltk.corpus import wordnet

        wordnet.ensure_loaded()
        return wordnet, "nltk-wordnet"
    except LookupError:
        pass
    debian = Path("/usr/share/wordnet")
    if (debian / "data.noun").exists():
        return WordNetCorpusReader(str(debian), None), "debian-wordnet"
    return _NoSynonyms(), "none (exact and stem matches only)"


def meteor_wordnet() -> str:
    """Which WordNet METEOR uses here (see the module docstring)."""
    return _wordnet()[1]


@functools.cache
def _rouge_scorer(kind: str) -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([kind], use_stemmer=True)


def similarity(metric: str, output: str, reference: str) -> float:
    """`metric` (any of `SIMILARITY_METRICS` except cosine) of `output` against `reference`."""
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz

        return float(fuzz.WRatio(output, reference)) / 100.0
    if metric == "bleu":
        import sacrebleu

        score = float(sacrebleu.sentence_bleu(output, [reference]).score) / 100.0
        return min(1.0, max(0.0, score))  # 100.00000000000004 happens
    if metric == "gleu":
        from nltk.translate.gleu_score import sentence_gleu

        return float(sentence_gleu([reference.split()], output.split()))
    if metric == "meteor":
        from nltk.translate.meteor_score import meteor_score

        return float(meteor_score([reference.split()], output.split(), wordnet=_wordnet()[0]))
    if metric in ROUGE_METRICS:
        kind = ROUGE_METRICS[metric]
        return float(_rouge_scorer(kind).score(reference, output)[kind].fmeasure)
    if metric == "cosine":
        raise ValueError("cosine needs embeddings: use cosine_similarity on two vectors")
    raise ValueError(f"unknown evaluation_metric {metric!r} ({', '.join(SIMILARITY_METRICS)})")


def cosine_similarity(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine of the angle between two vectors (0.0 when either is all zeros)."""
    if len(a) != len(b):
        raise ValueError(f"embedding sizes differ: {len(a)} vs {len(b)}")
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0
