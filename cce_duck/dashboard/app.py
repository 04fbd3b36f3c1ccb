"""``create_dashboard_app``: the REST app, the dashboard's read routes and its static files."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from cce_duck.engine import Engine
from cce_duck.server.deps import G, KeyedRoute, Sid, frame_rows
from cce_duck.server.keys import KeyRing
from cce_duck.server.rest import create_app

__all__ = ["STATIC", "create_dashboard_app", "router"]

#: The page, its script and its style sheet.
STATIC = Path(str(files("cce_duck.dashboard") / "static"))

router = APIRouter(prefix="/v1/sessions/{session_id}", route_class=KeyedRoute)


@router.get("/turns", tags=["dashboard"])
def turns(sid: Sid, g: G) -> dict[str, Any]:
    """Every stored turn with its tier (hot, pending, compressed) and its note."""
    return {"session_id": sid, "hot_turns": g.engine.config.hot_tier_max_turns,
            "turns": frame_rows(g.call(g.engine.turns, sid))}


@router.get("/notes", tags=["dashboard"])
def notes(sid: Sid, g: G) -> dict[str, Any]:
    """The session's topic notes (warm tier) in conversation order."""
    return {"session_id": sid, "notes": frame_rows(g.call(g.engine.notes, sid))}


def _sample() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (files("cce_duck.data") / "sample_conversation.json").read_text(encoding="utf-8"))
    return data


def create_dashboard_app(engine: Engine, keys: KeyRing | None = None, **kwargs: Any) -> FastAPI:
    """The REST app (same routes, keys and limits) serving the dashboard at ``/ui/``."""
    app = create_app(engine, keys, **kwargs)
    app.include_router(router)
    app.add_api_route("/ui/sample.json", _sample, methods=["GET"], tags=["dashboard"],
                      summary="The bundled sample conversation the dashboard replays")
    app.mount("/ui", StaticFiles(directory=STATIC, html=True), name="ui")

    def home() -> RedirectResponse:
        return RedirectResponse("/ui/")

    app.add_api_route("/", home, methods=["GET"], include_in_schema=False)
    return app
