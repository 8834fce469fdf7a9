"""`rldojo serve`: an OpenAI-compatible server over a local model (see `rldojo.inference`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    model: Annotated[
        str, typer.Option(help="Model name (tiny-random, smollm2-135m-instruct) or directory")
    ] = "smollm2-135m-instruct",
    host: Annotated[
        str, typer.Option(help="Address to bind (no auth: keep it local)")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port)")] = 8000,
    dtype: Annotated[
        str, typer.Option(help="Generation dtype: auto (measured), bfloat16 or float32")
    ] = "auto",
) -> None:
    """Serve /v1/chat/completions, /v1/models and /v1/embeddings for a local model."""
    from rldojo.commands.ui import console, fail, user_errors
    from rldojo.inference.server import serve_forever

    if dtype not in ("auto", "bfloat16", "float32"):
        fail(f"--dtype: expected auto, bfloat16 or float32, got {dtype!r}")

    def ready(handle: Any) -> None:
        console.print(f"serving {handle.model} at {handle.url} (Ctrl-C stops)", soft_wrap=True)

    try:
        serve_forever(model, host, port, dtype=dtype, on_ready=ready)
    except user_errors() as exc:
        fail(str(exc))
