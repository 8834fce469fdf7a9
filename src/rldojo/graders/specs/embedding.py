"""Embedding models for `text_similarity`'s ``cosine`` metric, built from an ``embedding`` table.

    {base_url = "http://127.0.0.1:8000/v1", model = "...", api_key = "..."}
    {backend = "transformers", model = "tiny-random"}

`LoadContext.embedder` (`context`) builds and shares them per spec.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from rldojo.graders.specs.common import check_keys, require

if TYPE_CHECKING:
    from rldojo.inference.protocol import ChatEngine

__all__ = ["Embedder", "make_embedder"]


class Embedder(Protocol):
    """An embedding model: texts in, one vector each."""

    model: str

    async def embed(self, texts: list[str]) -> list[list[float]]: ...

    async def aclose(self) -> None:
        """Release its client or engine."""
        ...


class _OpenAIEmbedder:
    def __init__(self, base_url: str, model: str, api_key: str) -> None:
        self.base_url, self.model, self.api_key = base_url, model, api_key
        self._clients: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    async def embed(self, texts: list[str]) -> list[list[float]]:
        import openai

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key)
            self._clients[loop] = client
        response = await client.embeddings.create(model=self.model, input=texts)
        return [list(d.embedding) for d in sorted(response.data, key=lambda d: d.index)]

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()


class _EngineEmbedder:
    def __init__(self, engine: ChatEngine) -> None:
        self.engine, self.model = engine, engine.model

    async def embed(self, texts: list[str]) -> list[list[float]]:
        return list(await self.engine.embed(texts))

    async def aclose(self) -> None:
        self.engine.close()


def make_embedder(config: Mapping[str, Any], path: str) -> Embedder:
    """An embedder from ``{base_url, model, api_key}`` or ``{backend="transformers", model}``."""
    check_keys(config, ("backend", "base_url", "model", "api_key"), path)
    model = require(config, "model", str, path)
    if config.get("backend") == "transformers":
        from rldojo.inference.engine import TransformersEngine

        return _EngineEmbedder(TransformersEngine(model))
    base_url = require(config, "base_url", str, path)
    return _OpenAIEmbedder(base_url, model, str(config.get("api_key", "EMPTY")))
