"""ACE playbook (bullets in the store, Markdown/OKF round trips) and the Evolver loop.

The Generator, Reflector and Curator replies come from a scripted fake backend
(tests/llm_fake.py) standing in for a paid model API.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llm_fake import FakeBackend

from cce_duck import Engine
from cce_duck.errors import ConflictError, NotFoundError, ValidationError
from cce_duck.llm import LLM
from cce_duck.tools.evolver import Evolver, validate_operations
from cce_duck.tools.playbook import Bullet, Playbook, parse_markdown


@pytest.fixture
def eng() -> Any:
    with Engine(data_dir=None, embedder="hash") as e:
        yield e


def test_playbook_persists_in_the_store_file(tmp_path: Path) -> None:
    with Engine(data_dir=tmp_path / "store", embedder="hash") as e:
        bid = Playbook(e, "p").add("facts", "The warehouse is in Lyon.")
    with Engine(data_dir=tmp_path / "store", embedder="hash") as e:
        assert Playbook(e, "p").get(bid).content == "The warehouse is in Lyon."
        assert Playbook(e, "p").add("facts", "Another.") > bid


def test_bullets_live_in_the_table_with_a_global_counter(eng: Engine) -> None:
    a, b = Playbook(eng, "alpha"), Playbook(eng, "beta")
    i1 = a.add("strategies", "Check units before adding numbers.")
    i2 = b.add("pitfalls", "Do not trust totals without a source.")
    i3 = a.add("strategies", "Quote the source sentence.")
    assert i1 < i2 < i3  # one counter across playbooks
    rows = eng.sql("SELECT playbook, section, content, helpful, harmful FROM playbook_bullets "
                   "ORDER BY bullet_id").rows()
    assert rows[0] == ("alpha", "strategies", "Check units before adding numbers.", 0, 0)
    assert [x.id for x in a.bullets()] == [i1, i3]
    assert len(b.bullets()) == 1
    assert eng.sql("SELECT count(*) FROM playbook_bullets WHERE vector IS NULL").item() == 0
    with pytest.raises(NotFoundError):
        a.get(i2)


def test_markdown_and_okf_round_trips_are_lossless(eng: Engine, tmp_path: Path) -> None:
    pb = Playbook(eng, "p")
    pb.add("strategies", "Check units before adding numbers.")
    pb.add("pitfalls", "Percentages of different bases do not add.")
    bullets = pb.bullets()
    bumped = [Bullet(b.id, b.section, b.content, 3, 1, b.created_at, b.updated_at) for b in bullets]
    pb.replace_all(bumped)
    saved = pb.bullets()
    md = pb.to_markdown()
    assert parse_markdown(md) == saved
    pb.replace_all([])
    pb.load_markdown(md)
    assert pb.bullets() == saved
    pb.to_okf(tmp_path / "okf")
    pb.replace_all([])
    pb.load_okf(tmp_path / "okf")
    assert pb.bullets() == saved
    with pytest.raises(ConflictError):  # ids are global: another playbook cannot reuse them
        Playbook(eng, "copy").load_markdown(md)


@pytest.mark.parametrize("text", ["## strategies\n- not a bullet line\n",
                                  "- [b1 +0 -0 2026-01-01T00:00:00 2026-01-01T00:00:00] no section",
                                  "## Bad Section\n",
                                  "## s\n- [b1 +0 -0 2026-13-01T00:00:00 2026-01-01T00:00:00] x\n"])
def test_bad_markdown_is_refused_and_changes_nothing(eng: Engine, text: str) -> None:
    pb = Playbook(eng, "p")
    pb.add("strategies", "keep me")
    with pytest.raises(ValidationError):
        pb.load_markdown(text)
    assert [b.content for b in pb.bullets()] == ["keep me"]


def test_validate_operations() -> None:
    ok, bad = validate_operations([
        {"op": "ADD", "section": "strategies", "content": "new"},
        {"op": "add", "section": "nowhere", "content": "x"},
        {"op": "UPDATE", "id": 1, "content": "better"},
        {"op": "DELETE", "id": 99},
        {"op": "MERGE", "ids": [1, 2], "content": "both"},
        {"op": "DELETE", "id": 2},  # merged away above
        {"op": "FROB"}, "junk",
    ], {1, 2}, ["strategies"])
    assert [o.op for o in ok] == ["ADD", "UPDATE", "MERGE"]
    assert len(bad) == 5


def scripted(curate_ops: list[list[dict[str, Any]]], answers: list[str]) -> FakeBackend:
    """Generator answers from ``answers``; Curator emits ``curate_ops`` in turn."""
    def reply(messages: list[dict[str, str]]) -> str:
        system = messages[0]["content"]
        if system.startswith("You answer"):
            return json.dumps({"answer": answers.pop(0), "bullet_ids": [1, 2]})
        if system.startswith("You diagnose"):
            return json.dumps({"diagnosis": "wrong unit", "key_insight": "convert units",
                               "helpful_ids": [], "harmful_ids": [1]})
        return json.dumps({"operations": curate_ops.pop(0) if curate_ops else []})
    return FakeBackend(responder=reply)


def evaluator(sample: dict[str, Any], answer: str) -> tuple[bool, str]:
    ok = answer.strip() == sample["answer"]
    return ok, "correct" if ok else f"expected {sample['answer']}"


def test_evolver_credits_reflects_curates_and_dedups(eng: Engine) -> None:
    pb = Playbook(eng, "ace")
    first = pb.add("strategies", "Always convert units first.")
    fake = scripted(
        curate_ops=[[{"op": "ADD", "section": "pitfalls", "content": "Metres are not feet."},
                     {"op": "ADD", "section": "pitfalls", "content": "Metres are not feet."},
                     {"op": "ADD", "section": "strategies", "content": "Always convert units first."},
                     {"op": "UPDATE", "id": 424242, "content": "x"}]],
        answers=["4", "15", "12"])
    samples = [{"question": "2+2?", "answer": "4"}, {"question": "1 foot in inches?", "answer": "12"}]
    ev = Evolver(LLM("fake", backend=fake), max_rounds=2)
    report = ev.run(pb, samples, evaluator)
    s0, s1 = report.steps
    assert s0.correct
    assert s0.rounds == 0
    assert s0.credited == {"helpful": [first]}
    assert s1.correct
    assert s1.rounds == 1
    assert [a["op"] for a in s1.applied] == ["ADD"]
    reasons = " | ".join(r["reason"] for r in s1.rejected)
    assert "duplicate" in reasons
    assert "no bullet 424242" in reasons
    contents = [b.content for b in pb.bullets()]
    assert contents.count("Metres are not feet.") == 1
    assert contents.count("Always convert units first.") == 1
    got = pb.get(first)
    assert got.helpful == 2
    assert got.harmful == 1
    assert report.accuracy == 1.0
    assert report.failures == 0


def test_a_bad_reply_is_isolated_and_logged(eng: Engine, caplog: pytest.LogCaptureFixture) -> None:
    pb = Playbook(eng, "ace")
    pb.add("strategies", "keep")
    replies = ["not json at all", json.dumps({"answer": "4", "bullet_ids": []})]
    fake = FakeBackend(replies)
    samples = [{"question": "a?", "answer": "4"}, {"question": "b?", "answer": "4"}]
    report = Evolver(LLM("fake", backend=fake)).run(pb, samples, evaluator)
    assert report.failures == 1
    assert report.steps[0].error
    assert "JSON" in report.steps[0].error
    assert report.steps[1].correct
    assert "evolver step 0 failed" in caplog.text
    assert [b.content for b in pb.bullets()] == ["keep"]


def test_trim_to_token_budget_drops_least_useful_first(eng: Engine) -> None:
    pb = Playbook(eng, "ace")
    ids = [pb.add("facts", f"Fact number {i} about the warehouse schema and its many tables.")
           for i in range(12)]
    bs = pb.bullets()
    pb.replace_all([Bullet(b.id, b.section, b.content, 5 if b.id == ids[0] else 0, 0,
                           b.created_at, b.updated_at) for b in bs])
    fake = scripted([[]], ["4"])
    ev = Evolver(LLM("fake", backend=fake), token_budget=60)
    report = ev.run(pb, [{"question": "2+2?", "answer": "4"}], evaluator)
    assert report.steps[0].trimmed
    assert ev.llm.count(pb.render()) <= 60
    assert ids[0] in [b.id for b in pb.bullets()]


def test_checkpoint_and_resume(eng: Engine, tmp_path: Path) -> None:
    pb = Playbook(eng, "ace")
    ckpt = tmp_path / "ckpt.json"
    samples = [{"question": f"q{i}?", "answer": "4"} for i in range(4)]
    fake = FakeBackend([json.dumps({"answer": "4", "bullet_ids": []})] * 2
                       + [LLMBoom()] * 10)
    ev = Evolver(LLM("fake", backend=fake, max_retries=0))
    with pytest.raises(KeyboardInterrupt):
        ev.run(pb, samples, evaluator, checkpoint=ckpt)
    assert json.loads(ckpt.read_text())["next_step"] == 2
    fake2 = FakeBackend(responder=lambda m: json.dumps({"answer": "4", "bullet_ids": []}))
    report = Evolver(LLM("fake", backend=fake2)).run(pb, samples, evaluator, checkpoint=ckpt)
    assert report.resumed_from == 2
    assert len(report.steps) == 4
    assert fake2.calls == 2
    with pytest.raises(ValidationError):
        Evolver(LLM("fake", backend=fake2)).run(Playbook(eng, "other"), samples, evaluator,
                                                checkpoint=ckpt)


class LLMBoom(KeyboardInterrupt):
    """Stands for the process being stopped in the middle of a run."""


@pytest.mark.parametrize("kw", [{"max_rounds": -1}, {"dedup_threshold": 0}, {"token_budget": 0}])
def test_bad_evolver_settings(kw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Evolver(LLM("fake", backend=FakeBackend([])), **kw)


def test_bad_samples_are_refused(eng: Engine) -> None:
    ev = Evolver(LLM("fake", backend=FakeBackend([])))
    for samples in ([], [{"q": 1}], "text"):
        with pytest.raises(ValidationError):
            ev.run(Playbook(eng, "p"), samples, evaluator)  # type: ignore[arg-type]
