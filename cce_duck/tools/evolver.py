"""ACE-style playbook evolution: Generator → Reflector → Curator over a stream of samples.

For each sample the Generator answers with the playbook in its prompt and names the bullets it
used; the ``evaluator`` judges the answer. A right answer credits the bullets used (helpful + 1).
A wrong one goes through up to ``max_rounds`` of reflect → regenerate (the reflection's insight
is given to the next try); the Reflector's verdicts move helpful/harmful counts, and the Curator
turns the last reflection into typed operations (ADD / UPDATE / MERGE / DELETE) that are
validated one by one and applied in one transaction. An ADD whose embedding is within
``dedup_threshold`` cosine of an existing bullet is not added (logged as a duplicate). The
playbook is then trimmed to ``token_budget`` by usefulness, then age. Each step is logged; the
checkpoint file lets a run resume after the last finished step. A reply that is not the expected
JSON fails that step only: it is logged with its error, and the run goes on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from cce_duck import clock
from cce_duck.errors import CCEError, LLMError, ValidationError
from cce_duck.llm.client import LLM
from cce_duck.tools.okf import atomic_write
from cce_duck.tools.playbook import Bullet, Playbook, check_section, clean_content
from cce_duck.tools.prompts import prompt
from cce_duck.tools.replies import ReplyFormatError, parse_json_object

__all__ = ["EvolveReport", "Evolver", "Operation", "StepLog", "validate_operations"]

log = logging.getLogger(__name__)

Evaluator = Callable[[Mapping[str, Any], str], tuple[bool, str]]


@dataclass(frozen=True)
class Operation:
    """A validated curator operation."""

    op: str
    section: str | None = None
    content: str | None = None
    ids: tuple[int, ...] = ()


@dataclass
class StepLog:
    """What happened for one sample."""

    step: int
    sample: int
    correct: bool | None = None
    rounds: int = 0
    answer: str | None = None
    applied: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    credited: dict[str, list[int]] = field(default_factory=dict)
    trimmed: list[int] = field(default_factory=list)
    error: str | None = None


@dataclass
class EvolveReport:
    """The run's steps and totals."""

    steps: list[StepLog]
    correct: int
    failures: int
    bullets: int
    resumed_from: int = 0

    @property
    def accuracy(self) -> float:
        """Share of finished steps answered right (first try or after reflection)."""
        done = [s for s in self.steps if s.correct is not None]
        return sum(s.correct is True for s in done) / len(done) if done else 0.0


def _ints(raw: object) -> list[int]:
    if not isinstance(raw, list):
        return []
    out = []
    for x in raw:
        try:
            out.append(int(x))
        except (TypeError, ValueError):
            continue
    return out


def validate_operations(raw: object, existing: set[int], sections: Sequence[str]
                        ) -> tuple[list[Operation], list[dict[str, Any]]]:
    """Split raw curator operations into valid :class:`Operation` s and rejected ones (with the
    reason). Later operations see the ids removed by earlier ones."""
    if not isinstance(raw, list):
        return [], [{"op": raw, "reason": "operations is not a list"}]
    ok: list[Operation] = []
    bad: list[dict[str, Any]] = []
    alive = set(existing)
    for item in raw:
        try:
            if not isinstance(item, Mapping):
                raise ValidationError("not an object")
            kind = str(item.get("op", "")).upper()
            if kind == "ADD":
                section = check_section(str(item.get("section", "")).strip().lower())
                if section not in sections:
                    raise ValidationError(f"section {section!r} is not one of {list(sections)}")
                ok.append(Operation("ADD", section, clean_content(item.get("content"))))
            elif kind in ("UPDATE", "DELETE"):
                bid = int(item.get("id"))  # type: ignore[arg-type]
                if bid not in alive:
                    raise ValidationError(f"no bullet {bid}")
                content = clean_content(item.get("content")) if kind == "UPDATE" else None
                ok.append(Operation(kind, None, content, (bid,)))
                if kind == "DELETE":
                    alive.discard(bid)
            elif kind == "MERGE":
                ids = tuple(dict.fromkeys(_ints(item.get("ids"))))
                if len(ids) < 2 or any(i not in alive for i in ids):
                    raise ValidationError("MERGE needs two or more existing ids")
                ok.append(Operation("MERGE", None, clean_content(item.get("content")), ids))
                alive.difference_update(ids[1:])
            else:
                raise ValidationError(f"unknown op {kind!r}")
        except (ValidationError, TypeError, ValueError) as exc:
            bad.append({"op": item, "reason": str(exc)})
    return ok, bad


class Evolver:
    """Evolves a :class:`Playbook` with a model.

    Args:
        llm: The model client (its cache makes re-runs cheap).
        max_rounds: Reflect → regenerate rounds on a wrong answer.
        dedup_threshold: Cosine at or above which an ADD counts as a duplicate.
        token_budget: The rendered playbook is trimmed to this many tokens after each step.
        sections: Sections the Curator may add to.
    """

    def __init__(self, llm: LLM, *, max_rounds: int = 2, dedup_threshold: float = 0.90,
                 token_budget: int = 2000,
                 sections: Sequence[str] = ("strategies", "pitfalls", "facts")) -> None:
        if not isinstance(llm, LLM):
            raise ValidationError("llm must be a cce_duck.llm.LLM")
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 0:
            raise ValidationError("max_rounds must be an integer >= 0")
        if not isinstance(dedup_threshold, int | float) or not 0 < dedup_threshold <= 1:
            raise ValidationError("dedup_threshold must be in (0, 1]")
        if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget <= 0:
            raise ValidationError("token_budget must be a positive integer")
        self.llm = llm
        self.max_rounds = max_rounds
        self.dedup_threshold = float(dedup_threshold)
        self.token_budget = token_budget
        self.sections = [check_section(s) for s in sections]

    # -- the three roles ------------------------------------------------------------

    def _json(self, name: str, **fields: Any) -> dict[str, Any]:
        p = prompt(name)
        c = self.llm.chat(p.messages(**fields), prompt_version=p.key, json_object=True)
        return parse_json_object(c.text)

    def generate(self, pb: Playbook, question: str, hint: str | None = None
                 ) -> tuple[str, list[int]]:
        """The Generator: an answer and the ids of the bullets it used."""
        q = question if not hint else f"{question}\n(Hint from a review: {hint})"
        out = self._json("ace_generate", playbook=pb.prompt_view(), question=q)
        answer = out.get("answer")
        if answer is None or (isinstance(answer, str) and not answer.strip()):
            raise ReplyFormatError("the generator reply has no 'answer'")
        return str(answer).strip(), _ints(out.get("bullet_ids"))

    def reflect(self, pb: Playbook, question: str, answer: str, correct: bool, feedback: str
                ) -> dict[str, Any]:
        """The Reflector: diagnosis, key insight, helpful and harmful bullet ids."""
        out = self._json("ace_reflect", playbook=pb.prompt_view(), question=question,
                         answer=answer, correct="yes" if correct else "no", feedback=feedback)
        return {"diagnosis": str(out.get("diagnosis") or ""),
                "key_insight": str(out.get("key_insight") or ""),
                "helpful_ids": _ints(out.get("helpful_ids")),
                "harmful_ids": _ints(out.get("harmful_ids"))}

    def curate(self, pb: Playbook, question: str, reflection: Mapping[str, Any]) -> object:
        """The Curator: raw operations (validated by :func:`validate_operations`)."""
        out = self._json("ace_curate", playbook=pb.prompt_view(), question=question,
                         reflection=json.dumps(reflection, ensure_ascii=False),
                         sections=", ".join(self.sections))
        return out.get("operations", [])

    # -- applying -------------------------------------------------------------------

    def apply(self, pb: Playbook, ops: list[Operation], credit: Mapping[str, list[int]],
              step: StepLog) -> None:
        """Apply operations and credits in one transaction; log what was applied."""
        now = clock.now(whole_seconds=True)
        bullets = {b.id: b for b in pb.bullets()}
        for key in ("helpful", "harmful"):
            for bid in credit.get(key, []):
                if bid in bullets:
                    b = bullets[bid]
                    bullets[bid] = Bullet(b.id, b.section, b.content,
                                          b.helpful + (key == "helpful"),
                                          b.harmful + (key == "harmful"), b.created_at, now)
                    step.credited.setdefault(key, []).append(bid)
        pending: list[tuple[int, Any]] = []
        for op in ops:
            if op.op == "ADD":
                assert op.content is not None
                assert op.section is not None
                dup = pb.similar(op.content, self.dedup_threshold) if bullets else None
                vec = pb.embedder.embed([op.content])[0]
                for pid, pvec in pending:
                    cos = float(vec @ pvec)
                    if dup is None and cos >= self.dedup_threshold:
                        dup = (pid, cos)
                if dup is not None and dup[0] in bullets:
                    step.rejected.append({"op": "ADD", "content": op.content,
                                          "reason": f"duplicate of bullet {dup[0]} "
                                                    f"(cosine {dup[1]:.3f})"})
                    continue
                (bid,) = pb.next_ids(1)
                bullets[bid] = Bullet(bid, op.section, op.content, 0, 0, now, now)
                pending.append((bid, vec))
                step.applied.append({"op": "ADD", "id": bid, "section": op.section,
                                     "content": op.content})
            elif op.op == "UPDATE":
                b = bullets[op.ids[0]]
                bullets[b.id] = Bullet(b.id, b.section, op.content or b.content, b.helpful,
                                       b.harmful, b.created_at, now)
                step.applied.append({"op": "UPDATE", "id": b.id, "content": op.content})
            elif op.op == "DELETE":
                bullets.pop(op.ids[0], None)
                step.applied.append({"op": "DELETE", "id": op.ids[0]})
            elif op.op == "MERGE":
                keep = bullets[op.ids[0]]
                rest = [bullets.pop(i) for i in op.ids[1:]]
                bullets[keep.id] = Bullet(
                    keep.id, keep.section, op.content or keep.content,
                    keep.helpful + sum(r.helpful for r in rest),
                    keep.harmful + sum(r.harmful for r in rest), keep.created_at, now)
                step.applied.append({"op": "MERGE", "ids": list(op.ids), "content": op.content})
        kept = self._trim(pb, sorted(bullets.values(), key=lambda b: b.id), step)
        pb.replace_all(kept)

    def _trim(self, pb: Playbook, bullets: list[Bullet], step: StepLog) -> list[Bullet]:
        order = sorted(bullets, key=lambda b: (b.score, b.updated_at or datetime.min, b.id))
        alive = list(bullets)
        while alive and self.llm.count(pb.render(alive)) > self.token_budget:
            victim = order.pop(0)
            alive.remove(victim)
            step.trimmed.append(victim.id)
        return alive

    # -- the loop -------------------------------------------------------------------

    def step(self, pb: Playbook, sample: Mapping[str, Any], evaluator: Evaluator,
             step: StepLog) -> None:
        """One sample through Generator, evaluator, Reflector and Curator."""
        question = sample.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValidationError("each sample needs a non-empty 'question'")
        answer, used = self.generate(pb, question)
        correct, feedback = evaluator(sample, answer)
        step.answer, step.correct = answer, bool(correct)
        if correct:
            self.apply(pb, [], {"helpful": used}, step)
            return
        reflection: dict[str, Any] = {}
        for _ in range(self.max_rounds):
            step.rounds += 1
            reflection = self.reflect(pb, question, answer, False, feedback)
            answer, used = self.generate(pb, question, reflection["key_insight"] or None)
            correct, feedback = evaluator(sample, answer)
            step.answer, step.correct = answer, bool(correct)
            if correct:
                break
        if not reflection:
            reflection = self.reflect(pb, question, answer, bool(correct), feedback)
        raw = self.curate(pb, question, reflection)
        existing = {b.id for b in pb.bullets()}
        ops, bad = validate_operations(raw, existing, self.sections)
        step.rejected.extend(bad)
        credit = {"helpful": reflection.get("helpful_ids", []) + (used if correct else []),
                  "harmful": reflection.get("harmful_ids", [])}
        self.apply(pb, ops, credit, step)

    def run(self, playbook: Playbook, samples: Sequence[Mapping[str, Any]], evaluator: Evaluator,
            *, epochs: int = 1, checkpoint: str | Path | None = None) -> EvolveReport:
        """Evolve ``playbook`` over ``samples`` (``epochs`` passes); resumable by ``checkpoint``."""
        if not isinstance(playbook, Playbook):
            raise ValidationError("playbook must be a Playbook")
        if not isinstance(samples, Sequence) or isinstance(samples, str) or not samples:
            raise ValidationError("samples must be a non-empty list of {'question': ...} dicts")
        if not callable(evaluator):
            raise ValidationError("evaluator must be callable(sample, answer) -> (bool, str)")
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs <= 0:
            raise ValidationError("epochs must be a positive integer")
        for i, s in enumerate(samples):
            if not isinstance(s, Mapping) or not isinstance(s.get("question"), str):
                raise ValidationError(f"sample {i} needs a 'question' string")
        ckpt = Path(checkpoint) if checkpoint is not None else None
        steps: list[StepLog] = []
        start = 0
        if ckpt is not None and ckpt.is_file():
            try:
                state = json.loads(ckpt.read_text(encoding="utf-8"))
                start = int(state["next_step"])
                steps = [StepLog(**s) for s in state["steps"]]
                if state.get("playbook") != playbook.name:
                    raise ValueError("checkpoint of another playbook")
            except (ValueError, KeyError, TypeError) as exc:
                raise ValidationError(f"checkpoint {ckpt} is not usable: {exc}") from None
        total = epochs * len(samples)
        for n in range(start, total):
            rec = StepLog(step=n, sample=n % len(samples))
            try:
                self.step(playbook, samples[n % len(samples)], evaluator, rec)
            except (LLMError, CCEError) as exc:
                rec.error = f"{type(exc).__name__}: {exc}"
                log.warning("evolver step %d failed: %s", n, rec.error)
            steps.append(rec)
            if ckpt is not None:
                atomic_write(ckpt, json.dumps({"playbook": playbook.name, "next_step": n + 1,
                                               "steps": [asdict(s) for s in steps]},
                                              ensure_ascii=False, default=str))
        return EvolveReport(steps, sum(s.correct is True for s in steps),
                            sum(s.error is not None for s in steps), len(playbook.bullets()),
                            start)
