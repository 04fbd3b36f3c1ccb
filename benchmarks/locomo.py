"""Retrieval quality of cce_duck on LoCoMo conversations, against raw-turn baselines.

    python benchmarks/locomo.py [DATA.json] [--budget 1000] [--json out.json]
    python benchmarks/locomo.py --budgets 250,500,1000,2000,4000 --json sweep.json

Every conversation is ingested into one engine as a live session, one ``add_message`` at a time
with its real time and speaker names. Then every question of categories 1-4 gets a context from
the engine (``Engine.context`` under the token budget) and from the raw-turn baselines of
``baselines.py`` under the same budget; each context is scored by ``scoring.py``. The report is
a table on stdout and, with ``--json``, a file other scripts read (see ``benchmarks/README.md``).

With ``--split-sessions`` each conversation is also ingested as one user whose LoCoMo sessions
(``session_N``) are separate engine sessions, live, with the same times; every question is then
asked at user scope (``Engine.user_context``) from a new, empty session of that user, and scored
as the system ``cce_duck_user`` beside the single-session run and the baselines (which rank all
of the user's turns).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from baselines import BASELINES, RawTurn, TurnIndex
from locomo_data import Conversation, load
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from scoring import (
    ANSWER_CATEGORIES,
    CATEGORIES,
    answer_present,
    content_words,
    evidence_ids,
    evidence_present,
)

import cce_duck
from cce_duck import estimate_tokens
from cce_duck.text import terms

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = (HERE.parent / ".." / "shared" / "data" / "locomo_dev.json").resolve()
SYSTEMS: tuple[str, ...] = ("cce_duck", "cce_duck_user", *BASELINES)
DEFAULT_SWEEP = (250, 500, 1000, 2000, 4000)


# -- per-question records ------------------------------------------------------


class Tally:
    """Scores of every (budget, system, category), averaged into the report's shape."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, str], dict[str, dict[int, list[float]]]] = defaultdict(
            lambda: {"evidence_recall": defaultdict(list), "answer_recall": defaultdict(list),
                     "tokens": defaultdict(list)})

    def add(self, budget: int, system: str, category: int, evidence: float | None,
            answer: float | None, tokens: int) -> None:
        """Record one question's scores (``None``: not scored for this question)."""
        row = self.rows[(budget, system)]
        if evidence is not None:
            row["evidence_recall"][category].append(evidence)
        if answer is not None:
            row["answer_recall"][category].append(answer)
        row["tokens"][category].append(float(tokens))

    def systems(self, budget: int) -> dict[str, Any]:
        """``{NAME: {"overall": {...}, "by_category": {"1": {...}, ...}}}`` at ``budget``."""
        out: dict[str, Any] = {}
        for system in SYSTEMS:
            if (budget, system) not in self.rows:
                continue
            row = self.rows[(budget, system)]
            out[system] = {
                "overall": {k: _mean([v for c in CATEGORIES for v in row[k][c]]) for k in row},
                "by_category": {str(c): {k: _mean(row[k][c]) for k in row} for c in CATEGORIES
                                if row["tokens"][c]},
            }
        return out


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def score(text: str, evidence: list[set[str]], answer: set[str] | None
          ) -> tuple[float | None, float | None, list[bool]]:
    """Evidence recall, answer recall and which evidence turns are present, for one context."""
    words = content_words(text)
    present = [evidence_present(ev, words) for ev in evidence]
    ev = sum(present) / len(present) if present else None
    ans = None if answer is None else float(answer_present(answer, words))
    return ev, ans, present


# -- the run -------------------------------------------------------------------


def select(convs: list[Conversation], ids: str | None, limit: int | None) -> list[Conversation]:
    """The conversations asked for (by ``sample_id``, then the first ``limit``)."""
    if ids:
        wanted = [s.strip() for s in ids.split(",") if s.strip()]
        known = {c.sample_id for c in convs}
        missing = [s for s in wanted if s not in known]
        if missing:
            raise SystemExit(f"unknown conversation(s): {', '.join(missing)}")
        convs = [c for c in convs if c.sample_id in wanted]
    return convs[:limit] if limit else convs


def spread(items: list[Any], n: int | None) -> list[Any]:
    """``n`` items evenly spaced over ``items`` (all of them when ``n`` is ``None`` or larger)."""
    if n is None or n >= len(items):
        return items
    return [items[i * len(items) // n] for i in range(n)]


def session_id(conv: Conversation, n: int) -> str:
    """A valid session id for a conversation (its ``sample_id`` when it is one)."""
    sid = "".join(ch if ch.isalnum() or ch in "_.-" else "_" for ch in conv.sample_id)[:64]
    return sid if sid.strip("._") else f"conversation_{n}"


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Ingest, ask, score; return the results document."""
    convs = select(load(args.data), args.conversations, args.limit)
    budgets = args.budgets or [args.budget]
    tally = Tally()
    counts: dict[str, int] = defaultdict(int)
    timing: dict[str, float] = defaultdict(float)
    details = args.details.open("w", encoding="utf-8") if args.details else None
    questions = {id(c): spread([q for q in c.qa if q.get("category") in CATEGORIES], args.questions)
                 for c in convs}
    n_msgs = sum(len(c.messages) for c in convs)
    n_q = sum(len(v) for v in questions.values())
    started = time.perf_counter()
    commit = _git_commit()  # before the run: the tree may move while it runs
    reused: list[str] = []
    with tempfile.TemporaryDirectory(prefix="cce-locomo-") as tmp, \
            Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                     TimeElapsedColumn(), console=console) as progress:
        root = args.data_dir or Path(tmp)
        embedder_name = args.embedder
        config_doc: dict[str, str] = {}
        t_ingest = progress.add_task("ingest (live)", total=n_msgs)
        t_ask = progress.add_task("questions", total=n_q)
        for n, conv in enumerate(convs):
            sid = session_id(conv, n)
            folder = root / f"{embedder_name}-{sid}"
            marker = folder / "ingested.json"
            previous = _ingested(marker, conv, args.embedder)
            if previous is None and folder.exists():
                shutil.rmtree(folder)  # an unfinished or outdated ingestion: start again
            with cce_duck.Engine(data_dir=folder, embedder=args.embedder) as eng:
                embedder = eng.store.embedder
                embedder_name = embedder.name
                config_doc = {k: str(v) for k, v in asdict(eng.config).items() if k != "data_dir"}
                if previous is not None:
                    turn_nos = previous
                    reused.append(conv.sample_id)
                    progress.advance(t_ingest, len(conv.messages))
                else:
                    t0 = time.perf_counter()
                    turn_nos = []
                    for i, m in enumerate(conv.messages):
                        turn_nos.append(eng.add_message(sid, m["role"], m["content"],
                                                        timestamp=m["timestamp"], name=m["name"]))
                        if i % 50 == 49:
                            progress.advance(t_ingest, 50)
                    eng.flush()
                    timing["ingest_s"] += time.perf_counter() - t0
                    progress.advance(t_ingest, len(conv.messages) % 50)
                    if args.data_dir:
                        marker.write_text(json.dumps({
                            "sample_id": conv.sample_id, "embedder": args.embedder,
                            "messages": len(conv.messages), "git_commit": commit,
                            "terms_probe": _TERMS_PROBE,
                            "turn_nos": turn_nos}), encoding="utf-8")
                user_eng = None
                if args.split_sessions:
                    split = root / f"{embedder_name}-{sid}-split"
                    shutil.rmtree(split, ignore_errors=True)  # ingested afresh every run
                    user_eng = cce_duck.Engine(data_dir=split, embedder=args.embedder)
                    t0 = time.perf_counter()
                    for m in conv.messages:
                        user_eng.add_message(f"{sid}-s{m['session']}"[:64], m["role"],
                                             m["content"], timestamp=m["timestamp"],
                                             name=m["name"], user_id=sid)
                    user_eng.flush()
                    timing["ingest_split_s"] += time.perf_counter() - t0
                turns = [RawTurn(i, m["name"], m["content"], m["timestamp"])
                         for i, m in enumerate(conv.messages)]
                by_dia = {m["dia_id"]: i for i, m in enumerate(conv.messages) if m.get("dia_id")}
                t0 = time.perf_counter()
                index = TurnIndex(turns, embedder)
                timing["baseline_index_s"] += time.perf_counter() - t0
                full_tokens = estimate_tokens(index.full_text)
                full_words = content_words(index.full_text)
                for qa in questions[id(conv)]:
                    ask(eng, sid, conv, qa, index, by_dia, budgets, full_tokens, full_words, tally,
                        counts, timing, details, turn_nos, user_eng)
                    progress.advance(t_ask)
                if user_eng is not None:
                    user_eng.close()
    if details:
        details.close()
    return {
        "benchmark": "locomo",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cce_duck_version": cce_duck.__version__,
        "python": platform.python_version(), "platform": platform.platform(),
        "git_commit": commit,
        "command": " ".join(["python", "benchmarks/locomo.py", *sys.argv[1:]]),
        "wall_s": round(time.perf_counter() - started, 1),
        "config": {
            "data": str(args.data), "conversations": [c.sample_id for c in convs],
            "budgets": budgets, "embedder": embedder_name, "categories": list(CATEGORIES),
            "answer_categories": list(ANSWER_CATEGORIES),
            "questions_per_conversation": args.questions,
            "token_counter": "cce_duck.estimate_tokens on the context text (Engine: "
                             "ContextPayload.to_string())",
            "baselines": "whole turns 'speaker: text' under a [YYYY-MM-DD] line per day, "
                         "conversation order; bm25 = rank_bm25 BM25Okapi + Snowball stems; "
                         "dense = the engine's embedder; hybrid = RRF k=60",
            "engine_config": config_doc,
            "reused_ingestion": reused,
            "split_sessions": bool(args.split_sessions),
        },
        "counts": {"messages": n_msgs, "questions": n_q, **dict(counts)},
        "timing_s": {k: round(v, 2) for k, v in timing.items()},
        "budgets": {str(b): {"systems": tally.systems(b)} for b in budgets},
    }


# Stored terms depend on the stemmer: an ingestion made with other terms is not reused.
_TERMS_PROBE = " ".join(terms("Caroline's friends were running happily to the libraries generously"))


def _ingested(marker: Path, conv: Conversation, embedder: str) -> list[int] | None:
    """The turn numbers of a finished ingestion of ``conv`` kept in ``marker``'s folder, if any."""
    try:
        doc = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (doc.get("sample_id") != conv.sample_id or doc.get("embedder") != embedder
            or doc.get("messages") != len(conv.messages) or doc.get("terms_probe") != _TERMS_PROBE):
        return None
    return [int(t) for t in doc["turn_nos"]]


def ask(eng: cce_duck.Engine, sid: str, conv: Conversation, qa: dict[str, Any], index: TurnIndex,
        by_dia: dict[str, int], budgets: list[int], full_tokens: int, full_words: set[str],
        tally: Tally, counts: dict[str, int], timing: dict[str, float], details: Any,
        turn_nos: list[int], user_eng: cce_duck.Engine | None = None) -> None:
    """Score one question for every system and budget."""
    cat = int(qa["category"])
    counts[f"category_{cat}"] += 1
    ev_turns: list[int] = []
    for did in evidence_ids(qa.get("evidence") or []):
        if did not in by_dia:
            counts["evidence_ids_unknown"] += 1
        elif not content_words(index.turns[by_dia[did]].text):
            counts["evidence_turns_without_content_words"] += 1
        else:
            ev_turns.append(by_dia[did])
    evidence = [content_words(index.turns[i].text) for i in ev_turns]
    answer: set[str] | None = None
    if cat in ANSWER_CATEGORIES:
        answer = content_words(str(qa.get("answer", "")))
        if not answer:
            counts["answers_without_content_words"] += 1
            answer = None
    if not evidence:
        counts["questions_without_scorable_evidence"] += 1
    question = str(qa["question"])

    # full history: one context, whatever the budget
    words = full_words
    f_ev = [evidence_present(ev, words) for ev in evidence]
    f_score = (sum(f_ev) / len(f_ev) if f_ev else None,
               None if answer is None else float(answer_present(answer, words)))
    t0 = time.perf_counter()
    rankings = index.rankings(question)
    timing["baseline_rank_s"] += time.perf_counter() - t0
    for budget in budgets:
        tally.add(budget, "full", cat, *f_score, full_tokens)
        t0 = time.perf_counter()
        payload = eng.context(sid, question, max_tokens=budget, explain=details is not None)
        timing["cce_duck_context_s"] += time.perf_counter() - t0
        texts = {"cce_duck": payload.to_string()}
        if user_eng is not None:  # the same question from a new, empty session of the user
            t0 = time.perf_counter()
            user_payload = user_eng.user_context(
                sid, question, session_id=f"{sid}-ask"[:64], max_tokens=budget,
                explain=details is not None)
            texts["cce_duck_user"] = user_payload.to_string()
            timing["cce_duck_user_context_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        texts.update(index.contexts(rankings, budget))
        timing["baseline_context_s"] += time.perf_counter() - t0
        record: dict[str, Any] = {}
        for system, text in texts.items():
            tokens = estimate_tokens(text)
            ev, ans, present = score(text, evidence, answer)
            tally.add(budget, system, cat, ev, ans, tokens)
            record[system] = {"evidence": present, "answer": ans, "tokens": tokens}
        if details is not None:
            record["cce_duck"].update(context=texts["cce_duck"], explain=payload.explain,
                                      payload_tokens=payload.tokens)
            if user_eng is not None:
                record["cce_duck_user"].update(context=texts["cce_duck_user"],
                                               explain=user_payload.explain)
            details.write(json.dumps({
                "conversation": conv.sample_id, "session_id": sid, "budget": budget,
                "category": cat, "question": question, "answer": qa.get("answer"),
                "evidence_turns": ev_turns, "evidence_text": [index.turns[i].text for i in ev_turns],
                "evidence_engine_turns": [turn_nos[i] for i in ev_turns],
                "systems": record,
            }, default=str) + "\n")


# -- report --------------------------------------------------------------------


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def print_table(console: Console, doc: dict[str, Any]) -> None:
    """One table per budget: evidence and answer recall (%) per category, mean tokens."""
    blocks = doc["budgets"] if "budgets" in doc else {str(doc["budget"]): doc}
    for budget, block in blocks.items():
        table = Table(title=f"LoCoMo, budget {budget} tokens: evidence recall % (ev) and answer "
                            f"recall % (ans) by category, mean context tokens")
        table.add_column("system")
        cats = sorted({c for s in block["systems"].values() for c in s["by_category"]})
        ans_cats = [c for c in cats if int(c) in ANSWER_CATEGORIES]
        for c in cats:
            table.add_column(f"ev {c}", justify="right")
        table.add_column("ev all", justify="right", style="bold")
        for c in ans_cats:
            table.add_column(f"ans {c}", justify="right")
        table.add_column("ans all", justify="right", style="bold")
        table.add_column("tokens", justify="right")
        for name, s in block["systems"].items():
            by = s["by_category"]
            table.add_row(name, *[_pct(by[c]["evidence_recall"]) for c in cats],
                          _pct(s["overall"]["evidence_recall"]),
                          *[_pct(by[c]["answer_recall"]) for c in ans_cats],
                          _pct(s["overall"]["answer_recall"]), f"{s['overall']['tokens']:,.0f}")
        console.print(table)
    console.print(f"{doc['counts']['questions']} questions, {doc['counts']['messages']} messages, "
                  f"embedder {doc['config']['embedder']}, cce_duck {doc['cce_duck_version']}, "
                  f"{doc['date']}, {doc['wall_s']} s")


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _budgets(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}"
                                         ) from None
    if not out or any(b <= 0 for b in out):
        raise argparse.ArgumentTypeError("budgets must be positive integers")
    return sorted(set(out))


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return v


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print the table and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="?", type=Path,
                    default=Path(os.environ.get("CCE_LOCOMO", DEFAULT_DATA)),
                    help="LoCoMo JSON file (default ../shared/data/locomo_dev.json)")
    ap.add_argument("--budget", type=_positive, default=1000, help="token budget (default 1000)")
    ap.add_argument("--budgets", type=_budgets, default=None,
                    help=f"comma-separated budgets for a sweep, e.g. "
                         f"{','.join(map(str, DEFAULT_SWEEP))} (overrides --budget)")
    ap.add_argument("--embedder", default="onnx", help="engine and dense embedder (default onnx)")
    ap.add_argument("--conversations", default=None, help="comma-separated sample_ids")
    ap.add_argument("--limit", type=_positive, default=None, help="only the first N conversations")
    ap.add_argument("--questions", type=_positive, default=None,
                    help="only N questions (categories 1-4) of each conversation, evenly spread")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="keep each conversation's engine folder here and reuse a finished "
                         "ingestion of the same conversation and embedder (context-only "
                         "experiments; delete the folder after changing how messages are stored)")
    ap.add_argument("--split-sessions", action="store_true",
                    help="also ingest each conversation as one user with one engine session per "
                         "LoCoMo session and ask at user scope (system cce_duck_user)")
    ap.add_argument("--details", type=Path, default=None,
                    help="write one JSON line per question and budget (contexts, explain)")
    args = ap.parse_args(argv)
    if not args.data.is_file():
        ap.error(f"no such file: {args.data}")
    if args.embedder not in cce_duck.available_embedders():
        ap.error(f"embedder not installed: {args.embedder} "
                 f"(have {', '.join(cce_duck.available_embedders())})")
    console = Console(width=None if sys.stdout.isatty() else max(132, shutil.get_terminal_size().columns))
    doc = run(args, console)
    if len(doc["budgets"]) == 1:  # one budget: the systems block sits at the top, as documented
        (budget, block), = doc.pop("budgets").items()
        doc = {**doc, "budget": int(budget), "systems": block["systems"]}
    print_table(console, doc)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        console.print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
