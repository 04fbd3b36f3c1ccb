"""The MCP tool ``cce_export_session`` writes only inside the export folder the user configured
(``CCE_EXPORT_DIR``), through the library and a real MCP client over stdio: every other path is
refused with a clear error, memory is unchanged and no file appears (or changes) elsewhere."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import topic_messages
from test_mcp import Call, run_client

from cce_duck import Config, Engine, ValidationError
from cce_duck.export import confined_path

SID = "s"


def files_outside(root: Path, exports: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` except the export folder's, the data folder's (its
    memory is compared row by row) and the server log's."""
    skip = (exports, root / "data", root / "log")
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file() and not any(s in p.parents for s in skip)}


def hostile_paths(root: Path) -> list[str]:
    """Paths that leave the export folder ``root/exports`` (made ready by :func:`setup`)."""
    return [
        str(root / "outside" / "x.json"),              # absolute, outside
        "/tmp/cce-export-escape.json",
        "../outside/y.json",                            # relative escape
        "sub/../../outside/z.json",
        str(root / "exports" / ".." / "outside" / "w.json"),
        "link/escaped.json",                            # a symbolic link inside that points out
        str(root / "data" / "memory.duckdb"),          # the store itself
        str(root / "data"),                            # the data folder (parquet)
        ".",                                           # the export folder itself
        str(root / "exports"),
    ]


def setup(root: Path) -> Path:
    (root / "outside").mkdir(parents=True)
    (root / "outside" / "keep.txt").write_text("untouched", encoding="utf-8")
    exports = root / "exports"
    exports.mkdir()
    (exports / "link").symlink_to(root / "outside", target_is_directory=True)
    (root / "log").mkdir()
    with Engine(data_dir=root / "data", embedder="hash") as eng:
        eng.ingest(SID, topic_messages())
    return exports


def snapshot(folder: Path) -> dict[str, Any]:
    with Engine(data_dir=folder, embedder="hash", read_only=True) as eng:
        return {t: sorted(eng.sql(f"SELECT * FROM {t}").rows(), key=repr)
                for t in ("sessions", "turns", "notes", "pins")}


def test_confined_path_rule(tmp_path: Path) -> None:
    exports = setup(tmp_path)
    with pytest.raises(ValidationError, match="turned off"):
        confined_path(None, "x.json")
    for path in hostile_paths(tmp_path):
        with pytest.raises(ValidationError, match="not inside the export folder"):
            confined_path(exports, path)
    assert confined_path(exports, "a/b.json") == exports.resolve() / "a" / "b.json"
    assert confined_path(exports, str(exports / "c.json")) == exports.resolve() / "c.json"


def test_library_export_confined(tmp_path: Path) -> None:
    exports = setup(tmp_path)
    before, files = snapshot(tmp_path / "data"), files_outside(tmp_path, exports)
    cfg = Config(data_dir=tmp_path / "data", embedder="hash", export_dir=exports)
    with Engine(cfg) as eng:
        for path in hostile_paths(tmp_path):
            for fmt in ("json", "parquet"):
                with pytest.raises(ValidationError, match="not inside the export folder"):
                    eng.export_session(SID, path, format=fmt, confined=True)
        out = eng.export_session(SID, "mine/s.json", confined=True)
        assert out == exports.resolve() / "mine" / "s.json"
    with Engine(data_dir=tmp_path / "data", embedder="hash") as eng, \
            pytest.raises(ValidationError, match="CCE_EXPORT_DIR"):  # no export folder set
        eng.export_session(SID, "s.json", confined=True)
    assert len(json.loads(out.read_text(encoding="utf-8"))["turns"]) == 20
    assert snapshot(tmp_path / "data") == before
    assert files_outside(tmp_path, exports) == files


@pytest.mark.processes
def test_mcp_export_confined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exports = setup(tmp_path)
    before, files = snapshot(tmp_path / "data"), files_outside(tmp_path, exports)
    monkeypatch.setenv("CCE_EXPORT_DIR", str(exports))

    async def body(_: Any, call: Call) -> None:
        for path in hostile_paths(tmp_path):
            for fmt in ("json", "parquet"):
                err, text = await call("cce_export_session",
                                       {"session_id": SID, "path": path, "format": fmt})
                assert err, (path, text)
                assert "not inside the export folder" in text, text
        err, out = await call("cce_export_session", {"session_id": SID, "path": "s.json"})
        assert not err, out
        assert out["path"] == str(exports.resolve() / "s.json")
        err, out = await call("cce_export_session",
                              {"session_id": SID, "path": "pq", "format": "parquet"})
        assert not err, out
        err, doc = await call("cce_export_session", {"session_id": SID})  # no path: returned
        assert not err, doc
        assert len(doc["turns"]) == 20

    run_client(tmp_path / "data", tmp_path / "log", body)
    assert (exports / "pq" / "manifest.json").exists()
    assert json.loads((exports / "s.json").read_text(encoding="utf-8"))["session"]["session_id"] == SID
    assert snapshot(tmp_path / "data") == before
    assert files_outside(tmp_path, exports) == files
    assert not Path("/tmp/cce-export-escape.json").exists()


@pytest.mark.processes
def test_mcp_export_without_export_folder_writes_nothing(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    exports = setup(tmp_path)
    monkeypatch.delenv("CCE_EXPORT_DIR", raising=False)
    files = files_outside(tmp_path, exports)

    async def body(_: Any, call: Call) -> None:
        for path in (str(tmp_path / "outside" / "x.json"), "x.json", str(exports / "x.json")):
            err, text = await call("cce_export_session", {"session_id": SID, "path": path})
            assert err, text
            assert "CCE_EXPORT_DIR" in text, text

    run_client(tmp_path / "data", tmp_path / "log", body)
    assert list(exports.iterdir()) == [exports / "link"]
    assert files_outside(tmp_path, exports) == files
    assert snapshot(tmp_path / "data")["turns"]
