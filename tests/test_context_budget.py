"""Property: a built context never exceeds its token cap, whatever the history and budget."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cce_duck import Engine
from cce_duck.payload import messages_tokens
from cce_duck.text import estimate_tokens

WORDS = [
    "duckdb", "budget", "migration", "garden", "piano", "hiking", "the", "and", "is", "we",
    "ACME", "40000", "03:15", "Frankfurt", "東京", "タワー", "naïve", "{", "}", "\"key\":",
    "internationalization", "ZEBRA-4471", "a", "?", ".", "!", "\n", "—", "🦆",
]

word = st.sampled_from(WORDS)
content = st.lists(word, min_size=1, max_size=120).map(" ".join).filter(lambda s: s.strip())
message = st.fixed_dictionaries({
    "role": st.sampled_from(["user", "assistant", "system", "tool"]),
    "content": content,
    "name": st.none() | st.sampled_from(["ana", "bob"]),
}).map(lambda m: {k: v for k, v in m.items() if v is not None})
conversation = st.lists(message, min_size=1, max_size=60)
query = st.sampled_from(["what did we talk about?", "recap", ""]) | content


EXAMPLES = int(os.environ.get("CCE_PROPERTY_EXAMPLES", "60"))  # raise it to search harder


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=conversation,
    max_tokens=st.integers(min_value=1, max_value=2000),
    question=query,
    hot=st.integers(min_value=1, max_value=8),
    live=st.booleans(),
    top_k=st.integers(min_value=1, max_value=10),
    last_turns=st.none() | st.integers(min_value=1, max_value=30),
)
# Regression: every hit is an uncompressed turn (no note ids) -> the note header query got ''.
@example(messages=[{"role": "user", "content": "duckdb"}] * 2, max_tokens=1, question="duckdb",
         hot=1, live=False, top_k=1, last_turns=1)
def test_context_never_exceeds_the_cap(messages: list[dict[str, Any]], max_tokens: int,
                                       question: str, hot: int, live: bool, top_k: int,
                                       last_turns: int | None) -> None:
    with Engine(data_dir=None, embedder="hash", hot_tier_max_turns=hot,
                live_batch_turns=4) as eng:
        if live:
            for m in messages:
                eng.add_messages("s", [m])
        else:
            eng.ingest("s", messages)
        payload = eng.context("s", question, max_tokens=max_tokens, top_k=top_k,
                              last_turns=last_turns, explain=True)
        assert payload.tokens <= max_tokens
        assert estimate_tokens(payload.to_string()) <= max_tokens
        assert messages_tokens(payload.to_messages()) <= max_tokens
        assert payload.explain is not None
        assert payload.explain["budget"]["used"] <= max_tokens
        # what is sent verbatim is a suffix of the stored turns, in order
        numbers = [t.turn_no for t in payload.turns]
        assert numbers == sorted(numbers)
        if numbers:
            assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
            assert numbers[-1] == len(messages) - 1
