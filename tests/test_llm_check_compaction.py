"""ppa_check (macro-fallacy consistency) and compact_messages (U-shaped compaction).

Model replies come from a scripted fake backend (tests/llm_fake.py) standing in for a paid model
API; here it answers from a table keyed by the sub-population named in the prompt.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from llm_fake import FakeBackend

from cce_duck import Engine
from cce_duck.errors import LLMError, ValidationError
from cce_duck.llm import LLM
from cce_duck.tools.check import ppa_check
from cce_duck.tools.compaction import SUMMARY_HEADER, compact_messages
from cce_duck.tools.replies import ReplyFormatError, parse_json_object, parse_number

TREE = [
    {"name": "young", "prior": 0.4, "children": [
        {"name": "urban", "prior": 0.5}, {"name": "rural", "prior": 0.5}]},
    {"name": "old", "prior": 0.6},
]


def answers(table: dict[str, str]) -> FakeBackend:
    def reply(messages: list[dict[str, str]]) -> str:
        pop = messages[-1]["content"].split("Population: ")[1].split("\n")[0]
        key = pop.split("sub-population: ")[-1] if "sub-population" in pop else "ALL"
        return table[key]
    return FakeBackend(responder=reply)


def llm_with(fake: FakeBackend, **kw: Any) -> LLM:
    return LLM("fake", backend=fake, context_window=2048, max_tokens=256, **kw)


# -- number and JSON parsing -------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [
    ("50%", 0.5), ("0.5", 0.5), ("1,200", 1200.0), ("0", 0.0), ("About 12.5 percent", 12.5),
    ("The answer is -3.", -3.0), ("It is 45 %.", 0.45), ("2e3 people", 2000.0), (".25", 0.25),
    ("Roughly 1,234,567.5 units", 1234567.5)])
def test_parse_number(text: str, value: float) -> None:
    assert parse_number(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["no idea", "", "many"])
def test_parse_number_refuses_text_without_a_number(text: str) -> None:
    with pytest.raises(ReplyFormatError):
        parse_number(text)


def test_parse_json_object() -> None:
    assert parse_json_object('Sure! ```json\n{"a": [1]}\n``` done') == {"a": [1]}
    assert parse_json_object('text {"b": {"c": 2}} tail {') == {"b": {"c": 2}}
    with pytest.raises(ReplyFormatError):
        parse_json_object("[1, 2] and no object")


# -- ppa_check -----------------------------------------------------------------------


def test_consistent_answers_aggregate_at_every_depth() -> None:
    fake = answers({"ALL": "0.5", "young": "0.8", "young > urban": "90%", "young > rural": "0.7",
                    "old": "0.3"})
    res = ppa_check("What share owns a bike?", "adults in Lyon", TREE, llm_with(fake))
    assert res.direct == 0.5
    assert res.aggregates[1] == pytest.approx(0.4 * 0.8 + 0.6 * 0.3)
    assert res.aggregates[2] == pytest.approx(0.4 * 0.5 * 0.9 + 0.4 * 0.5 * 0.7 + 0.6 * 0.3)
    assert res.gaps[1] == pytest.approx(res.aggregates[1] - 0.5)
    assert res.node_gaps["young"] == pytest.approx(0.8 - 0.8)
    assert res.self_consistent
    assert res.calls == 5
    assert fake.calls == 5


def test_macro_fallacy_is_reported_inconsistent() -> None:
    fake = answers({"ALL": "0.9", "young": "0.2", "young > urban": "0.2", "young > rural": "0.2",
                    "old": "0.1"})
    res = ppa_check("What share owns a bike?", "adults in Lyon", TREE, llm_with(fake))
    assert not res.self_consistent
    assert res.gaps[1] < -0.5


def test_inner_node_disagreeing_with_children_is_inconsistent() -> None:
    fake = answers({"ALL": "0.5", "young": "0.8", "young > urban": "0.1", "young > rural": "0.1",
                    "old": "0.3"})
    res = ppa_check("q?", "p", TREE, llm_with(fake), tolerance=0.2)
    assert res.node_gaps["young"] == pytest.approx(0.1 - 0.8)
    assert not res.self_consistent


def test_totals_sum_instead_of_weighting() -> None:
    fake = answers({"ALL": "1,000", "a": "600", "b": "400"})
    tree = [{"name": "a", "prior": 0.6}, {"name": "b", "prior": 0.4}]
    res = ppa_check("How many?", "p", tree, llm_with(fake), kind="total")
    assert res.aggregates[1] == 1000.0
    assert res.self_consistent


@pytest.mark.parametrize("tree", [
    [], [{"name": "a", "prior": 0.5}],  # top level must sum to 1
    [{"name": "a", "prior": 0.5, "children": [{"name": "x", "prior": 0.3}]},
     {"name": "b", "prior": 0.5}],  # a deeper level must sum to 1
    [{"name": "a", "prior": 1.5}], [{"name": "", "prior": 1.0}], [{"name": "a", "prior": "1"}],
    [{"name": "a", "prior": 0.5}, {"name": "a", "prior": 0.5}], "not a list", [42],
])
def test_bad_trees_are_refused_before_any_call(tree: Any) -> None:
    fake = FakeBackend([])
    with pytest.raises(ValidationError):
        ppa_check("q?", "p", tree, llm_with(fake))
    assert fake.calls == 0


def test_non_numeric_reply_is_reasked_once_then_errors() -> None:
    fake = FakeBackend(["lots", "0.5", "0.5", "0.5"])
    tree = [{"name": "a", "prior": 0.5}, {"name": "b", "prior": 0.5}]
    res = ppa_check("q?", "p", tree, llm_with(fake), max_workers=1)
    assert res.direct == 0.5
    assert fake.calls == 4
    with pytest.raises(ReplyFormatError):
        ppa_check("q2?", "p", tree, llm_with(FakeBackend(responder=lambda m: "unsure")))


# -- compact_messages --------------------------------------------------------------------


def summary_json(messages: list[dict[str, str]]) -> str:
    return json.dumps({"goal": "ship the release", "decisions": ["use DuckDB"],
                       "facts": ["budget is 40000 euros"], "open_items": ["pick a date"]})


def chat(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "Be helpful."},
                                 {"role": "user", "content": "Help me plan the release."}]
    for i in range(turns):
        out.append({"role": "assistant", "content": f"Step {i}: " + "details " * 30})
        out.append({"role": "user", "content": f"Question {i}: " + "more words " * 20})
    return out


def check_roles(msgs: list[dict[str, Any]]) -> None:
    """User and assistant turns alternate; an assistant may follow its own tool results."""
    roles = [m["role"] for m in msgs if m["role"] != "system"]
    for prev, cur in itertools.pairwise(roles):
        assert not (prev == cur == "user"), roles
        assert not (prev == cur == "assistant"), roles
        if cur == "tool":
            assert prev in ("assistant", "tool"), roles


def test_no_compaction_below_the_trigger() -> None:
    fake = FakeBackend([])
    res = compact_messages(chat(2), llm_with(fake), trigger_tokens=100_000)
    assert not res.compacted
    assert res.messages == chat(2)
    assert fake.calls == 0
    assert res.tokens_before == res.tokens_after


def test_u_shape_keeps_head_and_tail_and_summarises_the_middle() -> None:
    fake = FakeBackend(responder=summary_json)
    msgs = chat(12)
    res = compact_messages(msgs, llm_with(fake), trigger_tokens=500, keep_recent_tokens=150)
    assert res.compacted
    assert res.tokens_after < res.tokens_before
    out = res.messages
    assert out[:2] == msgs[:2]  # system + first user turn
    assert out[-res.tail:] == msgs[-res.tail:]
    assert out[-res.tail]["role"] == "user"
    summary = out[2]
    assert summary["role"] == "assistant"
    assert summary["content"].startswith(SUMMARY_HEADER)
    for part in ("Goal: ship the release", "- use DuckDB", "- budget is 40000 euros",
                 "- pick a date"):
        assert part in summary["content"]
    assert len(out) == 2 + 1 + res.tail
    assert res.summarised == len(msgs) - 2 - res.tail
    check_roles(out)
    assert fake.requests[0]["options"]["response_format"] == {"type": "json_object"}


def test_system_messages_in_the_middle_are_kept_verbatim() -> None:
    msgs = chat(10)
    msgs.insert(7, {"role": "system", "content": "New rule: answer in French."})
    res = compact_messages(msgs, llm_with(FakeBackend(responder=summary_json)),
                           trigger_tokens=500, keep_recent_tokens=150)
    assert res.compacted
    assert [m for m in res.messages if m["role"] == "system"] == [
        m for m in msgs if m["role"] == "system"]


def tool_chat() -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Agent."},
                                  {"role": "user", "content": "Find the bug."}]
    for i in range(8):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function",
             "function": {"name": "grep", "arguments": json.dumps({"q": f"x{i}"})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "match " * 40})
    msgs.append({"role": "assistant", "content": "Found it in parser.py."})
    return msgs


def test_tool_calls_stay_with_their_results_in_an_agentic_run() -> None:
    msgs = tool_chat()
    res = compact_messages(msgs, llm_with(FakeBackend(responder=summary_json)),
                           trigger_tokens=300, keep_recent_tokens=120)
    assert res.compacted
    out = res.messages
    ids_called = {c["id"] for m in out for c in m.get("tool_calls") or []}
    ids_answered = {m["tool_call_id"] for m in out if m["role"] == "tool"}
    assert ids_called == ids_answered
    assert out[0] == msgs[0]
    assert SUMMARY_HEADER in out[1]["content"]
    assert out[1]["content"].startswith("Find the bug.")
    assert out[2]["role"] == "assistant"
    assert out[-1] == msgs[-1]
    check_roles(out)


def test_bad_model_json_raises_and_leaves_input_untouched() -> None:
    msgs = chat(12)
    copy = json.loads(json.dumps(msgs))
    with pytest.raises(LLMError):
        compact_messages(msgs, llm_with(FakeBackend(responder=lambda m: "no json here")),
                         trigger_tokens=500)
    assert msgs == copy


@pytest.mark.parametrize(("msgs", "kw"), [
    ([], {"trigger_tokens": 10}),
    ([{"role": "user", "content": "x"}], {"trigger_tokens": 0}),
    ([{"role": "user", "content": "x"}], {"trigger_tokens": 10, "keep_recent_tokens": -1}),
    ([{"role": "tool", "tool_call_id": "zz", "content": "orphan"}], {"trigger_tokens": 10}),
    ([{"role": "user", "content": None}], {"trigger_tokens": 10}),
    ([{"role": "user", "content": "x", "tool_calls": []}], {"trigger_tokens": 10}),
])
def test_bad_input_is_refused(msgs: Any, kw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        compact_messages(msgs, llm_with(FakeBackend([])), **kw)


def test_compaction_is_cached() -> None:
    with Engine(data_dir=None, embedder="hash") as eng:
        fake = FakeBackend(responder=summary_json)
        llm = llm_with(fake, store=eng)
        a = compact_messages(chat(12), llm, trigger_tokens=500)
        b = compact_messages(chat(12), llm, trigger_tokens=500)
        assert a.messages == b.messages
        assert b.cache_hits == a.calls
        assert b.calls == 0
