"""OpenAI's error shape for every failure the service reports.

`ApiError(status, message, param=..., code=...)` raised anywhere in a route becomes
``{"error": {"message", "type", "param", "code"}}`` with that HTTP status, so the openai
client raises its usual exceptions (`BadRequestError`, `AuthenticationError`,
`NotFoundError`). `error_body` builds the same body for the app's own handlers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError", "error_body", "not_found"]

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
}


class ApiError(Exception):
    """An HTTP error with OpenAI's body; `message` is one line."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "invalid_request_error")
    text = " ".join(message.split())
    return {"error": {"message": text, "type": kind, "param": param, "code": code}}


def not_found(kind: str, ident: str, param: str | None = None) -> ApiError:
    """404 for an object that does not exist or belongs to another key (no difference
    is visible: the message is the same)."""
    return ApiError(404, f"No such {kind}: {ident!r}", param=param, code="not_found")
