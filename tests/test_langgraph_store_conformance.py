"""LangGraph's own store tests, ported to ``CCEStore`` on a real data folder (hash embedder).

LangGraph does not ship its store tests in the wheel; these follow, test for test, the ones of
``langchain-ai/langgraph`` that apply to a store with its own embedder:

- ``libs/checkpoint/tests/test_store.py`` (InMemoryStore): ``test_list_namespaces_basic``,
  ``_with_wildcards``, ``_pagination``, ``_max_depth``, ``_no_conditions``, ``_empty_store``,
  ``test_cannot_put_empty_namespace``, ``test_vector_insert_with_auto_embedding`` (and async),
  ``test_vector_update_with_embedding`` (and async), ``test_vector_search_with_filters`` (the
  filter parts), ``test_vector_search_pagination`` (and async), ``test_embed_with_path`` (the
  ranking parts), ``test_non_ascii``;
- ``libs/checkpoint/tests/test_store_namespace_validation.py``: invalid labels store nothing;
- ``libs/checkpoint-sqlite/tests/test_store.py``: ``test_batch_order``, ``test_batch_get_ops``,
  ``test_batch_put_ops``, ``test_batch_search_ops``, ``test_batch_list_namespaces_ops``,
  ``test_basic_store_ops``, ``test_list_namespaces``, ``test_search``.

Left out, because they test something else than a store: the ``AsyncBatchedBaseStore`` queue
tests (mocked stores), ``test_get_text_at_path`` (LangGraph's function, which ``CCEStore`` calls),
the TTL tests (``CCEStore`` has no TTL: ``supports_ttl`` is false), the index-configuration tests
of custom embedding functions (the folder's embedder embeds). Changed: assertions that two
items get the *same* score — the engine's ranking fuses ranks, and ranks break ties by recency —
and those expecting a character-count embedding to put one item first (the hash embedder is
another model) assert the engine's order instead.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)

from cce_duck import Engine
from cce_duck.integrations.langgraph import CCEStore


def in_loop(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an ``async`` test in a fresh event loop (LangGraph's ``a*`` methods; no plugin)."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))
    return run


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CCEStore]:
    eng = Engine(data_dir=tmp_path / "store", embedder="hash")
    try:
        yield CCEStore(engine=eng)
    finally:
        eng.close()


def _fill(store: CCEStore, namespaces: list[tuple[str, ...]]) -> None:
    for i, ns in enumerate(namespaces):
        store.put(namespace=ns, key=f"id_{i}", value={"data": f"value_{i:02d}"})


# -- libs/checkpoint/tests/test_store.py ----------------------------------------------------------

def test_list_namespaces_basic(store: CCEStore) -> None:
    _fill(store, [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f"),
                  ("a", "c", "f"), ("b", "a", "f"), ("users", "123"), ("users", "456", "settings"),
                  ("admin", "users", "789")])
    assert sorted(store.list_namespaces(prefix=("a", "b"))) == [
        ("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f")]
    assert sorted(store.list_namespaces(suffix=("f",))) == [
        ("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert sorted(store.list_namespaces(prefix=("a",), suffix=("f",))) == [
        ("a", "b", "f"), ("a", "c", "f")]
    assert sorted(store.list_namespaces(prefix=("a", "b"), max_depth=3)) == [
        ("a", "b", "c"), ("a", "b", "d"), ("a", "b", "f")]
    assert store.list_namespaces(prefix=("a", "b"), limit=2) == [
        ("a", "b", "c"), ("a", "b", "d", "e")]
    assert store.list_namespaces(prefix=("a", "b"), offset=2) == [
        ("a", "b", "d", "i"), ("a", "b", "f")]
    assert sorted(store.list_namespaces(prefix=("a", "*", "f"))) == [
        ("a", "b", "f"), ("a", "c", "f")]
    assert sorted(store.list_namespaces(suffix=("*", "f"))) == [
        ("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert store.list_namespaces(prefix=("nonexistent",)) == []
    assert store.list_namespaces(prefix=("users", "123")) == [("users", "123")]


def test_list_namespaces_with_wildcards(store: CCEStore) -> None:
    _fill(store, [("users", "123"), ("users", "456"), ("users", "789", "settings"),
                  ("admin", "users", "789"), ("guests", "123"), ("guests", "456", "preferences")])
    assert sorted(store.list_namespaces(prefix=("users", "*"))) == [
        ("users", "123"), ("users", "456"), ("users", "789", "settings")]
    assert store.list_namespaces(suffix=("*", "preferences")) == [("guests", "456", "preferences")]
    assert store.list_namespaces(prefix=("*", "users"), suffix=("*", "settings")) == []
    store.put(namespace=("admin", "users", "settings", "789"), key="foo", value={"data": "x"})
    assert store.list_namespaces(prefix=("*", "users"), suffix=("*", "789")) == [
        ("admin", "users", "789"), ("admin", "users", "settings", "789")]


def test_list_namespaces_pagination(store: CCEStore) -> None:
    for i in range(20):
        store.put(namespace=("namespace", f"sub_{i:02d}"), key=f"id_{i:02d}", value={"d": i})
    for offset in (0, 5, 15):
        assert store.list_namespaces(prefix=("namespace",), limit=5, offset=offset) == [
            ("namespace", f"sub_{i:02d}") for i in range(offset, offset + 5)]


def test_list_namespaces_max_depth(store: CCEStore) -> None:
    _fill(store, [("a", "b", "c", "d"), ("a", "b", "c", "e"), ("a", "b", "f"), ("a", "g"),
                  ("h", "i", "j", "k")])
    assert sorted(store.list_namespaces(max_depth=2)) == [("a", "b"), ("a", "g"), ("h", "i")]


def test_list_namespaces_no_conditions_and_empty(store: CCEStore) -> None:
    assert store.list_namespaces() == []
    namespaces = [("a", "b"), ("c", "d"), ("e", "f", "g")]
    _fill(store, namespaces)
    assert sorted(store.list_namespaces()) == namespaces


@in_loop
async def test_cannot_put_empty_namespace(store: CCEStore) -> None:
    doc = {"foo": "bar"}
    for bad in [(), ("the", "thing.about"), ("some", "fun", ""), ("langgraph", "foo")]:
        with pytest.raises(InvalidNamespaceError):
            store.put(bad, "foo", doc)
        with pytest.raises(InvalidNamespaceError):
            await store.aput(bad, "foo", doc)
    assert store.list_namespaces() == []

    ns = ("foo", "langgraph", "foo")
    await store.aput(ns, "bar", doc)
    assert (await store.aget(ns, "bar")).value == doc  # type: ignore[union-attr]
    assert (await store.asearch(ns, query="bar"))[0].value == doc
    await store.adelete(ns, "bar")
    assert await store.aget(ns, "bar") is None
    store.put(ns, "bar", doc)
    assert store.get(ns, "bar").value == doc  # type: ignore[union-attr]
    assert store.search(ns, query="bar")[0].value == doc
    store.delete(ns, "bar")
    assert store.get(ns, "bar") is None

    # past the public put: a batch may use the reserved root label, as in InMemoryStore
    await store.abatch([PutOp(("langgraph", "foo"), "bar", doc)])
    assert (await store.aget(("langgraph", "foo"), "bar")).value == doc  # type: ignore[union-attr]
    assert (await store.asearch(("langgraph", "foo")))[0].value == doc
    await store.adelete(("langgraph", "foo"), "bar")
    assert await store.aget(("langgraph", "foo"), "bar") is None


DOCS = [("doc1", {"text": "short text"}), ("doc2", {"text": "longer text document"}),
        ("doc3", {"text": "longest text document here"}),
        ("doc4", {"description": "text in description field"}),
        ("doc5", {"content": "text in content field"}), ("doc6", {"body": "text in body field"})]


def test_vector_insert_with_auto_embedding(store: CCEStore) -> None:
    for key, value in DOCS:
        store.put(("test",), key, value)
    results = store.search(("test",), query="longer document")
    assert {"doc2", "doc3"} <= {r.key for r in results}
    assert results[0].key == "doc2"  # both its terms match; doc3 has "document" only
    assert all(r.score is not None for r in results)


@in_loop
async def test_async_vector_insert_with_auto_embedding(store: CCEStore) -> None:
    for key, value in DOCS:
        await store.aput(("test",), key, value)
    results = await store.asearch(("test",), query="longer document")
    assert results[0].key == "doc2"
    assert "doc3" in [r.key for r in results]


def _update_checks(results_initial: list[Any], results_after: list[Any]) -> float:
    assert results_initial[0].key == "doc1"
    initial = results_initial[0].score
    assert initial is not None
    after = next(r.score for r in results_after if r.key == "doc1")
    assert after is not None
    assert after < initial
    return float(after)


def test_vector_update_with_embedding(store: CCEStore) -> None:
    store.put(("test",), "doc1", {"text": "zany zebra Xerxes"})
    store.put(("test",), "doc2", {"text": "something about dogs"})
    store.put(("test",), "doc3", {"text": "text about birds"})
    initial = store.search(("test",), query="Zany Xerxes")
    store.put(("test",), "doc1", {"text": "new text about dogs"})
    after = _update_checks(initial, store.search(("test",), query="Zany Xerxes"))
    for r in store.search(("test",), query="new text about dogs"):
        if r.key == "doc1":
            assert r.score is not None
            assert r.score > after
    store.put(("test",), "doc4", {"text": "new text about dogs"}, index=False)
    assert not any(r.key == "doc4" for r in store.search(("test",), query="new text about dogs",
                                                           limit=3))


@in_loop
async def test_async_vector_update_with_embedding(store: CCEStore) -> None:
    await store.aput(("test",), "doc1", {"text": "zany zebra Xerxes"})
    await store.aput(("test",), "doc2", {"text": "something about dogs"})
    await store.aput(("test",), "doc3", {"text": "text about birds"})
    initial = await store.asearch(("test",), query="Zany Xerxes")
    await store.aput(("test",), "doc1", {"text": "new text about dogs"})
    _update_checks(initial, await store.asearch(("test",), query="Zany Xerxes"))
    await store.aput(("test",), "doc4", {"text": "new text about dogs"}, index=False)
    hits = await store.asearch(("test",), query="new text about dogs", limit=3)
    assert not any(r.key == "doc4" for r in hits)


def test_vector_search_with_filters(store: CCEStore) -> None:
    docs = [("doc1", {"text": "red apple", "color": "red", "score": 4.5}),
            ("doc2", {"text": "red car", "color": "red", "score": 3.0}),
            ("doc3", {"text": "green apple", "color": "green", "score": 4.0}),
            ("doc4", {"text": "blue car", "color": "blue", "score": 3.5})]
    for key, value in docs:
        store.put(("test",), key, value)
    results = store.search(("test",), query="apple", filter={"color": "red"})
    assert [r.key for r in results][:1] == ["doc1"]
    assert len(results) == 2
    results = store.search(("test",), query="car", filter={"color": "red"})
    assert [r.key for r in results][:1] == ["doc2"]
    assert len(results) == 2
    results = store.search(("test",), query="blue", filter={"score": {"$gt": 3.2}})
    assert len(results) == 3
    assert results[0].key == "doc4"
    results = store.search(("test",), query="apple",
                           filter={"score": {"$gte": 4.0}, "color": "green"})
    assert [r.key for r in results] == ["doc3"]


def test_vector_search_pagination(store: CCEStore) -> None:
    for i in range(5):
        store.put(("test",), f"doc{i}", {"text": f"test document number {i}"})
    page1 = store.search(("test",), query="test", limit=2)
    page2 = store.search(("test",), query="test", limit=2, offset=2)
    assert len(page1) == len(page2) == 2
    assert {r.key for r in page1}.isdisjoint(r.key for r in page2)
    everything = store.search(("test",), query="test", limit=10)
    assert len(everything) == 5
    assert [r.key for r in everything][:4] == [r.key for r in page1 + page2]


@in_loop
async def test_async_vector_search_pagination(store: CCEStore) -> None:
    for i in range(5):
        await store.aput(("test",), f"doc{i}", {"text": f"test document number {i}"})
    page1 = await store.asearch(("test",), query="test", limit=2)
    page2 = await store.asearch(("test",), query="test", limit=2, offset=2)
    assert {r.key for r in page1}.isdisjoint(r.key for r in page2)
    assert len(await store.asearch(("test",), query="test", limit=10)) == 5


@in_loop
async def test_embed_with_path(tmp_path: Path) -> None:
    with Engine(data_dir=tmp_path / "s", embedder="hash") as eng:
        store = CCEStore(engine=eng, index={"fields": ["key0", "key1", "key3"]})
        await store.aput(("test",), "doc1", {"key1": "xxx", "key2": "yyy", "key3": "zzz"})
        await store.aput(("test",), "doc2", {"key0": "uuu", "key1": "vvv", "key2": "www",
                                             "key3": "xxx"})
        results = await store.asearch(("test",), query="xxx")
        assert len(results) == 2
        assert results[0].key != results[1].key
        results = await store.asearch(("test",), query="uuu")
        assert results[0].key == "doc2"
        assert results[0].score is not None
        assert results[0].score > results[1].score
        results = await store.asearch(("test",), query="www")  # key2 is not indexed
        assert len(results) == 2

        per_op = CCEStore(engine=eng, index={"fields": ["key17"]})
        await per_op.aput(("t2",), "doc3", {"key0": "aaa", "key1": "bbb", "key2": "ccc",
                                            "key3": "ddd"}, index=["key0", "key1"])
        await per_op.aput(("t2",), "doc4", {"key0": "eee", "key1": "bbb", "key2": "fff",
                                            "key3": "ggg"}, index=["key1", "key3"])
        assert (await per_op.asearch(("t2",), query="aaa"))[0].key == "doc3"
        assert (await per_op.asearch(("t2",), query="ggg"))[0].key == "doc4"
        await per_op.aput(("t2",), "doc5", {"key0": "hhh", "key1": "iii"}, index=False)
        results = await per_op.asearch(("t2",), query="hhh")
        assert len(results) == 3
        assert next(r for r in results if r.key == "doc5").score is None
        assert results[-1].key == "doc5"  # not indexed: after every ranked item


def test_non_ascii(store: CCEStore) -> None:
    texts = {"1": "这是中文", "2": "これは日本語です", "3": "이건 한국어야", "4": "Это русский",
             "5": "यह रूसी है"}
    for key, text in texts.items():
        store.put(("user_123", "memories"), key, {"text": text})
    for key, text in texts.items():
        assert store.search(("user_123", "memories"), query=text)[0].key == key


# -- libs/checkpoint/tests/test_store_namespace_validation.py ------------------------------------

async def _call(store: CCEStore, method: str, namespace: Any, use_async: bool) -> None:
    if method in ("prefix", "suffix"):
        if use_async:
            await store.alist_namespaces(**{method: namespace})
        else:
            store.list_namespaces(**{method: namespace})
    elif method == "search":
        await store.asearch(namespace) if use_async else store.search(namespace)
    elif method == "put":
        await store.aput(namespace, "k", {"v": 2}) if use_async else store.put(namespace, "k",
                                                                                 {"v": 2})
    elif use_async:
        await getattr(store, f"a{method}")(namespace, "k")
    else:
        getattr(store, method)(namespace, "k")


@pytest.mark.parametrize("method", ["get", "delete", "search", "prefix", "suffix", "put"])
@in_loop
async def test_invalid_labels_store_nothing(store: CCEStore, method: str) -> None:
    store.put(("ok",), "k", {"v": 1})
    for namespace in [("foo.bar",), ("foo", ""), (123,)]:
        for use_async in (False, True):
            with pytest.raises(InvalidNamespaceError):
                await _call(store, method, namespace, use_async)
        with pytest.raises(InvalidNamespaceError):  # past the public methods
            store.batch([PutOp(("ok",), "k2", {"v": 3}), PutOp(namespace, "k", {"v": 2})])
    assert store.list_namespaces() == [("ok",)]
    assert store.get(("ok",), "k2") is None


# -- libs/checkpoint-sqlite/tests/test_store.py --------------------------------------------------

def test_batch_order(store: CCEStore) -> None:
    store.put(("test", "foo"), "key1", {"data": "value1"})
    store.put(("test", "bar"), "key2", {"data": "value2"})
    results = store.batch([
        GetOp(namespace=("test", "foo"), key="key1"),
        PutOp(namespace=("test", "bar"), key="key2", value={"data": "value2"}),
        SearchOp(namespace_prefix=("test",), filter={"data": "value1"}, limit=10, offset=0),
        ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
        GetOp(namespace=("test",), key="key3"),
    ])
    assert len(results) == 5
    first = results[0]
    assert isinstance(first, Item)
    assert (first.value, first.key, first.namespace) == ({"data": "value1"}, "key1", ("test", "foo"))
    assert results[1] is None
    assert isinstance(results[2], list)
    assert [i.key for i in results[2]] == ["key1"]
    assert isinstance(results[3], list)
    assert ("test", "foo") in results[3]
    assert ("test", "bar") in results[3]
    assert results[4] is None

    reordered = store.batch([
        SearchOp(namespace_prefix=("test",), filter=None, limit=5, offset=0),
        GetOp(namespace=("test", "bar"), key="key2"),
        ListNamespacesOp(match_conditions=None, max_depth=None, limit=5, offset=0),
        PutOp(namespace=("test",), key="key3", value={"data": "value3"}),
        GetOp(namespace=("test", "foo"), key="key1"),
    ])
    assert isinstance(reordered[0], list)
    assert len(reordered[0]) >= 2
    assert isinstance(reordered[1], Item)
    assert reordered[1].value == {"data": "value2"}
    assert reordered[3] is None
    assert isinstance(reordered[4], Item)
    assert reordered[4].key == "key1"
    assert store.get(("test",), "key3").value == {"data": "value3"}  # type: ignore[union-attr]


def test_batch_get_and_put_ops(store: CCEStore) -> None:
    results = store.batch([PutOp(("test",), "key1", {"data": "value1"}),
                           PutOp(("test",), "key2", {"data": "value2"}),
                           PutOp(("test",), "key3", None)])
    assert results == [None, None, None]
    got = store.batch([GetOp(("test",), "key1"), GetOp(("test",), "key2"), GetOp(("test",), "key3")])
    assert [g.key if isinstance(g, Item) else g for g in got] == ["key1", "key2", None]


def test_batch_search_ops(store: CCEStore) -> None:
    for ns, key, value in [(("test", "foo"), "key1", {"data": "value1", "tag": "a"}),
                           (("test", "bar"), "key2", {"data": "value2", "tag": "a"}),
                           (("test", "baz"), "key3", {"data": "value3", "tag": "b"})]:
        store.put(ns, key, value)
    tagged, two, foo = store.batch([
        SearchOp(namespace_prefix=("test",), filter={"tag": "a"}, limit=10, offset=0),
        SearchOp(namespace_prefix=("test",), filter=None, limit=2, offset=0),
        SearchOp(namespace_prefix=("test", "foo"), filter=None, limit=10, offset=0)])
    assert isinstance(tagged, list)
    assert isinstance(two, list)
    assert isinstance(foo, list)
    assert len(tagged) == 2
    assert all(i.value["tag"] == "a" for i in tagged)
    assert len(two) == 2
    assert [i.namespace for i in foo] == [("test", "foo")]  # type: ignore[union-attr]


def test_batch_list_namespaces_ops(store: CCEStore) -> None:
    data = [(("test", "documents", "public"), "doc1"), (("test", "documents", "private"), "doc2"),
            (("test", "images", "public"), "img1"), (("prod", "documents", "public"), "doc3")]
    for ns, key in data:
        store.put(ns, key, {"content": key})
    every, shallow, public = store.batch([
        ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
        ListNamespacesOp(match_conditions=None, max_depth=2, limit=10, offset=0),
        ListNamespacesOp(match_conditions=(MatchCondition("suffix", ("public",)),),
                         max_depth=None, limit=10, offset=0)])
    assert isinstance(every, list)
    assert len(every) == len(data)
    assert isinstance(shallow, list)
    assert sorted(shallow) == [  # type: ignore[type-var]
        ("prod", "documents"), ("test", "documents"), ("test", "images")]
    assert isinstance(public, list)
    assert len(public) == 3
    assert all(ns[-1] == "public" for ns in public)  # type: ignore[index]


def test_basic_store_ops(store: CCEStore) -> None:
    ns = ("test", "documents")
    store.put(ns, "doc1", {"title": "Test Document", "content": "Hello, World!"})
    item = store.get(ns, "doc1")
    assert item is not None
    assert (item.namespace, item.key, item.value) == (ns, "doc1", {"title": "Test Document",
                                                                   "content": "Hello, World!"})
    time.sleep(0.01)
    store.put(ns, "doc1", {"title": "Updated Document", "content": "Hello, Updated!"})
    updated = store.get(ns, "doc1")
    assert updated is not None
    assert updated.value["title"] == "Updated Document"
    assert updated.created_at == item.created_at  # kept, as in the database-backed stores
    assert updated.updated_at > item.updated_at
    assert store.get(("test", "other_documents"), "doc1") is None
    store.delete(ns, "doc1")
    assert store.get(ns, "doc1") is None


def test_list_namespaces(store: CCEStore) -> None:
    namespaces = [("test", "documents", "public"), ("test", "documents", "private"),
                  ("test", "images", "public"), ("test", "images", "private"),
                  ("prod", "documents", "public"), ("prod", "documents", "private")]
    for ns in namespaces:
        store.put(ns, "dummy", {"content": "dummy"})
    assert len(store.list_namespaces()) == 6
    assert len(store.list_namespaces(prefix=("test",))) == 4
    assert all(ns[-1] == "public" for ns in store.list_namespaces(suffix=("public",)))
    assert len(store.list_namespaces(suffix=("public",))) == 3
    assert all(len(ns) <= 2 for ns in store.list_namespaces(max_depth=2))
    assert len(store.list_namespaces(limit=3)) == 3
    for ns in namespaces:
        store.delete(ns, "dummy")
    assert store.list_namespaces() == []


def test_search(store: CCEStore) -> None:
    for ns, key, value in [
            (("test", "docs"), "doc1", {"title": "First Doc", "author": "Alice", "tags": ["important"]}),
            (("test", "docs"), "doc2", {"title": "Second Doc", "author": "Bob", "tags": ["draft"]}),
            (("test", "images"), "img1", {"title": "Image 1", "author": "Alice", "tags": ["final"]})]:
        store.put(ns, key, value)
    assert [i.key for i in store.search(("test",))] == ["doc1", "doc2", "img1"]  # stored order
    assert [i.key for i in store.search(("test", "docs"))] == ["doc1", "doc2"]
    alice = store.search(("test",), filter={"author": "Alice"})
    assert [i.key for i in alice] == ["doc1", "img1"]
    assert len(store.search(("test",), limit=2)) == 2
    assert [i.key for i in store.search(("test",), offset=2)] == ["img1"]
    assert [i.key for i in store.search(("test",), filter={"tags": ["draft"]})] == ["doc2"]
    assert [i.key for i in store.search(("test",), filter={"author": {"$ne": "Alice"}})] == ["doc2"]
