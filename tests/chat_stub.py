"""A stand-in OpenAI-compatible chat server for tests: a handler base that answers every
POST with one assistant message (`ChatStub.answer`) and keeps the request bodies."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar


class ChatStub(BaseHTTPRequestHandler):
    """Subclass and define `answer(body) -> str`; `seen` holds each request's JSON body
    (one list per subclass: give each its own `seen = []`)."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def answer(self, body: dict[str, Any]) -> str:
        raise NotImplementedError

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        message = {"role": "assistant", "content": self.answer(body)}
        data = json.dumps(
            {
                "id": "cmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass
