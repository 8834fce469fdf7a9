"""The mapping between rldojo's turns and an OpenEnv server's actions and observations.

OpenEnv environments declare their own action and observation models, so the mapping
reads the server's ``/schema``:

- **action**: the assistant's text goes into one string field of the action. Which one is
  `action_field`, or else the action schema's only string field (a required one first:
  ``message`` for the environment `openenv init` generates and for `rldojo env serve`).
  An action schema that is OpenEnv's MCP `CallToolAction` (`is_tool_action`) takes tool
  calls instead (`rldojo.envs.openenv.tools`).
- **observation**: an observation with a ``messages`` list of chat messages (what `rldojo
  env serve` sends) becomes those messages; otherwise `observation_field`'s value, or the
  observation's only string field, or all its fields as JSON (its ``metadata`` when it has
  no other field, as an MCP environment's reset observation), becomes one user message.
- **status**: an observation with rldojo's ``status`` field (a server `rldojo env serve`
  runs) that reports a failure is raised here (`ServerReportedError`, or a `TimeoutError`
  for ``timeout``), so the rollout engine records the status; ``grade_<s>`` is not
  raised: the episode ended, and the grader reports the server grader's failure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rldojo.types import Message

__all__ = [
    "ServerReportedError",
    "action_field_of",
    "check_status",
    "discover_action_field",
    "fetch_schema",
    "is_tool_action",
    "observation_messages",
]

_NOT_SHOWN = frozenset({"metadata", "reward", "done"})
"""Observation fields that are not part of what the policy reads."""
FAILURES = frozenset({"env_error", "timeout", "invalid"})
"""The statuses of `rldojo.interop.served_episode` that end an episode without grading."""
_SCHEMA_CACHE: dict[str, dict[str, Any]] = {}
"""The server's ``/schema`` per base URL."""


class ServerReportedError(RuntimeError):
    """The server's observation reported a failure (rldojo ``status``); `env_error`."""


def action_field_of(schema: Mapping[str, Any]) -> str:
    """The action's string field to put the assistant's text in, from ``/schema``'s
    `action` JSON schema; `ValueError` when there is none or the choice is ambiguous."""
    props: Mapping[str, Any] = schema.get("properties") or {}
    strings = [name for name, p in props.items() if p.get("type") == "string"]
    required = [name for name in strings if name in (schema.get("required") or ())]
    for candidates in (required, strings):
        if len(candidates) == 1:
            return candidates[0]
    if not strings:
        raise ValueError(
            f"the server's action has no string field (fields: {', '.join(props) or 'none'}); "
            "it cannot take a text turn"
        )
    raise ValueError(
        f"the server's action has several string fields ({', '.join(strings)}): set "
        "env.kwargs.action_field to the one the assistant's text goes in"
    )


async def fetch_schema(base_url: str, timeout_s: float) -> dict[str, Any]:
    """The server's ``GET /schema`` (action, observation and state JSON schemas), cached
    per URL (a server's schema does not change); `ConnectionError` when it cannot be read."""
    if base_url in _SCHEMA_CACHE:
        return _SCHEMA_CACHE[base_url]
    import httpx

    url = base_url.rstrip("/").replace("ws://", "http://").replace("wss://", "https://")
    try:
        async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:
            response = await client.get(f"{url}/schema")
            response.raise_for_status()
            schema = response.json()
    except httpx.HTTPError as exc:
        raise ConnectionError(f"GET {url}/schema failed: {type(exc).__name__}: {exc}") from exc
    _SCHEMA_CACHE[base_url] = schema
    return schema


async def discover_action_field(base_url: str, timeout_s: float) -> str:
    """`action_field_of` the server at `base_url` (``GET /schema``); `ConnectionError`
    when the server cannot be reached."""
    schema = await fetch_schema(base_url, timeout_s)
    return action_field_of(schema.get("action") or {})


def is_tool_action(schema: Mapping[str, Any]) -> bool:
    """Whether an action JSON schema is OpenEnv's MCP `CallToolAction` (a ``tool_name``
    string and an ``arguments`` object): the server takes tool calls, not text."""
    props: Mapping[str, Any] = schema.get("properties") or {}
    return (props.get("tool_name") or {}).get("type") == "string" and (
        props.get("arguments") or {}
    ).get("type") == "object"


def _is_chat(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in value
    )


def observation_messages(observation: Mapping[str, Any], field: str | None = None) -> list[Message]:
    """The chat messages an observation adds to the conversation (module docstring)."""
    if field is None and _is_chat(observation.get("messages")):
        return [
            {"role": str(m["role"]), "content": str(m["content"])} for m in observation["messages"]
        ]
    if field is not None:
        if field not in observation:
            raise ValueError(
                f"the observation has no field {field!r} (it has: "
                f"{', '.join(observation) or 'none'})"
            )
        value = observation[field]
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        return [{"role": "user", "content": text}]
    shown = {k: v for k, v in observation.items() if k not in _NOT_SHOWN}
    if not shown and observation.get("metadata"):  # e.g. an MCP environment's reset
        shown = dict(observation["metadata"])
    strings = [v for v in shown.values() if isinstance(v, str)]
    if len(shown) == 1 and len(strings) == 1:
        return [{"role": "user", "content": strings[0]}]
    return [{"role": "user", "content": json.dumps(shown, sort_keys=True, default=str)}]


def check_status(observation: Mapping[str, Any]) -> str:
    """The observation's rldojo status (``ok`` when it has none); raises for one of
    `FAILURES` (module docstring)."""
    status = observation.get("status")
    if status not in FAILURES:  # another server's "status" field means something else
        return status if isinstance(status, str) else "ok"
    error = str(observation.get("error") or "no reason given")
    if status == "timeout":
        raise TimeoutError(f"the server reported a timeout: {error}")
    raise ServerReportedError(f"the server reported {status}: {error}")
