"""inspect-ai against `rldojo serve`: its OpenAI-compatible provider (`openai-api`) runs a
small task defined here (four samples; a system message and `generate()` as the solver;
the `includes()` scorer) against the served model, and every answer and score is checked
against rldojo's own.

- the model is `tiny-random` with its weights nudged (seed 3, 0.2 noise), so that its
  greedy replies differ from prompt to prompt (`tiny-random` itself answers every prompt
  with the same newlines, which would prove little);
- the server runs under a `--served-model-name` and an `--api-key`, so inspect reaches it
  as `openai-api/rldojo/<name>` with `RLDOJO_BASE_URL` and `RLDOJO_API_KEY`, the
  provider's own variables for a service named `rldojo`;
- inspect's answers (system + user messages, greedy, `max_tokens` capped, the samples
  in flight together) equal rldojo's own greedy chat replies to the same messages,
  computed in process one prompt at a time; so do its token counts and stop reasons;
- whole replies and streamed ones (`-M stream=true`) alike;
- the targets are chosen so that half the samples are correct: a piece of rldojo's reply,
  or a word the reply does not hold; the scores and the accuracy follow;
- a request past the model's context is OpenAI's 400 `context_length_exceeded`, which
  inspect turns into a `model_length` stop: the samples end, the eval does not fail.

inspect-ai is not an rldojo dependency: it runs from its own venv (`make test-interop`
builds `.venv-inspect`; `RLDOJO_INSPECT` names another `inspect`), and without it the
test skips.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from rldojo.inference import start_server
from rldojo.inference.engine import TransformersEngine
from rldojo.types import Completion, SamplingParams

pytestmark = pytest.mark.slow  # rldojo serve over tiny-random, inspect in a subprocess

ROOT = Path(__file__).resolve().parents[2]
INSPECT = Path(os.environ.get("RLDOJO_INSPECT", ROOT / ".venv-inspect" / "bin" / "inspect"))
INSPECT = INSPECT.absolute()  # `make` passes it relative; inspect runs in a temporary dir

NAME, KEY = "rldojo-tiny", "inspect-test-key"
MAX_TOKENS = 8
SYSTEM = "Answer in one word."
QUESTIONS = [
    "What is 2 + 2?",
    "What is the capital of France?",
    "Name a primary colour.",
    "How many legs does a spider have?",
]
ABSENT = "zebra"
"""The target of the odd samples: a word the tiny model's replies do not hold."""

TASK = """from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, system_message

SYSTEM = {system!r}
SAMPLES = {samples!r}


@task
def rldojo_inline():
    return Task(
        dataset=[Sample(input=q, target=t, id=i) for i, (q, t) in enumerate(SAMPLES)],
        solver=[system_message(SYSTEM), generate()],
        scorer=includes(),
    )
"""


@pytest.fixture(scope="module")
def served(request):
    if not INSPECT.exists():
        pytest.skip(f"inspect-ai is not installed at {INSPECT}: `make test-interop` builds it")
    model, tokenizer = request.getfixturevalue("tiny")  # loaded only when not skipping
    model = copy.deepcopy(model)  # the session's `tiny` stays as it is
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    engine = TransformersEngine("tiny-random", model=model, tokenizer=tokenizer, dtype="float32")
    with start_server(engine, served_model_name=NAME, api_key=KEY) as server:
        yield server
    engine.close()


def _greedy_replies(engine: TransformersEngine) -> list[tuple[list[int], Completion]]:
    """rldojo's own greedy chat replies to the questions, one prompt at a time: each
    prompt's token ids and its completion."""
    sampling = SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0.0)
    chats = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
             for q in QUESTIONS]  # fmt: skip
    prompts = [engine.policy.encode_chat(chat) for chat in chats]
    return [(p, engine.policy.generate([p], sampling)[0]) for p in prompts]


def _targets(replies: list[str]) -> list[str]:
    """Even samples: a piece of rldojo's reply (`includes` says C); odd: `ABSENT` (I)."""
    targets = []
    for i, reply in enumerate(replies):
        assert ABSENT not in reply.casefold()
        piece = reply.strip()[:4]
        targets.append(piece if i % 2 == 0 and piece else ABSENT)
    return targets


def _write_task(work: Path, targets: list[str]) -> None:
    items = list(zip(QUESTIONS, targets, strict=True))
    (work / "task.py").write_text(TASK.format(system=SYSTEM, samples=items))


def _inspect_eval(server, work: Path, *extra: str) -> dict:
    """Run `inspect eval` on `work/task.py`; its JSON log. The task is named relative to
    `work`: inspect 0.3.285 globs the name, and Python 3.11's pathlib refuses an
    absolute pattern. Its traces and buffers go under `work` too, not the home directory."""
    logs = work / "logs"
    env = {**os.environ, "RLDOJO_BASE_URL": server.url, "RLDOJO_API_KEY": KEY,
           "XDG_DATA_HOME": str(work / "data"), "XDG_CACHE_HOME": str(work / "cache")}  # fmt: skip
    command = [str(INSPECT), "eval", "task.py", "--model", f"openai-api/rldojo/{NAME}",
               "--temperature", "0", "--max-connections", str(len(QUESTIONS)),
               "--log-format", "json", "--log-dir", str(logs), "--display", "plain",
               *extra]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=work, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (log,) = logs.glob("*.json")
    return json.loads(log.read_text())


def _check_outputs(samples: list[dict], ours: list[tuple[list[int], Completion]]) -> None:
    """inspect's messages, answers, token counts and stop reasons are rldojo's own."""
    sent = [[(m["role"], m["content"]) for m in s["messages"][:2]] for s in samples]
    assert sent == [[("system", SYSTEM), ("user", q)] for q in QUESTIONS]
    answers = [s["output"]["choices"][0]["message"]["content"] for s in samples]
    assert answers == [c.text for _, c in ours]
    usage = [(s["output"]["usage"]["input_tokens"], s["output"]["usage"]["output_tokens"])
             for s in samples]  # fmt: skip
    assert usage == [(len(p), len(c.token_ids)) for p, c in ours]
    reasons = {"length": "max_tokens", "stop": "stop"}  # OpenAI's finish_reason -> inspect's
    stops = [s["output"]["choices"][0]["stop_reason"] for s in samples]
    assert stops == [reasons[c.finish_reason] for _, c in ours]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_inspect_eval_answers_and_scores_as_rldojo_does(served, tmp_path, stream):
    ours = _greedy_replies(served.engine)
    replies = [c.text for _, c in ours]
    assert len(set(replies)) == len(replies)  # each answer tells which prompt it is of
    targets = _targets(replies)
    _write_task(tmp_path, targets)
    flags = ("--max-tokens", str(MAX_TOKENS), "-M", f"stream={str(stream).lower()}")
    log = _inspect_eval(served, tmp_path, *flags)
    assert log["status"] == "success", log.get("error")
    samples = sorted(log["samples"], key=lambda s: s["id"])
    assert [s["input"] for s in samples] == QUESTIONS
    calls = [e["call"]["request"] for s in samples for e in s["events"] if e["event"] == "model"]
    assert [(c["model"], c.get("stream", False)) for c in calls] == [(NAME, stream)] * len(samples)
    _check_outputs(samples, ours)
    implied = [t.casefold() in r.casefold() for r, t in zip(replies, targets, strict=True)]
    assert implied == [True, False, True, False]  # includes(): case-folded substring
    assert [s["scores"]["includes"]["value"] for s in samples] == ["C", "I", "C", "I"]
    (score,) = log["results"]["scores"]
    assert score["metrics"]["accuracy"]["value"] == pytest.approx(0.5)


def test_past_the_context_inspect_stops_for_length(served, tmp_path):
    _write_task(tmp_path, [ABSENT] * len(QUESTIONS))
    context = served.engine.context  # tiny-random: 2048 positions; any prompt + this exceeds
    log = _inspect_eval(served, tmp_path, "--max-tokens", str(context))
    assert log["status"] == "success", log.get("error")
    outputs = [s["output"] for s in log["samples"]]
    assert [o["choices"][0]["stop_reason"] for o in outputs] == ["model_length"] * len(QUESTIONS)
    assert all(f"max_tokens {context} exceed" in o["completion"] for o in outputs)
