"""File-backed notes: Markdown files in a folder are the source of truth a model or a person reads.

Each note is ``<id>.md`` with a YAML front matter block (``type: Note``, so the folder is also an
OKF bundle) holding its title, tags, pin and timestamps; the body is the note. Every write is
atomic and done under a cross-process lock (``.notes.lock``), so two processes never interleave
their updates. :meth:`NotesManager.compact` keeps the folder under a byte cap: pinned notes are
always kept, the oldest unpinned notes go first (or are merged into one summary note when a model
is given). :meth:`NotesManager.search` ranks notes by BM25 and by embedding similarity (the
store's embedder), fused by reciprocal rank.
"""

from __future__ import annotations

import builtins
import math
import re
import secrets
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from filelock import FileLock

from cce_duck import clock
from cce_duck.errors import BudgetExceededError, NotFoundError, ValidationError
from cce_duck.text import terms
from cce_duck.tools.okf import Concept, atomic_write, read_concept, render_concept

__all__ = ["Note", "NotesManager"]

_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,79}")
_TAG = re.compile(r"[\w.-]{1,40}")
MAX_NOTE_BYTES = 200_000


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40].strip("-")
    return s or "note"


@dataclass
class Note:
    """One note file."""

    id: str
    text: str
    title: str = ""
    tags: list[str] = field(default_factory=list)
    pinned: bool = False
    created: datetime = field(default_factory=lambda: clock.now(whole_seconds=True))
    updated: datetime = field(default_factory=lambda: clock.now(whole_seconds=True))
    extra: dict[str, Any] = field(default_factory=dict)

    def to_concept(self) -> Concept:
        """The note as an OKF concept (unknown front matter keys kept)."""
        front = {**self.extra, "type": "Note", "title": self.title or self.id,
                 "tags": list(self.tags), "pinned": self.pinned,
                 "created": self.created.isoformat(), "updated": self.updated.isoformat()}
        return Concept(self.id, front, self.text)


def _time(value: object, fallback: datetime) -> datetime:
    if isinstance(value, datetime):
        return value.replace(tzinfo=None)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).replace(tzinfo=None)
        except ValueError:
            return fallback
    return fallback


def _from_concept(c: Concept, mtime: datetime) -> Note:
    f = dict(c.front)
    known = {"type", "title", "tags", "pinned", "created", "updated"}
    tags = f.get("tags") or []
    return Note(
        id=c.id, text=c.body.rstrip("\n"), title=str(f.get("title") or c.id),
        tags=[str(t) for t in tags] if isinstance(tags, list) else [str(tags)],
        pinned=bool(f.get("pinned", False)), created=_time(f.get("created"), mtime),
        updated=_time(f.get("updated"), mtime),
        extra={k: v for k, v in f.items() if k not in known})


class NotesManager:
    """Notes in ``folder``. ``embedder`` (an Engine, a Store or an embedder) enables vector
    search; without one, search is BM25 only."""

    def __init__(self, folder: str | Path, *, embedder: Any = None, max_bytes: int = 1_000_000
                 ) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValidationError("max_bytes must be a positive integer")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        store = getattr(embedder, "store", embedder)
        self.embedder = getattr(store, "embedder", embedder)
        self._lock = FileLock(str(self.folder / ".notes.lock"), timeout=30)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the folder's cross-process lock."""
        with self._lock:
            yield

    # -- reading ----------------------------------------------------------------

    def _path(self, note_id: str) -> Path:
        if not isinstance(note_id, str) or not _ID.fullmatch(note_id):
            raise ValidationError(f"invalid note id {note_id!r}")
        return self.folder / f"{note_id}.md"

    def get(self, note_id: str) -> Note:
        """One note; :class:`NotFoundError` if there is no such file."""
        path = self._path(note_id)
        if not path.is_file():
            raise NotFoundError(f"no note {note_id!r} in {self.folder}")
        return self._read(path)

    def _read(self, path: Path) -> Note:
        mtime = datetime.fromtimestamp(path.stat().st_mtime, UTC).replace(tzinfo=None)
        try:
            return _from_concept(read_concept(self.folder, path.stem), mtime)
        except ValidationError:
            # a file written by hand without front matter is still a note
            return Note(path.stem, path.read_text(encoding="utf-8").rstrip("\n"), path.stem,
                        created=mtime, updated=mtime)

    def list(self, tag: str | None = None) -> list[Note]:
        """Every note (pinned first, then newest first), optionally only those with ``tag``."""
        notes = [self._read(p) for p in sorted(self.folder.glob("*.md"))
                 if _ID.fullmatch(p.stem) and p.name not in ("index.md", "log.md")]
        if tag is not None:
            notes = [n for n in notes if tag in n.tags]
        return sorted(notes, key=lambda n: (not n.pinned, -n.updated.timestamp(), n.id))

    def total_bytes(self) -> int:
        """Bytes of every note file."""
        return sum(p.stat().st_size for p in self.folder.glob("*.md"))

    # -- writing ----------------------------------------------------------------

    @staticmethod
    def _check(text: object, title: object, tags: object) -> None:
        if text is not None and (not isinstance(text, str) or not text.strip()):
            raise ValidationError("note text must be a non-empty string")
        if isinstance(text, str) and len(text.encode("utf-8")) > MAX_NOTE_BYTES:
            raise ValidationError(f"a note is limited to {MAX_NOTE_BYTES} bytes")
        if title is not None and (not isinstance(title, str) or "\n" in title):
            raise ValidationError("a title is a one-line string")
        if tags is not None:
            if isinstance(tags, str) or not isinstance(tags, Iterable):
                raise ValidationError("tags must be a list of strings")
            for t in tags:
                if not isinstance(t, str) or not _TAG.fullmatch(t):
                    raise ValidationError(f"invalid tag {t!r} (1-40 of letters, digits, _ . -)")

    def _write(self, note: Note) -> None:
        atomic_write(self._path(note.id), render_concept(note.to_concept()))

    def add(self, text: str, *, title: str | None = None, tags: Iterable[str] = (),
            pinned: bool = False) -> str:
        """Write a new note; returns its id."""
        tags = list(tags) if not isinstance(tags, str) else tags
        self._check(text, title, tags)
        with self._lock:
            base = _slug(title or text.split("\n", 1)[0])
            note_id = f"{base}-{secrets.token_hex(3)}"
            while self._path(note_id).exists():
                note_id = f"{base}-{secrets.token_hex(3)}"
            now = clock.now(whole_seconds=True)
            self._write(Note(note_id, text.strip(), title or "", list(dict.fromkeys(tags)),
                             bool(pinned), now, now))
        return note_id

    def update(self, note_id: str, *, text: str | None = None, title: str | None = None,
               tags: Iterable[str] | None = None, pinned: bool | None = None) -> Note:
        """Change some fields of a note."""
        tags = list(tags) if tags is not None and not isinstance(tags, str) else tags
        self._check(text, title, tags)
        with self._lock:
            note = self.get(note_id)
            if text is not None:
                note.text = text.strip()
            if title is not None:
                note.title = title
            if tags is not None:
                note.tags = list(dict.fromkeys(tags))
            if pinned is not None:
                note.pinned = bool(pinned)
            note.updated = clock.now(whole_seconds=True)
            self._write(note)
            return note

    def pin(self, note_id: str) -> Note:
        """Keep this note through every compaction."""
        return self.update(note_id, pinned=True)

    def unpin(self, note_id: str) -> Note:
        """Let compaction remove this note again."""
        return self.update(note_id, pinned=False)

    def delete(self, note_id: str) -> None:
        """Remove a note."""
        with self._lock:
            path = self._path(note_id)
            if not path.is_file():
                raise NotFoundError(f"no note {note_id!r} in {self.folder}")
            path.unlink()

    def compact(self, max_bytes: int | None = None, *, llm: Any = None) -> dict[str, Any]:
        """Bring the folder under ``max_bytes`` (default: the manager's cap).

        Pinned notes are always kept; unpinned ones go oldest first. With ``llm`` the removed
        notes are merged into one summary note (unpinned, tagged ``summary``) when it fits.
        Raises :class:`BudgetExceededError`, changing nothing, if the pinned notes alone are
        over the cap.
        """
        cap = self.max_bytes if max_bytes is None else max_bytes
        if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
            raise ValidationError("max_bytes must be a positive integer")
        with self._lock:
            size = {p.stem: p.stat().st_size for p in self.folder.glob("*.md")}
            total = sum(size.values())
            if total <= cap:
                return {"removed": [], "summary_id": None, "bytes_before": total,
                        "bytes_after": total}
            notes = self.list()
            pinned = sum(size.get(n.id, 0) for n in notes if n.pinned)
            if pinned > cap:
                raise BudgetExceededError(
                    f"the pinned notes take {pinned} bytes, over the cap of {cap}; unpin some")
            # with a model, leave room for the summary note when the pinned notes allow it
            goal = cap - min(max(600, cap // 8), cap - pinned) if llm is not None else cap
            victims: list[Note] = []
            for n in sorted((n for n in notes if not n.pinned), key=lambda n: n.updated):
                if total <= goal:
                    break
                victims.append(n)
                total -= size.get(n.id, 0)
            summary_id = None
            if llm is not None and victims:
                summary_id = self._summarise(victims, cap - total, llm)
            for n in victims:
                self._path(n.id).unlink(missing_ok=True)
            if summary_id is not None:
                total += (self.folder / f"{summary_id}.md").stat().st_size
            return {"removed": [n.id for n in victims], "summary_id": summary_id,
                    "bytes_before": sum(size.values()), "bytes_after": total}

    def _summarise(self, victims: builtins.list[Note], room: int, llm: Any) -> str | None:
        from cce_duck.tools.ppa import truncate_to_tokens

        if room < 400:
            return None
        text = "\n\n".join(f"{n.title}: {n.text}" for n in victims)
        out = llm.complete(
            "Summarise these notes in a few short lines, keeping names, numbers and "
            f"decisions:\n\n{truncate_to_tokens(text, llm.context_window // 2, llm.counter)}",
            prompt_version="notes_compact@v1", max_tokens=max(16, min(256, room // 8)))
        note_id = f"summary-{secrets.token_hex(3)}"
        now = clock.now(whole_seconds=True)
        note = Note(note_id, out.strip(), "Summary of older notes", ["summary"], False, now, now,
                    {"summarises": [n.id for n in victims]})
        body = render_concept(note.to_concept())
        while len(body.encode("utf-8")) > room and note.text:
            note.text = note.text[: len(note.text) * 3 // 4].rstrip()
            body = render_concept(note.to_concept())
        if not note.text:
            return None
        atomic_write(self._path(note_id), body)
        return note_id

    # -- search -----------------------------------------------------------------

    def search(self, query: str, k: int = 5, *, tag: str | None = None
               ) -> builtins.list[tuple[Note, float]]:
        """Notes ranked for ``query``: BM25 and (with an embedder) cosine, fused by RRF."""
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("query must be a non-empty string")
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise ValidationError("k must be a positive integer")
        notes = self.list(tag)
        if not notes:
            return []
        docs = [f"{n.title}\n{' '.join(n.tags)}\n{n.text}" for n in notes]
        rankings = [_bm25([terms(d) for d in docs], terms(query))]
        if self.embedder is not None:
            mat = self.embedder.embed(docs)
            q = self.embedder.embed([query], "query")[0]
            sims = mat @ q
            rankings.append({i: float(s) for i, s in enumerate(sims)})
        fused: dict[int, float] = {}
        for scores in rankings:
            ranked = sorted((i for i in scores if scores[i] > 0), key=lambda i: -scores[i])
            for r, i in enumerate(ranked):
                fused[i] = fused.get(i, 0.0) + 1.0 / (60 + r + 1)
        best = sorted(fused, key=lambda i: (-fused[i], i))[:k]
        return [(notes[i], fused[i]) for i in best]


def _bm25(docs: list[list[str]], query: list[str], k1: float = 1.2, b: float = 0.75
          ) -> dict[int, float]:
    n = len(docs)
    avg = sum(len(d) for d in docs) / max(1, n) or 1.0
    df: Counter[str] = Counter()
    for d in docs:
        df.update(set(d))
    scores: dict[int, float] = {}
    for i, d in enumerate(docs):
        tf = Counter(d)
        s = 0.0
        for t in set(query):
            if tf[t]:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                s += idf * tf[t] * (k1 + 1) / (tf[t] + k1 * (1 - b + b * len(d) / avg))
        scores[i] = s
    return scores


