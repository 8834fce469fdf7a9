"""Experts: scripted players that solve an environment through the same API a model uses.

An expert reads the conversation so far (the env's opening, its own earlier turns and the
env's replies) and writes the next assistant turn as text, exactly as a policy would:

    expert = expert_for("arith-tools-v1")
    obs = await env.reset(task, seed=0)
    action = expert.act(obs.messages, task)      # '<tool_call>{...}</tool_call>'

Experts are stateless: everything they need is in `messages` and `task`, so one expert
plays many episodes at once. They may read `task.info` (a CRM scenario's template, a
game's mark), but take the ids and values a lookup returns from the ``tool`` messages,
so the demonstrated calls are the ones a model must learn. Turns are short and canonical
(one JSON tool call, ``<answer>N</answer>``, ``<move>N</move>``): small models imitate
them (`rldojo.rollout.demos` plays experts into demonstration files).

The experts of the built-in families live next to them (`arith_tools/expert.py`,
`crm/expert.py`, `web_crm/expert.py`, `games/expert.py`) and are imported on first
use; the CRM ones are `ScriptedExpert`s (a generator script per task template). Experts
are plugins (`rldojo.plugins`, `EXPERTS`): `register_expert` adds one in process, an
installed package through the entry-point group ``rldojo.experts`` (the entry's name is the
environment id it plays, its value the factory), and ``expert_for(env_id,
expert="pkg.mod:factory")``
(``rldojo demos --expert``) plays one named by path, or another registered one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from rldojo.envs.tool_calls import parse_turn
from rldojo.plugins import Registry
from rldojo.types import Message, Task

__all__ = [
    "EXPERTS",
    "Expert",
    "ScriptedExpert",
    "ToolExchange",
    "expert_for",
    "list_experts",
    "register_expert",
    "tool_call_text",
    "tool_exchanges",
]


@runtime_checkable
class Expert(Protocol):
    """Writes the next assistant turn of an episode (see the module docstring)."""

    def act(self, messages: list[Message], task: Task) -> str:
        """The next assistant turn's text, given the conversation so far and the task."""
        ...


ExpertFactory = Callable[..., Expert]
"""Builds an expert from the environment's kwargs (it may refuse a configuration)."""

EXPERTS = Registry(
    "expert",
    "rldojo.experts",
    lazy={
        "arith-tools-v1": "rldojo.envs.arith_tools.expert:make_expert",
        "crm-v1": "rldojo.envs.crm.expert:make_expert",
        "web-crm-v1": "rldojo.envs.web_crm.expert:make_expert",
        "tictactoe-v1": "rldojo.envs.games.expert:make_expert",
        "connect4-v1": "rldojo.envs.games.expert:make_expert",
    },
    error=ValueError,
)
"""Expert factories by the environment id they play (see the module docstring)."""


def register_expert(env_id: str, factory: ExpertFactory) -> None:
    """Give `env_id` an expert: ``factory(env_id=..., **env_kwargs)`` returns it."""
    EXPERTS.register(env_id, factory, overwrite=True)


def list_experts() -> list[str]:
    """The environment ids that have an expert."""
    return EXPERTS.names()


def expert_for(env_id: str, *, expert: str | None = None, **env_kwargs: object) -> Expert:
    """The expert of `env_id`, for an environment built with `env_kwargs`; `expert`
    names another one to play it (an id from `list_experts`, or ``"pkg.mod:factory"``).

    Raises `ValueError` (one line) when `env_id` has no expert, when `expert` cannot be
    found, or when the expert cannot play that configuration (e.g. arith-tools-v1
    without the calculator).
    """
    if expert is None and env_id not in EXPERTS:
        raise ValueError(
            f"{env_id} has no expert; environments with experts: {', '.join(list_experts())}"
        )
    # an env id is never read as a path: "pkg.mod:make_env" names the env, not its expert
    factory = EXPERTS.resolve(expert or env_id, paths=expert is not None)
    made = factory(env_id=env_id, **env_kwargs)
    if not callable(getattr(made, "act", None)):
        raise ValueError(
            f"expert {expert or env_id!r} returned {type(made).__name__}, which has no act()"
        )
    return made


# ------------------------------------------------------------------ the tool-call protocol


def tool_call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """One call in the syntax `rldojo.envs.tools.tools_prompt` teaches."""
    body = json.dumps({"name": name, "arguments": dict(arguments)})
    return f"<tool_call>{body}</tool_call>"


_RESPONSE = re.compile(r"<tool_response>(.*)</tool_response>", re.DOTALL)


@dataclass(frozen=True)
class ToolExchange:
    """One tool call an assistant turn made and what came back.

    `ok` is True when the tool returned a result (then `result` is the decoded JSON);
    otherwise `error` says why not (the tool's refusal, a cut or missing response).
    """

    name: str
    arguments: dict[str, Any]
    ok: bool
    result: Any = None
    error: str = ""


def _exchange(name: str, arguments: dict[str, Any], reply: str | None) -> ToolExchange:
    match = _RESPONSE.search(reply or "")
    if match is None:
        return ToolExchange(name, arguments, False, error="no tool response")
    try:
        body = json.loads(match.group(1))
    except ValueError:
        return ToolExchange(name, arguments, False, error="tool response is not JSON (cut?)")
    if isinstance(body, dict) and "result" in body:
        return ToolExchange(name, arguments, True, body["result"])
    error = body.get("error", body) if isinstance(body, dict) else body
    return ToolExchange(name, arguments, False, error=str(error))


def tool_exchanges(messages: list[Message]) -> list[list[ToolExchange]]:
    """Per assistant turn that called tools, its calls paired with the ``tool`` replies.

    The env answers a turn's calls in order, one ``tool`` message each (parse errors
    first, then the calls); turns without a call are left out.
    """
    out: list[list[ToolExchange]] = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        parsed = parse_turn(message.get("content") or "")
        if not parsed.calls:
            continue
        replies: list[str] = []
        for later in messages[i + 1 :]:
            if later.get("role") != "tool":
                break
            replies.append(later.get("content") or "")
        replies = replies[len(parsed.errors) :]
        out.append(
            [
                _exchange(call.name, call.arguments, replies[k] if k < len(replies) else None)
                for k, call in enumerate(parsed.calls)
            ]
        )
    return out


# ------------------------------------------------------------------ experts that run scripts

Script = Generator[list[tuple[str, dict[str, Any]]], Any, str]
"""A template's script: yields a turn's calls ``(name, arguments)``, receives what the
environment answered to them, returns the final answer."""


class ScriptedExpert:
    """An expert that plays each task by the script of its template
    (``task.info["template"]``), replayed over the replies already in the conversation,
    so it stays stateless. Subclasses set `scripts`, the exception a script raises to end
    with an explanation (`stop`), and how the replies are read (`replies`)."""

    scripts: Mapping[str, Callable[[str], Script]] = {}
    stop: type[Exception] = Exception

    def replies(self, messages: list[Message]) -> list[Any]:
        """What the environment answered to each assistant turn so far, as scripts read it."""
        raise NotImplementedError

    def act(self, messages: list[Message], task: Task) -> str:
        """The script's next calls, or its ``<answer>`` once it is done."""
        script = self.scripts.get(str(task.info.get("template", "")))
        if script is None:
            return "<answer>I cannot do this request.</answer>"
        prompt = task.prompt if isinstance(task.prompt, str) else messages[-1]["content"]
        try:
            run = script(prompt)
            calls = next(run)
            for reply in self.replies(messages):
                calls = run.send(reply)
        except StopIteration as done:
            return f"<answer>{done.value}</answer>"
        except self.stop as stop:
            return f"<answer>{stop}</answer>"
        return "\n".join(tool_call_text(name, args) for name, args in calls)
