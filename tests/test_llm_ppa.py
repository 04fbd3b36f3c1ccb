"""PPA compression: partition, leaf summaries, aggregation, budget guarantee, cache, provenance.

The model is a scripted fake backend (tests/llm_fake.py) standing in for a paid model API: it
"summarises" by keeping the first words of the passage, as many as the prompt allows.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from llm_fake import FakeBackend

from cce_duck import Engine
from cce_duck.errors import BudgetExceededError, LLMError, ValidationError
from cce_duck.llm import LLM
from cce_duck.llm.tokens import EstimateCounter
from cce_duck.tools.ppa import partition, ppa_compress, truncate_to_tokens

WORDS = re.compile(r"at most (\d+) words")


def first_words(messages: list[dict[str, str]]) -> str:
    user = messages[-1]["content"]
    limit = int(WORDS.search(user).group(1))  # type: ignore[union-attr]
    body = user.split("\n\n", 1)[1]
    body = re.sub(r"</?(passage|summary)>", " ", body)
    return " ".join(body.split()[:limit])


def long_text(n_paragraphs: int, topic: str) -> str:
    paras = []
    for p in range(n_paragraphs):
        paras.append(" ".join(
            f"In part {p} sentence {s} the {topic} team decided item {p * 10 + s} for the plan."
            for s in range(6)))
    return "\n\n".join(paras)


def make_llm(responder: Any = first_words, **kw: Any) -> tuple[LLM, FakeBackend]:
    fake = FakeBackend(responder=responder)
    return LLM("fake", backend=fake, context_window=2048, max_tokens=256, **kw), fake


CHAT = [
    {"role": "system", "content": "You are a planning assistant."},
    {"role": "user", "content": long_text(12, "database")},
    {"role": "assistant", "content": long_text(9, "budget")},
    {"role": "user", "content": "So what did we decide?"},
]


def test_partition_keeps_offsets_and_limits() -> None:
    text = long_text(8, "x")
    c = EstimateCounter()
    leaves = partition(text, 120, c)
    assert len(leaves) > 1
    for a, b, n in leaves:
        assert n <= 120
        assert n == c.count(text[a:b])
        assert text[a:b] == text[a:b].strip()
    assert leaves[0][0] == 0
    assert leaves[-1][1] == len(text)
    joined = " ".join(text[a:b] for a, b, _ in leaves)
    assert joined.split() == text.split()  # nothing lost, in order


def test_partition_splits_a_giant_sentence_by_words() -> None:
    text = " ".join(f"word{i}" for i in range(500))
    leaves = partition(text, 50, EstimateCounter())
    assert all(n <= 50 for _, _, n in leaves)
    assert len(leaves) >= 10
    assert " ".join(text[a:b] for a, b, _ in leaves) == text


def test_no_model_call_when_everything_fits() -> None:
    llm, fake = make_llm()
    res = ppa_compress(CHAT, 100_000, llm)
    assert res.messages == CHAT
    assert res.calls == 0
    assert fake.calls == 0
    assert res.tokens_before == res.tokens_after


def test_compresses_every_long_message_to_the_budget_with_provenance() -> None:
    llm, fake = make_llm()
    before = llm.count_messages(CHAT)
    budget = before // 4
    res = ppa_compress(CHAT, budget, llm, leaf_tokens=150)
    assert res.tokens_after <= budget
    assert llm.count_messages(res.messages) == res.tokens_after
    assert res.tokens_before == before
    assert sorted(res.summaries) == [1, 2]  # both long messages, not only the longest
    assert res.messages[0] == CHAT[0]
    assert res.messages[3] == CHAT[3]
    assert [m["role"] for m in res.messages] == [m["role"] for m in CHAT]
    for lf in res.leaves:
        src = CHAT[lf.message_index]["content"]
        assert src[lf.start:lf.end].strip()
        assert lf.tokens <= 150
        assert lf.summary
    assert res.calls == fake.calls
    assert res.calls >= len(res.leaves)
    assert not res.truncated
    prov = res.provenance()
    assert prov["tokens_after"] == res.tokens_after
    assert len(prov["leaves"]) == len(res.leaves)
    # each leaf was summarised in isolation: its request holds only its own text
    leaf_reqs = [r for r in fake.requests if "Summarise this passage" in r["messages"][1]["content"]]
    assert len(leaf_reqs) == len(res.leaves)


def test_aggregation_is_hierarchical_and_every_call_fits_the_window() -> None:
    llm, fake = make_llm()
    big = [{"role": "user", "content": long_text(80, "infra")}]
    res = ppa_compress(big, 200, llm, leaf_tokens=300)
    assert res.tokens_after <= 200
    assert res.levels[0] >= 1
    for r in fake.requests:
        assert llm.count_messages(r["messages"]) + r["options"]["max_tokens"] <= llm.context_window


def test_second_run_is_served_from_the_cache() -> None:
    with Engine(data_dir=None, embedder="hash") as eng:
        llm, fake = make_llm(store=eng)
        first = ppa_compress(CHAT, 300, llm, leaf_tokens=150)
        calls = fake.calls
        second = ppa_compress(CHAT, 300, llm, leaf_tokens=150)
        assert fake.calls == calls
        assert second.calls == 0
        assert second.cache_hits == first.calls
        assert second.messages == first.messages


def test_budget_guarantee_raises_or_truncates() -> None:
    def verbose(messages: list[dict[str, str]]) -> str:
        return "blah " * 400  # ignores the word limit

    llm, _ = make_llm(verbose, max_retries=0)
    with pytest.raises(BudgetExceededError):
        ppa_compress(CHAT, 200, llm, leaf_tokens=150)
    res = ppa_compress(CHAT, 200, llm, leaf_tokens=150, truncate=True)
    assert res.truncated
    assert res.tokens_after <= 200


def test_impossible_budget_raises_budget_exceeded() -> None:
    llm, fake = make_llm()
    with pytest.raises(BudgetExceededError):
        ppa_compress(CHAT, 10, llm)
    assert fake.calls == 0


@pytest.mark.parametrize("budget", [0, -5, 1.5, True, "100"])
def test_bad_budget(budget: Any) -> None:
    llm, _ = make_llm()
    with pytest.raises(ValidationError):
        ppa_compress(CHAT, budget, llm)


def test_bad_messages_and_leaf_size() -> None:
    llm, _ = make_llm()
    with pytest.raises(ValidationError):
        ppa_compress([], 100, llm)
    with pytest.raises(ValidationError):
        ppa_compress(CHAT, 100, llm, leaf_tokens=5)
    with pytest.raises(ValidationError):
        ppa_compress(CHAT, 100, llm, leaf_tokens=100_000)


def test_a_failing_model_call_raises_llm_error() -> None:
    llm, _ = make_llm(lambda m: None, max_retries=0)
    with pytest.raises(LLMError):
        ppa_compress(CHAT, 200, llm, leaf_tokens=150)


def test_truncate_to_tokens() -> None:
    c = EstimateCounter()
    text = "alpha beta gamma delta epsilon zeta"
    assert truncate_to_tokens(text, 3, c) == "alpha beta gamma"
    assert truncate_to_tokens(text, 100, c) == text
    assert truncate_to_tokens(text, 0, c) == ""
