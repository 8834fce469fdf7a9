"""Online curriculum: saturation, weights, weighted sampling, metrics, checkpoint state."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from rldojo.data.curriculum import Curriculum, CurriculumConfig
from rldojo.types import Task

TASKS = [Task(f"t{i}", "q", "1", {"level": 1 + i % 2}) for i in range(10)]


def test_status_and_weight_follow_the_recent_window():
    cur = Curriculum(TASKS, CurriculumConfig(window=2, saturated_weight=0.1))
    assert cur.status("t0") == "new" and cur.weight("t0") == 1.0
    cur.observe("t0", [1.0, 1.0, 1.0])
    assert cur.status("t0") == "mixed" and cur.weight("t0") == 1.0  # one group is not enough
    cur.observe("t0", [1.0, 1.0])
    assert cur.status("t0") == "all_correct" and cur.weight("t0") == pytest.approx(0.1)
    cur.observe("t0", [1.0, 0.0])  # a mixed group brings it back
    assert cur.weight("t0") == 1.0
    cur.observe("t1", [0.0, -0.5])
    cur.observe("t1", [-0.5, -0.5])
    assert cur.status("t1") == "all_wrong"
    cur.observe("t2", [])  # nothing valid: ignored
    assert cur.status("t2") == "new"
    retire = Curriculum(TASKS, CurriculumConfig(window=1, mode="retire"))
    retire.observe("t3", [1.0])
    assert retire.weight("t3") == 0.0


def test_sampling_avoids_saturated_tasks_and_falls_back():
    cur = Curriculum(TASKS, CurriculumConfig(window=1, mode="retire"))
    for t in TASKS[:8]:
        cur.observe(t.id, [0.0, 0.0])
    rng = random.Random(0)
    picked = cur.sample(TASKS, 2, rng)
    assert sorted(t.id for t in picked) == ["t8", "t9"]
    assert len(cur.sample(TASKS, 5, rng)) == 5  # only two live: repeated among them
    assert {t.id for t in cur.sample(TASKS, 5, rng)} <= {"t8", "t9"}
    for t in TASKS[8:]:
        cur.observe(t.id, [1.0])
    assert len(cur.sample(TASKS, 3, rng)) == 3 and cur.exhausted == 1  # all retired: uniform


def test_downweighted_tasks_are_drawn_in_proportion():
    cur = Curriculum(TASKS, CurriculumConfig(window=1, saturated_weight=0.1))
    for t in TASKS[:5]:
        cur.observe(t.id, [1.0, 1.0])
    rng = random.Random(1)
    counts = Counter(t.id for _ in range(2000) for t in cur.sample(TASKS, 1, rng))
    low = sum(counts[f"t{i}"] for i in range(5)) / 2000
    assert low == pytest.approx(0.5 / 5.5, abs=0.03)  # weights 5 x 0.1 against 5 x 1
    drawn = cur.sample(TASKS, 10, random.Random(2))
    assert len({t.id for t in drawn}) == 10  # without replacement


def test_metrics_per_difficulty_and_state_round_trip():
    cur = Curriculum(TASKS, CurriculumConfig(window=1))
    cur.observe("t0", [1.0, 1.0])  # level 1, all correct
    cur.observe("t2", [1.0, 0.0])  # level 1, mixed
    cur.observe("t1", [0.0, 0.0])  # level 2, all wrong
    cur.observe("zz", [1.0, 0.0])  # not registered: difficulty "unknown"
    m = cur.metrics()
    assert m["curriculum/observed"] == 4
    assert (m["curriculum/all_correct"], m["curriculum/all_wrong"]) == (1, 1)
    assert m["curriculum/difficulty/1/pass_rate"] == pytest.approx(0.75)
    assert m["curriculum/difficulty/1/saturated"] == pytest.approx(0.5)
    assert m["curriculum/difficulty/2/pass_rate"] == 0.0
    assert m["curriculum/difficulty/unknown/observed"] == 1
    state = json.loads(json.dumps(cur.state_dict()))  # JSON-able for checkpoints
    fresh = Curriculum(TASKS, CurriculumConfig(window=1))
    fresh.load_state_dict(state)
    assert fresh.metrics() == m and fresh.weight("t0") == cur.weight("t0")
    with pytest.raises(ValueError):
        fresh.load_state_dict({"version": 9})
    with pytest.raises(ValueError):
        CurriculumConfig(window=0)


def test_draw_thins_a_stream_and_never_stalls():
    cur = Curriculum(TASKS, CurriculumConfig(window=1, mode="retire"))
    for t in TASKS[:5]:
        cur.observe(t.id, [1.0])
    position = 0

    def stream(k):  # the trainer's mixture: an endless epoch-ordered stream
        nonlocal position
        out = [TASKS[(position + i) % len(TASKS)] for i in range(k)]
        position += k
        return out

    drawn = cur.draw(stream, 4, random.Random(0))
    assert [t.id for t in drawn] == ["t5", "t6", "t7", "t8"]  # order kept, retired skipped
    for t in TASKS:
        cur.observe(t.id, [0.0])
    assert len(cur.draw(stream, 3, random.Random(0), max_draws=5)) == 3
    assert cur.exhausted == 1
