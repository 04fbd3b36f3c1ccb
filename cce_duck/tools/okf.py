"""Open Knowledge Format (OKF) v0.2 bundles: read, write, and PPA results as a bundle.

A bundle is a folder of Markdown files. Concepts carry a YAML front matter block whose only
required key is ``type``; every other key, known or not, is kept on a round trip. ``index.md``
files have no front matter, except ``okf_version`` in the bundle root, and list
``* [Title](url) - description`` entries under ``#`` headings. ``log.md`` files hold ``## YYYY-MM-DD``
headings, newest first. Broken links and missing indexes are tolerated. Every file is written
atomically (a temporary file, fsync, rename), so a crash leaves each file in its old or its new
version, never neither and never half.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import yaml

from cce_duck.errors import NotFoundError, ValidationError

__all__ = [
    "OKF_VERSION",
    "Bundle",
    "Concept",
    "IndexEntry",
    "LogDay",
    "append_log",
    "atomic_write",
    "read_bundle",
    "read_concept",
    "render_concept",
    "write_bundle",
    "write_concept",
    "write_index",
]

OKF_VERSION = "0.2"
RESERVED = frozenset({"index.md", "log.md"})
_ENTRY = re.compile(r"^\s*[*-]\s+\[(?P<title>[^\]]*)\]\((?P<url>[^)]*)\)(?:\s+-\s+(?P<desc>.*))?$")
_DAY = re.compile(r"^##\s+(\d{4}-\d{2}-\d{2})\s*$")


@dataclass
class Concept:
    """One concept: its id (path without ``.md``), front matter and Markdown body."""

    id: str
    front: dict[str, Any]
    body: str = ""

    @property
    def type(self) -> str:
        """The required ``type``."""
        return str(self.front.get("type", ""))


@dataclass(frozen=True)
class IndexEntry:
    """``* [title](url) - description`` under a section heading of an ``index.md``."""

    section: str
    title: str
    url: str
    description: str = ""


@dataclass
class LogDay:
    """A ``## YYYY-MM-DD`` heading of a ``log.md`` and its entries."""

    day: date
    entries: list[str] = field(default_factory=list)


@dataclass
class Bundle:
    """A whole bundle: concepts by id, indexes and logs by folder (``""`` is the root)."""

    root: Path
    concepts: dict[str, Concept] = field(default_factory=dict)
    indexes: dict[str, list[IndexEntry]] = field(default_factory=dict)
    index_titles: dict[str, str] = field(default_factory=dict)
    logs: dict[str, list[LogDay]] = field(default_factory=dict)
    log_titles: dict[str, str] = field(default_factory=dict)
    okf_version: str | None = None

    def broken_links(self) -> list[tuple[str, str]]:
        """``(concept id or index folder, url)`` of links to bundle files that do not exist."""
        out = []
        for cid, c in self.concepts.items():
            for url in re.findall(r"\]\(([^)\s]+)\)", c.body):
                if not _exists(self.root, str(Path(cid).parent), url):
                    out.append((cid, url))
        for folder, entries in self.indexes.items():
            for e in entries:
                if not _exists(self.root, folder, e.url):
                    out.append((folder or "/", e.url))
        return out


def _exists(root: Path, folder: str, url: str) -> bool:
    if re.match(r"^[a-z][a-z0-9+.-]*:", url) or url.startswith("#"):
        return True  # external
    target = root / url.lstrip("/") if url.startswith("/") else root / folder / url
    return target.exists()


# -- files ----------------------------------------------------------------------


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _split_front(text: str, where: str) -> tuple[dict[str, Any] | None, str]:
    if not text.startswith("---"):
        return None, text
    lines = text.split("\n")
    if lines[0].strip() != "---":
        return None, text
    for i in range(1, len(lines)):
        if lines[i].strip() == "---":
            try:
                front = yaml.safe_load("\n".join(lines[1:i])) or {}
            except yaml.YAMLError as exc:
                raise ValidationError(f"{where}: the front matter is not valid YAML: {exc}") from None
            if not isinstance(front, dict):
                raise ValidationError(f"{where}: the front matter is not a mapping")
            return front, "\n".join(lines[i + 1:]).lstrip("\n")
    raise ValidationError(f"{where}: the front matter block is not closed by '---'")


def _dump_front(front: dict[str, Any]) -> str:
    text: str = yaml.safe_dump(front, sort_keys=False, allow_unicode=True, default_flow_style=False,
                               width=10_000)
    return text


def render_concept(concept: Concept) -> str:
    """The file text of a concept."""
    _check_concept(concept)
    body = concept.body if concept.body.endswith("\n") or not concept.body else concept.body + "\n"
    return f"---\n{_dump_front(concept.front)}---\n\n{body}"


def _check_concept(concept: Concept) -> None:
    cid = concept.id
    if not isinstance(cid, str) or not cid or cid.startswith("/") or ".." in Path(cid).parts or (
        Path(cid).name + ".md" in RESERVED
    ):
        raise ValidationError(f"invalid concept id {cid!r}")
    t = concept.front.get("type") if isinstance(concept.front, dict) else None
    if not isinstance(t, str) or not t.strip():
        raise ValidationError(f"concept {cid!r} needs a non-empty 'type' in its front matter")


def read_concept(root: Path, concept_id: str) -> Concept:
    """Read one concept file; raises :class:`ValidationError` if it does not conform."""
    path = Path(root) / f"{concept_id}.md"
    if not path.is_file():
        raise NotFoundError(f"no concept {concept_id!r} in {root}")
    text = path.read_text(encoding="utf-8")
    front, body = _split_front(text, str(path))
    if front is None:
        raise ValidationError(f"{path}: a concept needs a YAML front matter block")
    concept = Concept(concept_id, front, body)
    try:
        _check_concept(concept)
    except ValidationError as exc:
        raise ValidationError(f"{path}: {exc}") from None
    return concept


def write_concept(root: Path, concept: Concept) -> Path:
    """Write a concept atomically; returns its path."""
    path = Path(root) / f"{concept.id}.md"
    atomic_write(path, render_concept(concept))
    return path


# -- index.md and log.md ----------------------------------------------------------


def _read_index(path: Path, is_root: bool) -> tuple[list[IndexEntry], str, str | None]:
    front, body = _split_front(path.read_text(encoding="utf-8"), str(path))
    version = None
    if front is not None:
        extra = set(front) - {"okf_version"}
        if not is_root or extra:
            raise ValidationError(
                f"{path}: an index.md has no front matter (only okf_version in the bundle root)")
        version = str(front.get("okf_version")) if front.get("okf_version") is not None else None
    section, title, out = "", "", []
    for line in body.splitlines():
        if line.startswith("# "):
            section = line[2:].strip()
            title = title or section
        m = _ENTRY.match(line)
        if m:
            out.append(IndexEntry(section, m["title"], m["url"], (m["desc"] or "").strip()))
    return out, title, version


def write_index(root: Path, folder: str, entries: Iterable[IndexEntry], *,
                okf_version: str | None = None) -> Path:
    """Write ``<folder>/index.md`` (grouped by section, in first-seen order)."""
    if okf_version is not None and folder not in ("", "."):
        raise ValidationError("okf_version belongs only in the bundle root's index.md")
    sections: dict[str, list[IndexEntry]] = {}
    for e in entries:
        sections.setdefault(e.section or "Contents", []).append(e)
    parts = [f"---\nokf_version: \"{okf_version}\"\n---\n"] if okf_version else []
    for name, items in sections.items():
        lines = [f"# {name}", ""]
        for e in items:
            desc = " ".join(e.description.split())
            lines.append(f"* [{e.title}]({e.url})" + (f" - {desc}" if desc else ""))
        parts.append("\n".join(lines) + "\n")
    path = Path(root) / folder / "index.md"
    atomic_write(path, "\n".join(parts))
    return path


def _read_log(path: Path) -> tuple[list[LogDay], str]:
    days: list[LogDay] = []
    title = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# ") and not title:
            title = line[2:].strip()
            continue
        m = _DAY.match(line)
        if m:
            try:
                days.append(LogDay(date.fromisoformat(m.group(1))))
            except ValueError:
                raise ValidationError(f"{path}: {m.group(1)} is not a valid date") from None
        elif line.startswith("## "):
            raise ValidationError(f"{path}: log headings must be dates (YYYY-MM-DD): {line!r}")
        elif line.strip() and days:
            days[-1].entries.append(line.strip().removeprefix("* ").removeprefix("- "))
    return days, title


def append_log(root: Path, folder: str, entries: Iterable[str], *, day: date | None = None,
               title: str = "Update Log") -> Path:
    """Add entries under ``day`` (today, UTC) in ``<folder>/log.md``, keeping newest first."""
    path = Path(root) / folder / "log.md"
    days, old_title = _read_log(path) if path.is_file() else ([], "")
    day = day or datetime.now(UTC).date()
    new = [" ".join(e.split()) for e in entries if e.strip()]
    for d in days:
        if d.day == day:
            d.entries = new + d.entries
            break
    else:
        days.append(LogDay(day, new))
    days.sort(key=lambda d: d.day, reverse=True)
    atomic_write(path, _render_log(days, old_title or title))
    return path


def _render_log(days: list[LogDay], title: str) -> str:
    out = [f"# {title}", ""]
    for d in days:
        out += [f"## {d.day.isoformat()}", *(f"* {e}" for e in d.entries), ""]
    return "\n".join(out)


# -- whole bundles ----------------------------------------------------------------


def read_bundle(root: str | Path) -> Bundle:
    """Read every concept, index and log under ``root``.

    Raises :class:`ValidationError` (naming the file) for a concept without front matter or
    ``type``, an index with front matter, or a log with a heading that is not a date.
    """
    root = Path(root)
    if not root.is_dir():
        raise NotFoundError(f"no OKF bundle at {root}")
    b = Bundle(root)
    for path in sorted(root.rglob("*.md")):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        folder = "" if str(rel.parent) == "." else rel.parent.as_posix()
        if path.name == "index.md":
            entries, title, version = _read_index(path, folder == "")
            b.indexes[folder], b.index_titles[folder] = entries, title
            if folder == "":
                b.okf_version = version
        elif path.name == "log.md":
            b.logs[folder], b.log_titles[folder] = _read_log(path)
        else:
            cid = rel.with_suffix("").as_posix()
            b.concepts[cid] = read_concept(root, cid)
    return b


def write_bundle(bundle: Bundle, root: str | Path | None = None) -> Path:
    """Write ``bundle`` (to ``root`` or its own root): concepts first, then indexes and logs."""
    root = Path(root) if root is not None else bundle.root
    for c in bundle.concepts.values():
        _check_concept(c)
    for c in bundle.concepts.values():
        write_concept(root, c)
    for folder, entries in bundle.indexes.items():
        write_index(root, folder, entries,
                    okf_version=bundle.okf_version if folder == "" else None)
    for folder, days in bundle.logs.items():
        atomic_write(root / folder / "log.md",
                     _render_log(sorted(days, key=lambda d: d.day, reverse=True),
                                 bundle.log_titles.get(folder) or "Update Log"))
    return root
