"""``cce encrypt`` / ``cce decrypt`` and the passphrase rule (``CCE_ENCRYPTION_KEY``) across the
CLI, the ``cce sql`` shell and the REST server."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from conftest import topic_messages
from servers import cce_server
from typer.testing import CliRunner

from cce_duck import Engine
from cce_duck.cli import app

PASS = "correct horse battery staple"
MARKER = "QXCLIMARKER42"
runner = CliRunner()


def _hits(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if p.is_file() and MARKER.encode() in p.read_bytes()]


@pytest.mark.processes
def test_encrypt_then_decrypt(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Engine(data_dir=data, embedder="hash") as eng:
        eng.ingest("s", [*topic_messages(), {"role": "user", "content": f"the code is {MARKER}"}])
    assert _hits(data)  # the control: plain text is on disk
    d = ["--data-dir", str(data)]
    r = runner.invoke(app, ["encrypt", *d], env={"CCE_ENCRYPTION_KEY": PASS})
    assert r.exit_code == 0, r.output
    assert _hits(data) == []
    # every command opens it with the key from the environment, and refuses without it
    r = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM turns", "-f", "json", *d],
                      env={"CCE_ENCRYPTION_KEY": PASS})
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == [{"n": 21}]
    for env in ({}, {"CCE_ENCRYPTION_KEY": "wrong passphrase"}):
        r = runner.invoke(app, ["stats", "s", "--json", *d], env={"CCE_ENCRYPTION_KEY": "", **env})
        assert r.exit_code == 2, (env, r.output)
        assert "error" in r.output
    r = runner.invoke(app, ["encrypt", *d], env={"CCE_ENCRYPTION_KEY": PASS})
    assert r.exit_code == 2
    assert "encrypted already" in r.output
    with cce_server(["rest"], data, env={"CCE_ENCRYPTION_KEY": PASS}) as (base, _):
        r = httpx.post(base + "/v1/sessions/s/context", json={"query": "what is the code?"})
        assert MARKER in r.text
    assert _hits(data) == []
    r = runner.invoke(app, ["decrypt", "--passphrase", "wrong one", *d])
    assert r.exit_code == 2
    r = runner.invoke(app, ["decrypt", "--passphrase", PASS, *d])
    assert r.exit_code == 0, r.output
    assert _hits(data)
    r = runner.invoke(app, ["stats", "s", "--json", *d], env={"CCE_ENCRYPTION_KEY": ""})
    assert json.loads(r.stdout)[0]["turns"] == 21


def test_no_passphrase_without_a_terminal(tmp_path: Path) -> None:
    r = runner.invoke(app, ["encrypt", "--data-dir", str(tmp_path)], env={"CCE_ENCRYPTION_KEY": ""})
    assert r.exit_code == 2
    assert "CCE_ENCRYPTION_KEY" in r.output
