"""REST adapter (FastAPI): ``cce serve rest`` — every route parses, calls one library function, formats.

OpenAPI docs at ``/docs`` (and ``/redoc``), served offline. Keys: see :mod:`cce_duck.server.keys`; errors: see
:mod:`cce_duck.server.http`.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.middleware.cors import CORSMiddleware
from fastapi_offline import FastAPIOffline

from cce_duck import __version__, pipeline
from cce_duck.adhoc import read_only_query
from cce_duck.engine import Engine
from cce_duck.messages import validate_session_id
from cce_duck.server import manage_routes
from cce_duck.server.access import check_answering_session, writing_user
from cce_duck.server.deps import G, KeyedRoute, Sid, Uid, Who, document_keys, frame_rows
from cce_duck.server.http import (
    BodyLimit,
    Guard,
    JSONDocument,
    error_response,
    install_error_handlers,
)
from cce_duck.server.keys import KeyRing
from cce_duck.server.models import (
    CompressIn,
    ContextIn,
    MessagesIn,
    SearchIn,
    SqlIn,
    UserContextIn,
    UserPinIn,
)

__all__ = ["create_app", "router"]

router = APIRouter(prefix="/v1", route_class=KeyedRoute)


@router.post("/compress", tags=["stateless"])
def compress(body: CompressIn, _: Who) -> dict[str, Any]:
    """Compress a history and build the context for ``query`` in one call; nothing is stored."""
    msgs = [m.model_dump(exclude_none=True) for m in body.messages]
    return pipeline.compress(msgs, body.query, body.max_tokens).to_dict()


@router.get("/sessions", tags=["sessions"])
def list_sessions(g: G, who: Who, user_id: Annotated[str | None, Query(max_length=64)] = None
                  ) -> dict[str, Any]:
    """Sessions the key may use, with turn and note counts; with ``user_id`` only the user's,
    in time order (404 for an unknown user, 403 for a key outside it)."""
    if user_id is not None:
        who.check_user(user_id)
    rows = frame_rows(g.read(g.engine.sessions, user_id))
    return {"sessions": [r for r in rows if who.allows(str(r["session_id"]), r["user_id"])]}


@router.post("/sessions/{session_id}/messages", tags=["sessions"], response_model=dict[str, Any])
def add_messages(session_id: str, body: MessagesIn, g: G, who: Who) -> Response:
    """Append messages to a session (created on first use); returns their turn numbers. A key
    limited to users creates only sessions bound to one of its users (``user_id``, or the key's
    only user)."""
    sid = validate_session_id(session_id)
    uid = writing_user(who, g, sid, body.user_id)
    msgs = [m.model_dump(exclude_none=True) for m in body.messages]
    return JSONDocument({"session_id": sid,
                         "turns": g.add(g.engine.add_messages, sid, msgs, user_id=uid)})


@router.post("/sessions/{session_id}/context", tags=["sessions"], response_model=dict[str, Any])
async def context(sid: Sid, body: ContextIn, g: G) -> Response:
    """The token-capped context for the question about to be asked."""
    payload = await g.context(sid, body.query, max_tokens=body.max_tokens, top_k=body.top_k,
                              since=body.since, until=body.until,
                              last_turns=body.last_turns, explain=body.explain)
    return JSONDocument(payload.document())


@router.post("/users/{user_id}/context", tags=["users"], response_model=dict[str, Any])
def user_context(user_id: Uid, body: UserContextIn, g: G, who: Who) -> Response:
    """The token-capped context across every session of a user (404 for an unknown user, 409
    for a ``session_id`` of another user; 403 for a key outside the user or that session)."""
    check_answering_session(who, g, user_id, body.session_id)
    payload = g.read(g.engine.user_context, user_id, body.query, session_id=body.session_id,
                     max_tokens=body.max_tokens, top_k=body.top_k, since=body.since,
                     until=body.until, explain=body.explain)
    return JSONDocument({"user_id": user_id, **payload.document()})


@router.post("/sessions/{session_id}/search", tags=["sessions"])
def search(sid: Sid, body: SearchIn, g: G) -> dict[str, Any]:
    """The best-ranked turns for ``query`` with their scores and text, best first."""
    hits = g.read(g.engine.search, sid, body.query, body.k, since=body.since, until=body.until,
                  last_turns=body.last_turns)
    return {"session_id": sid, "hits": frame_rows(hits)}


@router.get("/sessions/{session_id}/summary", tags=["sessions"])
def summary(sid: Sid, g: G) -> dict[str, Any]:
    """The cold-tier summary of a closed session (``null`` while it is open)."""
    return {"session_id": sid, "summary": g.read(g.engine.summary, sid)}


@router.get("/sessions/{session_id}/stats", tags=["sessions"])
def stats(sid: Sid, g: G) -> dict[str, Any]:
    """Sizes, tiers and compression of one session."""
    rows = frame_rows(g.read(g.engine.stats, sid))
    return rows[0] if rows else {"session_id": sid}


@router.post("/sessions/{session_id}/close", tags=["sessions"])
def close(sid: Sid, g: G) -> dict[str, Any]:
    """Compress what is pending, write the session summary and close the session."""
    return {"session_id": sid, "summary": g.call(g.engine.close_session, sid)}


@router.get("/users", tags=["users"])
def list_users(g: G, who: Who) -> dict[str, Any]:
    """Every user with their session and turn counts (those of its users for a key limited to
    users; 403 for a key limited to sessions)."""
    if not who.user_patterns:
        who.require_admin()
    rows = frame_rows(g.read(g.engine.users))
    return {"users": [r for r in rows if who.allows_user(str(r["user_id"]))]}


@router.get("/users/{user_id}/overview", tags=["users"])
def user_overview(user_id: Uid, g: G, since: Annotated[str | None, Query(max_length=64)] = None,
                  until: Annotated[str | None, Query(max_length=64)] = None) -> dict[str, Any]:
    """What the user talked about: their sessions in time order with summaries and topics,
    those with a turn in ``since``..``until`` (ISO 8601; 404 for an unknown user)."""
    rows = frame_rows(g.read(g.engine.user_overview, user_id, since=since, until=until))
    return {"user_id": user_id, "sessions": rows}


@router.get("/users/{user_id}/export", tags=["users"])
def export_user(user_id: Uid, g: G) -> dict[str, Any]:
    """Every session of a user as JSON, each as ``GET /v1/sessions/{id}/export`` gives it (admin
    key or one limited to the user; 404 for an unknown user)."""
    document: dict[str, Any] = g.call(g.engine.user_document, user_id)
    return document


@router.get("/users/{user_id}/pins", tags=["users"])
def user_pins(user_id: Uid, g: G) -> dict[str, Any]:
    """The user's pins (admin key or one limited to the user; 404 for an unknown user)."""
    return {"user_id": user_id, "pins": frame_rows(g.call(g.engine.user_pins, user_id))}


@router.post("/users/{user_id}/pins", tags=["users"])
def pin_user(user_id: Uid, body: UserPinIn, g: G) -> dict[str, Any]:
    """Keep a text in every context of every session of the user (admin key or one limited to the user)."""
    return {"user_id": user_id, "pin_id": g.call(g.engine.pin_user, user_id, body.text)}


@router.delete("/users/{user_id}/pins/{pin_id}", tags=["users"])
def unpin_user(user_id: Uid, pin_id: int, g: G) -> dict[str, Any]:
    """Remove a pin of the user (admin key or one limited to the user)."""
    g.call(g.engine.unpin_user, user_id, pin_id)
    return {"user_id": user_id, "pin_id": pin_id, "deleted": True}


@router.delete("/users/{user_id}", tags=["users"])
def delete_user(user_id: Uid, g: G) -> dict[str, Any]:
    """Delete every session of a user, its text gone from every file (admin key; 404 for an
    unknown user)."""
    return {"user_id": user_id, "deleted": g.call(g.engine.delete_user, user_id)}


@router.delete("/sessions/{session_id}", tags=["sessions"])
def delete_session(sid: Sid, g: G) -> dict[str, Any]:
    """Delete a session with everything stored about it (the file is rewritten without it)."""
    return {"session_id": sid, "deleted": g.call(g.engine.delete_session, sid)}


@router.post("/admin/sql", tags=["admin"])
def sql(body: SqlIn, g: G, who: Who) -> dict[str, Any]:
    """One read-only SQL statement over the store (admin keys only), in the SQL sandbox (see
    docs/security.md); used by ``cce sql``."""
    who.require_admin()
    df = g.read(read_only_query, g.engine, body.sql)
    return {"columns": df.columns, "types": [str(t) for t in df.dtypes], "rows": df.rows()}


def _health(request: Request) -> Any:
    g: Guard = request.app.state.guard
    failure = g.engine.storage_error and g.call(g.engine.check_storage)
    if failure is not None:  # 503: the server is up, its store is not
        return error_response(503, "storage_failing", str(failure), version=__version__,
                              recoverable=failure.recoverable)
    return {"status": "ok", "version": __version__, "embedder": g.engine.embedder_name}


def create_app(engine: Engine, keys: KeyRing | None = None, *, cors_origins: list[str] | None = None,
               max_body: int | None = None) -> FastAPI:
    """The REST app over an open engine (the caller owns and closes the engine)."""
    # /docs and /redoc load their scripts and styles from an installed package, not a CDN
    app: FastAPI = FastAPIOffline(
        title="cce_duck", version=__version__,
        description="Memory for AI assistants on DuckDB: sessions, context, management.")
    app.state.guard = Guard(engine, keys if keys is not None else KeyRing.from_env())
    install_error_handlers(app)
    document_keys(app)
    app.include_router(router)
    app.include_router(manage_routes.router)
    app.add_api_route("/health", _health, methods=["GET"], tags=["health"],
                      summary="Liveness, version and embedder (no key needed); 503 while the "
                      "store is failing (a full disk), with the cause")
    origins = cors_origins if cors_origins is not None else [
        o.strip() for o in os.environ.get("CCE_CORS_ORIGINS", "").split(",") if o.strip()]
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"],
                           allow_headers=["*"])
    app.add_middleware(BodyLimit, limit=max_body)
    return app
