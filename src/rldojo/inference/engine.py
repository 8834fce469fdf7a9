"""`TransformersEngine`: the local model behind `rldojo serve` (the `ChatEngine` protocol,
`rldojo.inference.protocol`).

An engine answers a chat request (messages + sampling, with tools) or a legacy completion
request (raw prompts) with `n` choices and token counts, and embeds texts. Each choice
carries the text each completion token adds and, when asked for, each token's
log-probability and top alternatives (`rldojo.inference.logprobs` says which
distribution). The HTTP layer (`rldojo.inference.app`) only translates JSON.

It generates with `TransformersPolicy` on one worker thread. Requests that arrive close
together and sample the same way are decoded as one batch (`rldojo.inference.batching`;
the cached sampler's cost per step barely grows with the batch on CPU), so a judge
grading many samples concurrently gets batched generation for free. Logprobs are
computed per choice after the batch is decoded.

`stream` hands back each token as the sampler draws it: the sampler calls the worker
after every decode step (`rldojo.policy.sampling.DecodeStep`), which passes the tokens to
the streamed requests' `ChoiceStreams` (`rldojo.inference.token_stream`) and so, across
threads, to the HTTP response while the batch is still decoding.

The model: a built-in name, a model directory, or a checkpoint directory of an rldojo
run; a LoRA checkpoint (adapter files only) is loaded onto its base and merged at load
time (`load_served_model`), so it decodes as fast as a merged export. Its context window
(`max_model_len`) and chat template may be set (`rldojo.inference.serve_options`); a
request past the window is refused before it queues (`_check_length`): `max_tokens`
beyond the whole window is `invalid_value`, a prompt + `max_tokens` that overflow it
`context_length_exceeded`.

`ScriptedEngine` (`rldojo.inference.scripted`) and the protocol's types are importable
from here too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rldojo.inference.batching import Job, JobQueue
from rldojo.inference.chat_tools import encode_with_tools
from rldojo.inference.logprobs import (
    TokenLogprob,
    prompt_pieces,
    score_sequence,
    score_tokens,
    token_pieces,
)
from rldojo.inference.protocol import (
    ChatChoice,
    ChatEngine,
    ChatRequest,
    ChatResult,
    ChatStream,
    CompletionRequest,
    CompletionResult,
    PromptEcho,
    RequestError,
    TokenEvent,
)
from rldojo.inference.scripted import ScriptedEngine, bag_of_letters
from rldojo.inference.serve_options import (
    check_max_model_len,
    context_window,
    load_chat_template,
)
from rldojo.inference.token_stream import ChoiceStreams, stream_hook, when_all_done
from rldojo.policy.base import Tokenizer
from rldojo.types import Completion, SamplingParams

if TYPE_CHECKING:
    import torch

__all__ = [
    "ChatChoice",
    "ChatEngine",
    "ChatRequest",
    "ChatResult",
    "CompletionRequest",
    "CompletionResult",
    "ScriptedEngine",
    "TokenLogprob",
    "TransformersEngine",
    "bag_of_letters",
    "load_served_model",
]


def load_served_model(name: str) -> tuple[torch.nn.Module, Tokenizer]:
    """`(model, tokenizer)` for `rldojo serve`: a LoRA checkpoint directory (adapter
    files, `rldojo.policy.lora`) merged into the base it names, anything else as
    `load_model` loads it (built-in name, model or full-weights checkpoint directory)."""
    from rldojo.policy.lora import is_adapter_dir, load_merged
    from rldojo.policy.models import load_model

    path = Path(name).expanduser()
    if is_adapter_dir(path):
        return load_merged(path)
    return load_model(name)


class TransformersEngine:
    """A local transformers model served from one worker thread with request batching.

    Args:
        model_name: built-in name (`tiny-random`, `smollm2-135m-instruct`), model
            directory, or checkpoint directory (a LoRA adapter is merged into its base).
        dtype: generation dtype, `auto` (bf16 where measured faster on this machine,
            see `rldojo.hardware.precision`), `bfloat16` or `float32`.
        max_batch: most sequences decoded together.
        batch_window_s: how long the worker waits for more requests to join a batch
            (`rldojo.inference.batching`).
        model, tokenizer: an already loaded pair (then `model_name` only names it).
        max_model_len: the context window allowed (prompt + completion); None: the
            model's `max_position_embeddings`. More than that is a `ServeOptionError`.
        chat_template: a Jinja chat template, or a file holding one, replacing the
            tokenizer's (a tokenizer passed in is copied, not changed).
    """

    def __init__(
        self,
        model_name: str = "tiny-random",
        *,
        dtype: str = "auto",
        max_batch: int = 16,
        batch_window_s: float = 0.005,
        model: torch.nn.Module | None = None,
        tokenizer: Tokenizer | None = None,
        max_model_len: int | None = None,
        chat_template: str | None = None,
    ) -> None:
        import torch

        from rldojo.policy.transformers_backend import TransformersPolicy

        if dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"dtype must be auto, bfloat16 or float32, got {dtype!r}")
        if max_model_len is not None:  # what can be told before the model loads
            check_max_model_len(max_model_len)
        template = load_chat_template(chat_template) if chat_template is not None else None
        if (model is None) != (tokenizer is None):
            raise ValueError("pass model and tokenizer together, or neither")
        if model is None or tokenizer is None:
            model, tokenizer = load_served_model(model_name)
        elif template is not None:  # others may share the tokenizer passed in
            tokenizer = copy.deepcopy(tokenizer)
        if template is not None:
            tokenizer.chat_template = template
        positions = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        self.context = context_window(positions, max_model_len)
        """Most tokens a sequence may hold (prompt + completion); 0: unknown."""
        gen_dtype = {"bfloat16": torch.bfloat16, "float32": None}.get(dtype, "auto")
        self.model = model_name
        self.policy = TransformersPolicy(model, tokenizer, generation_dtype=gen_dtype)
        self._gen_model = self.policy._gen_model
        self.tokenizer = tokenizer
        self.queue = JobQueue(max_batch, batch_window_s)
        self.batches: list[int] = []
        """Sequences per decoded batch, for tests and throughput notes."""
        self._thread = threading.Thread(target=self._work, name="rldojo-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------- requests

    async def chat(self, request: ChatRequest) -> ChatResult:
        job = self._chat_job(request)
        self.queue.submit(job)
        choices, _ = await asyncio.wrap_future(job.future)
        return ChatResult(choices=choices, prompt_tokens=len(job.prompt))

    async def complete(self, request: CompletionRequest) -> CompletionResult:
        jobs = self._completion_jobs(request)
        for job in jobs:
            self.queue.submit(job)
        done = await asyncio.gather(*(asyncio.wrap_future(j.future) for j in jobs))
        choices = [c for mine, _ in done for c in mine]
        echoes = [echo for _, echo in done if echo is not None]
        return CompletionResult(choices, echoes, sum(len(j.prompt) for j in jobs))

    async def stream(self, request: ChatRequest | CompletionRequest) -> ChatStream:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenEvent | BaseException | None] = asyncio.Queue()

        def put(item: TokenEvent | BaseException | None) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the server's loop has stopped: nobody is reading
                pass

        if isinstance(request, ChatRequest):
            jobs = [self._chat_job(request)]
        else:
            jobs = self._completion_jobs(request)
        echoes = [self._echo(job.prompt, None) for job in jobs if job.echo]
        for i, job in enumerate(jobs):
            stops = job.sampling.stop if job.sampling is not None else ()
            job.streams = ChoiceStreams(
                self.tokenizer, job.n, i * job.n, stops, job.top_logprobs, put
            )
            job.top_logprobs, job.echo = None, False  # from the stream, not afterwards
        when_all_done([job.future for job in jobs], put)
        for job in jobs:
            self.queue.submit(job)

        async def events() -> AsyncIterator[TokenEvent]:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item

        total = sum(len(job.prompt) for job in jobs)
        return ChatStream(total, events(), sum(job.n for job in jobs), echoes)

    def complete_ids(
        self, prompt: list[int], n: int, sampling: SamplingParams, *, timeout_s: float = 600
    ) -> list[ChatChoice]:
        """`n` completions of raw prompt token ids (no chat template), batched with the
        other requests on the engine's worker thread; blocks until they are done."""
        job = Job("chat", concurrent.futures.Future(), list(prompt), n, sampling)
        self.queue.submit(job)
        choices, _ = job.future.result(timeout=timeout_s)
        return list(choices)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        job = Job("embed", concurrent.futures.Future(), texts=list(texts))
        self.queue.submit(job)
        return await asyncio.wrap_future(job.future)

    def _chat_job(self, request: ChatRequest) -> Job:
        prompt = self._chat_prompt(request)
        if request.max_tokens_default and self.context:  # as much as the window leaves
            fits = max(1, min(request.max_tokens, self.context - len(prompt)))
            request = replace(request, max_tokens=fits)
        self._check_length(prompt, request.max_tokens, "messages", request.max_tokens_field)
        sampling = _sampling(request)
        job = Job("chat", concurrent.futures.Future(), prompt, request.n, sampling)
        if request.logprobs:
            job.top_logprobs = request.top_logprobs
        return job

    def _chat_prompt(self, request: ChatRequest) -> list[int]:
        """The conversation's prompt ids; a chat template that refuses it (its
        ``raise_exception``) is the request's fault."""
        import jinja2

        try:
            return encode_with_tools(self.tokenizer, request.messages, request.tools)
        except jinja2.TemplateError as exc:
            raise RequestError("messages", f"the chat template refused them: {exc}") from None

    def _completion_jobs(self, request: CompletionRequest) -> list[Job]:
        sampling = _sampling(request)
        jobs = []
        for prompt in request.prompts:
            ids = self._prompt_ids(prompt)
            self._check_length(ids, request.max_tokens, "prompt")
            job = Job("chat", concurrent.futures.Future(), ids, request.n, sampling)
            job.top_logprobs, job.echo = request.logprobs, request.echo
            jobs.append(job)
        return jobs

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """A completion prompt's token ids: text tokenized without special tokens added
        (an empty one is the end-of-text token, as on OpenAI), ids checked."""
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            return list(ids) or [int(self.tokenizer.eos_token_id)]
        if not prompt:
            raise RequestError("prompt", "a token-id prompt is empty", "empty_array")
        vocab = len(self.tokenizer)
        if bad := [t for t in prompt if not 0 <= t < vocab]:
            raise RequestError(
                "prompt", f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})"
            )
        return list(prompt)

    def _check_length(
        self, prompt: list[int], max_tokens: int, param: str, limit: str = "max_tokens"
    ) -> None:
        """Refuse what the context window cannot hold; `param` names the prompt's field,
        `limit` the field `max_tokens` came from."""
        if not self.context:
            return
        if max_tokens > self.context:  # no prompt makes it fit
            message = (
                f"{max_tokens} is too large: this model supports at most "
                f"{self.context} completion tokens (its context length)"
            )
            raise RequestError(limit, message, code="invalid_value")
        if len(prompt) + max_tokens > self.context:
            where = param if len(prompt) >= self.context else limit
            message = (
                f"{len(prompt)} prompt tokens + {limit} {max_tokens} exceed the "
                f"model's context of {self.context} tokens"
            )
            raise RequestError(where, message, code="context_length_exceeded")

    # --------------------------------------------------------------------------- worker

    def _work(self) -> None:
        while (batch := self.queue.take()) is not None:
            try:
                if batch[0].kind == "embed":
                    batch[0].future.set_result(self._embed(batch[0].texts))
                else:
                    self._generate(batch)
            except BaseException as exc:  # report to the callers, keep serving
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(exc)

    def _generate(self, batch: list[Job]) -> None:
        prompts = [job.prompt for job in batch for _ in range(job.n)]
        owners = [(job.streams, k) for job in batch for k in range(job.n)]
        sampling = batch[0].sampling
        assert sampling is not None
        if sampling.greedy:
            sampling = replace(sampling, seed=None)
        hook = stream_hook(owners) if any(job.streams for job in batch) else None
        completions = self.policy.generate(prompts, sampling, on_step=hook)
        self.batches.append(len(prompts))
        start = 0
        for job in batch:
            mine = completions[start : start + job.n]
            start += job.n
            if job.streams is not None:
                job.streams.close()
            echo = self._echo(job.prompt, job.top_logprobs) if job.echo else None
            job.future.set_result(([self._choice(job, c) for c in mine], echo))

    def _choice(self, job: Job, c: Completion) -> ChatChoice:
        pieces = token_pieces(self.tokenizer, c.token_ids, c.text)
        logprobs = None
        if job.top_logprobs is not None:
            logprobs = score_tokens(
                self._gen_model, self.tokenizer, job.prompt, c.token_ids, pieces, job.top_logprobs
            )
        reason = "stop" if c.finish_reason == "stop" else "length"
        return ChatChoice(c.text, reason, len(c.token_ids), pieces, logprobs)

    def _echo(self, prompt: list[int], top_logprobs: int | None) -> PromptEcho:
        """The prompt as `echo` returns it; scored (one forward pass) when `top_logprobs`
        is not None."""
        pieces = prompt_pieces(self.tokenizer, prompt)
        if top_logprobs is None:
            return PromptEcho("".join(pieces), pieces)
        scored = score_sequence(
            self._gen_model, self.tokenizer, prompt, 1, pieces[1:], top_logprobs
        )
        return PromptEcho("".join(pieces), pieces, (None, *scored))

    def _embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Mean-pooled last hidden state, L2-normalised (like hosted embedding APIs)."""
        import torch

        rows: list[list[float]] = []
        with torch.no_grad():
            for text in texts:
                tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"][:2048]
                ids = torch.tensor([tokens], dtype=torch.long)  # [1, T]
                if ids.shape[1] == 0:
                    ids = torch.tensor([[self.tokenizer.eos_token_id]])
                out = self._gen_model(input_ids=ids, output_hidden_states=True)
                vector = out.hidden_states[-1][0].float().mean(0)  # [H]
                rows.append(torch.nn.functional.normalize(vector, dim=0).tolist())
        return rows

    def close(self) -> None:
        self.queue.close()
        self._thread.join(timeout=30)


def _sampling(request: ChatRequest | CompletionRequest) -> SamplingParams:
    """The sampler's parameters of a chat or completion request."""
    return SamplingParams(
        max_new_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        stop=request.stop,
        seed=request.seed,
    )
