"""PPA results as an OKF v0.2 bundle, and leaves materialised back from it.

Layout (``mNNN`` is the message index, ``lNNN`` the leaf index)::

    index.md                    okf_version 0.2; lists the compressed messages and the folders
    log.md                      one dated entry per run, newest first
    summaries/mNNN.md           type "Compressed Message": the final summary, token counts, links
    leaves/mNNN-lNNN.md         type "Summary Leaf": offsets [start, end) into the source, summary
    sources/mNNN.txt            the original message text, byte for byte
    sources/mNNN.md             type "Source Text": what the .txt is, its SHA-256 and length

With ``index_only=True`` (the default) leaf files hold offsets and summaries only; the original
text lives once in ``sources/``, so any leaf can still be materialised (:func:`materialise_leaf`).
With ``index_only=False`` each leaf file also carries its own text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cce_duck.errors import NotFoundError, ValidationError
from cce_duck.llm.client import LLM
from cce_duck.tools.okf import (
    OKF_VERSION,
    Concept,
    IndexEntry,
    append_log,
    atomic_write,
    read_concept,
    write_concept,
    write_index,
)
from cce_duck.tools.ppa import PPAResult, ppa_compress

__all__ = ["materialise_leaf", "ppa_compress_to_okf"]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _describe(text: str, limit: int = 140) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1].rstrip() + "…"


def ppa_compress_to_okf(messages: Sequence[Mapping[str, Any]], budget_tokens: int, llm: LLM,
                        bundle_dir: str | Path, *, index_only: bool = True, **kw: Any
                        ) -> tuple[PPAResult, Path]:
    """Run :func:`~cce_duck.tools.ppa.ppa_compress` and write the result as an OKF bundle.

    Nothing is written when compression fails (bad input, budget not met, model errors).
    """
    if not isinstance(bundle_dir, str | Path) or not str(bundle_dir).strip():
        raise ValidationError("bundle_dir must be a folder path")
    root = Path(bundle_dir)
    if root.exists() and not root.is_dir():
        raise ValidationError(f"{root} exists and is not a folder")
    res = ppa_compress(messages, budget_tokens, llm, **kw)
    from cce_duck import __version__

    at = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    generated = {"by": f"cce_duck/{__version__}", "at": at, "model": llm.model}
    roles = {i: m["role"] for i, m in enumerate(res.messages)}
    summary_entries, leaf_entries, source_entries = [], [], []
    for i, original in sorted(res.originals.items()):
        mid = f"m{i:03d}"
        src_url = f"/sources/{mid}.txt"
        atomic_write(root / "sources" / f"{mid}.txt", original)
        source_ref = {"id": mid, "resource": src_url, "title": f"Original message {i}"}
        write_concept(root, Concept(f"sources/{mid}", {
            "type": "Source Text", "title": f"Message {i} ({roles[i]}), original",
            "description": _describe(original), "resource": src_url,
            "sha256": _sha(original), "chars": len(original), "message_index": i,
            "role": roles[i],
        }, f"The original text of message {i} is stored verbatim in [{mid}.txt]({mid}.txt).\n"))
        source_entries.append(IndexEntry("Sources", f"Message {i}", f"{mid}.md",
                                         f"original text, {len(original)} characters"))
        leaves = [lf for lf in res.leaves if lf.message_index == i]
        for lf in leaves:
            front: dict[str, Any] = {
                "type": "Summary Leaf", "title": f"Message {i}, leaf {lf.leaf_index}",
                "description": _describe(lf.summary), "message_index": i,
                "leaf_index": lf.leaf_index, "start": lf.start, "end": lf.end,
                "tokens": lf.tokens, "summary_tokens": lf.summary_tokens,
                "text_included": not index_only, "generated": generated,
                "sources": [source_ref],
            }
            body = f"# Summary\n\n{lf.summary}\n"
            if not index_only:
                body += f"\n# Text\n\n~~~text\n{original[lf.start:lf.end]}\n~~~\n"
            write_concept(root, Concept(f"leaves/{lf.leaf_id}", front, body))
            leaf_entries.append(IndexEntry(f"Message {i}", f"Leaf {lf.leaf_index}",
                                           f"{lf.leaf_id}.md", _describe(lf.summary, 100)))
        summary = res.summaries[i]
        write_concept(root, Concept(f"summaries/{mid}", {
            "type": "Compressed Message", "title": f"Message {i} ({roles[i]})",
            "description": _describe(summary), "message_index": i, "role": roles[i],
            "tokens_before": llm.count(original), "tokens_after": llm.count(summary),
            "aggregation_levels": res.levels.get(i, 0), "truncated": res.truncated,
            "leaves": [f"/leaves/{lf.leaf_id}.md" for lf in leaves],
            "generated": generated, "sources": [source_ref],
        }, f"{summary}\n\n# Leaves\n\n" + "".join(
            f"* [Leaf {lf.leaf_index}](/leaves/{lf.leaf_id}.md) - characters "
            f"{lf.start}-{lf.end}\n" for lf in leaves)))
        summary_entries.append(IndexEntry("Compressed messages", f"Message {i} ({roles[i]})",
                                          f"summaries/{mid}.md", _describe(summary)))
    if res.originals:
        write_index(root, "leaves", leaf_entries)
        write_index(root, "sources", source_entries)
    folders = [IndexEntry("Folders", "Leaves", "leaves/", "leaf summaries with their offsets"),
               IndexEntry("Folders", "Sources", "sources/", "the original messages")]
    write_index(root, "", summary_entries + (folders if res.originals else []),
                okf_version=OKF_VERSION)
    append_log(root, "", [
        f"**Compression**: {len(res.originals)} message(s) from {res.tokens_before} to "
        f"{res.tokens_after} tokens (budget {res.budget_tokens}), {len(res.leaves)} leaves, "
        f"{res.calls} model call(s), {res.cache_hits} cache hit(s), model {llm.model}."])
    return res, root


def materialise_leaf(bundle_dir: str | Path, leaf_id: str) -> str:
    """The original text of leaf ``leaf_id`` (e.g. ``m001-l002``), read back from the bundle."""
    root = Path(bundle_dir)
    leaf = read_concept(root, f"leaves/{leaf_id}")
    try:
        src = leaf.front["sources"][0]["resource"]
        start, end = int(leaf.front["start"]), int(leaf.front["end"])
    except (KeyError, IndexError, TypeError, ValueError):
        raise ValidationError(f"leaf {leaf_id} lacks its source or offsets") from None
    path = root / str(src).lstrip("/")
    if not path.is_file():
        raise NotFoundError(f"the source {src} of leaf {leaf_id} is missing")
    with path.open(encoding="utf-8", newline="") as fh:
        text = fh.read()
    meta = root / Path(str(src).lstrip("/")).with_suffix("")
    try:
        expected = read_concept(root, meta.relative_to(root).as_posix()).front.get("sha256")
    except NotFoundError:
        expected = None
    if expected is not None and expected != _sha(text):
        raise ValidationError(f"the source {src} of leaf {leaf_id} was changed (hash mismatch)")
    if not 0 <= start <= end <= len(text):
        raise ValidationError(f"leaf {leaf_id} offsets {start}-{end} are outside its source")
    return text[start:end]
