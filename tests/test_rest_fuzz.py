"""Fuzz the REST API from its own OpenAPI spec with schemathesis: no request gets a 500, and
every error has the documented shape."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings

from cce_duck import Engine
from cce_duck.server.keys import KeyRing
from cce_duck.server.rest import create_app

_engine = Engine(data_dir=None, embedder="hash")
_engine.add_messages("user-1", [{"role": "user", "content": "We chose DuckDB for storage."},
                                {"role": "assistant", "content": "Noted: DuckDB it is."}])
app = create_app(_engine, KeyRing.parse("admin-key", None), max_body=256 * 1024)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case) -> None:
    response = case.call(headers={"Authorization": "Bearer admin-key"})
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
    if response.status_code >= 400:
        err = response.json()["error"]
        assert err["status"] == response.status_code
        assert isinstance(err["message"], str)
