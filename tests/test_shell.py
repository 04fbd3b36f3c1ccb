"""The ``cce sql`` shell: its line handling, the prompt_toolkit loop, a real process reading
stdin, and the fallback through the REST server when the server owns the folder."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import topic_messages
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from servers import CCE, cce_server

from cce_duck import Engine
from cce_duck.cli.output import Format
from cce_duck.cli.shell import LocalBackend, Shell, run_shell


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    with Engine(data_dir=data, embedder="hash") as eng:
        eng.ingest("s1", topic_messages())
    return data


def test_shell_lines(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines: list[str] = []
    shell = Shell(LocalBackend(folder, write=False), Format.json, echo=lines.append)
    shell.feed("SELECT turn_no,")
    assert shell.prompt.strip() == "...>"
    shell.feed("  role FROM turns")
    shell.feed("WHERE turn_no = 4;")
    assert json.loads(capsys.readouterr().out) == [{"turn_no": 4, "role": "user"}]
    shell.feed(".macros")
    text = "\n".join(lines)
    assert "cce_retrieve(sid, query" in text
    assert "Purpose:" in text
    shell.feed(".tables")
    names = {r["name"] for r in json.loads(capsys.readouterr().out)}
    assert {"turns", "notes", "sessions", "pins"} <= names
    shell.feed("DELETE FROM turns;")
    assert "only SELECT" in capsys.readouterr().err
    shell.feed("SELEC oops;")
    assert "error" in capsys.readouterr().err
    shell.feed(".format csv")
    shell.feed("SELECT count(*) AS n FROM turns;")
    assert capsys.readouterr().out.split() == ["n", "20"]
    shell.feed(".bogus")
    assert "unknown command" in capsys.readouterr().err
    # between statements the shell holds nothing: another writer can use the folder
    with Engine(data_dir=folder, embedder="hash") as eng:
        eng.pin("s1", "[red]kept[/red] as written")
    shell.feed(".format json")
    shell.feed("SELECT text FROM pins;")
    assert json.loads(capsys.readouterr().out) == [{"text": "[red]kept[/red] as written"}]
    shell.feed(".quit")
    assert shell.done
    with Engine(data_dir=folder, embedder="hash") as eng:
        assert eng.sql("SELECT count(*) FROM turns").item() == 20


def test_prompt_toolkit_loop_with_history(folder: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    history = tmp_path / "history"
    monkeypatch.setenv("CCE_SQL_HISTORY", str(history))
    with create_pipe_input() as pipe:
        shell = Shell(LocalBackend(folder, write=False), Format.json, echo=lambda _: None)
        pipe.send_text("SELECT count(*) AS n\r")
        pipe.send_text("FROM notes;\r")
        pipe.send_text(".quit\r")
        run_shell(shell, input=pipe, output=DummyOutput())
    out = capsys.readouterr().out
    assert json.loads(out)[0]["n"] >= 4
    assert "FROM notes;" in history.read_text()


@pytest.mark.processes
def test_shell_process_reads_stdin(folder: Path) -> None:
    script = "SELECT role, count(*) AS n\nFROM turns GROUP BY role ORDER BY role;\n.tables\n"
    proc = subprocess.run([*CCE, "sql", "--format", "csv", "--data-dir", str(folder)],
                          input=script, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CCE_EMBEDDER": "hash"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:3] == ["role,n", "assistant,10", "user,10"]
    assert "message_vectors" in proc.stdout


@pytest.mark.processes
def test_folder_owned_by_rest_server(folder: Path) -> None:
    env = {"CCE_API_KEYS": "user=s1;boss=*"}
    with cce_server(["rest"], folder, env=env) as (base, _):
        base_env = {**os.environ, "CCE_EMBEDDER": "hash", "COLUMNS": "200"}
        one = subprocess.run([*CCE, "sql", "SELECT count(*) AS n FROM turns", "-f", "json",
                              "--data-dir", str(folder)], capture_output=True, text=True,
                             timeout=120, env={**base_env, "CCE_API_KEY": "boss"})
        assert one.returncode == 0, one.stderr
        assert json.loads(one.stdout) == [{"n": 20}]
        assert f"owned by the server at {base}" in one.stderr.replace("\n", "")
        # the shell goes through the server too; writes stay refused
        shell = subprocess.run([*CCE, "sql", "-f", "csv", "--data-dir", str(folder)],
                               input="SELECT count(*) AS n FROM notes;\nDELETE FROM turns;\n",
                               capture_output=True, text=True, timeout=120,
                               env={**base_env, "CCE_API_KEY": "boss"})
        assert shell.returncode == 0, shell.stderr
        assert shell.stdout.splitlines()[0] == "n"
        assert "only SELECT" in shell.stderr
        # a key that is not an admin key is refused by the server
        user = subprocess.run([*CCE, "sql", "SELECT 1", "--data-dir", str(folder)],
                              capture_output=True, text=True, timeout=120,
                              env={**base_env, "CCE_API_KEY": "user"})
        assert user.returncode == 2
        assert "admin key" in user.stderr
        # --write cannot go through the server
        write = subprocess.run([*CCE, "sql", "DELETE FROM pins", "--write", "--data-dir",
                                str(folder)], capture_output=True, text=True, timeout=120,
                               env=base_env)
        assert write.returncode == 2
        assert "in use by another process" in write.stderr
    with Engine(data_dir=folder, embedder="hash") as eng:
        assert eng.sql("SELECT count(*) FROM turns").item() == 20
