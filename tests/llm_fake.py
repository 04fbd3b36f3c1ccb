"""A scripted fake model backend for the unit tests of cce_duck.llm and cce_duck.tools.

It stands in for a paid model API, which cannot exist on these machines; the end-to-end tests
(marker ``e2e``) run the same code against a real model server instead. Each call pops the next
scripted item (a reply text, ``None`` for an empty reply, or an exception to raise) or asks a
responder function; every request is recorded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cce_duck.llm import Reply

Script = str | None | BaseException


class FakeBackend:
    """Scripted replies; ``responder(messages) -> str`` answers once the script is used up."""

    name = "fake"

    def __init__(self, script: list[Script] | None = None,
                 responder: Callable[[list[dict[str, str]]], str | None] | None = None) -> None:
        self.script = list(script or [])
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def complete(self, model: str, messages: list[dict[str, str]], options: dict[str, Any],
                 timeout: float) -> Reply:
        with self._lock:
            self.requests.append({"model": model, "messages": messages, "options": options,
                                  "timeout": timeout})
            item: Script
            if self.script:
                item = self.script.pop(0)
            elif self.responder is not None:
                item = self.responder(messages)
            else:
                raise AssertionError("the fake backend ran out of scripted replies")
        if isinstance(item, BaseException):
            raise item
        words = sum(len(m["content"].split()) for m in messages)
        return Reply(item, words, 0 if item is None else len(item.split()))

    @property
    def calls(self) -> int:
        return len(self.requests)
