"""`rldojo check-env ID`: check that an environment keeps the `Env` contract.

Runs `rldojo.envs.check.check_env` on a registered id or a ``package.module:factory``
path and prints one line per check. Exit status: 0 when every check passes, 1 when one
fails, 2 for bad input (unknown id, invalid ``--kwargs`` JSON, kwargs the environment's
`Kwargs` model or signature refuses: one line naming the key, ``env.kwargs.db_size``).

With ``--show`` (or ``--action``) it also plays one episode on the first train task and
prints the whole transcript (prompt, policy turns with their tool calls, environment
replies) and the grader's score, so you see what the policy will see. The policy turns
are the ``--action`` texts when given; else the task's reference answer, written both as
``<answer>...</answer>`` and as an ``Answer: ...`` line (the answer formats the built-in
graders read); else, for tasks without a reference, the checker's fixed filler turns.
Filler turns also continue an episode that the scripted turns did not end. The
transcript says which source it used. The episode never changes the exit status.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer

from rldojo.types import Message, Score


def register(app: typer.Typer) -> None:
    app.command("check-env")(check_env_command)


def check_env_command(
    env_id: Annotated[str, typer.Argument(help="Environment id or package.module:factory")],
    kwargs: Annotated[
        str, typer.Option("--kwargs", help="Factory keyword arguments as a JSON object")
    ] = "{}",
    seed: Annotated[int, typer.Option(help="Task and reset seed")] = 0,
    timeout_s: Annotated[float, typer.Option(help="Time limit of each check")] = 60.0,
    show: Annotated[
        bool, typer.Option("--show", help="Also print one episode's transcript and score")
    ] = False,
    action: Annotated[
        list[str] | None,
        typer.Option(
            "--action",
            help="A policy turn for --show, which it implies (repeat for more turns; "
            "default: the task's reference answer)",
        ),
    ] = None,
) -> None:
    """Check an environment: determinism, snapshot/restore, bad actions, step after done."""
    from rich.markup import escape

    from rldojo.commands.ui import console, fail
    from rldojo.envs.check import check_env
    from rldojo.envs.registry import (
        EnvKwargsError,
        UnknownEnvError,
        check_kwargs,
        resolve_factory,
    )

    try:
        env_kwargs = json.loads(kwargs)
    except json.JSONDecodeError as exc:
        fail(f"--kwargs is not valid JSON: {exc}")
        return
    if not isinstance(env_kwargs, dict):
        fail("--kwargs must be a JSON object")
        return
    try:  # the id and kwargs (its Kwargs model, else its signature) before any check
        check_kwargs(env_id, resolve_factory(env_id), env_kwargs)
    except (UnknownEnvError, EnvKwargsError) as exc:
        fail(str(exc))
        return
    report = check_env(env_id, seed=seed, timeout_s=timeout_s, **env_kwargs)
    for result in report.results:
        mark = "[green]ok[/]" if result.passed else "[red]FAIL[/]"
        console.print(
            f"{mark} {result.name}: {escape(result.message)}", soft_wrap=True, emoji=False
        )
    if show or action:
        show_episode(env_id, env_kwargs, seed=seed, actions=action or [], timeout_s=timeout_s)
    verdict = "[green]PASS[/]" if report.ok else f"[red]FAIL[/] ({len(report.failures)} failed)"
    console.print(f"check-env {escape(env_id)}: {verdict}", emoji=False)  # "m:X:" is no emoji
    if not report.ok:
        raise typer.Exit(1)


@dataclass
class Episode:
    """One played episode: what `--show` prints."""

    task_id: str = ""
    source: str = ""
    prompt: list[Message] = field(default_factory=list)
    turns: list[tuple[str, list[Message]]] = field(default_factory=list)
    """(policy turn, environment replies) in order."""
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    score: Score | None = None
    error: str = ""


def reference_turn(answer: str) -> str:
    """The reference answer in both formats the built-in graders read."""
    return f"<answer>{answer}</answer>\nAnswer: {answer}"


async def play_episode(
    env_id: str,
    env_kwargs: Mapping[str, Any],
    *,
    seed: int = 0,
    actions: list[str] | None = None,
    max_steps: int = 64,
    timeout_s: float = 60.0,
) -> Episode:
    """Play the first train task with scripted turns (see the module docstring) and grade
    it. An exception inside the environment or grader ends the episode with `error` set."""
    from rldojo.envs.check import FILLER, PLAIN
    from rldojo.envs.registry import make_env
    from rldojo.types import Rollout

    episode = Episode()
    try:
        env = make_env(env_id, **env_kwargs)
        tasks = list(env.tasks("train", seed=seed, n=2))
    except Exception as exc:
        episode.error = f"cannot build the environment: {type(exc).__name__}: {exc}"
        return episode
    if not tasks:
        episode.error = "tasks('train') returned no tasks"
        return episode
    task = tasks[0]
    episode.task_id = task.id
    script = list(actions or [])
    if script:
        episode.source = f"your {len(script)} --action turn(s), then the checker's filler turns"
    elif task.answer is not None:
        script = [reference_turn(task.answer)]
        episode.source = (
            f"the task's reference answer {task.answer!r} as <answer>...</answer> and as "
            "an 'Answer: ...' line, then the checker's filler turns"
        )
    else:
        episode.source = "the checker's fixed filler turns (this task has no reference answer)"
    filler = [FILLER, PLAIN]
    try:
        obs = await asyncio.wait_for(env.reset(task, seed=seed), timeout_s)
        episode.prompt = list(obs.messages)
        for i in range(max_steps):
            text = script[i] if i < len(script) else filler[(i - len(script)) % 2]
            result = await asyncio.wait_for(env.step(text), timeout_s)
            episode.turns.append((text, list(result.messages)))
            episode.info.update(result.info)
            if result.done:
                episode.done = True
                break
        messages = list(episode.prompt)
        for text, replies in episode.turns:
            messages += [{"role": "assistant", "content": text}, *replies]
        rollout = Rollout(
            task_id=task.id,
            env=task.env or env.env_id,
            messages=messages,
            completion=episode.turns[-1][0] if episode.turns else "",
            info=dict(episode.info),
            seed=seed,
        )
        grading = env.default_grader().grade(rollout, task)
        episode.score = await asyncio.wait_for(grading, timeout_s)
    except Exception as exc:
        episode.error = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        try:
            await env.close()
        except Exception as exc:
            episode.error = episode.error or f"close() raised {type(exc).__name__}: {exc}"
    return episode


def _block(header: str, content: str) -> list[str]:
    return [header, *("    " + line for line in (content or "(empty)").splitlines() or [""])]


def transcript_lines(episode: Episode) -> list[str]:
    """The transcript as plain lines: a header per message naming its role and whether it
    is prompt, policy turn or environment reply; tool calls listed under their turn."""
    from rldojo.envs.tool_calls import parse_turn

    if not episode.task_id:
        return [f"episode not played: {episode.error}"]
    lines = [f"episode: task {episode.task_id}", f"policy turns: {episode.source}"]
    for message in episode.prompt:
        lines += _block(f"[{message.get('role', '?')}] (prompt)", str(message.get("content")))
    for n, (text, replies) in enumerate(episode.turns, start=1):
        lines += _block(f"[assistant] (policy turn {n})", text)
        parsed = parse_turn(text)
        for call in parsed.calls:
            lines.append(f"  -> tool call: {call.name} {json.dumps(call.arguments)}")
        for error in parsed.errors:
            lines.append(f"  -> bad tool call ({error.kind}): {error.message}")
        for message in replies:
            lines += _block(f"[{message.get('role', '?')}] (env reply)", str(message["content"]))
    if episode.error:
        lines.append(f"episode stopped: {episode.error}")
        return lines
    ended = (
        f"done after {len(episode.turns)} turn(s)"
        if episode.done
        else f"not done after {len(episode.turns)} turn(s)"
    )
    reason = episode.info.get("episode/done_reason")
    lines.append(f"end: {ended}" + (f" ({reason})" if reason else ""))
    score = episode.score
    if score is not None:
        parts = ", ".join(f"{k} {v:g}" for k, v in score.components.items())
        lines.append(
            f"score: {score.value} ({score.status})"
            + (f" [{parts}]" if parts else "")
            + (f": {score.explanation}" if score.explanation else "")
        )
    return lines


def show_episode(
    env_id: str,
    env_kwargs: Mapping[str, Any],
    *,
    seed: int,
    actions: list[str],
    timeout_s: float,
) -> None:
    """Play and print one episode (`--show`)."""
    from rich.markup import escape

    from rldojo.commands.ui import console

    episode = asyncio.run(
        play_episode(env_id, env_kwargs, seed=seed, actions=actions, timeout_s=timeout_s)
    )
    console.rule("episode")
    for line in transcript_lines(episode):
        console.print(escape(line), soft_wrap=True, highlight=False, emoji=False)
    console.rule()
