"""`rldojo env serve ID`: an rldojo environment as an OpenEnv server (see
`rldojo.interop.openenv_server`), for OpenEnv's clients and the trainers built on them.

    rldojo env serve arith-v1 --port 8000
    rldojo env serve crm-v1 --kwargs '{"db_size": "small"}' --port 0   # any free port

Exit codes: 2 for bad input (unknown id, `--kwargs` that are not a JSON object or that the
environment refuses, a port in use, `openenv` not installed), as every command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rldojo.interop.serving import AppHandle

env_app = typer.Typer(
    help="Serve an environment to other projects' clients (OpenEnv).", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(env_app, name="env")


@env_app.command("serve")
def serve(
    env_id: Annotated[str, typer.Argument(help="Environment id (or package.module:factory)")],
    kwargs: Annotated[
        str, typer.Option("--kwargs", help="Factory keyword arguments as a JSON object")
    ] = "{}",
    host: Annotated[
        str, typer.Option(help="Address to bind (no auth: keep it local)")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port)")] = 8000,
    max_sessions: Annotated[
        int, typer.Option(help="Concurrent client sessions (one environment each)", min=1)
    ] = 64,
    task_seed: Annotated[int, typer.Option(help="Seed of the task lists a reset picks from")] = 0,
    step_timeout_s: Annotated[
        float, typer.Option(help="Seconds a reset or step may take (status timeout)", min=0.001)
    ] = 60.0,
    grade_timeout_s: Annotated[
        float, typer.Option(help="Seconds the grader may take at the end", min=0.001)
    ] = 60.0,
    max_turns: Annotated[
        int, typer.Option(help="Turns before an unfinished episode is cut (truncated)", min=1)
    ] = 64,
) -> None:
    """Serve ID over OpenEnv's protocol: reset gives the task's prompt, step plays one
    assistant turn, the grader's score is the reward at the end."""
    from rldojo.commands.ui import console, fail, parse_env_kwargs, user_errors
    from rldojo.interop.served_episode import ServedEnvSpec

    try:
        env_kwargs = parse_env_kwargs(kwargs)
    except ValueError as exc:
        fail(str(exc).replace("--env-kwargs", "--kwargs"))
    try:
        from rldojo.interop.openenv_server import serve_env_forever
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("openenv"):
            raise
        fail("rldojo env serve needs the openenv package: pip install 'rldojo[openenv]'")
    spec = ServedEnvSpec(env_id, env_kwargs, task_seed, step_timeout_s, grade_timeout_s, max_turns)

    def ready(handle: AppHandle) -> None:
        console.print(
            f"serving {env_id} over OpenEnv at {handle.url} (WebSocket "
            f"{handle.url.replace('http', 'ws', 1)}/ws; Ctrl-C stops)",
            soft_wrap=True,
        )

    from rldojo.asgi import PortInUseError

    refused: tuple[type[Exception], ...] = (PortInUseError, *user_errors())
    try:
        serve_env_forever(spec, host, port, max_sessions=max_sessions, on_ready=ready)
    except refused as exc:
        fail(str(exc))
