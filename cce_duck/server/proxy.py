"""OpenAI-compatible proxy (``cce serve proxy --upstream URL``): trims long chats on the way.

``POST /v1/chat/completions`` stores the chat in a session (``X-CCE-Session`` header, else the
``user`` field, else a hash of the first message), replaces a long history by the relevant notes
plus the recent turns, forwards the request (streaming passes through chunk by chunk) and
stores the model's answer. ``GET /v1/models`` is passed through. Our key goes in ``X-CCE-Key``;
``Authorization`` is forwarded to the model server untouched. An ``X-CCE-User`` header binds
the session to that user (else it has none) and trims with the memory of all of the user's
sessions.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from fastapi_offline import FastAPIOffline
from starlette.concurrency import run_in_threadpool

from cce_duck import __version__
from cce_duck.chat import ChatPlan, chat_session_id, prepare_chat, record_reply
from cce_duck.engine import Engine
from cce_duck.errors import ValidationError
from cce_duck.server.access import writing_user
from cce_duck.server.http import BodyLimit, Guard, error_response, install_error_handlers
from cce_duck.server.keys import KeyRing

__all__ = ["create_proxy"]

_FORWARD = ("authorization", "openai-organization", "openai-project", "accept")


def _headers(request: Request) -> dict[str, str]:
    out = {k: v for k, v in request.headers.items() if k.lower() in _FORWARD}
    out["content-type"] = "application/json"
    return out


def _reply_text(data: Any) -> str | None:
    try:
        content = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None


def create_proxy(engine: Engine, upstream: str, keys: KeyRing | None = None, *,
                 max_tokens: int | None = None, max_body: int | None = None,
                 timeout: float = 600.0) -> FastAPI:
    """The proxy app in front of ``upstream`` (base URL ending in ``/v1`` or similar)."""
    if not upstream.startswith(("http://", "https://")):
        raise ValidationError(f"upstream must be an http(s) URL, not {upstream!r}")
    base = upstream.rstrip("/")
    guard = Guard(engine, keys if keys is not None else KeyRing.from_env())
    app: FastAPI = FastAPIOffline(
        title="cce_duck proxy", version=__version__,
        description="OpenAI-compatible proxy that trims long chats with cce_duck memory.")
    install_error_handlers(app)

    async def unreachable(_: Request, exc: Exception) -> Response:
        return error_response(502, "upstream_error", f"the model server at {base} failed: {exc}")

    app.add_exception_handler(httpx.HTTPError, unreachable)
    app.add_middleware(BodyLimit, limit=max_body if max_body is not None else 16 * 1024 * 1024)
    client = httpx.AsyncClient(timeout=timeout)
    app.router.on_shutdown.append(client.aclose)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "version": __version__, "upstream": base}

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        guard.principal(request, "x-cce-key")
        r = await client.get(base + "/models", headers=_headers(request))
        return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        who = guard.principal(request, "x-cce-key")
        try:
            body = json.loads(await request.body())
        except ValueError:
            return error_response(400, "malformed_json", "the request body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) \
                or not body["messages"]:
            return error_response(422, "invalid_request", "the body needs a non-empty 'messages' list")
        sid = chat_session_id(body["messages"], header=request.headers.get("x-cce-session"),
                              user=body.get("user"))
        uid = await run_in_threadpool(writing_user, who, guard, sid,
                                      request.headers.get("x-cce-user"))
        plan: ChatPlan = await run_in_threadpool(guard.call, prepare_chat, engine, sid,
                                                 body["messages"], max_tokens=max_tokens,
                                                 user_id=uid)
        out = {**body, "messages": plan.messages}
        extra = {"x-cce-session": sid, "x-cce-trimmed": "1" if plan.trimmed else "0",
                 "x-cce-tokens": f"{plan.tokens_in}->{plan.tokens_out}"}
        req = client.build_request("POST", base + "/chat/completions", json=out,
                                   headers=_headers(request))
        if not body.get("stream"):
            r = await client.send(req)
            if r.status_code == 200 and plan.remembered:
                text = _reply_text(_safe_json(r.content))
                await run_in_threadpool(guard.call, record_reply, engine, sid, text)
            return Response(r.content, r.status_code, headers=extra,
                            media_type=r.headers.get("content-type"))
        r = await client.send(req, stream=True)
        if r.status_code != 200:
            content = await r.aread()
            await r.aclose()
            return Response(content, r.status_code, headers=extra,
                            media_type=r.headers.get("content-type"))
        return StreamingResponse(_relay(r, plan, guard, engine), headers=extra,
                                 media_type=r.headers.get("content-type", "text/event-stream"))

    return app


def _safe_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


async def _relay(r: httpx.Response, plan: ChatPlan, guard: Guard, engine: Engine
                 ) -> AsyncIterator[bytes]:
    """Pass the SSE stream on chunk by chunk; collect the answer's text to store it at the end."""
    buffer = b""
    parts: list[str] = []
    try:
        async for chunk in r.aiter_raw():
            yield chunk
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                parts.extend(_delta(line))
    finally:
        await r.aclose()
    parts.extend(_delta(buffer))
    if plan.remembered:
        await run_in_threadpool(guard.call, record_reply, engine, plan.session_id, "".join(parts))


def _delta(line: bytes) -> list[str]:
    line = line.strip()
    if not line.startswith(b"data:"):
        return []
    data = _safe_json(line[5:].strip())
    try:
        text = data["choices"][0]["delta"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return []
    return [text] if isinstance(text, str) else []
