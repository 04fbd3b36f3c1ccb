"""Text primitives: sentences with offsets, BM25 terms, query terms and token estimates.

Everything here is pure Python, deterministic and fast enough to run on every message; the same
functions back the SQL UDFs, so the library and ``cce sql`` see identical terms and counts.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass

__all__ = [
    "STOPWORDS",
    "Sentence",
    "content_words",
    "estimate_tokens",
    "query_terms",
    "split_sentences",
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

_CJK = (
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs
    "\uac00-\ud7af"  # Hangul syllables
)
_CJK_RUN = re.compile(f"[{_CJK}]+")
_WORD = re.compile(rf"[^\W_{_CJK}]+(?:['’][^\W_{_CJK}]+)*|[{_CJK}]+", re.UNICODE)
_SENTENCE_END = re.compile(r"(?<=[.!?…])[\"')\]]*\s+|(?<=[。！？])|\n+")
_TOKEN_PIECE = re.compile(
    rf"[{_CJK}]|[A-Za-z]+|\d+|[^\W\d_A-Za-z{_CJK}]+|\n|[ \t]{{2,}}|[^\w\s]",
    re.UNICODE,
)


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
    return unicodedata.normalize("NFKC", text).casefold().replace("’", "'")


def _stem(word: str) -> str:
    """A light English plural/possessive stemmer (other scripts are left alone)."""
    if word.endswith("'s"):
        word = word[:-2]
    elif "'" in word:
        word = word.replace("'", "")
    if len(word) > 3 and word.isascii() and word.endswith("s") and not word.endswith(
        ("ss", "us", "is")
    ):
        if word.endswith("sses"):  # classes -> class
            word = word[:-2]
        elif word.endswith("ies") and len(word) > 4:  # queries -> query (but ties -> tie)
            word = word[:-3] + "y"
        else:  # bugs -> bug
            word = word[:-1]
    return word


def _tokens(text: str) -> list[str]:
    """Lower-cased words; runs of CJK characters become overlapping character bigrams."""
    out: list[str] = []
    for m in _WORD.finditer(_normalise(text)):
        w = m.group(0)
        if _CJK_RUN.fullmatch(w):
            out.extend([w] if len(w) == 1 else [w[i : i + 2] for i in range(len(w) - 1)])
        else:
            out.append(w)
    return out


def terms(text: str) -> list[str]:
    """BM25 terms of a text: normalised words without stop words, lightly stemmed."""
    out = []
    for w in _tokens(text):
        if w in STOPWORDS or (len(w) < 2 and w.isascii() and not w.isdigit()):
            continue
        out.append(_stem(w))
    return out


def query_terms(query: str) -> list[tuple[str, float]]:
    """Distinct search terms of a question with weights.

    Names, acronyms, identifiers and numbers (the words a user expects to be matched exactly)
    weigh 2.0; other content words 1.0; question filler words are dropped.
    """
    seen: dict[str, float] = {}
    for m in _WORD.finditer(unicodedata.normalize("NFKC", query)):
        raw = m.group(0)
        distinctive = any(c.isdigit() for c in raw) or (raw[:1].isupper() and m.start() > 0) or (
            sum(c.isupper() for c in raw) > 1
        )
        for t in terms(raw):
            if t in _QUESTION_WORDS:
                continue
            seen[t] = max(seen.get(t, 0.0), 2.0 if distinctive else 1.0)
    return list(seen.items())


def content_words(text: str) -> set[str]:
    """Distinct lower-cased alphanumeric words of 3+ letters that are not stop words."""
    return {
        w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) >= 3 and w not in STOPWORDS
    }


def estimate_tokens(text: str) -> int:
    """Estimate how many tokens a BPE model spends on ``text``.

    Counted per piece so that CJK (about one token per character), long numbers (groups of three
    digits), code and JSON punctuation (one token per symbol) are not under-counted the way a
    characters/4 rule under-counts them. English prose comes out about 1.3 tokens per word.
    """
    if not text:
        return 0
    n = 0
    for m in _TOKEN_PIECE.finditer(text):
        piece = m.group(0)
        c = piece[0]
        if c.isascii() and c.isalpha():
            n += 1 if len(piece) <= 8 else math.ceil(len(piece) / 5)
        elif c.isdigit():
            n += math.ceil(len(piece) / 3)
        elif c == "\n" or c in " \t":
            n += 1
        elif len(piece) > 1 and not c.isascii():  # a word in another alphabet
            n += math.ceil(len(piece) / 3)
        else:
            n += 1
    return n
