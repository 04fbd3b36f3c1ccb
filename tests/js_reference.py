"""Reference run of the Python engine (hash embedder) for the JavaScript cross-language test.

``python tests/js_reference.py FIXTURE.json`` prints, as JSON, what the engine keeps and chooses
on the fixture's conversations; ``cce_sdk_js/test/cross_language.test.js`` runs the JavaScript
lite engine through the same steps and compares. Keep both scenario functions in step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from cce_duck import Engine
from cce_duck.payload import ContextPayload


def _ctx(p: ContextPayload) -> dict[str, Any]:
    return {
        "notes": [[n["start_turn"], n["end_turn"]] for n in p.notes],
        "quotes": [[q["turn_no"] for q in n["quotes"]] for n in p.notes],
        "turns": [t.turn_no for t in p.turns],
        "tokens": p.tokens,
        "memory": p.memory,
    }


def _notes(eng: Engine, sid: str) -> list[list[Any]]:
    return [[r["start_turn"], r["end_turn"], r["label"], r["summary"]]
            for r in eng.notes(sid).iter_rows(named=True)]


def scenario(fixture: dict[str, Any]) -> dict[str, Any]:
    """The ingest run (whole history, then questions) and the live run (one message at a time)."""
    out: dict[str, Any] = {"ingest": {}, "live": {}}
    for sid, messages in fixture["sessions"].items():
        questions = fixture["questions"][sid]
        with Engine(data_dir=None, embedder="hash") as eng:
            eng.ingest(sid, messages)
            run: dict[str, Any] = {"notes": _notes(eng, sid), "contexts": [], "search": []}
            for q in questions:
                for budget in fixture["budgets"]:
                    run["contexts"].append(_ctx(eng.context(sid, q, max_tokens=budget)))
                run["search"].append(eng.search(sid, q, k=10)["turn_no"].to_list())
            out["ingest"][sid] = run
        with Engine(data_dir=None, embedder="hash") as eng:
            live: dict[str, Any] = {"contexts": []}
            every = fixture["live_every"]
            for i, m in enumerate(messages):
                eng.add_message(sid, m["role"], m["content"], timestamp=m["timestamp"])
                if (i + 1) % every == 0:
                    q = questions[(i // every) % len(questions)]
                    live["contexts"].append(_ctx(eng.context(sid, q, max_tokens=600)))
            live["notes"] = _notes(eng, sid)
            out["live"][sid] = live
    return out


def stem_table(min_words: int = 50_000) -> dict[str, str]:
    """Snowball stems (PyStemmer, as the engine's terms use it) of a large word list: the words of
    the LoCoMo dev file when it is there, and of the Python standard library's sources (present
    on every machine), so the JavaScript port is compared on at least ``min_words`` words."""
    import re
    import sysconfig

    import Stemmer

    words: set[str] = set()
    locomo = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "locomo_dev.json"
    if locomo.is_file():
        words.update(re.findall(r"[a-z0-9]+", locomo.read_text(encoding="utf-8").lower()))
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        words.update(re.findall(r"[a-z]+", f.read_text(encoding="utf-8", errors="ignore").lower()))
    if len(words) < min_words:
        raise SystemExit(f"only {len(words)} words found for the stemmer comparison")
    stemmer = Stemmer.Stemmer("english")
    return {w: stemmer.stemWord(w) for w in sorted(words)}


if __name__ == "__main__":
    if sys.argv[1] == "--stems":
        json.dump(stem_table(), sys.stdout)
    else:
        data = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
        json.dump(scenario(data), sys.stdout, ensure_ascii=False)
