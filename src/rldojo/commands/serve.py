"""`rldojo serve`: an OpenAI-compatible server over a local model (see `rldojo.inference`).

The options that shape what the model reads (`--max-model-len`, `--chat-template`) are
vLLM's flags of the same names, checked before the model loads where they can be
(`rldojo.inference.serve_options`); each request is a line on the console unless
`--no-request-log` (`rldojo.inference.request_log`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rldojo.inference.server import ServerHandle

_Model = Annotated[
    str,
    typer.Option(
        help="Model name (tiny-random, smollm2-135m-instruct), model directory or "
        "checkpoint directory (a LoRA checkpoint is merged into its base on load)"
    ),
]
_Host = Annotated[str, typer.Option(help="Address to bind (keep it local unless --api-key is set)")]
_Port = Annotated[int, typer.Option(help="Port (0: any free port)")]
_Dtype = Annotated[str, typer.Option(help="Generation dtype: auto (measured), bfloat16 or float32")]
_ServedName = Annotated[
    str | None,
    typer.Option(
        help="The model's name for clients: /v1/models lists it and requests must use "
        "it (default: --model as given)"
    ),
]
_ApiKey = Annotated[
    str | None,
    typer.Option(
        envvar="RLDOJO_API_KEY",
        show_envvar=True,
        help="Require 'Authorization: Bearer KEY' on every /v1 request (default: none)",
    ),
]
_MaxModelLen = Annotated[
    int | None,
    typer.Option(
        help="Context window: a prompt + max_tokens beyond it is a 400 "
        "context_length_exceeded (default: the model's max_position_embeddings)"
    ),
]
_ChatTemplate = Annotated[
    str | None,
    typer.Option(
        help="Jinja chat template replacing the tokenizer's: a file, or the template "
        "itself (default: the tokenizer's)"
    ),
]
_RequestLog = Annotated[
    bool,
    typer.Option(
        "--request-log/--no-request-log",
        help="Print one line per request: method, path, status, model, prompt and "
        "completion tokens, duration",
    ),
]


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    model: _Model = "smollm2-135m-instruct",
    host: _Host = "127.0.0.1",
    port: _Port = 8000,
    dtype: _Dtype = "auto",
    served_model_name: _ServedName = None,
    api_key: _ApiKey = None,
    max_model_len: _MaxModelLen = None,
    chat_template: _ChatTemplate = None,
    request_log: _RequestLog = True,
) -> None:
    """Serve /v1/chat/completions (with tools), /v1/completions, /v1/models and
    /v1/embeddings for a local model: a drop-in OpenAI-compatible server."""
    from rldojo.commands.ui import console, fail, user_errors
    from rldojo.inference.serve_options import (
        ServeOptionError,
        check_max_model_len,
        load_chat_template,
    )

    if dtype not in ("auto", "bfloat16", "float32"):
        fail(f"--dtype: expected auto, bfloat16 or float32, got {dtype!r}")
    if served_model_name is not None and not served_model_name.strip():
        fail("--served-model-name: must not be empty")
    try:  # before the model loads
        if max_model_len is not None:
            check_max_model_len(max_model_len)
        template = load_chat_template(chat_template) if chat_template is not None else None
    except ServeOptionError as exc:
        fail(str(exc))

    from rldojo.inference.server import serve_forever

    refused: tuple[type[Exception], ...] = (*user_errors(), ServeOptionError)  # past positions

    def ready(handle: ServerHandle) -> None:
        console.print(f"serving {handle.model} at {handle.url} (Ctrl-C stops)", soft_wrap=True)

    def log(line: str) -> None:
        console.print(line, soft_wrap=True, markup=False, highlight=False)

    try:
        serve_forever(
            model,
            host,
            port,
            dtype=dtype,
            on_ready=ready,
            served_model_name=served_model_name,
            api_key=api_key or None,
            max_model_len=max_model_len,
            chat_template=template,
            request_log=log if request_log else None,
        )
    except refused as exc:
        fail(str(exc))
