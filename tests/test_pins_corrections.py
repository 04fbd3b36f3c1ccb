"""Pins and corrections on real DuckDB stores."""

from __future__ import annotations

from typing import Any

import pytest

from cce_duck import Engine, NotFoundError, ValidationError
from cce_duck.text import estimate_tokens
from cce_duck.text import terms as text_terms


@pytest.fixture
def eng(engine: Engine, conversation: list[dict[str, Any]]) -> Engine:
    engine.ingest("s", conversation)
    return engine


def _postings(eng: Engine, turn: int) -> set[str]:
    return {r[0] for r in eng.sql("SELECT term FROM postings WHERE session_id = 's' AND turn_no = ?",
                                  [turn]).rows()}


# -- pins -------------------------------------------------------------------------------------

def test_pin_text_and_turn_listed_updated_removed(eng: Engine) -> None:
    a = eng.pin("s", "Always answer in French.")
    b = eng.pin("s", turn=5)
    df = eng.pins("s")
    assert df.columns[:4] == ["pin_id", "text", "turn", "created_at"]
    assert df["pin_id"].to_list() == [a, b]
    assert df["text"][0] == "Always answer in French."
    assert df["text"][1] == "assistant: The budget covers two engineers for three months."
    assert df["turn"].to_list() == [None, 5]
    eng.update_pin("s", a, "Always answer in German.")
    assert eng.pins("s")["text"][0] == "Always answer in German."
    eng.unpin("s", b)
    assert eng.pins("s")["pin_id"].to_list() == [a]


def test_pins_come_first_in_every_context(eng: Engine) -> None:
    eng.pin("s", "PINNED-RULE answer briefly.")
    for q in ("piano lessons", "what did we talk about?", "garden party grill"):
        ctx = eng.context("s", q, max_tokens=200)  # below the history (268 tokens)
        assert ctx.pins == ["PINNED-RULE answer briefly."]
        memory = ctx.to_messages()[0]["content"]
        lines = memory.splitlines()
        assert lines[1] == "Pinned:"
        assert lines[2] == "- PINNED-RULE answer briefly."
        # the history fits: the pins, then every turn as it is
        ctx = eng.context("s", q, max_tokens=400)
        assert ctx.verbatim
        assert ctx.to_messages()[0]["content"].splitlines() == [
            "Pinned:", "- PINNED-RULE answer briefly."]
        assert len(ctx.turns) == 20


@pytest.mark.parametrize("max_tokens", [120, 200, 400, 600])
def test_pins_use_at_most_a_quarter_of_the_budget(eng: Engine, max_tokens: int) -> None:
    for i in range(12):
        eng.pin("s", f"Rule {i}: " + "keep every invoice for seven years " * 4)
    ctx = eng.context("s", "budget", max_tokens=max_tokens, explain=True)
    assert not ctx.verbatim  # the history (268 tokens) and the pins (~350) do not fit
    used = sum(estimate_tokens(f"- {p}") + 1 for p in ctx.pins)
    assert used <= max_tokens // 4
    assert ctx.explain is not None
    assert ctx.explain["budget"]["pins"] <= max_tokens // 4
    assert ctx.tokens <= max_tokens
    assert 0 < len(ctx.pins) < 12 or max_tokens < 160


def test_pin_bad_input(eng: Engine) -> None:
    with pytest.raises(NotFoundError):
        eng.pin("nobody", "text")
    with pytest.raises(NotFoundError):
        eng.pin("s", turn=999)
    with pytest.raises(ValidationError):
        eng.pin("s")
    with pytest.raises(ValidationError):
        eng.pin("s", "text", turn=1)
    with pytest.raises(ValidationError):
        eng.pin("s", "   ")
    with pytest.raises(ValidationError):
        eng.pin("s", turn=-1)
    with pytest.raises(NotFoundError):
        eng.update_pin("s", 12345, "x")
    with pytest.raises(NotFoundError):
        eng.unpin("s", 12345)
    p = eng.pin("s", "mine")
    eng.ingest("other", [{"role": "user", "content": "hello"}])
    with pytest.raises(NotFoundError):
        eng.unpin("other", p)  # a pin of another session
    with pytest.raises(ValidationError):
        eng.update_pin("s", p, "")
    assert eng.pins("s")["text"].to_list() == ["mine"]
    assert eng.pins("other").height == 0


# -- corrections ------------------------------------------------------------------------------

def test_edit_note_label_and_summary(eng: Engine) -> None:
    nid = int(eng.notes("s")["note_id"][1])
    eng.edit_note("s", nid, label="project budget")
    row = eng.notes("s").filter(note_id=nid)
    assert row["label"][0] == "project budget"
    eng.edit_note("s", nid, summary="The ACME budget is 40000 euros, no travel.")
    row = eng.notes("s").filter(note_id=nid)
    assert row["label"][0] == "project budget"
    assert row["summary"][0] == "The ACME budget is 40000 euros, no travel."
    assert row["summary_tokens"][0] == estimate_tokens("The ACME budget is 40000 euros, no travel.")
    ov = eng.overview("s").filter(note_id=nid)
    assert ov["label"][0] == "project budget"
    with pytest.raises(NotFoundError):
        eng.edit_note("s", 9999, label="x")
    with pytest.raises(ValidationError):
        eng.edit_note("s", nid)
    with pytest.raises(ValidationError):
        eng.edit_note("s", nid, label=" ")


def stem(word: str) -> str:
    return text_terms(word)[0]


def test_edit_turn_new_words_found_old_words_gone(eng: Engine) -> None:
    turn = 11  # "Marta brings the grill and the charcoal."
    pin = eng.pin("s", turn=turn)
    assert stem("marta") in _postings(eng, turn)
    old_vec = eng.sql("SELECT vector FROM message_vectors WHERE session_id='s' AND turn_no=?",
                      [turn]).rows()[0][0]
    eng.edit_turn("s", turn, "Jorge brings the smoker and the wood pellets.")
    terms = _postings(eng, turn)
    assert stem("jorge") in terms
    assert stem("smoker") in terms
    assert stem("marta") not in terms
    assert stem("charcoal") not in terms
    new_vec = eng.sql("SELECT vector FROM message_vectors WHERE session_id='s' AND turn_no=?",
                      [turn]).rows()[0][0]
    assert new_vec != old_vec
    hits = eng.search("s", "Jorge smoker pellets", k=3)
    assert hits["turn_no"][0] == turn
    assert hits["bm25"][0] > 0
    old = eng.search("s", "Marta charcoal", k=20)
    assert old.filter(turn_no=turn)["bm25"].to_list() in ([], [0.0])
    row = eng.turns("s").filter(turn_no=turn)
    assert row["content"][0] == "Jorge brings the smoker and the wood pellets."
    assert row["tokens"][0] == estimate_tokens("Jorge brings the smoker and the wood pellets.")
    # nothing derived still carries the old words: note, micro line, pin, full-text of any table
    note_id = row["note_id"][0]
    note = eng.notes("s").filter(note_id=note_id)
    assert "Marta" not in note["summary"][0]
    assert "marta" not in note["label"][0]
    assert "Marta" not in row["micro"][0]
    assert eng.pins("s").filter(pin_id=pin)["text"][0].endswith("Jorge brings the smoker and "
                                                               "the wood pellets.")
    for table in ("turns", "notes", "pins", "postings", "session_summaries"):
        dump = str(eng.sql(f"SELECT * FROM {table}").rows()).lower()
        assert "marta" not in dump, table
        assert "charcoal" not in dump, table
    ctx = eng.context("s", "who brings the smoker?", max_tokens=400)
    assert "Jorge brings the smoker" in ctx.to_string()


def test_edit_turn_updates_closed_session_summary(engine: Engine,
                                                  conversation: list[dict[str, Any]]) -> None:
    engine.ingest("c", conversation[:8])
    engine.close_session("c")
    before = engine.summary("c")
    assert before is not None
    assert "40000" in before
    engine.edit_turn("c", 4, "Now the budget: the ACME project has 55000 euros.")
    after = engine.summary("c")
    assert after is not None
    assert "40000" not in after
    assert "40000" not in str(engine.notes("c").rows())


def test_edit_turn_bad_input(eng: Engine) -> None:
    with pytest.raises(NotFoundError):
        eng.edit_turn("s", 999, "x")
    with pytest.raises(NotFoundError):
        eng.edit_turn("nobody", 1, "x")
    with pytest.raises(ValidationError):
        eng.edit_turn("s", 1, "")
    with pytest.raises(ValidationError):
        eng.edit_turn("s", "1", "text")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        eng.edit_turn("s", True, "text")  # type: ignore[arg-type]


def test_every_change_moves_the_session_forward(eng: Engine) -> None:
    """Caches keyed on (updated_at, next_turn) must see pins, corrections and forgetting."""

    def stamp() -> Any:
        return eng.sessions().filter(session_id="s")["updated_at"][0]

    nid = int(eng.notes("s")["note_id"][0])
    changes = [
        lambda: eng.pin("s", "p"),
        lambda: eng.update_pin("s", int(eng.pins("s")["pin_id"][0]), "q"),
        lambda: eng.unpin("s", int(eng.pins("s")["pin_id"][0])),
        lambda: eng.edit_note("s", nid, label="new label"),
        lambda: eng.edit_turn("s", 2, "A corrected question about migrations?"),
        lambda: eng.forget("s", turns=(18, 19)),
    ]
    for change in changes:
        before = stamp()
        change()
        assert stamp() > before


def test_every_pin_is_sent_when_the_history_and_the_pins_fit(eng: Engine) -> None:
    for i in range(12):
        eng.pin("s", f"Rule {i}: " + "keep every invoice for seven years " * 4)
    ctx = eng.context("s", "budget", max_tokens=1000)
    assert ctx.verbatim
    assert len(ctx.pins) == 12  # more than a quarter of the budget: nothing else needed room
    assert ctx.tokens == ctx.full_tokens + ctx.pin_tokens <= 1000
    assert ctx.tokens_saved == 0
