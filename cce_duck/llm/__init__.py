"""Model access for the context-engineering tools: backends, retries, cache, token counts.

>>> from cce_duck.llm import LLM
>>> llm = LLM("openai/smollm2", api_base="http://127.0.0.1:8080/v1")  # doctest: +SKIP
>>> llm.complete("Say hi").strip()  # doctest: +SKIP
"""

from __future__ import annotations

from cce_duck.llm.backends import (
    BACKENDS,
    Backend,
    LiteLLMBackend,
    OpenAIBackend,
    Reply,
    VLLMBackend,
    classify_error,
    get_backend,
)
from cce_duck.llm.cache import LLMCache, cache_key
from cce_duck.llm.client import LLM, CallRecord, Completion, Usage
from cce_duck.llm.tokens import TokenCounter, count_messages, token_counter

__all__ = [
    "BACKENDS",
    "LLM",
    "Backend",
    "CallRecord",
    "Completion",
    "LLMCache",
    "LiteLLMBackend",
    "OpenAIBackend",
    "Reply",
    "TokenCounter",
    "Usage",
    "VLLMBackend",
    "cache_key",
    "classify_error",
    "count_messages",
    "get_backend",
    "token_counter",
]
