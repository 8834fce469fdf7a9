"""`rldojo serve`: an OpenAI-compatible server over a local model (see `rldojo.inference`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    model: Annotated[
        str,
        typer.Option(
            help="Model name (tiny-random, smollm2-135m-instruct), model directory or "
            "checkpoint directory (a LoRA checkpoint is merged into its base on load)"
        ),
    ] = "smollm2-135m-instruct",
    host: Annotated[
        str, typer.Option(help="Address to bind (keep it local unless --api-key is set)")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port)")] = 8000,
    dtype: Annotated[
        str, typer.Option(help="Generation dtype: auto (measured), bfloat16 or float32")
    ] = "auto",
    served_model_name: Annotated[
        str | None,
        typer.Option(
            help="The model's name for clients: /v1/models lists it and requests must use "
            "it (default: --model as given)"
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="RLDOJO_API_KEY",
            show_envvar=True,
            help="Require 'Authorization: Bearer KEY' on every /v1 request (default: none)",
        ),
    ] = None,
) -> None:
    """Serve /v1/chat/completions (with tools), /v1/completions, /v1/models and
    /v1/embeddings for a local model: a drop-in OpenAI-compatible server."""
    from rldojo.commands.ui import console, fail, user_errors
    from rldojo.inference.server import serve_forever

    if dtype not in ("auto", "bfloat16", "float32"):
        fail(f"--dtype: expected auto, bfloat16 or float32, got {dtype!r}")
    if served_model_name is not None and not served_model_name.strip():
        fail("--served-model-name: must not be empty")

    def ready(handle: Any) -> None:
        console.print(f"serving {handle.model} at {handle.url} (Ctrl-C stops)", soft_wrap=True)

    try:
        serve_forever(
            model,
            host,
            port,
            dtype=dtype,
            on_ready=ready,
            served_model_name=served_model_name,
            api_key=api_key or None,
        )
    except user_errors() as exc:
        fail(str(exc))
