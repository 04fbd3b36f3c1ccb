"""What every REST router shares: the server's engine and keys, the caller's key, a checked
session id (FastAPI dependencies), and frames as JSON rows.

The dependencies are ``async``: FastAPI runs a plain ``def`` dependency on its thread pool,
one thread hand-off per dependency and request (three for a session route), for checks that
take microseconds. The one check that may read the store (the user a session is bound to,
for a key limited to users) still runs on the thread pool."""

from __future__ import annotations

from typing import Annotated, Any

import polars as pl
from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPBearer
from starlette.concurrency import run_in_threadpool

from cce_duck.messages import validate_session_id
from cce_duck.server.access import check_session
from cce_duck.server.http import Guard
from cce_duck.server.keys import Principal

__all__ = ["G", "Sid", "Uid", "Who", "frame_rows", "guard", "principal", "session", "user"]

_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="API key")
_bearer = HTTPBearer(auto_error=False, description="API key as a Bearer token")


async def guard(request: Request) -> Guard:
    """The server's engine and keys."""
    g: Guard = request.app.state.guard
    return g


async def principal(request: Request, _k: Annotated[str | None, Security(_api_key)] = None,
                    _b: Annotated[Any, Security(_bearer)] = None) -> Principal:
    """Authenticate the caller (401 without a valid key when keys are configured)."""
    g: Guard = request.app.state.guard
    return g.principal(request, "x-api-key")


Who = Annotated[Principal, Depends(principal)]
G = Annotated[Guard, Depends(guard)]


async def session(session_id: str, who: Who, g: G) -> str:
    """A valid session id (400) that the caller's key may use (403, whether it exists or not):
    by name, or through the user it is bound to (looked up in the store, on the thread pool)."""
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


def frame_rows(df: pl.DataFrame) -> list[dict[str, Any]]:
    """A frame as a list of JSON-ready row dicts."""
    return df.to_dicts()
