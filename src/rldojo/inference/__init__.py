"""rldojo.inference: an OpenAI-compatible HTTP server over a local model (`rldojo serve`).

So the default SmolLM2 (or `tiny-random` in tests) can act as a judge or an eval target
through the real openai client, on loopback, with no network.

- `protocol`: the `ChatEngine` protocol and the requests and results it exchanges.
- `engine`: `TransformersEngine` (batched local generation, tokens streamed as sampled,
  LoRA checkpoints merged on load); `batching`: which requests decode together.
- `scripted`: `ScriptedEngine` (replies are a function of the request: deterministic
  judge stand-in).
- `app`: the FastAPI routes, API key and model name; `chat_api` (/v1/chat/completions),
  `completions` (/v1/completions), `errors` (OpenAI's error shape).
- `chat_tools`: `tools` rendered into the prompt, ``<tool_call>`` tags parsed into
  `tool_calls` by `tool_calls` (the parser the environments use too).
- `logprobs`: per-token texts and raw-model log-probabilities (OpenAI's `logprobs`).
- `token_stream`, `streaming`: tokens as they are sampled, as OpenAI's server-sent chunks.
- `server`: `start_server(...)` in a background thread, `serve_forever(...)` for the CLI;
  `serve_options` (`--max-model-len`, `--chat-template`, checked before serving);
  `request_log` (one line per request).

What is and is not supported of OpenAI's API: docs/interop.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers; at run time imported on first use
    from rldojo.inference.engine import TransformersEngine
    from rldojo.inference.logprobs import TokenLogprob
    from rldojo.inference.protocol import (
        ChatChoice,
        ChatEngine,
        ChatRequest,
        ChatResult,
        ChatStream,
        CompletionRequest,
        CompletionResult,
        RequestError,
    )
    from rldojo.inference.scripted import ScriptedEngine, bag_of_letters
    from rldojo.inference.server import ServerHandle, make_engine, serve_forever, start_server

_LAZY = {
    "TransformersEngine": "engine",
    "TokenLogprob": "logprobs",
    "ChatChoice": "protocol",
    "ChatEngine": "protocol",
    "ChatRequest": "protocol",
    "ChatResult": "protocol",
    "ChatStream": "protocol",
    "CompletionRequest": "protocol",
    "CompletionResult": "protocol",
    "RequestError": "protocol",
    "ScriptedEngine": "scripted",
    "bag_of_letters": "scripted",
    "ServerHandle": "server",
    "make_engine": "server",
    "serve_forever": "server",
    "start_server": "server",
}
"""Names imported on first use, and their module: importing a submodule (the environments
import `tool_calls`) must not import torch, the engine and the server with it."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rldojo.inference' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rldojo.inference.{module}"), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


__all__ = [
    "ChatChoice",
    "ChatEngine",
    "ChatRequest",
    "ChatResult",
    "ChatStream",
    "CompletionRequest",
    "CompletionResult",
    "RequestError",
    "ScriptedEngine",
    "ServerHandle",
    "TokenLogprob",
    "TransformersEngine",
    "bag_of_letters",
    "make_engine",
    "serve_forever",
    "start_server",
]
