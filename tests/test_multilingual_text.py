"""Lexical search beyond Latin script: words, bigrams, normalisation, query terms, bad input."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cce_duck import Engine
from cce_duck.text import content_words, estimate_tokens, query_terms, split_sentences, terms

# -- words and normalisation ----------------------------------------------------------------


def test_devanagari_words_keep_their_vowel_signs() -> None:
    # Python's \w does not match Devanagari vowel signs or the virama: without the mark class
    # "मेरी" fell apart into "म" and "र".
    assert terms("मेरी बहन लिस्बन में रहती है। वह डॉक्टर है।") == ["बहन", "लिस्बन", "रहती", "डॉक्टर"]
    assert terms("क्या") == ["क्या"]  # one word, not "क" and "य"
    assert query_terms("क्या") == []  # "what": question filler


def test_cjk_korean_and_thai_runs_become_bigrams() -> None:
    assert terms("我姐姐住在里斯本") == ["我姐", "姐姐", "姐住", "住在", "在里", "里斯", "斯本"]
    assert terms("제 여동생은") == ["제", "여동", "동생", "생은"]
    assert terms("ผมชอบ")[:2] == ["ผม", "มช"]


def test_japanese_particles_alone_are_stop_words() -> None:
    assert terms("DuckDB を 使う") == ["duckdb", "使う"]


def test_accents_stay_distinguishable_but_compose() -> None:
    assert terms("año") != terms("ano")
    assert terms("año") == terms("an\u0303o")  # decomposed ñ (NFKC composes it)
    assert terms("MÉDICA") == terms("médica") == ["médica"]


def test_digits_of_any_script_become_ascii() -> None:
    assert terms("२०२४ में") == ["2024"]
    assert terms("٢٠٢٤") == ["2024"]
    assert terms("２０２４") == ["2024"]  # full-width (NFKC)


def test_zero_width_characters() -> None:
    assert terms("data\u200dbase") == terms("database") == ["databas"]  # joiner: removed
    assert terms("data\u200bbase") == ["data", "base"]  # zero-width space: a word break
    assert terms("\ufeffhello world") == ["world"]  # byte-order mark removed, "hello" stop word


def test_arabic_light_normalisation() -> None:
    # Optional vowel marks, tatweel and alef variants do not split or change a word.
    assert terms("مُدَرِّسَة") == terms("مدرسة")
    assert terms("أحمد") == terms("احمد")
    assert terms("كـتـاب") == terms("كتاب")
    assert terms("في البيت") == ["البيت"]  # "in" is a stop word


def test_cyrillic_case_and_yo() -> None:
    assert terms("Живёт в МОСКВЕ") == ["живет", "москве"]


def test_spanish_stop_words_but_english_homographs_kept() -> None:
    assert terms("La casa de mi hermana") == ["casa", "hermana"]
    assert terms("my son ate hay") == ["son", "ate", "hay"]  # English words stay


def test_content_words_any_script() -> None:
    assert content_words("Mi hermana vive en Lisboa") == {"hermana", "vive", "lisboa"}
    assert content_words("मेरी बहन लिस्बन में रहती है") >= {"बहन", "लिस्बन", "रहती"}
    assert "里斯" in content_words("我姐姐住在里斯本")


def test_sentences_end_at_danda_and_arabic_question_mark() -> None:
    got = [s.text for s in split_sentences("वह डॉक्टर है। वह लिस्बन में है। هل هي طبيبة؟ نعم")]
    assert got == ["वह डॉक्टर है।", "वह लिस्बन में है।", "هل هي طبيبة؟", "نعم"]


# -- distinctive query terms ----------------------------------------------------------------


def test_spanish_name_after_inverted_question_mark() -> None:
    got = dict(query_terms("¿Dónde vive la hermana de Ana?"))
    assert got == {"vive": 1.0, "hermana": 1.0, "ana": 2.0}  # "Dónde" starts the sentence


def test_cyrillic_names_are_distinctive() -> None:
    got = dict(query_terms("Где живёт сестра Анны?"))
    assert got == {"живет": 1.0, "сестра": 1.0, "анны": 2.0}


def test_word_in_another_script_is_distinctive() -> None:
    hindi = dict(query_terms("मेरी बहन किस शहर में रहती है और DuckDB कब आया?"))
    assert hindi["duckdb"] == 2.0
    assert hindi["बहन"] == 1.0
    assert "किस" not in hindi
    assert "कब" not in hindi
    chinese = dict(query_terms("我们什么时候迁移到DuckDB？"))
    assert chinese["duckdb"] == 2.0
    assert "什么" not in chinese
    assert "时候" not in chinese


def test_katakana_and_native_digits_are_distinctive() -> None:
    got = dict(query_terms("リスボンに住んでいるのは誰？"))
    assert got["リス"] == 2.0
    assert got["ボン"] == 2.0
    assert got.get("住ん") == 1.0
    assert dict(query_terms("२०२४ में क्या हुआ?"))["2024"] == 2.0


def test_query_and_document_terms_agree() -> None:
    for doc, question in [("Mi hermana Lucía vive en Valencia", "¿Dónde vive Lucía?"),
                          ("मेरी मैनेजर का नाम कविता मेनन है", "मेरी मैनेजर कौन है?"),
                          ("坐地铁九号线大概四十五分钟", "坐地铁要多长时间？")]:
        shared = {t for t, _ in query_terms(question)} & set(terms(doc))
        assert shared, (doc, question)


# -- bad input ------------------------------------------------------------------------------

NASTY = [
    "bad \ud800 surrogate \udfff",
    "emoji 😀👍🏽 ❤️ 1️⃣ mixed русский 中文 हिंदी عربى",
    "zero\u200bwidth\u200d\ufeff\u2060",
    "\u0301\u0301 leading marks",
    "x" * 100_000,
    "अ" * 50_000,
    "中" * 20_000,
    "\x00nul\x00",
]


@pytest.mark.parametrize("text", NASTY, ids=range(len(NASTY)))
def test_text_functions_survive_nasty_input(text: str) -> None:
    start = time.perf_counter()
    terms(text)
    query_terms(text)
    content_words(text)
    split_sentences(text)
    assert estimate_tokens(text) > 0
    assert time.perf_counter() - start < 5.0


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec=None, categories=None), max_size=60))
def test_text_functions_never_crash(text: str) -> None:
    for t in terms(text):
        assert t
        assert t == t.strip()
    for t, w in query_terms(text):
        assert t
        assert w in (1.0, 2.0)
    assert estimate_tokens(text) >= 0


def test_engine_takes_nasty_messages_and_queries() -> None:
    eng = Engine(data_dir=None, embedder="hash")
    try:
        for text in NASTY:
            eng.add_message("s", "user", text)
        payload = eng.context("s", "中文 русский 😀 \ud800 हिंदी?", max_tokens=300)
        assert payload.tokens <= 300
        assert len(eng.search("s", "surrogate \ud800", k=3)) > 0
    finally:
        eng.close()
