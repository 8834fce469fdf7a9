"""lm-evaluation-harness against `rldojo serve`: its own `local-completions` and
`local-chat-completions` models score a small task defined here (YAML + JSONL, no hub),
and every number is checked against rldojo's own scoring of the same items.

- multiple choice (log-likelihood, /v1/completions with echo + logprobs): each
  continuation's log-likelihood equals the served model's, summed over the continuation's
  tokens in process; the accuracy follows;
- generation (greedy, stop at a newline): lm-eval's answers equal rldojo's own greedy
  completions (raw prompt) and chat replies (chat template) of the same prompts.

lm-eval is not an rldojo dependency: it runs from its own venv (`make test-interop`
builds `.venv-lmeval`; `RLDOJO_LM_EVAL` names another `lm_eval`), and without it the
test skips.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from rldojo.inference import start_server
from rldojo.inference.engine import TransformersEngine
from rldojo.types import SamplingParams

pytestmark = pytest.mark.slow  # rldojo serve over tiny-random, lm-eval in subprocesses

ROOT = Path(__file__).resolve().parents[2]
LM_EVAL = Path(os.environ.get("RLDOJO_LM_EVAL", ROOT / ".venv-lmeval" / "bin" / "lm_eval"))

MC = [
    {"question": "What is 2 + 2?", "choices": ["4", "5", "22"], "answer": 0},
    {"question": "Which colour is a clear sky?", "choices": ["blue", "green", "red"], "answer": 0},
    {"question": "How many legs does a spider have?", "choices": ["six", "eight"], "answer": 1},
]
GEN = [
    {"question": "Q: What is 2 + 2?\nA:", "answer": " 4"},
    {"question": "Q: What is the capital of France?\nA:", "answer": " Paris"},
]
TASKS = {
    "rldojo_mc.yaml": """task: rldojo_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/mc.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
""",
    "rldojo_gen.yaml": """task: rldojo_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/gen.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
""",
}


@pytest.fixture(scope="module")
def served(tiny, tmp_path_factory):
    if not LM_EVAL.exists():
        pytest.skip(f"lm-eval is not installed at {LM_EVAL}: `make test-interop` builds it")
    model, tokenizer = tiny
    tasks = tmp_path_factory.mktemp("lm-eval-tasks")
    (tasks / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in MC))
    (tasks / "gen.jsonl").write_text("".join(json.dumps(d) + "\n" for d in GEN))
    for name, body in TASKS.items():
        (tasks / name).write_text(body.format(dir=tasks))
    tokenizer.save_pretrained(tasks / "tokenizer")  # lm-eval tokenizes as the model does
    engine = TransformersEngine("tiny-random", model=model, tokenizer=tokenizer, dtype="float32")
    with start_server(engine) as server:
        yield server, tasks
    engine.close()


def _lm_eval(tasks: Path, model: str, args: str, names: str, *extra: str) -> dict[str, list]:
    """Run lm-eval; its samples, by task name (per sample: the doc and the responses)."""
    out = tasks / f"out-{model}"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    command = [str(LM_EVAL), "run", "--model", model, "--model_args", args, "--tasks", names,
               "--include_path", str(tasks), "--output_path", str(out), "--log_samples",
               *extra]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    samples: dict[str, list] = {}
    for path in out.rglob("samples_*.jsonl"):
        task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in path.read_text().splitlines()]
    return samples


def _loglikelihood(engine, context: str, continuation: str) -> float:
    """rldojo's own score: the continuation's tokens' log-probabilities under the served
    model, split from the context as lm-eval splits them (the whole string tokenized)."""
    encode = engine.tokenizer
    whole = encode(context + continuation, add_special_tokens=False)["input_ids"]
    start = len(encode(context, add_special_tokens=False)["input_ids"])
    with torch.no_grad():
        logits = engine._gen_model(input_ids=torch.tensor([whole])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)  # [L, V]
    return sum(logp[i - 1, whole[i]].item() for i in range(start, len(whole)))


def test_local_completions_scores_choices_and_generates_as_rldojo_does(served):
    server, tasks = served
    engine = server.engine
    args = (f"base_url={server.url}/completions,model={server.model},"
            f"tokenizer={tasks / 'tokenizer'},tokenized_requests=True,max_retries=1")  # fmt: skip
    samples = _lm_eval(tasks, "local-completions", args, "rldojo_mc,rldojo_gen")
    assert (len(samples["rldojo_mc"]), len(samples["rldojo_gen"])) == (len(MC), len(GEN))
    for sample in sorted(samples["rldojo_mc"], key=lambda s: s["doc_id"]):
        scored = [float(r[0][0]) for r in sample["resps"]]
        context = sample["arguments"]["gen_args_0"]["arg_0"]
        choices = [a["arg_1"] for a in sample["arguments"].values()]
        ours = [_loglikelihood(engine, context, c) for c in choices]
        assert scored == pytest.approx(ours, abs=1e-3)
        best = max(range(len(ours)), key=ours.__getitem__)
        assert sample["acc"] == float(best == sample["doc"]["answer"])  # the accuracy follows
    sampling = SamplingParams(max_new_tokens=8, temperature=0.0, stop=("\n",))
    for sample in samples["rldojo_gen"]:
        prompt = engine.tokenizer(sample["doc"]["question"], add_special_tokens=False)["input_ids"]
        ours = engine.policy.generate([prompt], sampling)[0].text
        assert sample["resps"][0][0] == ours


def test_local_chat_completions_generates_as_rldojo_does(served):
    server, tasks = served
    engine = server.engine
    args = f"base_url={server.url}/chat/completions,model={server.model},max_retries=1"
    samples = _lm_eval(tasks, "local-chat-completions", args, "rldojo_gen", "--apply_chat_template")
    sampling = SamplingParams(max_new_tokens=8, temperature=0.0, stop=("\n",))
    assert len(samples["rldojo_gen"]) == len(GEN)
    for sample in samples["rldojo_gen"]:
        prompt = engine.policy.encode_chat([{"role": "user", "content": sample["doc"]["question"]}])
        ours = engine.policy.generate([prompt], sampling)[0].text
        assert sample["resps"][0][0] == ours
