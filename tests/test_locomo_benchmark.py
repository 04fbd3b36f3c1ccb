"""The LoCoMo quality harness (``benchmarks/locomo.py``): scoring rules, budgeted baselines, a real
run on a small LoCoMo-format file, and the analysis notebook executed headless (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
NOTEBOOK = ROOT / "notebooks" / "benchmarks.ipynb"
sys.path.insert(0, str(BENCH))

from baselines import RawTurn, TurnIndex, fill, render  # noqa: E402
from scoring import (  # noqa: E402
    answer_present,
    content_words,
    evidence_ids,
    evidence_present,
)

from cce_duck import estimate_tokens, get_embedder  # noqa: E402

SYSTEMS = {"cce_duck", "full", "recent", "bm25", "dense", "hybrid"}

# Three sessions of a small made-up conversation; each fact is said once.
SESSIONS: list[tuple[str, list[tuple[str, str]]]] = [
    ("10:00 am on 3 March, 2023", [
        ("Ana", "Hi Ben! Guess what, I adopted a grey kitten named Pepper from the shelter."),
        ("Ben", "That is lovely news. How old is Pepper?"),
        ("Ana", "Pepper is eleven weeks old and already climbs the curtains."),
        ("Ben", "My weekend was busy, I repaired the fence around the vegetable garden."),
        ("Ana", "Did the tomatoes survive the storm?"),
        ("Ben", "Most tomatoes survived, but the cucumbers were flattened."),
        ("Ana", "I am reading a novel about lighthouse keepers in Norway."),
        ("Ben", "Sounds calm. Talk soon!"),
    ]),
    ("4:30 pm on 20 April, 2023", [
        ("Ben", "I signed up for the city marathon in October."),
        ("Ana", "Wow, have you run one before?"),
        ("Ben", "Never a full marathon, only a half marathon in Lisbon two years ago."),
        ("Ana", "My sister Clara is moving to Toronto for a job in robotics."),
        ("Ben", "Robotics in Toronto, impressive. When does she leave?"),
        ("Ana", "Clara leaves in June, right after her graduation ceremony."),
        ("Ben", "I baked sourdough bread with rye flour yesterday."),
        ("Ana", "Send me the recipe please."),
    ]),
    ("9:15 am on 2 June, 2023", [
        ("Ana", "Pepper learned to open the kitchen cupboard with her paw."),
        ("Ben", "Clever cat. My knee hurts after the long training run."),
        ("Ana", "Maybe see a physiotherapist before the marathon."),
        ("Ben", "Good idea, I booked an appointment for Thursday."),
        ("Ana", "We painted the living room a pale green colour."),
        ("Ben", "Pale green sounds relaxing."),
        ("Ana", "The lighthouse novel ended sadly, the keeper left the island."),
        ("Ben", "Bye for now."),
    ]),
]
QA: list[dict[str, Any]] = [
    {"question": "What is the name of Ana's kitten?", "answer": "Pepper", "evidence": ["D1:1"],
     "category": 4},
    {"question": "Which vegetables were flattened by the storm?", "answer": "cucumbers",
     "evidence": ["D1:6"], "category": 4},
    {"question": "Where is Clara moving, and when does she leave?", "answer": "Toronto, June",
     "evidence": ["D2:4", "D2:6"], "category": 1},
    {"question": "When did Ben sign up for the marathon?", "answer": "April 2023",
     "evidence": ["D2:1"], "category": 2},
    {"question": "Would Ben enjoy baking at home?", "answer": "yes, he baked sourdough bread",
     "evidence": ["D2:7"], "category": 3},
    {"question": "Where did Ben run a half marathon?", "answer": "Lisbon",
     "evidence": ["D2:3; D3:2"], "category": 4},
    {"question": "What colour did Ana paint the kitchen?", "adversarial_answer": "pale green",
     "evidence": ["D3:5"], "category": 5},
]


def write_locomo(path: Path) -> Path:
    """A LoCoMo-format file with one conversation."""
    conv: dict[str, Any] = {"speaker_a": "Ana", "speaker_b": "Ben"}
    for n, (when, turns) in enumerate(SESSIONS, start=1):
        conv[f"session_{n}_date_time"] = when
        conv[f"session_{n}"] = [{"speaker": s, "dia_id": f"D{n}:{i}", "text": t}
                                for i, (s, t) in enumerate(turns, start=1)]
    path.write_text(json.dumps([{"sample_id": "conv-test", "conversation": conv, "qa": QA}]))
    return path


def run_harness(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, str(BENCH / "locomo.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


# -- scoring --------------------------------------------------------------------


def test_content_words_are_lowercase_3_letter_non_stop_words() -> None:
    assert content_words("The Cat sat on a MAT, it's 2023! ok yes") == {"cat", "sat", "mat", "2023"}


def test_evidence_needs_half_of_its_words() -> None:
    turn = content_words("grey kitten named Pepper shelter")
    assert evidence_present(turn, content_words("grey kitten Pepper"))  # 3 of 5
    assert not evidence_present(turn, content_words("grey kitten"))  # 2 of 5


def test_answer_needs_every_word() -> None:
    assert answer_present(content_words("Toronto, June"), content_words("June in Toronto"))
    assert not answer_present(content_words("Toronto, June"), content_words("Toronto in May"))


def test_evidence_ids_split_and_normalise() -> None:
    assert evidence_ids(["D1:3", "D8:6; D9:17", "D:11:26", "D1:3", "D"]) == [
        "D1:3", "D8:6", "D9:17", "D11:26"]


# -- baselines ------------------------------------------------------------------


def _turns() -> list[RawTurn]:
    t0 = datetime(2023, 3, 3, 10)
    out = []
    for n, (_, turns) in enumerate(SESSIONS):
        for i, (speaker, text) in enumerate(turns):
            out.append(RawTurn(len(out), speaker, text, t0 + timedelta(days=40 * n, seconds=30 * i)))
    return out


@pytest.mark.parametrize("budget", [20, 45, 80, 150, 400])
def test_fill_never_exceeds_the_budget_and_keeps_conversation_order(budget: int) -> None:
    turns = _turns()
    ranked = list(range(len(turns)))[::-1]
    ranked = ranked[::2] + ranked[1::2]
    chosen = fill(turns, ranked, budget)
    text = render(turns, chosen)
    assert estimate_tokens(text) <= budget
    assert chosen, "something always fits in these budgets"
    lines = [ln for ln in text.splitlines() if not ln.startswith("[")]
    assert lines == [turns[i].line() for i in sorted(chosen)]
    # every day is announced once, before its turns
    assert text.count("[2023-03-03]") <= 1
    assert text.startswith("[2023-")
    # skipping lets a later, shorter turn in: the budget is used well
    unused = [i for i in ranked if i not in chosen]
    assert all(estimate_tokens(render(turns, [*chosen, i])) > budget for i in unused)


def test_recent_takes_the_last_turns_and_rankers_find_the_fact() -> None:
    turns = _turns()
    index = TurnIndex(turns, get_embedder("hash"))
    rankings = index.rankings("What was flattened?")
    assert rankings["recent"][:3] == [23, 22, 21]
    assert rankings["bm25"][0] == 5  # "the cucumbers were flattened"
    assert sorted(rankings["hybrid"]) == list(range(len(turns)))
    texts = index.contexts(rankings, 40)
    assert "cucumbers were flattened" in texts["bm25"]
    assert "cucumbers" not in texts["recent"]
    assert all(estimate_tokens(t) <= 40 for t in texts.values())


# -- the harness, as a real process -----------------------------------------------


@pytest.mark.processes
def test_harness_run_writes_the_documented_json(tmp_path: Path) -> None:
    data = write_locomo(tmp_path / "mini.json")
    out, details = tmp_path / "out.json", tmp_path / "details.jsonl"
    proc = run_harness(str(data), "--embedder", "hash", "--budget", "60", "--json", str(out),
                       "--details", str(details))
    assert proc.returncode == 0, proc.stderr
    assert "budget 60 tokens" in proc.stdout
    assert "hybrid" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["budget"] == 60
    assert doc["config"]["embedder"] == "hash"
    assert doc["cce_duck_version"]
    assert doc["date"].startswith("20")
    assert doc["counts"]["questions"] == 6  # category 5 is skipped
    assert set(doc["systems"]) == SYSTEMS
    for s in doc["systems"].values():
        assert set(s["overall"]) == {"evidence_recall", "answer_recall", "tokens"}
        assert set(s["by_category"]) == {"1", "2", "3", "4"}
        assert s["by_category"]["2"]["answer_recall"] is None  # temporal answers are not checked
    full = doc["systems"]["full"]
    assert full["overall"]["evidence_recall"] == 1.0
    assert full["overall"]["tokens"] > 200
    assert doc["systems"]["bm25"]["overall"]["evidence_recall"] > \
        doc["systems"]["recent"]["overall"]["evidence_recall"]
    rows = [json.loads(line) for line in details.read_text().splitlines()]
    assert len(rows) == 6
    for row in rows:
        for name, s in row["systems"].items():
            if name != "full":
                assert s["tokens"] <= 60, (name, s["tokens"])
        assert row["systems"]["cce_duck"]["tokens"] == estimate_tokens(
            row["systems"]["cce_duck"]["context"])


@pytest.mark.processes
def test_harness_split_sessions_asks_at_user_scope(tmp_path: Path) -> None:
    data = write_locomo(tmp_path / "mini.json")
    out, root = tmp_path / "split.json", tmp_path / "folders"
    proc = run_harness(str(data), "--embedder", "hash", "--budget", "80", "--split-sessions",
                       "--data-dir", str(root), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert set(doc["systems"]) == SYSTEMS | {"cce_duck_user"}
    assert doc["config"]["split_sessions"] is True
    user = doc["systems"]["cce_duck_user"]
    assert 0 < user["overall"]["tokens"] <= 80
    assert user["overall"]["evidence_recall"] > doc["systems"]["recent"]["overall"][
        "evidence_recall"]
    (split,) = [p for p in root.iterdir() if p.name.endswith("-split")]
    from cce_duck import Engine
    with Engine(data_dir=split, embedder="hash") as eng:  # one user, one session per LoCoMo one
        rows = eng.sessions().to_dicts()
        assert len(rows) == len(SESSIONS)
        assert {r["user_id"] for r in rows} == {rows[0]["session_id"].rsplit("-s", 1)[0]}
        assert [r["turns"] for r in rows] == [len(t) for _, t in SESSIONS]


@pytest.mark.processes
def test_harness_budget_sweep_and_bad_arguments(tmp_path: Path) -> None:
    data = write_locomo(tmp_path / "mini.json")
    out = tmp_path / "sweep.json"
    proc = run_harness(str(data), "--embedder", "hash", "--budgets", "120,40", "--questions", "3",
                       "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert list(doc["budgets"]) == ["40", "120"]
    assert "systems" not in doc
    assert doc["counts"]["questions"] == 3
    small, large = (doc["budgets"][b]["systems"] for b in ("40", "120"))
    assert small["full"] == large["full"]
    for name in ("recent", "bm25", "dense", "hybrid", "cce_duck"):
        assert small[name]["overall"]["tokens"] <= 40 < large[name]["overall"]["tokens"] <= 120
    bad = run_harness(str(data), "--budgets", "10,x")
    assert bad.returncode == 2
    assert "comma-separated" in bad.stderr
    missing = run_harness(str(tmp_path / "nope.json"))
    assert missing.returncode == 2
    assert "no such file" in missing.stderr
    unknown = run_harness(str(data), "--embedder", "hash", "--conversations", "conv-x")
    assert unknown.returncode != 0
    assert "conv-x" in unknown.stderr


# -- the notebook -----------------------------------------------------------------


def test_notebook_is_committed_without_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.processes
@pytest.mark.slow
def test_notebook_runs_headless_on_a_small_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    from nbclient import NotebookClient

    data = write_locomo(tmp_path / "mini.json")
    single, sweep = tmp_path / "single.json", tmp_path / "sweep.json"
    for args in (["--budget", "80", "--json", str(single)],
                 ["--budgets", "40,80,160", "--json", str(sweep)]):
        proc = run_harness(str(data), "--embedder", "hash", *args)
        assert proc.returncode == 0, proc.stderr
    nb = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("CCE_LOCOMO_RESULTS", str(single))
    monkeypatch.setenv("CCE_LOCOMO_SWEEP", str(sweep))
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # evidence bars, answer bars, sweep lines, per-category lines
    text = "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/html", ""))
                     for o in outputs)
    assert "cce_duck" in text
    assert "fewer" in text
    assert "best raw system" in text
