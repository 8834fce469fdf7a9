"""`rldojo service`: the OpenAI-compatible fine-tuning service (`rldojo.service`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rldojo.service.server import ServiceHandle


def register(app: typer.Typer) -> None:
    app.command("service")(service)


def service(
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="State, uploads and job run directories")
    ] = Path("rldojo-service"),
    host: Annotated[str, typer.Option(help="Address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port)")] = 8000,
    api_keys_file: Annotated[
        Path | None,
        typer.Option("--api-keys-file", help="API keys, one per line (also RLDOJO_API_KEYS)"),
    ] = None,
    max_concurrent_jobs: Annotated[
        int, typer.Option("--max-concurrent-jobs", min=1, help="Jobs training at once")
    ] = 1,
    max_file_mb: Annotated[
        float, typer.Option("--max-file-mb", help="Largest upload, in MiB")
    ] = 64.0,
    allow_model: Annotated[
        list[str] | None,
        typer.Option("--allow-model", help="Also fine-tune this local model directory"),
    ] = None,
    max_loaded_models: Annotated[
        int, typer.Option("--max-loaded-models", min=1, help="Models kept loaded for inference")
    ] = 2,
    job_threads: Annotated[
        int | None, typer.Option("--job-threads", help="torch threads per job (default: all)")
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            help="Run reinforcement jobs' rollout workers on this Ray cluster (host:port, "
            "ray://host:10001, auto); its nodes must read --data-dir at the same path. "
            "Supervised jobs ignore it",
        ),
    ] = None,
    judge_base_url: Annotated[
        str | None,
        typer.Option(
            "--judge-base-url",
            help="OpenAI-compatible endpoint (e.g. `rldojo serve`) that answers model graders "
            "(score_model, label_model) for the model their spec names; without it they are "
            "a 400",
        ),
    ] = None,
    judge_api_key: Annotated[
        str | None,
        typer.Option(
            "--judge-api-key",
            envvar="RLDOJO_JUDGE_API_KEY",
            show_envvar=True,
            help="API key of --judge-base-url (never stored, logged or shown to callers; "
            "prefer the environment variable, which `ps` does not show)",
        ),
    ] = None,
    keep_checkpoints: Annotated[
        int, typer.Option(min=1, help="Checkpoints kept per job (the newest; the last is final)")
    ] = 2,
    pause_timeout_s: Annotated[
        float, typer.Option(help="Seconds a paused job's run may take to checkpoint and stop")
    ] = 120.0,
    signal_prompts: Annotated[
        int,
        typer.Option(
            help="Prompts sampled before step 1 to report the expected learning signal (0: off)"
        ),
    ] = 4,
) -> None:
    """Serve OpenAI's fine-tuning API (files, supervised and RFT jobs, graders, models)
    under /v1."""
    from rldojo.commands.ui import console, fail
    from rldojo.service import ServiceSettings, load_api_keys, serve_forever
    from rldojo.service.settings import BUILTIN_BASE_MODELS

    try:
        keys = load_api_keys(api_keys_file)
    except ValueError as exc:
        fail(str(exc))
    if judge_base_url and not judge_base_url.startswith(("http://", "https://")):
        fail(f"--judge-base-url {judge_base_url}: expected an http:// or https:// URL")
    if not keys:
        fail("no API keys: set RLDOJO_API_KEYS=key1,key2 or pass --api-keys-file FILE")
    models = list(BUILTIN_BASE_MODELS)
    for path in allow_model or []:
        if not Path(path).is_dir():
            fail(f"--allow-model {path}: not a model directory")
        models.append(path)
    settings = ServiceSettings(
        data_dir=data_dir,
        api_keys=keys,
        max_concurrent_jobs=max_concurrent_jobs,
        max_file_bytes=int(max_file_mb * 1024 * 1024),
        base_models=tuple(models),
        max_loaded_models=max_loaded_models,
        job_threads=job_threads,
        ray_address=ray_address,
        judge_base_url=judge_base_url or None,
        judge_api_key=(judge_api_key or None) if judge_base_url else None,
        keep_checkpoints=keep_checkpoints,
        pause_timeout_s=pause_timeout_s,
        signal_prompts=signal_prompts,
    )

    def ready(handle: ServiceHandle) -> None:
        console.print(
            f"rldojo service at {handle.url} (data: {data_dir}; Ctrl-C stops)", soft_wrap=True
        )

    serve_forever(settings, host, port, on_ready=ready)
