"""The read-only SQL sandbox, attacked through every route: the library, a real REST server, a
real MCP client over stdio and the real ``cce sql`` command (one-shot and shell).

Each hostile statement of :data:`hostile_sql.HOSTILE` must be refused with a clear error, leave
memory exactly as it was (every row of every table and every sequence), create no file and read
no file outside the data folder: files outside hold a secret marker that no answer may contain,
and the tree of files outside the data folder must be byte for byte what it was.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import topic_messages
from hostile_sql import HOSTILE, LEAK_TARGETS, READS, SECRET, plant_secrets
from servers import CCE, cce_server
from test_mcp import Call, run_client

from cce_duck import Engine, ValidationError
from cce_duck.adhoc import read_only_query
from cce_duck.sandbox import SandboxError

SID = "s1"
OTHER_SECRET = "SECRET-other-folder-41d2"


@dataclass(frozen=True)
class Arena:
    """A loaded data folder, another data folder and a folder of secrets, side by side."""

    root: Path
    data: Path
    other: Path
    out: Path

    def fill(self, sql: str) -> str:
        return sql.format(out=self.out, other=self.other, data=self.data, sid=SID)

    def hostile(self) -> list[str]:
        return [self.fill(s) for s in HOSTILE]

    def reads(self) -> list[str]:
        return [self.fill(s) for s in READS]


def make_arena(root: Path) -> Arena:
    arena = Arena(root, root / "data", root / "other", root / "outside")
    plant_secrets(arena.out)
    plant_secrets(root / "data-evil")
    with Engine(data_dir=arena.other, embedder="hash") as other:
        other.add_message("x", "user", f"the other folder's secret is {OTHER_SECRET}")
    with Engine(data_dir=arena.data, embedder="hash") as eng:
        eng.ingest(SID, topic_messages())
        eng.pin(SID, "pinned fact: the gate code is 1234")
    return arena


@pytest.fixture
def arena(tmp_path: Path) -> Arena:
    return make_arena(tmp_path / "arena")


def memory(folder: Path) -> dict[str, Any]:
    """Every row of every table and every sequence's state, read from a fresh engine."""
    with Engine(data_dir=folder, embedder="hash", read_only=True) as eng:
        tables = eng.sql("SELECT table_name FROM duckdb_tables() "
                         "WHERE database_name = current_database() ORDER BY 1")["table_name"]
        out: dict[str, Any] = {t: sorted(eng.sql(f'SELECT * FROM main."{t}"').rows(), key=repr)
                               for t in tables}
        out["<sequences>"] = eng.sql("SELECT sequence_name, last_value FROM duckdb_sequences() "
                                     "ORDER BY 1").rows()
        out["<views>"] = eng.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal").rows()
    return out


def outside_files(arena: Arena) -> dict[str, str]:
    """sha256 of every file under the arena outside the data folder."""
    found = {}
    for path in sorted(arena.root.rglob("*")):
        if path.is_file() and arena.data not in path.parents:
            found[str(path.relative_to(arena.root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def assert_untouched(arena: Arena, before: dict[str, Any], files: dict[str, str],
                     answers: list[str]) -> None:
    assert memory(arena.data) == before
    assert outside_files(arena) == files
    for name in LEAK_TARGETS:
        assert not (arena.out / name).exists(), name
        assert not (arena.data / name).exists(), name
    host = Path("/etc/hostname").read_text(encoding="utf-8").strip() if Path(
        "/etc/hostname").exists() else ""
    for answer in answers:
        assert SECRET not in answer
        assert OTHER_SECRET not in answer
        if len(host) >= 6:
            assert host not in answer.replace("/etc/hostname", "")


def test_every_hostile_statement_is_refused_by_the_library(arena: Arena) -> None:
    assert len(HOSTILE) >= 40
    before, files = memory(arena.data), outside_files(arena)
    answers = []
    with Engine(data_dir=arena.data, embedder="hash") as eng:
        for sql in arena.hostile():
            with pytest.raises(ValidationError) as err:
                read_only_query(eng, sql)
            answers.append(str(err.value))
            if not isinstance(err.value, SandboxError):  # only a CTE with a write gets here
                assert "cannot parse the SQL" in str(err.value), sql
        n = read_only_query(eng, "SELECT count(*) AS n FROM turns")["n"].item()
        assert n == 20  # the engine still answers after every refusal
    assert_untouched(arena, before, files, answers)


def test_refusals_name_the_reason(arena: Arena) -> None:
    with Engine(data_dir=arena.data, embedder="hash") as eng:
        def refusal(sql: str) -> str:
            with pytest.raises(SandboxError) as err:
                read_only_query(eng, arena.fill(sql))
            return str(err.value)

        assert "EXPLAIN of UPDATE" in refusal("EXPLAIN ANALYZE UPDATE turns SET content = 'x'")
        assert "EXPLAIN of COPY" in refusal("EXPLAIN ANALYZE COPY turns TO '{out}/leak1.csv'")
        assert "COPY statements" in refusal("COPY turns TO '{data}/leak4.json'")
        assert "Cannot access file \"/etc/hostname\"" in refusal(
            "SELECT * FROM read_text('/etc/hostname')")
        assert "nextval()" in refusal("WITH a AS (SELECT nextval('note_ids')) SELECT * FROM a")
        assert "exactly one statement, not 2" in refusal("SELECT 1; DELETE FROM turns")


def test_read_only_transaction_is_a_second_wall(arena: Arena, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    """With the function check switched off, a write that gets through is still refused by
    DuckDB's read-only transaction, and the sequence does not move."""
    from cce_duck import sandbox

    monkeypatch.setattr(sandbox, "REFUSED_FUNCTIONS", frozenset())
    before = memory(arena.data)
    with Engine(data_dir=arena.data, embedder="hash") as eng:
        for sql in ("SELECT nextval('note_ids')", "SELECT nextval('pin_ids') FROM turns"):
            with pytest.raises(SandboxError, match="read-only mode"):
                read_only_query(eng, sql)
        assert read_only_query(eng, "SELECT count(*) AS n FROM turns")["n"].item() == 20
    assert memory(arena.data) == before


def test_reads_and_macros_work_in_the_sandbox(arena: Arena) -> None:
    with Engine(data_dir=arena.data, embedder="hash") as eng:
        frames = [read_only_query(eng, sql) for sql in arena.reads()]
        assert frames[0]["n"].item() == 20
        assert frames[1].height == 3
        assert frames[2].height >= 1
        assert "label" in frames[2].columns
        assert frames[3].rows() == [(SID, 20)]
        assert sorted(frames[4].rows()) == [("assistant", 10), ("user", 10)]
        # the store's own folder stays readable (it is the store)
        own = read_only_query(eng, f"SELECT size FROM read_blob('{arena.data}/memory.duckdb')")
        assert own["size"].item() > 0
        # parameters still bind
        q = read_only_query(eng, "SELECT count(*) AS n FROM turns WHERE role = ?", ["user"])
        assert q["n"].item() == 10


def test_the_engine_itself_cannot_leave_its_folder(arena: Arena) -> None:
    """``Engine.sql`` (full power) may write the store but no file outside, and no setting."""
    with Engine(data_dir=arena.data, embedder="hash") as eng:
        for sql in ("COPY turns TO '{out}/leak2.csv'", "SELECT * FROM read_text('{out}/secret.txt')",
                    "ATTACH '{other}/memory.duckdb' AS other", "EXPORT DATABASE '{out}/dump'"):
            with pytest.raises(Exception, match=r"disabled by configuration|Permission"):
                eng.sql(arena.fill(sql))
        for sql in ("SET enable_external_access = true", "SET threads = 1",
                    "SET allowed_directories = ['/']", "RESET lock_configuration"):
            with pytest.raises(Exception, match="configuration has been locked"):
                eng.sql(sql)
        with pytest.raises(Exception, match=r"disabled through configuration|disabled by config"):
            eng.sql(arena.fill("LOAD '{out}/evil.duckdb_extension'"))
        settings = dict(eng.sql("SELECT name, value FROM duckdb_settings() WHERE name IN "
                                "('enable_external_access', 'lock_configuration', "
                                "'autoinstall_known_extensions', 'autoload_known_extensions')"
                                ).rows())
        assert set(settings.values()) == {"false", "true"}
        assert settings["enable_external_access"] == "false"
        assert settings["lock_configuration"] == "true"
        # inside its folder the engine keeps working: a file there, forget + rewrite, compact
        eng.sql(arena.fill("COPY (SELECT 1 AS a) TO '{data}/inside.csv'"))
        assert (arena.data / "inside.csv").exists()
        eng.forget(SID, turns=(0, 1))
        eng.compact()
        assert eng.sql("SELECT count(*) FROM turns").item() < 20
    assert not (arena.out / "leak2.csv").exists()


def test_in_memory_engine_has_no_file_access(tmp_path: Path) -> None:
    plant_secrets(tmp_path / "outside")
    with Engine(data_dir=None, embedder="hash") as eng:
        eng.add_message("m", "user", "hello")
        with pytest.raises(SandboxError, match="disabled by configuration"):
            read_only_query(eng, f"SELECT * FROM read_text('{tmp_path}/outside/secret.txt')")
        with pytest.raises(Exception, match="disabled by configuration"):
            eng.sql(f"COPY (SELECT 1) TO '{tmp_path}/m.csv'")
        with pytest.raises(Exception, match="disabled by configuration"):
            eng.sql(f"SELECT * FROM read_text('{tmp_path}/outside/secret.txt')")
        assert eng.sql("SELECT current_setting('temp_directory') AS t")["t"].item() == ""
        assert eng.sql("SELECT current_setting('allowed_directories') AS a").rows() == [([],)]
    assert not (tmp_path / "m.csv").exists()


def test_spill_directory_stays_usable_inside_the_folder(tmp_path: Path) -> None:
    """A query larger than DuckDB's memory limit spills into the folder's own temp directory
    under the seal; an in-memory engine (no spill directory at all) runs out of memory."""
    big = "SELECT count(*) AS n FROM (SELECT DISTINCT md5(range::VARCHAR) FROM range(2000000))"
    with Engine(data_dir=tmp_path / "data", embedder="hash", duckdb_memory_mb=64) as eng:
        assert read_only_query(eng, big)["n"].item() == 2_000_000
        tmp = eng.sql("SELECT current_setting('temp_directory') AS t")["t"].item()
        assert Path(tmp).parent == (tmp_path / "data").resolve()
    with Engine(data_dir=None, embedder="hash", duckdb_memory_mb=64) as eng, \
            pytest.raises(ValidationError, match="Out of Memory"):
        read_only_query(eng, big)


def test_encrypted_folder_is_sealed_after_httpfs(tmp_path: Path) -> None:
    arena = make_arena(tmp_path / "plain")  # the secrets and the other folder
    data = tmp_path / "enc"
    with Engine(data_dir=data, embedder="hash", encryption_key="pass phrase") as eng:
        eng.ingest(SID, topic_messages())
        for sql in ("SELECT * FROM read_text('{out}/secret.txt')",
                    "SELECT * FROM read_csv('https://example.com/x.csv')",
                    "COPY turns TO '{out}/leak2.csv'", "LOAD httpfs"):
            with pytest.raises(SandboxError):
                read_only_query(eng, arena.fill(sql))
        assert read_only_query(eng, "SELECT count(*) AS n FROM turns")["n"].item() == 20
        assert eng.store.folder_key is not None
        key = eng.store.folder_key.database_key
        for sql in ("SELECT * FROM duckdb_databases()", "SELECT * FROM duckdb_settings()",
                    "SELECT * FROM pragma_database_list", "SELECT * FROM duckdb_logs()"):
            text = str(read_only_query(eng, sql).rows())
            assert key not in text  # the database key is in no catalog answer
            assert "pass phrase" not in text
        eng.forget(SID, turns=(0, 1))  # the rewrite ATTACHes an encrypted file in the folder
        assert read_only_query(eng, "SELECT count(*) AS n FROM turns")["n"].item() < 20
    assert not (arena.out / "leak2.csv").exists()


# -- the three adapter routes ---------------------------------------------------------------


@pytest.mark.processes
def test_rest_route(arena: Arena) -> None:
    before, files = memory(arena.data), outside_files(arena)
    answers = []
    headers = {"Authorization": "Bearer boss"}
    with cce_server(["rest"], arena.data, env={"CCE_API_KEYS": "boss=*"}) as (base, _), \
            httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        for sql in arena.hostile():
            r = client.post("/v1/admin/sql", json={"sql": sql})
            answers.append(r.text)
            assert r.status_code == 400, (sql, r.text)
            err = r.json()["error"]
            assert err["type"] == "invalid_input", (sql, err)
            assert "sandbox" in err["message"] or "cannot parse" in err["message"], err
        reads = [client.post("/v1/admin/sql", json={"sql": sql}) for sql in arena.reads()]
        assert [r.status_code for r in reads] == [200] * len(reads), [r.text for r in reads]
        assert reads[0].json()["rows"] == [[20]]
        assert len(reads[1].json()["rows"]) == 3
        assert reads[3].json()["rows"] == [[SID, 20]]
        answers += [r.text for r in reads]
    assert_untouched(arena, before, files, answers)


@pytest.mark.processes
def test_mcp_route(arena: Arena, tmp_path: Path) -> None:
    before, files = memory(arena.data), outside_files(arena)
    answers: list[str] = []

    async def body(_: Any, call: Call) -> None:
        for sql in arena.hostile():
            err, out = await call("cce_sql", {"sql": sql})
            answers.append(str(out))
            assert err, (sql, out)
            assert "ValidationError" in out or "SandboxError" in out, out
        results = []
        for sql in arena.reads():
            err, out = await call("cce_sql", {"sql": sql})
            assert not err, (sql, out)
            results.append(out)
            answers.append(str(out))
        assert results[0]["rows"] == [[20]]
        assert len(results[1]["rows"]) == 3
        assert results[3]["rows"] == [[SID, 20]]

    run_client(arena.data, tmp_path, body)
    assert_untouched(arena, before, files, answers)


def _cli_env() -> dict[str, str]:
    return {**os.environ, "CCE_EMBEDDER": "hash", "COLUMNS": "100000", "PYTHONUNBUFFERED": "1"}


@pytest.mark.processes
def test_cli_shell_route(arena: Arena) -> None:
    """One ``cce sql`` process reads every statement from stdin, a marker query after each, so
    each refusal is matched to its statement (stdout and stderr merged, unbuffered)."""
    before, files = memory(arena.data), outside_files(arena)
    hostile, reads = arena.hostile(), arena.reads()
    script = "".join(f"{sql};\nSELECT 'mark-{i}' AS m;\n" for i, sql in enumerate(hostile + reads))
    proc = subprocess.run([*CCE, "sql", "--format", "csv", "--data-dir", str(arena.data)],
                          input=script, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300, env=_cli_env())
    assert proc.returncode == 0, proc.stdout
    parts = re.split(r"^m\nmark-\d+\n", proc.stdout, flags=re.M)
    assert len(parts) == len(hostile) + len(reads) + 1, proc.stdout[-2000:]
    for sql, out in zip(hostile, parts, strict=False):
        assert out.startswith("error:"), (sql, out)
        assert "sandbox" in out or "cannot parse" in out, (sql, out)
    for sql, out in zip(reads, parts[len(hostile):], strict=False):
        assert "error:" not in out, (sql, out)
    assert parts[len(hostile)].splitlines() == ["n", "20"]
    assert_untouched(arena, before, files, [proc.stdout])


ISSUE_STATEMENTS = [
    "EXPLAIN ANALYZE UPDATE turns SET content = 'PWNED' WHERE turn_no = 1",
    "EXPLAIN ANALYZE COPY (SELECT content FROM turns) TO '{out}/leak1.csv'",
    "SELECT content FROM read_text('/etc/hostname')",
    "SELECT * FROM read_blob('{other}/memory.duckdb')",
    "SELECT * FROM glob('/root/*')",
]


@pytest.mark.processes
def test_cli_one_shot_route(arena: Arena) -> None:
    before, files = memory(arena.data), outside_files(arena)
    answers = []
    for sql in ISSUE_STATEMENTS:
        proc = subprocess.run([*CCE, "sql", arena.fill(sql), "--data-dir", str(arena.data)],
                              capture_output=True, text=True, timeout=120, env=_cli_env())
        answers.append(proc.stdout + proc.stderr)
        assert proc.returncode == 2, (sql, proc.stdout, proc.stderr)
        assert "error:" in proc.stderr, proc.stderr
        assert "sandbox" in proc.stderr, proc.stderr
    ok = subprocess.run([*CCE, "sql", "SELECT count(*) AS n FROM cce_overview('s1')", "-f", "csv",
                         "--data-dir", str(arena.data)], capture_output=True, text=True,
                        timeout=120, env=_cli_env())
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[0] == "n", ok.stdout
    assert_untouched(arena, before, files, answers)


@pytest.mark.processes
def test_cli_write_stays_inside_the_store(arena: Arena) -> None:
    """``cce sql --write`` changes memory on request, but no file outside and no setting."""
    files = outside_files(arena)

    def run(sql: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CCE, "sql", arena.fill(sql), "--write", "--data-dir",
                               str(arena.data)], capture_output=True, text=True, timeout=120,
                              env=_cli_env())

    for sql in ("COPY turns TO '{out}/leak2.csv'", "SELECT * FROM read_text('{out}/secret.txt')",
                "SET enable_external_access = true", "INSTALL httpfs"):
        proc = run(sql)
        assert proc.returncode == 2, (sql, proc.stdout)
        assert SECRET not in proc.stdout + proc.stderr
    assert run("DELETE FROM pins").returncode == 0
    assert run("COPY (SELECT 1 AS a) TO '{data}/inside.csv'").returncode == 0
    assert (arena.data / "inside.csv").read_text().splitlines() == ["a", "1"]
    assert memory(arena.data)["pins"] == []
    assert outside_files(arena) == files


@pytest.mark.processes
def test_mcp_server_keeps_serving_after_refusals(arena: Arena, tmp_path: Path) -> None:
    """Refusals do not disturb the server: calls made before and after answer the same."""
    async def body(_: Any, call: Call) -> None:
        first = await call("cce_retrieve_context", {"session_id": SID, "query": "piano lesson"})
        results = await asyncio.gather(*(call("cce_sql", {"sql": s}) for s in arena.hostile()[:8]))
        assert all(err for err, _ in results)
        again = await call("cce_retrieve_context", {"session_id": SID, "query": "piano lesson"})
        assert first[1]["context"] == again[1]["context"]

    run_client(arena.data, tmp_path, body)
