"""Errors in OpenAI's shape, so the openai SDK raises its usual exceptions.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
               "code": "invalid_value"}}

400 `BadRequestError`: a field's value, `param` names it (nested as `tools.0.type`) and
`code` says what is wrong with it in OpenAI's words (`validation_code`):
`integer_above_max_value`, `decimal_below_min_value`, `empty_array`, `invalid_type`,
`missing_required_parameter`, `invalid_value`, `unsupported_value` (a value this server
cannot honour), `context_length_exceeded` when prompt + `max_tokens` pass the context
(clients such as inspect-ai read it as a length stop rather than a failure);
`max_tokens` beyond the whole context is `invalid_value`, as OpenAI answers a value
above a model's completion limit. 401 `AuthenticationError`
(`code: invalid_api_key`), 404 `NotFoundError` (`code: model_not_found`), 500
`InternalServerError` (the engine failed; the client may retry).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi.responses import JSONResponse

from rldojo.inference.protocol import RequestError

__all__ = ["bad_request", "openai_error", "request_error", "validation_code"]


def openai_error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def bad_request(param: str, message: str, code: str = "invalid_value") -> JSONResponse:
    """A 400 naming the field at fault (its name leads the message too)."""
    return openai_error(400, f"{param}: {message}", param=param, code=code)


def request_error(exc: RequestError) -> JSONResponse:
    """The 400 of a request the engine refused, with its `param` and `code`."""
    return openai_error(400, f"{exc.param}: {exc}", param=exc.param, code=exc.code)


_LIMIT_CODES = {"greater_than": "below_min_value", "greater_than_equal": "below_min_value",
                "less_than": "above_max_value", "less_than_equal": "above_max_value"}  # fmt: skip


def validation_code(error: Mapping[str, Any]) -> str | None:
    """OpenAI's code for one of pydantic's validation errors (`exc.errors()[0]`); None
    where OpenAI gives none (a body that is not JSON)."""
    kind, value = str(error.get("type", "")), error.get("input")
    if kind == "missing":
        return "missing_required_parameter"
    if kind in _LIMIT_CODES:
        limit = next(iter(dict(error.get("ctx") or {}).values()), 0)
        return f"{'decimal' if isinstance(limit, float) else 'integer'}_{_LIMIT_CODES[kind]}"
    if kind in ("too_short", "too_long"):
        if isinstance(value, str):
            return "string_below_min_length" if kind == "too_short" else "string_above_max_length"
        if kind == "too_short":
            return "array_below_min_length" if value else "empty_array"
        return "array_above_max_length"
    if kind == "json_invalid":
        return None
    if kind.endswith(("_type", "_parsing")) or kind in ("int_from_float", "union_tag_invalid"):
        return "invalid_type"
    return "invalid_value"  # a pattern, a literal, an enum or a check of our own
