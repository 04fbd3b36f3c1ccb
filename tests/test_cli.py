"""The ``cce`` command line in process (Typer's CliRunner) on real data folders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import typer
from conftest import topic_messages
from typer.testing import CliRunner

from cce_duck import Engine
from cce_duck.cli import app

runner = CliRunner()


def cce(*args: str, input: str | None = None) -> Any:
    return runner.invoke(app, list(args), input=input, env={"COLUMNS": "200"})


def _commands(group: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every command and sub-command (Typer's groups have a ``commands`` dict)."""
    out = []
    for name, cmd in group.commands.items():
        out.append((prefix + name, cmd))
        if hasattr(cmd, "commands"):
            out.extend(_commands(cmd, prefix + name + " "))
    return out


def test_every_command_has_help() -> None:
    root = typer.main.get_command(app)
    commands = _commands(root)
    names = {n for n, _ in commands}
    assert {"demo", "ingest", "context", "inspect", "pin", "pins", "unpin", "forget", "stats",
            "sessions", "sql", "serve", "serve rest", "serve mcp", "serve proxy"} <= names
    for name, cmd in commands:
        assert (cmd.help or "").strip(), f"'cce {name}' has no help text"
        result = cce(*name.split(), "--help")
        assert result.exit_code == 0, (name, result.output)
        assert "Usage" in result.output
        for param in cmd.params:
            if param.param_type_name == "option" and param.name != "help":
                assert (getattr(param, "help", None) or "").strip(), \
                    f"'cce {name}' option {param.opts} has no help"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    conv = tmp_path / "conv.json"
    conv.write_text(json.dumps([{**m, "timestamp": m["timestamp"].isoformat()}
                                for m in topic_messages()]))
    result = cce("ingest", str(conv), "--session", "s1", "--data-dir", str(data))
    assert result.exit_code == 0, result.output
    assert "stored 20 new messages" in result.output
    return data


def test_ingest_transcript_with_progress(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("User: hello, we use DuckDB\nAssistant: good choice\n  it is fast\n")
    result = cce("ingest", str(text), "-s", "t", "-d", str(tmp_path / "d"))
    assert result.exit_code == 0, result.output
    assert "ingesting" in result.output  # the progress bar's label
    again = cce("ingest", str(text), "-s", "t", "-d", str(tmp_path / "d"), "--json")
    assert json.loads(again.stdout) == {"session_id": "t", "stored": 0, "turns": 2, "notes": 0}
    bad = tmp_path / "bad.txt"
    bad.write_text("no speakers here")
    result = cce("ingest", str(bad), "-s", "t", "-d", str(tmp_path / "d"))
    assert result.exit_code == 2
    assert "User:" in result.output


def test_sessions_stats_context_inspect(folder: Path) -> None:
    d = ("--data-dir", str(folder))
    out = json.loads(cce("sessions", "--json", *d).output)
    assert [s["session_id"] for s in out] == ["s1"]
    assert json.loads(cce("stats", "s1", "--json", *d).output)[0]["turns"] == 20
    table = cce("stats", *d).output
    assert "s1" in table
    assert "cce_stats" in table
    ctx = json.loads(cce("context", "s1", "How much is a piano lesson?", "-m", "150", "--json",
                         *d).output)
    assert ctx["tokens"] <= 150
    assert "thirty dollars" in json.dumps(ctx)
    notes = json.loads(cce("inspect", "s1", "--json", *d).output)
    assert len(notes) >= 4
    assert {"label", "start_turn", "end_turn"} <= set(notes[0])
    why = json.loads(cce("inspect", "s1", "--query", "piano price", "--json", *d).output)
    assert why["explain"]
    shown = cce("inspect", "s1", "--query", "piano price", *d)
    assert shown.exit_code == 0, shown.output
    assert "tokens of context" in shown.output
    assert cce("inspect", *d).exit_code == 0
    missing = cce("inspect", "nope", *d)
    assert missing.exit_code == 2
    assert "unknown session" in missing.output


def test_pins_and_forget(folder: Path) -> None:
    d = ("--data-dir", str(folder))
    assert "pinned as 1" in cce("pin", "s1", "Always answer in French.", *d).output
    assert json.loads(cce("pin", "s1", "--turn", "3", "--json", *d).stdout)["pin_id"] == 2
    pins = json.loads(cce("pins", "s1", "--json", *d).output)
    assert [p["pin_id"] for p in pins] == [1, 2]
    assert cce("unpin", "s1", "2", *d).exit_code == 0
    assert cce("unpin", "s1", "2", *d).exit_code == 2
    assert [p["pin_id"] for p in json.loads(cce("pins", "s1", "--json", *d).output)] == [1]
    # no --yes and no terminal: show the plan, forget nothing
    result = cce("forget", "s1", "--turns", "8-11", *d)
    assert result.exit_code == 2
    assert "would be forgotten" in result.output
    assert "--yes" in result.output
    assert cce("sql", "SELECT count(*) AS n FROM turns", "-f", "json", *d).output.count('"n": 20')
    assert cce("forget", "s1", "--turns", "11-8", "--yes", *d).exit_code == 2
    assert cce("forget", "s1", "--turns", "eight", "--yes", *d).exit_code == 2
    result = cce("forget", "s1", "--turns", "8-11", "--yes", "--json", *d)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["turns"] >= 4
    with Engine(data_dir=folder, embedder="hash") as eng:
        assert eng.sql("SELECT count(*) FROM turns WHERE content LIKE '%grill%'").item() == 0


def test_sql_one_shot_formats(folder: Path, tmp_path: Path) -> None:
    d = ("--data-dir", str(folder))
    q = "SELECT turn_no, role FROM turns WHERE turn_no < 3 ORDER BY turn_no"
    assert json.loads(cce("sql", q, "--format", "json", *d).output)[2] == {"turn_no": 2,
                                                                           "role": "user"}
    assert cce("sql", q, "-f", "csv", *d).output.splitlines() == ["turn_no,role", "0,user",
                                                                  "1,assistant", "2,user"]
    out = tmp_path / "r.parquet"
    assert cce("sql", q, "-f", "parquet", "--out", str(out), *d).exit_code == 0
    assert pl.read_parquet(out).height == 3
    assert cce("sql", q, "-f", "parquet", *d).exit_code == 2
    hits = json.loads(cce("sql", "SELECT turn_no FROM cce_retrieve('s1', 'garden party grill', k := 3)",
                          "-f", "json", *d).output)
    assert 10 in [h["turn_no"] for h in hits] or 11 in [h["turn_no"] for h in hits]
    # read-only unless --write
    result = cce("sql", "DELETE FROM pins", *d)
    assert result.exit_code == 2
    assert cce("sql", "DELETE FROM pins", "--write", *d).exit_code == 0


def test_compact_rewrites_the_file_and_reports_its_size(folder: Path) -> None:
    result = cce("compact", "--data-dir", str(folder), "--json")
    assert result.exit_code == 0, result.output
    sizes = json.loads(result.stdout)
    assert set(sizes) == {"bytes_before", "bytes_after"}
    assert 0 < sizes["bytes_after"] <= sizes["bytes_before"]
    listed = cce("inspect", "s1", "--data-dir", str(folder), "--json")
    assert listed.exit_code == 0, listed.output
    missing = cce("compact", "--data-dir", str(folder.parent / "nowhere"))
    assert missing.exit_code != 0
