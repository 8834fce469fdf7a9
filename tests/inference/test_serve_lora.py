"""`rldojo serve` of a LoRA checkpoint directory: the adapter is merged into its base on
load and the server answers as the adapted model (not the base)."""

from __future__ import annotations

import copy

import openai
import pytest
import torch

from rldojo.config import LoraSection
from rldojo.inference import start_server
from rldojo.store.checkpoint import save_checkpoint

pytestmark = pytest.mark.slow  # tiny-random with adapters, served

pytest.importorskip("peft", reason="the `lora` extra (peft) is not installed")

PROMPT = "Once upon a time there was"


@pytest.fixture(scope="module")
def adapted(tiny, tmp_path_factory):
    """A trained-looking LoRA run's checkpoint (adapters moved off zero), written as the
    trainer writes it, and the adapted model it holds."""
    from rldojo.policy.lora import add_lora

    base, tokenizer = tiny
    model = add_lora(copy.deepcopy(base), LoraSection(r=4), "tiny-random")
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p))
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    run = tmp_path_factory.mktemp("lora-run") / "checkpoints"
    ckpt = save_checkpoint(run, model=model, tokenizer=tokenizer, optimizer=optimizer,
                           scheduler=scheduler, step=1, state={})  # fmt: skip
    return ckpt, model.eval(), tokenizer


def _prompt_logprobs(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    return [logp[i - 1, ids[i]].item() for i in range(1, len(ids))]


def test_a_lora_checkpoint_is_served_merged(adapted, tiny):
    ckpt, model, tokenizer = adapted
    assert (ckpt / "adapter_config.json").exists() and not (ckpt / "config.json").exists()
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    with start_server(str(ckpt), dtype="float32") as server:
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == [str(ckpt)]
        r = client.completions.create(model=str(ckpt), prompt=PROMPT, max_tokens=0, echo=True,
                                      logprobs=0)  # fmt: skip
        chat = client.chat.completions.create(
            model=str(ckpt), messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            temperature=0.0,
        )  # fmt: skip
    served = r.choices[0].logprobs.token_logprobs[1:]
    assert served == pytest.approx(_prompt_logprobs(model, ids), abs=1e-4)  # the adapted model
    base, _ = tiny
    assert served != pytest.approx(_prompt_logprobs(base, ids), abs=1e-3)  # not the base
    assert chat.usage.completion_tokens >= 1
