"""`rldojo demos`: expert or teacher demonstrations of an environment, as JSONL for SFT.

    rldojo demos ENV --n N --out demos.jsonl [--env-kwargs JSON] [--split train] [--seed 0]
                 [--expert ID|pkg.module:factory]
                 [--teacher http://host:port/v1#model] [--samples K] [--temperature 0.7]
                 [--max-new-tokens 256] [--keep passed|all] [--api-key KEY]
                 [--from-answers] [--format text|openai]
    rldojo demos CONFIG.toml --n N --out demos.jsonl [--set env.kwargs.levels=[1]]

ENV is an environment id, or the TOML config that `rldojo sft` and `rldojo train` read:
its `[env]` id and kwargs are played (with `--set` overrides; `--env-kwargs` is merged
over the kwargs), so the demonstrations come from the environment the model trains on.

Without `--teacher`, the env's expert plays (`rldojo.envs.experts`), or the one `--expert`
names (an installed expert's id from `rldojo plugins`, or ``pkg.module:factory``); with
`--teacher`, the endpoint does, and only episodes the env's grader passes are kept (up
to `--samples` attempts per task); with `--from-answers`, each task's own reference
answer is the reply (`AnswerActor`: a cold start for any env whose tasks carry `answer`),
graded like any other, so only answers the env's grader passes are kept. Each line is
one demo record (`rldojo.rollout.demos`), or with `--format openai` only its messages in
OpenAI's tool-calling shape and its tools (`rldojo.rollout.openai_demos`: what OpenAI's
fine-tuning and TRL's SFTTrainer read; it cannot mark failed attempts, so it refuses
`--keep all`); the file is replaced in one step when the collection is done. Bad input
(unknown env, an env without an expert, bad `--env-kwargs` or config, an `--out` that
cannot be written) is one line, before any episode; an error in the config's env names
the config file.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rldojo.commands.ui import parse_env_kwargs

if TYPE_CHECKING:
    from rich.console import Console

    from rldojo.types import Message, Task

FORMAT_HELP = (
    "text: demo records, calls as the model wrote them; openai: OpenAI's fine-tuning "
    "lines (tool_calls, tool_call_id, tools)"
)


def register(app: typer.Typer) -> None:
    """Add `rldojo demos` to the app."""
    app.command("demos")(demos)


def _env_of(
    spec: str, env_kwargs: str | None, overrides: list[str]
) -> tuple[str, dict[str, Any], str | None]:
    """`(env id, kwargs, config file or None)` from ENV (an id or a TOML config)."""
    extra = parse_env_kwargs(env_kwargs) if env_kwargs is not None else {}
    if not spec.endswith(".toml"):
        if overrides:
            raise ValueError("--set needs a CONFIG.toml in place of ENV")
        return spec, extra, None
    from rldojo.config import ConfigError, load_config

    env = load_config(spec, overrides).env
    if env.mix:
        raise ConfigError(
            f"{spec}: env.mix: rldojo demos plays one environment; set env.id "
            "and env.kwargs (or pass an environment id)"
        )
    return env.id, {**env.kwargs, **extra}, spec


def _check_out(out: Path) -> None:
    """Fail now, not after the episodes, when `out` cannot be written."""
    if out.is_dir():
        raise ValueError(f"--out {out} is a directory")
    parent = next((p for p in out.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"--out {out}: {parent} is not a directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}."):
            pass
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None


def _rows(records: list[dict[str, Any]], form: str) -> tuple[list[dict[str, Any]], int]:
    """The lines to write in `form`, and how many assistant turns kept their calls as
    text (``openai``: a turn `openai_record` cannot give back exactly)."""
    if form == "text":
        return records, 0
    from rldojo.rollout.openai_demos import openai_record

    rows = [openai_record(r) for r in records]
    as_text = sum(
        m["role"] == "assistant" and "<tool_call>" in (m["content"] or "")
        for row in rows
        for m in row["messages"]
    )
    return rows, as_text


def _write_jsonl(out: Path, rows: list[dict[str, Any]]) -> None:
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
    os.replace(tmp, out)  # a crash leaves the old file or the new one, never half


class AnswerActor:
    """An actor that replies with the task's reference answer (`Task.answer`), written
    the way the env asks (its `reference_reply(task)`, where it has one), else as the
    ``Answer: X`` line the rules graders read. A task without an answer raises, which
    the episode records as `policy_error`: never a kept demo."""

    source = "answers"

    def __init__(self, env_id: str, kwargs: dict[str, Any]) -> None:
        from rldojo.envs.registry import make_env

        self.env = make_env(env_id, **kwargs)
        self.reply = getattr(self.env, "reference_reply", None)

    def __call__(self, messages: list[Message], task: Task) -> str:
        reply = self.reply(task) if self.reply is not None else None
        if reply is None and task.answer is not None:
            reply = f"Answer: {task.answer}"
        if reply is None:
            raise ValueError(f"task {task.id} carries no reference answer")
        return str(reply)

    async def aclose(self) -> None:
        await self.env.close()


async def _collect(o: dict[str, Any], kwargs: dict[str, Any]) -> tuple[list[dict], Any]:
    from rldojo.rollout.demos import Teacher, collect_demos

    teacher: AnswerActor | Teacher | None = None
    if o["from_answers"]:
        teacher = AnswerActor(o["env"], kwargs)
    if o["teacher"]:
        key = o["api_key"] or os.environ.get("OPENAI_API_KEY", "EMPTY")
        teacher = Teacher.from_spec(
            o["teacher"],
            api_key=key,
            temperature=o["temperature"],
            max_tokens=o["max_new_tokens"],
        )
    try:
        return await collect_demos(
            o["env"],
            kwargs,
            n=o["n"],
            split=o["split"],
            seed=o["seed"],
            actor=teacher or "expert",
            expert=o["expert"],
            samples=o["samples"],
            keep=o["keep"],
            pass_threshold=o["pass_threshold"],
            max_turns=o["max_turns"],
            concurrency=o["concurrency"],
        )
    finally:
        if teacher is not None:
            await teacher.aclose()


def _print(console: Console, o: dict[str, Any], s: dict[str, Any], source: str) -> None:
    from rich.table import Table

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    title = f"{o['env']} demos by {source} ({o['split']} split)"
    table = Table(title=title, min_width=len(title) + 4)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in (
        ("tasks", str(s["tasks"])),
        ("episodes", str(s["episodes"])),
        ("passed", f"{s['passed']} ({s['tasks_passed']} tasks)"),
        ("kept", str(s["kept"])),
        ("mean score", num(s["mean_score"])),
        ("mean turns", num(s["mean_turns"])),
        ("mean tool calls", num(s["mean_tool_calls"])),
        ("statuses", ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items())) or "-"),
    ):
        table.add_row(name, value)
    console.print(table)
    console.print(f"wrote {s['kept']} demos to {o['out']}")


def demos(
    env: Annotated[
        str,
        typer.Argument(
            metavar="ENV|CONFIG.toml",
            help="Environment id (e.g. crm-v1), or the TOML config of rldojo sft/train "
            "(its \\[env] id and kwargs)",
        ),
    ],
    n: Annotated[int, typer.Option("--n", help="Tasks of the split to play")] = 100,
    out: Annotated[Path, typer.Option(help="Demo records (JSONL)")] = Path("demos.jsonl"),
    env_kwargs: Annotated[
        str | None,
        typer.Option(help="JSON kwargs for the environment (with a CONFIG: merged over its)"),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override in CONFIG, e.g. env.kwargs.levels=[1]"),
    ] = None,
    split: Annotated[str, typer.Option()] = "train",
    seed: Annotated[int, typer.Option(help="Task seed; episode seeds follow from it")] = 0,
    expert: Annotated[
        str | None,
        typer.Option(help="Expert to play: an id from rldojo plugins, or pkg.module:factory"),
    ] = None,
    teacher: Annotated[
        str | None, typer.Option(help="Teacher endpoint http://host:port/v1#model-name")
    ] = None,
    samples: Annotated[int, typer.Option(help="Attempts per task (rejection sampling)")] = 1,
    temperature: Annotated[float, typer.Option(help="Teacher sampling temperature")] = 0.7,
    max_new_tokens: Annotated[int, typer.Option(help="Teacher tokens per turn")] = 256,
    keep: Annotated[str, typer.Option(help="passed: passing episodes only; all")] = "passed",
    pass_threshold: Annotated[
        float | None, typer.Option(help="Pass at this score when the grader has no 'correct'")
    ] = None,
    max_turns: Annotated[int, typer.Option(help="Assistant turns per episode at most")] = 32,
    concurrency: Annotated[int, typer.Option(help="Episodes played at once")] = 8,
    api_key: Annotated[
        str | None, typer.Option(help="Teacher key (default $OPENAI_API_KEY)")
    ] = None,
    from_answers: Annotated[
        bool, typer.Option(help="Reply with each task's reference answer (a cold start)")
    ] = False,
    format_: Annotated[str, typer.Option("--format", help=FORMAT_HELP)] = "text",
) -> None:
    """Play an env with its expert (or a teacher endpoint) and write graded demos as JSONL."""
    from rldojo.commands.ui import fail, user_errors
    from rldojo.envs.registry import EnvKwargsError, UnknownEnvError

    o = dict(locals())
    errors: tuple[type[Exception], ...] = (*user_errors(), ValueError)
    source = None
    try:
        _check_options(o)
        o["env"], kwargs, source = _env_of(env, env_kwargs, set_ or [])
        _check_out(out)
        records, stats = asyncio.run(_collect(o, kwargs))
    except errors as exc:
        # the env's errors name its id or key, not the config file they came from
        in_config = source is not None and isinstance(exc, (EnvKwargsError, UnknownEnvError))
        fail(f"{source}: {exc}" if in_config else str(exc))
        return
    _save(o, records, stats.as_dict())


def _save(o: dict[str, Any], records: list[dict[str, Any]], stats: dict[str, Any]) -> None:
    """Write the demos in the chosen format and say what was played and kept."""
    from rldojo.commands.ui import console

    rows, as_text = _rows(records, o["format_"])
    _write_jsonl(o["out"], rows)
    played = f"teacher:{o['teacher'].partition('#')[2]}" if o["teacher"] else "expert"
    _print(console, o, stats, AnswerActor.source if o["from_answers"] else played)
    if as_text:
        console.print(
            f"{as_text} assistant turns kept their tool calls as text (a call amid "
            "prose, a broken tag): rldojo sft reads them as written; OpenAI's "
            "fine-tuning wants tool_calls"
        )


def _check_options(o: dict) -> None:
    """One-line `ValueError`s for options that cannot go together, before anything plays."""
    if o["keep"] not in ("passed", "all"):
        raise ValueError(f"--keep must be 'passed' or 'all', got {o['keep']!r}")
    if o["format_"] not in ("text", "openai"):
        raise ValueError(f"--format must be 'text' or 'openai', got {o['format_']!r}")
    if o["format_"] == "openai" and o["keep"] == "all":
        raise ValueError(
            "--format openai writes no 'passed' mark, so it cannot keep failed "
            "attempts: use --keep passed, or --format text"
        )
    if o["n"] < 1 or o["samples"] < 1 or o["max_turns"] < 1:
        raise ValueError("--n, --samples and --max-turns must be >= 1")
    if sum(map(bool, (o["expert"], o["teacher"], o["from_answers"]))) > 1:
        raise ValueError(
            "--expert, --teacher and --from-answers exclude each other: one of them plays"
        )
