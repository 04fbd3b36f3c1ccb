"""One way to call a model: backend choice, retries with backoff, a total deadline, the cache in
the store, token counting and usage records."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cce_duck.errors import LLMError, MissingExtraError, ValidationError
from cce_duck.llm.backends import Backend, classify_error, get_backend
from cce_duck.llm.cache import LLMCache, cache_key
from cce_duck.llm.tokens import TokenCounter, count_messages, token_counter

__all__ = ["LLM", "CallRecord", "Completion", "Usage", "validate_messages"]

_ROLES = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True)
class Completion:
    """A model's reply to one call."""

    text: str
    cached: bool
    prompt_tokens: int | None
    completion_tokens: int | None
    attempts: int
    seconds: float


@dataclass(frozen=True)
class CallRecord:
    """One entry of :attr:`LLM.records`: a call, a cache hit or a failure."""

    model: str
    prompt_version: str
    cached: bool
    ok: bool
    attempts: int
    prompt_tokens: int | None
    completion_tokens: int | None
    seconds: float
    error: str | None = None


@dataclass
class Usage:
    """Totals over every call of one :class:`LLM`."""

    calls: int = 0
    cache_hits: int = 0
    failures: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        """The totals as a plain dict."""
        return asdict(self)


def validate_messages(messages: object) -> list[dict[str, str]]:
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ValidationError("messages must be a non-empty list of {'role', 'content'} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValidationError(f"message {i} is not a mapping")
        role, content = m.get("role"), m.get("content")
        if role not in _ROLES:
            raise ValidationError(f"message {i} has an invalid role {role!r}")
        if not isinstance(content, str):
            raise ValidationError(f"message {i} has no text content")
        out.append({"role": str(role), "content": content})
    return out


def _positive(name: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (
        value == 0 and not allow_zero
    ):
        raise ValidationError(f"{name} must be a positive number, got {value!r}")
    return float(value)


class LLM:
    """A model behind a backend, with retries, a deadline, a cache and usage records.

    Args:
        model: Model id (``CCE_LLM_MODEL`` if omitted), e.g. ``openai/smollm2`` for a local
            OpenAI-compatible server through litellm, ``gpt-4o-mini``, ``anthropic/claude-...``.
        backend: ``litellm`` (default, or ``CCE_LLM_BACKEND``), ``openai``, ``vllm`` or an object
            with ``name`` and ``complete()``.
        store: A :class:`~cce_duck.store.Store` or :class:`~cce_duck.Engine` whose ``llm_cache``
            table caches replies (``None``: no cache).
        api_base / api_key: Server address and key (default ``OPENAI_API_BASE`` /
            ``OPENAI_API_KEY``).
        temperature / max_tokens: Default sampling options (part of the cache key).
        timeout_s: Limit of one attempt. ``deadline_s``: limit of the whole call, retries included.
        max_retries: Further attempts after a retryable failure (timeouts, connection errors,
            408/409/429/5xx); auth and other 4xx fail at once. Backoff doubles from
            ``backoff_s`` up to ``max_backoff_s`` with jitter, and waits at least a 429's
            ``Retry-After``.
        context_window: Tokens the model accepts (prompt + reply); tools size their calls by it.
        tokenizer: Path of a ``tokenizer.json`` or ``.gguf`` file for exact counts
            (``CCE_LLM_TOKENIZER``), else an estimate.
        json_schemas: Send the tools' JSON schemas with their requests (llama.cpp server form,
            ``response_format={"type": "json_object", "schema": ...}``).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        backend: str | Backend | None = None,
        store: Any = None,
        api_base: str | None = None,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 512,
        timeout_s: float = 60.0,
        deadline_s: float = 300.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        context_window: int = 8192,
        tokenizer: str | None = None,
        json_schemas: bool = False,
        cache_max_entries: int = 10_000,
        cache_max_age_s: float = 30 * 86400.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        model = model or os.environ.get("CCE_LLM_MODEL")
        if not isinstance(model, str) or not model.strip():
            raise ValidationError("an LLM needs a model id (argument or CCE_LLM_MODEL)")
        self.model = model
        self.backend = get_backend(backend, api_base=api_base, api_key=api_key)
        self.temperature = _positive("temperature", temperature, allow_zero=True)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ValidationError("max_tokens must be a positive integer")
        self.max_tokens = max_tokens
        self.timeout_s = _positive("timeout_s", timeout_s)
        self.deadline_s = _positive("deadline_s", deadline_s)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValidationError("max_retries must be an integer >= 0")
        self.max_retries = max_retries
        self.backoff_s = _positive("backoff_s", backoff_s, allow_zero=True)
        self.max_backoff_s = _positive("max_backoff_s", max_backoff_s, allow_zero=True)
        if isinstance(context_window, bool) or not isinstance(context_window, int) or (
            context_window < 256
        ):
            raise ValidationError("context_window must be an integer >= 256")
        self.context_window = context_window
        self.counter: TokenCounter = token_counter(tokenizer)
        self.json_schemas = bool(json_schemas)
        con, on_lake = None, False
        if store is not None:
            st = getattr(store, "store", store)  # an Engine or a Store
            con, on_lake = st.new_cursor(), st.lake is not None
        self.cache = None if con is None else LLMCache(
            con, max_entries=cache_max_entries, max_age_s=cache_max_age_s, lake=on_lake)
        self._sleep = sleep
        self._clock = clock
        self._lock = threading.Lock()
        self.usage = Usage()
        self.records: list[CallRecord] = []

    # -- tokens ---------------------------------------------------------------

    def count(self, text: str) -> int:
        """Tokens in ``text`` (exact when a tokenizer is configured)."""
        return self.counter.count(text)

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Tokens a chat costs, with per-message overhead."""
        return count_messages(messages, self.counter)

    # -- calls ----------------------------------------------------------------

    def _record(self, rec: CallRecord, retries: int) -> None:
        with self._lock:
            self.records.append(rec)
            u = self.usage
            u.retries += retries
            if rec.cached:
                u.cache_hits += 1
            elif rec.ok:
                u.calls += 1
                u.prompt_tokens += rec.prompt_tokens or 0
                u.completion_tokens += rec.completion_tokens or 0
            else:
                u.failures += 1

    def chat(self, messages: Sequence[Mapping[str, Any]], *, prompt_version: str = "",
             max_tokens: int | None = None, temperature: float | None = None,
             use_cache: bool = True, deadline_s: float | None = None,
             json_object: bool = False, json_schema: dict[str, Any] | None = None
             ) -> Completion:
        """Answer ``messages``; raises :class:`LLMError` once retries or the deadline run out.

        ``json_object=True`` asks the server for a JSON object (``response_format``), which
        OpenAI-compatible servers such as llama.cpp's enforce with a grammar; ``json_schema``
        adds a schema to it in the llama.cpp server's form
        (``{"type": "json_object", "schema": ...}``).
        """
        msgs = validate_messages(messages)
        options: dict[str, Any] = {
            "temperature": self.temperature if temperature is None else _positive(
                "temperature", temperature, allow_zero=True),
            "max_tokens": self.max_tokens if max_tokens is None else max_tokens,
        }
        if json_object or json_schema is not None:
            options["response_format"] = {"type": "json_object"}
            if json_schema is not None:
                options["response_format"]["schema"] = json_schema
        if isinstance(options["max_tokens"], bool) or not isinstance(options["max_tokens"], int) or (
            options["max_tokens"] <= 0
        ):
            raise ValidationError("max_tokens must be a positive integer")
        start = self._clock()
        key = cache_key(self.backend.name, self.model, msgs, options, prompt_version)
        if use_cache and self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                done = Completion(hit.text, True, hit.prompt_tokens, hit.completion_tokens, 0,
                                  self._clock() - start)
                self._record(CallRecord(self.model, prompt_version, True, True, 0,
                                        hit.prompt_tokens, hit.completion_tokens, done.seconds), 0)
                return done
        limit = self.deadline_s if deadline_s is None else _positive("deadline_s", deadline_s)
        attempt = 0
        while True:
            attempt += 1
            remaining = limit - (self._clock() - start)
            try:
                if remaining <= 0:
                    raise LLMError(f"deadline of {limit:g}s reached before attempt {attempt}")
                reply = self._attempt(msgs, options, min(self.timeout_s, remaining))
                text = reply.text
                if text is None or not text.strip():
                    raise LLMError("the model returned an empty reply")
            except LLMError as exc:
                wait = self._backoff(attempt, exc.retry_after)
                left = limit - (self._clock() - start)
                if exc.retryable and attempt <= self.max_retries and wait < left:
                    self._sleep(wait)
                    continue
                if exc.retryable and attempt <= self.max_retries:
                    exc = LLMError(f"deadline of {limit:g}s reached after {attempt} attempt(s): "
                                   f"{exc}", retryable=True, status=exc.status)
                self._record(CallRecord(self.model, prompt_version, False, False, attempt, None,
                                        None, self._clock() - start, str(exc)), attempt - 1)
                raise exc from None
            break
        seconds = self._clock() - start
        p_tok = reply.prompt_tokens if reply.prompt_tokens is not None else self.count_messages(msgs)
        c_tok = reply.completion_tokens if reply.completion_tokens is not None else self.count(text)
        if use_cache and self.cache is not None:
            self.cache.put(key, self.model, text, p_tok, c_tok)
        self._record(CallRecord(self.model, prompt_version, False, True, attempt, p_tok, c_tok,
                                seconds), attempt - 1)
        return Completion(text, False, p_tok, c_tok, attempt, seconds)

    def _attempt(self, msgs: list[dict[str, str]], options: dict[str, Any], timeout: float
                 ) -> Any:
        try:
            return self.backend.complete(self.model, msgs, dict(options), timeout)
        except (LLMError, MissingExtraError, ValidationError):
            raise
        except Exception as exc:  # a custom backend's own exception types
            raise classify_error(exc) from exc

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        base = min(self.max_backoff_s, self.backoff_s * (2.0 ** (attempt - 1)))
        wait = base * (0.5 + random.random() / 2)
        return max(wait, retry_after or 0.0)

    def complete(self, prompt: str, *, system: str | None = None, **kw: Any) -> str:
        """Shorthand: one user prompt (and an optional system message) to text."""
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}]
        return self.chat(msgs, **kw).text
