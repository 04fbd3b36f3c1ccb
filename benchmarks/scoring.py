"""How a context is scored on a LoCoMo question: evidence recall and answer recall.

* **content words** of a text: its distinct lower-cased alphanumeric words of 3+ letters that are
  not stop words;
* an **evidence turn** counts as present in a context when at least half of its content words
  appear in the context's content words; a question's evidence recall is the fraction of its
  evidence turns present (turns without content words, and ``dia_id`` s that name no turn, are
  left out and counted);
* **answer recall** (categories 1, 3, 4): the question counts when every content word of the
  gold answer appears in the context (answers without content words are left out).

The stop-word list is a frozen copy kept here, so that the score of a context never moves when
the engine's own word lists change.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "ANSWER_CATEGORIES",
    "CATEGORIES",
    "SCORE_STOPWORDS",
    "answer_present",
    "content_words",
    "evidence_ids",
    "evidence_present",
]

#: Question categories scored (5, adversarial, has no answer in the conversation).
CATEGORIES: tuple[int, ...] = (1, 2, 3, 4)
#: Categories whose gold answer is checked (2, temporal, answers with relative dates).
ANSWER_CATEGORIES: tuple[int, ...] = (1, 3, 4)

_STOP_TEXT = """
    a about above after again against all also am an and any are aren as at be because been
    before being below between both but by can cannot could couldn did didn do does doesn doing
    don down during each few for from further had hadn has hasn have haven having he her here
    hers herself him himself his how i if in into is isn it its itself just let me more most
    mustn my myself no nor not now of off on once only or other ought our ours ourselves out over
    own same shan she should shouldn so some such than that the their theirs them themselves
    then there these they this those through to too under until up very was wasn we were weren
    what when where which while who whom why will with won would wouldn you your yours yourself
    yourselves ll re ve im ive id youre thats dont doesnt didnt isnt wasnt cant wont yes yeah oh
    ok okay hey hi hello thanks thank really got get gets getting like well much many one
    """
SCORE_STOPWORDS: frozenset[str] = frozenset(_STOP_TEXT.split())

_WORD = re.compile(r"[a-z0-9]+")
_DIA_ID = re.compile(r"D:?(\d+):(\d+)")


def content_words(text: str) -> set[str]:
    """Distinct lower-cased alphanumeric words of 3+ letters that are not stop words."""
    return {w for w in _WORD.findall(text.lower()) if len(w) >= 3 and w not in SCORE_STOPWORDS}


def evidence_ids(evidence: Iterable[str]) -> list[str]:
    """Normalised ``dia_id`` s of a question's evidence list, in order, without repeats.

    LoCoMo evidence entries are ``"D3:14"``; a few hold two ids (``"D8:6; D9:17"``) or a stray
    colon (``"D:11:26"``), which are read as the ids they name.
    """
    out: list[str] = []
    for item in evidence:
        for m in _DIA_ID.finditer(str(item)):
            did = f"D{int(m.group(1))}:{int(m.group(2))}"
            if did not in out:
                out.append(did)
    return out


def evidence_present(turn_words: set[str], context_words: set[str]) -> bool:
    """At least half of the turn's content words are in the context."""
    return 2 * len(turn_words & context_words) >= len(turn_words)


def answer_present(answer_words: set[str], context_words: set[str]) -> bool:
    """Every content word of the answer is in the context."""
    return answer_words <= context_words
