"""The generated reference pages (docs/cli.md, docs/sql.md) are current: `make docs` rewrites
them, this test fails when the code changed without a rewrite."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from cogapp import Cog

from cce_duck.sqlfiles import CURRENT_MACROS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "docs" / "cli.md", ROOT / "docs" / "sql.md"]


def cog(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = Cog().main(["cog", "-I", str(ROOT / "docs"), *args])
    return rc, out.getvalue()


def test_reference_pages_are_current() -> None:
    rc, out = cog("--check", *map(str, PAGES))
    assert rc == 0, f"stale reference docs, run `make docs`:\n{out}"


def test_a_stale_page_fails_the_check(tmp_path: Path) -> None:
    for page in PAGES:
        stale = tmp_path / page.name
        text = page.read_text(encoding="utf-8")
        end = text.index("<!-- [[[end]]] -->")
        stale.write_text(text[:end] + "a hand edit\n" + text[end:], encoding="utf-8")
        rc, out = cog("--check", str(stale))
        assert rc != 0, out


def test_pages_name_every_command_and_current_macro() -> None:
    cli, sql = (p.read_text(encoding="utf-8") for p in PAGES)
    for command in ("cce context", "cce ingest", "cce sql", "cce serve rest", "cce forget"):
        assert f"## `{command}`" in cli
    for alias, target in CURRENT_MACROS.items():
        assert f"`{alias}` → `{target}`" in sql
    for table in ("turns", "notes", "postings", "pins"):
        assert f"### `{table}`" in sql


def test_changelog_lists_every_migration_and_macro_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "### SQL changes" in changelog
    names = [p.stem for p in (ROOT / "sql" / "migrations").glob("*.sql")]
    names += [p.stem for p in (ROOT / "sql" / "macros").glob("*.sql")]
    missing = [n for n in sorted(names) if f"`{n}`" not in changelog]
    assert not missing, f"CHANGELOG.md lacks an SQL changes entry for {missing}"
