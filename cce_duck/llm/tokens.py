"""Token counting: exact with a tokenizer file on disk, a documented estimate otherwise.

Nothing is ever downloaded. ``CCE_LLM_TOKENIZER`` (or the ``path`` argument) may name a
Hugging Face ``tokenizer.json`` (read with the ``tokenizers`` package, a core dependency) or a
``.gguf`` model file (its vocabulary read with ``llama_cpp``, the ``e2e`` extra). Without one, the
count is :func:`cce_duck.text.estimate_tokens`: about 1.3 tokens per English word, one per CJK
character or code symbol; it is an estimate and ``exact`` says so.

A chat's count adds :data:`MESSAGE_OVERHEAD` tokens per message (role and separators) and
:data:`REPLY_PRIMER` for the reply's start, as chat templates do.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from cce_duck.errors import ValidationError
from cce_duck.text import estimate_tokens

__all__ = [
    "MESSAGE_OVERHEAD",
    "REPLY_PRIMER",
    "EstimateCounter",
    "GGUFCounter",
    "TokenCounter",
    "TokenizerFileCounter",
    "count_messages",
    "token_counter",
]

MESSAGE_OVERHEAD = 4
REPLY_PRIMER = 2


class TokenCounter(Protocol):
    """Counts tokens of a text. ``exact`` is true only for the model's own tokenizer."""

    name: str
    exact: bool

    def count(self, text: str) -> int:
        """Tokens in ``text``."""
        ...


class EstimateCounter:
    """The offline estimate (no tokenizer)."""

    name = "estimate"
    exact = False

    def count(self, text: str) -> int:
        """Estimated tokens in ``text``."""
        return estimate_tokens(text)


class TokenizerFileCounter:
    """Exact counts from a Hugging Face ``tokenizer.json`` on disk."""

    exact = True

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        self.name = f"tokenizer:{Path(path).name}"
        self._tok = Tokenizer.from_file(str(path))
        self._tok.no_truncation()
        self._tok.no_padding()

    def count(self, text: str) -> int:
        """Tokens in ``text`` (no special tokens added)."""
        return len(self._tok.encode(text, add_special_tokens=False).ids) if text else 0


class GGUFCounter:
    """Exact counts from a GGUF model's vocabulary (loaded vocabulary-only with llama_cpp)."""

    exact = True

    def __init__(self, path: str | Path) -> None:
        from cce_duck.llm.backends import require

        llama_cpp = require("llama_cpp", "e2e")
        self.name = f"gguf:{Path(path).name}"
        self._llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self._lock = threading.Lock()

    def count(self, text: str) -> int:
        """Tokens in ``text`` (no BOS added)."""
        if not text:
            return 0
        with self._lock:
            return len(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))


_CACHE: dict[str, TokenCounter] = {}
_CACHE_LOCK = threading.Lock()


def token_counter(path: str | Path | None = None) -> TokenCounter:
    """The counter for ``path`` (or ``CCE_LLM_TOKENIZER``), else the estimate."""
    spec = str(path) if path is not None else os.environ.get("CCE_LLM_TOKENIZER", "")
    if not spec:
        return EstimateCounter()
    with _CACHE_LOCK:
        hit = _CACHE.get(spec)
        if hit is not None:
            return hit
        p = Path(spec)
        if not p.is_file():
            raise ValidationError(f"tokenizer file {spec} does not exist")
        counter: TokenCounter = GGUFCounter(p) if p.suffix == ".gguf" else TokenizerFileCounter(p)
        _CACHE[spec] = counter
        return counter


def count_messages(messages: Iterable[Mapping[str, Any]], counter: TokenCounter | None = None
                   ) -> int:
    """Tokens a chat costs: contents plus a fixed overhead per message and for the reply."""
    c = counter or EstimateCounter()
    total = REPLY_PRIMER
    for m in messages:
        content = m.get("content")
        total += MESSAGE_OVERHEAD + (c.count(content) if isinstance(content, str) else 0)
    return total
