"""Text primitives: sentences with offsets, BM25 terms, query terms, token estimates."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cce_duck.text import (
    STOPWORDS,
    content_words,
    estimate_tokens,
    query_terms,
    split_sentences,
    terms,
)

PROSE = (
    "We decided to store the conversation history in DuckDB, because it is embedded and fast. "
    "The assistant suggested compressing older turns into topic notes; the user agreed, but "
    "asked whether the notes would keep exact quotes. After some discussion, we settled on "
    "keeping verbatim sentences for every retrieved fact, and a hard token budget for the "
    "whole context."
)

# -- sentences ------------------------------------------------------------------------------


def test_split_sentences_basic() -> None:
    msg = "Hello there. How are you?  I am fine!\nNew line here… And more。日本語です。Ok"
    got = [s.text for s in split_sentences(msg)]
    assert got == ["Hello there.", "How are you?", "I am fine!", "New line here…", "And more。",
                   "日本語です。", "Ok"]


@pytest.mark.parametrize("msg", [
    PROSE,
    "  leading and trailing spaces.   Second one!  ",
    "no terminal punctuation at all",
    'He said "stop." Then left.',
    "Line one\n\n\nLine two\r\nLine three",
    "Version 1.5.5 is pinned. Use e.g. the hash embedder.",
    "",
    "   \n  ",
])
def test_sentence_offsets_point_into_the_message(msg: str) -> None:
    sentences = split_sentences(msg)
    prev_end = 0
    for s in sentences:
        assert s.text == msg[s.start:s.end]
        assert s.text
        assert s.text == s.text.strip()
        assert s.start >= prev_end
        prev_end = s.end
    assert (not sentences) == (not msg.strip())


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab .!?\n。…\"')日")), max_size=80))
def test_sentence_offsets_property(msg: str) -> None:
    sentences = split_sentences(msg)
    prev_end = 0
    for s in sentences:
        assert s.text == msg[s.start:s.end]
        assert s.text.strip() == s.text != ""
        assert s.start >= prev_end
        prev_end = s.end
    # nothing but whitespace falls between sentences
    covered = "".join(s.text for s in sentences)
    assert "".join(covered.split()) == "".join(msg.split())


def test_third_sentence_of_prose() -> None:
    third = split_sentences(PROSE)[2]
    assert third.text.startswith("After some discussion")
    assert PROSE[third.start:third.end] == third.text


# -- terms ----------------------------------------------------------------------------------


def test_terms_drop_stop_words_and_lowercase() -> None:
    got = terms("The Cat and THE dog were in the garden with a ball")
    assert got == ["cat", "dog", "garden", "ball"]
    assert not set(got) & STOPWORDS


def test_terms_keep_numbers_and_drop_single_letters() -> None:
    assert terms("x 7 y 42 version 3") == ["7", "42", "version", "3"]


@pytest.mark.parametrize(("plural", "singular"), [
    ("databases", "database"),
    ("queries", "query"),
    ("migrations", "migration"),
    ("classes", "class"),
    ("bugs", "bug"),
    ("logs", "log"),
    ("ties", "tie"),
    ("Bob's", "Bob"),
])
def test_terms_stem_plurals(plural: str, singular: str) -> None:
    assert terms(plural) == terms(singular)


@pytest.mark.parametrize("word", ["status", "analysis", "bus", "address", "virus"])
def test_terms_leave_singulars_ending_in_s(word: str) -> None:
    (stem,) = terms(word)  # Snowball: at most the final letter goes, never the word's body
    assert word.startswith(stem)
    assert len(stem) >= len(word) - 1


def test_terms_cjk_bigrams() -> None:
    assert terms("東京タワー") == ["東京", "京タ", "タワ", "ワー"]
    assert terms("猫") == ["猫"]
    assert terms("DuckDB で 東京") == ["duckdb", "東京"]  # で is a stop particle


def test_terms_normalise_unicode() -> None:
    assert terms("ＤｕｃｋＤＢ") == ["duckdb"]  # full-width letters (NFKC)
    assert terms("Straße") == terms("STRASSE")  # casefold


# -- query terms ----------------------------------------------------------------------------


def test_query_terms_weights() -> None:
    got = dict(query_terms("What did Alice say about the PostgreSQL 16 migration and databases?"))
    assert got == {terms("alice")[0]: 2.0, "postgresql": 2.0, "16": 2.0,
                   terms("migration")[0]: 1.0, terms("database")[0]: 1.0}
    assert terms("databases") == terms("database")


def test_query_terms_drop_question_filler() -> None:
    assert query_terms("do you remember what we discussed?") == []
    assert dict(query_terms("tell me about the budget")) == {"budget": 1.0}


def test_query_terms_first_capital_is_not_a_name() -> None:
    assert dict(query_terms("Budget for the ACME project")) == {"budget": 1.0, terms("acme")[0]: 2.0,
                                                                terms("project")[0]: 1.0}


def test_query_terms_are_distinct_and_keep_the_highest_weight() -> None:
    got = query_terms("the budget, the Budget, the budgets")
    assert got == [("budget", 2.0)]


# -- token estimates ------------------------------------------------------------------------


def test_estimate_tokens_empty_and_tiny() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("a") == 1
    assert estimate_tokens("hello") == 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(
    [*"ab Z09\t .,!?…—é漢かカ한हिаб\u0301{}", "hello ", "internationalisation", "123456"]),
    max_size=30).map("".join), max_size=6))
def test_estimate_tokens_adds_up_line_by_line(lines: list[str]) -> None:
    """No piece spans a line break: a text costs its lines plus one per break (the rule the
    memoised per-line estimate relies on), for short, long, ASCII and other lines alike."""
    text = "\n".join(lines)
    long_line = "é" * 900 + "".join(lines)  # past the memoised length
    assert estimate_tokens(text) == sum(map(estimate_tokens, lines)) + max(len(lines) - 1, 0)
    assert estimate_tokens(long_line + "\n" + text) == (
        estimate_tokens(long_line) + 1 + estimate_tokens(text))
    assert estimate_tokens(text) == estimate_tokens(text)  # memoised: the same the second time


def test_estimate_tokens_english_about_1_3_per_word() -> None:
    words = len(PROSE.split())
    ratio = estimate_tokens(PROSE) / words
    assert 1.1 <= ratio <= 1.6, ratio


def test_estimate_tokens_cjk_per_character_class() -> None:
    # Calibrated against XLM-R SentencePiece (tests/test_multilingual_text.py checks the ±25%).
    assert estimate_tokens("今天天气很好") == 5  # 6 ideographs x 0.8
    assert estimate_tokens("ひらがなです") == 3  # 6 kana x 0.45
    assert estimate_tokens("안녕하세요") == 4  # 5 syllables x 0.7
    assert estimate_tokens("猫") == 1


def test_estimate_tokens_counts_json_punctuation() -> None:
    doc = json.dumps({"a": [1, 2, 3], "b": {"c": None, "d": "x"}})
    words_only = estimate_tokens(" ".join(["a", "1", "2", "3", "b", "c", "null", "d", "x"]))
    assert estimate_tokens(doc) >= words_only + doc.count('"') + doc.count(":")
    assert estimate_tokens(doc) >= len(doc) / 3


def test_estimate_tokens_long_numbers_and_words() -> None:
    assert estimate_tokens("123") == 1
    assert estimate_tokens("123456789012") == 4
    assert estimate_tokens("internationalization") >= 3


def test_estimate_tokens_is_roughly_additive() -> None:
    a, b = "The plan is ready.", "We ship on Friday!"
    joined = estimate_tokens(a + " " + b)
    assert joined <= estimate_tokens(a) + estimate_tokens(b) + 1
    assert joined >= estimate_tokens(a) + estimate_tokens(b) - 1


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.text(max_size=200))
def test_estimate_tokens_never_shrinks_when_text_grows(a: str, b: str) -> None:
    # Appending text never makes the estimate smaller by more than one joined piece.
    assert estimate_tokens(a + "\n" + b) >= max(estimate_tokens(a), estimate_tokens(b)) - 1


# -- content words --------------------------------------------------------------------------


def test_content_words() -> None:
    assert content_words("The Quick brown fox, an ox, and 42 items!") == {
        "quick", "brown", "fox", "items"}
    assert content_words("") == set()
    assert content_words("the and of") == set()
    assert content_words("Version 2024 of DuckDB") == {"version", "2024", "duckdb"}


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), max_size=300))
def test_estimate_tokens_ascii_shortcut_counts_like_the_piece_loop(text: str) -> None:
    from cce_duck.text import _TOKEN_PIECE_ASCII, _estimate_pieces

    assert estimate_tokens(text) == _estimate_pieces(text, _TOKEN_PIECE_ASCII)
    assert estimate_tokens(text + " supercalifragilistic 12345678") == _estimate_pieces(
        text + " supercalifragilistic 12345678", _TOKEN_PIECE_ASCII)
