"""rldojo.inference: an OpenAI-compatible HTTP server over a local model (`rldojo serve`).

So the default SmolLM2 (or `tiny-random` in tests) can act as a judge or an eval target
through the real openai client, on loopback, with no network.

- `engine`: `ChatEngine` protocol, `TransformersEngine` (batched local generation),
  `ScriptedEngine` (replies are a function of the request: deterministic judge stand-in).
- `app`: the FastAPI routes (/v1/chat/completions, /v1/models, /v1/embeddings).
- `logprobs`: per-token texts and raw-model log-probabilities (OpenAI's `logprobs`).
- `streaming`: `stream: true` replies as OpenAI's server-sent chunks.
- `server`: `start_server(...)` in a background thread, `serve_forever(...)` for the CLI.
"""

from rldojo.inference.engine import (
    ChatChoice,
    ChatEngine,
    ChatRequest,
    ChatResult,
    ScriptedEngine,
    TokenLogprob,
    TransformersEngine,
    bag_of_letters,
)
from rldojo.inference.server import ServerHandle, make_engine, serve_forever, start_server

__all__ = [
    "ChatChoice",
    "ChatEngine",
    "ChatRequest",
    "ChatResult",
    "ScriptedEngine",
    "ServerHandle",
    "TokenLogprob",
    "TransformersEngine",
    "bag_of_letters",
    "make_engine",
    "serve_forever",
    "start_server",
]
