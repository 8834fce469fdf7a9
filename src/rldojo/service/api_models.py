"""Routes for models, inference and graders.

    GET  /v1/models, /v1/models/{id}   base models + the caller's succeeded fine-tunes and
                                       their checkpoints (`ft:…:ckpt-step-N`)
    POST /v1/chat/completions          any of them, through `rldojo serve`'s engine and
                                       request handling (`rldojo.inference.chat_api`)
    POST /v1/completions               a raw prompt (no chat template)
    POST /v1/fine_tuning/alpha/graders/validate   {grader} -> {grader} or 400; with an
                                       `item` (and `model_sample`), also graded: a grader
                                       that errors on it is a 400 (`grader_failures`)
    POST /v1/fine_tuning/alpha/graders/run        {grader, model_sample, item} -> reward,
                                       sub_rewards and OpenAI's error flags; with
                                       `signal: {model, training_file}` also the
                                       learning-signal check of that model on that file

Engines load on first use (in a thread, so the API keeps answering) and are kept in an
LRU cache of `max_loaded_models`. Python graders run in the sandbox (`PythonGrader`
always does); model graders ask the service's judge endpoint (`--judge-base-url`,
`rldojo.service.judge`; without one they are a 400); a failed grade is a reward of 0
with its error flag set, never a 500.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from rldojo.inference.chat_api import (
    ChatIn,
    chat_request,
    chat_response,
    invalid_combination,
    stream_response,
)
from rldojo.inference.engine import TransformersEngine
from rldojo.service.errors import ApiError, not_found
from rldojo.service.judge import load_grader
from rldojo.service.preflight import run_signal, signal_request
from rldojo.service.settings import Owner, ServiceSettings
from rldojo.service.state import ServiceState
from rldojo.store.checkpoint import latest_checkpoint
from rldojo.types import SamplingParams, Score

if TYPE_CHECKING:
    from rldojo.graders.specs.loading import SpecGrader

__all__ = ["EngineCache", "models_router"]


class EngineCache:
    """At most `size` loaded engines, least recently used closed first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._engines: collections.OrderedDict[str, TransformersEngine] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, source: str) -> TransformersEngine:
        with self._lock:
            if source in self._engines:
                self._engines.move_to_end(source)
                return self._engines[source]
            engine = TransformersEngine(source)
            self._engines[source] = engine
            while len(self._engines) > self.size:
                _, old = self._engines.popitem(last=False)
                old.close()
            return engine

    def close(self) -> None:
        with self._lock:
            for engine in self._engines.values():
                engine.close()
            self._engines.clear()


class _CompletionIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    prompt: str | list[str]
    max_tokens: int = Field(16, gt=0, le=8192)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=16)
    seed: int | None = None
    stop: str | list[str] | None = None


def _model_json(name: str, created: int, owner: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": owner}


def _complete(engine: TransformersEngine, prompt: str, body: _CompletionIn) -> list[Any]:
    """Raw-prompt generation on the engine's worker thread (its batching and lock)."""
    stop = body.stop if isinstance(body.stop, list) else ([body.stop] if body.stop else [])
    ids = engine.tokenizer(prompt, add_special_tokens=False)["input_ids"] or [
        engine.tokenizer.eos_token_id
    ]
    sampling = SamplingParams(
        max_new_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        stop=tuple(s for s in stop if s),
        seed=body.seed,
    )
    return [(len(ids), c) for c in engine.complete_ids(list(ids), body.n, sampling)]


def _grade_json(grader: SpecGrader, score: Score, wall_s: float) -> dict[str, Any]:
    failed = score.status != "ok"
    detail = score.explanation if failed else None
    python = getattr(grader.grader, "type", "") == "python"
    judged = getattr(grader.grader, "type", "") in ("score_model", "label_model")
    invalid = score.status == "invalid"
    server = failed and judged and not invalid  # the judge endpoint failed or timed out
    errors = {
        "formula_parse_error": False,
        "invalid_variable_error": invalid,
        "model_grader_parse_error": False,
        "model_grader_refusal_error": False,
        "model_grader_server_error": server,
        "model_grader_server_error_details": detail if server else None,
        "other_error": failed and not python and not judged and not invalid,
        "python_grader_runtime_error": failed and python and not invalid,
        "python_grader_runtime_error_details": detail if python else None,
        "python_grader_server_error": False,
        "python_grader_server_error_type": None,
        "sample_parse_error": False,
        "truncated_observation_error": False,
        "unresponsive_reward_error": score.status == "timeout",
    }
    return {
        "reward": 0.0 if score.value is None else float(score.value),
        "sub_rewards": dict(score.components),
        "model_grader_token_usage_per_model": {},
        "metadata": {
            "errors": errors,
            "execution_time": wall_s,
            "name": grader.name,
            "sampled_model_name": None,
            "scores": dict(score.components),
            "token_usage": None,
            "type": getattr(grader.grader, "type", ""),
        },
    }


async def _grade(grader: SpecGrader, body: _GraderIn) -> tuple[SpecGrader, Score, float]:
    """(grader, score, seconds) of `body.model_sample` graded against `body.item`."""
    from rldojo.graders.offline import GradeRow, row_task_rollout

    task, rollout = row_task_rollout(
        GradeRow(1, dict(body.item), {"output_text": body.model_sample}, {})
    )
    t0 = time.perf_counter()
    score = await grader.grade(rollout, task)
    return grader, score, time.perf_counter() - t0


class _GraderIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    grader: dict[str, Any]
    model_sample: str = ""
    item: dict[str, Any] = Field(default_factory=dict)


def models_router(
    settings: ServiceSettings, state: ServiceState, owner: Owner, engines: EngineCache
) -> APIRouter:
    r = APIRouter(prefix="/v1")
    started = int(time.time())

    def _visible(who: str) -> dict[str, tuple[str, int]]:
        """Model name -> (what loads it, created) for the caller."""
        found = {name: (name, started) for name in settings.base_models}
        for job in state.jobs(who):
            ckpt = (
                latest_checkpoint(Path(job["run_dir"]) / "checkpoints") if job["run_dir"] else None
            )
            if job["status"] == "succeeded" and ckpt is not None:
                found[job["fine_tuned_model"]] = (str(ckpt), job["finished_at"] or started)
        for c in state.owned_checkpoints(who):
            found.setdefault(c["model"], (c["path"], c["created_at"]))
        return found

    def _source(who: str, name: str) -> str:
        visible = _visible(who)
        if name not in visible:
            raise not_found("model", name, "model")
        return visible[name][0]

    @r.get("/models")
    async def models(who: str = Depends(owner)) -> dict[str, Any]:
        data = [
            _model_json(name, created, "rldojo" if name in settings.base_models else "user")
            for name, (_, created) in _visible(who).items()
        ]
        return {"object": "list", "data": data}

    @r.get("/models/{name:path}")
    async def model(name: str, who: str = Depends(owner)) -> dict[str, Any]:
        _, created = _visible(who).get(name) or (None, None)
        if created is None:
            raise not_found("model", name, "model")
        return _model_json(name, created, "rldojo" if name in settings.base_models else "user")

    @r.post("/chat/completions", response_model=None)
    async def chat(body: ChatIn, who: str = Depends(owner)) -> Any:
        engine = await asyncio.to_thread(engines.get, _source(who, body.model))
        if (wrong := invalid_combination(body)) is not None:
            return wrong
        result = await engine.chat(chat_request(body))
        if body.stream:
            return stream_response(body.model, result, body)
        return chat_response(body.model, result, tools=body.uses_tools())

    @r.post("/completions")
    async def completions(body: _CompletionIn, who: str = Depends(owner)) -> dict[str, Any]:
        engine = await asyncio.to_thread(engines.get, _source(who, body.model))
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        choices: list[dict[str, Any]] = []
        prompt_tokens = completion_tokens = 0
        for prompt in prompts:
            for p_len, c in await asyncio.to_thread(_complete, engine, prompt, body):
                choices.append(
                    {
                        "index": len(choices),
                        "text": c.text,
                        "logprobs": None,
                        "finish_reason": c.finish_reason,
                    }
                )
                prompt_tokens += p_len
                completion_tokens += c.completion_tokens
        return {
            "id": f"cmpl-{time.time_ns():x}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    @r.post("/fine_tuning/alpha/graders/validate")
    async def validate(body: _GraderIn, who: str = Depends(owner)) -> dict[str, Any]:
        grader = await asyncio.to_thread(load_grader, body.grader, settings, "grader")
        try:
            if body.item:  # the preflight of job creation, on the caller's item
                _, score, _ = await _grade(grader, body)
                if score.status == "error":
                    raise ApiError(
                        400,
                        f"grader: the grader failed on the item: {score.explanation}",
                        param="grader",
                        code="grader_failures",
                    )
        finally:
            await grader.close()
        return {"grader": body.grader}

    @r.post("/fine_tuning/alpha/graders/run")
    async def run(body: _GraderIn, who: str = Depends(owner)) -> dict[str, Any]:
        ask = (body.model_extra or {}).get("signal")  # opt-in: sample the base model too
        checked = None if ask is None else signal_request(ask, who, _source, state.file, settings)
        grader = await asyncio.to_thread(load_grader, body.grader, settings, "grader")
        try:
            out = _grade_json(*await _grade(grader, body))
        finally:
            await grader.close()
        if checked is not None:
            out["signal"] = await asyncio.wait_for(
                asyncio.to_thread(run_signal, *checked, body.grader, settings),
                settings.signal_timeout_s,
            )
        return out

    return r
