"""The ``llm`` summariser: topic notes (and closed sessions) summarised by a model.

With ``Config.summariser == "llm"`` each topic note the write path creates gets one model call
(prompt ``note_summary``, versioned and part of the cache key) through :class:`cce_duck.llm.LLM`
and the store's ``llm_cache`` table; closing a session makes one more call (``session_summary``)
over the topic labels and summaries. The call happens after the notes were committed with their
extractive summary, outside any transaction, and a second short transaction swaps the summary in.
So a crash, a missing SDK, a timeout, an error or an empty reply leaves the extractive summary in
place: ingestion never fails or loses turns because of the model. Each such failure is reported
with a :class:`SummariserWarning` and logged. The per-message micro lines and sentence quotes
that retrieval uses are never touched.

Bounds: a call sees at most ``summariser_input_tokens`` of the topic's text (every message cut
to a fair share when the topic is longer), its reply is limited to ``summariser_max_tokens``
(and to the note's own size, at least :data:`MIN_SUMMARY_TOKENS`) and clipped to it.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cce_duck.config import Config
from cce_duck.errors import LLMError, ValidationError
from cce_duck.llm import LLM, LLMCache
from cce_duck.text import estimate_tokens
from cce_duck.topics import TopicTurn, clip

__all__ = [
    "MAX_FAILURES_IN_A_ROW",
    "MIN_SUMMARY_TOKENS",
    "SESSION_MAX_TOKENS",
    "FreshNote",
    "Outcome",
    "Summariser",
    "SummariserWarning",
    "fit_lines",
    "model_of",
]

log = logging.getLogger(__name__)

MIN_SUMMARY_TOKENS = 16    # a tiny topic may still get one sentence
SESSION_MAX_TOKENS = 240   # the extractive session summary's cap
MAX_FAILURES_IN_A_ROW = 2  # then the rest of the batch keeps extractive summaries uncalled
_LABEL = re.compile(r"^\s*(summary|topic summary)\s*:\s*", re.IGNORECASE)


class SummariserWarning(UserWarning):
    """A model summary could not be made; the extractive summary was kept."""


@dataclass(frozen=True)
class FreshNote:
    """A note just committed with its extractive summary, waiting for the model's."""

    session_id: str
    note_id: int
    turns: tuple[TopicTurn, ...]
    raw_tokens: int
    extractive: str


@dataclass(frozen=True)
class Outcome:
    """How one summary was made: ``llm`` (a model call), ``cache`` (an ``llm_cache`` hit) or
    ``extractive`` (a fallback, with the error). ``note_id`` is ``None`` for a session summary."""

    session_id: str
    note_id: int | None
    source: str
    tokens: int
    error: str | None = None


def _clip_counted(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """``text`` cut to its longest word prefix that fits ``max_tokens`` by ``count``."""
    if count(text) <= max_tokens:
        return text
    words = text.split()
    lo, hi = 0, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid]) + " …") <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo]) + " …" if lo else ""


def fit_lines(lines: Sequence[str], budget: int, count: Callable[[str], int]) -> str:
    """Join ``lines`` into at most ``budget`` tokens: short lines whole, long ones cut to an
    equal share of what the short ones leave (water filling), the whole clipped at the end."""
    costs = [count(ln) + 1 for ln in lines]
    if sum(costs) > budget:
        share = float(max(costs))
        left = float(budget)
        for i, c in enumerate(sorted(costs)):
            fair = left / (len(costs) - i)
            if c > fair:
                share = fair
                break
            left -= c
        lines = [ln if c <= share else _clip_counted(ln, max(1, int(share) - 1), count)
                 for ln, c in zip(lines, costs, strict=True)]
    text = "\n".join(ln for ln in lines if ln)
    return _clip_counted(text, budget, count) if count(text) > budget else text


def _clean(reply: str, max_tokens: int) -> str:
    """One line, no "Summary:" label, clipped to ``max_tokens`` (estimated, as stored)."""
    text = _LABEL.sub("", " ".join(reply.split())).strip()
    return clip(text, max_tokens) if text else ""


def model_of(config: Config) -> str:
    """The model id of the ``llm`` summariser, or a :class:`ValidationError` naming the settings."""
    model = config.summariser_model or os.environ.get("CCE_LLM_MODEL")
    if not model or not model.strip():
        raise ValidationError(
            "summariser 'llm' needs a model: set summariser_model (CCE_SUMMARISER_MODEL) or "
            "CCE_LLM_MODEL")
    return model


class Summariser:
    """Model summaries of notes and sessions for one store; built by the writer in ``llm`` mode.

    Args:
        store: The :class:`~cce_duck.store.Store` whose ``llm_cache`` caches the replies.
        config: Its ``summariser_*`` settings choose model, backend, server and bounds.
    """

    def __init__(self, store: Any, config: Config) -> None:
        from cce_duck.tools.prompts import prompt

        model = model_of(config)
        t = float(config.summariser_timeout_s)
        self.store = store
        self.config = config
        self.note_prompt = prompt("note_summary")
        self.session_prompt = prompt("session_summary")
        self.llm = LLM(model, backend=config.summariser_backend,
                       api_base=config.summariser_api_base, store=None,
                       max_tokens=config.summariser_max_tokens, timeout_s=t,
                       deadline_s=2 * t + 1.0, max_retries=1, backoff_s=0.5, max_backoff_s=2.0)
        #: The most recent outcomes, oldest first (provenance of the summaries stored).
        self.outcomes: deque[Outcome] = deque(maxlen=10_000)

    @contextmanager
    def _cache(self) -> Iterator[None]:
        """The ``llm_cache`` through a cursor of the store's current connection (it changes
        after a file rewrite), closed after the batch so no transaction outlives it."""
        try:
            cursor = self.store.new_cursor()
        except Exception as exc:  # no cache this time; the calls still go
            log.warning("llm_cache unavailable for summaries: %s", exc)
            yield
            return
        self.llm.cache = LLMCache(cursor, lake=self.store.lake is not None)
        try:
            yield
        finally:
            self.llm.cache = None
            cursor.close()

    def _call(self, messages: list[dict[str, str]], version: str, max_tokens: int,
              limit: int) -> tuple[str, bool]:
        done = self.llm.chat(messages, prompt_version=version, max_tokens=max_tokens)
        text = _clean(done.text, limit)
        if not text:
            raise LLMError("the model's summary is empty once cleaned")
        return text, done.cached

    # -- notes ----------------------------------------------------------------

    def note_limit(self, note: FreshNote) -> int:
        """Token cap of a note's model summary."""
        return min(self.config.summariser_max_tokens, max(MIN_SUMMARY_TOKENS, note.raw_tokens))

    def note_messages(self, note: FreshNote) -> list[dict[str, str]]:
        """The chat of one note summary call (the topic's text bounded in tokens)."""
        lines = [f"{t.speaker or t.role}: {' '.join(t.content.split())}" for t in note.turns]
        text = fit_lines(lines, self.config.summariser_input_tokens, self.llm.count)
        words = max(8, int(self.note_limit(note) / 1.3))
        return self.note_prompt.messages(words=words, text=text)

    def summarise_notes(self, notes: Sequence[FreshNote]) -> dict[int, str]:
        """Model summaries of ``notes`` by note id; a note that failed is left out (it keeps its
        extractive summary) after a warning. Never raises for a model failure."""
        with self._cache():
            return self._summarise_notes(notes)

    def _summarise_notes(self, notes: Sequence[FreshNote]) -> dict[int, str]:
        out: dict[int, str] = {}
        failures = 0
        for i, note in enumerate(notes):
            if failures >= MAX_FAILURES_IN_A_ROW:
                rest = notes[i:]
                self.warn(f"{len(rest)} more note(s) keep their extractive summaries after "
                           f"{failures} failed summary calls in a row")
                self.outcomes.extend(Outcome(n.session_id, n.note_id, "extractive",
                                             estimate_tokens(n.extractive), "skipped")
                                     for n in rest)
                break
            limit = self.note_limit(note)
            try:
                text, cached = self._call(self.note_messages(note), self.note_prompt.key, limit,
                                          limit)
            except Exception as exc:  # any failure: the extractive summary stays
                failures += 1
                self.warn(f"note {note.note_id} of session {note.session_id!r} keeps its "
                           f"extractive summary: {type(exc).__name__}: {exc}")
                self.outcomes.append(Outcome(note.session_id, note.note_id, "extractive",
                                             estimate_tokens(note.extractive), str(exc)))
                continue
            failures = 0
            out[note.note_id] = text
            self.outcomes.append(Outcome(note.session_id, note.note_id,
                                         "cache" if cached else "llm", estimate_tokens(text)))
        return out

    # -- sessions -------------------------------------------------------------

    def summarise_session(self, session_id: str, labels: Sequence[str],
                          summaries: Sequence[str], extractive: str) -> str:
        """The summary of a closed session from its topics, or ``extractive`` on a failure."""
        if not labels:
            return extractive
        lines = [f"- {lab}: {' '.join(s.split())}" for lab, s in zip(labels, summaries, strict=True)]
        text = fit_lines(lines, self.config.summariser_input_tokens, self.llm.count)
        msgs = self.session_prompt.messages(words=int(SESSION_MAX_TOKENS / 1.3), text=text)
        try:
            with self._cache():
                out, cached = self._call(msgs, self.session_prompt.key, SESSION_MAX_TOKENS,
                                         SESSION_MAX_TOKENS)
        except Exception as exc:
            self.warn(f"session {session_id!r} keeps its extractive summary: "
                       f"{type(exc).__name__}: {exc}")
            self.outcomes.append(Outcome(session_id, None, "extractive",
                                         estimate_tokens(extractive), str(exc)))
            return extractive
        self.outcomes.append(Outcome(session_id, None, "cache" if cached else "llm",
                                     estimate_tokens(out)))
        return out

    def warn(self, message: str) -> None:
        log.warning("%s", message)
        warnings.warn(message, SummariserWarning, stacklevel=4)
