"""LangGraph: CCEStore as the long-term memory store of a real compiled graph.

Everything is real: LangGraph's StateGraph and in-memory checkpointer, a DuckDB data folder, the
hash embedder through the real registry. LangGraph's own store tests, ported, are in
``tests/test_langgraph_store_conformance.py``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import pyarrow.parquet as pq
import pytest
from lake import make_lake
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_config, get_store
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import InvalidNamespaceError, PutOp

from cce_duck import Config, Engine, NotFoundError, ValidationError, ranking
from cce_duck.integrations.langgraph import CCEStore

PASS = "correct horse battery staple"


@dataclass
class Who:
    user_id: str


class State(TypedDict, total=False):
    said: str
    recalled: list[str]


def remember(state: State) -> dict[str, Any]:
    """Store what the user asked to remember (the store from ``get_store()``)."""
    said = state["said"]
    if said.startswith("remember:"):
        user = get_config()["configurable"]["user_id"]
        get_store().put(("users", user, "memories"), secrets.token_hex(4),
                        {"text": said.removeprefix("remember:").strip()})
    return {}


def recall(state: State, runtime: Runtime[Who]) -> dict[str, Any]:
    """The user's two memories that best match the message (the store from the Runtime)."""
    assert runtime.store is not None
    hits = runtime.store.search(("users", runtime.context.user_id, "memories"),
                                query=state["said"], limit=2)
    return {"recalled": [h.value["text"] for h in hits]}


def graph(store: CCEStore) -> CompiledStateGraph[Any, Any, Any, Any]:
    builder = StateGraph(State, context_schema=Who)
    builder.add_node("remember", remember)
    builder.add_node("recall", recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    return builder.compile(checkpointer=InMemorySaver(), store=store)


def say(app: CompiledStateGraph[Any, Any, Any, Any], user: str, text: str,
        thread: str = "t1") -> list[str]:
    out = app.invoke({"said": text}, {"configurable": {"thread_id": f"{user}-{thread}",
                                                       "user_id": user}},
                     context=Who(user_id=user))
    return list(out["recalled"])


@pytest.fixture
def store(file_engine: Engine) -> CCEStore:
    return CCEStore(engine=file_engine)


def test_a_graph_remembers_per_user_across_threads_and_restarts(data_dir: Path) -> None:
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        app = graph(CCEStore(engine=eng))
        say(app, "alice", "remember: I am allergic to peanuts")
        say(app, "alice", "remember: my sister Ines lives in Porto")
        say(app, "alice", "remember: I run every Sunday morning")
        say(app, "bob", "remember: I love peanuts and almonds")
        recalled = say(app, "alice", "Where does Ines live?", thread="t2")  # another thread
        assert recalled[0] == "my sister Ines lives in Porto"
        assert all("almonds" not in r for r in recalled)  # never another user's memory
        assert say(app, "bob", "what do I love?", thread="t9") == ["I love peanuts and almonds"]
    with Engine(data_dir=data_dir, embedder="hash") as eng:  # a new process would see the same
        app = graph(CCEStore(engine=eng))
        assert say(app, "alice", "What am I allergic to?", thread="t3")[0] == \
            "I am allergic to peanuts"
        assert CCEStore(engine=eng).list_namespaces(prefix=("users",), max_depth=2) == [
            ("users", "alice"), ("users", "bob")]


def test_an_async_graph_uses_abatch(store: CCEStore) -> None:
    app = graph(store)

    async def run() -> list[str]:
        cfg: Any = {"configurable": {"thread_id": "a", "user_id": "carol"}}
        await app.ainvoke({"said": "remember: my bike is a green Bianchi"}, cfg,
                          context=Who(user_id="carol"))
        out = await app.ainvoke({"said": "what colour is my Bianchi?"}, cfg,
                                context=Who(user_id="carol"))
        return list(out["recalled"])

    assert asyncio.run(run()) == ["my bike is a green Bianchi"]
    item = store.search(("users", "carol"))[0]
    assert item.namespace == ("users", "carol", "memories")


COLOURS = ["red", "green", "blue", "amber"]
FRUITS = ["apple", "pear", "plum", "cherry", "lime"]


def test_parallel_branches_write_at_once(store: CCEStore) -> None:
    def writer(n: int) -> Any:
        def node(state: State) -> dict[str, Any]:
            for i in range(5):
                get_store().put(("shared", f"branch{n}"), f"k{i}",
                                {"text": f"{COLOURS[n]} branch, {FRUITS[i]} fact"})
            return {}
        return node

    builder = StateGraph(State)
    for n in range(4):
        builder.add_node(f"w{n}", writer(n))
        builder.add_edge(START, f"w{n}")
        builder.add_edge(f"w{n}", END)
    builder.compile(store=store).invoke({"said": "go"})
    assert store.list_namespaces(prefix=("shared",)) == [("shared", f"branch{n}") for n in range(4)]
    assert len(store.search(("shared",), limit=100)) == 20
    best = store.search(("shared",), query="the blue branch's cherry fact")[0]
    assert (best.namespace, best.key) == (("shared", "branch2"), "k3")


def test_search_is_the_engines_ranking(store: CCEStore) -> None:
    store.put(("docs",), "a", {"text": "The freezer alarm fires at -16 degrees"})
    store.put(("docs",), "b", {"text": "Twilio sends the SMS alerts"})
    store.put(("docs",), "c", {"text": "Priya owns the dashboard"})
    hits = store.search(("docs",), query="Who owns the dashboard, Priya?")
    assert hits[0].key == "c"
    # the best item has the best dense and BM25 ranks: reciprocal-rank fusion with the
    # constants of sql/ranking_v1.json
    assert hits[0].score == pytest.approx(2 / (ranking.spec().rrf_k + 1))
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_search_turns_ranks_the_users_conversations(store: CCEStore, file_engine: Engine) -> None:
    file_engine.ingest("ann-0", [{"role": "user", "content": "My sister Ines moved to Porto."},
                                 {"role": "assistant", "content": "Porto is lovely in spring."}],
                       user_id="ann")
    file_engine.ingest("ann-1", [{"role": "user", "content": "I bought a green Bianchi bike."}],
                       user_id="ann")
    file_engine.ingest("ben-0", [{"role": "user", "content": "Ines is my cousin too."}],
                       user_id="ben")
    turns = store.search_turns("ann", "Where does Ines live?", limit=3)
    assert turns[0].namespace == ("users", "ann", "sessions", "ann-0")
    assert (turns[0].key, turns[0].value["content"]) == ("0", "My sister Ines moved to Porto.")
    assert all(t.namespace[3] in ("ann-0", "ann-1") for t in turns)  # never another user's
    # the engine's ranking: the order and scores of Engine.user_search for the same question
    frame = file_engine.user_search("ann", "Where does Ines live?", k=3)
    assert [(t.namespace[3], int(t.key), t.score) for t in turns] == list(
        zip(frame["session_id"], frame["turn_no"], frame["score"], strict=True))
    assert store.search_turns("nobody", "Ines") == []
    assert store.search(("users", "ann")) == []  # turns are not items
    with pytest.raises(ValidationError):
        store.search_turns("ann", "   ")


def test_items_leave_the_session_indexes_valid(store: CCEStore, file_engine: Engine) -> None:
    file_engine.ingest("s1", [{"role": "user", "content": f"message {i} about lighthouses"}
                              for i in range(12)])
    file_engine.context("s1", "lighthouses")
    generation = file_engine.store.generation
    store.put(("sessions", "s1", "notes"), "n1", {"text": "the keeper is Tom"})
    assert file_engine.store.generation == generation  # cached indexes stay valid
    assert "lighthouses" in file_engine.context("s1", "lighthouses").to_string()


def test_threads_write_and_read_beside_the_engine(store: CCEStore, file_engine: Engine) -> None:
    errors: list[BaseException] = []

    def items(t: int) -> None:
        try:
            for i in range(8):
                store.put(("users", f"u{t}"), f"k{i}", {"text": f"user {t} fact {i}"})
                store.search(("users", f"u{t}"), query=f"fact {i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def chat() -> None:
        try:
            for i in range(16):
                file_engine.add_message("chat", "user", f"line {i} of the chat", user_id="u0")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=items, args=(t,)) for t in range(3)]
    threads.append(threading.Thread(target=chat))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert [len(store.search(("users", f"u{t}"), limit=50)) for t in range(3)] == [8, 8, 8]
    assert len(file_engine.history("chat")) == 16


@pytest.mark.lake
def test_the_store_works_on_a_lake(tmp_path: Path) -> None:
    """A DuckLake store (local catalog): no sequences there, ids come from _cce_sequences."""
    with make_lake("file", tmp_path) as spec, Engine(Config(data_dir=None, embedder="hash",
                                                            **spec.config())) as eng:
        st = CCEStore(engine=eng)
        st.put(("users", "ann", "memories"), "diet", {"text": "vegetarian since 2019"})
        st.batch([PutOp(("users", "ann", "memories"), f"k{i}", {"text": f"fact {i}"})
                  for i in range(3)])
        st.put(("users", "ann", "memories"), "diet", {"text": "vegan since 2021"})
        assert st.get(("users", "ann", "memories"), "diet").value == {  # type: ignore[union-attr]
            "text": "vegan since 2021"}
        assert st.search(("users",), query="Is Ann vegan?")[0].key == "diet"
        assert eng.sql("SELECT item_id FROM store_items ORDER BY 1")["item_id"].to_list() == [
            1, 2, 3, 4]
        assert eng.delete_user("ann")["store_items"] == 4
        assert st.list_namespaces() == []


# -- namespaces belong to users and sessions ------------------------------------------------------

def _readable(folder: Path, needles: list[str]) -> list[str]:
    data = [p.read_bytes() for p in folder.rglob("*") if p.is_file()]
    return [n for n in needles if any(n.encode() in d for d in data)]


def test_erasing_a_user_or_a_session_erases_their_items_from_every_file(data_dir: Path) -> None:
    gone = [f"QD{secrets.token_hex(8)}" for _ in range(5)]
    kept = [f"QK{secrets.token_hex(8)}" for _ in range(3)]
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        st = CCEStore(engine=eng)
        eng.ingest("dora-0", [{"role": "user", "content": f"hello {gone[0]}"}], user_id="dora")
        st.put(("users", "dora", "memories"), "m1", {"text": f"dora likes {gone[1]}"})
        st.put(("users", "dora", "profile"), "p", {"name": gone[2]}, index=False)
        st.put(("users", "zed"), "only", {"text": f"zed has items only {gone[3]}"})
        st.put(("sessions", "scratch", "notes"), "n", {"text": f"session note {gone[4]}"})
        st.put(("users", "eve", "memories"), "m1", {"text": f"eve keeps {kept[0]}"})
        st.put(("sessions", "other"), "n", {"text": f"other session keeps {kept[1]}"})
        st.put(("shared",), "n", {"text": f"nobody's {kept[2]}"})
    assert _readable(data_dir, gone + kept) == gone + kept, "markers not readable before: void"
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        st = CCEStore(engine=eng)
        removed = eng.delete_user("dora")
        assert removed["sessions"] == 1
        assert removed["store_items"] == 2
        assert removed["store_item_vectors"] == 1  # the profile was not indexed
        assert eng.delete_user("zed")["store_items"] == 1  # a user with items only
        assert eng.delete_session("scratch")["store_items"] == 1  # a session with items only
        with pytest.raises(NotFoundError):
            eng.delete_user("dora")
        with pytest.raises(NotFoundError):
            eng.delete_session("scratch")
        assert st.list_namespaces() == [("sessions", "other"), ("shared",),
                                        ("users", "eve", "memories")]
    assert _readable(data_dir, gone) == []
    assert _readable(data_dir, kept) == kept


def test_a_users_export_holds_their_items(tmp_path: Path, file_engine: Engine) -> None:
    st = CCEStore(engine=file_engine)
    file_engine.ingest("ann-0", [{"role": "user", "content": "hello"}], user_id="ann")
    st.put(("users", "ann", "memories"), "diet", {"text": "vegetarian", "since": 2019})
    st.put(("users", "ann"), "profile", {"name": "Ann"}, index=False)
    st.put(("users", "ben", "memories"), "diet", {"text": "vegan"})  # another user's
    doc = file_engine.user_document("ann")
    assert [s["session_id"] for s in doc["sessions"]] == ["ann-0"]
    assert [(i["namespace"], i["key"], i["value"]) for i in doc["items"]] == [
        (["users", "ann", "memories"], "diet", {"text": "vegetarian", "since": 2019}),
        (["users", "ann"], "profile", {"name": "Ann"})]
    assert doc["items"][0]["created_at"] == st.get(("users", "ann", "memories"),  # type: ignore[union-attr]
                                                   "diet").created_at.isoformat()
    only = file_engine.user_document("ben")  # a user with items only
    assert only["sessions"] == []
    assert [i["value"] for i in only["items"]] == [{"text": "vegan"}]
    folder = file_engine.export_user("ann", tmp_path / "ann-pq", format="parquet")
    assert sorted(p.name for p in folder.iterdir()) == ["ann-0", "store_items.parquet"]
    table = pq.read_table(folder / "store_items.parquet").to_pylist()
    assert [(r["key"], json.loads(r["value"])) for r in table] == [
        ("diet", {"text": "vegetarian", "since": 2019}), ("profile", {"name": "Ann"})]
    with pytest.raises(NotFoundError):
        file_engine.user_document("nobody")


def test_a_deleted_item_leaves_the_file_at_the_next_rewrite(data_dir: Path) -> None:
    marker = f"QD{secrets.token_hex(8)}"
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        st = CCEStore(engine=eng)
        st.put(("shared",), "gone", {"text": f"soon deleted {marker}"})
        st.put(("shared",), "kept", {"text": "stays"})
        eng.store.con.execute("CHECKPOINT")
        assert _readable(data_dir, [marker]) == [marker]
        st.delete(("shared",), "gone")
        eng.compact()
        assert [i.key for i in st.search(("shared",))] == ["kept"]
    assert _readable(data_dir, [marker]) == []


def test_an_encrypted_folder_encrypts_items(tmp_path: Path) -> None:
    marker = f"QX{secrets.token_hex(10)}"
    folder = tmp_path / "enc"
    with Engine(data_dir=folder, embedder="hash", encryption_key=PASS) as eng:
        CCEStore(engine=eng).put(("users", "ann"), "secret", {"text": f"my pin is {marker}"})
        assert _readable(folder, [marker]) == []  # at no moment, not only after close
    assert _readable(folder, [marker]) == []
    with Engine(data_dir=folder, embedder="hash", encryption_key=PASS) as eng:
        st = CCEStore(engine=eng)
        assert st.get(("users", "ann"), "secret").value == {"text": f"my pin is {marker}"}  # type: ignore[union-attr]
        assert st.search(("users",), query=marker)[0].key == "secret"


# -- bad input ------------------------------------------------------------------------------------

def _snapshot(eng: Engine) -> list[Any]:
    return [eng.sql(f"SELECT * EXCLUDE (session_id) FROM {t} ORDER BY ALL").rows()
            for t in ("store_items", "store_item_vectors", "store_item_postings")]


def test_bad_input_is_refused_and_stores_nothing(store: CCEStore, file_engine: Engine) -> None:
    store.put(("users", "ann", "memories"), "diet", {"text": "vegetarian"})
    before = _snapshot(file_engine)
    ns = ("users", "ann", "memories")
    bad_calls: list[tuple[type[BaseException], Any]] = [
        (ValidationError, lambda: store.put(ns, "", {"text": "x"})),
        (ValidationError, lambda: store.put(ns, "k" * 1025, {"text": "x"})),
        (ValidationError, lambda: store.put(ns, "a\x00b", {"text": "x"})),
        (ValidationError, lambda: store.put(ns, "diet", [1, 2])),  # type: ignore[arg-type]
        (ValidationError, lambda: store.put(ns, "diet", {"x": float("nan")})),
        (ValidationError, lambda: store.put(ns, "diet", {"x": object()})),
        (ValidationError, lambda: store.put(ns, "diet", {1: "a"})),  # type: ignore[dict-item]
        (ValidationError, lambda: store.put(ns, "diet", {"x": "\ud800"})),
        (ValidationError, lambda: store.put(ns, "diet", {"x": "y"}, index="x")),  # type: ignore[arg-type]
        (InvalidNamespaceError, lambda: store.put(("users", "a b"), "k", {"x": 1})),
        (InvalidNamespaceError, lambda: store.put(("sessions", "x" * 65), "k", {"x": 1})),
        (InvalidNamespaceError, lambda: store.put(("users", ".."), "k", {"x": 1})),
        (InvalidNamespaceError, lambda: store.get(("users", "../x"), "k")),
        (NotImplementedError, lambda: store.put(ns, "diet", {"x": 1}, ttl=5)),
        (NotImplementedError, lambda: store.batch([PutOp(ns, "diet", {"x": 1}, ttl=5.0)])),
        (ValidationError, lambda: store.search(ns, limit=-1)),
        (ValidationError, lambda: store.search(ns, filter={"text": {"$regex": "veg"}})),
        (ValidationError, lambda: store.list_namespaces(max_depth=0)),
        # one bad write in a batch: the good one before it is not stored either
        (ValidationError, lambda: store.batch([PutOp(ns, "new", {"x": 1}),
                                               PutOp(ns, "", {"x": 2})])),
        (InvalidNamespaceError, lambda: store.batch([PutOp(ns, "diet", None),
                                                     PutOp(("a.b",), "k", {"x": 2})])),
    ]
    for error, call in bad_calls:
        with pytest.raises(error):
            call()
        assert _snapshot(file_engine) == before
    assert store.get(ns, "diet").value == {"text": "vegetarian"}  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match="embed"):
        CCEStore(engine=file_engine, index={"embed": lambda texts: [[0.0]] * len(texts)})
    with pytest.raises(ValidationError, match="dimension"):
        CCEStore(engine=file_engine, index={"dims": 1536})
