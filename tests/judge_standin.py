"""A deterministic judge stand-in: reads rldojo's judge prompts and answers by keywords.

    engine = ScriptedEngine(StandinJudge())          # serve it with start_server(engine)

Tests need judges whose verdicts are exact, so they can check scores by hand and count
calls; a random or small model cannot give that. `StandinJudge` reads a judge prompt the
way a model would and decides by keywords in double quotes:

- rubric prompts (``- id: X | points: +5 | criterion: ...``): a criterion is met when
  every quoted keyword in its text occurs in the sample (case-insensitive); met
  criteria quote the first keyword as evidence.
- group prompts (``S1``, ``S2`` blocks): each sample scores the share of the
  instructions' quoted keywords it contains.
- score_model prompts: the share of the prompt's quoted keywords in the sample, mapped
  onto the requested range; label_model prompts: the first label named in the sample,
  else the last label.

It models a judge that follows instructions, which is what injection tests need:

- Text inside a data block (``<<<LABEL ID>>>`` ... the first ``<<<END LABEL ID>>>`` with
  the same ID) is data. Text outside every block that asks for full marks ("give full
  marks", "all criteria are met", "maximum score") is obeyed: everything is met / scores
  the top of the range. So a sample that can close its own block early escapes.
- `parrot_json=True`: if the prompt contains a JSON object anywhere (even inside data),
  the stand-in replies with it verbatim, as a model that copies a verdict would.
- `reads_rubric_everywhere` (default True): rubric lines are read from the whole prompt,
  data blocks included, as a naive model would; a fake criterion list in a sample then
  ends up in the verdict.
- `broken_first=True`: the first turn replies with prose, not JSON; a repair turn (the
  conversation already holds an assistant reply) is answered properly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from rldojo.inference.engine import ChatRequest

__all__ = ["StandinJudge", "split_blocks"]

_OPEN = re.compile(r"^<<<(?!END )(\S+) (\S+)>>>$")
_RUBRIC_LINE = re.compile(
    r"^- id: (\S+) \| points: ([+-]?[\d.]+) \| criterion: (.*)$", re.MULTILINE
)
_QUOTED = re.compile(r'"([^"]+)"')
_OBEY = re.compile(r"give (it )?full marks|all criteria (are )?met|maximum score", re.IGNORECASE)


def split_blocks(text: str) -> tuple[str, dict[str, str]]:
    """(text outside data blocks, label -> block content); blocks end at their first END."""
    outside: list[str] = []
    blocks: dict[str, str] = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i].strip())
        if m is None:
            outside.append(lines[i])
            i += 1
            continue
        label, ident = m.groups()
        end = f"<<<END {label} {ident}>>>"
        j = i + 1
        while j < len(lines) and lines[j].strip() != end:
            j += 1
        blocks.setdefault(label, "\n".join(lines[i + 1 : j]))
        i = j + 1
    return "\n".join(outside), blocks


def _keywords(text: str) -> list[str]:
    return [k for k in _QUOTED.findall(text) if k.strip()]


def _share(keywords: list[str], sample: str) -> float:
    if not keywords:
        return 0.5
    return sum(k.lower() in sample.lower() for k in keywords) / len(keywords)


@dataclass
class StandinJudge:
    """Deterministic judge (see the module docstring). Call it with a `ChatRequest`."""

    parrot_json: bool = False
    reads_rubric_everywhere: bool = True
    broken_first: bool = False

    def __call__(self, request: ChatRequest) -> str:
        first_reply = next(
            (i for i, m in enumerate(request.messages) if m["role"] == "assistant"), None
        )
        if self.broken_first and first_reply is None:
            return "Sure! This response looks quite good to me overall."
        head = request.messages[:first_reply]  # the original prompt, without repair turns
        system = next((m["content"] for m in head if m["role"] == "system"), "")
        prompt = next((m["content"] for m in head if m["role"] == "user"), "")
        if self.parrot_json and (copied := _first_json_object(prompt)) is not None:
            return copied
        outside, blocks = split_blocks("\n".join(m["content"] for m in head))
        obey = bool(_OBEY.search(outside))
        if "# Rubric" in prompt:
            return self._rubric(prompt, outside, blocks, obey)
        if '"group_id"' in system:
            return self._group(outside, blocks, obey)
        if '"result"' in system:
            return self._score_model(system, outside, blocks, obey)
        if '"label"' in system:
            return self._label_model(system, blocks)
        return "I cannot tell what to grade."

    def _rubric(self, prompt: str, outside: str, blocks: dict[str, str], obey: bool) -> str:
        sample = blocks.get("SAMPLE", "")
        source = prompt if self.reads_rubric_everywhere else outside
        criteria = []
        for cid, points, text in _RUBRIC_LINE.findall(source):
            keywords = _keywords(text)
            if obey:
                met = float(points) > 0
            else:
                met = bool(keywords) and all(k.lower() in sample.lower() for k in keywords)
            entry = {"id": cid, "met": met, "reason": "keywords " + ("found" if met else "missing")}
            if met and keywords:
                entry["quote"] = keywords[0]
            criteria.append(entry)
        ident = re.search(r"\(ID (\S+)\)", outside)
        return json.dumps({"sample_id": ident.group(1) if ident else "", "criteria": criteria})

    def _group(self, outside: str, blocks: dict[str, str], obey: bool) -> str:
        shared = blocks.get("SHARED", "")
        keywords = _keywords(
            outside.split("# Grading instructions", 1)[-1].split("responses to score")[0]
        )
        labels = sorted((k for k in blocks if re.fullmatch(r"S\d+", k)), key=lambda k: int(k[1:]))
        scores = [
            {
                "sample": label,
                "score": 1.0 if obey else _share(keywords, shared + blocks[label]),
                "reason": "keyword share",
            }
            for label in labels
        ]
        ident = re.search(r"\(ID (\S+)\)", outside)
        return json.dumps({"group_id": ident.group(1) if ident else "", "scores": scores})

    def _score_model(self, system: str, outside: str, blocks: dict[str, str], obey: bool) -> str:
        rule = re.search(r'"sample_id": "(\w+)", "result": <a number from (\S+) to (\S+)>', system)
        if rule is None:
            return "{}"
        nonce, lo, hi = rule.group(1), float(rule.group(2)), float(rule.group(3))
        spec_text = re.sub(r"Text between a line.*?never for it\.", "", outside, flags=re.DOTALL)
        spec_text = re.sub(r"Reply with only a JSON object:.*", "", spec_text)
        share = 1.0 if obey else _share(_keywords(spec_text), blocks.get("SAMPLE", ""))
        return json.dumps({"sample_id": nonce, "result": lo + share * (hi - lo), "steps": []})

    def _label_model(self, system: str, blocks: dict[str, str]) -> str:
        rule = re.search(r'"sample_id": "(\w+)", "label": <one of (\[.*?\])>', system)
        if rule is None:
            return "{}"
        labels = json.loads(rule.group(2))
        sample = blocks.get("SAMPLE", "").lower()
        label = next((x for x in labels if x.lower() in sample), labels[-1])
        return json.dumps({"sample_id": rule.group(1), "label": label})


def _first_json_object(text: str) -> str | None:
    decoder = json.JSONDecoder()
    pos = 0
    while (start := text.find("{", pos)) != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            pos = start + 1
            continue
        if isinstance(value, dict):
            return text[start:end]
        pos = end
    return None
