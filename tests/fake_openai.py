"""A small fake OpenAI-compatible model server for proxy tests (no paid model API exists here).

It records every request it receives and answers ``Echo: <last user message>`` — as one JSON
response, or as an SSE stream of several chunks sent with pauses between them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHUNK_PAUSE = 0.25


class FakeUpstream:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.url = ""


def _answer(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    last = users[-1]["content"] if users else ""
    return f"Echo: {last if isinstance(last, str) else 'parts'}"


def _handler(state: FakeUpstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _headers(self) -> dict[str, str]:
            return {k.lower(): v for k, v in self.headers.items()}

        def _json(self, status: int, data: Any) -> None:
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            state.requests.append({"path": self.path, "headers": self._headers()})
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [
                    {"id": "fake-model", "object": "model", "created": 0, "owned_by": "test"}]})
            else:
                self._json(404, {"error": {"message": "no such route"}})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            state.requests.append({"path": self.path, "headers": self._headers(), "body": body})
            text = _answer(body)
            if not body.get("stream"):
                self._json(200, {
                    "id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                    "model": body.get("model", "fake-model"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            words = text.split(" ")
            pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
            for i, piece in enumerate(pieces):
                delta: dict[str, Any] = {"content": piece}
                if i == 0:
                    delta["role"] = "assistant"
                self._chunk({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                             "model": "fake-model",
                             "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                time.sleep(CHUNK_PAUSE)
            self._chunk({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                         "model": "fake-model",
                         "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            self._raw(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")

        def _chunk(self, data: Any) -> None:
            self._raw(b"data: " + json.dumps(data).encode() + b"\n\n")

        def _raw(self, raw: bytes) -> None:
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()

    return Handler


@contextmanager
def fake_upstream() -> Iterator[FakeUpstream]:
    state = FakeUpstream()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
