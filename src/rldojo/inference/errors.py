"""Errors in OpenAI's shape, so the openai SDK raises its usual exceptions.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
               "code": null}}

400 `BadRequestError` (a field's value, `param` names it; `code: context_length_exceeded`
when prompt + `max_tokens` pass the model's context, as on OpenAI, which clients such as
inspect-ai read as a length stop rather than a failure), 401 `AuthenticationError`
(`code: invalid_api_key`), 404 `NotFoundError` (`code: model_not_found`), 500
`InternalServerError` (the engine failed; the client may retry).
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from rldojo.inference.protocol import RequestError

__all__ = ["bad_request", "openai_error", "request_error"]


def openai_error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def bad_request(param: str, message: str) -> JSONResponse:
    """A 400 naming the field at fault (its name leads the message too)."""
    return openai_error(400, f"{param}: {message}", param=param)


def request_error(exc: RequestError) -> JSONResponse:
    """The 400 of a request the engine refused, with its `param` and `code`."""
    return openai_error(400, f"{exc.param}: {exc}", param=exc.param, code=exc.code)
