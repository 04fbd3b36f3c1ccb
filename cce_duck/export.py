"""Export one session and import it into another data folder.

- **JSON** (one file): the rows of the ``cce_export`` macro grouped by kind — the session row,
  turns, notes, pins and the cold-tier summary — without vectors. Importing recomputes vectors
  and BM25 postings with the target folder's embedder.
- **Parquet** (a folder): ``manifest.json`` plus one Parquet file per table, vectors and postings
  included. Importing needs a folder with the same embedder (name and dimension).

Either way, importing into a folder with the same embedder gives the same retrieval results.
Note and pin ids are renumbered in the target folder; turn numbers are kept.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cce_duck.config import Config
from cce_duck.derived import derive_turns, write_notes
from cce_duck.errors import ConflictError, EmbedderMismatchError, ValidationError
from cce_duck.items import owner_items
from cce_duck.messages import ROLES, parse_time, validate_session_id
from cce_duck.pins import user_owner
from cce_duck.rows import quantize, run_with, vectors_of
from cce_duck.store import Store
from cce_duck.topics import unit

__all__ = ["FORMAT", "FORMATS", "PARQUET_TABLES", "confined_path", "export_session",
           "import_session", "session_document"]

FORMAT = "cce_duck.session"
VERSION = 1
FORMATS = ("json", "parquet")
#: Tables of a Parquet export, in insertion order.
PARQUET_TABLES = ("sessions", "turns", "message_vectors", "sentence_vectors", "postings",
                  "notes", "pins", "session_summaries")
MANIFEST = "manifest.json"


def session_document(store: Store, sid: str) -> dict[str, Any]:
    """The JSON export of a session as a dict (deterministic: same memory, same document)."""
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "embedder": store.embedder.name,
                           "dim": store.dim, "session": None, "turns": [], "notes": [],
                           "pins": [], "summary": None}
    plural = {"turn": "turns", "note": "notes", "pin": "pins"}
    for kind, _, data in store.connection.execute("SELECT * FROM cce_export(?)", [sid]).fetchall():
        value = json.loads(data)
        if kind in plural:
            doc[plural[kind]].append(value)
        else:
            doc[kind] = value
    return doc


def confined_path(root: Path | None, path: str | os.PathLike[str]) -> Path:
    """``path`` resolved inside the export folder ``root`` (a relative path is taken inside it;
    symbolic links are followed before the check); :class:`ValidationError` when there is no
    export folder or the path leaves it."""
    if root is None:
        raise ValidationError(
            "writing an export to a path is turned off here: set CCE_EXPORT_DIR "
            "(Config.export_dir) to the folder exports may be written to, or leave out the path "
            "to get the export back")
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise ValidationError("path must be a file or folder path")
    base = root.resolve()
    target = (base / Path(path)).resolve()
    if target == base or base not in target.parents:
        raise ValidationError(f"{str(path)!r} is not inside the export folder {root}; exports "
                              "are only written there (give a name inside it)")
    return target


def _checked_target(path: str | os.PathLike[str], fmt: str) -> Path:
    """The path of an export in ``fmt``: a file for JSON, a folder for Parquet (refused
    before anything is written)."""
    if fmt not in FORMATS:
        raise ValidationError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise ValidationError("path must be a file or folder path")
    out = Path(path)
    if fmt == "json" and out.is_dir():
        raise ValidationError(f"{out} is a folder; give a file path for a JSON export")
    if fmt != "json" and out.exists() and not out.is_dir():
        raise ValidationError(f"{out} is a file; give a folder path for a Parquet export")
    return out


def _write_json(out: Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` to ``out`` atomically (a temporary file moved into place)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(tmp, out)
    return out


def _parquet() -> Any:
    """``pyarrow.parquet``, imported by the first export or import that needs it (~9 MB of
    memory a process that only adds messages and builds contexts does not carry)."""
    import pyarrow.parquet as pq

    return pq


def export_session(store: Store, sid: str, path: str | os.PathLike[str], fmt: str) -> Path:
    """Write a session to ``path`` (a JSON file, or a folder for Parquet); returns the path."""
    out = _checked_target(path, fmt)
    if fmt == "json":
        return _write_json(out, session_document(store, sid))
    out.mkdir(parents=True, exist_ok=True)
    for table in PARQUET_TABLES:
        _parquet().write_table(store.q(f"export_{table}", {"sid": sid}).to_arrow_table(),
                               out / f"{table}.parquet")
    manifest = {"format": FORMAT, "version": VERSION, "embedder": store.embedder.name,
                "dim": store.dim, "session_id": sid, "tables": list(PARQUET_TABLES)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return out


USER_FORMAT = "cce_duck-user"


def user_document(store: Store, user_id: str, sessions: list[str]) -> dict[str, Any]:
    """The JSON export of a user: each of ``sessions`` (the user's, in time order) as
    :func:`session_document` gives it, and the user's store items (``items``:
    :func:`cce_duck.items.owner_items`)."""
    return {"format": USER_FORMAT, "version": VERSION, "user_id": user_id,
            "sessions": [{"session_id": sid, **session_document(store, sid)} for sid in sessions],
            "items": owner_items(store, user_owner(user_id))}


#: The file of a user's Parquet export that holds the user's store items.
USER_ITEMS_FILE = "store_items.parquet"


def export_user(store: Store, user_id: str, sessions: list[str], path: str | os.PathLike[str],
                fmt: str) -> Path:
    """Write a user to ``path``: a JSON file (:func:`user_document`) or, for Parquet, a folder
    holding one session export folder per session (each one ``cce import`` reads) and, when the
    user has store items, :data:`USER_ITEMS_FILE` (``value`` as JSON text)."""
    out = _checked_target(path, fmt)
    if fmt == "json":
        return _write_json(out, user_document(store, user_id, sessions))
    for sid in sessions:
        export_session(store, sid, out / sid, "parquet")
    items = owner_items(store, user_owner(user_id))
    if items:
        out.mkdir(parents=True, exist_ok=True)
        rows = [{**i, "value": json.dumps(i["value"], ensure_ascii=False)} for i in items]
        _parquet().write_table(pa.Table.from_pylist(rows), out / USER_ITEMS_FILE)
    return out


# -- import -----------------------------------------------------------------------------------

def import_session(store: Store, config: Config, path: str | os.PathLike[str],
                   session_id: str | None) -> str:
    """Restore an exported session into this store; returns its session id here."""
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise ValidationError("path must be a file or folder path")
    src = Path(path)
    if not src.exists():
        raise ValidationError(f"no export at {src}")
    if src.is_dir():
        return _import_parquet(store, src, session_id)
    return _import_json(store, config, src, session_id)


def _target(store: Store, original: object, session_id: str | None) -> str:
    sid = validate_session_id(original if session_id is None else session_id)
    if store.q("session_row", {"sid": sid}).fetchone() is not None:
        raise ConflictError(f"session {sid!r} already exists here; import under another "
                            "session_id or forget it first")
    return sid


def _header(doc: object, where: Path) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValidationError(f"{where} is not a cce_duck session export")
    if doc.get("version") != VERSION:
        raise ValidationError(f"{where} has export version {doc.get('version')!r}; this "
                              f"cce_duck reads version {VERSION}")
    return doc


def _bad(where: Path, what: str) -> ValidationError:
    return ValidationError(f"{where}: {what}")


def _clean_turns(doc: dict[str, Any], where: Path, next_turn: int) -> list[dict[str, Any]]:
    out, seen = [], set()
    for i, t in enumerate(doc.get("turns") or []):
        if not isinstance(t, dict):
            raise _bad(where, f"turn {i} is not an object")
        n = t.get("turn_no")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0 or n >= next_turn or n in seen:
            raise _bad(where, f"turn {i} has a bad or repeated turn_no {n!r}")
        seen.add(n)
        if t.get("role") not in ROLES:
            raise _bad(where, f"turn {n} has an unknown role {t.get('role')!r}")
        content, micro = t.get("content"), t.get("micro")
        if not isinstance(content, str | None) or not isinstance(micro, str | None) or (
                content is None and not micro):
            raise _bad(where, f"turn {n} has no text")
        speaker = t.get("speaker")
        if not isinstance(speaker, str | None):
            raise _bad(where, f"turn {n} has a bad speaker")
        out.append({"turn_no": n, "role": t["role"], "speaker": speaker, "content": content,
                    "micro": micro, "ts": parse_time(t.get("ts"), f"turn {n} ts"),
                    "tokens": t.get("tokens"), "note_id": t.get("note_id")})
    return out


def _import_json(store: Store, config: Config, src: Path, session_id: str | None) -> str:
    try:
        doc = _header(json.loads(src.read_text(encoding="utf-8")), src)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValidationError(f"{src} is not a readable JSON export: {exc}") from None
    sess = doc.get("session")
    if not isinstance(sess, dict):
        raise _bad(src, "no session row")
    sid = _target(store, sess.get("session_id"), session_id)
    try:
        next_turn = int(sess["next_turn"])
        status = sess.get("status", "open")
        if status not in ("open", "closed"):
            raise ValueError(status)
        created, updated = parse_time(sess["created_at"]), parse_time(sess["updated_at"])
        turns = _clean_turns(doc, src, next_turn)
        notes = [n for n in doc.get("notes") or [] if isinstance(n, dict)]
        old_ids = [int(n["note_id"]) for n in notes]
        if len(set(old_ids)) != len(old_ids):
            raise ValueError("repeated note ids")
        pins = [{"text": str(p["text"]), "turn_no": p.get("turn_no"),
                 "created_at": parse_time(p["created_at"]), "updated_at": parse_time(p["updated_at"]),
                 "pin_id": int(p["pin_id"])} for p in doc.get("pins") or []]
        summary = doc.get("summary")
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(src, f"malformed export ({exc})") from None
    new_ids = dict(zip(old_ids, _note_ids(store, len(old_ids)), strict=True))
    for t in turns:
        if t["note_id"] is not None:
            if t["note_id"] not in new_ids:
                raise _bad(src, f"turn {t['turn_no']} refers to an unknown note {t['note_id']}")
            t["note_id"] = new_ids[t["note_id"]]
    derived = derive_turns(store, config, sid, turns)
    with store.transaction():
        _insert(store, "import_sessions", pa.table({
            "session_id": [sid], "created_at": pa.array([created], pa.timestamp("us")),
            "updated_at": pa.array([updated], pa.timestamp("us")), "status": [status],
            "next_turn": pa.array([next_turn], pa.int32())}))
        derived.insert(store)
        rows = []
        # note vector = unit mean of its turns' stored (int8) message vectors, as when written
        stored = vectors_of(quantize(np.vstack(derived.mvec)), store.dim) if derived.mvec else (
            np.empty((0, store.dim), np.float32))
        members: dict[int, list[int]] = {}
        for i, t in enumerate(derived.turns):
            if t["note_id"] is not None:
                members.setdefault(int(t["note_id"]), []).append(i)
        for n in notes:
            new = new_ids[int(n["note_id"])]
            if new not in members:
                raise _bad(src, f"note {n['note_id']} covers no turn")
            f = {"vector": unit(stored[members[new]].astype(np.float32).mean(axis=0))}
            rows.append({**{k: n[k] for k in ("start_turn", "end_turn", "label", "summary",
                                              "raw_tokens", "summary_tokens", "level",
                                              "retrieval_count")},
                         "start_ts": parse_time(n["start_ts"]), "end_ts": parse_time(n["end_ts"]),
                         "created_at": parse_time(n["created_at"]), "note_id": new,
                         "session_id": sid, "vector": f["vector"]})
        write_notes(store, rows, insert=True)
        if pins:
            _insert(store, "import_pins", pa.Table.from_pylist(
                [{**p, "session_id": sid} for p in pins]))
        if isinstance(summary, dict):
            _insert(store, "import_session_summaries", pa.table({
                "session_id": [sid], "summary": [str(summary["summary"])],
                "tokens": pa.array([int(summary["tokens"])], pa.int32()),
                "created_at": pa.array([parse_time(summary["created_at"])], pa.timestamp("us"))}))
    return sid


def _note_ids(store: Store, n: int) -> list[int]:
    if n == 0:
        return []
    return [int(r[0]) for r in store.q("next_note_ids", {"n": n}).fetchall()]


def _insert(store: Store, query_name: str, table: pa.Table) -> None:
    run_with(store, query_name, _b_import=table)


def _with_session(table: pa.Table, sid: str) -> pa.Table:
    i = table.schema.get_field_index("session_id")
    return table.set_column(i, "session_id", pa.array([sid] * table.num_rows, pa.string()))


def _import_parquet(store: Store, src: Path, session_id: str | None) -> str:
    try:
        manifest = _header(json.loads((src / MANIFEST).read_text(encoding="utf-8")), src)
        tables = {t: _parquet().read_table(src / f"{t}.parquet") for t in PARQUET_TABLES}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, pa.ArrowException) as exc:
        raise ValidationError(f"{src} is not a readable Parquet export: {exc}") from None
    if manifest.get("embedder") != store.embedder.name or manifest.get("dim") != store.dim:
        raise EmbedderMismatchError(
            f"{src} holds vectors of embedder {manifest.get('embedder')!r} "
            f"({manifest.get('dim')} dimensions); this folder uses {store.embedder.name!r} "
            f"({store.dim}); import the JSON export instead (vectors are recomputed)")
    if tables["sessions"].num_rows != 1:
        raise _bad(src, "sessions.parquet must hold exactly one session")
    sid = _target(store, tables["sessions"].column("session_id")[0].as_py(), session_id)
    tables = {k: _with_session(v, sid) for k, v in tables.items()}
    notes = tables["notes"]
    old = notes.column("note_id").to_pylist()
    new_ids = dict(zip(old, _note_ids(store, len(old)), strict=True))
    mapping = pa.array([new_ids[x] for x in old], pa.int64())
    tables["notes"] = notes.set_column(notes.schema.get_field_index("note_id"), "note_id", mapping)
    turns = tables["turns"]
    remapped = pa.array([None if x is None else new_ids.get(x, -1)
                         for x in turns.column("note_id").to_pylist()], pa.int64())
    if pc.any(pc.equal(remapped, -1)).as_py():
        raise _bad(src, "a turn refers to a note that is not in the export")
    tables["turns"] = turns.set_column(turns.schema.get_field_index("note_id"), "note_id", remapped)
    targets = {"sessions": "import_sessions", "turns": "insert_turns",
               "message_vectors": "insert_message_vectors",
               "sentence_vectors": "insert_sentence_vectors", "postings": "insert_postings",
               "notes": "insert_notes", "pins": "import_pins",
               "session_summaries": "import_session_summaries"}
    batch_names = {"turns": "_b_turns", "message_vectors": "_b_mvec", "sentence_vectors": "_b_svec",
                   "postings": "_b_post", "notes": "_b_notes"}
    try:
        with store.transaction():
            for t in PARQUET_TABLES:
                if tables[t].num_rows == 0:
                    continue
                run_with(store, targets[t], **{batch_names.get(t, "_b_import"): tables[t]})
    except duckdb.Error as exc:
        raise _bad(src, f"the tables do not fit this store ({exc})") from None
    return sid
