"""What every REST router shares: the server's engine and keys, the caller's key, a checked
session id (FastAPI dependencies), and frames as JSON rows.

The dependencies are ``async``: FastAPI runs a plain ``def`` dependency on its thread pool,
one thread hand-off per dependency and request, for checks that take microseconds. The one
check that may read the store (the user a session is bound to, for a key limited to users)
still runs on the thread pool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import polars as pl
from fastapi import Depends, FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from cce_duck.messages import validate_session_id
from cce_duck.server.access import check_session
from cce_duck.server.http import Guard
from cce_duck.server.keys import Principal

__all__ = ["SECURITY_SCHEMES", "G", "KeyedRoute", "Sid", "Uid", "Who", "document_keys", "frame_rows",
           "guard", "principal", "session", "user"]

#: How a caller presents its key, as the OpenAPI document states it (read by
#: :meth:`Guard.principal` itself: no dependency per scheme to solve on every request).
SECURITY_SCHEMES: dict[str, dict[str, str]] = {
    "APIKeyHeader": {"type": "apiKey", "description": "API key", "in": "header",
                     "name": "X-API-Key"},
    "HTTPBearer": {"type": "http", "description": "API key as a Bearer token",
                   "scheme": "bearer"},
}


async def guard(request: Request) -> Guard:
    """The server's engine and keys."""
    g: Guard = request.app.state.guard
    return g


def _caller(request: Request) -> tuple[Guard, Principal]:
    """The server's guard and the caller it authenticates from the headers that
    :data:`SECURITY_SCHEMES` name (401 without a valid key when keys are configured)."""
    g: Guard = request.app.state.guard
    return g, g.principal(request, SECURITY_SCHEMES["APIKeyHeader"]["name"].lower())


async def principal(request: Request) -> Principal:
    """Authenticate the caller (401 without a valid key when keys are configured)."""
    return _caller(request)[1]


Who = Annotated[Principal, Depends(principal)]
G = Annotated[Guard, Depends(guard)]


async def session(session_id: str, request: Request) -> str:
    """A valid session id (400) that the caller's key (401) may use (403, whether it exists or
    not): by name, or through the user it is bound to (looked up in the store, on the thread
    pool). One dependency: each one FastAPI solves costs tens of microseconds per request."""
    g, who = _caller(request)  # (first: a caller without a key learns nothing of the id)
    sid = validate_session_id(session_id)
    if not who.allows(sid):
        await run_in_threadpool(check_session, who, g, sid)
    return sid


Sid = Annotated[str, Depends(session)]


async def user(user_id: str, who: Who) -> str:
    """A user id the caller's key may use (403, whether the user exists or not)."""
    who.check_user(user_id)
    return user_id


Uid = Annotated[str, Depends(user)]


class KeyedRoute(APIRoute):
    """A route whose OpenAPI operation states how to present a key (:data:`SECURITY_SCHEMES`)
    when its dependencies authenticate the caller (:func:`principal`, :func:`session`), as
    FastAPI states it for ``Security`` parameters (the routers' ``route_class``)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        if _authenticates(self.dependant):
            self.openapi_extra = {**(self.openapi_extra or {}),
                                  "security": [{name: []} for name in SECURITY_SCHEMES]}


def _authenticates(dependant: Dependant) -> bool:
    return dependant.call in (principal, session) or any(
        _authenticates(d) for d in dependant.dependencies)


def document_keys(app: FastAPI) -> None:
    """Declare :data:`SECURITY_SCHEMES` among ``app``'s OpenAPI components (the operations of
    :class:`KeyedRoute` refer to them)."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            plain().setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]


def frame_rows(df: pl.DataFrame) -> list[dict[str, Any]]:
    """A frame as a list of JSON-ready row dicts."""
    return df.to_dicts()
