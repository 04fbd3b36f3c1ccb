"""A macro-fallacy consistency check: does the model's answer for a whole population agree with
its answers for the parts, weighted by their priors?

The question is asked for the population and for every node of a tree of sub-populations. For
each depth ``d`` the aggregate combines the answers of the nodes at that depth (a node without
children at a shallower depth stands for itself), weighted by the product of priors along its path
(``kind="mean"``, for rates, shares, averages) or summed (``kind="total"``, for counts). The gaps
between the direct answer and each aggregate, and between every inner node and its children,
decide the ``self_consistent`` verdict.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from cce_duck.errors import ValidationError
from cce_duck.llm.client import LLM
from cce_duck.tools.prompts import prompt
from cce_duck.tools.replies import ReplyFormatError, parse_number

__all__ = ["CheckResult", "Node", "parse_tree", "ppa_check"]

MAX_NODES = 200
MAX_DEPTH = 6


@dataclass
class Node:
    """A sub-population: its name, prior (share of its parent) and children."""

    name: str
    prior: float
    children: list[Node] = field(default_factory=list)


@dataclass
class CheckResult:
    """The direct estimate, aggregates and gaps per depth, per-node answers and the verdict."""

    question: str
    population: str
    kind: str
    direct: float
    aggregates: dict[int, float]
    gaps: dict[int, float]
    estimates: dict[str, float]
    node_gaps: dict[str, float]
    tolerance: float
    self_consistent: bool
    calls: int
    cache_hits: int

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready)."""
        return dict(self.__dict__)


def parse_tree(tree: Sequence[Node | Mapping[str, Any]], prior_tolerance: float = 0.01
               ) -> list[Node]:
    """Validated nodes from ``Node`` objects or ``{"name", "prior", "children"}`` mappings.

    Every group of siblings, the top level included, must have priors in [0, 1] summing to 1
    within ``prior_tolerance``; names are non-empty and unique among siblings.
    """
    count = [0]

    def one(item: Node | Mapping[str, Any], path: str, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise ValidationError(f"the tree is deeper than {MAX_DEPTH} levels")
        count[0] += 1
        if count[0] > MAX_NODES:
            raise ValidationError(f"the tree has more than {MAX_NODES} nodes")
        name: object
        prior: object
        kids: object
        if isinstance(item, Node):
            name, prior, kids = item.name, item.prior, item.children
        elif isinstance(item, Mapping):
            name, prior, kids = item.get("name"), item.get("prior"), item.get("children") or []
        else:
            raise ValidationError(f"tree node under {path or 'the top'} is not a node or mapping")
        if not isinstance(name, str) or not name.strip():
            raise ValidationError(f"a node under {path or 'the top'} has no name")
        if isinstance(prior, bool) or not isinstance(prior, int | float) or not (
            0.0 <= prior <= 1.0) or math.isnan(prior):
            raise ValidationError(f"node {name!r} has prior {prior!r}; priors are numbers in [0, 1]")
        return Node(name.strip(), float(prior), group(kids, f"{path}/{name.strip()}", depth + 1))

    def group(items: Any, path: str, depth: int) -> list[Node]:
        if not isinstance(items, Sequence) or isinstance(items, str):
            raise ValidationError(f"the children of {path or 'the top'} must be a list")
        nodes = [one(x, path, depth) for x in items]
        if nodes:
            total = sum(n.prior for n in nodes)
            if abs(total - 1.0) > prior_tolerance:
                raise ValidationError(
                    f"the priors under {path or 'the top level'} sum to {total:.4g}, not 1 "
                    f"(tolerance {prior_tolerance})")
            names = [n.name for n in nodes]
            if len(set(names)) != len(names):
                raise ValidationError(f"sibling names under {path or 'the top'} repeat")
        return nodes

    nodes = group(tree, "", 1)
    if not nodes:
        raise ValidationError("the tree needs at least one sub-population")
    return nodes


def _walk(nodes: list[Node], prefix: str = "", depth: int = 1, weight: float = 1.0
          ) -> list[tuple[str, Node, int, float]]:
    out = []
    for n in nodes:
        path = f"{prefix} > {n.name}" if prefix else n.name
        out.append((path, n, depth, weight * n.prior))
        out.extend(_walk(n.children, path, depth + 1, weight * n.prior))
    return out


def ppa_check(question: str, population: str, tree: Sequence[Node | Mapping[str, Any]],
              llm: LLM, *, kind: Literal["mean", "total"] = "mean", tolerance: float = 0.1,
              relative: bool = True, prior_tolerance: float = 0.01, max_workers: int = 4
              ) -> CheckResult:
    """Ask ``question`` for ``population`` and every sub-population; compare the answers.

    A gap is within tolerance when ``|aggregate - direct| <= tolerance`` times
    ``max(|direct|, |aggregate|)`` (``relative=True``) or in absolute terms.
    """
    for name, value in (("question", question), ("population", population)):
        if not isinstance(value, str) or not value.strip():
            raise ValidationError(f"{name} must be a non-empty string")
    if kind not in ("mean", "total"):
        raise ValidationError("kind must be 'mean' or 'total'")
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or tolerance < 0:
        raise ValidationError("tolerance must be a number >= 0")
    if not isinstance(llm, LLM):
        raise ValidationError("llm must be a cce_duck.llm.LLM")
    nodes = parse_tree(tree, prior_tolerance)
    flat = _walk(nodes)
    targets = [population] + [f"{population}, sub-population: {path}" for path, *_ in flat]
    p = prompt("ppa_estimate")
    stats = {"calls": 0, "hits": 0}
    lock = threading.Lock()

    def ask(target: str) -> float:
        for attempt in range(2):
            c = llm.chat(p.messages(question=question, population=target),
                         prompt_version=p.key + ("" if attempt == 0 else "#reask"), max_tokens=24)
            with lock:
                stats["hits" if c.cached else "calls"] += 1
            try:
                return parse_number(c.text)
            except ReplyFormatError:
                if attempt:
                    raise
        raise AssertionError("unreachable")

    with ThreadPoolExecutor(max_workers=max(1, int(max_workers))) as pool:
        answers = list(pool.map(ask, targets))
    direct = answers[0]
    estimates = {path: a for (path, *_), a in zip(flat, answers[1:], strict=True)}
    by_path = {path: (node, depth, w) for path, node, depth, w in flat}

    def combine(value: float, weight: float) -> float:
        return value * weight if kind == "mean" else value

    max_depth = max(d for _, _, d, _ in flat)
    aggregates: dict[int, float] = {}
    for d in range(1, max_depth + 1):
        aggregates[d] = sum(combine(estimates[path], w) for path, node, depth, w in flat
                            if depth == d or (depth < d and not node.children))

    def within(a: float, b: float) -> bool:
        gap = abs(a - b)
        return gap <= (tolerance * max(abs(a), abs(b)) if relative else tolerance) + 1e-12

    node_gaps: dict[str, float] = {}
    for path, (node, _, _) in by_path.items():
        if node.children:
            kids = sum(
                (estimates[f"{path} > {c.name}"] * c.prior) if kind == "mean"
                else estimates[f"{path} > {c.name}"] for c in node.children)
            node_gaps[path] = kids - estimates[path]
    gaps = {d: a - direct for d, a in aggregates.items()}
    ok = all(within(direct, a) for a in aggregates.values()) and all(
        within(estimates[path], estimates[path] + g) for path, g in node_gaps.items())
    return CheckResult(question, population, kind, direct, aggregates, gaps, estimates, node_gaps,
                       float(tolerance), ok, stats["calls"], stats["hits"])
