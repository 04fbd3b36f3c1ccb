"""An ACE playbook: bullets in the store's ``playbook_bullets`` table.

A bullet has an id from the global ``bullet_ids`` counter, a section, one line of content,
helpful/harmful counts, created/updated times and an embedding (for de-duplication). A playbook
renders to Markdown and to an OKF bundle and parses back from both without loss::

    ## strategies
    - [b12 +3 -0 2026-01-02T10:00:00 2026-01-05T08:30:00] Check units before adding numbers.

Every change is one transaction on the store.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from cce_duck import clock
from cce_duck.errors import ConflictError, NotFoundError, ValidationError
from cce_duck.rows import quantize, registered
from cce_duck.tools.okf import Concept, IndexEntry, read_bundle, write_concept, write_index

__all__ = ["Bullet", "Playbook", "parse_markdown"]

_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_SECTION = re.compile(r"[a-z0-9_\-]{1,40}")
_LINE = re.compile(
    r"^- \[b(?P<id>\d+) \+(?P<h>\d+) -(?P<x>\d+) (?P<c>[0-9T:.\-]+) (?P<u>[0-9T:.\-]+)\] "
    r"(?P<content>.+)$")
MAX_CONTENT = 600


@dataclass(frozen=True)
class Bullet:
    """One playbook bullet."""

    id: int
    section: str
    content: str
    helpful: int = 0
    harmful: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def score(self) -> int:
        """Usefulness: helpful minus harmful."""
        return self.helpful - self.harmful

    def line(self) -> str:
        """The Markdown line of this bullet."""
        c = (self.created_at or clock.now(whole_seconds=True)).isoformat()
        u = (self.updated_at or clock.now(whole_seconds=True)).isoformat()
        return f"- [b{self.id} +{self.helpful} -{self.harmful} {c} {u}] {self.content}"


def clean_content(content: object) -> str:
    """One line of text, or :class:`ValidationError`."""
    if not isinstance(content, str) or not content.strip():
        raise ValidationError("bullet content must be a non-empty string")
    one = " ".join(content.split())
    if len(one) > MAX_CONTENT:
        raise ValidationError(f"bullet content is limited to {MAX_CONTENT} characters")
    return one


def check_section(section: object) -> str:
    """A valid section name (lower-case letters, digits, ``_`` and ``-``)."""
    if not isinstance(section, str) or not _SECTION.fullmatch(section):
        raise ValidationError(f"invalid section {section!r} (1-40 of a-z 0-9 _ -)")
    return section


def parse_markdown(text: str) -> list[Bullet]:
    """Bullets from :meth:`Playbook.to_markdown` text."""
    if not isinstance(text, str):
        raise ValidationError("playbook Markdown must be a string")
    section, out = None, []
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            section = check_section(line[3:].strip())
        elif line.startswith("- "):
            m = _LINE.match(line)
            if m is None or section is None:
                raise ValidationError(f"line {n} is not a playbook bullet: {line[:80]!r}")
            try:
                created, updated = datetime.fromisoformat(m["c"]), datetime.fromisoformat(m["u"])
            except ValueError:
                raise ValidationError(f"line {n} has a bad timestamp") from None
            out.append(Bullet(int(m["id"]), section, clean_content(m["content"]), int(m["h"]),
                              int(m["x"]), created, updated))
    ids = [b.id for b in out]
    if len(set(ids)) != len(ids):
        raise ValidationError("bullet ids repeat")
    return out


class Playbook:
    """The bullets of playbook ``name`` in ``store`` (an Engine or a Store)."""

    def __init__(self, store: Any, name: str = "default") -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValidationError(f"invalid playbook name {name!r}")
        self.store = getattr(store, "store", store)
        self.name = name
        self.embedder = self.store.embedder
        self.dim = self.store.dim

    def _q(self, name: str, params: dict[str, Any] | None = None) -> Any:
        return self.store.q(name, params, source="llm.sql")

    # -- reading ----------------------------------------------------------------

    def bullets(self) -> list[Bullet]:
        """Every bullet, in id order."""
        rows = self._q("bullets_of", {"playbook": self.name}).fetchall()
        return [Bullet(r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows]

    def get(self, bullet_id: int) -> Bullet:
        """One bullet; :class:`NotFoundError` if absent."""
        for b in self.bullets():
            if b.id == bullet_id:
                return b
        raise NotFoundError(f"no bullet {bullet_id} in playbook {self.name!r}")

    def vectors(self) -> tuple[list[int], np.ndarray]:
        """Bullet ids and their unit vectors (float32)."""
        rows = self._q("bullets_of", {"playbook": self.name}).fetchall()
        if not rows:
            return [], np.empty((0, self.dim), dtype=np.float32)
        mat = np.asarray([r[7] for r in rows], dtype=np.float32) / 127.0
        norms = np.linalg.norm(mat, axis=1, keepdims=True)
        return [r[0] for r in rows], mat / np.where(norms == 0, 1.0, norms)

    def similar(self, content: str, threshold: float) -> tuple[int, float] | None:
        """The most similar bullet with cosine >= ``threshold``, as ``(id, cosine)``."""
        ids, mat = self.vectors()
        if not ids:
            return None
        q = self.embedder.embed([clean_content(content)])[0]
        sims = mat @ q
        best = int(np.argmax(sims))
        return (ids[best], float(sims[best])) if sims[best] >= threshold else None

    def render(self, bullets: Iterable[Bullet] | None = None) -> str:
        """Markdown, one ``## section`` per section in first-seen order."""
        groups: dict[str, list[Bullet]] = {}
        for b in self.bullets() if bullets is None else bullets:
            groups.setdefault(b.section, []).append(b)
        parts = [f"## {s}\n" + "\n".join(b.line() for b in bs) + "\n" for s, bs in groups.items()]
        return "\n".join(parts)

    to_markdown = render

    def prompt_view(self) -> str:
        """A compact view for prompts: ``[id] content`` under each section."""
        groups: dict[str, list[Bullet]] = {}
        for b in self.bullets():
            groups.setdefault(b.section, []).append(b)
        if not groups:
            return "(empty)"
        return "\n".join(f"{s}:\n" + "\n".join(f"[{b.id}] {b.content}" for b in bs)
                         for s, bs in groups.items())

    # -- writing ----------------------------------------------------------------

    def replace_all(self, bullets: list[Bullet]) -> None:
        """Make the stored playbook exactly ``bullets`` (one transaction)."""
        for b in bullets:
            check_section(b.section)
            clean_content(b.content)
            if b.helpful < 0 or b.harmful < 0:
                raise ValidationError("helpful/harmful counts are >= 0")
        ids = [b.id for b in bullets]
        if len(set(ids)) != len(ids):
            raise ValidationError("bullet ids repeat")
        now = clock.now(whole_seconds=True)
        bullets = [replace(b, created_at=b.created_at or now, updated_at=b.updated_at or now)
                   for b in bullets]
        vecs = self.embedder.embed([b.content for b in bullets]) if bullets else np.empty(
            (0, self.dim), dtype=np.float32)
        with self.store.transaction() as con:
            self._q("bullets_delete_playbook", {"playbook": self.name})
            if bullets:
                tbl = pa.table({
                    "bullet_id": pa.array(ids, pa.int64()),
                    "playbook": pa.array([self.name] * len(bullets)),
                    "section": pa.array([b.section for b in bullets]),
                    "content": pa.array([b.content for b in bullets]),
                    "helpful": pa.array([b.helpful for b in bullets], pa.int32()),
                    "harmful": pa.array([b.harmful for b in bullets], pa.int32()),
                    "created_at": pa.array([b.created_at for b in bullets], pa.timestamp("us")),
                    "updated_at": pa.array([b.updated_at for b in bullets], pa.timestamp("us")),
                    "vector": quantize(vecs),
                })
                try:
                    with registered(con, _b_bullets=tbl):
                        self._q("bullets_insert")
                except duckdb.ConstraintException:
                    raise ConflictError(
                        "a bullet id is already used by another playbook (ids are global)"
                    ) from None
            # keep the global counter ahead of every id written
            top = max(ids, default=0)
            row = self._q("bullet_last_id").fetchone()
            last = row[0] if row and row[0] is not None else 0
            for _ in range(max(0, top - last)):
                self._q("bullet_next_id").fetchall()

    def next_ids(self, n: int) -> list[int]:
        """Reserve ``n`` ids from the global counter."""
        return [int(self._q("bullet_next_id").fetchone()[0]) for _ in range(n)]

    def add(self, section: str, content: str) -> int:
        """Add one bullet; returns its id."""
        section, content = check_section(section), clean_content(content)
        (bid,) = self.next_ids(1)
        now = clock.now(whole_seconds=True)
        self.replace_all([*self.bullets(), Bullet(bid, section, content, 0, 0, now, now)])
        return bid

    # -- Markdown and OKF -------------------------------------------------------

    def load_markdown(self, text: str) -> None:
        """Replace the playbook with the bullets of ``text``."""
        self.replace_all(parse_markdown(text))

    def to_okf(self, bundle_dir: str | Path) -> Path:
        """Write one concept per section (``type: Playbook Section``) plus an index."""
        root = Path(bundle_dir)
        groups: dict[str, list[Bullet]] = {}
        for b in self.bullets():
            groups.setdefault(b.section, []).append(b)
        entries = []
        for section, bs in groups.items():
            write_concept(root, Concept(f"playbook/{section}", {
                "type": "Playbook Section", "title": f"{self.name}: {section}",
                "description": f"{len(bs)} bullet(s)", "playbook": self.name,
                "section": section}, "\n".join(b.line() for b in bs) + "\n"))
            entries.append(IndexEntry("Sections", section, f"playbook/{section}.md",
                                      f"{len(bs)} bullet(s)"))
        write_index(root, "", entries, okf_version="0.2")
        return root

    def load_okf(self, bundle_dir: str | Path) -> None:
        """Replace the playbook with the ``Playbook Section`` concepts of a bundle."""
        b = read_bundle(bundle_dir)
        bullets: list[Bullet] = []
        for c in b.concepts.values():
            if c.type != "Playbook Section":
                continue
            section = check_section(c.front.get("section"))
            bullets += parse_markdown(f"## {section}\n{c.body}")
        self.replace_all(sorted(bullets, key=lambda x: x.id))
