"""What every REST router shares: the server's engine and keys, the caller's key, a checked
session id (FastAPI dependencies), and frames as JSON rows."""

from __future__ import annotations

from typing import Annotated, Any

import polars as pl
from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPBearer

from cce_duck.messages import validate_session_id
from cce_duck.server.access import check_session
from cce_duck.server.http import Guard
from cce_duck.server.keys import Principal

__all__ = ["G", "Sid", "Uid", "Who", "frame_rows", "guard", "principal", "session", "user"]

_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="API key")
_bearer = HTTPBearer(auto_error=False, description="API key as a Bearer token")


def guard(request: Request) -> Guard:
    """The server's engine and keys."""
    g: Guard = request.app.state.guard
    return g


def principal(request: Request, _k: Annotated[str | None, Security(_api_key)] = None,
              _b: Annotated[Any, Security(_bearer)] = None) -> Principal:
    """Authenticate the caller (401 without a valid key when keys are configured)."""
    return guard(request).principal(request, "x-api-key")


Who = Annotated[Principal, Depends(principal)]
G = Annotated[Guard, Depends(guard)]


def session(session_id: str, who: Who, g: G) -> str:
    """A valid session id (400) that the caller's key may use (403, whether it exists or not):
    by name, or through the user it is bound to."""
    sid = validate_session_id(session_id)
    check_session(who, g, sid)
    return sid


Sid = Annotated[str, Depends(session)]


def user(user_id: str, who: Who) -> str:
    """A user id the caller's key may use (403, whether the user exists or not)."""
    who.check_user(user_id)
    return user_id


Uid = Annotated[str, Depends(user)]


def frame_rows(df: pl.DataFrame) -> list[dict[str, Any]]:
    """A frame as a list of JSON-ready row dicts."""
    return df.to_dicts()
