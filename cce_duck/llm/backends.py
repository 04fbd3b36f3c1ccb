"""Model backends: litellm (default), the raw openai client, and in-process vLLM.

Every SDK is imported lazily, when a backend is first used, so ``import cce_duck`` never needs
them; a missing one raises :class:`~cce_duck.errors.MissingExtraError` naming the extra to
install. Each backend turns its SDK's exceptions into :class:`~cce_duck.errors.LLMError` with a
``retryable`` flag (timeouts, connection errors, 408, 429 and 5xx are retryable; auth and other
4xx are not); retrying is the client's job, so SDK-level retries are switched off.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from cce_duck.errors import LLMError, MissingExtraError, ValidationError

__all__ = [
    "BACKENDS",
    "Backend",
    "LiteLLMBackend",
    "OpenAIBackend",
    "Reply",
    "VLLMBackend",
    "classify_error",
    "get_backend",
    "require",
]

_RETRYABLE_NAMES = ("Timeout", "APIConnectionError", "ServiceUnavailable", "InternalServerError",
                    "RateLimitError")


@dataclass(frozen=True)
class Reply:
    """A model's answer and its token usage as reported by the backend (``None`` if unknown)."""

    text: str | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@runtime_checkable
class Backend(Protocol):
    """Sends one chat request. Raises :class:`LLMError` (with ``retryable`` set) on failure."""

    name: str

    def complete(self, model: str, messages: list[dict[str, str]], options: dict[str, Any],
                 timeout: float) -> Reply:
        """Answer ``messages`` with ``model`` within ``timeout`` seconds."""
        ...


def require(module: str, extra: str) -> Any:
    """Import ``module`` or raise :class:`MissingExtraError` naming ``cce_duck[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"the {module!r} package is needed for this backend; install it with "
            f"pip install 'cce_duck[{extra}]'"
        ) from exc


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        raw = headers.get("retry-after") or headers.get("Retry-After")
    except Exception:
        return None
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except (TypeError, ValueError):
        return None


def classify_error(exc: BaseException) -> LLMError:
    """An :class:`LLMError` for an SDK exception, retryable only for transient failures."""
    if isinstance(exc, LLMError):
        return exc
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        status = getattr(getattr(exc, "response", None), "status_code", None)
    status = status if isinstance(status, int) else None
    names = {c.__name__ for c in type(exc).__mro__}
    if status is not None:
        retryable = status in (408, 409, 429) or status >= 500
    else:
        retryable = any(n in name for name in names for n in _RETRYABLE_NAMES) or isinstance(
            exc, TimeoutError | ConnectionError)
    if "AuthenticationError" in names or "PermissionDeniedError" in names:
        retryable = False
    label = f"HTTP {status}" if status is not None else type(exc).__name__
    return LLMError(f"model call failed ({label}): {exc}", retryable=retryable, status=status,
                    retry_after=_retry_after(exc))


def _usage(obj: Any) -> tuple[int | None, int | None]:
    usage = getattr(obj, "usage", None)
    if usage is None:
        return None, None
    p, c = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
    return (p if isinstance(p, int) else None), (c if isinstance(c, int) else None)


def _first_text(resp: Any) -> str | None:
    try:
        content = resp.choices[0].message.content
    except (AttributeError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None


class LiteLLMBackend:
    """Any model id litellm knows: ``openai/<name>`` with ``api_base`` for an OpenAI-compatible
    local server (llama.cpp, vLLM), ``anthropic/...``, ``gpt-...`` and so on. Keys come from the
    usual variables (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``)."""

    name = "litellm"

    def __init__(self, api_base: str | None = None, api_key: str | None = None) -> None:
        self.api_base = api_base
        self.api_key = api_key

    def complete(self, model: str, messages: list[dict[str, str]], options: dict[str, Any],
                 timeout: float) -> Reply:
        # The cost map ships inside the package; never fetch it at import time.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        litellm = require("litellm", "llm")
        litellm.suppress_debug_info = True
        kw: dict[str, Any] = {"timeout": timeout, "num_retries": 0, "max_retries": 0, **options}
        base = self.api_base or os.environ.get("OPENAI_API_BASE")
        if base and model.startswith("openai/"):
            kw["api_base"] = base
            kw["api_key"] = self.api_key or os.environ.get("OPENAI_API_KEY") or "no-key"
        elif self.api_key:
            kw["api_key"] = self.api_key
        try:
            resp = litellm.completion(model=model, messages=messages, **kw)
        except Exception as exc:
            raise classify_error(exc) from exc
        return Reply(_first_text(resp), *_usage(resp))


class OpenAIBackend:
    """The ``openai`` client against the OpenAI API or any OpenAI-compatible server
    (``OPENAI_API_BASE``)."""

    name = "openai"

    def __init__(self, api_base: str | None = None, api_key: str | None = None) -> None:
        self.api_base = api_base
        self.api_key = api_key
        self._clients: dict[float, Any] = {}
        self._lock = threading.Lock()

    def _client(self, timeout: float) -> Any:
        openai = require("openai", "llm")
        with self._lock:
            client = self._clients.get(timeout)
            if client is None:
                base = self.api_base or os.environ.get("OPENAI_API_BASE")
                key = self.api_key or os.environ.get("OPENAI_API_KEY") or ("no-key" if base else None)
                client = openai.OpenAI(api_key=key, base_url=base, max_retries=0, timeout=timeout)
                self._clients[timeout] = client
            return client

    def complete(self, model: str, messages: list[dict[str, str]], options: dict[str, Any],
                 timeout: float) -> Reply:
        client = self._client(round(timeout, 1))
        try:
            resp = client.chat.completions.create(model=model, messages=messages, **options)
        except Exception as exc:
            raise classify_error(exc) from exc
        return Reply(_first_text(resp), *_usage(resp))


class VLLMBackend:
    """vLLM in this process (``pip install vllm``): the model id is a local model folder or a
    name vLLM can load offline. One engine per model, loaded on first use."""

    name = "vllm"

    def __init__(self, **engine_args: Any) -> None:
        self.engine_args = engine_args
        self._engines: dict[str, Any] = {}
        self._lock = threading.Lock()

    def complete(self, model: str, messages: list[dict[str, str]], options: dict[str, Any],
                 timeout: float) -> Reply:
        vllm = require("vllm", "vllm")
        with self._lock:
            engine = self._engines.get(model)
            if engine is None:
                engine = vllm.LLM(model=model, **self.engine_args)
                self._engines[model] = engine
            params = vllm.SamplingParams(
                temperature=float(options.get("temperature", 0.0)),
                max_tokens=int(options.get("max_tokens", 512)),
            )
            try:
                out = engine.chat(messages, params, use_tqdm=False)[0]
            except Exception as exc:
                raise LLMError(f"vLLM generation failed: {exc}") from exc
        first = out.outputs[0]
        prompt_ids = getattr(out, "prompt_token_ids", None)
        return Reply(first.text, len(prompt_ids) if prompt_ids is not None else None,
                     len(first.token_ids))


BACKENDS: dict[str, Callable[..., Backend]] = {
    "litellm": LiteLLMBackend,
    "openai": OpenAIBackend,
    "vllm": VLLMBackend,
}


def get_backend(spec: str | Backend | None = None, **kwargs: Any) -> Backend:
    """A backend by name (``CCE_LLM_BACKEND``, default ``litellm``) or the object itself."""
    if spec is not None and not isinstance(spec, str):
        if not isinstance(spec, Backend):
            raise ValidationError("backend must be a name or an object with .name and .complete()")
        return spec
    name = (spec or os.environ.get("CCE_LLM_BACKEND") or "litellm").strip().lower()
    if name not in BACKENDS:
        raise ValidationError(f"unknown LLM backend {name!r}; choose one of {sorted(BACKENDS)}")
    if name == "vllm":
        return BACKENDS[name]()
    return BACKENDS[name](**kwargs)
