"""The Engine facade on real DuckDB: writing, live batching, ingestion, closing, stats, search,
context building."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import BASE_TIME, TOPICS, topic_messages
from hypothesis import given, settings
from hypothesis import strategies as st

from cce_duck import ConflictError, ContextPayload, Engine
from cce_duck.payload import MESSAGE_OVERHEAD
from cce_duck.text import estimate_tokens, split_sentences

HOT = 6
BATCH = 8

LONG_MESSAGE = (
    "I looked into several options for the storage layer this week, and wrote down what I found. "
    "DuckDB is embedded, fast, and needs no separate server process to run on our laptops. "
    "The staging server backup runs every night at 03:15 from the Frankfurt rack. "
    "We could also try SQLite, but its analytical queries are slower for our kind of workload. "
    "Finally, the team agreed to revisit the decision after the first benchmark results come in "
    "next month. Meanwhile Priya compares the pricing pages of three hosted warehouses, writes a "
    "short memo about licence terms, and collects the latency figures from last quarter's load "
    "tests so that everybody can read them before Thursday's architecture review meeting. "
    "Tom will prepare slides about the migration plan and the rollback procedure as well."
)  # longer than a quote may be (QUOTE_MAX_TOKENS), so only its best part is quoted


def _states(eng: Engine, sid: str) -> list[str]:
    return eng.turns(sid)["state"].to_list()


def _note_ranges(eng: Engine, sid: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in eng.notes(sid)[["start_turn", "end_turn"]].rows()]


# -- writing --------------------------------------------------------------------------------


def test_add_message_returns_increasing_turn_numbers(engine: Engine) -> None:
    assert engine.add_message("s", "user", "hello there") == 0
    assert engine.add_message("s", "assistant", "hi, how can I help?") == 1
    assert engine.add_messages("s", [{"role": "user", "content": "a question"},
                                     {"role": "assistant", "content": "an answer"}]) == [2, 3]
    assert engine.add_messages("s", []) == []
    assert engine.add_message("other", "user", "separate numbering") == 0
    assert engine.add_message("s", "system", "be brief", name="ops") == 4
    turns = engine.turns("s")
    assert turns["turn_no"].to_list() == [0, 1, 2, 3, 4]
    assert turns["role"].to_list() == ["user", "assistant", "user", "assistant", "system"]
    assert turns["speaker"].to_list() == [None, None, None, None, "ops"]
    assert turns["content"].to_list()[2] == "a question"


def test_session_handle(engine: Engine) -> None:
    s = engine.session("team-1")
    assert s.add("user", "We picked DuckDB for storage.") == 0
    assert s.add_messages([{"role": "assistant", "content": "Noted."}]) == [1]
    assert s.stats()["turns"].to_list() == [2]
    assert s.context("storage").session_id == "team-1"
    assert s.notes().is_empty()


def test_timestamps_are_stored_as_naive_utc(engine: Engine) -> None:
    engine.add_message("s", "user", "first", timestamp="2024-05-01T09:00:00+02:00")
    engine.add_message("s", "user", "second", timestamp=BASE_TIME)
    ts = engine.turns("s")["ts"].to_list()
    assert ts == [BASE_TIME - timedelta(hours=2), BASE_TIME]


def test_live_batching_creates_notes_once_turns_leave_the_hot_window(
        conversation: list[dict[str, Any]]) -> None:
    with Engine(data_dir=None, embedder="hash", hot_tier_max_turns=HOT,
                live_batch_turns=BATCH) as eng:
        seen_first_note = None
        for n, msg in enumerate(conversation):
            assert eng.add_messages("s", [msg]) == [n]
            states = _states(eng, "s")
            total = n + 1
            assert len(states) == total
            hot_start = max(0, total - HOT)
            # the hot window is verbatim and never compressed while the session is open
            assert states[hot_start:] == ["hot"] * (total - hot_start)
            ranges = _note_ranges(eng, "s")
            compressed = [i for i, s in enumerate(states) if s == "compressed"]
            # compressed turns are exactly the turns covered by notes, from turn 0, contiguous
            assert compressed == [i for a, b in ranges for i in range(a, b + 1)]
            assert compressed == list(range(len(compressed)))
            # everything between the notes and the hot window is pending
            assert states[len(compressed):hot_start] == ["pending"] * (hot_start - len(compressed))
            if total - HOT < BATCH:
                assert ranges == [], f"notes before {BATCH} turns left the hot window"
            if ranges and seen_first_note is None:
                seen_first_note = total
        assert seen_first_note == HOT + BATCH
        # notes follow the topics (each topic is one day later than the previous one)
        assert _note_ranges(eng, "s") == [(0, 3), (4, 7)]
        notes = eng.notes("s")
        assert "vector" not in notes.columns
        assert notes["note_id"].n_unique() == notes.height
        assert "migration" in notes["label"][0]
        assert "budget" in notes["label"][1]


def test_notes_are_written_once(conversation: list[dict[str, Any]]) -> None:
    with Engine(data_dir=None, embedder="hash") as eng:
        for msg in conversation:
            eng.add_messages("s", [msg])
            eng.flush()
            eng.flush()
        ranges = _note_ranges(eng, "s")
        assert len(ranges) == len(set(ranges))
        turns = eng.sql("SELECT turn_no, note_id FROM turns WHERE session_id = 's'")
        assert turns["turn_no"].n_unique() == turns.height == len(conversation)
        mv = eng.sql("SELECT count(*) AS n, count(DISTINCT turn_no) AS d FROM message_vectors")
        assert mv.row(0) == (len(conversation), len(conversation))


def test_ingest_compresses_everything_but_the_hot_window(
        engine: Engine, conversation: list[dict[str, Any]]) -> None:
    assert engine.ingest("s", conversation) == list(range(len(conversation)))
    states = _states(engine, "s")
    hot = engine.config.hot_tier_max_turns
    assert states == ["compressed"] * (len(conversation) - hot) + ["hot"] * hot
    assert _note_ranges(engine, "s") == [(0, 3), (4, 7), (8, 11), (12, 13)]


def test_ingest_is_idempotent(engine: Engine, conversation: list[dict[str, Any]]) -> None:
    engine.ingest("s", conversation)
    notes, turns = engine.notes("s"), engine.turns("s")
    tables = _all_rows(engine)
    assert engine.ingest("s", conversation) == []
    assert engine.notes("s").equals(notes)
    assert engine.turns("s").equals(turns)
    assert _all_rows(engine) == tables


def test_ingest_appends_only_the_new_tail(engine: Engine,
                                          conversation: list[dict[str, Any]]) -> None:
    assert engine.ingest("s", conversation[:10]) == list(range(10))
    assert engine.ingest("s", conversation) == list(range(10, len(conversation)))
    contents = engine.turns("s")["content"].to_list()
    assert contents == [m["content"] for m in conversation]
    ranges = _note_ranges(engine, "s")
    covered = [i for a, b in ranges for i in range(a, b + 1)]
    assert covered == sorted(set(covered)), "a turn belongs to at most one note"


def test_ingest_is_idempotent_on_a_data_folder(data_dir: Path,
                                               conversation: list[dict[str, Any]]) -> None:
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        eng.ingest("s", conversation)
        before = _all_rows(eng)
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        assert eng.ingest("s", conversation) == []
        assert _all_rows(eng) == before


def _all_rows(eng: Engine) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    for table in ("sessions", "turns", "notes", "message_vectors", "sentence_vectors",
                  "postings", "session_summaries"):
        out[table] = sorted(eng.sql(f"SELECT * FROM {table}").rows(), key=repr)
    return out


# -- closing --------------------------------------------------------------------------------


def test_close_session_writes_summary_and_refuses_adds(
        engine: Engine, conversation: list[dict[str, Any]]) -> None:
    engine.ingest("s", conversation)
    assert engine.summary("s") is None
    summary = engine.close_session("s")
    assert summary
    assert engine.summary("s") == summary
    labels = engine.notes("s")["label"].to_list()
    positions = [summary.index(label) for label in labels]
    assert positions == sorted(positions), "the summary lists the topics in order"
    assert set(_states(engine, "s")) == {"compressed"}
    assert engine.stats("s")["status"].to_list() == ["closed"]
    before = _all_rows(engine)
    with pytest.raises(ConflictError, match="closed"):
        engine.add_message("s", "user", "one more thing")
    with pytest.raises(ConflictError):
        engine.ingest("s", [*conversation, {"role": "user", "content": "more"}])
    assert _all_rows(engine) == before
    # reading still works
    assert engine.context("s", "what is the budget?").tokens > 0


def test_closed_session_stays_closed_after_reopening(
        data_dir: Path, conversation: list[dict[str, Any]]) -> None:
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        eng.ingest("s", conversation)
        summary = eng.close_session("s")
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        assert eng.summary("s") == summary
        with pytest.raises(ConflictError):
            eng.add_message("s", "user", "one more thing")
        assert eng.add_message("s2", "user", "a new session works") == 0


# -- stats ----------------------------------------------------------------------------------


def _check_stats(eng: Engine, sid: str) -> dict[str, Any]:
    row = eng.stats(sid).to_dicts()[0]
    (raw,) = eng.sql(
        "SELECT CAST(coalesce(sum(tokens), 0) AS BIGINT) FROM turns WHERE session_id = ?",
        [sid]).row(0)
    (uncompressed,) = eng.sql(
        "SELECT CAST(coalesce(sum(tokens), 0) AS BIGINT) FROM turns "
        "WHERE session_id = ? AND note_id IS NULL",
        [sid]).row(0)
    (note_tokens, n_notes) = eng.sql(
        "SELECT CAST(coalesce(sum(summary_tokens), 0) AS BIGINT), count(*) FROM notes "
        "WHERE session_id = ?",
        [sid]).row(0)
    (n_turns,) = eng.sql("SELECT count(*) FROM turns WHERE session_id = ?", [sid]).row(0)
    assert row["raw_tokens"] == raw
    assert row["turns"] == n_turns
    assert row["notes"] == n_notes
    assert row["note_tokens"] == note_tokens
    assert row["memory_tokens"] == note_tokens + uncompressed
    assert row["hot_turns"] + row["pending_turns"] + row["compressed_turns"] == n_turns
    states = _states(eng, sid)
    assert row["hot_turns"] == states.count("hot")
    assert row["pending_turns"] == states.count("pending")
    assert row["compressed_turns"] == states.count("compressed")
    if row["memory_tokens"] < raw:
        assert row["compression_ratio"] == pytest.approx(raw / row["memory_tokens"], abs=1e-3)
    else:
        assert row["compression_ratio"] is None
    return row


def test_stats_formulas(engine: Engine, conversation: list[dict[str, Any]]) -> None:
    engine.add_message("tiny", "user", "hello")
    tiny = _check_stats(engine, "tiny")
    assert tiny["compression_ratio"] is None
    long = [{**m, "content": m["content"] + " " + " ".join(["filler words here"] * 20)}
            for m in conversation]
    engine.ingest("s", long)
    row = _check_stats(engine, "s")
    assert row["compression_ratio"] is not None
    assert row["compression_ratio"] > 1
    for n, msg in enumerate(conversation[:9]):  # live: some pending, no notes yet
        engine.add_messages("live", [msg])
        assert _check_stats(engine, "live")["turns"] == n + 1
    all_stats = engine.stats()
    assert all_stats["session_id"].to_list() == ["live", "s", "tiny"]


# -- search ---------------------------------------------------------------------------------


def test_search_ranks_a_unique_fact_first(engine: Engine,
                                          conversation: list[dict[str, Any]]) -> None:
    msgs = [*conversation[:6],
            {"role": "user", "content": "The wifi password for the office is ZEBRA-4471."},
            *conversation[6:]]
    engine.ingest("s", msgs)
    hits = engine.search("s", "what is the office wifi password?", k=5)
    assert isinstance(hits, pl.DataFrame)
    assert hits.height == 5
    assert hits["rank"].to_list() == [1, 2, 3, 4, 5]
    assert hits["turn_no"][0] == 6
    assert "ZEBRA-4471" in hits["content"][0]
    for col in ("turn_no", "note_id", "dense", "bm25", "fused", "rank", "content"):
        assert col in hits.columns
    assert hits["fused"].to_list() == sorted(hits["fused"].to_list(), reverse=True)
    # the identifier alone finds it too (BM25 on a distinctive term)
    assert engine.search("s", "ZEBRA-4471", k=3)["turn_no"][0] == 6


def _ingest_with_third_turn(engine: Engine, conversation: list[dict[str, Any]], role: str,
                           content: str) -> None:
    """The conversation with ``content`` said as turn 2."""
    engine.ingest("s", [*conversation[:2],
                        {"role": role, "content": content, "timestamp": conversation[1]["timestamp"]},
                        *conversation[2:]])


def _turn_2_in_context(engine: Engine, question: str) -> tuple[pl.DataFrame, list[str], str]:
    """Search hits for ``question``, the quotes of turn 2 in its context, the context text."""
    hits = engine.search("s", question, k=3)
    payload = engine.context("s", question, max_tokens=150)  # below the history: quotes
    quotes = [q["text"] for n in payload.notes for q in n["quotes"] if q["turn_no"] == 2]
    return hits, quotes, payload.to_string()


def _sentence_rows(engine: Engine) -> list[tuple[Any, ...]]:
    return engine.sql("SELECT sent_no, start_char, end_char FROM sentence_vectors "
                      "WHERE turn_no = 2 ORDER BY sent_no").rows()


def test_fact_inside_a_long_message_is_quoted_on_its_own(
        engine: Engine, conversation: list[dict[str, Any]]) -> None:
    sentences = split_sentences(LONG_MESSAGE)
    assert len(sentences) >= 4
    assert estimate_tokens(LONG_MESSAGE) >= 24
    fact = sentences[2].text
    assert "03:15" in fact
    _ingest_with_third_turn(engine, conversation, "assistant", LONG_MESSAGE)
    assert engine.turns("s").filter(pl.col("turn_no") == 2)["state"][0] == "compressed"
    assert len(_sentence_rows(engine)) == len(sentences)

    hits, quotes, text_sent = _turn_2_in_context(engine, "when does the staging server backup run?")
    assert hits["turn_no"][0] == 2
    assert hits["best_sentence"][0] == 2
    assert len(quotes) == 1
    text = quotes[0]
    assert fact in text
    assert text != LONG_MESSAGE
    assert sentences[0].text not in text
    assert len(text) < len(LONG_MESSAGE) / 2
    assert fact in text_sent
    assert LONG_MESSAGE not in text_sent


CHEERFUL = ("Oh wow! I finally booked the overnight ferry to Santorini for the third of June, "
            "leaving Piraeus at seven in the evening. The cabin has two bunks and a small window "
            "facing the sea. Thanks! See you.")
FERRY = "When does the ferry to Santorini leave?"


def test_pleasantries_get_no_sentence_vector_and_stay_out_of_quotes(
        engine: Engine, conversation: list[dict[str, Any]]) -> None:
    sentences = split_sentences(CHEERFUL)
    assert sentences[0].text == "Oh wow!"
    assert len(sentences) == 5
    _ingest_with_third_turn(engine, conversation, "user", CHEERFUL)
    rows = _sentence_rows(engine)
    # positions among the message's sentences: 0 ("Oh wow!"), 3 and 4 are pleasantries
    assert [r[0] for r in rows] == [1, 2]
    assert [CHEERFUL[a:z] for _, a, z in rows] == [sentences[1].text, sentences[2].text]

    hits, quotes, _ = _turn_2_in_context(engine, FERRY)
    assert hits["turn_no"][0] == 2
    assert hits["best_sentence"][0] == 1
    assert quotes == [f"{sentences[1].text} {sentences[2].text}"]
    assert estimate_tokens(quotes[0]) < estimate_tokens(CHEERFUL)


def test_a_message_of_substance_only_is_quoted_whole(engine: Engine,
                                                     conversation: list[dict[str, Any]]) -> None:
    plain = CHEERFUL.replace("Oh wow! ", "").replace(" Thanks! See you.", "")
    _ingest_with_third_turn(engine, conversation, "user", plain)
    assert [r[0] for r in _sentence_rows(engine)] == [0, 1]
    assert _turn_2_in_context(engine, FERRY)[1] == [plain]


# -- context --------------------------------------------------------------------------------


def test_overview_question_returns_topics_in_order(
        engine: Engine, conversation: list[dict[str, Any]]) -> None:
    engine.ingest("s", conversation)
    overview = engine.overview("s")
    assert overview["start_turn"].to_list() == [0, 4, 8, 12]
    payload = engine.context("s", "what did we talk about?", max_tokens=267)  # history: 268
    assert [n["start_turn"] for n in payload.notes] == [0, 4, 8, 12]
    text = payload.to_string()
    positions = [text.index(label) for label in overview["label"].to_list()]
    assert positions == sorted(positions)
    assert payload.tokens <= 267
    # the hot turns are still there verbatim, in order
    assert [t.turn_no for t in payload.turns] == list(range(14, 20))


def test_fact_question_retrieves_the_right_topic(
        engine: Engine, conversation: list[dict[str, Any]]) -> None:
    engine.ingest("s", conversation)
    payload = engine.context("s", "who brings the barbecue grill?", max_tokens=200, explain=True)
    assert payload.notes
    assert any("Marta" in q["text"] for n in payload.notes for q in n["quotes"])
    assert payload.explain is not None
    assert payload.explain["budget"]["max_tokens"] == 200
    assert payload.explain["budget"]["used"] == payload.tokens
    assert payload.explain["overview"] is False
    assert payload.explain["hits"]


def test_context_payload_forms(engine: Engine, conversation: list[dict[str, Any]]) -> None:
    engine.ingest("s", conversation)
    payload = engine.context("s", "what is the ACME budget?", max_tokens=200)  # history: 268
    assert isinstance(payload, ContextPayload)
    assert payload.session_id == "s"
    assert payload.query == "what is the ACME budget?"
    assert payload.memory

    messages = payload.to_messages()
    assert messages[0] == {"role": "system", "content": payload.memory}
    assert [m["content"] for m in messages[1:]] == [t.content for t in payload.turns]
    assert [m["role"] for m in messages[1:]] == [t.role for t in payload.turns]
    assert sum(estimate_tokens(m["content"]) + MESSAGE_OVERHEAD for m in messages) \
        <= payload.tokens

    text = payload.to_string()
    assert text.startswith(payload.memory)
    for t in payload.turns:
        assert f"{t.role}: {t.content}" in text
    assert estimate_tokens(text) <= payload.tokens <= 200

    d = payload.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["tokens"] == payload.tokens
    assert d["messages"] == messages
    assert d["memory"] == payload.memory
    assert [t["turn_no"] for t in d["turns"]] == [t.turn_no for t in payload.turns]
    stats = engine.stats("s").row(0, named=True)
    # the full history as messages (every turn's tokens plus the per-message overhead), which
    # costs more than its "role: text" lines here
    assert d["full_tokens"] == stats["raw_tokens"] + MESSAGE_OVERHEAD * stats["turns"]
    assert d["pin_tokens"] == 0
    assert d["verbatim"] is False
    assert d["tokens_saved"] == d["full_tokens"] - d["tokens"] > 0


def test_context_of_a_fresh_session_is_just_the_turns(engine: Engine) -> None:
    engine.add_message("s", "user", "We picked DuckDB for storage.", name="ana")
    payload = engine.context("s", "storage?")
    assert payload.memory == ""
    assert payload.notes == []
    assert payload.to_messages() == [{"role": "user", "content": "We picked DuckDB for storage.",
                                      "name": "ana"}]
    assert "ana: We picked DuckDB for storage." in payload.to_string()


def test_context_respects_last_turns_and_time_filters(
        engine: Engine, conversation: list[dict[str, Any]]) -> None:
    engine.ingest("s", conversation)
    payload = engine.context("s", "budget", last_turns=3)
    # the window fits the budget: its turns are sent as they are
    assert [t.turn_no for t in payload.turns] == [17, 18, 19]
    assert payload.verbatim
    assert payload.notes == []
    day2 = BASE_TIME + timedelta(days=1)
    payload = engine.context("s", "budget travel", since=day2, until=day2 + timedelta(hours=1))
    assert [t.turn_no for t in payload.turns] == [4, 5, 6, 7]
    # a budget below the window's size: quotes from inside the window only
    payload = engine.context("s", "budget travel", since=day2, until=day2 + timedelta(hours=1),
                             max_tokens=40)
    assert payload.turns == []
    quoted = [q["turn_no"] for n in payload.notes for q in n["quotes"]]
    assert quoted
    assert set(quoted) <= {4, 5, 6, 7}


def test_many_sessions_do_not_mix(engine: Engine) -> None:
    engine.ingest("a", topic_messages([TOPICS[0], TOPICS[1]]))
    engine.ingest("b", topic_messages([TOPICS[2], TOPICS[3]]))
    payload = engine.context("b", "budget ACME euros")
    assert "ACME" not in payload.to_string()
    hits = engine.search("a", "garden barbecue", k=20)
    assert set(hits["turn_no"].to_list()) <= set(range(8))
    assert set(engine.sessions()["session_id"].to_list()) == {"a", "b"}


_words = st.sampled_from(["duckdb", "budget", "garden", "piano", "the", "ACME", "40000", "東京",
                          "trip", "hiking", "notes", "?", "."])
_messages = st.lists(
    st.fixed_dictionaries({
        "role": st.sampled_from(["user", "assistant"]),
        "content": st.lists(_words, min_size=1, max_size=30).map(" ".join),
    }), min_size=1, max_size=40)


@settings(max_examples=30, deadline=None)
@given(messages=_messages, cut=st.integers(min_value=0, max_value=40))
def test_ingest_property(messages: list[dict[str, Any]], cut: int) -> None:
    """Ingesting a prefix then the whole history equals the history once; again adds nothing."""
    with Engine(data_dir=None, embedder="hash", hot_tier_max_turns=3, live_batch_turns=4) as eng:
        eng.ingest("s", messages[:cut])
        eng.ingest("s", messages)
        tables = _all_rows(eng)
        assert eng.ingest("s", messages) == []
        assert _all_rows(eng) == tables
        turns = eng.turns("s")
        assert turns["turn_no"].to_list() == list(range(len(messages)))
        assert turns["content"].to_list() == [m["content"] for m in messages]
        ranges = _note_ranges(eng, "s")
        covered = [i for a, b in ranges for i in range(a, b + 1)]
        assert covered == list(range(len(covered))), "notes tile the compressed turns"
        states = turns["state"].to_list()
        assert states.count("compressed") == len(covered)
        assert "pending" not in states, "ingest compresses everything older than the hot window"
