"""Write the ranking goldens: what the ``cce_retrieve`` macro returns on fixed and seeded sessions.

    python benchmarks/ranking_goldens.py [--out tests/goldens/ranking.json] [--check]

Run it after any change to ``sql/ranking_v1.json`` (or to the ranking itself) and commit the
result with the change. Each case is one session (the JavaScript fixture's conversations, the
package's sample conversation and seeded random conversations with named speakers, questions,
repeated pleasantries and long messages), ingested with the ``hash`` or the ``onnx`` embedder
into a data folder; each query (time and turn windows, small and large ``k``, with and without
the conversation re-ranking) records the macro's turn numbers in order. ``onnx`` cases also
record the stored int8 vectors and the query vectors, so the JavaScript lite engine, which has
no ONNX model, can replay them (``cce_sdk_js/test/ranking_goldens.test.js``); ``tests/
test_ranking_goldens.py`` has the NumPy index reproduce every case. The file records the
specification's sha256: both test suites fail when the specification changed since.
``--check`` regenerates in memory and exits 1 when the committed file differs.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

import cce_duck
from cce_duck import ranking

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "goldens" / "ranking.json"
FIXTURE = ROOT / "cce_sdk_js" / "test" / "fixtures" / "conversation.json"
SAMPLE = ROOT / "cce_duck" / "data" / "sample_conversation.json"

_WORDS = (
    "garden", "kitchen", "paint", "colour", "budget", "launch", "sensor", "freezer", "alert",
    "threshold", "meetup", "piano", "lesson", "grill", "barbecue", "trip", "Lisbon", "Kyoto",
    "report", "migration", "database", "encryption", "keys", "football", "concert", "recipe",
    "bread", "sourdough", "marathon", "training", "museum", "ticket", "flight", "hotel", "invoice",
    "deadline", "review", "design", "mockup", "camera", "lens", "puppy", "vet", "appointment"
)
_PLEASANTRIES = ("Thanks!", "Wow, so cool!", "Haha, nice.", "Sounds good.", "Oh wow!")
_SPEAKERS = (("Ann", "Bob"), ("Caroline", "Melanie"), ("Chloé", "Jon"))


def _sentence(rng: random.Random, ask: bool) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 11))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), str(rng.randint(2, 999)))
    text = " ".join(words)
    return text[0].upper() + text[1:] + ("?" if ask else ".")


def random_session(seed: int, turns: int) -> tuple[list[dict[str, Any]], list[str]]:
    """A seeded conversation between two named speakers, and questions about it."""
    rng = random.Random(seed)
    a, b = _SPEAKERS[seed % len(_SPEAKERS)]
    t = datetime(2025, 3, 1, 9, 0) + timedelta(days=seed)
    msgs: list[dict[str, Any]] = []
    for i in range(turns):
        who = a if i % 2 == 0 else b
        roll = rng.random()
        if roll < 0.12:
            content = rng.choice(_PLEASANTRIES)
        elif roll < 0.35:
            content = " ".join(_sentence(rng, j == 0 and rng.random() < 0.5)
                               for j in range(rng.randint(3, 6)))
        else:
            content = _sentence(rng, rng.random() < 0.3)
            if rng.random() < 0.2:
                content = f"{rng.choice((a, b))}, {content[0].lower()}{content[1:]}"
        t += timedelta(minutes=rng.choice((1, 2, 5, 30, 600, 2880)))
        msgs.append({"role": "user" if who == a else "assistant", "content": content,
                     "timestamp": t.isoformat(), "name": who})
    questions = []
    for _ in range(6):
        q = f"What did we say about the {rng.choice(_WORDS)} and {rng.choice(_WORDS)}?"
        questions.append(q)
    questions += [f"What did {a} say about the {rng.choice(_WORDS)}?",
                  f"Which {rng.choice(_WORDS)} did {b} mention?",
                  f"{rng.choice(_WORDS)} {rng.randint(2, 999)}",
                  f"When did {a} and {b} talk about {rng.choice(_WORDS)}?"]
    return msgs, questions


def _windows(msgs: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """Query parameters: plain, small k, time and turn windows, without the re-ranking."""
    n = len(msgs)
    ts = [m.get("timestamp") for m in msgs]
    out: list[dict[str, Any]] = [{"k": 40}, {"k": 5}, {"k": 40, "conversation": False}]
    if all(ts):
        lo, hi = sorted(rng.sample(range(n), 2))
        out.append({"k": 20, "since": _naive(ts[lo]), "until": _naive(ts[hi])})
        out.append({"k": 10, "since": _naive(ts[n // 2])})
    out.append({"k": 10, "last_turns": max(3, n // 3)})
    out.append({"k": 40, "before_turn": n - 4})
    return out


def _naive(ts: str) -> str:
    """An ISO time as naive UTC (the macro's and the lite engine's reading agree on it)."""
    d = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    return d.replace(tzinfo=None).isoformat()


def macro_order(eng: cce_duck.Engine, sid: str, query: str, params: dict[str, Any]) -> list[int]:
    """The macro's turn numbers for one query."""
    names = ["k", "since", "until", "last_turns", "before_turn", "conversation"]
    args = {p: params[p] for p in names if p in params}
    sql = "SELECT turn_no FROM cce_retrieve(?, ?" + "".join(
        f", {p} := ?" for p in args) + ")"
    return [int(r[0]) for r in eng.store.con.execute(sql, [sid, query, *args.values()]).fetchall()]


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def _vectors(eng: cce_duck.Engine, sid: str, questions: list[str]) -> dict[str, Any]:
    con = eng.store.con
    m = con.execute("SELECT turn_no, vector FROM main.message_vectors WHERE session_id = ? "
                    "ORDER BY turn_no", [sid]).fetchall()
    s = con.execute("SELECT turn_no, sent_no, vector FROM main.sentence_vectors "
                    "WHERE session_id = ? ORDER BY turn_no, sent_no", [sid]).fetchall()
    qv = eng.store.embedder.embed(questions, "query")
    return {
        "messages": [[int(t), _b64(np.asarray(v, np.int8))] for t, v in m],
        "sentences": [[int(t), int(j), _b64(np.asarray(v, np.int8))] for t, j, v in s],
        "queries": {q: _b64(np.asarray(v, np.float32)) for q, v in zip(questions, qv, strict=True)},
    }


def case(name: str, embedder: str, msgs: list[dict[str, Any]], questions: list[str],
         seed: int, folder: Path) -> dict[str, Any]:
    """One session through the macro."""
    rng = random.Random(seed)
    sid = name
    queries = []
    with cce_duck.Engine(data_dir=folder / f"{name}-{embedder}", embedder=embedder) as eng:
        eng.ingest(sid, msgs)
        for q in questions:
            for params in _windows(msgs, rng):
                queries.append({"query": q, **params, "expect": macro_order(eng, sid, q, params)})
        vectors = _vectors(eng, sid, questions) if embedder != "hash" else None
    out: dict[str, Any] = {"name": name, "embedder": embedder, "messages": msgs,
                           "queries": queries}
    if vectors is not None:
        out["vectors"] = vectors
    return out


def generate() -> dict[str, Any]:
    """Every case, as the document written to the goldens file."""
    fixture = json.loads(FIXTURE.read_text(encoding="utf-8"))
    sample = json.loads(SAMPLE.read_text(encoding="utf-8"))
    sample_msgs = sample["messages"] if isinstance(sample, dict) else sample
    sessions: list[tuple[str, list[dict[str, Any]], list[str]]] = [
        (sid, msgs, fixture["questions"][sid]) for sid, msgs in fixture["sessions"].items()]
    sessions.append(("sample", sample_msgs, ["Which database did we choose and why?",
                                              "What did Maria say about encryption keys?",
                                              "When is the launch?", "lighthouse"]))
    for seed in (1, 2, 3):
        msgs, qs = random_session(seed, 40 + 25 * seed)
        sessions.append((f"random-{seed}", msgs, qs))
    cases = []
    with tempfile.TemporaryDirectory(prefix="cce-goldens-") as tmp:
        for i, (name, msgs, qs) in enumerate(sessions):
            cases.append(case(name, "hash", msgs, qs, i, Path(tmp)))
        for i, (name, msgs, qs) in enumerate(sessions):
            if name in ("lighthouse", "random-1"):
                cases.append(case(name, "onnx", msgs, qs[:5], 100 + i, Path(tmp)))
    return {
        "about": "Turn numbers the cce_retrieve macro returns, written by "
                 "benchmarks/ranking_goldens.py; read by tests/test_ranking_goldens.py and "
                 "cce_sdk_js/test/ranking_goldens.test.js. Regenerate after changing "
                 "sql/ranking_v1.json.",
        "spec_file": "sql/" + ranking.SPEC_FILE,
        "spec_sha256": ranking.spec().sha256,
        "cases": cases,
    }


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) the goldens file."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="compare with the file, write nothing")
    args = ap.parse_args(argv)
    text = json.dumps(generate(), ensure_ascii=False, separators=(",", ":")) + "\n"
    if args.check:
        same = args.out.is_file() and args.out.read_text(encoding="utf-8") == text
        print("goldens are current" if same else f"{args.out} is out of date: regenerate it")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    n = sum(len(c["queries"]) for c in json.loads(text)["cases"])
    print(f"wrote {args.out} ({len(text) // 1024} KB, {n} queries)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
