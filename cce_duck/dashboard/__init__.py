"""The live dashboard (``cce serve ui``): the REST app plus a local web page at ``/ui/``.

The page is plain HTML, CSS and JavaScript served from this package (no CDN, no build step). It
talks to the same REST API with the same key rules, plus two read routes it needs (turns with
their tier, notes).
"""

from __future__ import annotations

from cce_duck.dashboard.app import STATIC, create_dashboard_app

__all__ = ["STATIC", "create_dashboard_app"]
