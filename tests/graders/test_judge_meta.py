"""Judge meta-evaluation: Cohen's kappa by hand, and the bias probes catching a
length-loving judge and a first-position-loving group judge."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from judge_standin import StandinJudge, split_blocks

from rldojo.graders import load
from rldojo.graders.judges.meta_eval import agreement, cohen_kappa, evaluate_judge, normalise_label
from rldojo.graders.offline import GradeRow
from rldojo.inference import ScriptedEngine, start_server


def test_kappa_and_confusion_by_hand():
    assert cohen_kappa([]) is None
    assert cohen_kappa([("a", "a"), ("b", "b")]) == 1.0
    # p_o = 1/2; both raters 1/2 pass -> p_e = 1/2 -> kappa 0
    assert cohen_kappa([("p", "p"), ("p", "f"), ("f", "p"), ("f", "f")]) == 0.0
    result = agreement(["pass", "fail", "pass"], ["pass", None, "fail"])
    assert (result.rows, result.scored, result.coverage) == (3, 2, pytest.approx(2 / 3))
    assert result.accuracy == 0.5
    assert result.confusion == {"fail": {"fail": 0, "pass": 0}, "pass": {"fail": 1, "pass": 1}}


@pytest.mark.parametrize(
    ("raw", "label"),
    [(True, "pass"), (0, "fail"), ("Yes", "pass"), ("FAIL", "fail"), ("neutral", "neutral")],
)
def test_labels_are_normalised(raw, label):
    assert normalise_label(raw) == label


def rows(texts, item=None):
    item = item or {"question": "Describe Paris.", "answer": "Paris"}
    return [GradeRow(i + 1, dict(item), {"output_text": t}, {}) for i, t in enumerate(texts)]


def length_loving(request):
    """A score_model judge that scores by length: 1 point per 100 characters, up to 1."""
    system = request.messages[0]["content"]
    nonce = re.search(r'"sample_id": "(\w+)"', system).group(1)
    _, blocks = split_blocks("\n".join(m["content"] for m in request.messages))
    return json.dumps({"sample_id": nonce, "result": min(1.0, len(blocks["SAMPLE"]) / 100)})


def test_length_probe_catches_a_length_loving_judge():
    engine = ScriptedEngine(length_loving)
    with start_server(engine) as server:
        spec = {
            "type": "score_model",
            "model": "m",
            "input": [{"role": "user", "content": "Rate: {{sample.output_text}}"}],
            "judge": {"base_url": server.url, "model": server.model},
            "pass_threshold": 0.5,
        }

        async def run():
            grader = load(spec, cache=False)
            texts = ["Paris is the capital of France.", "It is Paris, on the Seine."]
            report = await evaluate_judge(grader, rows(texts), ["pass", "pass"], threshold=0.5)
            await grader.close()
            return report

        report = asyncio.run(run())
    bias = report["length_bias"]
    assert bias["pairs"] == 2 and bias["longer_scored_higher"] == 1.0
    assert bias["mean_delta"] > 0.3 and bias["flips_to_pass"] == 2
    assert report["agreement"]["accuracy"] == 0.0  # short answers judged "fail"


def first_loving(request):
    """A group judge that gives the first response shown 1.0 and every other 0.5."""
    user = request.messages[1]["content"]
    nonce = re.search(r"\(ID (\w+)\)", user).group(1)
    labels = sorted(set(re.findall(r"<<<(S\d+) ", user)), key=lambda s: int(s[1:]))
    scores = [{"sample": s, "score": 1.0 if s == "S1" else 0.5} for s in labels]
    return json.dumps({"group_id": nonce, "scores": scores})


@pytest.mark.parametrize(("reply", "advantage"), [(first_loving, 0.5), (StandinJudge(), 0.0)])
def test_position_probe(reply, advantage):
    engine = ScriptedEngine(reply)
    with start_server(engine) as server:
        spec = {
            "type": "group_judge",
            "judge": {"base_url": server.url, "model": server.model},
            "instructions": 'Prefer "Paris".',
        }

        async def run():
            grader = load(spec, cache=False)
            texts = ["Paris.", "Lyon.", "Paris, France."]
            report = await evaluate_judge(
                grader, rows(texts), ["pass", "fail", "pass"], threshold=0.5
            )
            await grader.close()
            return report

        report = asyncio.run(run())
    position = report["position_bias"]
    assert position["groups"] == 1
    assert position["first_position_advantage"] == pytest.approx(advantage)
