"""REST routes of memory management (pins, corrections, forgetting, export)."""

from __future__ import annotations

from fastapi import APIRouter

__all__ = ["router"]

router = APIRouter(prefix="/v1")
