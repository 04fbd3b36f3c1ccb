"""The command line people expect: bracketed data printed as it is, search / add / delete /
--version / stdin, readable defaults, ingest errors that say what is wrong, the one error
handler, and read commands through the server that owns a folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from conftest import topic_messages
from servers import CCE, cce_server
from typer.testing import CliRunner

from cce_duck import Engine, __version__
from cce_duck.cli import app

runner = CliRunner()
BRACKETS = "[tool call] foo(x) [red]hi[/red] [bold]"


def cce(*args: str, input: str | None = None, columns: int = 200) -> Any:
    return runner.invoke(app, list(args), input=input, env={"COLUMNS": str(columns)})


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    with Engine(data_dir=data, embedder="hash") as eng:
        eng.ingest("s1", topic_messages())
        eng.add_message("s1", "user", f"the adapter logged {BRACKETS}", name="[b]Ann[/b]")
        eng.pin("s1", f"pinned {BRACKETS}")
    return data


def test_bracketed_data_prints_as_stored_through_every_table(folder: Path) -> None:
    d = ("--data-dir", str(folder))
    out = cce("sql", "SELECT '[tool call] foo(x)' s, '[red]hi' t", *d).output
    assert "[tool call] foo(x)" in out
    assert "[red]hi" in out
    assert BRACKETS in cce("sql", "SELECT content FROM turns WHERE content LIKE '%adapter%'", *d).output
    assert BRACKETS in cce("pins", "s1", *d).output
    assert BRACKETS in cce("context", "s1", "what did the adapter log?", *d).output
    found = cce("search", "s1", "adapter logged tool call", *d)
    assert found.exit_code == 0, found.output
    assert BRACKETS in found.output
    assert "[b]Ann[/b]" in cce("sql", "SELECT speaker FROM turns WHERE speaker IS NOT NULL", *d).output
    shown = cce("inspect", "s1", "--query", "[tool call] foo", *d)
    assert shown.exit_code == 0, shown.output
    assert "for: [tool call] foo" in shown.output
    plan = cce("forget", "s1", "--turns", "20-20", *d)
    assert plan.exit_code == 2
    assert "would be forgotten" in plan.output


def test_serving_a_data_folder_with_two_workers_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "new"
    refused = cce("serve", "rest", "--workers", "2", "--data-dir", str(data))
    assert refused.exit_code == 2
    assert "--workers 2 needs a lake with a PostgreSQL catalog" in refused.output
    assert not data.exists()  # nothing was opened or created
    assert cce("serve", "proxy", "-u", "http://x/v1", "--workers", "0").exit_code == 2


def test_bracketed_values_in_errors_are_shown(folder: Path, tmp_path: Path) -> None:
    d = ("--data-dir", str(folder))
    bad_id = cce("context", "a[b]", "x", *d)
    assert bad_id.exit_code == 2
    assert "invalid session id 'a[b]'" in bad_id.output
    assert "'[red]x'" in cce("stats", "[red]x", *d).output
    sql_error = cce("sql", "SELECT * FROM [nope]", *d)
    assert sql_error.exit_code == 2
    assert "[nope]" in sql_error.output
    missing = cce("ingest", str(tmp_path / "[a].json"), "-s", "s2", *d)
    assert missing.exit_code == 2
    assert "[a].json" in missing.output


@pytest.mark.processes
def test_missing_server_extra_names_it_without_a_traceback(tmp_path: Path) -> None:
    blocked = ("import sys; sys.modules['mcp'] = None; sys.modules['uvicorn'] = None; "
               "sys.modules['fastapi'] = None; sys.argv = ['cce-mcp']; "
               "from cce_duck.cli.serve import mcp_main; mcp_main()")
    env = {**os.environ, "CCE_DATA_DIR": str(tmp_path / "d"), "COLUMNS": "200"}
    for code in (blocked, blocked.replace("mcp_main()", "from cce_duck.cli import main; "
                                          "sys.argv = ['cce', 'serve', 'rest']; main()")):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, env=env)
        assert proc.returncode == 2, proc.stderr
        assert "pip install 'cce_duck[server]'" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_version_add_search_delete(tmp_path: Path) -> None:
    d = ("--data-dir", str(tmp_path / "d"))
    assert cce("--version").output.strip() == f"cce_duck {__version__}"
    assert "stored as turn 0" in cce("add", "s1", "user", "We chose DuckDB for storage.", *d).output
    added = cce("add", "s1", "assistant", "-", "--name", "Bot", "--json", *d,
                input="Good choice: one file.\n")
    assert json.loads(added.stdout) == {"session_id": "s1", "turn_no": 1}
    bad_role = cce("add", "s1", "robot", "hi", *d)
    assert bad_role.exit_code == 2
    assert "unknown role 'robot'" in bad_role.output
    hits = json.loads(cce("search", "s1", "storage DuckDB", "--json", *d).stdout)
    assert hits[0]["turn_no"] == 0
    assert {"turn_no", "role", "content", "fused"} <= set(hits[0])
    none = json.loads(cce("search", "s1", "storage", "--json", "--until", "2000-01-01", *d).stdout)
    assert none == []
    assert cce("search", "s1", "x", "--since", "yesterday", *d).exit_code == 2
    refused = cce("delete", "s1", *d)
    assert refused.exit_code == 2
    assert "2 turns" in refused.output
    assert "--yes" in refused.output
    gone = cce("delete", "s1", "--yes", "--json", *d)
    assert gone.exit_code == 0, gone.output
    assert json.loads(gone.stdout)["deleted"]["turns"] == 2
    assert cce("delete", "s1", "--yes", *d).exit_code == 2
    assert json.loads(cce("sessions", "--json", *d).stdout) == []


def test_ingest_stdin_and_its_errors(tmp_path: Path) -> None:
    d = ("--data-dir", str(tmp_path / "d"))
    fed = cce("ingest", "-", "-s", "t", "--json", *d, input="Human: hi there\nAI: hello\n")
    assert json.loads(fed.stdout) == {"session_id": "t", "stored": 2, "turns": 2, "notes": 0}
    truncated = cce("ingest", "-", "-s", "t", *d, input='[{"role": "user",\n "content": "hi"')
    assert truncated.exit_code == 2
    assert "invalid JSON at line 2, column" in truncated.output
    keys = cce("ingest", "-", "-s", "t", *d, input='[{"from": "user", "text": "hi"}]')
    assert keys.exit_code == 2
    assert "lacks 'role' and 'content' (it has 'from', 'text')" in keys.output
    assert "ingesting" not in keys.output  # refused before any progress bar
    prose = cce("ingest", "-", "-s", "t", *d, input="hello\nUser: hi\n")
    assert prose.exit_code == 2
    assert "'Human:'" in prose.output
    assert "'AI:'" in prose.output
    with Engine(data_dir=tmp_path / "d", embedder="hash") as eng:
        assert eng.stats("t").item(0, "turns") == 2  # the failed calls stored nothing


def test_readable_defaults(folder: Path) -> None:
    d = ("--data-dir", str(folder))
    one = cce("stats", "s1", *d, columns=80).output
    lines = {ln.split()[0]: ln.split()[1:] for ln in one.splitlines()[1:] if ln.strip()}
    assert lines["turns"] == ["21"]
    assert lines["pins"] == ["1"]
    table = cce("stats", *d, columns=80).output
    assert "tokens_saved" in table
    assert "hot_tokens" not in table
    assert max(len(ln) for ln in table.splitlines()) <= 80
    border = next(ln for ln in cce("stats", "--wide", *d).output.splitlines() if "┳" in ln)
    assert border.count("┳") + 1 == len(json.loads(cce("stats", "--json", *d).stdout)[0])
    notes = cce("inspect", "s1", *d, columns=80).output
    top = next(ln for ln in notes.splitlines() if "┳" in ln)
    assert len(top.split("┳")[-1]) >= 24  # the summary column is not squeezed
    assert "transaction" in notes
    assert max(len(ln) for ln in notes.splitlines()) <= 80
    why = cce("inspect", "s1", "--query", "piano price", "-m", "120", *d, columns=100).output
    assert "{" not in why  # laid out, not a Python dict
    scores = [w for w in why.split() if w.count(".") == 1 and w.replace(".", "").isdigit()]
    assert scores
    assert all(len(w.split(".")[1]) <= 5 for w in scores)
    assert "stored 1 new message in 's9': 1 turn, 0 notes" in cce(
        "ingest", "-", "-s", "s9", *d, input="User: hi\n").output


def test_help_shows_defaults_and_no_bool_placeholders() -> None:
    root = typer.main.get_command(app)
    for name in ("context", "stats", "search", "inspect", "ingest", "demo"):
        text = cce(name, "--help").output
        assert "<bool>" not in text, name
    assert "1000" in cce("context", "--help").output or "CCE_MAX_TOKENS" in cce("context", "--help").output
    assert ".cce_data" in cce("stats", "--help").output
    assert {"search", "add", "delete"} <= set(root.commands)  # type: ignore[attr-defined]


@pytest.mark.processes
def test_read_commands_go_through_the_running_server(folder: Path) -> None:
    env = {**os.environ, "CCE_EMBEDDER": "hash", "COLUMNS": "200"}
    with cce_server(["rest"], folder) as (base, _):
        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*CCE, *args, "--data-dir", str(folder)], capture_output=True,
                                  text=True, timeout=120, env=env)

        stats = run("stats", "s1", "--json")
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)[0]["turns"] == 21
        assert f"owned by the server at {base}" in stats.stderr.replace("\n", "")
        ctx = run("context", "s1", "How much is a piano lesson?", "--json")
        assert ctx.returncode == 0, ctx.stderr
        assert "thirty dollars" in ctx.stdout
        shown = run("context", "s1", "what did the adapter log?")
        assert BRACKETS in shown.stdout
        notes = run("inspect", "s1", "--json")
        assert notes.returncode == 0, notes.stderr
        assert len(json.loads(notes.stdout)) >= 4
        hits = run("search", "s1", "adapter logged tool call", "--json")
        assert hits.returncode == 0, hits.stderr
        found = json.loads(hits.stdout)
        assert found[0]["content"] == f"the adapter logged {BRACKETS}"
        assert [h["rank"] for h in found] == sorted(h["rank"] for h in found)
        assert BRACKETS in run("search", "s1", "adapter logged tool call").stdout
        assert "unknown session" in run("search", "nope", "x").stderr
        sessions = run("sessions", "--json")
        assert [s["session_id"] for s in json.loads(sessions.stdout)] == ["s1"]
        # a write command gets the CLI's advice, not the library's
        pin = run("pin", "s1", "x")
        assert pin.returncode == 2
        assert "read_only" not in pin.stderr
        assert "cce serve rest" in pin.stderr


def test_engine_ingest_reports_progress_and_reads_files(tmp_path: Path) -> None:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} about topic {i // 50}"}
            for i in range(600)]
    calls: list[tuple[int, int]] = []
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"messages": msgs}))
    with Engine(data_dir=tmp_path / "d", embedder="hash") as eng:
        added = eng.ingest_file("s", path, progress=lambda done, total: calls.append((done, total)))
        assert len(added) == 600
        assert calls[0] == (0, 600)
        assert calls[-1] == (600, 600)
        assert len(calls) >= 3
        assert [c[0] for c in calls] == sorted(c[0] for c in calls)
        assert eng.ingest_file("s", path) == []  # the same history again stores nothing
        assert eng.stats("s").item(0, "turns") == 600


def test_demo_counts_the_history_once_and_says_its_folder_is_temporary(tmp_path: Path) -> None:
    import re

    out = cce("demo", "--embedder", "hash").output
    header = int(re.search(r"(\d+) tokens of history", out).group(1))  # type: ignore[union-attr]
    footer = int(re.search(r"full history (\d+) tokens", out).group(1))  # type: ignore[union-attr]
    assert header == footer
    assert "temporary" in out
    assert "--data-dir" in out
    kept = tmp_path / "kept"
    assert cce("demo", "--embedder", "hash", "--data-dir", str(kept)).exit_code == 0
    assert json.loads(cce("stats", "demo", "--json", "--data-dir", str(kept)).stdout)[0]["turns"] > 0
