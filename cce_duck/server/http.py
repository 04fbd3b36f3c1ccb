"""What the REST server and the proxy share: error shape, key checks, body limit, one lock.

Every error is JSON of one stable shape::

    {"error": {"type": "not_found", "status": 404, "message": "unknown session 'x'"}}
"""

from __future__ import annotations

import json
import os
from typing import Any

import duckdb
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cce_duck import errors
from cce_duck.engine import Engine
from cce_duck.server.keys import AuthError, ForbiddenError, KeyRing, Principal
from cce_duck.server.serial import Serialized

__all__ = [
    "DEFAULT_MAX_BODY",
    "BodyLimit",
    "Guard",
    "JSONDocument",
    "error_response",
    "install_error_handlers",
    "presented_key",
]

#: Default request body cap (bytes); ``CCE_MAX_BODY_BYTES`` overrides it.
DEFAULT_MAX_BODY = 4 * 1024 * 1024

#: Library errors → (HTTP status, error type). Checked in order (subclasses first).
_STATUS: list[tuple[type[BaseException], int, str]] = [
    (errors.EncryptionError, 403, "encryption_error"),
    (errors.ValidationError, 400, "invalid_input"),
    (errors.NotFoundError, 404, "not_found"),
    (errors.FolderInUseError, 409, "folder_in_use"),
    (errors.ConflictError, 409, "conflict"),
    (errors.EmbedderMismatchError, 409, "embedder_mismatch"),
    (errors.SchemaError, 500, "schema_error"),
    (errors.StorageError, 507, "storage_error"),
]


class JSONDocument(Response):
    """A JSON-ready document (plain dicts, lists, strings, numbers: what the library's
    ``to_dict`` forms give; or ``datetime`` values, which orjson writes as ``isoformat`` does:
    ``ContextPayload.document``) encoded by orjson. A route that returns one skips FastAPI's
    validation and encoding of its result against the declared ``response_model`` (the
    document is JSON already): half of the time a context request spends in the event loop."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    """The one error shape of every adapter."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    body: dict[str, Any] = {"type": kind, "status": status, "message": message, **extra}
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Map library, key, validation and routing errors to JSON errors."""

    async def cce_error(_: Request, exc: Exception) -> JSONResponse:
        for cls, status, kind in _STATUS:
            if isinstance(exc, cls):
                return error_response(status, kind, str(exc))
        return error_response(400, "error", str(exc))

    async def auth_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(401, "unauthorized", str(exc))

    async def forbidden(_: Request, exc: Exception) -> JSONResponse:
        return error_response(403, "forbidden", str(exc))

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        details = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
                    "type": str(e.get("type", ""))} for e in exc.errors()]
        if any(d["type"] == "json_invalid" for d in details):
            return error_response(400, "malformed_json", "the request body is not valid JSON",
                                  details=details)
        return error_response(422, "invalid_request", "the request does not match the schema",
                              details=details)

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        cause = exc.__cause__
        if isinstance(cause, UnicodeDecodeError):  # FastAPI's body parsing: not UTF-8 text
            return error_response(400, "malformed_json", "the request body is not valid JSON: "
                                  f"byte {cause.start} is not UTF-8",
                                  details=[{"loc": ["body", str(cause.start)],
                                            "msg": "invalid UTF-8", "type": "json_invalid"}])
        kind = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(
            exc.status_code, "http_error")
        return error_response(exc.status_code, kind, str(exc.detail))

    async def database_error(request: Request, exc: Exception) -> JSONResponse:
        guard = getattr(request.app.state, "guard", None)
        err = guard.engine.store.failed(exc) if guard is not None else exc
        if isinstance(err, errors.StorageError):
            return await cce_error(request, err)
        return error_response(500, "internal_error", f"database error ({type(exc).__name__})")

    app.add_exception_handler(errors.CCEError, cce_error)
    app.add_exception_handler(duckdb.Error, database_error)
    app.add_exception_handler(AuthError, auth_error)
    app.add_exception_handler(ForbiddenError, forbidden)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)


def presented_key(request: Request, *headers: str) -> str | None:
    """The key from ``Authorization: Bearer`` or one of ``headers`` (first found)."""
    for name in headers:
        value = request.headers.get(name)
        if value:
            return value.strip()
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


class Guard(Serialized):
    """The server's engine (reads beside writes: see :class:`Serialized`) and keys."""

    def __init__(self, engine: Engine, keys: KeyRing) -> None:
        super().__init__(engine)
        self.keys = keys

    def principal(self, request: Request, *headers: str) -> Principal:
        """Authenticate the request (401 on a missing or wrong key)."""
        return self.keys.authenticate(presented_key(request, *headers))


class BodyLimit:
    """ASGI middleware: answer 413 to bodies over ``limit`` bytes before the app reads them."""

    def __init__(self, app: ASGIApp, limit: int | None = None) -> None:
        self.app = app
        self.limit = limit if limit is not None else int(
            os.environ.get("CCE_MAX_BODY_BYTES", DEFAULT_MAX_BODY))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            more = bool(message.get("more_body"))
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        resp = error_response(413, "too_large", f"request body over {self.limit} bytes")
        await resp(scope, receive, send)


def dumps(value: Any) -> str:
    """Compact JSON (times and other objects as strings)."""
    return json.dumps(value, default=str, ensure_ascii=False)
