"""An environment served by `rldojo env serve` as TRL's `environment_factory`.

TRL's `GRPOTrainer(environment_factory=...)` (experimental in TRL 1.16) builds one
environment instance per rollout from a zero-argument callable and reuses it across
batches. It exposes every public method of the instance's class (except `reset` and
`get_reward`) as a tool: the method's signature and Google docstring become the schema
the chat template renders, and a parsed tool call runs ``method(**arguments)``, its
return value (as text) being the tool message. Before generating it calls
``reset(**row)`` with the dataset row; a returned string is appended to the last user
message. Reward functions get the instances as ``environments=``.

This module plugs a served environment into that contract through OpenEnv's own client:

    factory = served_env_factory("http://127.0.0.1:8000")   # reads the served tools
    trainer = GRPOTrainer(model, reward_funcs=served_reward,
                          environment_factory=factory, args=GRPOConfig(...))
    trainer.train()
    factory.close()

- each instance holds one OpenEnv session (`GenericEnvClient(...).sync()`);
- ``reset(**row)`` starts an episode on the row's ``task``, ``index`` (of ``split``) or
  ``seed``; a row with none of them (TRL's dataset-free mode) gets the factory's next
  seed, so each rollout plays its own task. It returns the opening conversation (the
  instructions and the task) as text;
- every tool the server lists at reset is a method of the same name; one call is one
  turn, ``step({"message": "", "tool_calls": [call]})``, and returns the tool's result;
- `served_reward` plays the rollout's last assistant message as the closing turn and
  returns the grader's score; None (TRL's "not scored": the rollout gets no advantage)
  when the episode failed (a status other than ok/truncated) or did not end.

Serve tool environments for TRL with ``schema_style: "template"`` (the chat template
renders the tools; the system prompt keeps the call syntax only) and ``no_action:
"end"`` (a final turn without an answer ends the episode with the format penalty rather
than drawing a reminder nobody reads). TRL runs the calls of one assistant message one
by one, so a message with two calls is two turns of the served episode.
"""

from __future__ import annotations

import inspect
import itertools
import keyword
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "EpisodeOverError",
    "ServedEnvFactory",
    "ServedToolEnv",
    "served_env_factory",
    "served_reward",
    "tool_method",
]

JSON_TYPES: dict[str, type] = {
    "string": str, "integer": int, "number": float, "boolean": bool, "array": list,
    "object": dict,
}  # fmt: skip
"""Python annotation of each JSON-schema type (transformers maps them back)."""
RESET_FIELDS = ("task", "index", "split", "seed")
"""Row columns forwarded to the served reset (`RldojoEnvironment.reset_async`)."""
_RESERVED = ("reset", "get_reward")
_TOOL_RESPONSE = re.compile(r"\A\s*<tool_response>(.*)</tool_response>\s*\Z", re.DOTALL)


class EpisodeOverError(RuntimeError):
    """A tool call after the served episode ended (TRL counts it as a failed call)."""


class ServedToolEnv:
    """One rollout's OpenEnv session with a served environment (module docstring).

    `ServedEnvFactory` subclasses it per environment, adding one method per served
    tool; everything else here is private or an attribute, because TRL makes every
    public method a tool. After an episode: `task_id`, `turns`, `done`, `status` (the
    server's, or ``unfinished``), `reward` (the grader's score, None unless graded).
    """

    _factory: ServedEnvFactory
    """The factory that built the subclass (set on it)."""

    def __init__(self) -> None:
        from openenv.core import GenericEnvClient

        self._client = GenericEnvClient(base_url=self._factory.url).sync()
        self.task_id, self.turns, self.status = "", 0, "ok"
        self.done, self.reward = True, None

    def reset(self, **row: object) -> str:
        """Start an episode on the row's task, index or seed (else the factory's next
        seed); the opening conversation as text. `ValueError` when the server refuses."""
        result = self._client.reset(**self._factory.reset_fields(row))
        obs = result.observation
        self.task_id, self.turns, self.reward = obs.get("task_id", ""), 0, None
        self.done, self.status = bool(result.done), obs.get("status", "ok")
        if self.done:
            raise ValueError(f"the served reset failed ({self.status}): {obs.get('error')}")
        return "\n\n".join(m["content"] for m in obs["messages"])

    def _play(self, action: dict[str, Any]) -> list[dict[str, Any]]:
        """One turn of the served episode; the environment's reply messages."""
        if self.done:
            raise EpisodeOverError(f"the episode of {self.task_id} is over ({self.status})")
        result = self._client.step(action)
        self.turns += 1
        obs = result.observation
        self.done, self.status = bool(result.done), obs.get("status", "ok")
        if self.done:
            self.reward = result.reward
        return list(obs.get("messages") or [])

    def _call_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        """A tool call as one turn; the result (``<tool_response>`` tags removed: the chat
        template adds its own)."""
        call = {"name": name, "arguments": {k: v for k, v in arguments.items() if v is not None}}
        messages = self._play({"message": "", "tool_calls": [call]})
        if not messages and self.done:
            return f"The episode ended ({self.status})."
        return "\n".join(_unwrap(m.get("content", "")) for m in messages)

    def _finish(self, text: str) -> float | None:
        """Play `text` as the closing turn (unless the episode already ended); the
        grader's score, or None when it failed or the episode is still open."""
        if not self.done:
            self._play({"message": text})
            if not self.done:
                self.status = "unfinished"
                return None
        return self.reward

    def _close(self) -> None:
        self._client.close()


def _unwrap(content: str) -> str:
    found = _TOOL_RESPONSE.match(content)
    return found.group(1) if found else content


def _docstring(function: Mapping[str, Any]) -> str:
    """A Google docstring from which transformers' `get_json_schema` rebuilds the schema."""
    lines = [" ".join(str(function.get("description") or function["name"]).split()), ""]
    properties = (function.get("parameters") or {}).get("properties") or {}
    if properties:
        lines.append("Args:")
    for name, spec in properties.items():
        text = " ".join(str(spec.get("description") or name.replace("_", " ")).split())
        if "enum" in spec:
            text += " (choices: [" + ", ".join(f'"{c}"' for c in spec["enum"]) + "])"
        lines.append(f"    {name}: {text}")
    return "\n".join(lines)


def _check_name(name: str, what: str) -> None:
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise ValueError(f"served {what} {name!r} is not usable as a Python name")
    if what == "tool" and name in _RESERVED:
        raise ValueError(f"served tool {name!r} clashes with TRL's {name}()")


def tool_method(schema: Mapping[str, Any]) -> Callable[..., str]:
    """The method that forwards one served tool (an OpenAI function schema): keyword
    arguments typed from the schema, optional ones defaulting to None (not sent)."""
    function = schema["function"]
    name = function["name"]
    _check_name(name, "tool")
    parameters = function.get("parameters") or {}
    required = set(parameters.get("required") or [])
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for arg, spec in (parameters.get("properties") or {}).items():
        _check_name(arg, "argument")
        annotations[arg] = JSON_TYPES.get(str(spec.get("type")), str)
        default = inspect.Parameter.empty if arg in required else None
        params.append(
            inspect.Parameter(
                arg, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotations[arg]
            )
        )

    def method(self: ServedToolEnv, **arguments: object) -> str:
        return self._call_tool(name, arguments)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = _docstring(function)
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = {**annotations, "return": str}
    return method


class ServedEnvFactory:
    """TRL's `environment_factory` for one served environment: each call is a fresh
    `ServedToolEnv` subclass instance with the served tools as methods."""

    def __init__(self, url: str, *, split: str = "train", first_seed: int = 0) -> None:
        self.url, self.split = url.rstrip("/"), split
        self._seeds, self._lock = itertools.count(first_seed), threading.Lock()
        self.instances: list[ServedToolEnv] = []
        self.env_id, self.tools = _probe(self.url, split)
        methods = {s["function"]["name"]: tool_method(s) for s in self.tools}
        class_name = "Served" + "".join(p.title() for p in re.split(r"[^0-9A-Za-z]+", self.env_id))
        namespace = {**methods, "_factory": self, "__module__": __name__}
        self.env_class: type[ServedToolEnv] = type(class_name, (ServedToolEnv,), namespace)

    def __call__(self) -> ServedToolEnv:
        env = self.env_class()
        self.instances.append(env)
        return env

    def reset_fields(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The served reset's fields for a dataset row (see the module docstring)."""
        fields = {k: row[k] for k in RESET_FIELDS if row.get(k) is not None}
        fields.setdefault("split", self.split)
        if not {"task", "index", "seed"} & fields.keys():
            with self._lock:
                fields["seed"] = next(self._seeds)
        return fields

    def close(self) -> None:
        """Close the sessions of every instance built so far."""
        for env in self.instances:
            env._close()


def _probe(url: str, split: str) -> tuple[str, list[dict[str, Any]]]:
    """The served environment's id and tool schemas (one reset, on a session of its own)."""
    from openenv.core import GenericEnvClient

    with GenericEnvClient(base_url=url).sync() as client:
        result = client.reset(split=split, index=0)
        state = client.state()
    tools = list(result.observation.get("tools") or [])
    env_id = str(state.get("env_id") or "env") if isinstance(state, Mapping) else "env"
    return env_id, tools


def served_env_factory(url: str, *, split: str = "train", first_seed: int = 0) -> ServedEnvFactory:
    """TRL's `environment_factory` for the environment served at `url` (`rldojo env
    serve`): tasks from `split`, dataset-free rollouts seeded from `first_seed` up."""
    return ServedEnvFactory(url, split=split, first_seed=first_seed)


def _final_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The closing turn of a TRL completion: its last message when that is an assistant
    message without tool calls (else the rollout stopped on a call: an empty turn)."""
    if isinstance(completion, str):
        return completion
    last = completion[-1] if completion else {}
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return ""
    content = last.get("content") or ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return str(content)


def served_reward(
    completions: Sequence[str | Sequence[Mapping[str, Any]]],
    environments: Sequence[object],
    **_: object,
) -> list[float | None]:
    """TRL reward function: each rollout's closing turn played on its served episode, and
    the grader's score (None for a failed or unfinished episode, or another env's)."""
    return [
        env._finish(_final_text(c)) if isinstance(env, ServedToolEnv) else None
        for c, env in zip(completions, environments, strict=True)
    ]
