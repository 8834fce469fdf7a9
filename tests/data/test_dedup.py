"""Near-duplicate removal: normalisation, containment of short texts, n-gram overlap."""

from __future__ import annotations

import pytest

from rldojo.data.dedup import NgramIndex, dedup_tasks, normalise_text, task_text
from rldojo.envs.registry import make_env
from rldojo.types import Task

LONG = (
    "A farmer has 17 cows and buys 5 more at the market on Tuesday. Each cow gives 3 litres "
    "of milk a day. How many litres of milk does the farmer get per day now?"
)


def test_normalise_text():
    assert normalise_text("  What IS 23 + 45?\n") == "what is 23 + 45"
    assert normalise_text("Ｆｕｌｌ－width: x=2") == "full - width x = 2"
    assert normalise_text("23 + 45") != normalise_text("23 - 45")


def test_exact_contained_and_ngram_matches():
    index = NgramIndex(["What is 23 + 45?\nShow your work.", LONG, "Unrelated text about cats."])
    assert index.match("what is 23 + 45") == (0, "contained", 1.0)
    assert index.match("What is 23 + 456?") is None  # token-aligned: 456 is not 45
    assert index.match("unrelated text about cats!")[:2] == (2, "exact")
    edited = LONG.replace("Tuesday", "Friday").replace("3 litres", "4 litres")
    ref, kind, overlap = index.match(edited)
    assert (ref, kind) == (1, "ngram") and 0.5 <= overlap < 1.0
    assert (
        index.match("A farmer has many cows. " + "Completely different words follow here " * 3)
        is None
    )


def test_boilerplate_ngrams_are_ignored():
    boiler = "Solve the problem and end with a line of the form Answer number please"
    refs = [f"Question {i} about topic {i * 7}. {boiler}" for i in range(40)]
    index = NgramIndex(refs, n=5)
    assert index.match(f"A brand new question about zebras. {boiler}") is None
    assert index.match(refs[3])[1] == "exact"


def test_dedup_tasks_against_a_seen_set_and_within():
    tasks = make_env("arith-v1").tasks("test", n=30)  # test questions are distinct
    seen = [tasks[2].info["question"], tasks[5].prompt]  # a question, and a full prompt
    dup = Task("dup", tasks[0].prompt, tasks[0].answer, dict(tasks[0].info), "arith-v1")
    kept, removed = dedup_tasks([*tasks, dup], seen)
    removed_ids = {t.id: m for t, m in removed}
    assert set(removed_ids) == {tasks[2].id, tasks[5].id, "dup"}
    assert removed_ids["dup"].ref_index == -1  # duplicates tasks[0] of the same list
    assert len(kept) == 28
    train = make_env("arith-v1").tasks("train", n=30)  # the train split repeats a question
    _, removed = dedup_tasks(train)
    assert [(t.id, m.ref_index) for t, m in removed] == [("arith-v1/train/0/28", -9)]
    assert task_text(tasks[0]) == tasks[0].info["question"]
    chat = Task("c", [{"role": "system", "content": "s"}, {"role": "user", "content": "Hi?"}])
    assert task_text(chat) == "Hi?"
    with pytest.raises(ValueError):
        NgramIndex(n=0)
